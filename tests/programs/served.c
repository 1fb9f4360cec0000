/* served CALLS [- [SPIN]]: the program whose debug file tests serve from a
 * debuginfod server once it is stripped. With "-" it first waits for a
 * line on stdin (see wait_start.h). Then main -> outer -> sink CALLS times,
 * through middle and inner, always inlined into outer (as in inline.c);
 * then spin() counts to SPIN million (default 0), for timed samples. */
#include <stdlib.h>

#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))
#define INLINE static inline __attribute__((always_inline))

volatile long counter;

KEEP void sink(long x)
{
	counter += x;
	asm volatile("");
}

INLINE long inner(long x)
{
	sink(x);
	return x * 2;
}

INLINE long middle(long x)
{
	long r = inner(x);
	r += inner(x + 1);
	return r;
}

KEEP long outer(long n)
{
	long s = 0;
	for (long i = 0; i < n; i++)
		s += middle(i);
	asm volatile("");
	return s;
}

KEEP void spin(long millions)
{
	for (long i = 0; i < millions * 1000000; i++)
		counter++;
}

int main(int argc, char **argv)
{
	if (argc > 2 && wait_start(argv[2]))
		return 4;
	long r = outer(argc > 1 ? atol(argv[1]) : 1);
	spin(argc > 3 ? atol(argv[3]) : 0);
	asm volatile("" : : "r"(r));
	return 0;
}
