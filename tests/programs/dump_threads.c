/* Two threads blocked in known call chains, for `ustack dump`:
 *   main -> main_outer -> main_inner -> read(stdin)
 *   worker_start -> worker_outer -> worker_inner -> read(pipe)
 * It prints "ready <worker tid>" once the worker exists; the test waits for
 * both threads to sit in read(2). A line on stdin lets main hand it to the
 * worker, which prints it; then both end with fixed output, so a test sees
 * the program went on unchanged after being stopped. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int pipefd[2];
static volatile pid_t worker_tid;

__attribute__((noinline)) void worker_inner(void)
{
	char buf[64] = {0};
	ssize_t n = read(pipefd[0], buf, sizeof buf - 1);
	printf("worker got %zd: %s", n, buf);
	fflush(stdout);
}

__attribute__((noinline)) void worker_outer(void)
{
	worker_inner();
	__asm__ volatile("");
}

void *worker_start(void *arg)
{
	(void)arg;
	worker_tid = syscall(SYS_gettid);
	worker_outer();
	return NULL;
}

__attribute__((noinline)) void main_inner(void)
{
	char buf[64] = {0};
	ssize_t n = read(0, buf, sizeof buf - 1);
	if (write(pipefd[1], buf, n > 0 ? (size_t)n : 0) < 0)
		perror("write");
}

__attribute__((noinline)) void main_outer(void)
{
	main_inner();
	__asm__ volatile("");
}

int main(void)
{
	pthread_t t;
	if (pipe(pipefd) || pthread_create(&t, NULL, worker_start, NULL))
		return 1;
	while (!worker_tid)
		sched_yield();
	printf("ready %d\n", (int)worker_tid);
	fflush(stdout);
	main_outer();
	pthread_join(t, NULL);
	printf("main done\n");
	return 0;
}
