/* qsort_cb [N]: main -> sort_things -> qsort (libc) -> ... -> cmp.
 * The comparator is called from inside libc, which keeps no frame pointers:
 * only DWARF CFI unwinds from cmp back to main. Sorts N ints (default 64).
 * Prints nothing, or with a second argument (any) the number of calls of
 * cmp. Exit status 0 (3 if the result is not sorted). */
#include <stdio.h>
#include <stdlib.h>

#define KEEP __attribute__((noinline, noipa, used))

volatile long compares;

KEEP int cmp(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	compares++;
	asm volatile("");
	return (x > y) - (x < y);
}

KEEP int sort_things(int *v, int n)
{
	qsort(v, n, sizeof *v, cmp);
	asm volatile("");
	for (int i = 1; i < n; i++)
		if (v[i - 1] > v[i])
			return 3;
	return 0;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 64;
	int *v = malloc(sizeof *v * (n > 0 ? n : 1));
	for (int i = 0; i < n; i++)
		v[i] = (i * 7919) % 1009;
	int r = sort_things(v, n);
	free(v);
	if (argc > 2)
		printf("%ld\n", compares);
	return r;
}
