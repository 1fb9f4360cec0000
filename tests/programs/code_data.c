/* code_data [N]: two hand-made functions whose bytes fool a decoder that
 * sweeps forward from a start, and prints "code_data SUM" of N calls of
 * each (default 1000). A uprobe's int3 inside an instruction of either
 * changes the immediate it sits in, and so the printed sum.
 *
 * trick:   jmp over one byte of data (0xb8, the opcode of a 5-byte mov) to
 *          its true second instruction at trick+0x3, a 10-byte movabs: a
 *          linear sweep decodes the data byte as that mov and walks through
 *          the movabs's immediate (trick+0x7 looks like a start).
 * shifted: its CFI (.cfi_startproc) begins at shifted+0x2, inside its first
 *          instruction (a movabs whose immediate decodes as add and nops):
 *          in a stripped copy, an FDE whose start is moved into an
 *          instruction.
 * pick:    a dense switch, which gcc -O2 compiles to a jump through a
 *          table of offsets: its cases are reached only through the table.
 * Exit status 0. */
#include <stdio.h>
#include <stdlib.h>

long trick(long x);
long shifted(long x);

__asm__(
	".text\n"
	".p2align 4\n"
	".globl trick\n"
	".type trick, @function\n"
	"trick:\n"
	".cfi_startproc\n"
	"	.byte 0xeb, 0x01\n"                      /* jmp trick+0x3 */
	"	.byte 0xb8\n"                            /* data */
	"	movabs $10, %rax\n"                      /* trick+0x3 */
	"	add %rdi, %rax\n"
	"	ret\n"
	".cfi_endproc\n"
	".size trick, .-trick\n"
	".p2align 4\n"
	".globl shifted\n"
	".type shifted, @function\n"
	"shifted:\n"
	"	.byte 0x48, 0xb8\n"                      /* movabs $IMM, %rax */
	".cfi_startproc\n"                           /* shifted+0x2 */
	"	.byte 0x01, 0xf8, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90\n"
	"	add %rdi, %rax\n"                        /* shifted+0xa */
	"	ret\n"
	".cfi_endproc\n"
	".size shifted, .-shifted\n");

__attribute__((noinline, noipa)) long pick(long x, long y)
{
	switch (x) {
	case 0: return y * 3;
	case 1: return y ^ 0x55;
	case 2: return y + 1000003;
	case 3: return y << 3;
	case 4: return y / 7;
	case 5: return y % 11;
	case 6: return ~y;
	case 7: return y * y;
	case 8: return y - 12345;
	default: return 0;
	}
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1000;
	unsigned long sum = 0;
	for (long i = 0; i < n; i++)
		sum += (unsigned long)trick(i) + (unsigned long)shifted(i)
		       + (unsigned long)pick(i % 10, i);
	printf("code_data %lu\n", sum);
	return 0;
}
