/* What ustack's BPF programs share with each other and with Python.
 *
 * Every structure Python reads or writes (map keys and values, ring
 * records) is defined here once; Python learns its layout from the
 * object's BTF (kernel/bpf_object.py: BpfObject.layout), so a field added
 * here reaches Python without a second format string. An enum's values
 * reach Python the same way (BpfObject.enum), once the C uses the enum as a
 * type (clang keeps in BTF only the types the code names: a map's key or
 * value, a typed global).
 *
 * No kernel headers: the few kernel layouts the programs touch are given
 * here (pt_regs is x86-64's, fixed by the ABI) or reach the programs as
 * read-only data taken from the running kernel's BTF (field offsets). */
#ifndef USTACK_H
#define USTACK_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* x86-64 struct pt_regs (arch/x86/include/asm/ptrace.h) */
struct pt_regs {
	__u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	__u64 ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};

#define EFAULT 14
#define EEXIST 17
#define CLONE_THREAD 0x10000

/* what a program on a trace event returns: 0 drops the perf sample (and on
 * a shared tracepoint, every other tool's too), 1 lets perf go on with it */
enum program_result { DROP_SAMPLE = 0, PASS_ON = 1 };

/* slots of the counters' error array: why an event was not counted */
enum count_error { ERR_COLLISION = 0, ERR_STACKS_FULL = 1, ERR_COUNTS_FULL = 2,
		   COUNT_ERROR_SLOTS = 3 };

/* what a stack counter does besides counting (counts.bpf.c's options) */
enum count_option {
	COUNT_ONLY_TRACED = 1,		/* a tracepoint under -p/-c: tgids only */
	COUNT_WAIT_FOR_EXEC = 2,	/* a -c command: count once armed */
	COUNT_KERNEL_STACK = 4,		/* --kernel */
	COUNT_RETURN_ADDRESS = 8,	/* an entry uprobe: its caller's return address */
	COUNT_WEIGHT = 16,		/* count --weight: add the event's weight, not 1 */
};

#define NO_STACK (-1)	/* the stack id stored when there is none */

/* the key of the stack counters' map */
struct count_key {
	__u64 pid_tgid;
	__s64 probe;		/* index into the run's probes */
	__s64 user_stack;	/* stack id, NO_STACK for none */
	__s64 kernel_stack;
	__u64 return_address;	/* the word at [sp] of an entry uprobe */
};

/* The run's scope, shared by the programs of several objects (the loader
 * hands each the same map): armed[0] is set when a held -c command has
 * exec'd (exec.bpf.c), tgids holds the traced processes (tracepoints fire
 * for every task). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} armed SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);		/* sized by the loader */
} tgids SEC(".maps");

/* count --weight: the value of the event's argument, put here by the
 * probe's program generated for it (capture/bpf_weight.py) before it
 * tail-calls the counting program, which adds it in place of 1 (a
 * trace event's programs do not nest on a CPU: bpf_prog_active) */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} weights SEC(".maps");

/* what the event adds to its stack's count: 1, or its weight */
static __always_inline __u64 event_weight(int weighted)
{
	__u32 zero = 0;
	__u64 *w;

	if (!weighted)
		return 1;
	w = bpf_map_lookup_elem(&weights, &zero);
	return w ? *w : 0;
}

/* whether the held command has exec'd */
static __always_inline int exec_seen(void)
{
	__u32 zero = 0;
	__u64 *flag = bpf_map_lookup_elem(&armed, &zero);

	return flag && *flag;
}

/* whether the process of this pid_tgid is traced */
static __always_inline int traced(__u64 pid_tgid)
{
	__u32 tgid = pid_tgid >> 32;

	return bpf_map_lookup_elem(&tgids, &tgid) != 0;
}

/* --- latency (latency.bpf.c) --- */
#define LAT_MAX_DEPTH 16	/* entries kept per (who, function): a power of two */
#define LAT_BUCKETS 64		/* log2 buckets of a histogram: a power of two */

/* ENTRIES' key: the thread (pid_tgid) or the goroutine (Go's g), the function */
struct entry_key {
	__u64 who;
	__u32 function;
	__u32 pad;
};

/* ENTRIES' value: a stack of entry times, so recursion pairs each return
 * with its own entry */
struct entry_level {
	__u64 time;
	__u64 hash;		/* the entry's stack, 0 without one */
};

struct entry_stack {
	__u64 depth;
	struct entry_level level[LAT_MAX_DEPTH];
};

/* HISTS' key: tgid and hash are 0 unless split by stack */
struct hist_key {
	__u32 function;
	__u32 tgid;
	__u64 hash;
};

/* HISTS' value (per CPU), durations in ns, buckets in the run's unit */
struct hist {
	__u64 count, sum, min, max;
	__u64 buckets[LAT_BUCKETS];
};

/* the ring's record of a call at least --slower long */
struct slow_call {
	__u64 end;
	__u64 pid_tgid;
	__u32 function;
	__u32 cpu;
	__u64 duration;
	__u64 hash;
};

/* FP_STACKS' value: a frame-pointer entry stack under its hash */
struct fp_stack {
	__s32 stack_id;
	__u32 pad;
	__u64 return_address;	/* the word at [sp], which the kernel's walk skips */
};

/* slots of latency's error array */
enum latency_error { LAT_TOO_DEEP = 0, LAT_HISTS_FULL = 1, LAT_ENTRIES_FULL = 2,
		     LAT_RING_FULL = 3, LAT_UNDEFERRED = 4, LATENCY_ERROR_SLOTS = 5 };

/* what a latency program does besides timing (latency.bpf.c's options) */
enum latency_option {
	LAT_ONLY_TRACED = 1,	/* a tracepoint under -p/-c: tgids only */
	LAT_WAIT_FOR_EXEC = 2,	/* a -c command: once armed */
	LAT_GOROUTINE = 4,	/* Go code: key on the goroutine (r14 holds g) */
	LAT_FP_STACK = 8,	/* an entry: keep its frame-pointer stack */
	LAT_BY_STACK = 16,	/* a return: a histogram per stack */
	LAT_SLOWER = 32,	/* a return: report calls of slower_ns or more */
	LAT_TAIL = 64,		/* a return through a tail call's jump: counted, not timed */
	LAT_DWARF_STACK = 128,	/* an entry: keep its stack unwound in the kernel (unwind.h) */
	LAT_PYTHON = 256,	/* with LAT_DWARF_STACK: Python frames into it (python.h) */
	LAT_V8 = 512,		/* with LAT_DWARF_STACK: JS frames named in it (v8.h) */
	LAT_PHP = 1024,		/* with LAT_DWARF_STACK: PHP frames into it (php.h) */
	LAT_PERL = 2048,	/* with LAT_DWARF_STACK: Perl frames into it (perl.h) */
	LAT_RUBY = 4096,	/* with LAT_DWARF_STACK: Ruby frames into it (ruby.h) */
	LAT_PASS_CALLS = 8192,	/* with LAT_DWARF_STACK: the runtimes' passes by tail calls (passes.h) */
	LAT_DEFER = 16384,	/* with LAT_DWARF_STACK: a walk through a JVM's JIT code goes to
				 * RING as a deferred record, its id the entry's stack hash */
};

/* *slot += 1 when slot is not NULL */
static __always_inline void add_one(__u64 *slot)
{
	if (slot)
		__sync_fetch_and_add(slot, 1);
}

/* map[index] += 1 in an ARRAY map of u64 */
#define COUNT_AT(map, index) ({ __u32 __i = (index); \
	add_one(bpf_map_lookup_elem(&(map), &__i)); })

/* --- the DWARF/Go unwinder (unwind.h, unwind.bpf.c) --- */
#define MAX_FRAMES 128		/* a power of two: the frame index is masked */
#define WINDOW 512		/* bytes of stack copied at a time (read_user) */
#define ARGS_AREA (12 << 10)	/* a trace record's fetch-args, after its frames */
#define DEFER_STACK 8192	/* bytes of stack a deferred record carries: two pages */
#define MAX_DEFER_STACK 65536	/* ... at most, as deep as --stack-size (the ring's) */
#define MAIN_DEFER_STACK 32768	/* ... a main thread's in the ring, at least: its copy ends
				 * where its stack does (Ruby's runs deeper than 8 KiB:
				 * a -c command's first samples, rows still to build,
				 * were cut) */
#define SWITCH_STACK 2048	/* bytes a deferred record carries from rbp when rbp is
				 * not in the copy from sp: the frames of another stack
				 * (Go's time.now runs the vDSO on the thread's g0 stack) */
#define SEARCH_STEPS 22		/* binary search steps: 4 M rows */
#define PAGE_SHIFT 12		/* the page index's granule (unwind/tables.py) */
#define VMA_REGION_SHIFT 21	/* the VMA cache's key: (mm ctx_id, address >> 21) */
#define TABLE_FULL_MARK 0x7FFFFFFF	/* an object's first row when its rows did not fit */
#define VDSO_INODE 1		/* OBJECTS' key of the vDSO: (0, 1), it has no file */

/* a row of unwind/tables.py: from ELF address pc on, CFA = sp|bp + cfa,
 * the return address at CFA - 8, bp by bp_rule */
struct unwind_row {
	__u32 pc;
	__u8 kind;		/* enum row_kind */
	__u8 bp_rule;		/* enum bp_rule */
	__u8 bx_rule;		/* enum bx_rule */
	__s8 aux;		/* ROW_PLT: the pc & 15 from which CFA gains 8;
				 * ROW_*_DEREF: added to the word read;
				 * ROW_BP: ROW_STACK_SWITCH or 0 */
	__s32 cfa;
	__s16 bp;		/* BP_AT: bp at CFA + bp, BP_AT_BP: at bp + bp */
	__s16 bx;		/* BX_AT: bx at CFA + bx */
};

/* ROW_BX: CFA = rbx + cfa (ld.so's lazy-binding resolver);
 * ROW_SP_DEREF, ROW_BP_DEREF: CFA = [rsp|rbp + cfa] + aux (DRAP) */
enum row_kind { ROW_GAP, ROW_SP, ROW_BP, ROW_PLT, ROW_END, ROW_SIGNAL, ROW_UNSUPPORTED,
		ROW_BX, ROW_SP_DEREF, ROW_BP_DEREF };
enum bp_rule { BP_SAME, BP_AT, BP_LOST, BP_AT_BP };
/* a ROW_BP row's aux: the function runs on another stack than its frame's
 * (Go's vDSO calls on the system stack), so its caller's CFA may be below */
#define ROW_STACK_SWITCH 1
enum bx_rule { BX_SAME, BX_AT, BX_LOST };

/* why a walk stopped (a stack's status); COMPLETE is a whole stack */
enum unwind_status {
	COMPLETE = 0, NO_MAPPING = 1, NO_FILE = 2, NO_TABLE = 3, NO_CFI = 4, GAP = 5,
	UNSUPPORTED = 6, NO_BP = 7, READ_FAILED = 8, NO_PROGRESS = 9, TRUNCATED = 10,
	VMA_BUSY = 11, TABLE_FULL = 12,
	THROUGH_JIT = 13,	/* complete, a JIT frame on its frame pointer */
	DEFERRED = 14,		/* a deferred record: the stack goes to user space */
	THROUGH_NO_CFI = 15,	/* complete, file-backed code without CFI on its frame pointer */
	PYTHON_CODE = 16,	/* not a stack: a ring record of a Python code object (python.h) */
	PYTHON_UNREADABLE = 17,	/* complete, but a Python frame could not be read */
	PYTHON_LEFT = 18,	/* complete, but Python frames were left when it ended */
	NO_BX = 20,		/* a CFA in rbx, which an earlier frame lost (or never had) */
	PHP_UNREADABLE = 21,	/* complete, but a PHP frame could not be read (php.h) */
	PHP_LEFT = 22,		/* complete, but PHP frames were left when it ended (php.h) */
	PASS_MISSING = 23,	/* complete, but a runtime's pass was not loaded: its frames not read */
	RUNNING = 0xFF,
};

/* slots of the unwinder's error array */
enum unwind_error { UW_STACKS_FULL = 0, UW_COUNTS_FULL = 1, UW_RING_FULL = 2,
		    UW_UNDEFERRED = 3,	/* the ring had no room: the stack ended cut */
		    UW_STACKS_ADDED = 4,	/* not an error: stacks put in STACKS, so
					 * user space sees it fill (bpf_unwind's spill) */
		    UW_JVM_DEFERRED = 5,	/* not an error: stacks through a JVM's JIT
					 * code deferred to user space */
		    UNWIND_ERROR_SLOTS = 6 };

/* what an unwinder program does (unwind.bpf.c's options) */
enum unwind_option {
	UW_ONLY_TRACED = 1,	/* a tracepoint under -p/-c: tgids only */
	UW_WAIT_FOR_EXEC = 2,	/* a -c command: once armed */
	UW_KERNEL_STACK = 4,	/* --kernel */
	UW_DEFER = 8,		/* a walk that ends NO_TABLE, VMA_BUSY or TABLE_FULL goes to the ring */
	UW_FETCH_ARGS = 16,	/* trace: the probe's fetch-args end each record */
	UW_PYTHON = 32,		/* Python frames into stacks through an interpreter (python.h) */
	UW_WEIGHT = 64,		/* count --weight: add the event's weight, not 1 */
	UW_V8 = 128,		/* JS frames named in stacks through a V8 object (v8.h) */
	UW_PHP = 256,		/* PHP frames into stacks through a PHP interpreter (php.h) */
	UW_PERL = 512,		/* Perl frames into stacks through a Perl object (perl.h) */
	UW_RUBY = 1024,		/* Ruby frames into stacks through a Ruby VM object (ruby.h) */
	UW_PASS_CALLS = 2048,	/* the runtimes' passes by tail calls (PASSES), each loaded
				 * when the run meets its runtime, not verified in this program */
};

/* the runtimes' pass programs a walk goes on in (passes.h's PASSES),
 * in the order they run; each goes on in the next the walk needs */
enum pass_slot {
	PASS_V8 = 0,		/* v8.h */
	PASS_PERL = 1,		/* perl.h */
	PASS_RUBY = 2,		/* ruby.h */
	PASS_PYTHON = 3,	/* python.h */
	PASS_PHP = 4,		/* php.h */
	PASS_PYTHON_DEFERRED = 5,	/* python.h's frames of a deferred stack, then its record */
	PASS_SLOTS = 6,
};

/* the programs a trace program with fetch-args goes on in (a tail call
 * into code capture/bpf_fetchargs.py generates per run): they write the
 * values after the record and output it */
enum fetch_slot {
	FETCH_STREAM = 0,	/* after the frames of the scratch value's record */
	FETCH_DEFERRED = 1,	/* after the stack of the deferred scratch's record */
	FETCH_SLOTS = 2,
};

/* where the event's user registers are */
enum regs_source {
	REGS_CTX = 0,		/* a uprobe: ctx is the user pt_regs */
	REGS_TASK = 1,		/* syscalls, tracepoints: bpf_task_pt_regs(current) */
	REGS_SAMPLE = 2,	/* a sample: ctx's when it interrupted user mode */
};

/* OBJECTS: (dev in the kernel's encoding, inode) -> its rows */
struct object_key {
	__u64 dev;
	__u64 inode;
};

struct object_rows {
	__u32 first;		/* its first row in ROWS, TABLE_FULL_MARK when they did not fit */
	__u32 rows;
	__s64 adjust;		/* vaddr - file offset of its code */
	__u32 page_slot;	/* its page index in PAGES: first slot, first page, pages */
	__u32 first_page;
	__u32 pages;
	__u32 python;		/* an interpreter: 1 + its slot in python.h's PYTHON_OBJECTS; 0 none */
	__u32 v8;		/* a V8 (node, libnode): 1 + its slot in v8.h's V8_OBJECTS; 0 none */
	__u32 php;		/* a PHP interpreter: 1 + its slot in php.h's PHP_OBJECTS; 0 none */
	__u32 perl;		/* a Perl interpreter: 1 + its slot in perl.h's PERL_OBJECTS; 0 none */
	__u32 ruby;		/* a Ruby VM (libruby): 1 + its slot in ruby.h's RUBY_OBJECTS; 0 none */
	__u32 jvm;		/* a JVM's libjvm: 1; 0 none (unwind.h's through_jvm_jit) */
	/* when a walk last met it, in unwind.h's EPOCH (~0.25 s ticks), 0
	 * never: user space evicts the rows of objects idle longest
	 * (capture/bpf_unwind.py) and reloads full ones being sampled */
	__u32 touched;
};

/* VMAS: (mm ctx_id, region) -> the mapping bpf_find_vma gave */
struct vma_key {
	__u64 ctx_id;
	__u64 region;
};

struct vma_info {
	__u64 start, end, pgoff;
	struct object_key file;	/* (0, 0): memory without a file */
};

struct stack_head {
	__u32 frames;
	enum unwind_status status;
};

/* STACKS' value, under the stack's hash */
struct unwound_stack {
	struct stack_head head;
	__u64 frame[MAX_FRAMES];
};

/* COUNTS' key */
struct unwind_count_key {
	__u64 pid_tgid;
	__u32 probe;
	__s32 kernel_stack;
	__u64 hash;
};

/* a trace record in the ring, its frames after it */
struct trace_record {
	__u64 time;		/* CLOCK_MONOTONIC ns */
	__u64 pid_tgid;
	__u32 probe;
	__u32 cpu;
	struct stack_head head;
};

/* a deferred record (head.status DEFERRED, no frames): the event's
 * registers, `copied` bytes of stack from sp, and where rbp points
 * outside them, `other_copied` bytes from rbp (`other`) right after
 * them. A fixed reserve has room for DEFER_STACK + SWITCH_STACK bytes
 * (the fetch-args after them); count/trace's ring holds a record only as
 * long as what it carries (unwind.bpf.c's defer) */
struct deferred_record {
	struct trace_record rec;
	__u64 ip, sp, bp, bx;
	__s32 kernel_stack;
	__u32 copied;
	__u64 weight;		/* what the event adds to its stack's count */
	__u64 other;
	__u32 other_copied;
	__u32 pad;
	__u8 stack[DEFER_STACK + SWITCH_STACK];
};

/* the longest deferred record (--stack-size MAX_DEFER_STACK), written
 * whole before its used part goes to the ring */
struct deferred_longest {
	struct deferred_record d;
	__u8 more[MAX_DEFER_STACK - DEFER_STACK];
};

/* a deferred record being written, its fetch-args after it (trace) */
struct deferred_with_args {
	struct deferred_record d;
	__u8 args[ARGS_AREA];
};

/* --- off-CPU (offcpu.bpf.c) --- */
/* START: a thread seen leaving the CPU, under its tid */
struct offcpu_start {
	__u64 time;
	__u64 pid_tgid;
	__u64 hash;		/* its user stack in STACKS */
	__s32 kernel_stack;
	__u32 pad;
	__u64 runtime;		/* its CPU time then (se.sum_exec_runtime, ns) */
};

/* WAKERS: who woke a thread in START, under the wakee's tid */
struct offcpu_waker {
	__u64 pid_tgid;		/* 0 with INTERRUPT_HASH: an interrupt's wakeup */
	__u64 hash;
	__s32 kernel_stack;
	__u32 pad;
};

#define INTERRUPT_HASH 1

/* OFFCPU's key: the blocked thread's and its waker's (0s without one);
 * its value the nanoseconds spent off the CPU, summed */
struct offcpu_key {
	__u64 pid_tgid;
	__s32 kernel_stack;
	__u32 pad;
	__u64 hash;
	__u64 waker_pid_tgid;
	__s32 waker_kernel_stack;
	__u32 waker_pad;
	__u64 waker_hash;
};

/* slots of off-CPU's error array */
enum offcpu_error { OFF_START_FULL = 0, OFF_COUNTS_FULL = 1, OFF_WAKERS_FULL = 2,
		    OFF_UNDEFERRED = 3,	/* the ring had no room: the stack stayed cut */
		    OFF_UNREPORTED_IN = 4,	/* not an error: blocks ended at the next switch-out */
		    OFFCPU_ERROR_SLOTS = 5 };

/* what the off-CPU programs do besides their job (offcpu.bpf.c's options) */
enum offcpu_option {
	OFF_ONLY_TRACED = 1,	/* under -p/-c: tgids only */
	OFF_WAIT_FOR_EXEC = 2,	/* a -c command: once armed */
	OFF_EXCLUDE = 4,	/* system-wide: not exclude_tgid (ustack) */
	OFF_USER_ONLY = 8,	/* not kernel threads (no kernel stacks asked for) */
	OFF_KERNEL_STACK = 16,	/* --kernel */
	OFF_WAKERS = 32,	/* --wakers: WAKERS is read at switch-in */
	OFF_MAX = 64,		/* an upper bound on the time off the CPU */
	OFF_STATES = 128,	/* only the states of state_bits (and running with OFF_RUNNING) */
	OFF_RUNNING = 256,
	OFF_PYTHON = 512,	/* Python frames into stacks through an interpreter (python.h) */
	OFF_V8 = 1024,		/* JS frames named in stacks through a V8 object (v8.h) */
	OFF_DEFER = 2048,	/* a walk that cannot finish goes to the ring (defer_walk) */
	OFF_PHP = 4096,		/* PHP frames into stacks through a PHP interpreter (php.h) */
	OFF_PERL = 8192,	/* Perl frames into stacks through a Perl object (perl.h) */
	OFF_RUBY = 16384,	/* Ruby frames into stacks through a Ruby VM object (ruby.h) */
	OFF_PASS_CALLS = 32768,	/* the runtimes' passes by tail calls (passes.h), not inline */
};

/* --- memleak (memleak.bpf.c) --- */
/* the allocator a probe is on: how its entry gives the size and its
 * return the block */
enum memleak_kind {
	ML_MALLOC = 0,		/* malloc(size), valloc(size), pvalloc(size) */
	ML_CALLOC = 1,		/* calloc(n, size) */
	ML_REALLOC = 2,		/* realloc(old, size): old freed when it returns a block */
	ML_ALIGNED = 3,		/* memalign(align, size), aligned_alloc(align, size) */
	ML_POSIX_MEMALIGN = 4,	/* posix_memalign(&block, align, size): 0 on success */
	ML_MMAP = 5,		/* mmap(addr, length, ...): MAP_FAILED on failure */
};

/* CALLS: an allocator call between its entry and its return, under the tid */
struct memleak_call {
	__u64 sp;		/* at the entry: its return comes back at sp + 8 */
	__u64 size;
	__u64 out;		/* posix_memalign's &block */
	__u64 hash;		/* the entry's stack in STACKS (unwound) */
	__u64 old;		/* realloc's old block, taken out of ALLOCS meanwhile */
	__u64 old_size, old_hash, old_time;
	__u32 kind;		/* enum memleak_kind */
	__u32 had_old;		/* old was outstanding */
};

/* ALLOCS: a block not freed yet, under (its address, tgid) */
struct memleak_key {
	__u64 addr;
	__u32 tgid;
	__u32 pad;
};

struct memleak_alloc {
	__u64 size;
	__u64 hash;
	__u64 time;		/* bpf_ktime_get_ns() when it was returned */
};

/* TOTALS: what each (process, stack) holds */
struct memleak_stack {
	__u64 hash;
	__u32 tgid;
	__u32 pad;
};

struct memleak_total {
	__s64 bytes;
	__s64 count;
};

/* slots of memleak's error array */
enum memleak_error { ML_CALLS_FULL = 0, ML_ALLOCS_FULL = 1, ML_TOTALS_FULL = 2,
		     ML_STACKS_FULL = 3,
		     ML_UNDEFERRED = 4,	/* the ring had no room: the stack ended cut */
		     MEMLEAK_ERROR_SLOTS = 5 };

/* what a memleak program does besides its job */
enum memleak_option {
	ML_WAIT_FOR_EXEC = 1,	/* a -c command: once armed */
	ML_PYTHON = 2,		/* Python frames into stacks through an interpreter (python.h) */
	ML_V8 = 4,		/* JS frames named in stacks through a V8 object (v8.h) */
	ML_DEFER = 8,		/* a walk that ends NO_TABLE or TABLE_FULL goes to the ring */
	ML_PHP = 16,		/* PHP frames into stacks through a PHP interpreter (php.h) */
	ML_PERL = 32,		/* Perl frames into stacks through a Perl object (perl.h) */
	ML_RUBY = 64,		/* Ruby frames into stacks through a Ruby VM object (ruby.h) */
	ML_PASS_CALLS = 128,	/* the runtimes' passes by tail calls (passes.h), not inline */
};

#endif
