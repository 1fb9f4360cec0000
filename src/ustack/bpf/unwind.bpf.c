/* The in-kernel DWARF/Go unwinder's programs, one per probe (the walk is
 * unwind.h's; capture/bpf_unwind.py loads them and tells the story):
 * unwind_count counts each distinct stack (count, profile):
 * STACKS[hash] = the stack, COUNTS[(pid_tgid, probe, kernel stack, hash)]
 * += 1 (or the event's weight: UW_WEIGHT, also in a deferred record);
 * unwind_trace writes each event's record and frames into the ring
 * (trace), its fetch-args after them where the probe has some (a tail call
 * into the code generated for them). Either defers a walk that ended
 * NO_TABLE, VMA_BUSY or TABLE_FULL (an object mapped before its rows were
 * loaded, a memory map locked in a sample's interrupt, an object whose
 * rows did not fit ROWS), or went through a JVM's JIT code (unwind.h's
 * through_jvm_jit; unwind/hotspot_live.py), given UW_DEFER: the event's registers and stack go to the
 * ring for user space to unwind; where the ring is full the stack ends
 * cut, as walked. Given UW_PYTHON, a stack of a process running a Python
 * interpreter gets its Python frames (python.h) after the native walk; given
 * UW_V8, a node process's JS frames are named (v8.h); given UW_PHP, a stack
 * through a PHP interpreter gets its PHP frames (php.h), UW_PERL a Perl
 * one's (perl.h), UW_RUBY a Ruby VM's (ruby.h): each verified in the
 * program. Given UW_PASS_CALLS instead, the walk goes on in the pass
 * programs below (pass_*, a tail call through PASSES each) of the runtimes
 * it met, and the last one ends the event as the walk's program would:
 * a pass is verified only once the run meets its runtime (the five cost
 * ~30 ms of verifier time in every program that holds them). A stack
 * that met a runtime whose pass is not in PASSES ends PASS_MISSING. */
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
	__type(key, struct unwind_count_key);
	__type(value, __u64);
	__uint(max_entries, 1);		/* sized by the loader */
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__type(value, struct deferred_record);	/* and trace_record (the loader drops the size) */
	__uint(max_entries, 4096);	/* sized by the loader */
} ring SEC(".maps");

/* a trace program's fetch-args programs (enum fetch_slot) */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__type(key, enum fetch_slot);
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, FETCH_SLOTS);
} fetch_args SEC(".maps");

/* where a deferred record with fetch-args is written (too big for the ring's reserve
 * to be handed to the generated code: it outputs a copy) */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct deferred_with_args);
	__uint(max_entries, 1);
} deferred_scratch SEC(".maps");

/* where a deferred record for the ring is written (defer), one value per
 * CPU: a per-CPU value holds at most 32 KiB */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct deferred_longest);
	__uint(max_entries, 1);		/* sized by the loader: the possible CPUs */
} deferred_room SEC(".maps");

const volatile __u32 probe_index;
/* behind a uprobe_multi link (many uprobes, one program): the probe is the
 * link's cookie for the uprobe that fired, not probe_index */
const volatile __u8 probe_by_cookie;
const volatile enum program_result result;
const volatile enum unwind_option options;
const volatile enum regs_source regs_source;
/* a pass program ends the event as unwind_trace does (1) or unwind_count */
const volatile __u8 tracing;
/* bytes of stack a deferred record in the ring carries: the run's
 * --stack-size (a multiple of 8; the loader's), DEFER_STACK to
 * MAX_DEFER_STACK. A constant to the verifier (.rodata is frozen), so the
 * ring's reserve may take it */
const volatile __u32 defer_stack = DEFER_STACK;

static __always_inline __u32 ring_defer_stack(void)
{
	__u32 size = defer_stack;

	if (size > MAX_DEFER_STACK)
		size = MAX_DEFER_STACK;
	if (size < DEFER_STACK)
		size = DEFER_STACK;
	return size;
}

static __always_inline __u32 this_probe(void *ctx)
{
	return probe_by_cookie ? bpf_get_attach_cookie(ctx) : probe_index;
}

static __always_inline int in_scope(__u64 pid_tgid, enum unwind_option opts)
{
	if ((opts & UW_ONLY_TRACED) && !traced(pid_tgid))
		return 0;
	if ((opts & UW_WAIT_FOR_EXEC) && !exec_seen())
		return 0;
	return 1;
}

static __always_inline struct walk *walked(void *ctx, enum unwind_option opts,
					   __s32 *kernel_stack)
{
	return walk(ctx, regs_source, (opts & UW_KERNEL_STACK) ? &kernel_stacks : 0,
		    kernel_stack);
}

static __always_inline int deferrable(struct walk *w, enum unwind_option opts)
{
	/* TABLE_FULL too: an object whose rows did not fit is unwound from
	 * the stack copy in user space, not cut; and a stack deeper than
	 * MAX_FRAMES where the run asked for deeper copies (--stack-size),
	 * which a record with fetch-args does not carry (DEFER_STACK) */
	if (!(opts & UW_DEFER))
		return 0;
	/* a JVM's JIT code (no frame pointer in its compiled code): its
	 * frames are walked in user space from the copy */
	if (through_jvm_jit(w)) {
		count_unwind_error(UW_JVM_DEFERRED);
		return 1;
	}
	return w->rec.head.status == NO_TABLE || w->rec.head.status == VMA_BUSY
		|| w->rec.head.status == TABLE_FULL
		|| (w->rec.head.status == TRUNCATED && !(opts & UW_FETCH_ARGS)
		    && ring_defer_stack() > DEFER_STACK);
}

/* the Python frames of w's stack, after the native walk; new code
 * objects into the ring */
static __always_inline void with_python(struct walk *w, enum unwind_option opts,
					__u64 pid_tgid, __u32 probe)
{
	if (opts & UW_V8)
		v8_pass(w, pid_tgid);
	if (opts & UW_PERL)
		perl_merge(w, pid_tgid);
	if (opts & UW_RUBY)
		ruby_pass(w);
	if (opts & UW_PYTHON)
		python_pass(w, &ring, pid_tgid, probe);
	if (opts & UW_PHP)
		php_pass(w);
}

/* the head of this event's record in w->rec */
static __always_inline void record_head(struct walk *w, __u64 pid_tgid, __u32 probe)
{
	w->rec.time = bpf_ktime_get_ns();
	w->rec.pid_tgid = pid_tgid;
	w->rec.probe = probe;
	w->rec.cpu = bpf_get_smp_processor_id();
}

/* A deferred record into the ring, for user space to unwind once it has
 * loaded what the walk missed; 0 when the ring is full (counted). Written
 * whole in this CPU's room first, so the ring holds only the part it uses:
 * a stack's copy as deep as the stack is (a short program's ~3 KiB of 8),
 * the other stack's only where the chain switches stacks; a command's
 * first burst of events then fits the ring whole. */
static __always_inline int defer(void *ctx, struct walk *w, __s32 kernel_stack,
				 __u64 weight)
{
	__u32 cpu = bpf_get_smp_processor_id(), used;
	struct deferred_longest *room = bpf_map_lookup_elem(&deferred_room, &cpu);

	if (!room) {
		count_unwind_error(UW_UNDEFERRED);
		return 0;
	}
	used = fill_deferred(ctx, regs_source, w, &room->d, kernel_stack, weight,
			     ring_defer_stack(), MAIN_DEFER_STACK);
	if (used > sizeof(*room))	/* for the verifier */
		used = sizeof(*room);
	if (bpf_ringbuf_output(&ring, room, used, 0)) {
		count_unwind_error(UW_UNDEFERRED);
		return 0;
	}
	return 1;
}

/* w's stack counted under the event kept in w (keep_event) */
static __always_inline void count_stack(struct walk *w)
{
	struct unwind_count_key key;
	__u64 weight = w->weight, *n;
	long err;

	key.pid_tgid = w->rec.pid_tgid;
	key.probe = w->rec.probe;
	key.kernel_stack = w->kernel_stack;
	if (!store_stack(w, &key.hash))
		return;
	n = bpf_map_lookup_elem(&counts, &key);
	if (!n) {
		err = bpf_map_update_elem(&counts, &key, &weight, BPF_NOEXIST);
		if (!err)
			return;
		if (err == -EEXIST)	/* another CPU made it first: add to theirs */
			n = bpf_map_lookup_elem(&counts, &key);
		if (!n) {
			count_unwind_error(UW_COUNTS_FULL);
			return;
		}
	}
	__sync_fetch_and_add(n, weight);
}

/* w's record (its head from record_head) and frames into the ring, or
 * into the probe's fetch-args programs, which write their values after
 * them and output it */
static __always_inline void output_record(void *ctx, struct walk *w, enum unwind_option opts)
{
	__u32 n;

	if (opts & UW_FETCH_ARGS)
		bpf_tail_call(ctx, &fetch_args, FETCH_STREAM);
	n = w->rec.head.frames;
	if (n > MAX_FRAMES)
		n = MAX_FRAMES;
	if (bpf_ringbuf_output(&ring, &w->rec, sizeof(w->rec) + 8 * n, 0))
		count_unwind_error(UW_RING_FULL);
}

/* the runtimes' passes a walk's program may run inline (with_python) */
#define INLINE_PASSES (UW_PYTHON | UW_V8 | UW_PHP | UW_PERL | UW_RUBY)

/* an event counted (unwind_count) */
static __always_inline int count_event(void *ctx, enum unwind_option opts)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid(), weight;
	__s32 kernel_stack;
	struct walk *w;
	__u32 probe;

	if (!in_scope(pid_tgid, opts))
		return result;
	probe = this_probe(ctx);
	weight = event_weight(opts & UW_WEIGHT);
	w = walked(ctx, opts, &kernel_stack);
	if (!w)
		return result;
	if (deferrable(w, opts)) {
		record_head(w, pid_tgid, probe);
		if (opts & UW_PYTHON)
			python_deferred(w, &ring);
		if ((opts & UW_PASS_CALLS) && w->python) {
			keep_event(w, pid_tgid, probe, kernel_stack, weight);
			bpf_tail_call(ctx, &passes, PASS_PYTHON_DEFERRED);
		}
		if (defer(ctx, w, kernel_stack, weight))
			return result;
	}
	with_python(w, opts, pid_tgid, probe);
	keep_event(w, pid_tgid, probe, kernel_stack, weight);
	if (opts & UW_PASS_CALLS)
		passes_from(ctx, w, PASS_V8);
	count_stack(w);
	return result;
}

/* an event's record into the ring (unwind_trace) */
static __always_inline int trace_event(void *ctx, enum unwind_option opts)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct deferred_with_args *dw;
	__s32 kernel_stack;
	struct walk *w;
	__u32 zero = 0, probe;

	if (!in_scope(pid_tgid, opts))
		return result;
	probe = this_probe(ctx);
	w = walked(ctx, opts, &kernel_stack);
	if (!w)
		return result;
	record_head(w, pid_tgid, probe);
	if (deferrable(w, opts)) {
		if (opts & UW_PYTHON)
			python_deferred(w, &ring);
		if (!(opts & UW_FETCH_ARGS)) {
			if ((opts & UW_PASS_CALLS) && w->python) {
				keep_event(w, pid_tgid, probe, kernel_stack, 1);
				bpf_tail_call(ctx, &passes, PASS_PYTHON_DEFERRED);
			}
			if (defer(ctx, w, kernel_stack, 1))
				return result;
		} else {
			dw = bpf_map_lookup_elem(&deferred_scratch, &zero);
			if (dw) {
				fill_deferred(ctx, regs_source, w, &dw->d, kernel_stack, 1, DEFER_STACK,
					      DEFER_STACK);
				/* outputs it, or counts UW_UNDEFERRED and goes on
				 * in FETCH_STREAM with the stack as walked */
				bpf_tail_call(ctx, &fetch_args, FETCH_DEFERRED);
			}
		}
	}
	with_python(w, opts, pid_tgid, probe);
	if (opts & UW_PASS_CALLS)
		passes_from(ctx, w, PASS_V8);
	output_record(ctx, w, opts);
	return result;
}

/* The walk's programs. Each _lean one leaves the runtimes' inline passes
 * out at compile time, and with them the .text functions only they call
 * (~5,800 of the ~7,400 instructions the other has with .text): for a run
 * whose passes are tail calls (UW_PASS_CALLS) or that merges no runtime,
 * the verifier has none of it to remove, and the loader links none of it. */
SEC("event")
int unwind_count(void *ctx)
{
	return count_event(ctx, options);
}

SEC("event")
int unwind_count_lean(void *ctx)
{
	return count_event(ctx, options & ~INLINE_PASSES);
}

SEC("event")
int unwind_trace(void *ctx)
{
	return trace_event(ctx, options);
}

SEC("event")
int unwind_trace_lean(void *ctx)
{
	return trace_event(ctx, options & ~INLINE_PASSES);
}

/* The pass programs: each goes on with the stack the walk's program left
 * in the scratch value (with the event, keep_event), in the next pass the
 * walk needs, and the last ends the event as that program would
 * (`tracing`; a probe with fetch-args runs its passes in its own program:
 * PASSES is the run's, its fetch-args the probe's). */
static __always_inline int pass_done(void *ctx, struct walk *w, enum pass_slot next)
{
	passes_from(ctx, w, next);
	if (tracing)
		output_record(ctx, w, 0);
	else
		count_stack(w);
	return result;
}

PASS_PROGRAMS(pass_done, result)

/* a stack the walk defers, having met a Python interpreter: its Python
 * frames into the ring before its deferred record; where the ring has no
 * room for that, the stack as walked goes on through the passes */
SEC("event")
int pass_python_deferred(void *ctx)
{
	struct walk *w = scratch_value();

	if (!w)
		return result;
	python_deferred(w, &ring);
	if (defer(ctx, w, w->kernel_stack, w->weight))
		return result;
	return pass_done(ctx, w, PASS_V8);
}
