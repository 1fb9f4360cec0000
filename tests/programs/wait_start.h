/* How a target waits before its work: with "-" it blocks until a line
 * arrives on stdin (a test writes it once ustack says it is tracing: no
 * race); otherwise it sleeps ARG milliseconds (default 500), for people
 * attaching by hand. Returns 0 to go on, 4 when stdin ended first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int wait_start(const char *arg)
{
	if (arg && strcmp(arg, "-") == 0) {
		char line[64];
		return fgets(line, sizeof line, stdin) ? 0 : 4;
	}
	long ms = arg ? atol(arg) : 500;
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
	return 0;
}
