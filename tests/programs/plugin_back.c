/* plugin_back.so for dlopen_deep: plugin_back(back, n) calls back(i) n
 * times and returns the number of calls. Build with -fPIC -shared. */
#define KEEP __attribute__((noinline, noipa, used))

KEEP long plugin_back(long (*back)(long), long n)
{
	long calls = 0;
	for (long i = 0; i < n; i++) {
		back(i);
		calls++;
	}
	asm volatile("");
	return calls;
}
