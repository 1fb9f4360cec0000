/* rows_lib.so, built with -DLIB=a or -DLIB=b: work_LIB(n) spins n rounds
 * in spin_LIB; beside them ~3,000 small functions, so the library has
 * ~12,000 unwind rows (an object of some size, as a table holds a few). */
#define KEEP __attribute__((noinline, noipa, used))
#define CAT_(x, y) x##y
#define CAT(x, y) CAT_(x, y)

volatile long sink;

#define FILL(i) KEEP long CAT(CAT(fill_, LIB), i)(long x) \
	{ volatile long v[4]; v[0] = x + i; sink = v[0]; return v[0]; }
/* one macro per level: a macro is not expanded again inside itself */
#define F10(p) FILL(p##0) FILL(p##1) FILL(p##2) FILL(p##3) FILL(p##4) \
	FILL(p##5) FILL(p##6) FILL(p##7) FILL(p##8) FILL(p##9)
#define F100(p) F10(p##0) F10(p##1) F10(p##2) F10(p##3) F10(p##4) \
	F10(p##5) F10(p##6) F10(p##7) F10(p##8) F10(p##9)
#define F1000(p) F100(p##0) F100(p##1) F100(p##2) F100(p##3) F100(p##4) \
	F100(p##5) F100(p##6) F100(p##7) F100(p##8) F100(p##9)
F1000(1)
F1000(2)
F1000(3)

long CAT(spin_, LIB)(long n);

KEEP long CAT(spin_, LIB)(long n)
{
	long s = 0;
	for (long i = 0; i < n; i++)
		s += i ^ (s >> 3);
	sink = s;
	return s;
}

KEEP long CAT(work_, LIB)(long n)
{
	long r = CAT(spin_, LIB)(n);
	asm volatile("");
	return r;
}
