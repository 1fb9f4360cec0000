/* The in-kernel unwinder's steps (src/ustack/bpf/unwind.h) run through
 * BPF_PROG_TEST_RUN: the walk state the test gives in GIVEN (registers,
 * the object's rows, a stack in the window) goes through args[0] steps
 * and comes back in GIVEN. */
#include "unwind.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct walk);
	__uint(max_entries, 1);
} given SEC(".maps");

SEC("raw_tracepoint/unwind_check")
int unwind_check(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 zero = 0;
	struct walk *in = bpf_map_lookup_elem(&given, &zero), *w = scratch_value();

	if (!in || !w)
		return -1;
	bpf_probe_read_kernel(w, sizeof(*w), in);
	bpf_loop(ctx->args[0], step, 0, 0);
	bpf_probe_read_kernel(in, sizeof(*in), w);
	return 0;
}
