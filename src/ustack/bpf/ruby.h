/* Ruby frames inside a native stack, walked in the kernel after the
 * native walk (unwind.h) of a stack that went through a CRuby VM object
 * (libruby): the object's rows (object_rows.ruby) point at its facts in
 * RUBY_OBJECTS, at their ELF addresses; the walk's adjust for that object
 * makes them the process's. So any process that runs the object, a
 * thread, a fork, a ruby started during the run, gets its Ruby frames
 * from its first sample, with no step per process in user space;
 * capture/bpf_ruby.py fills RUBY_OBJECTS as the objects' rows load. A
 * pass of its own, so the native walk's steps stay as they are: a stack
 * through no Ruby VM costs one test.
 *
 * - the thread's execution context: the thread-local ruby_current_ec,
 *   read through the thread's DTV (fsbase + 8) at the VM module's TLS id
 *   (in its GOT, written by ld.so) and the variable's offset in the block;
 * - its control frames, from ec->cfp up to the end of the VM stack
 *   (vm_stack + vm_stack_size words: the frames grow down from there);
 * - the merge: each native frame in rb_vm_exec is replaced by the Ruby
 *   frames (those with an iseq, not a C function's nor the thread's dummy
 *   first one) of the control frames its VM call ran, innermost first: up
 *   to and including the one flagged FINISH, where that call returns (in
 *   a whole stack, a call starting, its frames pushed before rb_vm_exec
 *   runs, is left out; one returning, its frames gone before rb_vm_exec
 *   returns, stays its C frame). Each Ruby frame is one tagged word
 *   (model.ruby_frame_word): the iseq body's address and the index of the
 *   instruction after its pc; the stack's hash covers them. A control
 *   frame that cannot be read leaves the rest of the stack's VM calls as
 *   their C frames, never a guessed frame;
 * - each (tgid, iseq body) seen goes into RUBY_ISEQS (an LRU) with its
 *   label object (what changes when another iseq takes the body's
 *   address) and, for a method's frame, its method entry (ep[-2], whose
 *   owner names the class: a method's iseq does not know it): user space
 *   takes them out as it reads their names, while the process lives
 *   (symbols/ruby.py). */
#ifndef RUBY_H
#define RUBY_H

#include "unwind.h"
#include "python.h"		/* user_word, task_fsbase */

#define RUBY_TAG 0xA000000000000000ULL	/* model.RUBY_FRAME_TAG */
#define RUBY_INDEX_MAX 0xFFFF
#define RUBY_ID_MASK ((1ULL << 44) - 1)
#define RUBY_MAX_CFPS 2048		/* control frames walked at most */
#define RUBY_FLAG_FINISH 0x0020		/* VM_FRAME_FLAG_FINISH: a VM call returns after it */
#define RUBY_FLAG_CFRAME 0x0080		/* VM_FRAME_FLAG_CFRAME: a C function's frame */
#define RUBY_MAGIC_MASK 0x7FFF0001	/* VM_FRAME_MAGIC_MASK */
#define RUBY_MAGIC_DUMMY 0x79990001	/* VM_FRAME_MAGIC_DUMMY: a thread's first frame */
#define RUBY_MAGIC_METHOD 0x11110001	/* VM_FRAME_MAGIC_METHOD: a method's frame */
#define RUBY_EP_ME_CREF 16		/* bytes below ep: its method entry (VM_ENV_DATA_INDEX_ME_CREF) */
#define RUBY_CFP_READ 64		/* room for a control frame's fields read (a power of two) */
#define RUBY_CFP_FIELDS 40		/* bytes of it read: pc, sp, iseq, self, ep */
#define RUBY_CACHED 64			/* iseqs kept per CPU (ruby_seen): a power of two */

/* RUBY_OBJECTS' value: a Ruby VM object's facts, at its ELF addresses
 * (present 0: an empty slot); byte offsets from unwind/ruby_runtime.py */
struct ruby_object {
	__u64 exec_start, exec_end;	/* rb_vm_exec */
	__u64 ec_module_got;		/* the GOT slot of the module's TLS id */
	__u32 ec_tls_offset;		/* ruby_current_ec in the module's TLS block */
	__u32 ec_vm_stack, ec_vm_stack_size, ec_cfp;
	__u32 cfp_pc, cfp_iseq, cfp_ep, cfp_size;
	__u32 iseq_body, body_iseq_encoded, body_location, location_label;
	__u32 present;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ruby_object);
	__uint(max_entries, 1);		/* sized by the loader */
} ruby_objects SEC(".maps");

/* RUBY_ISEQS' key: an iseq body seen in a stack */
struct ruby_iseq_key {
	__u32 tgid;
	__u32 pad;
	__u64 body;
};

/* RUBY_ISEQS' value */
struct ruby_iseq_seen {
	__u64 label;			/* its location.label object */
	__u64 me;			/* a method's frame: its method entry; else 0 */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ruby_iseq_key);
	__type(value, struct ruby_iseq_seen);
	__uint(max_entries, 1);		/* sized by the loader */
} ruby_iseqs SEC(".maps");

/* an iseq this CPU put in RUBY_ISEQS lately, in the slot of its body */
struct ruby_iseq_cached {
	__u64 body, label;
	__u32 tgid, pad;
};

/* the Ruby pass's per-CPU state */
struct ruby_walk {
	struct ruby_object vm;		/* exec_* at the process's addresses */
	__u64 native[MAX_FRAMES];	/* the native walk's frames */
	__u64 nnative, next;		/* their count; the next one to merge */
	__u64 cfp, end;			/* the next control frame; the VM stack's end */
	__u64 in_group;			/* a VM call's Ruby frames being written */
	__u64 group_pc, group_out;	/* its C frame; the merged words before it */
	__u64 out, hash, tgid;
	__u64 ruby_frames, cut;
	__u64 groups, execs;		/* VM calls' frame groups; rb_vm_exec frames */
	__u64 skip_execs;		/* innermost rb_vm_exec frames to leave as C */
	__u64 missing;			/* rb_vm_exec frames met with no group left */
	/* saves the RUBY_ISEQS lookup of an iseq met lately, as it was */
	struct ruby_iseq_cached cached[RUBY_CACHED];
	__u8 cf[RUBY_CFP_READ + 8];	/* the control frame being read */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ruby_walk);
	__uint(max_entries, 1);
} ruby_scratch SEC(".maps");

static __always_inline struct ruby_walk *ruby_state(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&ruby_scratch, &zero);
}

static __always_inline void ruby_emit(struct walk *w, struct ruby_walk *r, __u64 word)
{
	if (r->out >= MAX_FRAMES) {
		r->cut = 1;
		return;
	}
	w->frame[r->out & (MAX_FRAMES - 1)] = word;
	r->hash = r->out ? mix(r->hash, word) : mix(FNV_BASIS, word);
	r->out++;
}

/* the iseq body into RUBY_ISEQS, unless this CPU put it there as it is
 * lately (user space keeps what it read of it: once is enough) */
static __always_inline void ruby_seen(struct ruby_walk *r, __u64 body, __u64 ep,
				      __u64 flags)
{
	struct ruby_iseq_key key = { .tgid = r->tgid, .body = body };
	struct ruby_iseq_cached *c = &r->cached[((body >> 4) ^ r->tgid) & (RUBY_CACHED - 1)];
	struct ruby_iseq_seen seen = {};

	seen.label = user_word(body + r->vm.body_location + r->vm.location_label);
	if (!seen.label || (c->body == body && c->tgid == r->tgid && c->label == seen.label))
		return;
	if ((flags & RUBY_MAGIC_MASK) == RUBY_MAGIC_METHOD)
		seen.me = user_word(ep - RUBY_EP_ME_CREF);
	bpf_map_update_elem(&ruby_iseqs, &key, &seen, BPF_ANY);
	c->body = body;
	c->tgid = r->tgid;
	c->label = seen.label;
}

/* a field of the control frame read into r->cf, at a layout's offset */
#define CFP_FIELD(r, off) (*(__u64 *)((r)->cf + ((off) & (RUBY_CFP_READ - 8))))

/* one control frame at r->cfp into the merged stack where it is a Ruby
 * frame; whether its VM call's group ends with it. r->cfp moves to the
 * next, 0 when none is left or it could not be read */
static __always_inline int ruby_frame(struct walk *w, struct ruby_walk *r)
{
	__u64 pc, iseq, flags, body, encoded, index;
	__u64 at = r->cfp;

	if (at + r->vm.cfp_size > r->end
	    || bpf_probe_read_user(r->cf, RUBY_CFP_FIELDS, (void *)at)
	    || bpf_probe_read_user(&flags, 8, (void *)CFP_FIELD(r, r->vm.cfp_ep))) {
		r->cfp = 0;
		return 1;
	}
	r->cfp = at + r->vm.cfp_size;
	iseq = CFP_FIELD(r, r->vm.cfp_iseq);
	if (!(flags & RUBY_FLAG_CFRAME) && (flags & RUBY_MAGIC_MASK) != RUBY_MAGIC_DUMMY && iseq) {
		body = user_word(iseq + r->vm.iseq_body);
		encoded = body ? user_word(body + r->vm.body_iseq_encoded) : 0;
		if (body && encoded && !(body & 7)) {
			pc = CFP_FIELD(r, r->vm.cfp_pc);
			index = pc >= encoded ? (pc - encoded) / 8 : 0;
			if (index > RUBY_INDEX_MAX)
				index = RUBY_INDEX_MAX;
			ruby_emit(w, r, RUBY_TAG | ((body >> 3) & RUBY_ID_MASK) << 16 | index);
			ruby_seen(r, body, CFP_FIELD(r, r->vm.cfp_ep), flags);
			r->ruby_frames++;
		}
	}
	return (flags & RUBY_FLAG_FINISH) != 0;
}

/* whether the native frame i (its word pc) is in rb_vm_exec */
static __always_inline int ruby_in_exec(struct ruby_walk *r, __u64 i, __u64 pc)
{
	if (i)
		pc--;		/* a return address: the call is before it */
	return pc >= r->vm.exec_start && pc < r->vm.exec_end;
}

/* bpf_loop's callback: one control frame counted, from r->cfp; a group
 * ends at a FINISH frame but the thread's dummy first frame's; 1 stops */
static long ruby_count_step(__u64 index, void *unused)
{
	struct ruby_walk *r = ruby_state();
	__u64 ep, flags, at;

	if (!r)
		return 1;
	at = r->cfp;
	if (!at || at + r->vm.cfp_size > r->end
	    || bpf_probe_read_user(&ep, 8, (void *)(at + r->vm.cfp_ep))
	    || bpf_probe_read_user(&flags, 8, (void *)ep))
		return 1;
	r->cfp = at + r->vm.cfp_size;
	if ((flags & RUBY_FLAG_FINISH) && (flags & RUBY_MAGIC_MASK) != RUBY_MAGIC_DUMMY)
		r->groups++;
	return 0;
}

/* bpf_loop's callback: rb_vm_exec frames of the native stack counted */
static long ruby_exec_step(__u64 i, void *unused)
{
	struct ruby_walk *r = ruby_state();

	if (!r || i >= r->nnative)
		return 1;
	if (ruby_in_exec(r, i, r->native[i & (MAX_FRAMES - 1)]))
		r->execs++;
	return 0;
}

/* bpf_loop's callback: one control frame skipped, up to the end of a
 * group (the innermost groups whose VM call has not begun) */
static long ruby_skip_step(__u64 index, void *unused)
{
	struct ruby_walk *r = ruby_state();
	__u64 ep, flags, at;

	if (!r || !r->groups)
		return 1;
	at = r->cfp;
	if (!at || at + r->vm.cfp_size > r->end
	    || bpf_probe_read_user(&ep, 8, (void *)(at + r->vm.cfp_ep))
	    || bpf_probe_read_user(&flags, 8, (void *)ep)) {
		r->cfp = 0;
		return 1;
	}
	r->cfp = at + r->vm.cfp_size;
	if (flags & RUBY_FLAG_FINISH)
		r->groups--;
	return 0;
}

/* bpf_loop's callback: one word of the merged stack (or the start of a
 * VM call's Ruby frames); 1 stops */
static long ruby_step(__u64 index, void *unused)
{
	struct ruby_walk *r = ruby_state();
	struct walk *w = scratch_value();
	__u64 pc, i;

	if (!r || !w || r->out >= MAX_FRAMES)
		return 1;
	if (r->in_group) {
		if (!r->cfp || ruby_frame(w, r)) {
			r->in_group = 0;
			if (r->out == r->group_out) {	/* none: its C frame stays */
				ruby_emit(w, r, r->group_pc);
				r->missing++;
			}
		}
		return 0;
	}
	i = r->next;
	if (i >= r->nnative)
		return 1;
	r->next = i + 1;
	pc = r->native[i & (MAX_FRAMES - 1)];
	if (ruby_in_exec(r, i, pc) && r->skip_execs) {
		r->skip_execs--;	/* its frames are gone already: shown as C */
	} else if (ruby_in_exec(r, i, pc) && !r->cfp) {
		r->missing++;
	} else if (ruby_in_exec(r, i, pc)) {
		r->in_group = 1;	/* replaced by its Ruby frames */
		r->group_pc = r->native[i & (MAX_FRAMES - 1)];
		r->group_out = r->out;
		return 0;
	}
	ruby_emit(w, r, r->native[i & (MAX_FRAMES - 1)]);
	return 0;
}

/* the merged stack from the control frame at `cfp` into w's frames */
static __always_inline void ruby_merge(struct ruby_walk *r, __u64 cfp)
{
	r->cfp = cfp;
	r->next = r->out = r->in_group = r->ruby_frames = r->cut = r->missing = 0;
	r->hash = FNV_BASIS;
	bpf_loop(RUBY_MAX_CFPS + MAX_FRAMES, ruby_step, 0, 0);
}

/* Ruby frames into the walked stack w of the current task, when the walk
 * went through a Ruby VM object of RUBY_OBJECTS; the stack's frames and
 * hash change */
static __noinline void ruby_pass(struct walk *w)
{
	struct ruby_walk *r = ruby_state();
	void *task = bpf_get_current_task_btf();
	struct ruby_object *vm;
	__u64 fsbase, module, dtv, block, ec, stack, words, n, start;
	__u32 slot;
	__s64 adjust;

	if (!r || !w || !w->ruby)
		return;
	slot = w->ruby - 1;
	vm = bpf_map_lookup_elem(&ruby_objects, &slot);
	if (!vm || !vm->present)
		return;
	adjust = w->ruby_adjust;
	r->vm = *vm;
	r->vm.exec_start -= adjust;
	r->vm.exec_end -= adjust;
	/* the thread's ec: fsbase -> DTV -> the module's TLS block */
	fsbase = FIELD(__u64, task, task_fsbase);
	module = user_word(vm->ec_module_got - adjust);
	dtv = fsbase ? user_word(fsbase + 8) : 0;
	if (!module || module > 0xFFFF || !dtv)
		return;
	block = user_word(dtv + 16 * module);
	ec = block && block != -1ULL ? user_word(block + r->vm.ec_tls_offset) : 0;
	if (!ec)
		return;
	stack = user_word(ec + r->vm.ec_vm_stack);
	words = user_word(ec + r->vm.ec_vm_stack_size);
	r->cfp = user_word(ec + r->vm.ec_cfp);
	if (!stack || !words || words > (1ULL << 28))
		return;
	r->end = stack + 8 * words;
	if (r->cfp < stack || r->cfp >= r->end)
		return;
	n = w->rec.head.frames;
	if (n > MAX_FRAMES)
		n = MAX_FRAMES;
	if (n == 0 || bpf_probe_read_kernel(r->native, n * 8, w->frame))
		return;
	r->nnative = n;
	r->tgid = bpf_get_current_pid_tgid() >> 32;
	start = r->cfp;
	r->skip_execs = 0;
	ruby_merge(r, start);
	/* Paired from the inner end, a whole stack's groups end at the
	 * thread's dummy first frame with no rb_vm_exec frame left without
	 * its group. Else a VM call was starting (its frames pushed,
	 * rb_vm_exec not yet called: a group without its rb_vm_exec frame,
	 * whose frames are left out) or returning (its frames popped,
	 * rb_vm_exec not yet returned: an rb_vm_exec frame without a group,
	 * left a C frame), and the rest pair again from the outer end: only
	 * then are the groups counted. */
	if (w->rec.head.status != COMPLETE && w->rec.head.status != THROUGH_JIT
	    && w->rec.head.status != THROUGH_NO_CFI)
		goto done;	/* cut short: its outer VM calls are not there to count */
	if (!r->missing && r->cfp == r->end - r->vm.cfp_size)
		goto done;
	r->groups = r->execs = 0;
	r->cfp = start;
	bpf_loop(RUBY_MAX_CFPS, ruby_count_step, 0, 0);
	bpf_loop(MAX_FRAMES, ruby_exec_step, 0, 0);
	r->cfp = start;
	if (r->groups > r->execs) {
		r->groups -= r->execs;
		/* (none left: the merge below puts the native frames back) */
		bpf_loop(RUBY_MAX_CFPS, ruby_skip_step, 0, 0);
	} else {
		r->skip_execs = r->execs - r->groups;
	}
	ruby_merge(r, r->cfp);
done:
	if (!r->ruby_frames)
		return;		/* the stack as walked (its words are the same) */
	w->rec.head.frames = r->out;
	w->hash = r->hash;
	if (r->cut && w->rec.head.status == COMPLETE)
		w->rec.head.status = TRUNCATED;
}

#endif
