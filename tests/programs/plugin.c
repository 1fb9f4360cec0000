/* plugin.so for dlopen_main: plugin_entry(n) calls plugin_leaf n times and
 * returns the number of calls. Build with -fPIC -shared. */
#define KEEP __attribute__((noinline, noipa, used))

volatile long plugin_counter;

KEEP long plugin_leaf(long i)
{
	plugin_counter++;
	asm volatile("");
	return i;
}

KEEP long plugin_entry(long n)
{
	long calls = 0;
	for (long i = 0; i < n; i++) {
		plugin_leaf(i);
		calls++;
	}
	asm volatile("");
	return calls;
}
