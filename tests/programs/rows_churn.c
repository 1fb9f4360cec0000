/* rows_churn LIB_A LIB_B SECONDS [-]: dlopen()s LIB_A (rows_lib.so built
 * with -DLIB=a) at once, waits for a line on stdin with "-" (see
 * wait_start.h), then runs in three phases of SECONDS each: in LIB_A's
 * work, in LIB_B's (dlopen'd when the phase starts), in LIB_A's again.
 * Prints "calls A B A" (each phase's calls of its library's work) and
 * exits 0; 2 if a library fails, 4 if stdin ends before the line. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))

typedef long (*work_fn)(long);

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static work_fn open_work(const char *path, const char *name)
{
	void *h = dlopen(path, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return NULL;
	}
	return (work_fn)dlsym(h, name);
}

/* calls of `work` for `seconds` */
KEEP long run_in(work_fn work, double seconds)
{
	long calls = 0;
	double end = now() + seconds;
	while (now() < end) {
		work(20000);
		calls++;
	}
	asm volatile("");
	return calls;
}

int main(int argc, char **argv)
{
	if (argc < 4)
		return 1;
	work_fn a = open_work(argv[1], "work_a");
	if (!a)
		return 2;
	int waited = wait_start(argc > 4 ? argv[4] : "0");
	if (waited)
		return waited;
	double seconds = atof(argv[3]);
	long first = run_in(a, seconds);
	work_fn b = open_work(argv[2], "work_b");
	if (!b)
		return 2;
	long second = run_in(b, seconds);
	long third = run_in(a, seconds);
	printf("calls %ld %ld %ld\n", first, second, third);
	return 0;
}
