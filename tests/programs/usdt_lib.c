/* usdt_lib.so for usdt_dl: a USDT probe in a shared library, behind a
 * semaphore. lib_run(n) calls lib_step(i) for i in 0..n-1, which fires
 * demolib:tick (long) i, (int) -i when its is-enabled test holds;
 * lib_enabled() returns how often it held. Build with -fPIC -shared. */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

#define KEEP __attribute__((noinline, noipa, used))

unsigned short demolib_tick_semaphore __attribute__((section(".probes"), used));
static long enabled;

KEEP void lib_step(long i)
{
	if (__builtin_expect(demolib_tick_semaphore, 0)) {
		enabled++;
		STAP_PROBE2(demolib, tick, i, (int)-i);
	}
	asm volatile("");
}

KEEP long lib_run(long n)
{
	for (long i = 0; i < n; i++)
		lib_step(i);
	asm volatile("");
	return n;
}

KEEP long lib_enabled(void) { return enabled; }
