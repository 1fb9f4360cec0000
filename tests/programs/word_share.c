/* Shares a u64 at the start of FILE with a Python process, on another CPU,
 * as the kernel shares a ring buffer's positions with ustack.
 *
 *   word_share watch FILE A B STOP   reads the word until it is STOP; prints
 *                                    "torn N": reads that were neither A, B
 *                                    nor STOP (a write seen half done)
 *   word_share write FILE A B        stores A and B in turn, one 8-byte store
 *                                    each, until the word at offset 8 is not 0
 *
 * Prints "ready" once the file is mapped (and, for watch, A seen). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv)
{
	if (argc < 5)
		return 2;
	int fd = open(argv[2], O_RDWR);
	if (fd < 0)
		return 2;
	volatile uint64_t *word = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (word == MAP_FAILED)
		return 2;
	uint64_t a = strtoull(argv[3], NULL, 0), b = strtoull(argv[4], NULL, 0);

	if (strcmp(argv[1], "watch") == 0 && argc == 6) {
		uint64_t stop = strtoull(argv[5], NULL, 0), v;
		unsigned long torn = 0;
		while (word[0] != a)
			;
		puts("ready");
		fflush(stdout);
		while ((v = word[0]) != stop)
			if (v != a && v != b)
				torn++;
		printf("torn %lu\n", torn);
		return 0;
	}
	if (strcmp(argv[1], "write") == 0) {
		word[0] = a;
		puts("ready");
		fflush(stdout);
		while (!word[1]) {
			word[0] = a;
			word[0] = b;
		}
		return 0;
	}
	return 2;
}
