/* dlopen_main [SLEEP_MS|-] [PLUGIN] [N] [-]: waits so that a tracer can attach:
 * SLEEP_MS ms (default 500), or with "-" until a line arrives on stdin
 * (written once the tracer is attached: no race); then dlopen()s PLUGIN (default: plugin.so beside this
 * executable) and calls main -> run_plugin -> plugin_entry -> plugin_leaf,
 * plugin_leaf N times (default 3); with a last "-", then waits for another
 * line before it exits (the plugin still mapped). Exit status 0; 2 if the plugin fails,
 * 4 if stdin ends before the line. */
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))

KEEP long run_plugin(const char *path, long n)
{
	void *h = dlopen(path, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return -1;
	}
	long (*entry)(long) = (long (*)(long))dlsym(h, "plugin_entry");
	if (!entry) {
		fprintf(stderr, "dlsym: %s\n", dlerror());
		return -1;
	}
	long r = entry(n);
	asm volatile("");
	return r;
}

int main(int argc, char **argv)
{
	long n = argc > 3 ? atol(argv[3]) : 3;
	char path[PATH_MAX];
	if (argc > 2) {
		snprintf(path, sizeof path, "%s", argv[2]);
	} else {
		char self[PATH_MAX];
		snprintf(self, sizeof self, "%s", argv[0]);
		snprintf(path, sizeof path, "%s/plugin.so", dirname(self));
	}
	int waited = wait_start(argc > 1 ? argv[1] : NULL);
	if (waited)
		return waited;
	if (run_plugin(path, n) != n)
		return 2;
	return argc > 4 ? wait_start(argv[4]) : 0;
}
