/* checksum [N]: folds the numbers 0..N-1 (default 1000) into a 64-bit hash
 * with mix() and prints "checksum %016llx". mix() has the usual kinds of
 * -O2 instructions: pushes, calls, rip-relative loads and stores, 10-byte
 * immediates, branches. A probe that lands inside one of them changes the
 * printed value or kills the program; a probe on an instruction start
 * changes nothing. Exit status 0. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define KEEP __attribute__((noinline, noipa, used))

static uint64_t table[16];

KEEP uint64_t step(uint64_t h) { return h ^ (h >> 29); }

KEEP uint64_t mix(uint64_t h, uint64_t x)
{
	uint64_t a = step(h ^ x * 0x9e3779b97f4a7c15ULL);
	uint64_t b = step(a + table[x & 15]);
	table[(x >> 4) & 15] += b;
	b = (b << 27) | (b >> 37);
	b = b * 5 + 0x52dce729;
	if (b & 0x100)
		b += 0x1234567890abcdefULL;
	else
		b ^= b >> 33;
	return b ^ a;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1000;
	uint64_t h = 0;
	for (long i = 0; i < n; i++)
		h = mix(h, (uint64_t)i);
	printf("checksum %016llx\n", (unsigned long long)h);
	return 0;
}
