/* ct_app N: the program of the container tests. Copies a trampoline
 * (push %rbp; mov %rsp,%rbp; call *%rdi; pop %rbp; ret) into anonymous
 * executable memory and names it jitted_ct in /tmp/perf-PID.map, PID as
 * its own pid namespace numbers it (a JIT in a container does that); says
 * "ready" and waits for a line on stdin; then main -> app_work ->
 * jitted_ct -> ct_lib_entry -> ct_lib_inner -> getppid, N times; then
 * "done", and it exits at the end of stdin. A map it cannot write (the
 * symlink test) is no error. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))

long ct_lib_entry(void);

static const unsigned char trampoline[] = {
	0x55, 0x48, 0x89, 0xe5, 0xff, 0xd7, 0x5d, 0xc3,
};

typedef long (*jitted)(long (*)(void));

KEEP long app_work(jitted f) { return f(ct_lib_entry); }

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1;
	unsigned char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return 2;
	memcpy(p, trampoline, sizeof trampoline);
	if (mprotect(p, 4096, PROT_READ | PROT_EXEC))
		return 2;
	char path[64];
	snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
	FILE *f = fopen(path, "a");	/* unshare+chroot: one /tmp for all */
	if (f) {
		fprintf(f, "%lx %zx jitted_ct\n", (unsigned long)p, sizeof trampoline);
		fclose(f);
	}
	printf("ready %d\n", getpid());
	fflush(stdout);
	if (wait_start("-"))
		return 4;
	for (long i = 0; i < n; i++)
		app_work((jitted)p);
	printf("done\n");
	fflush(stdout);
	char line[64];
	while (fgets(line, sizeof line, stdin))
		;
	return 0;
}
