/* Two threads pass a byte back and forth through two pipes N times: each
 * pass blocks one thread in read() and wakes the other (a context-switch-
 * heavy workload for off-CPU tools). Prints the seconds the passes took.
 * usage: pingpong [N] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ping[2], pong[2];
static long n = 100000;

__attribute__((noinline)) static void pass(int in, int out)
{
	char c;
	if (read(in, &c, 1) != 1 || write(out, &c, 1) != 1)
		exit(3);
}

static void *ponger(void *arg)
{
	for (long i = 0; i < n; i++)
		pass(ping[0], pong[1]);
	return arg;
}

int main(int argc, char **argv)
{
	pthread_t t;
	struct timespec a, b;
	if (argc > 1)
		n = atol(argv[1]);
	if (pipe(ping) || pipe(pong))
		return 2;
	pthread_create(&t, NULL, ponger, NULL);
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++) {
		if (write(ping[1], "x", 1) != 1)
			return 3;
		char c;
		if (read(pong[0], &c, 1) != 1)
			return 3;
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	pthread_join(t, NULL);
	printf("%.6f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
	return 0;
}
