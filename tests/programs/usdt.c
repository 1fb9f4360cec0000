/* usdt N OUTFILE: USDT probes of <sys/sdt.h> (provider "demo") fired a known
 * number of times from main -> work -> step, with 0 to 3 arguments of
 * different sizes and signs; one probe is guarded by a semaphore.
 *
 * Per i in 0..N-1, step(i) fires:
 *   demo:zero      ()
 *   demo:one       (int) -3*i
 *   demo:two       (unsigned char) 200+i, (long) i*1000000007 - 3
 *   demo:three     (short) -100-i, (unsigned long) 0xffffffff00000000+i,
 *                  (const char *) "alpha", "beta" or "gamma" (i % 3)
 *   demo:konst     (int) the constant -5, (long) i
 *   demo:guarded   (int) i, only when its is-enabled test holds
 *   demo:twice     (int) 1 from site_a and 2 from site_b: one name, two sites
 *   demo:global    globals, read where they are: (long) gbase (1000+N),
 *                  (long) garr[1] (20), (const char *) gname ("delta")
 * and writes "enabled=K" to OUTFILE: how often demo:guarded's is-enabled
 * test held (the kernel raises its semaphore while it is traced).
 * KEEP stops inlining, so every frame of the chain exists. */
#define _SDT_HAS_SEMAPHORES 1
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

#define KEEP __attribute__((noinline, noipa, used))

/* with _SDT_HAS_SEMAPHORES every probe names a semaphore; only guarded's
 * is tested by the program, the others fire whatever their value */
#define SEMAPHORE(name) \
	unsigned short demo_##name##_semaphore __attribute__((section(".probes"), used))
SEMAPHORE(zero); SEMAPHORE(one); SEMAPHORE(two); SEMAPHORE(three);
SEMAPHORE(konst); SEMAPHORE(guarded); SEMAPHORE(twice); SEMAPHORE(global);
#define DEMO_GUARDED_ENABLED() __builtin_expect(demo_guarded_semaphore, 0)

static const char *const names[] = { "alpha", "beta", "gamma" };
long gbase = 1000;
long garr[3] = { 10, 20, 30 };
const char *gname = "delta";
static long enabled;

KEEP void site_a(void) { STAP_PROBE1(demo, twice, 1); asm volatile(""); }
KEEP void site_b(void) { STAP_PROBE1(demo, twice, 2); asm volatile(""); }

KEEP void step(long i)
{
	int one = (int)(-3 * i);
	unsigned char small = (unsigned char)(200 + i);
	long big = i * 1000000007L - 3;
	short neg = (short)(-100 - i);
	unsigned long high = 0xffffffff00000000UL + (unsigned long)i;
	const char *name = names[i % 3];
	volatile char first = name[0];	/* its page is then in memory, where
					 * bpftrace (BPF) can read the string */
	(void)first;

	STAP_PROBE(demo, zero);
	STAP_PROBE1(demo, one, one);
	STAP_PROBE2(demo, two, small, big);
	STAP_PROBE3(demo, three, neg, high, name);
	STAP_PROBE2(demo, konst, -5, i);
	if (DEMO_GUARDED_ENABLED()) {
		enabled++;
		STAP_PROBE1(demo, guarded, (int)i);
	}
	STAP_PROBE3(demo, global, gbase, garr[1], gname);
	site_a();
	site_b();
	asm volatile("");
}

KEEP void work(long n)
{
	for (long i = 0; i < n; i++)
		step(i);
	asm volatile("");
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1;
	gbase += n;
	work(n);
	if (argc > 2) {
		FILE *f = fopen(argv[2], "w");
		if (!f)
			return 3;
		fprintf(f, "enabled=%ld\n", enabled);
		fclose(f);
	}
	return 0;
}
