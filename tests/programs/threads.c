/* threads [SLEEP_MS] [N]: sleeps SLEEP_MS (default 500) so a tracer can
 * attach, then starts 2 pthreads, each running worker -> thread_a -> thread_d
 * with thread_d called N times (default 5) per thread; joins; exit status 0. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define KEEP __attribute__((noinline, noipa, used))
#define NTHREADS 2

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
	long ms = argc > 1 ? atol(argv[1]) : 500;
	if (argc > 2)
		per_thread = atol(argv[2]);
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);

	pthread_t t[NTHREADS];
	for (int i = 0; i < NTHREADS; i++)
		if (pthread_create(&t[i], NULL, worker, NULL))
			return 2;
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(t[i], NULL);
	return counter == NTHREADS * per_thread ? 0 : 3;
}
