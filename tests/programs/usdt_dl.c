/* usdt_dl LIB N: dlopen()s LIB (usdt_lib.so), waits for a line on stdin (a
 * tracer attaches meanwhile, naming the library as the process maps it),
 * then main -> lib_run -> lib_step N times, and prints "enabled=K": how
 * often the library's semaphore-guarded probe was enabled. Exit status 0;
 * 2 if LIB fails to load, 4 if stdin ends before the line. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "wait_start.h"

int main(int argc, char **argv)
{
	if (argc < 3)
		return 1;
	void *h = dlopen(argv[1], RTLD_NOW);
	long (*run)(long) = h ? (long (*)(long))dlsym(h, "lib_run") : NULL;
	long (*enabled)(void) = h ? (long (*)(void))dlsym(h, "lib_enabled") : NULL;
	if (!run || !enabled) {
		fprintf(stderr, "usdt_dl: %s\n", dlerror());
		return 2;
	}
	int waited = wait_start("-");
	if (waited)
		return waited;
	run(atol(argv[2]));
	printf("enabled=%ld\n", enabled());
	return 0;
}
