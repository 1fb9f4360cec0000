/* Perl frames inside a native stack, read in the kernel after the native
 * walk (unwind.h) of a stack that went through a Perl interpreter object
 * (the perl executable, which Debian links with the interpreter inside, or
 * libperl): the object's rows (object_rows.perl) point at its facts in
 * PERL_OBJECTS, at their ELF addresses; the walk's adjust for that object
 * makes them the process's. So any process that runs the object, a fork,
 * a perl started during the run, gets its Perl frames from its first
 * walked sample, with no step per process in user space;
 * capture/bpf_perl.py fills PERL_OBJECTS as the objects' rows load. A pass
 * of its own, so the native walk's steps stay as they are: a stack
 * through no Perl object costs one test.
 *
 * - the interpreter: with ithreads (Debian's build) the thread's own
 *   PerlInterpreter is pthread_getspecific(PL_thr_key): glibc keeps the
 *   first 32 keys' values in the thread's struct pthread (at fsbase); a
 *   thread without one (a program that never set it) uses PL_curinterp;
 * - its context stack: PL_curstackinfo's contexts, innermost first, then
 *   those of each si_prev. A sub's context (CXt_SUB) names its CV and
 *   keeps its caller's COP (blk_oldcop): a frame's line is the COP its
 *   callee saved, the innermost frame's PL_curcop; the main program's
 *   body ends the outermost stackinfo;
 * - the merge: Perl calls Perl without a C call (pp_entersub returns the
 *   sub's first op to the run loop), so a native frame in the run loop
 *   (Perl_runops_standard) stands for the contexts of one stackinfo (a
 *   sort block, a tie or a call from XS runs a nested loop on a stackinfo
 *   of its own): it is replaced by their frames, innermost first. Each is
 *   one tagged word (model.perl_frame_word): its CV's address and its
 *   line; the stack's hash covers them;
 * - names are copied at the sample: each (tgid, CV) the pass meets goes
 *   into PERL_SUBS with its sub's name, package and file (CvFILE: where
 *   it was defined; the main program's, its COP's), unless there with the
 *   same GV (or name HEK), which a freed CV's next owner would not have;
 *   user space takes them out as it reads them. A require or string eval
 *   (CXt_EVAL but eval {}) shows no frame of its own: its caller's line is
 *   the require's.
 * A context that cannot be read ends its stackinfo's frames there: the
 * rest of the run loop's frames stay as walked, never a guessed name. */
#ifndef PERL_H
#define PERL_H

#include "unwind.h"
#include "python.h"		/* task_fsbase */

#define PERL_TAG 0xB000000000000000ULL	/* model.PERL_FRAME_TAG */
#define PERL_LINE_MAX 0xFFFF
#define PERL_MAX_CONTEXTS 2048		/* contexts looked at per sample */
#define PERL_CX_READ 128		/* bytes of a context read at once: a power of two */
#define PERL_KEYS_1ST 32		/* glibc's PTHREAD_KEY_2NDLEVEL_SIZE */
#define PERL_NAME 64
#define PERL_FILE 128
#define CXT_TYPE_MASK 0xF		/* CXTYPEMASK */
#define CXT_SUB 9			/* CXt_SUB */
#define CXT_EVAL 11			/* CXt_EVAL */
#define CXP_EVALBLOCK 0x40		/* CXp_EVALBLOCK: eval {}, try {} */

/* a Perl version's layout (unwind/perl_runtime.py's names), byte offsets */
struct perl_layout {
	__u32 interp_curcop;		/* PerlInterpreter.Icurcop */
	__u32 interp_curstackinfo;	/* .Icurstackinfo */
	__u32 interp_main_cv;		/* .Imain_cv */
	__u32 si_cxstack, si_prev, si_cxix;	/* struct stackinfo */
	__u32 cx_size, cx_oldcop, cx_sub_cv;	/* PERL_CONTEXT: blk_oldcop, blk_sub.cv */
	__u32 cop_line, cop_file;	/* COP: cop_line, CopFILE (a char * with ithreads) */
	__u32 cv_stash, cv_gv, cv_flags;	/* XPVCV: xcv_stash, xcv_gv_u, xcv_flags */
	__u32 cv_file;			/* XPVCV.xcv_file: CvFILE, a char * with ithreads */
	__u32 cv_named;			/* CVf_NAMED: xcv_gv_u is a name HEK, not a GV */
	__u32 gv_name, gv_stash;	/* XPVGV: xiv_u (name HEK), xnv_u (stash) */
	__u32 sv_flags, sv_ook;		/* sv_flags; SVf_OOK: a hash with its aux part */
	__u32 hv_aux, aux_name, aux_name_count;	/* xpvhv_with_aux.xhv_aux; its name */
	__u32 hek_key;			/* HEK.hek_key */
	__u32 pthread_specific;		/* glibc's struct pthread.specific_1stblock */
};

/* PERL_OBJECTS' value: a Perl object's facts, at its ELF addresses
 * (version 0: an empty slot) */
struct perl_object {
	struct perl_layout layout;
	__u32 version;			/* 5 << 16 | minor << 8 | patch */
	__u64 curinterp;		/* &PL_curinterp */
	__u64 thr_key;			/* &PL_thr_key */
	__u64 runops_start, runops_end;	/* Perl_runops_standard */
};

/* PERL_SUBS' key: a sub seen in a stack (its CV; the main program's
 * body: PL_main_cv) */
struct perl_sub_key {
	__u32 tgid;
	__u32 pad;
	__u64 cv;
};

/* PERL_SUBS' value: what names it, copied at the sample (a NUL ends each;
 * empty for the main program's body, whose file is its COP's) */
struct perl_sub {
	__u64 identity;			/* xcv_gv_u */
	char name[PERL_NAME];
	char package[PERL_NAME];
	char file[PERL_FILE];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct perl_object);
	__uint(max_entries, 1);		/* sized by the loader */
} perl_objects SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct perl_sub_key);
	__type(value, struct perl_sub);
	__uint(max_entries, 1);		/* sized by the loader */
} perl_subs SEC(".maps");

/* the Perl pass's per-CPU state */
struct perl_walk {
	struct perl_object proc;	/* at the process's addresses */
	__u64 native[MAX_FRAMES];	/* the native walk's frames */
	__u64 nnative, next;		/* their count; the next one to merge */
	__u64 out, hash;		/* the merged frames written; their hash */
	__u64 si;			/* the stackinfo whose contexts come next, 0: none left */
	__u64 cxstack;			/* its contexts */
	__s64 ix;			/* its next context, counting down */
	__u64 in_group;			/* a run loop's frames being written */
	__u64 group_frames;		/* Perl frames written for it */
	__u64 cop;			/* the COP of the next frame: where it is */
	__u64 frame_cv, frame_cop;	/* a frame perl_context found */
	__u64 main_cv;
	__u64 contexts;			/* contexts read */
	__u64 perl_frames;
	__u32 tgid, pad;
	struct perl_sub sub;		/* a sub's names being copied */
	__u64 dropped;			/* words left out: the stack was full */
	__u8 cx[PERL_CX_READ + 8];
	__u8 body[PERL_CX_READ + 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct perl_walk);
	__uint(max_entries, 1);
} perl_scratch SEC(".maps");

static __always_inline struct perl_walk *perl_state(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&perl_scratch, &zero);
}

/* a field of the buffer `buf` (PERL_CX_READ bytes) at a layout's offset */
#define PERL_FIELD(type, buf, off) (*(type *)((buf) + ((off) & (PERL_CX_READ - 1))))

/* the NUL-ended key of the HEK at `hek` into out, "" when unreadable */
static __always_inline void perl_hek(struct perl_walk *p, __u64 hek, char *out, __u32 cap)
{
	out[0] = 0;
	if (hek && bpf_probe_read_user_str(out, cap, (void *)(hek + p->proc.layout.hek_key)) < 0)
		out[0] = 0;
}

/* the name of the stash (package) at `hv` into out */
static __always_inline void perl_stash_name(struct perl_walk *p, __u64 hv, char *out)
{
	struct perl_layout *l = &p->proc.layout;
	__u64 body, name;
	__u32 flags;
	__s32 count;

	out[0] = 0;
	if (!hv || bpf_probe_read_user(&flags, 4, (void *)(hv + l->sv_flags)) || !(flags & l->sv_ook))
		return;
	body = user_word(hv);
	if (!body)
		return;
	name = user_word(body + l->hv_aux + l->aux_name);
	if (bpf_probe_read_user(&count, 4, (void *)(body + l->hv_aux + l->aux_name_count)))
		return;
	if (count)		/* several names: the first is the effective one */
		name = name ? user_word(name) : 0;
	perl_hek(p, name, out, PERL_NAME);
}

/* (tgid, cv) into PERL_SUBS with its names, unless there as it is; 0.
 * A global function, so the verifier checks it once, on its own */
__noinline int perl_seen(__u64 cv, __u64 cop)
{
	struct perl_walk *p = perl_state();
	struct perl_layout *l;
	struct perl_sub_key key = { .cv = cv };
	struct perl_sub *known;
	__u64 body, gv_body, name, stash, identity = 0;
	__u32 flags = 0;

	if (!p)
		return 0;
	l = &p->proc.layout;
	key.tgid = p->tgid;

	body = user_word(cv);
	if (cv != p->main_cv) {
		if (!body || bpf_probe_read_user(p->body, PERL_CX_READ, (void *)body))
			return 0;
		identity = PERL_FIELD(__u64, p->body, l->cv_gv);
		flags = PERL_FIELD(__u32, p->body, l->cv_flags);
		if (!identity)
			return 0;
	}
	known = bpf_map_lookup_elem(&perl_subs, &key);
	if (known && known->identity == identity)
		return 0;
	p->sub.identity = identity;
	p->sub.file[0] = 0;
	/* one call of each reader (the verifier checks each call apart) */
	name = stash = 0;
	if (cv != p->main_cv) {
		if (flags & l->cv_named) {
			name = identity;
			stash = PERL_FIELD(__u64, p->body, l->cv_stash);
		} else {
			gv_body = user_word(identity);
			if (gv_body) {
				name = user_word(gv_body + l->gv_name);
				stash = user_word(gv_body + l->gv_stash);
			}
		}
	}
	perl_hek(p, name, p->sub.name, PERL_NAME);
	perl_stash_name(p, stash, p->sub.package);
	{
		__u64 file = cv != p->main_cv ? PERL_FIELD(__u64, p->body, l->cv_file)
			: cop ? user_word(cop + l->cop_file) : 0;

		if (file && bpf_probe_read_user_str(p->sub.file, PERL_FILE, (void *)file) < 0)
			p->sub.file[0] = 0;
	}
	bpf_map_update_elem(&perl_subs, &key, &p->sub, BPF_ANY);
	return 0;
}

/* one merged word into w */
static __always_inline void perl_emit(struct walk *w, struct perl_walk *p, __u64 word)
{
	if (p->out >= MAX_FRAMES) {
		p->dropped++;
		return;
	}
	w->frame[p->out & (MAX_FRAMES - 1)] = word;
	p->hash = p->out ? mix(p->hash, word) : mix(FNV_BASIS, word);
	p->out++;
}

/* the frame of sub `cv` at `cop` into the merged stack */
static __always_inline void perl_frame(struct walk *w, struct perl_walk *p, __u64 cv, __u64 cop)
{
	__u32 line = 0;

	if (cop)
		bpf_probe_read_user(&line, 4, (void *)(cop + p->proc.layout.cop_line));
	if (line > PERL_LINE_MAX)
		line = PERL_LINE_MAX;
	perl_seen(cv, cop);
	perl_emit(w, p, PERL_TAG | (cv >> 3) << 16 | line);
	p->group_frames++;
	p->perl_frames++;
}

/* the stackinfo p->si's contexts start (p->ix its last); 0 when it cannot
 * be read (none is left) */
static __always_inline int perl_stackinfo(struct perl_walk *p)
{
	__s32 cxix;

	if (!p->si || bpf_probe_read_user(&cxix, 4, (void *)(p->si + p->proc.layout.si_cxix))) {
		p->si = 0;
		return 0;
	}
	p->ix = cxix;
	p->cxstack = user_word(p->si + p->proc.layout.si_cxstack);
	return 1;
}

/* one step of a run loop's group: a context of the stackinfo, or its
 * end; whether the group ended. A frame it finds is left in p->frame_cv
 * and p->frame_cop, for the one place that writes frames (perl_step) */
static __always_inline int perl_context(struct perl_walk *p)
{
	struct perl_layout *l = &p->proc.layout;
	__u64 si = p->si, prev, cv;
	__u32 size = l->cx_size;

	if (p->ix < 0) {	/* the stackinfo's bottom: the main program's, or a nested loop's */
		prev = user_word(si + l->si_prev);
		if (!prev) {
			p->frame_cv = p->main_cv;
			p->frame_cop = p->cop;
		}
		p->si = prev;
		if (prev && !perl_stackinfo(p))
			p->si = 0;
		return 1;
	}
	if (++p->contexts > PERL_MAX_CONTEXTS || size > PERL_CX_READ)
		goto unreadable;
	if (!p->cxstack || bpf_probe_read_user(p->cx, size & (PERL_CX_READ - 1),
					       (void *)(p->cxstack + p->ix * size)))
		goto unreadable;
	p->ix--;
	if ((p->cx[0] & CXT_TYPE_MASK) == CXT_SUB) {
		cv = PERL_FIELD(__u64, p->cx, l->cx_sub_cv);
		if (cv) {	/* 0: pp_entersub pushed the block, not the sub yet */
			p->frame_cv = cv;
			p->frame_cop = p->cop;
		}
		p->cop = PERL_FIELD(__u64, p->cx, l->cx_oldcop);
	} else if ((p->cx[0] & CXT_TYPE_MASK) == CXT_EVAL && !(p->cx[0] & CXP_EVALBLOCK)) {
		p->cop = PERL_FIELD(__u64, p->cx, l->cx_oldcop);	/* where it was required */
	}
	return 0;
unreadable:
	p->si = 0;
	return 1;
}

static __always_inline int in_runops(struct perl_object *o, __u64 q)
{
	return q >= o->runops_start && q < o->runops_end;
}

/* bpf_loop's callback: one word of the merged stack, or one context of
 * a run loop's group; 1 stops */
static long perl_step(__u64 index, void *unused)
{
	struct perl_walk *p = perl_state();
	struct walk *w = scratch_value();
	__u64 pc, i;
	int ended;

	if (!p || !w)
		return 1;
	if (p->in_group) {
		p->frame_cv = 0;
		ended = perl_context(p);
		if (p->frame_cv)
			perl_frame(w, p, p->frame_cv, p->frame_cop);
		if (ended) {
			p->in_group = 0;
			if (!p->group_frames)	/* a loop with no sub: shown as C */
				perl_emit(w, p, p->native[(p->next - 1) & (MAX_FRAMES - 1)]);
		}
		return 0;
	}
	i = p->next;
	if (i >= p->nnative)
		return 1;
	p->next = i + 1;
	pc = p->native[i & (MAX_FRAMES - 1)];
	if (p->si && in_runops(&p->proc, i ? pc - 1 : pc)) {
		p->in_group = 1;
		p->group_frames = 0;
		return 0;
	}
	perl_emit(w, p, pc);
	return 0;
}

/* the thread's interpreter: its PL_thr_key value, else PL_curinterp */
static __always_inline __u64 perl_interpreter(struct perl_walk *p)
{
	void *task = bpf_get_current_task_btf();
	__u64 fsbase = FIELD(__u64, task, task_fsbase), interp = 0;
	__u32 key;

	if (fsbase && !bpf_probe_read_user(&key, 4, (void *)p->proc.thr_key)
	    && key < PERL_KEYS_1ST)
		interp = user_word(fsbase + p->proc.layout.pthread_specific + 16 * key + 8);
	return interp ? interp : user_word(p->proc.curinterp);
}

/* Perl frames into the walked stack w of the current task, when the walk
 * went through a Perl object of PERL_OBJECTS: its frames and hash change */
static __noinline void perl_merge(struct walk *w, __u64 pid_tgid)
{
	struct perl_walk *p;
	struct perl_object *o;
	struct perl_layout *l;
	__u64 interp, n;
	__u32 slot;
	__s64 adjust;

	if (!w || !w->perl)	/* a stack through no Perl object: this test only */
		return;
	p = perl_state();
	if (!p)
		return;
	slot = w->perl - 1;
	o = bpf_map_lookup_elem(&perl_objects, &slot);
	if (!o || !o->version)
		return;
	adjust = w->perl_adjust;
	p->proc = *o;
	p->proc.curinterp -= adjust;
	p->proc.thr_key -= adjust;
	p->proc.runops_start -= adjust;
	p->proc.runops_end -= adjust;
	l = &p->proc.layout;
	interp = perl_interpreter(p);
	if (!interp)
		return;
	p->si = user_word(interp + l->interp_curstackinfo);
	p->cop = user_word(interp + l->interp_curcop);
	p->main_cv = user_word(interp + l->interp_main_cv);
	if (!p->si || !p->main_cv || !perl_stackinfo(p))
		return;
	n = w->rec.head.frames;
	if (n > MAX_FRAMES)
		n = MAX_FRAMES;
	if (n == 0 || bpf_probe_read_kernel(p->native, n * 8, w->frame))
		return;
	p->tgid = pid_tgid >> 32;
	p->nnative = n;
	p->next = p->out = p->in_group = p->contexts = p->perl_frames = p->dropped = 0;
	p->hash = FNV_BASIS;
	bpf_loop(MAX_FRAMES + PERL_MAX_CONTEXTS + 64, perl_step, 0, 0);
	if (!p->perl_frames)
		return;		/* as walked: the words are the same */
	if (p->dropped || p->next < p->nnative)
		w->rec.head.status = TRUNCATED;	/* more words than a stack holds */
	w->rec.head.frames = p->out;
	w->hash = p->hash;
}

#endif
