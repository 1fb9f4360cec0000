/* threads [SLEEP_MS|-] [N] [THREADS]: waits so that a tracer can attach: SLEEP_MS ms
 * (default 500), or with "-" until a line arrives on stdin (written once the
 * tracer is attached: no race); then starts THREADS (default 2, at most 64) pthreads, each running
 * worker -> thread_a -> thread_d with thread_d called N times (default 5)
 * per thread; joins. Exit status 0; 3 if thread_d ran a wrong number of
 * times, 4 if stdin ends before the line. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))
#define MAX_THREADS 64

volatile long counter;
static long per_thread = 5;

KEEP long thread_d(long i)
{
	__atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
	asm volatile("");
	return i;
}

KEEP long thread_a(long n)
{
	long sum = 0;
	for (long i = 0; i < n; i++)
		sum += thread_d(i);
	asm volatile("");
	return sum + 1;
}

KEEP void *worker(void *arg)
{
	long r = thread_a(per_thread);
	asm volatile("" : : "r"(r));
	return arg;
}

int main(int argc, char **argv)
{
	if (argc > 2)
		per_thread = atol(argv[2]);
	int waited = wait_start(argc > 1 ? argv[1] : NULL);
	if (waited)
		return waited;

	int nthreads = argc > 3 ? atoi(argv[3]) : 2;
	if (nthreads < 1 || nthreads > MAX_THREADS)
		return 2;
	pthread_t t[MAX_THREADS];
	for (int i = 0; i < nthreads; i++)
		if (pthread_create(&t[i], NULL, worker, NULL))
			return 2;
	for (int i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
	return counter == nthreads * per_thread ? 0 : 3;
}
