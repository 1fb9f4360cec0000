/* A first call through the PLT with lazy binding (built -Wl,-z,lazy):
 * getppid's slot is resolved by ld.so's _dl_runtime_resolve_*, whose CFA
 * is rbx-based, when first_call makes the call. A uprobe on _dl_fixup (or
 * deeper, _dl_lookup_symbol_x) then stops inside that resolver. Usage:
 * lazy_bind [WAIT] (see wait_start.h); it prints "done" at the end. */
#include <stdio.h>
#include <unistd.h>
#include "wait_start.h"

volatile long sink;

__attribute__((noinline)) void first_call(void)
{
	sink = getppid();	/* its first call: through the resolver */
}

__attribute__((noinline)) void outer(void)
{
	first_call();
	sink++;
}

int main(int argc, char **argv)
{
	if (wait_start(argc > 1 ? argv[1] : NULL))
		return 4;
	outer();
	puts("done");
	return 0;
}
