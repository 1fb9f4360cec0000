/* The runtimes' passes by tail calls (capture/runtime_passes.py loads
 * them as the run meets their runtimes): a walk's program keeps what the
 * end of its event needs (keep_event, or its own maps), then goes on in
 * the first pass of a runtime the walk met (passes_from); each pass goes
 * on in the next, and the last ends the event as the walk's program
 * would. A pass is verified only in its own program, once the run meets
 * its runtime: the five cost every program that held them inline tens of
 * ms of verifier time. A stack that met a runtime whose pass is not in
 * PASSES ends PASS_MISSING.
 * The including file has its RING (python.h's code records) and, after
 * this header, instantiates PASS_PROGRAMS(done, none) with its own end of
 * the event: `done(ctx, w, next)` goes on with passes_from(ctx, w, next)
 * and ends it; `none` is what a program returns without a scratch value. */
#ifndef USTACK_PASSES_H
#define USTACK_PASSES_H

/* the runtimes' pass programs (enum pass_slot), loaded as the run meets
 * their runtimes */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__type(key, enum pass_slot);
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, PASS_SLOTS);
} passes SEC(".maps");

/* the pass in `slot`, tail-called: returns only when it is not loaded
 * (the run met its runtime, its pass failed to load), which the stack
 * says rather than lose its frames silently */
static __always_inline void pass_call(void *ctx, struct walk *w, enum pass_slot slot)
{
	enum unwind_status status;

	bpf_tail_call(ctx, &passes, slot);
	status = w->rec.head.status;
	if (status == COMPLETE || status == THROUGH_JIT || status == THROUGH_NO_CFI)
		w->rec.head.status = PASS_MISSING;
}

/* goes on in the first pass from `from` on whose runtime the walk met
 * (the inline order: V8, Perl, Ruby, Python, PHP); returns when none is left */
static __always_inline void passes_from(void *ctx, struct walk *w, enum pass_slot from)
{
	if (from <= PASS_V8 && w->v8)
		pass_call(ctx, w, PASS_V8);
	if (from <= PASS_PERL && w->perl)
		pass_call(ctx, w, PASS_PERL);
	if (from <= PASS_RUBY && w->ruby)
		pass_call(ctx, w, PASS_RUBY);
	if (from <= PASS_PYTHON && w->python)
		pass_call(ctx, w, PASS_PYTHON);
	if (from <= PASS_PHP && w->php)
		pass_call(ctx, w, PASS_PHP);
}

/* what the pass programs need of the event, kept in w (a tail call
 * keeps only ctx) */
static __always_inline void keep_event(struct walk *w, __u64 pid_tgid, __u32 probe,
				       __s32 kernel_stack, __u64 weight)
{
	w->rec.pid_tgid = pid_tgid;
	w->rec.probe = probe;
	w->kernel_stack = kernel_stack;
	w->weight = weight;
}

/* one program per runtime: its pass on the stack the walk's program left
 * in the scratch value, then `done` */
#define PASS_PROGRAMS(done, none)					\
SEC("event")								\
int pass_v8(void *ctx)							\
{									\
	struct walk *w = scratch_value();				\
									\
	if (!w)								\
		return none;						\
	v8_pass(w, w->rec.pid_tgid);					\
	return done(ctx, w, PASS_PERL);					\
}									\
									\
SEC("event")								\
int pass_perl(void *ctx)						\
{									\
	struct walk *w = scratch_value();				\
									\
	if (!w)								\
		return none;						\
	perl_merge(w, w->rec.pid_tgid);					\
	return done(ctx, w, PASS_RUBY);					\
}									\
									\
SEC("event")								\
int pass_ruby(void *ctx)						\
{									\
	struct walk *w = scratch_value();				\
									\
	if (!w)								\
		return none;						\
	ruby_pass(w);							\
	return done(ctx, w, PASS_PYTHON);				\
}									\
									\
SEC("event")								\
int pass_python(void *ctx)						\
{									\
	struct walk *w = scratch_value();				\
									\
	if (!w)								\
		return none;						\
	python_pass(w, &ring, w->rec.pid_tgid, w->rec.probe);		\
	return done(ctx, w, PASS_PHP);					\
}									\
									\
SEC("event")								\
int pass_php(void *ctx)							\
{									\
	struct walk *w = scratch_value();				\
									\
	if (!w)								\
		return none;						\
	php_pass(w);							\
	return done(ctx, w, PASS_SLOTS);				\
}

#endif
