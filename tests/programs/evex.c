/* evex [N]: calls three functions that each start with a different encoding
 * of "put the argument in a vector register and take it back", N times
 * (default 1), and prints what they returned (each returns its argument):
 *   f_sse    movd (legacy SSE)      f_vex   vmovd (VEX)
 *   f_evex   vpbroadcastd (EVEX, AVX-512; called only where the CPU has it)
 * A uprobe on f_evex's first instruction makes it return a wrong value on
 * the kernels measured (the out-of-line step loses its result): ustack
 * refuses that site. Exit status 0. */
#include <stdio.h>
#include <stdlib.h>

int f_sse(int x);
int f_vex(int x);
int f_evex(int x);

asm(".text\n"
    ".globl f_sse\n.type f_sse,@function\nf_sse:\n"
    "  movd %edi,%xmm1\n  movd %xmm1,%eax\n  ret\n.size f_sse,.-f_sse\n"
    ".globl f_vex\n.type f_vex,@function\nf_vex:\n"
    "  vmovd %edi,%xmm0\n  vmovd %xmm0,%eax\n  ret\n.size f_vex,.-f_vex\n"
    ".globl f_evex\n.type f_evex,@function\nf_evex:\n"
    "  {evex} vpbroadcastd %edi,%xmm0\n  movd %xmm0,%eax\n  ret\n.size f_evex,.-f_evex\n");

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1;
	int avx512 = __builtin_cpu_supports("avx512f");
	long sum = 0;
	for (long i = 0; i < n; i++) {
		sum += f_sse(1) + f_vex(2);
		if (avx512)
			sum += f_evex(3);
	}
	printf("%ld\n", sum);
	return 0;
}
