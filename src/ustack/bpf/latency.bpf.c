/* Entry-to-return latency (capture/bpf_latency.py has the whole story):
 * latency_entry pushes the entry time (and the entry stack's hash) on the
 * caller's ENTRIES stack; latency_return pops it and adds the duration to
 * the function's histogram, reporting calls of slower_ns or more to the
 * ring. One program per probe, the function and options as read-only
 * data (behind uprobe_multi links: one per role, the function the link's
 * cookie). An entry's stack is kept under its hash: walked on frame pointers
 * (FP_STACKS) or unwound in the kernel (unwind.h, the unwinder's STACKS),
 * then with LAT_PYTHON given a Python process's frames (python.h), whose
 * records of code objects seen first share RING with the slow calls;
 * with LAT_PASS_CALLS the runtimes' frames come from passes.h's programs,
 * each loaded once the run meets its runtime, the last of which pushes
 * the entry (pass_done). With LAT_DEFER an entry whose walk went through
 * a JVM's JIT code (no frame pointers there) sends its registers and
 * stack to RING as a deferred record (defer_entry), for user space to
 * walk its Java frames while the JVM lives; the record's id stands for
 * the stack's hash. */
#define FNV_PRIME 0x100000001B3ULL
#include "unwind.h"
#include "python.h"
#include "v8.h"
#include "php.h"
#include "perl.h"
#include "ruby.h"
#include "passes.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct entry_key);
	__type(value, struct entry_stack);
	__uint(max_entries, 16384);	/* (thread or goroutine, function) pairs in flight */
} entries SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, struct hist_key);
	__type(value, struct hist);
	__uint(max_entries, 10240);	/* functions x stacks */
} hists SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);		/* a slot per function: sized by the loader */
} tails SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, enum latency_error);
	__type(value, __u64);
	__uint(max_entries, LATENCY_ERROR_SLOTS);
} errors SEC(".maps");

/* zeros to create ENTRIES' and HISTS' values from (too big for the stack) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct hist);	/* the larger of entry_stack and hist */
	__uint(max_entries, 1);
} zero SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__type(value, struct slow_call);	/* its records (the loader drops the size) */
	__uint(max_entries, 4096);	/* sized by the loader */
} ring SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 8);		/* 8 bytes a frame: sized by the loader */
	__uint(max_entries, 1);
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, struct fp_stack);
	__uint(max_entries, 1);		/* sized by the loader */
} fp_stacks SEC(".maps");

const volatile __u32 function;
const volatile enum latency_option options;
const volatile enum program_result result;
const volatile __u64 unit_ns;		/* a histogram's unit */
const volatile __u64 slower_ns;		/* LAT_SLOWER */
const volatile enum regs_source regs_source;	/* LAT_DWARF_STACK */
/* behind a uprobe_multi link: the function is the link's cookie for the
 * uprobe that fired, not `function` */
const volatile __u8 function_by_cookie;

static __always_inline __u32 this_function(void *ctx)
{
	return function_by_cookie ? bpf_get_attach_cookie(ctx) : function;
}

static __always_inline void count_error(enum latency_error slot)
{
	add_one(bpf_map_lookup_elem(&errors, &slot));
}

/* map[key], created from zeros when absent; NULL (counted as `full`)
 * when the map has no room */
static __always_inline void *lookup_or_create(void *map, void *key,
					      enum latency_error full)
{
	__u32 zero_key = 0;
	void *value = bpf_map_lookup_elem(map, key), *zeros;

	if (value)
		return value;
	zeros = bpf_map_lookup_elem(&zero, &zero_key);
	if (!zeros)
		return 0;
	bpf_map_update_elem(map, key, zeros, BPF_NOEXIST);
	value = bpf_map_lookup_elem(map, key);
	if (!value)
		count_error(full);
	return value;
}

/* whether the event is the run's: its process traced, the command armed */
static __always_inline int of_the_run(enum latency_option opts, __u64 pid_tgid)
{
	if ((opts & LAT_ONLY_TRACED) && !traced(pid_tgid))
		return 0;
	return !(opts & LAT_WAIT_FOR_EXEC) || exec_seen();
}

static __always_inline void entry_key(struct entry_key *key, struct pt_regs *regs,
				      enum latency_option opts, __u64 pid_tgid, __u32 func)
{
	key->who = (opts & LAT_GOROUTINE) ? regs->r14 : pid_tgid;
	key->function = func;
	key->pad = 0;
}

/* the entry's frame-pointer stack, kept in FP_STACKS under its hash */
static __always_inline __u64 fp_stack_hash(void *ctx)
{
	struct fp_stack fp;
	__u64 hash;

	fp.stack_id = bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK);
	fp.pad = 0;
	fp.return_address = 0;
	bpf_probe_read_user(&fp.return_address, sizeof(fp.return_address),
			    (void *)((struct pt_regs *)ctx)->sp);
	hash = (__u32)fp.stack_id * FNV_PRIME;
	hash = (hash ^ fp.return_address) * FNV_PRIME;
	bpf_map_update_elem(&fp_stacks, &hash, &fp, BPF_ANY);
	return hash;
}

/* the entry pushed on the ENTRIES stack of `who` (entry_key's: a thread
 * or a goroutine) for function `func`: its time and stack */
static __always_inline int entry_pushed(__u64 who, __u32 func, __u64 now, __u64 hash)
{
	struct entry_key key = { .who = who, .function = func };
	struct entry_stack *stack;
	__u64 level;

	stack = lookup_or_create(&entries, &key, LAT_ENTRIES_FULL);
	if (!stack)
		return result;
	level = stack->depth;
	stack->depth = level + 1;
	if (level >= LAT_MAX_DEPTH) {	/* its return only pops the depth */
		count_error(LAT_TOO_DEEP);
		return result;
	}
	stack->level[level & (LAT_MAX_DEPTH - 1)].time = now;
	stack->level[level & (LAT_MAX_DEPTH - 1)].hash = hash;
	return result;
}

/* LAT_DEFER: the entry's stack through a JVM's JIT code, or one whose
 * walk found the process's memory map locked (another thread mapping:
 * a Go program starting its threads), to RING as a deferred record
 * (unwind.h's fill_deferred), *hash its id (the entry time and CPU
 * mixed: one per call, as the stacks' hashes mix their frames); 0 where
 * it does not go (neither; the ring is full: counted, the kernel's cut
 * walk kept) */
static __always_inline int defer_entry(void *ctx, struct walk *w, __u64 pid_tgid, __u32 func,
				       __u64 now, __u64 *hash)
{
	struct deferred_record *d;

	if (!through_jvm_jit(w) && w->rec.head.status != VMA_BUSY)
		return 0;
	d = bpf_ringbuf_reserve(&ring, sizeof(*d), 0);
	if (!d) {
		count_error(LAT_UNDEFERRED);
		return 0;
	}
	w->rec.time = now;
	w->rec.pid_tgid = pid_tgid;
	w->rec.probe = func;
	w->rec.cpu = bpf_get_smp_processor_id();
	*hash = mix(mix(FNV_BASIS, now), w->rec.cpu);
	fill_deferred(ctx, regs_source, w, d, NO_STACK, *hash, DEFER_STACK, DEFER_STACK);
	bpf_ringbuf_submit(d, 0);
	return 1;
}

SEC("event")
int latency_entry(void *ctx)
{
	enum latency_option opts = options;
	__u64 pid_tgid = bpf_get_current_pid_tgid(), now, hash = 0;
	struct entry_key key;

	if (!of_the_run(opts, pid_tgid))
		return result;
	now = bpf_ktime_get_ns();
	entry_key(&key, ctx, opts, pid_tgid, this_function(ctx));
	if (opts & LAT_FP_STACK)
		hash = fp_stack_hash(ctx);
	if (opts & LAT_DWARF_STACK) {
		__s32 no_kernel_stack;
		struct walk *w = walk(ctx, regs_source, 0, &no_kernel_stack);

		/* timed from after the copy: its cost (13-23 us a call by bpf_stats, far
		 * above a walk's) is not the call's */
		if (w && (opts & LAT_DEFER)
		    && defer_entry(ctx, w, pid_tgid, key.function, now, &hash))
			return entry_pushed(key.who, key.function, bpf_ktime_get_ns(), hash);
		if (w && (opts & LAT_PASS_CALLS)) {
			/* the entry where the passes find it (no record of w's
			 * is written): its function as the probe, its time, and
			 * whose stack of entries in place of a weight */
			keep_event(w, pid_tgid, key.function, NO_STACK, key.who);
			w->rec.time = now;
			passes_from(ctx, w, PASS_V8);
		}
		if (w && (opts & LAT_V8))
			v8_pass(w, pid_tgid);
		if (w && (opts & LAT_PERL))
			perl_merge(w, pid_tgid);
		if (w && (opts & LAT_RUBY))
			ruby_pass(w);
		if (w && (opts & LAT_PYTHON))
			python_pass(w, &ring, pid_tgid, key.function);
		if (w && (opts & LAT_PHP))
			php_pass(w);
		if (!w || !store_stack(w, &hash))
			return result;
	}
	return entry_pushed(key.who, key.function, now, hash);
}

/* 0 for less than one unit, else 1 + floor(log2(units)) */
static __always_inline __u32 log2_bucket(__u64 units)
{
	__u32 bucket = 1;

	if (!units)
		return 0;
#define STEP(shift) if (units >> shift) { units >>= shift; bucket += shift; }
	STEP(32) STEP(16) STEP(8) STEP(4) STEP(2) STEP(1)
#undef STEP
	return bucket;
}

SEC("event")
int latency_return(void *ctx)
{
	enum latency_option opts = options;
	__u64 pid_tgid = bpf_get_current_pid_tgid(), now, level, delta, hash, units;
	struct entry_key key;
	struct hist_key hkey;
	struct entry_stack *stack;
	struct entry_level *entry;
	struct hist *hist;
	__u32 func;

	if (!of_the_run(opts, pid_tgid))
		return result;
	now = bpf_ktime_get_ns();
	func = this_function(ctx);
	entry_key(&key, ctx, opts, pid_tgid, func);
	stack = bpf_map_lookup_elem(&entries, &key);
	if (!stack || !stack->depth)	/* no entry seen: it began before the run */
		return result;
	level = stack->depth - 1;
	stack->depth = level;
	if (level >= LAT_MAX_DEPTH)	/* too deep: not timed */
		return result;
	entry = &stack->level[level & (LAT_MAX_DEPTH - 1)];
	delta = now - entry->time;
	hash = entry->hash;
	hkey.function = func;
	hkey.tgid = (opts & LAT_BY_STACK) ? pid_tgid >> 32 : 0;
	hkey.hash = (opts & LAT_BY_STACK) ? hash : 0;
	if (!level)			/* the outermost call returned: free the slot */
		bpf_map_delete_elem(&entries, &key);
	if (opts & LAT_TAIL) {
		COUNT_AT(tails, func);
		return result;
	}
	hist = lookup_or_create(&hists, &hkey, LAT_HISTS_FULL);
	if (!hist)
		return result;
	hist->count += 1;
	hist->sum += delta;
	if (!hist->min || delta < hist->min)
		hist->min = delta;
	if (hist->max < delta)
		hist->max = delta;
	units = unit_ns > 1 ? delta / unit_ns : delta;
	hist->buckets[log2_bucket(units) & (LAT_BUCKETS - 1)] += 1;
	if ((opts & LAT_SLOWER) && delta >= slower_ns) {
		struct slow_call slow = {
			.end = now, .pid_tgid = pid_tgid, .function = func,
			.cpu = bpf_get_smp_processor_id(), .duration = delta, .hash = hash,
		};

		if (bpf_ringbuf_output(&ring, &slow, sizeof(slow), 0))
			count_error(LAT_RING_FULL);
	}
	return result;
}

/* The pass programs (passes.h): the last pushes the entry, its stack
 * stored */
static __always_inline int pass_done(void *ctx, struct walk *w, enum pass_slot next)
{
	__u64 hash;

	passes_from(ctx, w, next);
	if (!store_stack(w, &hash))
		return result;
	return entry_pushed(w->weight, w->rec.probe, w->rec.time, hash);
}

PASS_PROGRAMS(pass_done, result)
