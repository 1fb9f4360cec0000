/* The programs that scope a run to its processes, on raw tracepoints
 * (a link each: closing one detaches at once).
 *
 * exec_armed: a -c command is forked from ustack and held before its
 * execve; its perf events wait for the exec (enable_on_exec), but programs
 * on trace events run at once and would count the few calls the forked
 * Python makes on its way to execve. armed[0] becomes 1 when the command
 * has exec'd, and the probes' programs wait for it (the `armed` map they
 * share, ustack.h).
 *
 * follow_children: tracepoints fire for every task, so their programs look
 * the tgid up in the set of traced processes; this extends the set with
 * each child a traced process forks, as perf's inherited events follow
 * them. */
#include "ustack.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 traced_tgid;	/* the held command */
const volatile __u32 task_pid_offset;	/* offsetof(struct task_struct, pid) */

/* sched_process_exec runs in the process that exec'd */
SEC("raw_tracepoint/sched_process_exec")
int exec_armed(void *ctx)
{
	__u32 zero = 0;
	__u64 *flag;

	if (bpf_get_current_pid_tgid() >> 32 != traced_tgid)
		return 0;
	flag = bpf_map_lookup_elem(&armed, &zero);
	if (flag)
		*flag = 1;
	return 0;
}

/* task_newtask(task, clone_flags) runs in the parent; a new thread's
 * process is in the set already */
SEC("raw_tracepoint/task_newtask")
int follow_children(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 child, one = 1;

	if (ctx->args[1] & CLONE_THREAD)
		return 0;
	if (!traced(bpf_get_current_pid_tgid()))
		return 0;
	if (bpf_probe_read_kernel(&child, sizeof(child),
				  (void *)(ctx->args[0] + task_pid_offset)))
		return 0;
	bpf_map_update_elem(&tgids, &child, &one, BPF_ANY);
	return 0;
}
