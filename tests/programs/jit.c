/* jit [N [PAD_MB [DEEP_KB]]]: what a JIT does, in small. Copies a tiny trampoline (push %rbp;
 * mov %rsp,%rbp; call *%rdi; pop %rbp; ret) into fresh anonymous executable
 * memory, names it in /tmp/perf-PID.map the way perf's JIT interface asks
 * ("START SIZE name", hex), and calls target() through it N times (default
 * 1). Then it maps a second copy, appends its line to the map, and calls
 * through that one N times: a reader must notice the file changed. With
 * PAD_MB, the map first gets PAD_MB MiB of short lines naming other code
 * (what a hostile or runaway writer leaves). The map file is left behind,
 * as JITs leave theirs; one an earlier process of the same pid left is
 * removed first. With DEEP_KB, the calls through the copies are
 * made from a frame of DEEP_KB KiB (deeper than a stack copy of that size
 * reaches). Exit status 0. */
#define _GNU_SOURCE
#include <alloca.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KEEP __attribute__((noinline, noipa, used))

volatile long counter;

KEEP void target(void) { counter++; }

static const unsigned char trampoline[] = {
	0x55,			/* push %rbp */
	0x48, 0x89, 0xe5,	/* mov %rsp,%rbp */
	0xff, 0xd7,		/* call *%rdi */
	0x5d,			/* pop %rbp */
	0xc3,			/* ret */
};

typedef void (*jitted)(void (*)(void));

static jitted jit(const char *name)
{
	unsigned char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		exit(2);
	memcpy(p, trampoline, sizeof trampoline);
	if (mprotect(p, 4096, PROT_READ | PROT_EXEC))
		exit(2);
	char path[64];
	snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
	FILE *f = fopen(path, "a");
	if (!f)
		exit(2);
	fprintf(f, "%lx %zx %s\n", (unsigned long)p, sizeof trampoline, name);
	fclose(f);
	return (jitted)p;
}

static void pad_map(long mib)
{
	char path[64];
	snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
	FILE *f = fopen(path, "a");
	if (!f)
		exit(2);
	long written = 0;
	for (unsigned long start = 0x10000; written < (mib << 20); start += 0x10)
		written += fprintf(f, "%lx 8 p\n", start);
	fclose(f);
}

KEEP void call_through(jitted code, long n, long deep_kb)
{
	volatile char *pad = alloca((deep_kb << 10) + 1);
	pad[0] = 0;
	for (long i = 0; i < n; i++)
		code(target);
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1;
	/* a map an earlier process of this pid left (the lines below append):
	 * the map is this process's alone */
	char path[64];
	snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
	unlink(path);
	if (argc > 2)
		pad_map(atol(argv[2]));
	long deep_kb = argc > 3 ? atol(argv[3]) : 0;
	jitted first = jit("jitted_first");
	if (deep_kb)
		call_through(first, n, deep_kb);
	else
		for (long i = 0; i < n; i++)
			first(target);
	jitted second = jit("Lua:jitted second trace");
	if (deep_kb)
		call_through(second, n, deep_kb);
	else
		for (long i = 0; i < n; i++)
			second(target);
	return counter == 2 * n ? 0 : 3;
}
