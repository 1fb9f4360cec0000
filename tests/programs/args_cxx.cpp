// args_cxx [-|MS] [N]: a C++ method with an implicit `this`, for arguments
// by name against fetch-args by register and gdb. Counter::add(k, tag) is
// called N times with k = 10 + i, tag = "tag"; returns the new total.
#include <cstdlib>
#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))

namespace shop {
class Counter {
public:
	long total = 0;
	KEEP long add(int k, const char *tag);
};

long Counter::add(int k, const char *tag)
{
	total += k + tag[0];
	asm volatile("");
	return total;
}
}

int main(int argc, char **argv)
{
	if (wait_start(argc > 1 ? argv[1] : nullptr))
		return 4;
	int n = argc > 2 ? atoi(argv[2]) : 1;
	static shop::Counter counter;
	for (int i = 0; i < n; i++)
		counter.add(10 + i, "tag");
	return 0;
}
