/* funccount: calls per probe, counted in the kernel; no stacks.
 *
 * count_by_cookie: one program behind uprobe_multi links, a link per
 * binary (closing a perf event per uprobe waits ~0.1 s each, a link waits
 * once); the link's cookie is the probe's index. Kernels without
 * uprobe_multi (before 6.6) are refused with a one-line error. */
#include "ustack.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);		/* one slot per probe: sized by the loader */
} calls SEC(".maps");

const volatile __u32 skip_tgid;		/* a system-wide run: ustack itself */
const volatile __u8 wait_for_exec;	/* a -c command: count once armed */

SEC("uprobe.multi")
int count_by_cookie(struct pt_regs *ctx)
{
	if (wait_for_exec && !exec_seen())
		return 0;
	if (skip_tgid && bpf_get_current_pid_tgid() >> 32 == skip_tgid)
		return 0;
	COUNT_AT(calls, bpf_get_attach_cookie(ctx));
	return 0;
}
