/* dlopen_deep PLUGIN DEPTH N [-]: waits for a line on stdin with "-" (see
 * wait_start.h), then main -> deep(DEPTH) -> ... -> deep(1), which dlopen()s
 * PLUGIN (plugin_back.so) and calls plugin_back(back, N) at once, which
 * calls back N times (each call leaks a malloc'd block of 64 + i bytes):
 * stacks through the new library before a tracer can have read its mapping, under DEPTH frames of ~300 bytes each (DEPTH 100:
 * ~30 KiB, more than an 8 KiB copy, fewer than 128 frames). Exit status 0;
 * 2 if the plugin fails, 4 if stdin ends before the line. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))

volatile long backs;
void *volatile kept;		/* each call's block, never freed: a leak */

KEEP long back(long i)
{
	backs++;
	kept = malloc(64 + i);
	asm volatile("");
	return i;
}

KEEP long call_plugin(const char *path, long n)
{
	void *h = dlopen(path, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return -1;
	}
	long (*entry)(long (*)(long), long) =
		(long (*)(long (*)(long), long))dlsym(h, "plugin_back");
	long r = entry ? entry(back, n) : -1;
	asm volatile("");
	return r;
}

KEEP long deep(const char *path, long depth, long n)
{
	volatile char buf[256];
	buf[0] = (char)depth;
	long r = depth <= 1 ? call_plugin(path, n) : deep(path, depth - 1, n);
	asm volatile("");
	return r + buf[0] - (char)depth;
}

int main(int argc, char **argv)
{
	if (argc < 4)
		return 1;
	int waited = wait_start(argc > 4 ? argv[4] : "0");
	if (waited)
		return waited;
	long n = atol(argv[3]);
	return deep(argv[1], atol(argv[2]), n) == n ? 0 : 2;
}
