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
 * - a Python frame's word names its code object by an id, not by its
 *   address: the code object at an address is freed and another made
 *   there as a program runs. The id stands for (tgid, address, identity),
 *   the identity being what tells the object at that address from another
 *   one there later (its type, first line, file and name objects); each
 *   new id is reported once (PYTHON_CODES, an LRU) by a ring record of
 *   its own with the address and the identity, so user space reads the
 *   code while the process lives and checks it read the object the id
 *   stands for. A code object that cannot be checked gets PY_NOT_READ;
 * - a stack deeper than the record holds keeps its innermost PY_HEAD and
 *   outermost words (where `main` and `<module>` are), a word PY_CUT
 *   between them naming how many were left out;
 * - a native walk stopped at MAX_FRAMES with Python frames left (<= 3.10
 *   deep recursion: C frames per Python call) goes on with the rest of the
 *   Python chain after a PY_CUT word of count 0 (C frames not walked), so
 *   the outermost ones show; the status stays TRUNCATED. */
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
#define PY_CODE_READ 256		/* bytes of a code object's head read at most: a power of two */
/* a Python frame word's id (bits 16-59): PY_CUT, its index the count of
 * merged words left out there; PY_NOT_READ, a code object that could
 * not be checked; else a code object's id (code_id): a count, then in
 * the low 12 bits the CPU that made it (4095: user space's, the copy
 * path's; unwind/python_frames.py) */
#define PY_CUT 0
#define PY_NOT_READ 1
/* a PYTHON_CHAIN record's word after the frames one eval call ran */
#define PY_GROUP_END 2
#define PY_ID_MASK ((1ULL << 44) - 1)
#define PY_ID_CPU_BITS 12
/* the merged stack's words kept when it is deeper than MAX_FRAMES: the
 * innermost PY_HEAD, the outermost PY_TAIL - 1 (powers of two) */
#define PY_HEAD (MAX_FRAMES / 2)
#define PY_TAIL (MAX_FRAMES - PY_HEAD)
#define PY_MAX_WORDS 4096		/* merged words walked at most (recursion limit: 1000) */
#define PY_CACHED 64			/* ids kept per CPU (code_id): a power of two */
/* a status of unwind_status (ustack.h): complete, but the Python frame
 * chain loops back on itself (damaged memory), so it was left there */
#define PYTHON_LOOP 19
/* statuses of unwind_status: complete, through an eval call, but the
 * thread's PyThreadState was not found (a thread starting: its state not
 * yet in the list; ending: already out of it), or it had no current frame
 * (an interpreter starting or finishing a thread): its eval calls are
 * shown as C frames, with a note, never as a bare eval loop */
#define PYTHON_NO_THREAD 24	/* (23 is PASS_MISSING, ustack.h) */
#define PYTHON_NO_FRAME 25
/* not a stack: a ring record of the Python frame chain of the sample whose
 * deferred record follows (python_deferred); capture/bpf_unwind.py's */
#define PYTHON_CHAIN 0x50
/* its words before the frames: the current frame's address, the eval
 * function's two ranges at the process's addresses, the layout's
 * entry_kind (what user space needs of the interpreter to merge the
 * chain, so a process that ended before it reads the record is merged) */
#define PY_CHAIN_HEAD 6

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
	/* in PyCodeObject: co_filename, co_qualname (co_name before 3.11)
	 * and co_firstlineno: with ob_type, what tells a code object from one
	 * freed at its address (code_identity) */
	__u32 code_filename, code_name, code_firstline;
	__u32 str_data;			/* a compact ASCII str's characters, from its start */
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

/* PYTHON_CODES' value: the id of the code object at the key's address
 * while its identity is this one */
struct python_code_id {
	__u64 identity, id;
};

/* a code object given an id: where it is, what it is, and what names it
 * as read at the sample (a code object freed before user space reads it
 * is still named): its first line, its name's and file's lengths (0: not
 * a compact ASCII str, not copied) and their first PY_NAME_COPY, last
 * PY_FILE_COPY characters */
#define PY_NAME_COPY 64
#define PY_FILE_COPY 96
struct python_code_entry {
	__u64 code, id, identity;
	__s32 firstline;
	__u16 name_len, file_len;
	char name[PY_NAME_COPY];
	char file[PY_FILE_COPY];
};

/* the ring's record of code objects given an id: rec.head.status
 * PYTHON_CODE, rec.head.frames of them in code[] */
struct python_code_record {
	struct trace_record rec;
	struct python_code_entry code[PY_NEW_CODES];
};

/* an id this CPU gave or looked up last, in the slot of its code's address */
struct python_code_cached {
	__u64 code, identity, id;
	__u32 tgid, pad;
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
	__u64 tstate_cached;		/* tstate came from PYTHON_THREADS */
	__u64 unreadable;		/* a Python frame could not be read */
	__u64 missing;			/* eval C frames met with no Python frame left */
	__u64 skip;			/* innermost eval C frames to leave as C */
	__u64 truncated;		/* the native walk stopped at MAX_FRAMES */
	__u64 native_cut;		/* in a pass: truncated, 2 once its PY_CUT is out */
	__u64 python_frames;		/* Python frames in the merged stack */
	__u64 recent[PY_RECENT];	/* the frames read last, by steps */
	__u64 steps, mark;		/* frames read; one kept at each power of two */
	__u64 looped;			/* the chain came back to a frame read before */
	__u64 new_codes;
	struct python_code_entry new_code[PY_NEW_CODES];
	__u64 ids;			/* ids this CPU made: never reset */
	__u64 tail[PY_TAIL];		/* the outermost words, in order */
	/* saves the PYTHON_CODES lookup of a frame whose code was met lately */
	struct python_code_cached cached[PY_CACHED];
	__u8 frame[PY_FRAME_READ + 8];
	__u8 code[PY_CODE_READ + 8];
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
	__type(value, struct python_code_id);
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

/* p->tstate: the current thread's PyThreadState, 0 when it has none;
 * from PYTHON_THREADS unless `search` (p->tstate_cached: whether it was) */
static __noinline void find_thread(struct python_walk *p, int search)
{
	struct python_thread_key key = { .ctx_id = p->ctx_id, .fsbase = p->fsbase };
	struct python_layout *l = &p->proc.layout;
	struct python_thread found, *cached;
	__u64 interp, head;

	interp = user_word(p->proc.runtime + l->runtime_interp_head);
	head = interp ? user_word(interp + l->interp_tstate_head) : 0;
	cached = search ? 0 : bpf_map_lookup_elem(&python_threads, &key);
	if (cached && cached->tstate && cached->head == head
	    && user_word(cached->tstate + l->tstate_thread_id) == p->fsbase) {
		p->tstate = cached->tstate;
		p->tstate_cached = 1;
		return;
	}
	p->tstate_cached = 0;
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

/* What tells the code object at `code` from another made at that
 * address later (one freed, a new one there: a module body run at
 * start-up, then a function; throwaway functions of one file): its type,
 * first line, file and name objects, mixed; 0 when it cannot be read.
 * symbols/python.py computes it again from what it reads. */
static __always_inline __u64 code_identity(struct python_walk *p, __u64 code)
{
	struct python_object *py = &p->proc;
	__u32 span = py->code_name + 8;
	__u64 h;

	if (py->code_filename + 8 > span)
		span = py->code_filename + 8;
	if (py->code_firstline + 4 > span)
		span = py->code_firstline + 4;
	if (span > PY_CODE_READ)
		span = PY_CODE_READ;
	if (!code || bpf_probe_read_user(p->code, span, (void *)code))
		return 0;
#define CODE_FIELD(type, off) (*(type *)(p->code + ((off) & (PY_CODE_READ - 1))))
	h = mix(FNV_BASIS, CODE_FIELD(__u64, 8));		/* ob_type */
	h = mix(h, CODE_FIELD(__u32, py->code_firstline));
	h = mix(h, CODE_FIELD(__u64, py->code_filename));
	h = mix(h, CODE_FIELD(__u64, py->code_name));
#undef CODE_FIELD
	return h ? h : 1;
}

/* the characters of the str object at `str` into out (its last `cap`
 * when `tail`), when it is a compact ASCII str; its length, 0 if not */
static __always_inline __u32 copy_str(struct python_walk *p, __u64 str, char *out,
				      __u32 cap, int tail)
{
	__u64 head[5];
	__u64 len, n, from;

	if (!str || bpf_probe_read_user(head, sizeof(head), (void *)str))
		return 0;
	len = head[2];
	if (!(head[4] & (1 << 5)) || !(head[4] & (1 << 6)) || len > 0xFFFF)
		return 0;		/* not compact and ASCII */
	n = len < cap ? len : cap;
	from = str + p->proc.str_data + (tail && len > cap ? len - cap : 0);
	if (n == 0 || n > cap || bpf_probe_read_user(out, n, (void *)from))
		return 0;
	return len;
}

static __always_inline struct python_code_cached *cached_slot(struct python_walk *p, __u64 code)
{
	return &p->cached[((code >> 4) ^ p->tgid) & (PY_CACHED - 1)];
}

/* the id of the code object at `code` as it is now: the one it was given
 * while its identity is the same, else a new one, listed for the ring
 * (at most PY_NEW_CODES a sample: past that, PY_NOT_READ) */
static __always_inline __u64 code_id(struct python_walk *p, __u64 code)
{
	struct python_code_key key = { .tgid = p->tgid, .code = code };
	struct python_code_id *seen, fresh;
	struct python_code_cached *c;
	struct python_code_entry *e;
	__u64 n = p->new_codes;

	fresh.identity = code_identity(p, code);
	if (!fresh.identity)
		return PY_NOT_READ;
	c = cached_slot(p, code);
	if (c->code == code && c->tgid == p->tgid && c->identity == fresh.identity)
		return c->id;
	seen = bpf_map_lookup_elem(&python_codes, &key);
	if (seen && seen->identity == fresh.identity) {
		c->code = code;
		c->tgid = p->tgid;
		c->identity = seen->identity;
		c->id = seen->id;
		return seen->id;
	}
	if (n >= PY_NEW_CODES)
		return PY_NOT_READ;
	/* unique without a shared counter: this CPU's count, then the CPU */
	p->ids++;
	fresh.id = ((p->ids << PY_ID_CPU_BITS) | (bpf_get_smp_processor_id() % 4095)) & PY_ID_MASK;
	bpf_map_update_elem(&python_codes, &key, &fresh, BPF_ANY);
	c->code = code;
	c->tgid = p->tgid;
	c->identity = fresh.identity;
	c->id = fresh.id;
	e = &p->new_code[n & (PY_NEW_CODES - 1)];
	e->code = code;
	e->id = fresh.id;
	e->identity = fresh.identity;
	/* p->code still holds the code object's head (code_identity) */
	e->firstline = *(__s32 *)(p->code + (p->proc.code_firstline & (PY_CODE_READ - 1)));
	e->name_len = copy_str(p, *(__u64 *)(p->code + (p->proc.code_name & (PY_CODE_READ - 1))),
			       e->name, PY_NAME_COPY, 0);
	e->file_len = copy_str(p, *(__u64 *)(p->code + (p->proc.code_filename & (PY_CODE_READ - 1))),
			       e->file, PY_FILE_COPY, 1);
	p->new_codes = n + 1;
	return fresh.id;
}

/* a merged word as it is kept: a Python frame's code address replaced
 * by its id (code_id) */
static __always_inline __u64 named(struct python_walk *p, __u64 word)
{
	__u64 id = (word >> 16) & PY_ID_MASK;

	if (word >> 60 != PYTHON_TAG >> 60 || id == PY_CUT || id == PY_GROUP_END)
		return word;
	return PYTHON_TAG | code_id(p, id << 3) << 16 | (word & PY_INDEX_MAX);
}

/* word number p->out of the merged stack into w: the first PY_HEAD named
 * and hashed in place; the rest round a ring of PY_TAIL slots after
 * them, named and hashed once the walk has ended (name_tail; put in
 * order first by keep_ends when it went round), so the frames a deep
 * stack leaves out cost no code object read */
static __always_inline void emit(struct walk *w, struct python_walk *p, __u64 word)
{
	__u64 at = p->out;

	if (at < PY_HEAD) {
		word = named(p, word);
		p->hash = mix(p->hash, word);
	} else {
		at = PY_HEAD + ((at - PY_HEAD) & (PY_TAIL - 1));
	}
	w->frame[at & (MAX_FRAMES - 1)] = word;
	p->out++;
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
	if (code < 0x1000) {
		/* no code object yet (a frame being pushed): its word would
		 * read as a PY_CUT marker, an invented "frames left out" */
		p->unreadable = 1;
		p->pyframe = 0;
		return 1;
	}
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

	if (!p || !w || p->out >= PY_MAX_WORDS)
		return 1;
	if (p->in_group) {
		if (!p->pyframe || python_frame(w, p))
			p->in_group = 0;
		return 0;
	}
	i = p->next;
	if (i >= p->nnative) {
		/* the native walk stopped at its frame limit with Python
		 * frames left (<= 3.10: each Python call is C frames too): the
		 * rest of the chain after a PY_CUT word of no count (C frames
		 * not walked), so its outermost frames (main, <module>) show */
		if (!p->native_cut || !p->pyframe)
			return 1;
		if (p->native_cut == 1) {
			p->native_cut = 2;
			emit(w, p, PYTHON_TAG | (PY_CUT << 16));
		}
		python_frame(w, p);
		return 0;
	}
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
	p->native_cut = p->truncated;
	p->hash = FNV_BASIS;
	p->steps = p->mark = p->looped = 0;
	__builtin_memset(p->recent, 0, sizeof(p->recent));
	bpf_loop(PY_MAX_WORDS + MAX_FRAMES, merge_step, 0, 0);
}

/* bpf_loop's callback: word `index` of the tail's ring, in order, into
 * p->tail */
static long tail_step(__u64 index, void *unused)
{
	struct python_walk *p = python_state();
	struct walk *w = scratch_value();
	__u64 at;

	if (!p || !w || index >= PY_TAIL)
		return 1;
	at = PY_HEAD + ((p->out - PY_TAIL + index - PY_HEAD) & (PY_TAIL - 1));
	p->tail[index & (PY_TAIL - 1)] = w->frame[at & (MAX_FRAMES - 1)];
	return 0;
}

/* A merged stack deeper than MAX_FRAMES: its innermost PY_HEAD words,
 * a PY_CUT word counting those left out, its outermost PY_TAIL - 1 */
static __always_inline void keep_ends(struct walk *w, struct python_walk *p)
{
	__u64 cut;

	if (p->out <= MAX_FRAMES)
		return;
	bpf_loop(PY_TAIL, tail_step, 0, 0);
	cut = p->out - MAX_FRAMES + 1;
	w->frame[PY_HEAD] = PYTHON_TAG | (PY_CUT << 16) | (cut > PY_INDEX_MAX ? PY_INDEX_MAX : cut);
	bpf_probe_read_kernel(&w->frame[PY_HEAD + 1], (PY_TAIL - 1) * 8, &p->tail[1]);
	p->out = MAX_FRAMES;
}

/* bpf_loop's callback: merged word PY_HEAD + `index` named and hashed */
static long name_tail(__u64 index, void *unused)
{
	struct python_walk *p = python_state();
	struct walk *w = scratch_value();
	__u64 at = PY_HEAD + index, word;

	if (!p || !w || at >= p->out || index >= PY_TAIL)
		return 1;
	word = named(p, w->frame[at & (MAX_FRAMES - 1)]);
	w->frame[at & (MAX_FRAMES - 1)] = word;
	p->hash = mix(p->hash, word);
	return 0;
}

/* bpf_loop's callback: p->missing set when native frame `index` of the
 * walked stack lies in the eval function; 1 stops */
static long eval_step(__u64 index, void *unused)
{
	struct python_walk *p = python_state();
	struct walk *w = scratch_value();
	__u64 pc;

	if (!p || !w || index >= p->nnative)
		return 1;
	pc = w->frame[index & (MAX_FRAMES - 1)];
	if (in_eval(&p->proc, index ? pc - 1 : pc)) {
		p->missing = 1;
		return 1;
	}
	return 0;
}

/* w's status `why` when its stack went through an eval call whose Python
 * frames cannot be read, and nothing else cut it short */
static __always_inline void without_python(struct walk *w, struct python_walk *p, __u32 why)
{
	__u64 n = w->rec.head.frames;

	p->nnative = n > MAX_FRAMES ? MAX_FRAMES : n;
	p->missing = 0;
	bpf_loop(MAX_FRAMES, eval_step, 0, 0);
	if (p->missing && (w->rec.head.status == COMPLETE || w->rec.head.status == THROUGH_JIT
			   || w->rec.head.status == THROUGH_NO_CFI))
		w->rec.head.status = why;
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
	p->ctx_id = KFIELD(__u64, KFIELD(void *, task, task_mm), mm_ctx_id);
	p->fsbase = FIELD(__u64, task, task_fsbase);
	find_thread(p, 0);
	if (!p->tstate) {
		without_python(w, p, PYTHON_NO_THREAD);
		return;
	}
	current_frame(p);
	if (!p->pyframe && p->tstate_cached) {
		/* a state freed since (its memory still naming this thread)
		 * at an address the list's head has again: threads that end
		 * and start in batches get their states at the same addresses */
		find_thread(p, 1);
		if (p->tstate)
			current_frame(p);
	}
	if (!p->tstate) {
		without_python(w, p, PYTHON_NO_THREAD);
		return;
	}
	if (!p->pyframe) {
		without_python(w, p, PYTHON_NO_FRAME);
		return;
	}
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
	p->truncated = w->rec.head.status == TRUNCATED;
	p->unreadable = 0;
	merge_pass(p, 0);
	if (p->missing && !p->unreadable && !p->looped)
		merge_pass(p, p->missing);
	keep_ends(w, p);
	if (p->out > PY_HEAD)
		bpf_loop(PY_TAIL, name_tail, 0, 0);
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

/* bpf_loop's callback: one Python frame of the chain into the merged
 * words (emit: a deep chain's outermost round the tail's ring), a
 * PY_GROUP_END after each eval call's where a call runs more than one
 * (3.11+: up to 3.10 every frame is its own, and the words it would take
 * keep more frames of a deep chain); 1 stops */
static long chain_step(__u64 index, void *unused)
{
	struct python_walk *p = python_state();
	struct walk *w = scratch_value();

	if (!p || !w || !p->pyframe || p->out >= PY_MAX_WORDS)
		return 1;
	if (python_frame(w, p) && p->proc.layout.entry_kind != ONE_PER_EVAL)
		emit(w, p, PYTHON_TAG | (PY_GROUP_END << 16));
	return 0;
}

/* bpf_loop's callback: a code object listed for a record the ring had
 * no room for is forgotten, so it gets an id again, reported then */
static long forget_code(__u64 index, void *unused)
{
	struct python_walk *p = python_state();
	struct python_code_key key = {};

	if (!p || index >= p->new_codes)
		return 1;
	key.tgid = p->tgid;
	key.code = p->new_code[index & (PY_NEW_CODES - 1)].code;
	bpf_map_delete_elem(&python_codes, &key);
	cached_slot(p, key.code)->code = 0;	/* its id goes unreported */
	return 0;
}

/* the code objects python_merge gave an id, in one record into `ring` */
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

/* The Python frame chain of a sample the walk defers (the native stack
 * goes to user space to unwind: a new process's mappings not looked up
 * yet, rows still loading), read now, into `ring` as a PYTHON_CHAIN
 * record of w->rec's head: PY_CHAIN_HEAD words (the current frame's
 * address first), then a word per Python frame and (3.11+) a
 * PY_GROUP_END after each eval call's,
 * innermost first; user space merges them with the native stack it
 * unwinds, where a read of the live process later finds the thread moved
 * on. Only when the walk met the interpreter object before it stopped
 * and read the whole chain. A chain longer than the record holds keeps
 * its innermost and outermost words (keep_ends: a PY_CUT word counting
 * those left out between): a deep recursion's stack copy holds its
 * innermost eval calls only, and main and <module> are at the other end.
 * w's frames and head stay as walked.
 * (latency.bpf.c includes this header and defers no stack) */
static __noinline __attribute__((unused)) void python_deferred(struct walk *w, void *ring)
{
	struct python_walk *p = python_state();
	void *task = bpf_get_current_task_btf();
	struct stack_head head;
	struct python_object *py;
	__u32 slot, n;
	__s64 adjust;

	if (!p || !w || !w->python)
		return;
	p->new_codes = 0;
	slot = w->python - 1;
	py = bpf_map_lookup_elem(&python_objects, &slot);
	if (!py || !py->version)
		return;
	adjust = w->python_adjust;
	p->proc = *py;
	p->proc.runtime -= adjust;
	p->proc.eval_start[0] -= adjust;
	p->proc.eval_end[0] -= adjust;
	if (p->proc.eval_end[1]) {
		p->proc.eval_start[1] -= adjust;
		p->proc.eval_end[1] -= adjust;
	}
	p->tgid = w->rec.pid_tgid >> 32;
	p->ctx_id = KFIELD(__u64, KFIELD(void *, task, task_mm), mm_ctx_id);
	p->fsbase = FIELD(__u64, task, task_fsbase);
	find_thread(p, 0);
	if (!p->tstate)
		return;
	current_frame(p);
	if (!p->pyframe && p->tstate_cached) {		/* see python_merge */
		find_thread(p, 1);
		if (p->tstate)
			current_frame(p);
	}
	if (!p->tstate || !p->pyframe)
		return;
	head = w->rec.head;
	n = head.frames;
	if (n > MAX_FRAMES)
		n = MAX_FRAMES;
	if (n == 0 || bpf_probe_read_kernel(p->native, n * 8, w->frame))
		return;
	w->frame[0] = p->pyframe;
	w->frame[1] = p->proc.eval_start[0];
	w->frame[2] = p->proc.eval_end[0];
	w->frame[3] = p->proc.eval_start[1];
	w->frame[4] = p->proc.eval_end[1];
	w->frame[5] = p->proc.layout.entry_kind;
	p->out = PY_CHAIN_HEAD;
	p->hash = FNV_BASIS;
	p->unreadable = p->python_frames = 0;
	p->steps = p->mark = p->looped = 0;
	__builtin_memset(p->recent, 0, sizeof(p->recent));
	bpf_loop(PY_MAX_WORDS, chain_step, 0, 0);
	keep_ends(w, p);
	if (p->out > PY_HEAD)
		bpf_loop(PY_TAIL, name_tail, 0, 0);
	if (!p->pyframe && !p->unreadable && !p->looped) {
		w->rec.head.frames = p->out;
		w->rec.head.status = PYTHON_CHAIN;
		/* PY_CHAIN_HEAD to MAX_FRAMES words (keep_ends), in a form the
		 * verifier bounds */
		n = ((p->out - 1) & (MAX_FRAMES - 1)) + 1;
		bpf_ringbuf_output(ring, &w->rec, sizeof(w->rec) + 8 * n, 0);
		python_report(ring, w->rec.pid_tgid, w->rec.probe);
	} else {
		bpf_loop(PY_NEW_CODES, forget_code, 0, 0);	/* ids not reported */
	}
	p->new_codes = 0;
	w->rec.head = head;
	n = head.frames;
	if (n > MAX_FRAMES)
		n = MAX_FRAMES;
	bpf_probe_read_kernel(w->frame, n * 8, p->native);
}

/* The whole pass for a walked stack w: its Python frames merged in, its
 * new code objects reported into `ring` (a record of `probe`). Before
 * store_stack, which keys the stack by its merged frames. */
static __always_inline void python_pass(struct walk *w, void *ring, __u64 pid_tgid,
					__u32 probe)
{
	python_merge(w);
	python_report(ring, pid_tgid, probe);
}

#endif
