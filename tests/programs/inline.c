/* inline N: main -> outer -> middle -> inner -> sink, N times, where middle
 * and inner are always inlined into outer at -O2 (two copies of inner in
 * each middle). The return address of each call to sink lies in outer's
 * code but in the scopes of inner and middle: what --inlines must expand and
 * eu-addr2line -i lists. sink and outer are real calls (noipa). */
#include <stdlib.h>

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

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1;
	long r = outer(n);
	asm volatile("" : : "r"(r));
	return 0;
}
