/* phases N MS FILE: N phases of MS milliseconds of wall-clock time each
 * (N <= 40), phase I spinning in its own function phase_I (phase_00,
 * phase_01, ...), so a CPU sample names the phase it was taken in. After
 * each phase a line `I START END` (CLOCK_REALTIME nanoseconds) is added to
 * FILE: when each function ran, to compare with a profile's intervals. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define KEEP __attribute__((noinline, noipa, used))

volatile unsigned long spins;

static long long clock_ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#define PHASE(N) KEEP void phase_##N(long long until) \
	{ do { for (int i = 0; i < 10000; i++) spins++; } \
	  while (clock_ns(CLOCK_MONOTONIC) < until); }

PHASE(00) PHASE(01) PHASE(02) PHASE(03) PHASE(04) PHASE(05) PHASE(06) PHASE(07)
PHASE(08) PHASE(09) PHASE(10) PHASE(11) PHASE(12) PHASE(13) PHASE(14) PHASE(15)
PHASE(16) PHASE(17) PHASE(18) PHASE(19) PHASE(20) PHASE(21) PHASE(22) PHASE(23)
PHASE(24) PHASE(25) PHASE(26) PHASE(27) PHASE(28) PHASE(29) PHASE(30) PHASE(31)
PHASE(32) PHASE(33) PHASE(34) PHASE(35) PHASE(36) PHASE(37) PHASE(38) PHASE(39)

static void (*const phases[])(long long) = {
	phase_00, phase_01, phase_02, phase_03, phase_04, phase_05, phase_06, phase_07,
	phase_08, phase_09, phase_10, phase_11, phase_12, phase_13, phase_14, phase_15,
	phase_16, phase_17, phase_18, phase_19, phase_20, phase_21, phase_22, phase_23,
	phase_24, phase_25, phase_26, phase_27, phase_28, phase_29, phase_30, phase_31,
	phase_32, phase_33, phase_34, phase_35, phase_36, phase_37, phase_38, phase_39,
};

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	int n = atoi(argv[1]);
	long long ms = atoll(argv[2]);
	FILE *out = fopen(argv[3], "w");
	if (!out || n < 1 || n > 40)
		return 2;
	for (int i = 0; i < n; i++) {
		long long start = clock_ns(CLOCK_REALTIME);
		phases[i](clock_ns(CLOCK_MONOTONIC) + ms * 1000000LL);
		fprintf(out, "%02d %lld %lld\n", i, start, clock_ns(CLOCK_REALTIME));
		fflush(out);
	}
	return fclose(out) != 0;
}
