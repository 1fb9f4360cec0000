/* Blocks a known number of times and nothing else: NAPS nanosleeps of MS
 * milliseconds each under nap_fn, then prints its pid, the naps taken and
 * their time (ms, measured around the calls). Its first block is
 * the first switch of a fresh process, whose memory map the kernel's
 * find_vma has not yet been asked about. With DEPTH, the naps are taken
 * under DEPTH frames of deep() (~100 bytes each), deeper than the
 * in-kernel walk's 128 frames and the default 8 KiB stack copy.
 * usage: naps [-|MS] [NAPS] [MS_PER_NAP] [DEPTH]; prints "PID NAPS TOTAL_MS" */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "wait_start.h"

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

__attribute__((noinline)) double nap_fn(int ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	double t0 = now_ms();
	nanosleep(&ts, NULL);
	return now_ms() - t0;
}

__attribute__((noinline, noipa)) double deep(int depth, int naps, int ms)
{
	volatile char frame[64];	/* a frame of its own size */
	double total = 0;

	frame[0] = (char)depth;
	if (depth > 1)
		total = deep(depth - 1, naps, ms);
	else
		for (int i = 0; i < naps; i++)
			total += nap_fn(ms);
	return total + frame[0] * 0.0;	/* not a tail call */
}

int main(int argc, char **argv)
{
	int naps = argc > 2 ? atoi(argv[2]) : 5, ms = argc > 3 ? atoi(argv[3]) : 20;
	int depth = argc > 4 ? atoi(argv[4]) : 0;
	double total = 0;

	if (wait_start(argc > 1 ? argv[1] : NULL))
		return 4;
	if (depth > 0)
		total = deep(depth, naps, ms);
	else
		for (int i = 0; i < naps; i++)
			total += nap_fn(ms);
	printf("%d %d %.3f\n", (int)getpid(), naps, total);
	return 0;
}
