/* The in-kernel DWARF/Go unwinder's walk, shared by the programs that
 * unwind a user stack (unwind.bpf.c; capture/bpf_unwind.py tells the whole
 * story). walk() leaves the current task's user stack in the per-CPU
 * scratch value: its frames, status (enum unwind_status) and running hash.
 * One bpf_loop step per frame, so the verifier checks the step once:
 * - the pc's mapping: bpf_find_vma, its answers cached in VMAS by (mm
 *   ctx_id, 2 MiB region) (in a sample's interrupt find_vma answers once);
 *   consecutive frames in one mapping skip both;
 * - the object's rows: OBJECTS[(dev, inode)], a binary search over the
 *   rows of the pc's 4 KiB page (PAGES) in ROWS (chunks: ROW_CHUNKS);
 * - the row's rule: CFA = sp|bp|bx + N, [sp|bp + N] + M (DRAP) or the
 *   PLT's, the return address at CFA - 8, bp and bx restored per the row
 *   (bx: ld.so's lazy-binding resolver has its CFA in rbx); a signal frame
 *   continues from the ucontext. Stack words come from a WINDOW-byte copy.
 * Code without a file (a JIT's) and a file's code without CFI (V8's
 * builtins) are walked on the frame pointer, with a note; a row whose rule
 * is not evaluated ends the stack with a note, never a guess. A JVM's JIT
 * code keeps no frame pointer: through_jvm_jit tells the programs to
 * defer such a walk to user space (unwind/hotspot_live.py). */
#ifndef UNWIND_H
#define UNWIND_H

#include "ustack.h"

#ifndef FNV_PRIME
#define FNV_PRIME 0x100000001B3ULL
#endif
#define FNV_BASIS 0xCBF29CE484222325ULL

/* the ucontext of a signal frame, at sp when the handler returned */
#define UC_GREGS 40
#define UC_RBP (UC_GREGS + 8 * 10)
#define UC_RBX (UC_GREGS + 8 * 11)
#define UC_RSP (UC_GREGS + 8 * 15)
#define UC_RIP (UC_GREGS + 8 * 16)

struct task_struct;
struct vm_area_struct;

/* the per-CPU scratch value: a walk's state, then its record */
struct walk {
	__u64 pc, sp, bp;
	__u64 exact;		/* pc is the event's own, not a return address */
	__u64 bp_ok;		/* bp holds the frame's value */
	__u64 bx, bx_ok;	/* the same of rbx */
	__u64 hash;
	__u64 mstart, mend;	/* the mapping whose rows are below */
	__s64 adjust;		/* its ELF address - runtime address */
	__u32 first, rows, page_slot, first_page, pages, pad;
	__u32 lo, hi;		/* the binary search's bounds, rows in ROWS */
	__u64 word;		/* a word read from the stack */
	__u64 win;		/* the stack address window[] holds, 0 for none */
	__u64 fp_used;		/* FP_FOR_*: frames walked on bp, and why */
	__u64 sp0;		/* the event's sp (a runtime's pass checks frame 0 by it) */
	__u64 python;		/* object_rows.python of an interpreter the walk met, 0 none */
	__s64 python_adjust;	/* that object's adjust (the same in all its segments) */
	__u64 v8;		/* object_rows.v8 of a V8 object the walk met, 0 none */
	__u64 php;		/* object_rows.php of a PHP interpreter the walk met, 0 none */
	__s64 php_adjust;	/* that object's adjust */
	__u64 perl;		/* object_rows.perl of a Perl object the walk met, 0 none */
	__s64 perl_adjust;	/* that object's adjust */
	__u64 ruby;		/* object_rows.ruby of a Ruby VM object the walk met, 0 none */
	__s64 ruby_adjust;	/* that object's adjust */
	__u64 jvm;		/* the walk met a JVM's libjvm (object_rows.jvm) */
	/* the event's, for the pass programs that end what the walk began
	 * (unwind.bpf.c's: a tail call keeps only ctx) */
	__u64 weight;
	__s64 kernel_stack;
	struct trace_record rec;	/* a trace record's head; rec.head is the stack's */
	__u64 frame[MAX_FRAMES];
	/* each frame's frame pointer where it was walked on it, else 0: where
	 * a runtime's pass (v8.h) finds the frame's fixed slots (a trace
	 * record's fetch-args, written after its frames, may cover them once
	 * the walk and the passes are done) */
	__u64 frame_fp[MAX_FRAMES];
	/* WINDOW bytes of stack during the walk; a trace record's fetch-args
	 * after its frames once it is done */
	__u8 window[ARGS_AREA];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct walk);
	__uint(max_entries, 1);
} scratch SEC(".maps");

/* ROWS: every object's rows, in chunks of 1 << row_chunk_shift rows
 * added as the run needs them (capture/row_chunks.py): row i is row
 * i & (1 << row_chunk_shift) - 1 of chunk i >> row_chunk_shift, an ARRAY
 * map of struct unwind_row (row_chunks_inner) whose fd user space puts in
 * ROW_CHUNKS. The outer map is made from a chunk as template, without
 * BPF_F_INNER_MAP: the verifier inlines both lookups. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct unwind_row);
	__uint(max_entries, 1);		/* sized by the loader */
	__uint(map_flags, BPF_F_MMAPABLE);	/* filled by a copy */
} row_chunks_inner SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__type(key, __u32);
	__type(value, __u32);		/* an inner map's fd, from user space */
	__uint(max_entries, 1);		/* sized by the loader */
} row_chunks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);		/* the first row of a page of an object */
	__uint(max_entries, 1);		/* sized by the loader */
} pages SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct object_key);
	__type(value, struct object_rows);
	__uint(max_entries, 1);		/* sized by the loader */
} objects SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct vma_key);
	__type(value, struct vma_info);
	__uint(max_entries, 1);		/* sized by the loader */
} vmas SEC(".maps");

/* EPOCH: the clock of object_rows.touched, advanced by user space about
 * every 0.25 s (capture/bpf_unwind.py's UnwindObjects.tick): an array
 * lookup the verifier inlines, where reading the kernel's clock cost a
 * walk ~30 ns (5 % of a shallow uprobe's) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} epoch SEC(".maps");

/* WANTED: objects a walk found without rows, and how often: user space
 * builds and loads the most wanted first, while the run goes on */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct object_key);
	__type(value, __u64);
	__uint(max_entries, 1);		/* sized by the loader */
} wanted SEC(".maps");

/* STACKS (unwound): the distinct stacks walked, under their hash. Its
 * maps' names are the unwinder's own: a program that includes this header
 * may have a stacks or errors map of its own (latency.bpf.c) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, struct unwound_stack);
	__uint(max_entries, 1);		/* sized by the loader */
} unwound SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, enum unwind_error);
	__type(value, __u64);
	__uint(max_entries, UNWIND_ERROR_SLOTS);
} unwind_errors SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 8);		/* 8 bytes a frame: sized by the loader */
	__uint(max_entries, 1);
} kernel_stacks SEC(".maps");

/* JVM_PROCESSES: the processes (tgid) known to run a JVM: user space
 * writes those it finds mapping libjvm, a walk that meets libjvm its own.
 * A pid reused by another process keeps the mark till it is evicted: its
 * JIT stacks are deferred, and walked in user space as any copy. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, __u32);
	__type(value, __u8);
	__uint(max_entries, 1);		/* sized by the loader */
} jvm_processes SEC(".maps");

/* kernel field offsets, from the running kernel's BTF */
const volatile __u32 task_mm, mm_ctx_id, mm_vdso, mm_start_stack;
const volatile __u32 vm_start, vm_end, vm_pgoff, vm_file, vm_mm;
const volatile __u32 f_inode, i_ino, i_sb, s_dev;
/* ROWS' chunk size, a power of two: set by the loader per run */
const volatile __u32 row_chunk_shift = 18;

#define READ_ONCE(x) (*(volatile typeof(x) *)&(x))
#define WRITE_ONCE(x, v) (*(volatile typeof(x) *)&(x) = (v))

#define FIELD(type, ptr, offset) (*(type *)((void *)(ptr) + (offset)))

/* A kernel struct's field read by bpf_probe_read_kernel (0 where it cannot
 * be read), for pointers and what they point to. FIELD of a pointer
 * member makes the verifier look the struct's "safe" variants up by name
 * in the kernel's BTF, a scan of every type, at each such load on each
 * path it checks: ~4 ms of every load of the unwinder's program. Read
 * this way the pointer is a number, so what it points to is read so too. */
#define KFIELD(type, ptr, offset) ({					\
	type __v = 0;							\
	bpf_probe_read_kernel(&__v, sizeof(__v), (void *)(ptr) + (offset));	\
	__v;								\
})

static __always_inline struct walk *scratch_value(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&scratch, &zero);
}

static __always_inline __u64 mix(__u64 hash, __u64 word)
{
	hash = (hash ^ word) * FNV_PRIME;
	return hash ^ (hash >> 29);
}

static __always_inline long stop(struct walk *w, enum unwind_status status)
{
	w->rec.head.status = status;
	return 1;
}

/* *into = the user word at addr; 0 on success. Served from the window
 * when it holds the word: a copy from user memory costs as much for 8
 * bytes as for WINDOW (its checks dominate), and a walk reads nearby words. */
static __always_inline long read_user(struct walk *w, __u64 addr, __u64 *into)
{
	__u64 at = addr - w->win;

	if (at > WINDOW - 8) {
		if (bpf_probe_read_user(w->window, WINDOW, (void *)addr)) {
			w->win = 0;	/* near the stack's end: one word */
			return bpf_probe_read_user(into, 8, (void *)addr);
		}
		w->win = addr;
		at = 0;
	}
	*into = *(__u64 *)(w->window + at);
	return 0;
}

/* the current task's user registers into w: a function of its own, as
 * the verifier takes one load instruction to one kind of pointer (clang
 * would share the loads with the ctx's) */
static __noinline void task_registers(struct walk *w)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());

	w->pc = regs->ip;
	w->sp = regs->sp;
	w->bp = regs->bp;
	w->bx = regs->bx;
}

/* the user registers of the event into w */
static __always_inline void user_registers(void *ctx, enum regs_source source, struct walk *w)
{
	struct pt_regs *regs = ctx;

	if (source == REGS_TASK || (source == REGS_SAMPLE && !(regs->cs & 3))) {
		task_registers(w);
		return;
	}
	w->pc = regs->ip;
	w->sp = regs->sp;
	w->bp = regs->bp;
	w->bx = regs->bx;
}

/* bpf_find_vma's callback: the mapping's start, end, page offset, and
 * file (dev, inode; the vDSO's key, or none for anonymous code) */
static long vma_found(struct task_struct *task, struct vm_area_struct *vma,
		      struct vma_info *out)
{
	void *file, *inode, *sb, *mm;

	out->start = FIELD(__u64, vma, vm_start);
	out->end = FIELD(__u64, vma, vm_end);
	out->pgoff = FIELD(__u64, vma, vm_pgoff);
	file = KFIELD(void *, vma, vm_file);
	if (!file) {		/* the vDSO (its start is mm->context.vdso), or anonymous */
		mm = KFIELD(void *, vma, vm_mm);
		if (mm && KFIELD(__u64, mm, mm_vdso) == out->start)
			out->file.inode = VDSO_INODE;
		return 0;
	}
	inode = KFIELD(void *, file, f_inode);
	if (!inode)
		return 0;
	out->file.inode = KFIELD(__u64, inode, i_ino);
	sb = KFIELD(void *, inode, i_sb);
	if (sb)
		out->file.dev = KFIELD(__u32, sb, s_dev);
	return 0;
}

/* one more walk that wanted the rows of object `key` */
static __always_inline void want(struct object_key *key)
{
	__u64 one = 1, *hits = bpf_map_lookup_elem(&wanted, key);

	if (hits)
		__sync_fetch_and_add(hits, 1);
	else
		bpf_map_update_elem(&wanted, key, &one, BPF_NOEXIST);
}

#define VMA_SPREAD 4	/* regions of one mapping cached from one answer, at most */

/* find_vma's answer kept under its key's region and the others of the
 * mapping (VMA_SPREAD from its start): find_vma answers once per sample's
 * interrupt, so a new process's text over several 2 MiB regions
 * (libpython, a static python: 2-3) took a deferred sample each */
static __always_inline void cache_vma(struct vma_key *key, struct vma_info *vma)
{
	__u64 first = vma->start >> VMA_REGION_SHIFT, own = key->region;

	bpf_map_update_elem(&vmas, key, vma, BPF_ANY);
	for (int i = 0; i < VMA_SPREAD; i++) {
		key->region = first + i;
		if (key->region << VMA_REGION_SHIFT >= vma->end)
			break;
		if (key->region != own)
			bpf_map_update_elem(&vmas, key, vma, BPF_ANY);
	}
}

/* NO_FILE_CODE: a JIT's; NO_CFI_CODE: a file's code without CFI (V8's
 * builtins in node): both walked on the frame pointer */
/* why frames were walked on the frame pointer (struct walk's fp_used) */
enum { FP_FOR_NO_FILE = 1, FP_FOR_NO_CFI = 2 };

enum mapped { MAPPED, NOT_MAPPED, NO_FILE_CODE, NO_CFI_CODE };

/* w's mapping and rows for the address q, or why not (the walk stops).
 * A function of its own: its locals end with it, so the verifier checks
 * the search after it once whichever way the mapping was found */
static __noinline enum mapped find_mapping(struct walk *w, __u64 q)
{
	void *task = bpf_get_current_task_btf();
	/* keyed by the mm's ctx_id, not its address: a freed mm_struct is
	 * soon another process's, whose code the cached VMAs would misname */
	struct vma_key key = {
		.ctx_id = KFIELD(__u64, KFIELD(void *, task, task_mm), mm_ctx_id),
		.region = q >> VMA_REGION_SHIFT,
	};
	struct vma_info vma, *cached;
	struct object_rows *obj;
	__u32 zero = 0, *now;
	long err;

	cached = bpf_map_lookup_elem(&vmas, &key);
	if (cached && q >= cached->start && q < cached->end) {
		vma = *cached;
	} else {
		__builtin_memset(&vma, 0, sizeof(vma));
		err = bpf_find_vma(task, q, vma_found, &vma, 0);
		if (err)
			return stop(w, err == -16 /* EBUSY */ ? VMA_BUSY : NO_MAPPING), NOT_MAPPED;
		cache_vma(&key, &vma);
	}
	if (!vma.file.inode) {
		/* code without a file (a JIT's): followed on its frame pointer;
		 * nothing cached, each such frame comes here again */
		w->mstart = w->mend = 0;
		return NO_FILE_CODE;
	}
	obj = bpf_map_lookup_elem(&objects, &vma.file);
	if (!obj) {
		want(&vma.file);
		return stop(w, NO_TABLE), NOT_MAPPED;
	}
	/* stamped as a walk meets it, written only when the epoch changed:
	 * an entry whose rows did not fit too, so user space knows which
	 * full objects are sampled */
	now = bpf_map_lookup_elem(&epoch, &zero);
	if (now && obj->touched != *now)
		obj->touched = *now;
	w->page_slot = obj->page_slot;
	w->first_page = obj->first_page;
	w->pages = obj->pages;
	w->first = obj->first;
	w->rows = obj->rows;
	w->adjust = obj->adjust + (vma.pgoff << 12) - vma.start;
	if (obj->python) {	/* python.h merges its Python frames */
		w->python = obj->python;
		w->python_adjust = w->adjust;
	}
	if (obj->v8)		/* v8.h names its JS frames */
		w->v8 = obj->v8;
	if (obj->php) {		/* php.h merges its PHP frames */
		w->php = obj->php;
		w->php_adjust = w->adjust;
	}
	if (obj->perl) {	/* perl.h merges its Perl frames */
		w->perl = obj->perl;
		w->perl_adjust = w->adjust;
	}
	if (obj->ruby) {	/* ruby.h merges its Ruby frames */
		w->ruby = obj->ruby;
		w->ruby_adjust = w->adjust;
	}
	if (obj->jvm)
		w->jvm = 1;
	w->mstart = vma.start;
	w->mend = vma.end;
	if (!w->rows) {
		w->mend = 0;	/* not cached: each frame says why */
		/* a V8 object whose rows did not fit is walked on its frame
		 * pointer, which its code keeps (JIT, builtins, node's C++):
		 * its JS frames are named here (v8.h); a copy handed to user
		 * space is named only while its process lives, and at a
		 * sample a millisecond the reader fell behind node's exit */
		if (w->first == TABLE_FULL_MARK && !obj->v8)
			return stop(w, TABLE_FULL), NOT_MAPPED;
		return NO_CFI_CODE;
	}
	return MAPPED;
}

/* w->lo, w->hi: the rows to search for ELF address vaddr (indices into
 * ROWS), narrowed to those of its page by the page index, if the object
 * has one. A function of its own, so the search after it starts from one
 * state whichever way the bounds were found. */
static __noinline void search_bounds(struct walk *w, __u64 vaddr)
{
	__u64 page = (vaddr >> PAGE_SHIFT) - w->first_page;
	/* keys in 8-byte slots: a whole write tells the verifier the slot's
	 * old value is dead */
	__u64 key;
	__u32 *at, lo;

	w->lo = w->first;
	w->hi = w->first + w->rows;
	if (!w->pages || page >= w->pages - 1)
		return;
	key = (__u32)(w->page_slot + page);
	at = bpf_map_lookup_elem(&pages, &key);
	if (!at)
		return;
	lo = *at;
	key = (__u32)(key + 1);
	at = bpf_map_lookup_elem(&pages, &key);
	if (at) {
		w->lo = w->first + lo;
		w->hi = w->first + *at + 1;
	}
}

/* row i of ROWS, or NULL. `chunk`, `rows`: the chunk looked up last and
 * its map (NULL: none yet), looked up again only when i is in another:
 * the rows of a page of an object are in one chunk but where the object
 * crosses into the next there */
static __always_inline struct unwind_row *row_at(__u32 i, __u32 *chunk, void **rows)
{
	__u32 key = i & ((1U << row_chunk_shift) - 1);

	if (!*rows || i >> row_chunk_shift != *chunk) {
		*chunk = i >> row_chunk_shift;
		*rows = bpf_map_lookup_elem(&row_chunks, chunk);
		if (!*rows)
			return 0;
	}
	return bpf_map_lookup_elem(*rows, &key);
}

/* the row that covers ELF address vaddr in w's object, or NULL: a binary
 * search for the last row at or below it */
static __noinline struct unwind_row *find_row(struct walk *w, __u64 vaddr)
{
	struct unwind_row *row;
	__u32 lo, hi, mid, chunk = 0;
	void *rows = 0;

	search_bounds(w, vaddr);
	/* lo and hi kept in the scratch value: the verifier knows nothing of
	 * what it reads there, so it checks each step once, not once per
	 * range of them it could track through registers */
	for (int i = 0; i < SEARCH_STEPS; i++) {
		lo = READ_ONCE(w->lo);
		hi = READ_ONCE(w->hi);
		if (lo >= hi)
			break;
		mid = (lo + hi) >> 1;
		row = row_at(mid, &chunk, &rows);
		if (!row)
			break;
		if (row->pc > vaddr)
			WRITE_ONCE(w->hi, mid);
		else
			WRITE_ONCE(w->lo, mid + 1);
	}
	lo = READ_ONCE(w->lo);
	if (lo == w->first)
		return 0;
	return row_at(lo - 1, &chunk, &rows);
}

/* one frame: bpf_loop's callback; 0 goes on, 1 stops */
static long step(__u64 index, void *unused)
{
	struct walk *w = scratch_value();
	struct unwind_row *row;
	__u64 q, cfa, ra, cfa_or_bp;
	__u8 switched = 0;	/* this frame ran on another stack: its CFA may be lower */
	__u64 uc[(UC_RIP - UC_RBP) / 8 + 1];
	enum unwind_status status;
	__s64 off;
	__u32 n;

/* one way out for each outcome: the verifier checks it once */
#define STOP(why) do { status = (why); goto stopped; } while (0)

	if (!w)
		return 1;
	/* q: the pc itself, or the call instruction before a return address */
	q = w->pc - (w->exact ^ 1);
	if (q < w->mstart || q >= w->mend) {
		enum mapped got = find_mapping(w, q);

		if (got == NOT_MAPPED)
			return 1;
		if (got == NO_FILE_CODE || got == NO_CFI_CODE) {
			w->fp_used |= got == NO_FILE_CODE ? FP_FOR_NO_FILE : FP_FOR_NO_CFI;
			goto frame_pointer;
		}
	}
	row = find_row(w, q + w->adjust);
	if (!row)
		goto gap;
	off = row->cfa;
	switch (row->kind) {
	case ROW_SP:
		cfa = w->sp + off;
		break;
	case ROW_BP:
		if (!w->bp_ok)
			STOP(NO_BP);
		cfa = w->bp + off;
		switched = row->aux == ROW_STACK_SWITCH;
		break;
	case ROW_PLT:
		if ((w->pc & 15) >= (__u8)row->aux)
			off += 8;
		cfa = w->sp + off;
		break;
	case ROW_BX:
		if (!w->bx_ok)
			STOP(NO_BX);
		cfa = w->bx + off;
		break;
	case ROW_SP_DEREF:
	case ROW_BP_DEREF:
		if (row->kind == ROW_BP_DEREF && !w->bp_ok)
			STOP(NO_BP);
		if (read_user(w, (row->kind == ROW_SP_DEREF ? w->sp : w->bp) + off, &w->word))
			STOP(READ_FAILED);
		cfa = w->word + row->aux;
		break;
	case ROW_END:
		goto end;
	case ROW_SIGNAL:	/* the interrupted registers from the ucontext */
		if (bpf_probe_read_user(uc, sizeof(uc), (void *)(w->sp + UC_RBP)))
			STOP(READ_FAILED);
		w->bp = uc[0];
		w->bx = uc[(UC_RBX - UC_RBP) / 8];
		w->bx_ok = 1;
		w->pc = uc[(UC_RIP - UC_RBP) / 8];
		w->sp = uc[(UC_RSP - UC_RBP) / 8];
		w->exact = 1;
		w->bp_ok = 1;
		goto append;
	case ROW_UNSUPPORTED:	/* rbp need not be a frame pointer here */
		STOP(UNSUPPORTED);
	default:
		goto gap;
	}
	if (read_user(w, cfa - 8, &w->word))
		STOP(READ_FAILED);
	off = row->bp;
	cfa_or_bp = cfa;
	switch (row->bp_rule) {
	case BP_SAME:
		break;
	case BP_AT_BP:
		if (!w->bp_ok)
			break;
		cfa_or_bp = w->bp;
		/* fall through */
	case BP_AT:
		w->bp_ok = !read_user(w, cfa_or_bp + off, &w->bp);
		break;
	default:
		w->bp_ok = 0;
	}
	if (row->bx_rule == BX_AT)
		w->bx_ok = !read_user(w, cfa + row->bx, &w->bx);
	else if (row->bx_rule != BX_SAME)
		w->bx_ok = 0;
	if (0) {
frame_pointer:
		/* the frame-pointer rule (the ABI's): CFA = rbp + 16, the return
		 * address at rbp + 8, the caller's rbp at rbp; only reached going
		 * forward, so the verifier sees no loop through the rows' switch */
		if (!w->bp_ok)
			STOP(NO_BP);
		w->frame_fp[(w->rec.head.frames - 1) & (MAX_FRAMES - 1)] = w->bp;
		cfa = w->bp + 16;
		if (read_user(w, cfa - 8, &w->word))
			STOP(READ_FAILED);
		w->bp_ok = !read_user(w, cfa - 16, &w->bp);
		w->bx_ok = 0;	/* no CFI says where rbx went */
	}
	/* the caller: the stack ends at a null return address; a CFA that
	 * does not move up would loop */
	ra = w->word;
	if (ra < 0x1000)
		goto end;
	if (cfa <= w->sp && !switched)
		STOP(NO_PROGRESS);
	w->sp = cfa;
	w->pc = ra;
	w->exact = 0;
append:
	n = w->rec.head.frames;
	w->rec.head.frames = n + 1;
	w->frame[n & (MAX_FRAMES - 1)] = w->pc;
	w->frame_fp[n & (MAX_FRAMES - 1)] = 0;
	w->hash = mix(w->hash, w->pc);
	return 0;
gap:
	/* no CFI, and bp 0: the outermost frame (the ABI's mark, set by
	 * _start), where the stack ends complete, as the copy path ends it;
	 * bp set: code without CFI that keeps frame pointers, walked on them */
	if (!w->bp_ok)
		STOP(GAP);
	if (w->bp) {
		w->fp_used |= FP_FOR_NO_CFI;
		goto frame_pointer;
	}
end:
	status = w->fp_used & FP_FOR_NO_FILE ? THROUGH_JIT
		: w->fp_used & FP_FOR_NO_CFI ? THROUGH_NO_CFI : COMPLETE;
stopped:
	w->rec.head.status = status;
	return 1;
#undef STOP
}

/* the current process into JVM_PROCESSES (its walk met libjvm): its
 * walks that meet only JIT code are deferred too */
static __always_inline void note_jvm_process(void)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u8 one = 1;

	if (!bpf_map_lookup_elem(&jvm_processes, &tgid))
		bpf_map_update_elem(&jvm_processes, &tgid, &one, BPF_ANY);
}

/* the current task's user stack into the scratch value, returned (NULL:
 * none, nothing walked); `*kernel_stack`: the kernel stack's id when
 * `stacks` is given, else NO_STACK */
static __always_inline struct walk *walk(void *ctx, enum regs_source source,
					 void *kernel_stacks, __s32 *kernel_stack)
{
	struct walk *w = scratch_value();
	void *task;

	if (!w)
		return 0;
	user_registers(ctx, source, w);
	w->sp0 = w->sp;
	w->exact = 1;
	w->bp_ok = 1;
	w->bx_ok = 1;
	w->mend = w->mstart = w->win = w->fp_used = w->python = w->v8 = w->php = w->perl = 0;
	w->ruby = w->jvm = 0;
	w->frame[0] = w->pc;
	w->frame_fp[0] = 0;
	w->rec.head.frames = 1;
	w->rec.head.status = RUNNING;
	w->hash = mix(FNV_BASIS, w->pc);
	*kernel_stack = NO_STACK;
	if (kernel_stacks) {
		long id = bpf_get_stackid(ctx, kernel_stacks, 0);

		*kernel_stack = id < 0 ? NO_STACK : id;
	}
	task = bpf_get_current_task_btf();
	if (!KFIELD(void *, task, task_mm)) {	/* a kernel thread: an empty user stack */
		w->rec.head.frames = 0;
		w->rec.head.status = COMPLETE;
		w->hash = FNV_BASIS;
		return w;
	}
	bpf_loop(MAX_FRAMES - 1, step, 0, 0);
	if (w->rec.head.status == RUNNING)
		w->rec.head.status = TRUNCATED;
	if (w->jvm)
		note_jvm_process();
	return w;
}

/* whether the walk went on frame pointers through the JIT code of a JVM:
 * HotSpot's compiled code keeps none, so the programs defer it (its Java
 * frames are walked in user space from the copy). Another process's JIT
 * code (LuaJIT, a V8 not known by its object) stays walked on its frame
 * pointer, as its status says: one map lookup for a walk through JIT
 * code, nothing for the others */
static __always_inline int through_jvm_jit(struct walk *w)
{
	__u32 tgid;

	if (!(w->fp_used & FP_FOR_NO_FILE) || w->v8)
		return 0;
	if (w->jvm)
		return 1;
	tgid = bpf_get_current_pid_tgid() >> 32;
	return bpf_map_lookup_elem(&jvm_processes, &tgid) != 0;
}

static __always_inline void count_unwind_error(enum unwind_error slot)
{
	add_one(bpf_map_lookup_elem(&unwind_errors, &slot));
}

/* *hash = the walked stack's final hash (its status mixed in: a cut
 * stack is another stack), its frames in STACKS unless there; 0 when
 * STACKS is full (counted) */
static __always_inline int store_stack(struct walk *w, __u64 *hash)
{
	long err;

	*hash = mix(w->hash, w->rec.head.status);
	if (!bpf_map_lookup_elem(&unwound, hash)) {
		err = bpf_map_update_elem(&unwound, hash, &w->rec.head, BPF_NOEXIST);
		if (!err)
			count_unwind_error(UW_STACKS_ADDED);
		else if (err != -EEXIST) {
			count_unwind_error(UW_STACKS_FULL);
			return 0;
		}
	}
	return 1;
}

/* a few words past the process's first sp (argc, the first of argv):
 * an unwinder's reads at the outermost frame */
#define ABOVE_START_STACK 128

/* the bytes of stack from sp that may hold frames, at most `room`, or
 * for the main thread at most `main_room` (its copy ends where its stack
 * does, so a deep one costs only the bytes it has): no
 * frame lies above the main thread's first sp (mm->start_stack, argc's
 * address at exec); above it come argv, the environment, up to 8 KiB of
 * random gap and the strings. The kernel's words are read into *at (a
 * field of d written later): on the program's stack, or known to the
 * verifier as values, they made it walk the count program 8x longer */
static __always_inline __u64 stack_copy_bound(__u64 sp, __u64 room, __u64 main_room, __u64 *at)
{
	__u64 start;

	if (!mm_start_stack)
		return room;
	*at = 0;
	bpf_probe_read_kernel(at, sizeof(*at), (void *)bpf_get_current_task_btf() + task_mm);
	start = READ_ONCE(*at);
	if (!start || bpf_probe_read_kernel(at, sizeof(*at), (void *)start + mm_start_stack))
		return room;
	start = READ_ONCE(*at) + ABOVE_START_STACK;
	if (start > sp && start - sp < main_room)
		return (start - sp) & ~7ULL;
	return room;
}

/* d = the deferred record of this event: its registers (the walk moved
 * them: the event's own) and up to `room` bytes from sp at once, the
 * main thread's up to `main_room` (>= room; d has room for it and
 * SWITCH_STACK more; both bounded constants to the verifier);
 * where that fails the stack ends within them (a thread's: the main
 * thread's copy ends below mapped argument strings), and as it ends at a page
 * boundary (its mapping's end), sp's page and the ones after it are copied
 * one at a time. w->rec holds the record's head. Returns the bytes of d
 * used: its head and the copies, which follow one another */
static __always_inline __u32 fill_deferred(void *ctx, enum regs_source source, struct walk *w,
					   struct deferred_record *d, __s32 kernel_stack,
					   __u64 weight, __u32 room, __u32 main_room)
{
	__u64 first, copied, other, want;

	user_registers(ctx, source, w);
	d->rec.time = w->rec.time;
	d->rec.pid_tgid = w->rec.pid_tgid;
	d->rec.probe = w->rec.probe;
	d->rec.cpu = w->rec.cpu;
	d->rec.head.frames = 0;
	d->rec.head.status = DEFERRED;
	d->ip = w->pc;
	d->sp = w->sp;
	d->bp = w->bp;
	d->bx = w->bx;
	d->kernel_stack = kernel_stack;
	d->weight = weight;
	d->other_copied = 0;
	if (main_room < room)
		main_room = room;
	d->copied = stack_copy_bound(w->sp, room, main_room, &d->other);
	want = READ_ONCE(d->copied);	/* any number to the verifier: one state */
	if (want > main_room)
		want = main_room;
	d->other = 0;
	if (!bpf_probe_read_user(d->stack, want, (void *)w->sp)) {
		copied = want;
	} else {
		/* pages while they read, within `room` (a constant to the
		 * verifier), then no more than `want` kept */
		first = 4096 - (w->sp & 4095);		/* sp's page: 1..4096 bytes */
		if (bpf_probe_read_user(d->stack, first, (void *)w->sp)) {
			d->copied = 0;
			return offsetof(struct deferred_record, stack);
		}
		copied = first;
		for (int i = 0; i < MAX_DEFER_STACK / 4096; i++) {
			if (copied > room - 4096)
				break;
			if (bpf_probe_read_user(d->stack + copied, 4096, (void *)(w->sp + copied)))
				break;
			copied += 4096;
		}
		if (copied > want)
			copied = want;
	}
	if (copied > main_room)
		copied = main_room;
	d->copied = copied;
	/* the frame-pointer chain leaving the copy within a few links: a
	 * frame on another stack (Go's time.now runs the vDSO on the g0
	 * stack; the vDSO's own frame links to it), whose callers only a copy
	 * from there holds; that page alone where the stack ends sooner */
	other = w->bp;
	for (int i = 0; i < 3 && other - w->sp < copied; i++)
		if (bpf_probe_read_user(&other, sizeof(other), (void *)other))
			return offsetof(struct deferred_record, stack) + copied;
	if (other - w->sp < copied || other < 4096)
		return offsetof(struct deferred_record, stack) + copied;
	d->other = other;
	if (!bpf_probe_read_user(d->stack + copied, SWITCH_STACK, (void *)other)) {
		d->other_copied = SWITCH_STACK;
		return offsetof(struct deferred_record, stack) + copied + SWITCH_STACK;
	}
	first = 4096 - (other & 4095);
	if (first > SWITCH_STACK)
		first = SWITCH_STACK;
	if (bpf_probe_read_user(d->stack + copied, first, (void *)other))
		return offsetof(struct deferred_record, stack) + copied;
	d->other_copied = first;
	return offsetof(struct deferred_record, stack) + copied + first;
}

#endif
