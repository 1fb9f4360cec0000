// cxx_throw [N]: main -> f1 -> f2 -> leaf, N times (default 1). leaf throws
// on odd calls and f2 catches. Inside its try block f2 also calls a function
// with stack arguments (pushed), so g++ -O2 -fomit-frame-pointer emits
// DW_CFA_GNU_args_size in f2's CFI, which an unwinder must parse past.
// Prints nothing. Exit status 0.
#include <cstdlib>
#include <stdexcept>

#define KEEP __attribute__((noinline, noipa, used))

volatile long counter;

KEEP long leaf(long i)
{
	counter++;
	if (i & 1)
		throw std::runtime_error("odd");
	asm volatile("");
	return i;
}

KEEP long many(long a, long b, long c, long d, long e, long f, long g, long h)
{
	if (h < 0)
		throw std::runtime_error("negative");
	return a + b + c + d + e + f + g + h;
}

KEEP long f2(long i)
{
	try {
		long m = many(i, 1, 2, 3, 4, 5, i + 6, i + 7);
		return leaf(i) + m;
	} catch (const std::exception &) {
		return -1;
	}
}

KEEP long f1(long i)
{
	long r = f2(i);
	asm volatile("");
	return r + 1;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1;
	long sum = 0;
	for (long i = 0; i < n; i++)
		sum += f1(i);
	asm volatile("" : : "r"(sum));
	return 0;
}
