/* recurse [DEPTH] [N]: main -> rec(DEPTH) -> rec(DEPTH-1) -> ... -> rec(1)
 * -> leaf, N times (default DEPTH 200, N 1): DEPTH rec frames under main,
 * deeper than the kernel's perf_event_max_stack (127). Each rec frame holds
 * a 64-byte local, so the stack below main is ~DEPTH * 100 bytes: more than
 * the default 8 KiB stack copy, less than the maximum 64 KiB.
 * Build with -fno-optimize-sibling-calls (the `+ 1` already stops the tail
 * call). Prints nothing. Exit status 0 (3 if leaf ran a wrong number of times). */
#include <stdlib.h>

#define KEEP __attribute__((noinline, noipa, used))

volatile long leaves;

KEEP long leaf(volatile char *buf)
{
	leaves++;
	asm volatile("");
	return buf[0];
}

KEEP long rec(long depth)
{
	volatile char buf[64];
	buf[0] = (char)depth;
	long r = depth <= 1 ? leaf(buf) : rec(depth - 1);
	asm volatile("");
	return r + buf[0] + 1;
}

int main(int argc, char **argv)
{
	long depth = argc > 1 ? atol(argv[1]) : 200;
	long n = argc > 2 ? atol(argv[2]) : 1;
	long sum = 0;
	for (long i = 0; i < n; i++)
		sum += rec(depth);
	asm volatile("" : : "r"(sum));
	return leaves == n ? 0 : 3;
}
