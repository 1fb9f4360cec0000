/* args [-|MS] [N]: calls functions whose parameters have known values, for
 * arguments by name (DWARF) against fetch-args by register and gdb.
 *
 *   mix(i, len, buf, c, neg, flag, ok, ch, big, last) per call i = 0..N-1:
 *       int, unsigned long (a typedef), const char * ("hello"), an enum,
 *       short (negative), unsigned char, _Bool, char, then two stack-passed
 *       args (long, a pointer), the 7th and 8th+ integer arguments;
 *   diff(a, b) returns a - b: -3 for each call (a typed $retval);
 *   color_name(c) returns "blue" (a char * $retval), is_odd(i) a _Bool;
 *   by_value(p, x) takes a struct by value (refused by name) and a double.
 * Waits for a line on stdin first with "-" (wait_start.h). Prints nothing.
 * KEEP (noipa): no inlining or cloning, the ABI's registers at entry. */
#include <stdlib.h>
#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))

enum color { RED, GREEN = 5, BLUE };
typedef unsigned long size_type;
struct pair { long a, b; };

volatile long sink;

KEEP int mix(int i, size_type len, const char *buf, enum color c, short neg,
	     unsigned char flag, _Bool ok, char ch, long big, struct pair *last)
{
	sink += i + len + buf[0] + c + neg + flag + ok + ch + big + (long)last;
	asm volatile("");
	return i * 2;
}

KEEP int diff(int a, int b)
{
	asm volatile("");
	return a - b;
}

KEEP const char *color_name(enum color c)
{
	return c == BLUE ? "blue" : "other";
}

KEEP _Bool is_odd(int i)
{
	return i & 1;
}

KEEP double by_value(struct pair p, double x)
{
	return p.a + p.b + x;
}

int main(int argc, char **argv)
{
	if (wait_start(argc > 1 ? argv[1] : NULL))
		return 4;
	int n = argc > 2 ? atoi(argv[2]) : 1;
	static struct pair last = { 1, 2 };
	for (int i = 0; i < n; i++) {
		mix(i, 12 + i, "hello", BLUE, -7 - i, 200, i & 1, 'A' + i,
		    -1000000000000L, &last);
		sink += diff(i, i + 3);
		sink += (long)by_value(last, 0.5);
		sink += color_name(BLUE)[0] + is_odd(i);
	}
	return 0;
}
