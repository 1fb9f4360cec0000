/* busy [SECONDS] [-]: main -> work -> spin_here, spinning for SECONDS of its
 * own CPU time (default 2, fractions allowed) so that a CPU profile attributes
 * most samples to spin_here, and a profile at F Hz sees about F * SECONDS
 * samples however busy the machine is. The clock is read only every
 * SPIN_CHUNK iterations so that its cost stays negligible. With "-" it
 * first waits for a line on stdin (see wait_start.h). Exit status 0; 4 if
 * stdin ends before the line. */
#include <stdlib.h>
#include <time.h>

#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))
#define SPIN_CHUNK 200000

volatile unsigned long spins;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

KEEP void spin_here(double seconds)
{
	double end = now() + seconds;
	do {
		for (int i = 0; i < SPIN_CHUNK; i++)
			spins++;
	} while (now() < end);
}

KEEP void work(double seconds) { spin_here(seconds); asm volatile(""); }

int main(int argc, char **argv)
{
	if (argc > 2 && wait_start(argv[2]))
		return 4;
	work(argc > 1 ? strtod(argv[1], NULL) : 2.0);
	return 0;
}
