/* cold_part [N]: work() folds N numbers (default 100000) into a sum; its
 * rare branch calls a cold function, so gcc -O2 moves that branch out of
 * work into a separate fragment, work.cold, reached by a jump from inside
 * work (after its pushes: [sp] holds a saved register, no return address).
 * main keeps a value in a callee-saved register across the call and prints
 * "work RESULT CHECK": a return probe at work.cold replaces that saved
 * register and changes what is printed. Exit status 0. */
#include <stdio.h>
#include <stdlib.h>

#define KEEP __attribute__((noinline, noipa, used))

__attribute__((noinline, noipa, cold)) long rare(long acc, long i)
{
	return acc ^ (i * 0x9e3779b97f4a7c15LL);
}

KEEP long work(long n, long init)
{
	long acc = init, k = init * 3 + 1;
	for (long i = 0; i < n; i++) {
		acc = acc * 31 + (i ^ k);
		if (__builtin_expect((acc & 0xff) == 0x5a, 0))
			acc = rare(acc, i) + k;
		k += acc >> 7;
	}
	return acc;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	long kept = n * 7 + 3;          /* lives in a callee-saved register */
	long result = work(n, kept & 0xffff);
	printf("work %ld %ld\n", result, result ^ (kept * kept));
	return 0;
}
