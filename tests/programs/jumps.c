/* jumps N: N rounds of setjmp/longjmp and getcontext/setcontext, the
 * calls that return twice (their callee keeps its own return address),
 * then prints a checksum of what each round saw. Prints the same line
 * whatever traces it, as long as nothing replaced a return address. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

int main(int argc, char **argv)
{
	long rounds = argc > 1 ? atol(argv[1]) : 10, sum = 0;

	for (long i = 0; i < rounds; i++) {
		jmp_buf jb;
		volatile long jumped = 0;
		if (setjmp(jb) == 0) {
			jumped = i + 1;
			longjmp(jb, 1);
		}
		ucontext_t uc;
		volatile int again = 0;
		getcontext(&uc);
		if (again++ == 0)
			setcontext(&uc);
		sum += jumped * 3 + again;
	}
	printf("%ld\n", sum);
	return 0;
}
