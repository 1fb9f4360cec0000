/* sighandler [SECONDS]: main -> spin (busy loop) is interrupted by SIGALRM
 * every 10 ms; handler -> handler_leaf runs on the interrupted stack. An
 * unwinder must cross the kernel's signal frame (__restore_rt, ucontext_t)
 * to get from handler back to spin and main. Runs SECONDS (default 0.2).
 * Prints nothing. Exit status 0. */
#include <signal.h>
#include <stdlib.h>
#include <sys/time.h>

#define KEEP __attribute__((noinline, noipa, used))

volatile long spins, handled;
volatile sig_atomic_t done;

KEEP void handler_leaf(void) { handled++; asm volatile(""); }

KEEP void handler(int sig)
{
	(void)sig;
	handler_leaf();
	asm volatile("");
}

KEEP void spin(double seconds)
{
	long limit = (long)(seconds * 100);   /* ticks of 10 ms */
	while (handled < limit)
		spins++;
	asm volatile("");
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 0.2;
	struct sigaction sa = {0};
	sa.sa_handler = handler;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, NULL);
	struct itimerval it = {{0, 10000}, {0, 10000}};
	setitimer(ITIMER_REAL, &it, NULL);
	spin(seconds);
	struct itimerval off = {{0, 0}, {0, 0}};
	setitimer(ITIMER_REAL, &off, NULL);
	return 0;
}
