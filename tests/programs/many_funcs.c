/* many_funcs N [WAIT]: 1,024 functions fn_00000 .. fn_33333 (their number
 * in base 4), each called once from main through a table, then fn_00013
 * called N more times (default 0): a glob over the program's functions is
 * 1,024 uprobes whose counts are known.
 *
 * WAIT is wait_start.h's argument ("-": a line on stdin first, for -p).
 * Prints nothing. Exit status 0. KEEP keeps each function real at -O2. */
#include <stdlib.h>

#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))

volatile long counter;

#define F(n) KEEP long fn_##n(long i) { counter += i; asm volatile(""); return i + 1; }
#define F4(n) F(n##0) F(n##1) F(n##2) F(n##3)
#define F16(n) F4(n##0) F4(n##1) F4(n##2) F4(n##3)
#define F64(n) F16(n##0) F16(n##1) F16(n##2) F16(n##3)
#define F256(n) F64(n##0) F64(n##1) F64(n##2) F64(n##3)
F256(0) F256(1) F256(2) F256(3)

#define T(n) fn_##n,
#define T4(n) T(n##0) T(n##1) T(n##2) T(n##3)
#define T16(n) T4(n##0) T4(n##1) T4(n##2) T4(n##3)
#define T64(n) T16(n##0) T16(n##1) T16(n##2) T16(n##3)
#define T256(n) T64(n##0) T64(n##1) T64(n##2) T64(n##3)
static long (*const table[])(long) = { T256(0) T256(1) T256(2) T256(3) };

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 0;
	long sum = 0;

	if (argc > 2 && wait_start(argv[2]) != 0)
		return 4;
	for (unsigned i = 0; i < sizeof table / sizeof table[0]; i++)
		sum += table[i](i);
	for (long i = 0; i < n; i++)
		sum += fn_00013(i);
	return sum == 0;
}
