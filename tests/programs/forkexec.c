/* forkexec N [-]: main forks a child, which calls in_child -> hit N times
 * (the parent's program, before any exec), then execs this program again as
 * `forkexec leaf N [FD]`, which calls after_exec -> leaf N times. The parent
 * waits for the child. With "-", the exec'd child instead tells the parent
 * it is done (a byte on pipe FD), the parent exits at once, and the child
 * waits for a line on stdin before it exits: it outlives the traced command
 * (a tracer reads its maps meanwhile). Exit status 0; 1 if fork, exec or
 * the child fails, 4 if stdin ends first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))

volatile long counter;

KEEP long hit(long i) { counter += i; asm volatile(""); return i; }
KEEP long leaf(long i) { counter -= i; asm volatile(""); return i; }

KEEP long in_child(long n)
{
	long sum = 0;
	for (long i = 0; i < n; i++)
		sum += hit(i);
	asm volatile("");
	return sum;
}

KEEP long after_exec(long n)
{
	long sum = 0;
	for (long i = 0; i < n; i++)
		sum += leaf(i);
	asm volatile("");
	return sum;
}

int main(int argc, char **argv)
{
	if (argc > 2 && strcmp(argv[1], "leaf") == 0) {
		after_exec(atol(argv[2]));
		if (argc < 4)
			return 0;
		int done = atoi(argv[3]);
		if (write(done, "x", 1) != 1)
			return 1;
		close(done);
		return wait_start("-");
	}
	char *n = argc > 1 ? argv[1] : "1";
	int hold = argc > 2 && strcmp(argv[2], "-") == 0;
	int done[2];
	if (hold && pipe(done) != 0)
		return 1;
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		char fd[16];
		in_child(atol(n));
		if (hold) {
			close(done[0]);
			snprintf(fd, sizeof fd, "%d", done[1]);
		}
		char *args[] = { argv[0], "leaf", n, hold ? fd : NULL, NULL };
		execv(argv[0], args);
		_exit(1);
	}
	if (hold) {
		char byte;
		close(done[1]);
		return read(done[0], &byte, 1) == 1 ? 0 : 1;
	}
	int status;
	if (waitpid(pid, &status, 0) != pid)
		return 1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
