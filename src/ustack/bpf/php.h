/* PHP frames inside a native stack, walked in the kernel after the native
 * walk (unwind.h) of a stack that went through a PHP interpreter object
 * (the php CLI, php-fpm, libphp): the object's rows (object_rows.php)
 * point at its facts in PHP_OBJECTS, at their ELF addresses; the walk's
 * adjust for that object makes them the process's. So any process that
 * runs the object, -p, -c, a PHP started during a whole-machine run, gets
 * PHP frames from its first sample, with no step per process in user
 * space; capture/bpf_php.py fills PHP_OBJECTS as the objects' rows load,
 * unwind/php_runtime.py says what an interpreter object is. A pass of its
 * own (php_pass), so the native walk's steps stay as they are: a stack
 * through no PHP interpreter costs one test.
 *
 * - the executor's globals (executor_globals: an NTS build's symbol) hold
 *   the current zend_execute_data; each one's func (zend_function), opline
 *   (its zend_op: the line) and prev_execute_data, read per sample;
 * - the merge: each native frame whose pc lies in execute_ex (the hybrid
 *   VM's one function: PHP calls PHP without a native call) is replaced
 *   by the PHP frames its call ran, innermost first: up to and including
 *   the frame flagged ZEND_CALL_TOP (the one zend_execute or
 *   zend_call_function entered execute_ex with). A builtin's frame (an
 *   internal function, its zif_ C frame inner to execute_ex) goes with
 *   them, named. execute_ex frames met with no PHP frame left (a call
 *   entering or leaving) are left as C, counted from the innermost in a
 *   second pass, so the rest pair with the right frames (python.h's way);
 * - a PHP frame's word names its function by an id, not by its address
 *   (a closure's zend_function is freed and another made there): the id
 *   stands for (tgid, address, identity: type, name, class, file and first
 *   line pointers). A new id's names are copied by the kernel at the
 *   sample into PHP_NAMES (name, class, the file's last characters, first
 *   line), which user space takes out every 0.1 s and at the end: named
 *   after the process is gone, never read from it later. The word's low 16
 *   bits are the line of the frame's opline (0 for a builtin);
 * - a chain that cannot be read, a function whose names could not be
 *   kept, or more PHP frames than the record holds: the stack says so
 *   (its status) or keeps the C frame, never a guessed name. */
#ifndef PHP_H
#define PHP_H

#include "unwind.h"

#define PHP_TAG 0xC000000000000000ULL	/* model.PHP_FRAME_TAG */
#define PHP_LINE_MAX 0xFFFF
#define PHP_ID_MASK ((1ULL << 44) - 1)
#define PHP_ID_CPU_BITS 12
#define PHP_NOT_READ 1			/* an id: a function that could not be kept */
#define PHP_MAX_WORDS 1024		/* merge steps at most */
#define PHP_ED_READ 64			/* bytes of a zend_execute_data read: a power of two */
#define PHP_FN_READ 32			/* bytes of a zend_function's common head */
#define PHP_NAME_COPY 64
#define PHP_FILE_COPY 96

/* PHP_OBJECTS' value: an interpreter object's facts (version 0: an empty
 * slot), at its ELF addresses; byte offsets from the version's headers
 * (unwind/php_runtime.py) */
struct php_object {
	__u64 executor_globals;
	__u64 execute_start, execute_end;	/* execute_ex */
	__u32 eg_current_execute_data;
	__u32 ed_opline, ed_func, ed_call_info, ed_prev;
	__u32 op_lineno;
	__u32 fn_name, fn_scope, fn_filename, fn_line_start;
	__u32 ce_name;
	__u32 str_len, str_val;
	__u32 call_top;				/* ZEND_CALL_TOP in the call info */
	__u32 user_function;			/* ZEND_USER_FUNCTION */
	__u32 version;				/* major << 8 | minor */
};

/* PHP_FUNCTIONS' key: a function met already */
struct php_function_key {
	__u32 tgid;
	__u32 pad;
	__u64 func;
};

/* PHP_FUNCTIONS' value: its id while its identity is this one */
struct php_function_id {
	__u64 identity, id;
};

/* PHP_NAMES' key and value: what an id names, as copied at the sample;
 * lengths 0 where there is none (the main script has no name, a function
 * no class), the file's last PHP_FILE_COPY characters */
struct php_name_key {
	__u32 tgid;
	__u32 pad;
	__u64 id;
};

struct php_name {
	__u32 line_start;
	__u16 name_len, scope_len, file_len;
	__u8 type;
	__u8 pad;
	char name[PHP_NAME_COPY];
	char scope[PHP_NAME_COPY];
	char file[PHP_FILE_COPY];
};

/* the PHP pass's per-CPU state */
struct php_walk {
	struct php_object proc;		/* at the process's addresses */
	__u64 native[MAX_FRAMES];	/* the native walk's frames */
	__u64 nnative, next;		/* their count; the next one to merge */
	__u64 ed;			/* the next zend_execute_data, 0 when none is left */
	__u64 in_group;			/* an execute_ex call's frames being written */
	__u64 out, hash;		/* the merged frames written; their hash */
	__u64 tgid, ids;		/* ids this CPU made: never reset */
	__u64 unreadable, missing, skip, cut, php_frames;
	__u8 ed_bytes[PHP_ED_READ];
	__u8 fn_bytes[PHP_FN_READ];
	struct php_name fresh;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct php_object);
	__uint(max_entries, 1);		/* sized by the loader */
} php_objects SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct php_function_key);
	__type(value, struct php_function_id);
	__uint(max_entries, 1);		/* sized by the loader */
} php_functions SEC(".maps");

/* preallocated: entries allocated as a sample needs them (BPF_F_NO_PREALLOC)
 * failed for the first samples' new functions, a cache not filled yet;
 * user space takes them out every 0.1 s, so a few thousand suffice */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct php_name_key);
	__type(value, struct php_name);
	__uint(max_entries, 1);		/* sized by the loader */
} php_names SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct php_walk);
	__uint(max_entries, 1);
} php_scratch SEC(".maps");

static __always_inline struct php_walk *php_state(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&php_scratch, &zero);
}

static __always_inline __u64 php_word_at(__u64 addr)
{
	__u64 v;

	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr))
		return 0;
	return v;
}

#define ED_FIELD(type, p, off) (*(type *)((p)->ed_bytes + ((off) & (PHP_ED_READ - 1))))
#define FN_FIELD(type, p, off) (*(type *)((p)->fn_bytes + ((off) & (PHP_FN_READ - 1))))

/* the characters of the zend_string at `str` into out (its last `cap`
 * when `tail`); its length (0 when none or unreadable) */
static __always_inline __u16 php_copy_str(struct php_walk *p, __u64 str, char *out,
					  __u32 cap, int tail)
{
	__u64 len, n, from;

	if (!str || bpf_probe_read_user(&len, 8, (void *)(str + p->proc.str_len)))
		return 0;
	if (len == 0 || len > 0xFFFF)
		return 0;
	n = len < cap ? len : cap;
	from = str + p->proc.str_val + (tail && len > cap ? len - cap : 0);
	if (n == 0 || n > cap || bpf_probe_read_user(out, n, (void *)from))
		return 0;
	return len;
}

/* the id of the function at `func` (its head in p->fn_bytes) as it is
 * now: the one it was given while its identity is the same, else a new
 * one whose names go into PHP_NAMES first; PHP_NOT_READ where they
 * cannot be kept */
static __always_inline __u64 php_function_id(struct php_walk *p, __u64 func, __u8 type,
					     __u64 filename, __u32 line_start)
{
	struct php_function_key key = { .tgid = p->tgid, .func = func };
	struct php_name_key name_key = { .tgid = p->tgid };
	struct php_function_id *seen, fresh;
	struct php_name *n = &p->fresh;
	__u64 name, scope;

	name = FN_FIELD(__u64, p, p->proc.fn_name);
	scope = FN_FIELD(__u64, p, p->proc.fn_scope);
	fresh.identity = mix(mix(mix(mix(FNV_BASIS ^ type, name), scope), filename), line_start);
	seen = bpf_map_lookup_elem(&php_functions, &key);
	if (seen && seen->identity == fresh.identity)
		return seen->id;
	/* unique without a shared counter: this CPU's count, then the CPU */
	p->ids++;
	fresh.id = ((p->ids << PHP_ID_CPU_BITS) | (bpf_get_smp_processor_id() % 4095)) & PHP_ID_MASK;
	n->type = type;
	n->line_start = line_start;
	n->name_len = php_copy_str(p, name, n->name, PHP_NAME_COPY, 0);
	n->scope_len = scope ? php_copy_str(p, php_word_at(scope + p->proc.ce_name),
					    n->scope, PHP_NAME_COPY, 0) : 0;
	n->file_len = php_copy_str(p, filename, n->file, PHP_FILE_COPY, 1);
	name_key.id = fresh.id;
	if (bpf_map_update_elem(&php_names, &name_key, n, BPF_ANY))
		return PHP_NOT_READ;	/* full: user space has not taken them out */
	bpf_map_update_elem(&php_functions, &key, &fresh, BPF_ANY);
	return fresh.id;
}

/* a word of the merged stack into w */
static __always_inline void php_emit(struct walk *w, struct php_walk *p, __u64 word)
{
	__u64 at = p->out;

	if (at >= MAX_FRAMES) {
		p->cut = 1;
		return;
	}
	w->frame[at & (MAX_FRAMES - 1)] = word;
	p->hash = at ? mix(p->hash, word) : mix(FNV_BASIS, word);
	p->out = at + 1;
}

/* the PHP frame at p->ed into the merged stack; whether its execute_ex
 * call's group ends with it. p->ed moves to the next; 0 and
 * p->unreadable when it could not be read */
static __always_inline int php_frame(struct walk *w, struct php_walk *p)
{
	struct php_object *o = &p->proc;
	__u64 ed = p->ed, func, opline, filename = 0, id, where[2];
	__u32 line = 0, line_start = 0, info;
	__u8 type;

	if (bpf_probe_read_user(p->ed_bytes, PHP_ED_READ, (void *)ed)) {
		p->unreadable = 1;
		p->ed = 0;
		return 1;
	}
	p->ed = ED_FIELD(__u64, p, o->ed_prev);
	info = ED_FIELD(__u32, p, o->ed_call_info);
	func = ED_FIELD(__u64, p, o->ed_func);
	if (!func)		/* a frame without a function: not shown */
		return (info & o->call_top) != 0;
	if (bpf_probe_read_user(p->fn_bytes, PHP_FN_READ, (void *)func)) {
		p->unreadable = 1;
		p->ed = 0;
		return 1;
	}
	type = p->fn_bytes[0];
	if (type == o->user_function) {
		/* the op_array's filename and line_start, 8 bytes apart: one read */
		if (o->fn_line_start == o->fn_filename + 8
		    && !bpf_probe_read_user(where, sizeof(where), (void *)(func + o->fn_filename))) {
			filename = where[0];
			line_start = (__u32)where[1];
		}
		opline = ED_FIELD(__u64, p, o->ed_opline);
		if (!opline || bpf_probe_read_user(&line, 4, (void *)(opline + o->op_lineno)))
			line = 0;
	}
	id = php_function_id(p, func, type, filename, line_start);
	php_emit(w, p, PHP_TAG | id << 16 | (line > PHP_LINE_MAX ? PHP_LINE_MAX : line));
	p->php_frames++;
	return (info & o->call_top) != 0;
}

static __always_inline int in_execute(struct php_object *o, __u64 q)
{
	return q >= o->execute_start && q < o->execute_end;
}

/* bpf_loop's callback: one word of the merged stack (or the start of an
 * execute_ex call's PHP frames); 1 stops */
static long php_merge_step(__u64 index, void *unused)
{
	struct php_walk *p = php_state();
	struct walk *w = scratch_value();
	__u64 pc, i;

	if (!p || !w || p->cut)
		return 1;
	if (p->in_group) {
		if (!p->ed || php_frame(w, p))
			p->in_group = 0;
		return 0;
	}
	i = p->next;
	if (i >= p->nnative)
		return 1;
	p->next = i + 1;
	pc = p->native[i & (MAX_FRAMES - 1)];
	if (in_execute(&p->proc, i ? pc - 1 : pc)) {
		if (p->skip) {
			p->skip--;	/* shown as C: see php_pass */
		} else if (p->ed) {
			p->in_group = 1;	/* replaced by its PHP frames */
			return 0;
		} else {
			p->missing++;
		}
	}
	php_emit(w, p, pc);
	return 0;
}

/* the merged stack into w's frames, the `skip` innermost execute_ex
 * frames left as C; `ed`: the current zend_execute_data */
static __always_inline void php_merge(struct php_walk *p, __u64 ed, __u64 skip)
{
	p->ed = ed;
	p->next = p->out = p->in_group = p->missing = p->cut = p->php_frames = 0;
	p->skip = skip;
	p->hash = FNV_BASIS;
	bpf_loop(PHP_MAX_WORDS, php_merge_step, 0, 0);
}

/* PHP frames into the walked stack w of the current task, when the walk
 * went through an interpreter object of PHP_OBJECTS; the stack's frames,
 * hash and (for a note) status change. */
static __noinline void php_pass(struct walk *w)
{
	struct php_walk *p;
	struct php_object *o;
	__u32 slot;
	__s64 adjust;
	__u64 n, ed;

	if (!w || !w->php)
		return;		/* through no PHP interpreter: no map looked up */
	p = php_state();
	if (!p)
		return;
	slot = w->php - 1;
	o = bpf_map_lookup_elem(&php_objects, &slot);
	if (!o || !o->version)
		return;
	/* the object's ELF addresses as this process maps them */
	adjust = w->php_adjust;
	p->proc = *o;
	p->proc.executor_globals -= adjust;
	p->proc.execute_start -= adjust;
	p->proc.execute_end -= adjust;
	ed = php_word_at(p->proc.executor_globals + p->proc.eg_current_execute_data);
	if (!ed)
		return;
	n = w->rec.head.frames;
	if (n > MAX_FRAMES)
		n = MAX_FRAMES;
	if (n == 0 || bpf_probe_read_kernel(p->native, n * 8, w->frame))
		return;
	p->nnative = n;
	p->tgid = bpf_get_current_pid_tgid() >> 32;
	p->unreadable = 0;
	php_merge(p, ed, 0);
	if (p->missing && !p->unreadable)
		php_merge(p, ed, p->missing);
	if (!p->php_frames)		/* none merged: the frames were written as walked */
		return;
	w->rec.head.frames = p->out;
	w->hash = p->hash;
	if (w->rec.head.status != COMPLETE && w->rec.head.status != THROUGH_JIT
	    && w->rec.head.status != THROUGH_NO_CFI)
		return;			/* cut short: its own reason says more */
	if (p->cut)
		w->rec.head.status = TRUNCATED;
	else if (p->unreadable || p->missing)
		w->rec.head.status = PHP_UNREADABLE;
	else if (p->ed && p->next >= p->nnative)
		w->rec.head.status = PHP_LEFT;
}

#endif
