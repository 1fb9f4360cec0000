/* JS frames inside a native stack, named in the kernel after the native
 * walk (unwind.h) of a stack that went through a V8 object (node, or
 * libnode): the object's rows (object_rows.v8) point at its layout in
 * V8_OBJECTS, and the walk notes that slot as it passes through the
 * object. So any process that runs the object, a worker thread, a fork, a
 * node started during the run, gets its JS frames named from its first
 * walked sample, with no step per process in user space;
 * capture/bpf_v8.py fills V8_OBJECTS as the objects' rows load and tells
 * the story. A pass of its own, so the native walk's steps stay as they
 * are: a stack through no V8 object costs one test.
 *
 * V8 keeps frame pointers: the native walk goes through its JIT code and
 * its builtins (node's text without CFI) on them and notes each such
 * frame's frame pointer (walk.frame_fp). A JS frame's fixed slots sit below
 * it (offsets from node's v8dbg_off_fp_* symbols): the context (a tagged
 * heap pointer; a typed frame holds its type marker there, an even
 * integer), the JSFunction, and in an interpreted frame the BytecodeArray
 * and the bytecode offset (a Smi). Each JS frame's word becomes one tagged
 * word (model.v8_frame_word): its SharedFunctionInfo's address and the
 * bytecode offset where the frame is interpreted, so user space reads
 * name, script and line from the process (symbols/v8.py). A slot that does
 * not look like what it should leaves the frame as walked, never a guess.
 * The stack's hash covers the new words. Each (tgid, function) is put in
 * V8_FUNCTIONS (an LRU) with the word V8 changes when another function
 * takes its address or it is recompiled (its name_or_scope_info): user
 * space takes them out as it reads them, while the process lives (the
 * function objects live in each process's heap). */
#ifndef V8_H
#define V8_H

#include "unwind.h"

#define V8_TAG 0xD000000000000000ULL	/* model.V8_FRAME_TAG */
#define V8_NO_OFFSET 0xFFFF		/* model.V8_NO_OFFSET: not interpreted */
#define V8_HEAP_TAG_MASK 3		/* v8dbg_HeapObjectTagMask */
#define V8_HEAP_TAG 1			/* v8dbg_HeapObjectTag */
#define V8_SLOTS 5			/* words below a frame pointer read at once */

/* V8_OBJECTS' value, in a V8 object's slot, from its v8dbg_* symbols: a
 * frame's slots as indices into the V8_SLOTS words below its frame pointer
 * (slot i at fp - 8 * (V8_SLOTS - i)), and byte offsets in objects; none
 * is an address, so the process's load address changes nothing */
struct v8_object {
	__u32 slot_context;		/* v8dbg_off_fp_context */
	__u32 slot_function;		/* v8dbg_off_fp_function */
	__u32 slot_bytecode_array;	/* v8dbg_off_fp_bytecode_array */
	__u32 slot_bytecode_offset;	/* v8dbg_off_fp_bytecode_offset */
	__u32 function_shared;		/* JSFunction::shared */
	__u32 shared_function_data;	/* SharedFunctionInfo::function_data */
	__u32 shared_name_or_scope_info;	/* SharedFunctionInfo::name_or_scope_info */
	__u32 present;			/* 1: the slot is written; 0: an empty slot */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct v8_object);
	__uint(max_entries, 1);		/* sized by the loader */
} v8_objects SEC(".maps");

/* V8_FUNCTIONS' key: a function seen in a stack */
struct v8_function_key {
	__u32 tgid;
	__u32 pad;
	__u64 shared;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct v8_function_key);
	__type(value, __u64);		/* its name_or_scope_info word */
	__uint(max_entries, 1);		/* sized by the loader */
} v8_functions SEC(".maps");

/* bpf_loop's state over one stack's frames */
struct v8_pass_state {
	struct v8_object v8;
	__u64 hash;
	__u32 frames, named, tgid, pad;
};

static __always_inline int v8_heap_object(__u64 v)
{
	return (v & V8_HEAP_TAG_MASK) == V8_HEAP_TAG;
}

/* slot i of the V8_SLOTS words below a frame pointer, 0 for none */
static __always_inline __u64 v8_slot(__u64 *below, __u32 i)
{
	return i < V8_SLOTS ? below[i] : 0;
}

/* whether the innermost frame, at pc with stack pointer sp, has pushed
 * its fixed slots up to slot `slot` below fp and not begun to leave: in
 * the prologue (push rbp; mov rbp, rsp; the pushes of the context and
 * function) or at its ret, fp is the caller's or the slots are stale */
static __always_inline int v8_slots_pushed(__u64 pc, __u64 sp, __u64 fp, __u32 slot)
{
	__u8 code[3];

	if (slot >= V8_SLOTS || sp > fp - 8 * (V8_SLOTS - slot))
		return 0;
	if (bpf_probe_read_user(code, sizeof(code), (void *)pc))
		return 0;
	if (code[0] == 0x55					/* push rbp */
	    || (code[0] == 0x48 && code[1] == 0x89 && code[2] == 0xE5)	/* mov rbp, rsp */
	    || code[0] == 0xC3 || code[0] == 0xC2)		/* ret, ret imm16 */
		return 0;
	return 1;
}

/* the JS word of the frame whose frame pointer is fp, 0 when its slots
 * are not a JS frame's; sp: the event's stack pointer when the frame is
 * the innermost (its pc the event's own, pc), else 0 */
static __always_inline __u64 v8_frame(struct v8_object *p, __u64 fp, __u64 pc, __u64 sp)
{
	__u64 below[V8_SLOTS], function, shared, data, bytecode, offset, index;

	if (fp < 8 * V8_SLOTS || bpf_probe_read_user(below, sizeof(below), (void *)(fp - 8 * V8_SLOTS)))
		return 0;
	if (sp && !v8_slots_pushed(pc, sp, fp, p->slot_function))
		return 0;
	if (!v8_heap_object(v8_slot(below, p->slot_context)))
		return 0;		/* a typed frame's marker: a stub, an entry, an exit */
	function = v8_slot(below, p->slot_function);
	if (!v8_heap_object(function)
	    || bpf_probe_read_user(&shared, 8, (void *)(function - V8_HEAP_TAG + p->function_shared))
	    || !v8_heap_object(shared) || shared >> 47)
		return 0;
	index = V8_NO_OFFSET;
	/* interpreted: the frame's bytecode array is its function's, and the
	 * offset slot a Smi (an optimized frame's spill slots are neither) */
	bytecode = v8_slot(below, p->slot_bytecode_array);
	offset = v8_slot(below, p->slot_bytecode_offset);
	if (v8_heap_object(bytecode) && !(offset & 0xFFFFFFFF)
	    && (!sp || v8_slots_pushed(pc, sp, fp, p->slot_bytecode_offset))
	    && !bpf_probe_read_user(&data, 8, (void *)(shared - V8_HEAP_TAG + p->shared_function_data))
	    && data == bytecode) {
		index = offset >> 32;
		if (index >= V8_NO_OFFSET)
			index = V8_NO_OFFSET - 1;
	}
	return V8_TAG | (shared >> 3) << 16 | index;
}

/* the function of a JS frame into V8_FUNCTIONS, unless there as it is */
static __always_inline void v8_seen(struct v8_pass_state *s, __u64 word)
{
	struct v8_function_key key = { .tgid = s->tgid };
	__u64 identity, *known;

	key.shared = ((word >> 16) & ((1ULL << 44) - 1)) << 3 | V8_HEAP_TAG;
	if (bpf_probe_read_user(&identity, 8, (void *)(key.shared - V8_HEAP_TAG
							+ s->v8.shared_name_or_scope_info)))
		return;
	known = bpf_map_lookup_elem(&v8_functions, &key);
	if (!known || *known != identity)
		bpf_map_update_elem(&v8_functions, &key, &identity, BPF_ANY);
}

/* bpf_loop's callback: frame i named where it is a JS frame, the hash
 * carried over every frame; 1 ends the loop */
static long v8_step(__u64 i, struct v8_pass_state *s)
{
	struct walk *w = scratch_value();
	__u64 fp, word;
	__u32 at = i & (MAX_FRAMES - 1);

	if (!w || i >= s->frames)
		return 1;
	fp = w->frame_fp[at];
	if (fp) {
		word = v8_frame(&s->v8, fp, w->frame[at], i ? 0 : w->sp0);
		if (word) {
			w->frame[at] = word;
			s->named++;
			v8_seen(s, word);
		}
	}
	s->hash = i ? mix(s->hash, w->frame[at]) : mix(FNV_BASIS, w->frame[at]);
	return 0;
}

/* the JS frames of w's stack, where the walk went through a V8 object
 * and walked frames on their frame pointer */
static __always_inline void v8_pass(struct walk *w, __u64 pid_tgid)
{
	struct v8_object *v8;
	struct v8_pass_state s;
	__u32 slot;

	if (!w->v8 || !w->fp_used)
		return;
	slot = w->v8 - 1;
	v8 = bpf_map_lookup_elem(&v8_objects, &slot);
	if (!v8 || !v8->present)
		return;
	s.v8 = *v8;
	s.frames = w->rec.head.frames;
	if (s.frames > MAX_FRAMES)
		s.frames = MAX_FRAMES;
	s.named = 0;
	s.tgid = pid_tgid >> 32;
	s.hash = FNV_BASIS;
	bpf_loop(MAX_FRAMES, v8_step, &s, 0);
	if (s.named)
		w->hash = s.hash;
}

#endif
