/* Stacks counted in the kernel: counts[struct count_key] += 1, the user
 * (and kernel) stack kept as an id in a STACK_TRACE map. One program per
 * probe, its probe index and options given as read-only data, so the
 * verifier drops what a probe does not use. Loaded as a uprobe (kprobe),
 * tracepoint or perf_event program: what the probe is. */
#include "ustack.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 8);		/* 8 bytes a frame: sized by the loader */
	__uint(max_entries, 1);
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct count_key);
	__type(value, __u64);
	__uint(max_entries, 1);		/* sized by the loader */
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, enum count_error);
	__type(value, __u64);
	__uint(max_entries, COUNT_ERROR_SLOTS);
} errors SEC(".maps");

const volatile __s64 probe_index;
const volatile enum program_result result;
/* enum count_option bits, read once: each read of read-only data costs
 * two instructions a hit, though the verifier prunes the branches */
const volatile enum count_option options;
const volatile __u32 return_address_slot;	/* COUNT_RETURN_ADDRESS: sp + 8 * slot */
/* behind a uprobe_multi link: the probe is the link's cookie for the
 * uprobe that fired, not probe_index */
const volatile __u8 probe_by_cookie;

/* *id = bpf_get_stackid(ctx, stacks, flags); a missing stack (-EFAULT: a
 * kernel thread has no user stack) is NO_STACK; 0 when the event cannot
 * be counted (a collision or a full map, counted in errors) */
static __always_inline int stack_id(void *ctx, __u64 flags, __s64 *id)
{
	long got = bpf_get_stackid(ctx, &stacks, flags);

	if (got < 0) {
		if (got != -EFAULT) {
			COUNT_AT(errors, got == -EEXIST ? ERR_COLLISION : ERR_STACKS_FULL);
			return 0;
		}
		got = NO_STACK;
	}
	*id = got;
	return 1;
}

SEC("event")
int count_stack(void *ctx)
{
	enum count_option opts = options;
	struct count_key key;
	__u64 weight, *n;
	long err;

	key.pid_tgid = bpf_get_current_pid_tgid();
	if ((opts & COUNT_ONLY_TRACED) && !traced(key.pid_tgid))
		return result;
	if ((opts & COUNT_WAIT_FOR_EXEC) && !exec_seen())
		return result;
	key.probe = probe_by_cookie ? (__s64)bpf_get_attach_cookie(ctx) : probe_index;
	key.kernel_stack = NO_STACK;
	key.return_address = 0;
	if (!stack_id(ctx, BPF_F_USER_STACK, &key.user_stack))
		return result;
	if ((opts & COUNT_KERNEL_STACK) && !stack_id(ctx, 0, &key.kernel_stack))
		return result;
	if (opts & COUNT_RETURN_ADDRESS)	/* the caller's, which an FP walk may skip */
		bpf_probe_read_user(&key.return_address, sizeof(key.return_address),
				    (void *)(((struct pt_regs *)ctx)->sp
					     + 8 * return_address_slot));
	weight = event_weight(opts & COUNT_WEIGHT);
	n = bpf_map_lookup_elem(&counts, &key);
	if (!n) {
		err = bpf_map_update_elem(&counts, &key, &weight, BPF_NOEXIST);
		if (!err)
			return result;
		if (err == -EEXIST)	/* another CPU made it first: add to theirs */
			n = bpf_map_lookup_elem(&counts, &key);
		if (!n) {
			COUNT_AT(errors, ERR_COUNTS_FULL);
			return result;
		}
	}
	__sync_fetch_and_add(n, weight);
	return result;
}
