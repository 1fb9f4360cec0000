/* What the object loader must place: a bpf-to-bpf call (and a call
 * between two functions of .text, with one the program never reaches
 * laid out between them), a bpf_loop callback, .rodata set at load, .bss
 * written, a declared map. */
#include "ustack.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 4);
} out SEC(".maps");

/* named only by counted(), which loader_check never reaches */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} unreached SEC(".maps");

const volatile __u64 factor = 1;
__u64 loops;

static __noinline __u64 twice(__u64 x);

static __noinline __u64 scaled(__u64 x)
{
	return twice(x) * factor;
}

static __noinline __u64 counted(__u64 x)
{
	__u32 key = 0;
	__u64 *n = bpf_map_lookup_elem(&unreached, &key);

	return n ? *n + x : x;
}

static __noinline __u64 twice(__u64 x)
{
	return x + x;
}

static long step(__u64 index, void *ctx)
{
	loops += index;
	return 0;
}

SEC("raw_tracepoint/loader_check")
int loader_check(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 key = 1;
	__u64 value = scaled(ctx->args[0]);

	bpf_loop(4, step, 0, 0);	/* loops = 0 + 1 + 2 + 3 */
	bpf_map_update_elem(&out, &key, &value, BPF_ANY);
	return value + loops;
}

/* the only caller of counted() */
SEC("raw_tracepoint/lonely")
int lonely(void *ctx)
{
	return counted(3);
}

/* refused: reads past the end of its map value */
SEC("raw_tracepoint/refused")
int refused(void *ctx)
{
	__u32 key = 0;
	__u64 *v = bpf_map_lookup_elem(&out, &key);

	if (!v)
		return 0;
	return v[ctx ? 9 : 9];
}
