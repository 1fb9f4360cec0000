/* Allocations not freed, by stack (capture/bpf_memleak.py tells the whole
 * story): memleak_entry, on an allocator's first instruction, keeps the
 * requested size and the caller's stack (unwind.h's walk) in CALLS[tid];
 * memleak_return, on its uretprobe, enters the block it returned in
 * ALLOCS[(address, tgid)] and adds it to TOTALS[(tgid, stack)];
 * memleak_free, on free and munmap, takes a block out of both. One entry
 * program per allocator kind (enum memleak_kind as read-only data). With
 * ML_PYTHON the entry's stack of a Python process gets its Python frames
 * (python.h), the code objects seen first reported by RING; with
 * ML_PASS_CALLS the runtimes' frames come from passes.h's programs, each
 * loaded once the run meets its runtime, the last of which stores the
 * stack under the call CALLS[tid] holds already (pass_done). */
#include "unwind.h"
#include "python.h"
#include "v8.h"
#include "php.h"
#include "perl.h"
#include "ruby.h"
#include "passes.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct memleak_call);
	__uint(max_entries, 16384);	/* threads inside an allocator at once */
} calls SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct memleak_key);
	__type(value, struct memleak_alloc);
	__uint(max_entries, 1);		/* sized by the loader */
} allocs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct memleak_stack);
	__type(value, struct memleak_total);
	__uint(max_entries, 1);		/* sized by the loader */
} totals SEC(".maps");

/* python.h's records of code objects seen first; deferred records (ML_DEFER) */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__type(value, struct python_code_record);	/* (the loader drops the size) */
	__uint(max_entries, 4096);	/* sized by the loader */
} ring SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, enum memleak_error);
	__type(value, __u64);
	__uint(max_entries, MEMLEAK_ERROR_SLOTS);
} ml_errors SEC(".maps");

const volatile enum memleak_kind kind;
const volatile enum memleak_option ml_options;
const volatile enum program_result result;

static __always_inline void ml_error(enum memleak_error slot)
{
	add_one(bpf_map_lookup_elem(&ml_errors, &slot));
}

static __always_inline int of_the_run(void)
{
	return !(ml_options & ML_WAIT_FOR_EXEC) || exec_seen();
}

/* TOTALS[(tgid, hash)] += (bytes, count) */
static __always_inline void add_total(__u32 tgid, __u64 hash, __s64 bytes, __s64 count)
{
	struct memleak_stack key = { .hash = hash, .tgid = tgid };
	struct memleak_total *t = bpf_map_lookup_elem(&totals, &key), zero = {};

	if (!t) {
		if (count < 0)		/* a block counted nowhere: nothing to take */
			return;
		bpf_map_update_elem(&totals, &key, &zero, BPF_NOEXIST);
		t = bpf_map_lookup_elem(&totals, &key);
		if (!t) {
			ml_error(ML_TOTALS_FULL);
			return;
		}
	}
	__sync_fetch_and_add(&t->bytes, bytes);
	__sync_fetch_and_add(&t->count, count);
}

/* take block `addr` of process `tgid` out of ALLOCS and TOTALS; 1 and
 * *out if it was outstanding (a block from before the run is not) */
static __always_inline int take(__u32 tgid, __u64 addr, struct memleak_alloc *out)
{
	struct memleak_key key = { .addr = addr, .tgid = tgid };
	struct memleak_alloc *a = bpf_map_lookup_elem(&allocs, &key);

	if (!a)
		return 0;
	*out = *a;
	if (bpf_map_delete_elem(&allocs, &key))	/* another thread took it first */
		return 0;
	add_total(tgid, out->hash, -(__s64)out->size, -1);
	return 1;
}

/* enter block `addr` of process `tgid` as outstanding */
static __always_inline void put(__u32 tgid, __u64 addr, __u64 size, __u64 hash, __u64 time)
{
	struct memleak_key key = { .addr = addr, .tgid = tgid };
	struct memleak_alloc a = { .size = size, .hash = hash, .time = time }, gone;

	take(tgid, addr, &gone);	/* its free was not seen (another allocator's) */
	if (bpf_map_update_elem(&allocs, &key, &a, BPF_ANY)) {
		ml_error(ML_ALLOCS_FULL);
		return;
	}
	add_total(tgid, hash, size, 1);
}

/* ML_DEFER: a walk that met an object without rows yet (a library
 * dlopen'd just before: its mapping's record is still on its way to user
 * space) or whose rows did not fit, or through a JVM's JIT code (its Java
 * frames walked in user space), goes to the ring as a deferred record,
 * unwound by user space; the block is counted under *id, the record's
 * weight, until then. 0 where it does not go (the ring is full: counted) */
static __always_inline int defer_call(struct pt_regs *ctx, struct walk *w, __u64 pid_tgid,
				      __u64 *id)
{
	struct deferred_record *d;

	if (!(ml_options & ML_DEFER) || (w->rec.head.status != NO_TABLE
					 && w->rec.head.status != TABLE_FULL
					 && !through_jvm_jit(w)))
		return 0;
	d = bpf_ringbuf_reserve(&ring, sizeof(*d), 0);
	if (!d) {
		ml_error(ML_UNDEFERRED);
		return 0;
	}
	w->rec.time = bpf_ktime_get_ns();
	w->rec.pid_tgid = pid_tgid;
	w->rec.probe = 0;
	w->rec.cpu = bpf_get_smp_processor_id();
	*id = mix(mix(FNV_BASIS, w->rec.time), w->rec.cpu);
	fill_deferred(ctx, REGS_CTX, w, d, NO_STACK, *id, DEFER_STACK, DEFER_STACK);
	bpf_ringbuf_submit(d, 0);
	return 1;
}

SEC("event")
int memleak_entry(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = pid_tgid;
	struct memleak_call c = {}, *outer;
	struct memleak_alloc old;
	__s32 no_kernel_stack;
	struct walk *w;

	if (!of_the_run())
		return result;
	/* an allocator called by another (malloc calls mmap) or jumped to
	 * at the same sp (realloc(NULL, n) jumps into malloc, its return
	 * address already a uretprobe's): the outer call is the one counted */
	outer = bpf_map_lookup_elem(&calls, &tid);
	if (outer && outer->sp >= ctx->sp)
		return result;
	c.sp = ctx->sp;
	c.kind = kind;
	switch (kind) {
	case ML_CALLOC:
		c.size = ctx->di * ctx->si;
		break;
	case ML_REALLOC:
		c.size = ctx->si;
		c.old = ctx->di;
		if (c.old && take(pid_tgid >> 32, c.old, &old)) {
			c.had_old = 1;
			c.old_size = old.size;
			c.old_hash = old.hash;
			c.old_time = old.time;
		}
		break;
	case ML_ALIGNED:
	case ML_MMAP:
		c.size = ctx->si;
		break;
	case ML_POSIX_MEMALIGN:
		c.out = ctx->di;
		c.size = ctx->dx;
		break;
	default:
		c.size = ctx->di;
	}
	w = walk(ctx, REGS_CTX, 0, &no_kernel_stack);
	if (w && (ml_options & ML_V8))
		v8_pass(w, pid_tgid);
	if (w && defer_call(ctx, w, pid_tgid, &c.hash))
		goto keep;
	if (w && (ml_options & ML_PASS_CALLS) && (w->v8 || w->perl || w->ruby || w->python
						   || w->php)) {
		/* the call is kept now, its stack's hash by the last pass */
		if (bpf_map_update_elem(&calls, &tid, &c, BPF_ANY)) {
			ml_error(ML_CALLS_FULL);
			return result;
		}
		keep_event(w, pid_tgid, 0, NO_STACK, 0);
		passes_from(ctx, w, PASS_V8);
	}
	if (w && (ml_options & ML_PERL))
		perl_merge(w, pid_tgid);
	if (w && (ml_options & ML_RUBY))
		ruby_pass(w);
	if (w && (ml_options & ML_PYTHON))
		python_pass(w, &ring, pid_tgid, 0);
	if (w && (ml_options & ML_PHP))
		php_pass(w);
	if (!w || !store_stack(w, &c.hash)) {
		ml_error(ML_STACKS_FULL);
		c.hash = 0;			/* counted without a stack */
	}
keep:
	if (bpf_map_update_elem(&calls, &tid, &c, BPF_ANY))
		ml_error(ML_CALLS_FULL);
	return result;
}

SEC("event")
int memleak_return(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid(), addr = ctx->ax;
	__u32 tid = pid_tgid, tgid = pid_tgid >> 32;
	struct memleak_call *p, c;

	p = bpf_map_lookup_elem(&calls, &tid);
	if (!p || p->sp + 8 != ctx->sp)		/* a nested allocator's return */
		return result;
	c = *p;
	bpf_map_delete_elem(&calls, &tid);
	switch (c.kind) {
	case ML_POSIX_MEMALIGN:
		if (addr || bpf_probe_read_user(&addr, sizeof(addr), (void *)c.out))
			addr = 0;
		break;
	case ML_MMAP:
		if (addr == (__u64)-1)
			addr = 0;
		break;
	case ML_REALLOC:
		/* NULL: failed, the old block stays, but realloc(old, 0) freed it */
		if (!addr && c.size && c.had_old)
			put(tgid, c.old, c.old_size, c.old_hash, c.old_time);
		break;
	default:
		break;
	}
	if (addr)				/* a failed allocation is not counted */
		put(tgid, addr, c.size, c.hash, bpf_ktime_get_ns());
	return result;
}

SEC("event")
int memleak_free(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct memleak_alloc gone;

	if (!of_the_run())
		return result;
	if (ctx->di)
		take(pid_tgid >> 32, ctx->di, &gone);
	return result;
}

/* The pass programs (passes.h): the last stores the stack under the call
 * memleak_entry kept in CALLS */
static __always_inline int pass_done(void *ctx, struct walk *w, enum pass_slot next)
{
	__u32 tid = w->rec.pid_tgid;
	struct memleak_call *c;
	__u64 hash;

	passes_from(ctx, w, next);
	c = bpf_map_lookup_elem(&calls, &tid);
	if (!c)
		return result;
	if (!store_stack(w, &hash)) {
		ml_error(ML_STACKS_FULL);
		hash = 0;			/* counted without a stack */
	}
	c->hash = hash;
	return result;
}

PASS_PROGRAMS(pass_done, result)
