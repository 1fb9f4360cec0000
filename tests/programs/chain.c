/* chain N [MODE]: main -> a -> b -> c -> d, with d called N times (default 1).
 *
 * MODE (optional):
 *   write     d does one libc write() to /dev/null per call, so
 *             syscall:write fires exactly N times from d (via libc, which has
 *             no frame pointers on Debian).
 *   rawwrite  d issues the write syscall itself (inline asm), so the syscall
 *             instruction is inside d and a frame-pointer walk sees d..main.
 * Prints nothing. Exit status 0.
 *
 * KEEP (noipa) stops inlining, cloning (d.constprop.0 ...) and other
 * interprocedural changes at -O2; the `+ 1` after each call and the empty asm
 * stop the call from becoming a tail call, so every frame really exists. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define KEEP __attribute__((noinline, noipa, used))

volatile long counter;          /* what d does: observable and cheap */
static int mode;                /* 0 none, 1 write, 2 rawwrite */
static int devnull = -1;

static inline __attribute__((always_inline)) long raw_write(int fd, const void *buf, long n)
{
	long ret;
	asm volatile("syscall" : "=a"(ret)
		     : "0"((long)SYS_write), "D"((long)fd), "S"(buf), "d"(n)
		     : "rcx", "r11", "memory");
	return ret;
}

KEEP long d(long i)
{
	counter++;
	if (mode == 1)
		write(devnull, "x", 1);
	else if (mode == 2)
		raw_write(devnull, "x", 1);
	asm volatile("");
	return i;
}

KEEP long c(long n)
{
	long sum = 0;
	for (long i = 0; i < n; i++)
		sum += d(i);
	asm volatile("");
	return sum + 1;
}

KEEP long b(long n) { long r = c(n); asm volatile(""); return r + 1; }
KEEP long a(long n) { long r = b(n); asm volatile(""); return r + 1; }

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1;
	if (argc > 2 && strcmp(argv[2], "write") == 0)
		mode = 1;
	else if (argc > 2 && strcmp(argv[2], "rawwrite") == 0)
		mode = 2;
	if (mode && (devnull = open("/dev/null", O_WRONLY)) < 0)
		return 2;
	long r = a(n);
	asm volatile("" : : "r"(r));
	return 0;
}
