/* oneshot: prints the wall-clock time it started (as `date +%s.%N` does),
 * then calls d() once and writes one byte to /dev/null: one uprobe hit, one
 * write(2). bench/oneshot.py runs it under each tool. */
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline, used)) int d(int i)
{
	asm volatile("");
	return i + 1;
}

int main(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	printf("%lld.%09ld\n", (long long)ts.tv_sec, ts.tv_nsec);
	fflush(stdout);
	int fd = open("/dev/null", O_WRONLY);
	int r = d(fd);
	if (write(fd, "x", 1) != 1)
		return 1;
	return r > 0 ? 0 : 2;
}
