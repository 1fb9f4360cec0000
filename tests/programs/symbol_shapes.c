/* symbol_shapes: a symbol table with the shapes that decide which name an
 * address gets (objfile/elf_symbols.py): aliases of one address with other
 * sizes and bindings, a function nested in another, ranges that overlap
 * without nesting, code labels inside and outside functions, functions
 * without a size (filled to the next start) and a PLT stub. Read, not run
 * for its output: exit status 0. */
#include <stdio.h>

__asm__(
	".text\n"
	".p2align 4\n"
	/* aliases: a global of 8 bytes, a weak of 32, a local of 64 */
	".globl alias_global\n.type alias_global, @function\n"
	".weak alias_weak\n.type alias_weak, @function\n"
	".type alias_local, @function\n"
	"alias_global:\nalias_weak:\nalias_local:\n"
	"	.fill 64, 1, 0x90\n"
	"	ret\n"
	".size alias_global, 8\n.size alias_weak, 32\n.size alias_local, 64\n"
	/* outer (96 bytes) holds inner (16 bytes, from outer+32) and two
	 * labels; the last one's filled range reaches past outer's end, into
	 * 16 bytes no function holds */
	".p2align 4\n"
	".globl outer\n.type outer, @function\n"
	"outer:\n"
	"	.fill 16, 1, 0x90\n"
	"label_inside:\n"
	"	.fill 16, 1, 0x90\n"
	".globl inner\n.type inner, @function\n"
	"inner:\n"
	"	.fill 16, 1, 0x90\n"
	".size inner, 16\n"
	"	.fill 32, 1, 0x90\n"
	"label_late:\n"
	"	.fill 16, 1, 0x90\n"
	".size outer, 96\n"
	"	.fill 16, 1, 0xcc\n"
	/* two ranges overlapping without nesting */
	".p2align 4\n"
	".globl overlap_a\n.type overlap_a, @function\n"
	".globl overlap_b\n.type overlap_b, @function\n"
	"overlap_a:\n"
	"	.fill 16, 1, 0x90\n"
	"overlap_b:\n"
	"	.fill 32, 1, 0x90\n"
	".size overlap_a, 32\n.size overlap_b, 32\n"
	"	.fill 16, 1, 0x90\n"
	/* a label outside any function, then functions without a size */
	".p2align 4\n"
	"label_outside:\n"
	"	.fill 16, 1, 0x90\n"
	".globl unsized_one\n.type unsized_one, @function\n"
	"unsized_one:\n"
	"	.fill 24, 1, 0x90\n"
	".globl unsized_two\n.type unsized_two, @function\n"
	"unsized_two:\n"
	"	.fill 8, 1, 0x90\n"
	"	ret\n");

int main(void)
{
	puts("symbol_shapes");	/* a PLT stub */
	return 0;
}
