/* parked: two threads parked in read(2) under known chains, for `ustack dump`:
 * main -> main_outer -> main_inner -> read(stdin), and a pthread
 * side_start -> side_outer -> side_inner -> read(pipe). Each line on stdin
 * wakes the side thread, which prints "side N" and answers; main then
 * prints "main N". Exits 0 at the end of stdin. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#define KEEP __attribute__((noinline, noipa, used))

static int wake[2], done[2];

KEEP long side_inner(void)
{
	char c;
	return read(wake[0], &c, 1);
}

KEEP long side_outer(void)
{
	long n = 0;
	while (side_inner() == 1) {
		printf("side %ld\n", ++n);
		fflush(stdout);
		if (write(done[1], "x", 1) != 1)
			return -1;
	}
	return n;
}

KEEP void *side_start(void *arg)
{
	side_outer();
	return arg;
}

KEEP long main_inner(char *buf, long size)
{
	return read(0, buf, size);
}

KEEP long main_outer(void)
{
	char buf[256], c;
	long n = 0;
	while (main_inner(buf, sizeof buf) > 0) {
		if (write(wake[1], "x", 1) != 1 || read(done[0], &c, 1) != 1)
			return -1;
		printf("main %ld\n", ++n);
		fflush(stdout);
	}
	return n;
}

int main(void)
{
	pthread_t t;
	if (pipe(wake) || pipe(done) || pthread_create(&t, NULL, side_start, NULL))
		return 2;
	main_outer();
	close(wake[1]);
	pthread_join(t, NULL);
	return 0;
}
