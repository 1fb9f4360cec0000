/* parked_threads N: starts N-1 pthreads beside main, each blocked in
 * read(2) on a pipe (as a server's idle workers wait), prints "ready" once
 * all are parked, and exits at the end of stdin. What `ustack dump` stops. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int pipefd[2];

static void *park(void *arg)
{
	char c;
	(void)arg;
	while (read(pipefd[0], &c, 1) > 0)
		;
	return NULL;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 2;
	char line[64];
	pthread_t t;

	if (pipe(pipefd))
		return 1;
	for (int i = 1; i < n; i++)
		if (pthread_create(&t, NULL, park, NULL))
			return 2;
	puts("ready");
	fflush(stdout);
	while (fgets(line, sizeof line, stdin))
		;
	return 0;
}
