/* Off-CPU time (capture/bpf_offcpu.py tells the story): offcpu_switch on
 * the raw sched_switch tracepoint adds the time `next` spent off the CPU
 * to OFFCPU (and `prev`'s, where its switch-in went unreported), then
 * unwinds `prev`'s user stack (unwind.h's walk: the registers it will
 * return to user space with) and keeps START[tid];
 * offcpu_waking on sched:sched_waking keeps the waker's stack in WAKERS
 * for a thread in START. With OFF_PYTHON either stack of a Python
 * process gets its Python frames (python.h), the code objects seen first
 * reported by RING; with OFF_PASS_CALLS the runtimes' frames come from
 * passes.h's programs instead, each loaded once the run meets its
 * runtime (pass_done ends the event as the walk's program would). With OFF_DEFER a walk that could not finish here goes
 * to RING as a deferred record, unwound by user space (defer_walk). */
#include "unwind.h"
#include "python.h"
#include "v8.h"
#include "php.h"
#include "perl.h"
#include "ruby.h"
#include "passes.h"

char LICENSE[] SEC("license") = "GPL";

/* a task's kernel stack is THREAD_SIZE bytes (16 KiB on x86-64, 32 KiB
 * with KASAN): a frame farther from task->stack is on an interrupt stack */
#define THREAD_STACK_SPAN (32 << 10)
#define TASK_IDLE 0x402		/* TASK_UNINTERRUPTIBLE | TASK_NOLOAD */
#define TASK_REPORT 0x7F	/* the state bits the tracepoint reports */
#define STATE_IDLE 0x80		/* ps's I */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct offcpu_start);
	__uint(max_entries, 16384);	/* threads off the CPU at once (bcc: 10240) */
} start SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct offcpu_waker);
	__uint(max_entries, 16384);
} wakers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct offcpu_key);
	__type(value, __u64);
	__uint(max_entries, 10240);	/* sized by the loader */
} offcpu SEC(".maps");

/* python.h's records of code objects seen first; deferred records (OFF_DEFER) */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__type(value, struct python_code_record);	/* (the loader drops the size) */
	__uint(max_entries, 4096);	/* sized by the loader */
} ring SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, enum offcpu_error);
	__type(value, __u64);
	__uint(max_entries, OFFCPU_ERROR_SLOTS);
} off_errors SEC(".maps");

const volatile enum offcpu_option off_options;
const volatile __u64 min_ns, max_ns;
const volatile __u32 exclude_tgid;
const volatile __u32 state_bits;	/* OFF_STATES: the states' TASK_REPORT bits */
const volatile __u32 task_pid, task_exit_state, task_stack, task_runtime;
const volatile __u32 waking_pid;	/* sched_waking's pid field in its record */
/* bytes of stack a deferred record carries: the run's --stack-size (a
 * multiple of 8), DEFER_STACK to MAX_DEFER_STACK; a constant to the
 * verifier (.rodata is frozen), so the ring's reserve may take it */
const volatile __u32 defer_stack = DEFER_STACK;

static __always_inline void off_error(enum offcpu_error slot)
{
	add_one(bpf_map_lookup_elem(&off_errors, &slot));
}

/* a u32 field of a task (0 where it cannot be read) */
static __always_inline __u32 task_u32(__u64 task, __u32 offset)
{
	__u32 v = 0;

	bpf_probe_read_kernel(&v, sizeof(v), (void *)(task + offset));
	return v;
}

/* OFF_DEFER: a walk that could not finish here goes to user space as a
 * deferred record (the thread's user registers and defer_stack bytes of
 * its stack), unwound there as the copy path's samples. The scheduler's
 * tracepoints run with interrupts off, where bpf_find_vma takes the
 * memory map's lock by a trylock and leaves its release to an irq_work:
 * a second call on that CPU before the work has run answers -EBUSY
 * (VMA_BUSY), so each switch learns at most one region of a process's
 * map, and a fresh process's first blocks could not be walked. Likewise
 * an object whose rows are not loaded yet or did not fit, a stack
 * deeper than MAX_FRAMES where the run asked for deeper copies, and a
 * walk through a JVM's JIT code (its Java frames walked in user space). The block is
 * summed under *id, the record's weight: unique, its low byte the walk's
 * status (what user space says if it did not keep the record). 0 where
 * the record does not go (the ring is full: counted): the stack stays as
 * walked, cut with its note. */
static __always_inline int defer_walk(void *ctx, struct walk *w, __u64 pid_tgid,
				      __u32 probe, __s32 kernel_stack, __u64 *id)
{
	__u32 status = w->rec.head.status, size = defer_stack;
	struct deferred_record *d;

	if (size > MAX_DEFER_STACK)
		size = MAX_DEFER_STACK;
	if (size < DEFER_STACK)
		size = DEFER_STACK;
	if (!(off_options & OFF_DEFER)
	    || (status != VMA_BUSY && status != NO_TABLE && status != TABLE_FULL
		&& (status != TRUNCATED || size == DEFER_STACK) && !through_jvm_jit(w)))
		return 0;
	d = bpf_ringbuf_reserve(&ring, sizeof(*d) - DEFER_STACK + size, 0);
	if (!d) {
		off_error(OFF_UNDEFERRED);
		return 0;
	}
	w->rec.time = bpf_ktime_get_ns();
	w->rec.pid_tgid = pid_tgid;
	w->rec.probe = probe;
	w->rec.cpu = bpf_get_smp_processor_id();
	*id = (mix(mix(FNV_BASIS, w->rec.time), pid_tgid) & ~0xFFULL) | status;
	fill_deferred(ctx, REGS_TASK, w, d, kernel_stack, *id, size, size);
	bpf_ringbuf_submit(d, 0);
	return 1;
}

/* the CPU time a task has used (ns): 0 where it cannot be read */
static __always_inline __u64 task_runtime_ns(__u64 task)
{
	__u64 v = 0;

	bpf_probe_read_kernel(&v, sizeof(v), (void *)(task + task_runtime));
	return v;
}

/* The block of `task`, if it was seen leaving, ends: its time off the CPU
 * into OFFCPU. At its switch-in (`next`); or at its next switch-out, where
 * the kernel never reported the switch-in between (6.18 under load, about
 * one block in a hundred: ftrace's and perf's sched_switch miss it too),
 * its time then being the time since it left less the CPU time it used
 * since (se.sum_exec_runtime, which a switch-in leaves as it was). */
static __always_inline void block_ended(__u64 task, enum offcpu_option opts, int unreported)
{
	__u32 tid = task_u32(task, task_pid);
	struct offcpu_start *s;
	struct offcpu_waker *wk;
	struct offcpu_key key;
	__u64 delta, ran, *sum;
	long err;

	if (!tid)
		return;
	s = bpf_map_lookup_elem(&start, &tid);
	if (!s)
		return;
	delta = bpf_ktime_get_ns() - s->time;
	ran = s->runtime ? task_runtime_ns(task) - s->runtime : 0;	/* 0: unread */
	delta = ran < delta ? delta - ran : 0;
	if (unreported)
		off_error(OFF_UNREPORTED_IN);
	key.pid_tgid = s->pid_tgid;
	key.kernel_stack = s->kernel_stack;
	key.pad = 0;
	key.hash = s->hash;
	key.waker_pid_tgid = 0;
	key.waker_kernel_stack = NO_STACK;
	key.waker_pad = 0;
	key.waker_hash = 0;
	bpf_map_delete_elem(&start, &tid);
	if (opts & OFF_WAKERS) {
		wk = bpf_map_lookup_elem(&wakers, &tid);
		if (wk) {
			key.waker_pid_tgid = wk->pid_tgid;
			key.waker_kernel_stack = wk->kernel_stack;
			key.waker_hash = wk->hash;
			bpf_map_delete_elem(&wakers, &tid);
		}
	}
	if (delta < min_ns || ((opts & OFF_MAX) && delta > max_ns))
		return;
	sum = bpf_map_lookup_elem(&offcpu, &key);
	if (!sum) {
		err = bpf_map_update_elem(&offcpu, &key, &delta, BPF_NOEXIST);
		if (!err)
			return;
		if (err == -EEXIST)
			sum = bpf_map_lookup_elem(&offcpu, &key);
		if (!sum) {
			off_error(OFF_COUNTS_FULL);
			return;
		}
	}
	__sync_fetch_and_add(sum, delta);
}

/* whether prev's state is one asked for, as the classic tracepoint
 * reports it: running when preempted or TASK_RUNNING, I for TASK_IDLE,
 * else its state and exit state's low bits (TASK_REPORT) */
static __always_inline int state_wanted(struct bpf_raw_tracepoint_args *ctx,
					enum offcpu_option opts)
{
	__u64 state = ctx->args[3], bits;	/* an unsigned int, widened */

	if (!(opts & OFF_STATES))
		return 1;
	if (ctx->args[0] || !state)
		return opts & OFF_RUNNING;
	if (state == TASK_IDLE)
		bits = STATE_IDLE;
	else
		bits = (state | task_u32(ctx->args[1], task_exit_state)) & TASK_REPORT;
	return (bits & state_bits) != 0;
}

/* whether current is a thread of interest: the target's or its
 * children's (once it exec'd, for -c), else not ustack's; a kernel thread
 * only when kernel stacks are asked for */
static __always_inline int thread_wanted(__u64 pid_tgid, enum offcpu_option opts)
{
	void *task;

	if ((opts & OFF_ONLY_TRACED) && !traced(pid_tgid))
		return 0;
	if ((opts & OFF_EXCLUDE) && pid_tgid >> 32 == exclude_tgid)
		return 0;
	if ((opts & OFF_WAIT_FOR_EXEC) && !exec_seen())
		return 0;
	if (opts & OFF_USER_ONLY) {
		task = bpf_get_current_task_btf();
		if (!KFIELD(void *, task, task_mm))
			return 0;
	}
	return 1;
}

/* the script runtimes' frames of w's stack, after the native walk, in
 * the unwinder's order (unwind.bpf.c's with_python) */
static __always_inline void interpreter_frames(struct walk *w, enum offcpu_option opts,
					       __u64 pid_tgid, __u32 probe)
{
	if (opts & OFF_V8)
		v8_pass(w, pid_tgid);
	if (opts & OFF_PERL)
		perl_merge(w, pid_tgid);
	if (opts & OFF_RUBY)
		ruby_pass(w);
	if (opts & OFF_PYTHON)
		python_pass(w, &ring, pid_tgid, probe);
	if (opts & OFF_PHP)
		php_pass(w);
}

/* START[tid] = the block that begins: prev (current) leaves the CPU, its
 * stack under `hash` */
static __always_inline void block_begins(struct bpf_raw_tracepoint_args *ctx, __u64 pid_tgid,
					 __s32 kernel_stack, __u64 hash)
{
	struct offcpu_start s = {};
	__u32 tid = pid_tgid;

	s.kernel_stack = kernel_stack;
	s.hash = hash;
	s.time = bpf_ktime_get_ns();
	s.runtime = task_runtime_ns(ctx->args[1]);
	s.pid_tgid = pid_tgid;
	if (bpf_map_update_elem(&start, &tid, &s, BPF_ANY))
		off_error(OFF_START_FULL);
}

/* WAKERS[the wakee's tid] = current, the waker, its stack under `hash` */
static __always_inline void waker_kept(void *ctx, __u64 pid_tgid, __s32 kernel_stack,
				       __u64 hash)
{
	struct offcpu_waker wk = {};
	__u32 tid = 0;

	/* the record's pid, where its format file puts it (a ctx access
	 * takes no offset known only at load time) */
	bpf_probe_read_kernel(&tid, sizeof(tid), ctx + waking_pid);
	wk.kernel_stack = kernel_stack;
	wk.hash = hash;
	wk.pid_tgid = pid_tgid;
	if (bpf_map_update_elem(&wakers, &tid, &wk, BPF_ANY))
		off_error(OFF_WAKERS_FULL);
}

/* w's runtimes' frames (inline, or by the passes: then the last pass
 * ends the event), its stack stored under *hash; 0 where it is not */
static __always_inline int runtimes_stored(void *ctx, struct walk *w, enum offcpu_option opts,
					   __u64 pid_tgid, __u32 probe, __s32 kernel_stack,
					   __u64 *hash)
{
	if (opts & OFF_PASS_CALLS) {
		keep_event(w, pid_tgid, probe, kernel_stack, 0);
		passes_from(ctx, w, PASS_V8);
	}
	interpreter_frames(w, opts, pid_tgid, probe);
	return store_stack(w, hash);
}

/* sched_switch(preempt, prev, next, prev_state): current is prev */
SEC("raw_tracepoint/sched_switch")
int offcpu_switch(struct bpf_raw_tracepoint_args *ctx)
{
	enum offcpu_option opts = off_options;
	__s32 kernel_stack;
	__u64 pid_tgid, hash;
	struct walk *w;

	block_ended(ctx->args[2], opts, 0);
	block_ended(ctx->args[1], opts, 1);	/* still open: its switch-in went unreported */
	if (!task_u32(ctx->args[1], task_pid))		/* the idle task */
		return PASS_ON;
	if (!state_wanted(ctx, opts))
		return PASS_ON;
	pid_tgid = bpf_get_current_pid_tgid();
	if (!thread_wanted(pid_tgid, opts))
		return PASS_ON;
	w = walk(ctx, REGS_TASK, (opts & OFF_KERNEL_STACK) ? &kernel_stacks : 0,
		 &kernel_stack);
	if (!w)
		return PASS_ON;
	if (!defer_walk(ctx, w, pid_tgid, 0, kernel_stack, &hash)
	    && !runtimes_stored(ctx, w, opts, pid_tgid, 0, kernel_stack, &hash))
		return PASS_ON;
	block_begins(ctx, pid_tgid, kernel_stack, hash);
	return PASS_ON;
}

/* Whether a wakeup comes from an interrupt, not from what current does:
 * x86-64 runs an interrupt of kernel code on a per-CPU stack, so the
 * tracepoint's stack pointer lies outside current's own kernel stack (it
 * is the one perf saved in the pt_regs the record's first word points
 * to); an interrupt of user code runs on current's stack, but current
 * then entered the kernel by that interrupt, whose saved user registers
 * say so (orig_ax -1, where a system call keeps its number). -1: neither
 * could be read. */
static __always_inline int in_interrupt(void *ctx)
{
	struct pt_regs *user = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	__u64 regs, sp;
	void *task;

	if ((__s64)user->orig_ax < 0)
		return 1;
	if (bpf_probe_read_kernel(&regs, sizeof(regs), ctx))
		return -1;
	if (bpf_probe_read_kernel(&sp, sizeof(sp), (void *)(regs + 19 * 8 /* sp */)))
		return -1;
	task = bpf_get_current_task_btf();
	return sp - FIELD(__u64, task, task_stack) >= THREAD_STACK_SPAN;
}

SEC("tracepoint/sched/sched_waking")
int offcpu_waking(void *ctx)
{
	enum offcpu_option opts = off_options;
	struct offcpu_waker wk = {};
	__s32 kernel_stack;
	__u32 tid = 0;
	__u64 pid_tgid, hash;
	struct walk *w;
	int irq;

	/* the record's pid, where its format file puts it (a ctx access
	 * takes no offset known only at load time) */
	bpf_probe_read_kernel(&tid, sizeof(tid), ctx + waking_pid);
	if (!bpf_map_lookup_elem(&start, &tid))		/* not a thread we follow */
		return PASS_ON;
	wk.kernel_stack = NO_STACK;
	irq = in_interrupt(ctx);
	if (irq < 0)
		return PASS_ON;
	pid_tgid = bpf_get_current_pid_tgid();
	if (!irq && pid_tgid >> 32) {			/* not the idle task */
		w = walk(ctx, REGS_TASK, (opts & OFF_KERNEL_STACK) ? &kernel_stacks : 0,
			 &kernel_stack);
		if (!w)
			return PASS_ON;
		if (!defer_walk(ctx, w, pid_tgid, 1, kernel_stack, &hash)
		    && !runtimes_stored(ctx, w, opts, pid_tgid, 1, kernel_stack, &hash))
			return PASS_ON;
		waker_kept(ctx, pid_tgid, kernel_stack, hash);
		return PASS_ON;
	}
	/* an interrupt's wakeup (a timer, a device): no thread woke it; the
	 * kernel stack says what did */
	if (opts & OFF_KERNEL_STACK) {
		long id = bpf_get_stackid(ctx, &kernel_stacks, 0);

		wk.kernel_stack = id < 0 ? NO_STACK : id;
	}
	wk.hash = INTERRUPT_HASH;
	bpf_map_update_elem(&wakers, &tid, &wk, BPF_ANY);
	return PASS_ON;
}

/* The pass programs (passes.h): loaded for sched_switch's program (a raw
 * tracepoint's) or for sched_waking's (pass_of_waking), whose event the
 * last pass ends: START's entry, or WAKERS' */
const volatile __u8 pass_of_waking;

static __always_inline int pass_done(void *ctx, struct walk *w, enum pass_slot next)
{
	__u64 hash;

	passes_from(ctx, w, next);
	if (!store_stack(w, &hash))
		return PASS_ON;
	if (pass_of_waking)
		waker_kept(ctx, w->rec.pid_tgid, w->kernel_stack, hash);
	else
		block_begins(ctx, w->rec.pid_tgid, w->kernel_stack, hash);
	return PASS_ON;
}

PASS_PROGRAMS(pass_done, PASS_ON)
