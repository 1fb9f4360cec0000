/* strargs [-|MS] [N]: N rounds (default 1) of calls to say(s, n, p) with
 * the strings and pointers fetch-args read, for trace --backend bpf against
 * the kernel's own uprobe fetch (perf backend):
 *   say(word, 1, &head)   "hello" (a copy on the stack); head -> tail -> NULL,
 *                         each node { long v; struct node *next; char *name }
 *   say(empty, 2, &tail)  "" ; tail->next is NULL
 *   say(NULL, 3, NULL)    NULL pointers
 *   say(bad, 4, bad)      pointers to nothing ((void *)8)
 *   say(big, 5, &head)    5000 'x' (longer than the kernel's 4095 bytes)
 * then shout(big) alone (its strings at offsets into big).
 * say returns n (for $retval). Every string is in memory the program wrote
 * before the call: BPF reads no page the process has not touched yet.
 * Waits for a line on stdin first with "-" (wait_start.h). Prints nothing. */
#include <stdlib.h>
#include <string.h>
#include "wait_start.h"

#define KEEP __attribute__((noinline, noipa, used))

struct node { long v; struct node *next; char *name; };

volatile long sink;

KEEP long say(const char *s, long n, struct node *p)
{
	sink += n + (long)s + (long)p;
	asm volatile("");
	return n;
}

KEEP long shout(const char *s)
{
	sink += (long)s;
	asm volatile("");
	return 0;
}

int main(int argc, char **argv)
{
	if (wait_start(argc > 1 ? argv[1] : NULL))
		return 4;
	int rounds = argc > 2 ? atoi(argv[2]) : 1;
	static char big[5001], head_name[8], tail_name[8];
	char word[8], empty[1] = "";
	memset(big, 'x', 5000);
	strcpy(word, "hello");
	strcpy(head_name, "head");
	strcpy(tail_name, "tail");
	static struct node tail = { 7, NULL, tail_name };
	static struct node head = { 5, &tail, head_name };
	void *bad = (void *)8;
	for (int i = 0; i < rounds; i++) {
		sink += say(word, 1, &head);
		sink += say(empty, 2, &tail);
		sink += say(NULL, 3, NULL);
		sink += say(bad, 4, bad);
		sink += say(big, 5, &head);
	}
	sink += shout(big);
	return 0;
}
