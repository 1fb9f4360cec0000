/* forkexec N: main forks a child, which calls in_child -> hit N times (the
 * parent's program, before any exec), then execs this program again as
 * `forkexec leaf N`, which calls after_exec -> leaf N times. The parent
 * waits for the child. Exit status 0; 1 if fork, exec or the child fails. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
		return 0;
	}
	char *n = argc > 1 ? argv[1] : "1";
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		in_child(atol(n));
		char *args[] = { argv[0], "leaf", n, NULL };
		execv(argv[0], args);
		_exit(1);
	}
	int status;
	if (waitpid(pid, &status, 0) != pid)
		return 1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
