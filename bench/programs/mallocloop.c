/* mallocloop N: waits for a line on stdin, then N times malloc(64) and
 * free of it, two calls below main (stacks of 6 frames through libc's
 * start); prints the nanoseconds per malloc+free pair by its own clock,
 * so a tool's start-up and exit are not in the figure. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define KEEP __attribute__((noinline, noipa, used))

void *volatile sink;

KEEP void pair(void)
{
	sink = malloc(64);
	free(sink);
	asm volatile("");
}

KEEP void loop(long n)
{
	for (long i = 0; i < n; i++)
		pair();
	asm volatile("");
}

static long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	char line[16];
	long n = argc > 1 ? atol(argv[1]) : 1000000;

	if (!fgets(line, sizeof line, stdin))
		return 4;
	long t0 = now_ns();
	loop(n);
	printf("%.1f\n", (double)(now_ns() - t0) / n);
	return 0;
}
