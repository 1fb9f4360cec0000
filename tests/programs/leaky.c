/* leaky WAIT [OLDER_MS | threads]: allocations from known call chains, some freed,
 * some not (ustack memleak's target).
 *
 * WAIT: "-" waits for a line on stdin first (wait_start.h).
 * Left allocated (N = ROUNDS):
 *   leak_outer -> leak_inner: N x malloc(LEAK_SIZE)
 *   calloc_leak: N x calloc(3, CALLOC_SIZE)
 *   realloc_leak: N x realloc(malloc(64), REALLOC_SIZE): the malloc's
 *     block is freed by the realloc, the realloc's is left
 *   memalign_leak: N x posix_memalign(&p, 64, ALIGNED_SIZE)
 *   old_memalign_leak: N x memalign(64, OLD_ALIGNED_SIZE) (in glibc the same
 *     function as aligned_alloc)
 *   mmap_leak: N x mmap(MMAP_SIZE) (anonymous)
 *   big_leak: N x malloc(BIG_SIZE), which malloc gets from mmap itself
 * Freed: keep_outer -> keep_inner: N x malloc(KEEP_SIZE), then a
 *   realloc'd block, a posix_memalign'd one, an aligned_alloc'd one, a
 *   big malloc'd one and an mmap'd one (munmap).
 * Then "ready" on stdout.
 * With "threads": instead, THREADS threads started together each leak
 * THREAD_ROUNDS x malloc(THREAD_SIZE) from thread_leak and free as many
 * blocks from thread_keep, interleaved; then it exits.
 * With OLDER_MS: then it waits until OLDER_MS after those allocations
 * by its own clock, leaks N x malloc(YOUNG_SIZE) from young_leak, says
 * "young" and exits; without, it waits for a line (or the end) on stdin
 * and exits.
 * Exit status 0. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <sys/mman.h>
#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))
#define ROUNDS 5
#define LEAK_SIZE 1000
#define CALLOC_SIZE 100
#define REALLOC_SIZE 2000
#define ALIGNED_SIZE 512
#define OLD_ALIGNED_SIZE 320
#define KEEP_SIZE 777
#define YOUNG_SIZE 4444
#define MMAP_SIZE 8192
#define THREADS 4
#define THREAD_ROUNDS 1000
#define THREAD_SIZE 48
#define BIG_SIZE 200000		/* above malloc's mmap threshold: malloc calls mmap */

/* read by nobody, but the compiler must not drop the allocations */
void *volatile kept[64];
int nkept;

static void hold(void *p)
{
	kept[nkept++ % 64] = p;
}

KEEP void leak_inner(void) { hold(malloc(LEAK_SIZE)); asm volatile(""); }
KEEP void leak_outer(void) { leak_inner(); asm volatile(""); }
KEEP void calloc_leak(void) { hold(calloc(3, CALLOC_SIZE)); asm volatile(""); }
KEEP void realloc_leak(void) { hold(realloc(malloc(64), REALLOC_SIZE)); asm volatile(""); }

KEEP void memalign_leak(void)
{
	void *p = NULL;
	if (posix_memalign(&p, 64, ALIGNED_SIZE) == 0)
		hold(p);
	asm volatile("");
}

KEEP void old_memalign_leak(void) { hold(memalign(64, OLD_ALIGNED_SIZE)); asm volatile(""); }

KEEP void mmap_leak(void)
{
	void *p = mmap(NULL, MMAP_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		       -1, 0);
	if (p != MAP_FAILED)
		hold(p);
	asm volatile("");
}

KEEP void big_leak(void) { hold(malloc(BIG_SIZE)); asm volatile(""); }

KEEP void *keep_inner(void) { void *p = malloc(KEEP_SIZE); asm volatile(""); return p; }
KEEP void *keep_outer(void) { void *p = keep_inner(); asm volatile(""); return p; }

KEEP void freed_ones(void)
{
	void *blocks[ROUNDS], *p = NULL;
	for (int i = 0; i < ROUNDS; i++)
		blocks[i] = keep_outer();
	for (int i = 0; i < ROUNDS; i++)
		free(blocks[i]);
	free(realloc(malloc(32), 3000));
	if (posix_memalign(&p, 128, 256) == 0)
		free(p);
	free(aligned_alloc(64, 640));
	free(malloc(BIG_SIZE));
	p = mmap(NULL, MMAP_SIZE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED)
		munmap(p, MMAP_SIZE);
	asm volatile("");
}

KEEP void young_leak(void) { hold(malloc(YOUNG_SIZE)); asm volatile(""); }

static pthread_barrier_t together;

KEEP void *thread_leak(void) { void *p = malloc(THREAD_SIZE); asm volatile(""); return p; }
KEEP void thread_keep(void) { free(malloc(96)); asm volatile(""); }

KEEP void *thread_main(void *arg)
{
	void **mine = arg;

	pthread_barrier_wait(&together);
	for (int i = 0; i < THREAD_ROUNDS; i++) {
		mine[i] = thread_leak();
		thread_keep();
	}
	return NULL;
}

static int threads(void)
{
	static void *blocks[THREADS][THREAD_ROUNDS];
	pthread_t t[THREADS];

	pthread_barrier_init(&together, NULL, THREADS);
	for (int i = 0; i < THREADS; i++)
		if (pthread_create(&t[i], NULL, thread_main, blocks[i]))
			return 3;
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	return 0;
}

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	if (wait_start(argv[1]))
		return 4;
	if (argc > 2 && strcmp(argv[2], "threads") == 0)
		return threads();
	for (int i = 0; i < ROUNDS; i++) {
		leak_outer();
		calloc_leak();
		realloc_leak();
		memalign_leak();
		old_memalign_leak();
		mmap_leak();
		big_leak();
	}
	freed_ones();
	long done = now_ms();
	printf("ready\n");
	fflush(stdout);
	if (argc > 2) {
		long until = done + atol(argv[2]);
		while (now_ms() < until) {
			struct timespec ts = { 0, 20 * 1000000L };
			nanosleep(&ts, NULL);
		}
		for (int i = 0; i < ROUNDS; i++)
			young_leak();
		printf("young\n");
		fflush(stdout);
		return 0;
	}
	char line[16];
	(void)!fgets(line, sizeof line, stdin);	/* a line, or the end of stdin */
	return 0;
}
