/* Python frames inside a native stack, walked in the kernel after the
 * native walk (unwind.h) of a stack that went through an interpreter
 * object (the python executable or libpython): the object's rows
 * (object_rows.python) point at its facts in PYTHON_OBJECTS, at their ELF
 * addresses; the walk's adjust for that object makes them the process's.
 * So any process that runs the object, a thread, a fork, a Python started
 * during the run, gets Python frames from its first sample, with no step
 * per process in user space; capture/bpf_python.py fills PYTHON_OBJECTS
 * as the objects' rows load and tells the story. A pass of its own
 * (python_merge), so the native walk's steps stay as they are: a stack
 * through no interpreter costs one test.
 *
 * - the thread's PyThreadState: its thread_id is pthread_self(), the
 *   task's fsbase on x86-64 glibc; found by walking the interpreter's
 *   thread list (bounded) and kept in PYTHON_THREADS per (mm ctx_id,
 *   fsbase) with the list's head then, checked again at each use: a new
 *   thread's state goes first in the list, so a thread that reuses an
 *   ended one's stack (and fsbase) is looked up again, not given the
 *   freed state;
 * - its current frame, then the chain of `previous` frames, read per
 *   sample;
 * - the merge: each native frame whose pc lies in the eval function is
 *   replaced by the Python frames its eval call ran, innermost first (one
 *   frame up to 3.10; up to an is_entry frame on 3.11; up to the C stack's
 *   shim frame on 3.12+, which is skipped). Each Python frame is one tagged
 *   word (model.python_frame_word); the stack's hash covers them. A chain
 *   that cannot be read, or Python frames left when the native stack
 *   ends, give the stack a status that says so, never a guessed frame;
 * - each (tgid, code object) is reported once (PYTHON_CODES, an LRU set)
 *   by a ring record of its own, so user space reads the code while the
 *   process lives. */
#ifndef PYTHON_H
#define PYTHON_H

#include "unwind.h"

#define PY_NONE 0xFFFFFFFF		/* a layout field the version does not have */
#define PY_FRAME_READ 128		/* bytes of a frame read at once, at most */
#define PY_MAX_THREADS 512		/* PyThreadStates looked at to find a thread's */
#define PY_NEW_CODES 32			/* code objects reported per sample, at most: a power of two */
#define PY_OWNED_BY_CSTACK 3		/* 3.12+: the eval call's shim frame */
#define PYTHON_TAG 0xE000000000000000ULL	/* model.PYTHON_FRAME_TAG */
#define PY_INDEX_MAX 0xFFFF
#define PY_RECENT 8			/* frames a new one is checked against: a power of two */
/* a status of unwind_status (ustack.h): complete, but the Python frame
 * chain loops back on itself (damaged memory), so it was left there */
#define PYTHON_LOOP 19

/* how a frame says where it is (python_layout.instr_kind) */
enum python_instr { LASTI_BYTES = 1, LASTI_UNITS = 2, INSTR_POINTER = 3 };
/* how the frames of one eval call end (python_layout.entry_kind) */
enum python_entry { ONE_PER_EVAL = 1, IS_ENTRY = 2, OWNER_CSTACK = 3 };

/* a version's state layout (unwind/python_runtime.py's names), byte offsets */
struct python_layout {
	__u32 runtime_interp_head;
	__u32 interp_tstate_head;
	__u32 tstate_next;
	__u32 tstate_thread_id;
	__u32 tstate_frame;
	__u32 cframe_current_frame;
	__u32 frame_previous;
	__u32 frame_code;
	__u32 frame_instr;
	__u32 instr_kind;		/* enum python_instr */
	__u32 code_bytecode;
	__u32 entry_kind;		/* enum python_entry */
	__u32 frame_entry;
};

/* PYTHON_OBJECTS' value: an interpreter object's facts, at its ELF
 * addresses (version 0: an empty slot) */
struct python_object {
	struct python_layout layout;
	__u32 version;			/* major << 8 | minor */
	__u64 runtime;			/* the address of _PyRuntime */
	__u64 eval_start[2];		/* _PyEval_EvalFrameDefault and its .cold part */
	__u64 eval_end[2];
	/* in PyCodeObject: co_filename, and co_qualname (co_name before 3.11),
	 * after it: what tells a code object from one freed at its address */
	__u32 code_filename, code_name;
};

/* PYTHON_THREADS' key: a thread by its process's mm (ctx_id: never
 * reused, unlike a tgid or an mm's address) and its fsbase */
struct python_thread_key {
	__u64 ctx_id;
	__u64 fsbase;
};

/* PYTHON_THREADS' value: the thread's PyThreadState, found when the
 * interpreter's thread list began at `head` */
struct python_thread {
	__u64 tstate;
	__u64 head;
};

/* PYTHON_CODES' key: a code object reported already */
struct python_code_key {
	__u32 tgid;
	__u32 pad;
	__u64 code;
};

/* the ring's record of code objects seen first: rec.head.status
 * PYTHON_CODE, rec.head.frames of them in code[] */
struct python_code_record {
	struct trace_record rec;
	__u64 code[PY_NEW_CODES];
};

/* the Python pass's per-CPU state */
struct python_walk {
	struct python_object proc;	/* at the process's addresses */
	__u64 native[MAX_FRAMES];	/* the native walk's frames */
	__u64 nnative, next;		/* their count; the next one to merge */
	__u64 pyframe;			/* the next Python frame, 0 when none is left */
	__u64 in_group;			/* Python frames of an eval call being written */
	__u64 out, hash;		/* the merged frames written; their hash */
	__u64 tstate, fsbase, tgid, ctx_id;
	__u64 unreadable;		/* a Python frame could not be read */
	__u64 missing;			/* eval C frames met with no Python frame left */
	__u64 skip;			/* innermost eval C frames to leave as C */
	__u64 python_frames;		/* Python frames in the merged stack */
	__u64 recent[PY_RECENT];	/* the frames read last, by steps */
	__u64 steps, mark;		/* frames read; one kept at each power of two */
	__u64 looped;			/* the chain came back to a frame read before */
	__u64 new_codes;
	__u64 new_code[PY_NEW_CODES];
	__u8 frame[PY_FRAME_READ + 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct python_object);
	__uint(max_entries, 1);		/* sized by the loader */
} python_objects SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct python_thread_key);
	__type(value, struct python_thread);
	__uint(max_entries, 1);		/* sized by the loader */
} python_threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct python_code_key);
	__type(value, __u64);		/* the code object's identity (code_identity) */
	__uint(max_entries, 1);		/* sized by the loader */
} python_codes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct python_walk);
	__uint(max_entries, 1);
} python_scratch SEC(".maps");

/* the task's fsbase (task_struct.thread.fsbase), from the kernel's BTF */
const volatile __u32 task_fsbase;

static __always_inline struct python_walk *python_state(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&python_scratch, &zero);
}

/* the user word at addr, 0 when unreadable */
static __always_inline __u64 user_word(__u64 addr)
{
	__u64 v;

	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr))
		return 0;
	return v;
}

/* bpf_loop's callback: one PyThreadState of the list; 1 stops */
static long thread_step(__u64 index, void *unused)
{
	struct python_walk *p = python_state();
	__u64 t;

	if (!p || !p->tstate)
		return 1;
	t = p->tstate;
	if (user_word(t + p->proc.layout.tstate_thread_id) == p->fsbase)
		return 1;
	p->tstate = user_word(t + p->proc.layout.tstate_next);
	return 0;
}

/* p->tstate: the current thread's PyThreadState, 0 when it has none */
static __noinline void find_thread(struct python_walk *p)
{
	struct python_thread_key key = { .ctx_id = p->ctx_id, .fsbase = p->fsbase };
	struct python_layout *l = &p->proc.layout;
	struct python_thread found, *cached;
	__u64 interp, head;

	interp = user_word(p->proc.runtime + l->runtime_interp_head);
	head = interp ? user_word(interp + l->interp_tstate_head) : 0;
	cached = bpf_map_lookup_elem(&python_threads, &key);
	if (cached && cached->tstate && cached->head == head
	    && user_word(cached->tstate + l->tstate_thread_id) == p->fsbase) {
		p->tstate = cached->tstate;
		return;
	}
	p->tstate = head;
	bpf_loop(PY_MAX_THREADS, thread_step, 0, 0);
	if (p->tstate && user_word(p->tstate + l->tstate_thread_id) != p->fsbase)
		p->tstate = 0;		/* the list was longer than we looked */
	found.tstate = p->tstate;
	found.head = head;
	bpf_map_update_elem(&python_threads, &key, &found, BPF_ANY);
}

/* p->pyframe: the thread's current frame, 0 for none */
static __always_inline void current_frame(struct python_walk *p)
{
	struct python_layout *l = &p->proc.layout;
	__u64 f = user_word(p->tstate + l->tstate_frame);

	if (f && l->cframe_current_frame != PY_NONE)
		f = user_word(f + l->cframe_current_frame);
	p->pyframe = f;
}

static __always_inline int in_eval(struct python_object *py, __u64 q)
{
	return (q >= py->eval_start[0] && q < py->eval_end[0])
		|| (q >= py->eval_start[1] && q < py->eval_end[1]);
}

/* a field of the frame read into p->frame, at a layout's offset */
#define FRAME_FIELD(type, p, off) (*(type *)((p)->frame + ((off) & (PY_FRAME_READ - 1))))

static __always_inline void emit(struct walk *w, struct python_walk *p, __u64 word)
{
	w->frame[p->out & (MAX_FRAMES - 1)] = word;
	p->out++;
	p->hash = mix(p->hash, word);
}

/* whether code was reported before; if not, it is marked and listed for
 * the ring (at most PY_NEW_CODES a sample; the rest come again) */
/* what tells the code object at `code` from another at that address
 * (one freed, a new one made there: a module body run at start-up, then
 * a function): its file and name objects' addresses, mixed */
static __always_inline __u64 code_identity(struct python_walk *p, __u64 code)
{
	__u64 names[4] = {};
	__u32 span = p->proc.code_name + 8 - p->proc.code_filename;

	if (span > sizeof(names))
		span = sizeof(names);
	if (bpf_probe_read_user(names, span, (void *)(code + p->proc.code_filename)))
		return 0;
	return mix(mix(FNV_BASIS, names[0]),
		   names[((p->proc.code_name - p->proc.code_filename) / 8) & 3]);
}

static __always_inline void note_code(struct python_walk *p, __u64 code)
{
	struct python_code_key key = { .tgid = p->tgid, .code = code };
	__u64 n = p->new_codes, id, *seen;

	if (n >= PY_NEW_CODES)
		return;
	id = code_identity(p, code);
	seen = bpf_map_lookup_elem(&python_codes, &key);
	if (seen && *seen == id)
		return;
	bpf_map_update_elem(&python_codes, &key, &id, BPF_ANY);
	p->new_code[n & (PY_NEW_CODES - 1)] = code;
	p->new_codes = n + 1;
}

/* Whether frame f was read before in this pass: a damaged chain that
 * loops (a frame's `previous` pointing at itself or at a frame further
 * in) would fill the stack with its frames and push the outer native
 * ones out. A cycle of up to PY_RECENT frames is caught before one
 * repeats; a longer one at the frame kept at the last power of two
 * (Brent's method), within about twice its length. */
static __always_inline int seen_before(struct python_walk *p, __u64 f)
{
	int i;

	if (f == p->mark)
		return 1;
#pragma unroll
	for (i = 0; i < PY_RECENT; i++)
		if (p->recent[i] == f)
			return 1;
	p->recent[p->steps & (PY_RECENT - 1)] = f;
	p->steps++;
	if (!(p->steps & (p->steps - 1)))
		p->mark = f;
	return 0;
}

/* one Python frame at p->pyframe into the merged stack; whether its eval
 * call's group ends with it. p->pyframe moves to the next; 0 and
 * p->unreadable when it could not be read */
static __always_inline int python_frame(struct walk *w, struct python_walk *p)
{
	struct python_layout *l = &p->proc.layout;
	__u64 f = p->pyframe, code, index;
	__u32 span = l->frame_entry + 1;
	__s64 at;
	int last;

	if (l->frame_previous + 8 > span)
		span = l->frame_previous + 8;
	if (l->frame_code + 8 > span)
		span = l->frame_code + 8;
	if (l->frame_instr + 8 > span)
		span = l->frame_instr + 8;
	if (span > PY_FRAME_READ)
		span = PY_FRAME_READ;
	if (seen_before(p, f)) {
		p->looped = 1;
		p->pyframe = 0;
		return 1;
	}
	if (bpf_probe_read_user(p->frame, span, (void *)f)) {
		p->unreadable = 1;
		p->pyframe = 0;
		return 1;
	}
	p->pyframe = FRAME_FIELD(__u64, p, l->frame_previous);
	if (l->entry_kind == OWNER_CSTACK
	    && FRAME_FIELD(__u8, p, l->frame_entry) == PY_OWNED_BY_CSTACK)
		return 1;		/* the shim that ends the group: not shown */
	code = FRAME_FIELD(__u64, p, l->frame_code);
	switch (l->instr_kind) {
	case LASTI_BYTES:
		at = FRAME_FIELD(__s32, p, l->frame_instr) >> 1;	/* negative: not started */
		break;
	case LASTI_UNITS:
		at = FRAME_FIELD(__s32, p, l->frame_instr);
		break;
	default:		/* INSTR_POINTER */
		at = (__s64)(FRAME_FIELD(__u64, p, l->frame_instr) - code - l->code_bytecode) >> 1;
	}
	index = at < 0 ? 0 : at > PY_INDEX_MAX ? PY_INDEX_MAX : at;
	emit(w, p, PYTHON_TAG | (code >> 3) << 16 | index);
	p->python_frames++;
	last = l->entry_kind == ONE_PER_EVAL
		|| (l->entry_kind == IS_ENTRY && FRAME_FIELD(__u8, p, l->frame_entry));
	/* 3.12+: the group ends at the shim, read as the next step's frame */
	return last;
}

/* bpf_loop's callback: one word of the merged stack (or the start of an
 * eval call's Python frames); 1 stops */
static long merge_step(__u64 index, void *unused)
{
	struct python_walk *p = python_state();
	struct walk *w = scratch_value();
	__u64 pc, i;

	if (!p || !w || p->out >= MAX_FRAMES)
		return 1;
	if (p->in_group) {
		if (!p->pyframe || python_frame(w, p))
			p->in_group = 0;
		return 0;
	}
	i = p->next;
	if (i >= p->nnative)
		return 1;
	p->next = i + 1;
	pc = p->native[i & (MAX_FRAMES - 1)];
	if (in_eval(&p->proc, i ? pc - 1 : pc)) {
		if (p->skip) {
			p->skip--;	/* shown as C: see python_merge */
		} else if (p->pyframe) {
			p->in_group = 1;	/* replaced by its Python frames */
			return 0;
		} else {
			p->missing++;
		}
	}
	emit(w, p, pc);
	return 0;
}

/* the merged stack into w's frames, the `skip` innermost eval C frames
 * left as C */
static __always_inline void merge_pass(struct python_walk *p, __u64 skip)
{
	current_frame(p);
	p->next = p->out = p->in_group = p->missing = p->python_frames = 0;
	p->skip = skip;
	p->hash = FNV_BASIS;
	p->steps = p->mark = p->looped = 0;
	__builtin_memset(p->recent, 0, sizeof(p->recent));
	bpf_loop(2 * MAX_FRAMES, merge_step, 0, 0);
}

/* Python frames into the walked stack w of the current task, when the
 * walk went through an interpreter object of PYTHON_OBJECTS; the stack's
 * frames, hash and (for a note) status change. */
static __noinline void python_merge(struct walk *w)
{
	struct python_walk *p = python_state();
	void *task = bpf_get_current_task_btf();
	struct python_object *py;
	__u32 slot;
	__s64 adjust;
	__u64 n;

	if (!p || !w)
		return;
	p->new_codes = p->python_frames = 0;
	if (!w->python)
		return;
	slot = w->python - 1;
	py = bpf_map_lookup_elem(&python_objects, &slot);
	if (!py || !py->version)
		return;
	/* the object's ELF addresses as this process maps them */
	adjust = w->python_adjust;
	p->proc = *py;
	p->proc.runtime -= adjust;
	p->proc.eval_start[0] -= adjust;
	p->proc.eval_end[0] -= adjust;
	if (p->proc.eval_end[1]) {
		p->proc.eval_start[1] -= adjust;
		p->proc.eval_end[1] -= adjust;
	}
	p->tgid = bpf_get_current_pid_tgid() >> 32;
	p->ctx_id = FIELD(__u64, FIELD(void *, task, task_mm), mm_ctx_id);
	p->fsbase = FIELD(__u64, task, task_fsbase);
	find_thread(p);
	if (!p->tstate)
		return;
	current_frame(p);
	if (!p->pyframe)
		return;
	/* An eval call starting (its frame not yet current) or ending (its
	 * frame gone already) is the innermost one: a first pass that finds
	 * eval C frames left without Python frames at the outer end leaves
	 * that many innermost ones as C in a second, so the rest pair with
	 * the right frames */
	n = w->rec.head.frames;
	if (n > MAX_FRAMES)
		n = MAX_FRAMES;
	if (n == 0 || bpf_probe_read_kernel(p->native, n * 8, w->frame))
		return;
	p->nnative = n;
	p->unreadable = 0;
	merge_pass(p, 0);
	if (p->missing && !p->unreadable && !p->looped)
		merge_pass(p, p->missing);
	w->rec.head.frames = p->out;
	w->hash = p->hash;
	if (w->rec.head.status != COMPLETE && w->rec.head.status != THROUGH_JIT
	    && w->rec.head.status != THROUGH_NO_CFI)
		return;			/* cut short: its own reason says more */
	if (p->looped)
		w->rec.head.status = PYTHON_LOOP;
	else if (p->unreadable || p->missing)
		w->rec.head.status = PYTHON_UNREADABLE;
	else if (p->pyframe && p->next >= p->nnative)
		w->rec.head.status = PYTHON_LEFT;
}

/* bpf_loop's callback: the code object of merged frame `index`, if a
 * Python frame's, is noted */
static long note_step(__u64 index, void *unused)
{
	struct python_walk *p = python_state();
	struct walk *w = scratch_value();
	__u64 word;

	if (!p || !w || index >= p->out)
		return 1;
	word = w->frame[index & (MAX_FRAMES - 1)];
	if (word >> 60 == PYTHON_TAG >> 60)
		note_code(p, ((word >> 16) & ((1ULL << 44) - 1)) << 3);
	return 0;
}

/* The code objects of w's Python frames, those not reported yet listed
 * for python_report. Only for a stack not stored before (`unwound`): a
 * stack seen again had its code objects noted then, which saves a
 * lookup per frame of the samples that repeat a stack */
static __always_inline void python_note_codes(struct walk *w)
{
	struct python_walk *p = python_state();
	__u64 hash;

	if (!p || !p->python_frames)
		return;
	hash = mix(w->hash, w->rec.head.status);	/* store_stack's key */
	if (bpf_map_lookup_elem(&unwound, &hash))
		return;
	bpf_loop(MAX_FRAMES, note_step, 0, 0);
}

/* bpf_loop's callback: a code object listed for a record the ring had
 * no room for is forgotten, so it is reported again */
static long forget_code(__u64 index, void *unused)
{
	struct python_walk *p = python_state();
	struct python_code_key key = {};

	if (!p || index >= p->new_codes)
		return 1;
	key.tgid = p->tgid;
	key.code = p->new_code[index & (PY_NEW_CODES - 1)];
	bpf_map_delete_elem(&python_codes, &key);
	return 0;
}

/* the code objects python_merge saw first, in one record into `ring` */
static __always_inline void python_report(void *ring, __u64 pid_tgid, __u32 probe)
{
	struct python_walk *p = python_state();
	struct python_code_record *r;

	if (!p || !p->new_codes)
		return;
	r = bpf_ringbuf_reserve(ring, sizeof(*r), 0);
	if (!r) {
		bpf_loop(PY_NEW_CODES, forget_code, 0, 0);
		p->new_codes = 0;
		return;
	}
	r->rec.time = bpf_ktime_get_ns();
	r->rec.pid_tgid = pid_tgid;
	r->rec.probe = probe;
	r->rec.cpu = p->proc.version;	/* how user space reads the code objects */
	r->rec.head.frames = p->new_codes;
	r->rec.head.status = PYTHON_CODE;
	bpf_probe_read_kernel(r->code, sizeof(r->code), p->new_code);
	bpf_ringbuf_submit(r, 0);
	p->new_codes = 0;
}

/* The whole pass for a walked stack w: its Python frames merged in, its
 * new code objects reported into `ring` (a record of `probe`). Before
 * store_stack, which keys the stack by its merged frames. */
static __always_inline void python_pass(struct walk *w, void *ring, __u64 pid_tgid,
					__u32 probe)
{
	python_merge(w);
	python_note_codes(w);
	python_report(ring, pid_tgid, probe);
}

#endif
