/* libc_calls N: main calls libc's strlen, memcpy (sizes the compiler cannot
 * see, so neither is inlined) and printf + fflush N times each, so each of
 * strlen, memcpy and new_do_write (libc's internal writer, named only in
 * libc's debug file) runs exactly N times from main. Output goes to stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char src[4096] = "hello";
static char dst[4096];

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1, total = 0;
	for (long i = 0; i < n; i++) {
		total += strlen(argv[0] + (i & 1));
		memcpy(dst, src, (size_t)(n + i) % sizeof dst);
		printf("%ld\n", total);
		fflush(stdout);
	}
	return 0;
}
