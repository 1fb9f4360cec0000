/* latency WAIT MODE N OUT: calls of known durations, N rounds, each timed
 * by the program itself too.
 *
 * WAIT: "-" waits for a line on stdin first (wait_start.h), "go" does not.
 * MODE:
 *   naps  short_naps -> nap(1.3 ms), nap(2.6 ms); long_naps -> nap(5.2 ms),
 *         nap(10.4 ms): one call of nap per log2-millisecond bucket
 *         [1,2) [2,4) [4,8) [8,16) per round, each well inside it; nap
 *         sleeps with one nanosleep (libc: clock_nanosleep(2)).
 *   rec   rec_nap(3): a recursion whose levels last 10.4, 5.2, 2.6 and
 *         1.3 ms (outermost first): each level sleeps, then calls the next.
 *   tail  tail_nap(1.3 ms) returns through its RET, tail_nap(10.4 ms)
 *         leaves through a tail call (jmp nap): a RET probe never sees it.
 * OUT: the file where the program writes how long the calls of nap (naps)
 * or rec_nap (rec) took by its own clock, as `ustack latency --units ms`
 * buckets them: "[1ms, 2ms) 3" lines (a loaded machine may wake a sleeper
 * late: the program's clock and ustack's see the same delay).
 * Exit status 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))

static long buckets[65];

static long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void record(long ns)
{
	long ms = ns / 1000000;
	buckets[ms ? 64 - __builtin_clzl(ms) : 0]++;
}

#define TIMED(call) do { long t0_ = now_ns(); call; record(now_ns() - t0_); } while (0)

KEEP void nap(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
	nanosleep(&ts, NULL);
	asm volatile("");
}

KEEP void short_naps(void) { TIMED(nap(1300)); TIMED(nap(2600)); asm volatile(""); }
KEEP void long_naps(void) { TIMED(nap(5200)); TIMED(nap(10400)); asm volatile(""); }

/* a sibling call for long naps: `jmp nap`, nap's RET returns for it */
KEEP void tail_nap(long us)
{
	if (us > 5000) {
		nap(us);
		return;
	}
	nap(us);
	asm volatile("");
}

/* level `depth` lasts 1.3 ms * 2^depth: it sleeps what its callee does not */
KEEP long rec_nap(long depth)
{
	long r = 0;
	nap(depth ? 1300L << (depth - 1) : 1300);
	if (depth)
		TIMED(r = rec_nap(depth - 1));
	asm volatile("");
	return r + 1;
}

int main(int argc, char **argv)
{
	if (argc < 5)
		return 2;
	if (strcmp(argv[1], "go") != 0 && wait_start(argv[1]))
		return 4;
	long n = atol(argv[3]);
	int rec = strcmp(argv[2], "rec") == 0, tail = strcmp(argv[2], "tail") == 0;
	for (long i = 0; i < n; i++) {
		if (rec) {
			TIMED(rec_nap(3));
		} else if (tail) {
			TIMED(tail_nap(1300));
			TIMED(tail_nap(10400));
		} else {
			short_naps();
			long_naps();
		}
	}
	FILE *out = fopen(argv[4], "w");
	if (!out)
		return 2;
	for (int b = 0; b < 65; b++) {
		if (!buckets[b])
			continue;
		if (b == 0)
			fprintf(out, "[0, 1ms) %ld\n", buckets[b]);
		else
			fprintf(out, "[%ldms, %ldms) %ld\n", 1L << (b - 1), 1L << b, buckets[b]);
	}
	return fclose(out) ? 2 : 0;
}
