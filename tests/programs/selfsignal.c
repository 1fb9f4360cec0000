/* selfsignal N [trap]: main -> raise_many sends itself SIGUSR1 (SIGTRAP
 * with "trap") N times, each handled (a handler that counts), then prints
 * the count: N. Under a tracer each signal is a stop that the tracer must
 * pass on, SIGTRAP too (a tracer's own stops are not signals). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KEEP __attribute__((noinline, noipa, used))

static volatile sig_atomic_t handled;

static void on_signal(int sig) { (void)sig; handled++; }

KEEP void raise_many(long n, int sig)
{
	for (long i = 0; i < n; i++)
		kill(getpid(), sig);
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1000;
	int sig = argc > 2 && !strcmp(argv[2], "trap") ? SIGTRAP : SIGUSR1;
	signal(sig, on_signal);
	raise_many(n, sig);
	printf("%ld\n", (long)handled);
	return 0;
}
