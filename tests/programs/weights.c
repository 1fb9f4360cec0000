/* weights [write] [-]: take() called with known arguments from two chains, so
 * the sums of its arguments per stack are known:
 *   main -> via_a -> take: 3 calls, n = 100, 200, 300   (sum 600)
 *   main -> via_b -> take: 5 calls, n = 10 each         (sum 50)
 * take(long n, const struct req *r, const char *tag, int delta):
 *   r->size (u32 at +8) = n / 10 (sums 60 and 5), tag = "a" or "b",
 *   delta = -n (sums -600 and -50).
 * With `write`, take writes n bytes to /dev/null: syscall:write's count
 * sums 600 and 50 per stack the same way. Nothing else is written.
 * With `-`, the calls wait for a line on stdin (wait_start.h).
 * KEEP stops inlining, cloning and tail calls: every frame exists. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))

struct req {
	long id;
	unsigned int size;
};

volatile long total;
static int devnull = -1;
static char buf[512];

KEEP long take(long n, const struct req *r, const char *tag, int delta)
{
	total += n + r->size + tag[0] + delta;
	if (devnull >= 0 && write(devnull, buf, (size_t)n) != n)
		exit(2);
	asm volatile("");
	return total;
}

KEEP long via_a(long n)
{
	struct req r = { 1, (unsigned int)(n / 10) };

	return take(n, &r, "a", (int)-n) + 1;
}

KEEP long via_b(long n)
{
	struct req r = { 2, (unsigned int)(n / 10) };

	return take(n, &r, "b", (int)-n) + 1;
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "write") == 0)
			devnull = open("/dev/null", O_WRONLY);
		else if (strcmp(argv[i], "-") == 0 && wait_start("-"))
			return 4;
	}
	for (long n = 100; n <= 300; n += 100)
		via_a(n);
	for (int i = 0; i < 5; i++)
		via_b(10);
	return 0;
}
