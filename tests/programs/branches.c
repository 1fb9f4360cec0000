/* branches N M [WAIT]: leaf is called N times through main -> left and M
 * times through main -> right (defaults 300 and 100), so a flame graph of a
 * uprobe on leaf has two columns whose widths are N : M.
 *
 * WAIT (optional) is wait_start.h's argument: "-" waits for a line on
 * stdin before the calls (for -p), a number sleeps that many ms. Without
 * it the calls start at once (for -c). Prints nothing. Exit status 0.
 *
 * KEEP and the empty asm after each call keep every frame real at -O2
 * (no inlining, cloning or tail calls), as in chain.c. */
#include <stdlib.h>

#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))

volatile long counter;

KEEP long leaf(long i)
{
	counter++;
	asm volatile("");
	return i;
}

KEEP long left(long n)
{
	long sum = 0;
	for (long i = 0; i < n; i++)
		sum += leaf(i);
	asm volatile("");
	return sum + 1;
}

KEEP long right(long n)
{
	long sum = 0;
	for (long i = 0; i < n; i++)
		sum += leaf(i);
	asm volatile("");
	return sum + 1;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 300;
	long m = argc > 2 ? atol(argv[2]) : 100;
	if (argc > 3 && wait_start(argv[3]) != 0)
		return 4;
	long r = left(n) + right(m);
	asm volatile("" : : "r"(r));
	return 0;
}
