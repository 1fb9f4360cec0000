/* drap [N]: main -> mid -> leaf. mid is variadic, has a 64-byte aligned
 * local and an alloca, so gcc -O2 realigns its stack through a "dynamic
 * realign argument pointer" (DRAP, %r10): its CFI says CFA = [rbp - 16]
 * and rbp saved at [rbp] (DWARF expressions, not register + offset).
 * Prints nothing. Exit status 0. */
#include <stdlib.h>

#define KEEP __attribute__((noinline, noipa, used))

KEEP long leaf(long *p)
{
	asm volatile("" : : "r"(p) : "memory");
	return p[0];
}

KEEP long mid(long n, ...)
{
	long v[4] __attribute__((aligned(64))) = {n, 1, 2, 3};
	long *q = __builtin_alloca(n * 8 + 8);
	q[0] = n;
	return leaf(v) + leaf(q) + 1;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1;
	long r = mid(n, 1, 2, 3, 4, 5, 6, 7, 8);
	asm volatile("" : : "r"(r));
	return 0;
}
