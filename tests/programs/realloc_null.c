/* realloc_null: ROUNDS x realloc(NULL, SIZE) from grow_inner <- grow_outer,
 * left allocated (glibc's realloc(NULL, n) jumps into malloc at the same
 * sp), then one realloc(NULL, 99) freed. Prints "ready" and exits 0. */
#include <stdio.h>
#include <stdlib.h>

#define KEEP __attribute__((noinline, noipa, used))
#define ROUNDS 5
#define SIZE 1234

void *volatile kept[ROUNDS];
void *volatile none;		/* NULL the compiler cannot see: realloc stays realloc */

KEEP void *grow_inner(void) { void *p = realloc(none, SIZE); asm volatile(""); return p; }
KEEP void grow_outer(int i) { kept[i] = grow_inner(); asm volatile(""); }

int main(void)
{
	for (int i = 0; i < ROUNDS; i++)
		grow_outer(i);
	free(realloc(none, 99));
	puts("ready");
	return 0;
}
