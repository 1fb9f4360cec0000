/* vdso_loop [SECONDS]: main -> clock_loop, reading the clock in a tight loop
 * for SECONDS (default 1, fractions allowed), so a CPU profile finds most
 * samples inside the vDSO's clock_gettime. Exit status 0. */
#include <stdlib.h>
#include <time.h>

#define KEEP __attribute__((noinline, noipa, used))

KEEP void clock_loop(double seconds)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	double end = ts.tv_sec + ts.tv_nsec / 1e9 + seconds;
	do
		clock_gettime(CLOCK_MONOTONIC, &ts);
	while (ts.tv_sec + ts.tv_nsec / 1e9 < end);
}

int main(int argc, char **argv)
{
	clock_loop(argc > 1 ? strtod(argv[1], NULL) : 1.0);
	return 0;
}
