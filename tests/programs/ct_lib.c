/* ct_lib: the library of ct_app, built twice: the copy inside the test
 * container, and (with -DHOST_COPY) a different file at the same path on
 * the host, other names and another build-id: a tool that symbolizes the
 * container's frames from the host's copy names them host_copy_*. */
#define KEEP __attribute__((noinline, noipa, used))

static long raw_getppid(void)
{
	long ret;
	/* the syscall itself, not libc's wrapper: every frame keeps rbp */
	__asm__ volatile("syscall" : "=a"(ret) : "a"(110L) : "rcx", "r11", "memory");
	return ret;
}

#ifdef HOST_COPY
KEEP long host_copy_inner(void) { return raw_getppid() + 1; }
KEEP long host_copy_entry(void) { return host_copy_inner() + 1; }
#else
KEEP long ct_lib_inner(void) { return raw_getppid(); }
KEEP long ct_lib_entry(void) { return ct_lib_inner(); }
#endif
