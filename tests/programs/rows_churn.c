/* rows_churn SECONDS WAIT LIB:FUNCTION...: waits as wait_start.h says
 * (WAIT "-": for a line on stdin), then runs in each phase in turn for
 * SECONDS: dlopen()s LIB (again: the same handle) and calls its FUNCTION
 * (long FUNCTION(long), a rows_lib.so's work_LIB) until the phase ends.
 * Prints "calls" and each phase's calls, exits 0; 2 if a library or
 * function is missing, 4 if stdin ends before the line. The first phase's
 * library is opened before the wait: mapped when a tracer attaches. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))
#define MAX_PHASES 256

typedef long (*work_fn)(long);

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* "LIB:FUNCTION"'s function, its library opened */
static work_fn open_work(char *phase)
{
	char *colon = strrchr(phase, ':');
	if (!colon)
		return NULL;
	*colon = 0;
	void *h = dlopen(phase, RTLD_NOW);
	*colon = ':';
	if (!h) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return NULL;
	}
	return (work_fn)dlsym(h, colon + 1);
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
	static long calls[MAX_PHASES];
	int phases = argc - 3;
	if (phases < 1 || phases > MAX_PHASES)
		return 1;
	if (!open_work(argv[3]))
		return 2;
	int waited = wait_start(argv[2]);
	if (waited)
		return waited;
	double seconds = atof(argv[1]);
	for (int i = 0; i < phases; i++) {
		work_fn work = open_work(argv[3 + i]);
		if (!work)
			return 2;
		calls[i] = run_in(work, seconds);
	}
	printf("calls");
	for (int i = 0; i < phases; i++)
		printf(" %ld", calls[i]);
	printf("\n");
	return 0;
}
