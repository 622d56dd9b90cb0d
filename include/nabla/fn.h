/*
 * nabla/fn.h -- functions, filtered jit, the compile cache and trace accounting.
 *
 * An nb_fn is a C function (the body) plus a bound pytree of data (self) and a name: the C
 * form of a closure, or of an Equinox Module with __call__. Calling an nb_fn on an argument
 * tree traces the body into IR, compiles it into an executable, caches it, and runs it;
 * later calls with the same *signature* run the cached executable on new data.
 *
 * What is static and what is dynamic (docs/semantics.md, section 2, says the same at more
 * length; installed as share/doc/nabla/semantics.md):
 *   - array leaves of the arguments and of self are dynamic: traced as inputs, seen by the
 *     cache only as (dtype, shape);
 *   - everything else is static: tree structure, null leaves, static leaves (ints, floats,
 *     bools, strings, function references), compared by value.
 * The cache key is the body pointer + the static part of self + the static part of the
 * arguments + (dtype, shape) of every dynamic leaf + the jit options; a hit compares the
 * whole key, never just its hash. Two nb_fns made separately from the same body with equal
 * self data share their cache entries. A traced value is never hashed.
 *
 * A body's only inputs are args and self: a C global (an option, a flag) read by the body
 * is read once, at trace time, and its value is compiled in -- later calls do not see it
 * change. Pass such a value as a static leaf of args or self (a new value then retraces,
 * and the reason names it), or as an array (data). nb_jit_opts.debug_retrace finds such
 * reads.
 *
 * Outputs: array outputs always come back as new arrays owned by the caller -- also those
 * that constant folding turned into constants and those that are inputs passed through;
 * static outputs come back as the static values seen at trace time.
 *
 * Inside another trace, calling a function inlines its body into the outer IR by default;
 * a function made by nb_jit with inline_calls = false instead becomes a call to its own
 * cached sub-executable (one compile for a layer used many times). Both give the same
 * numbers, to the last bits except where a rewrite would reach across the call (a product
 * the callee returns and the caller sums over its rows: docs/semantics.md section 9).
 *
 * Trace accounting: per function (per cache identity: body + static self), the number of
 * traces, cache hits and, for every retrace, the reason -- the path of the leaf that
 * changed and how ("args[1]: static 3 → 4", "batch.x: f32[128,784] → f32[64,784]",
 * "opt_state.mu.w1: was null, now f32[256,784]"). nb_max_traces wraps a function so that
 * its (N+1)-th trace is an error carrying that reason, whether it wraps a jitted function
 * or is itself wrapped by one: it counts traces of its own body, so both orders give the
 * same count and both catch the retrace.
 */
#ifndef NABLA_FN_H
#define NABLA_FN_H

#include "array.h"
#include "core.h"
#include "trace.h"
#include "tree.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_fn nb_fn;

/* The body of a function. self is the bound data and args the argument tree, both with
 * their array leaves replaced by vars (borrowed, valid during the call). Build the output
 * tree from var leaves (nb_leaf / nb_return), static leaves and nodes, and set *out to a
 * new reference. Return NB_OK, or an error status (the trace's sticky error wins if set). */
typedef nb_status (*nb_fn_body)(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out);

/* ---- lifecycle ---------------------------------------------------------------------- */
/* A function from body, with bound data self (borrowed; may be NULL for none) and a name
 * for messages (copied; NULL gives "fn"). Returns a new reference. Allocates. */
NB_API nb_status nb_fn_create(nb_ctx *ctx, const char *name, nb_fn_body body, const nb_tree *self,
                              nb_fn **out);
NB_API nb_fn *nb_fn_retain(nb_fn *f);
/* NB_OK for a live function, NB_ERR_MISUSE for NULL or destroyed (a destroyed handle also
 * records why on its context). */
NB_API nb_status nb_fn_check(const nb_fn *f);
/* Release a reference. The cache keeps what it compiled (keyed by value, not by this
 * object), so destroying and re-creating an equal function costs no retrace. */
NB_API void nb_fn_destroy(nb_fn *f);
NB_API const char *nb_fn_name(const nb_fn *f); /* borrowed; "" for NULL */

/* ---- jit ---------------------------------------------------------------------------- */
typedef struct nb_jit_opts {
    /* When > 0, the (max_traces+1)-th trace of this function is an error (NB_ERR_RETRACE)
     * naming the leaf that changed. Default 0: unlimited. */
    int max_traces;
    /* Inside another trace: true (default) inlines the body; false keeps a call to this
     * function's own cached executable. */
    bool inline_calls;
    /* Debugging (JAX's jax_debug_nans / jax_debug_infs), default false. The function is
     * compiled without fusion and every op's result is checked as it is made: the first
     * float result holding a NaN (debug_nans; also an integer division by zero) or an
     * infinity (debug_infs) fails the call with NB_ERR_RUNTIME, naming the op, its IR
     * location (%N in nb_fn_format_ir's traced IR), the function that traced it, the
     * element, and the leaf paths of the inputs it depends on. Functions traced inside it
     * (loop bodies, non-inlined calls) are checked too. The environment variables
     * NABLA_DEBUG_NANS=1 and NABLA_DEBUG_INFS=1 turn the same checks on for every function
     * (read once per process). Nothing is checked, and nothing costs, when both are off.
     * A value made by constant folding at compile time is not checked. */
    bool debug_nans;
    bool debug_infs;
    /* Debugging: on every call served from the cache, trace the body again and compare the
     * IR with the one compiled; a difference fails the call with NB_ERR_RUNTIME naming the
     * first differing line. It catches a body that reads something besides its arguments
     * and bound data -- a C global, a static variable -- that changed since it was traced
     * (whose old value the compiled code still uses). NABLA_DEBUG_RETRACE=1 turns it on
     * for every function. Each call costs a trace; off by default. */
    bool debug_retrace;
    /* Which tier runs the compiled code (see "Native code" in docs/semantics.md):
     * NB_NATIVE_AUTO (default): the interpreter, until an executable has run often enough
     * to be worth compiling; then it is compiled to machine code (generated C, the system
     * C compiler) on a background thread and swapped in between calls. A warm disk cache
     * gives the native code from the first call. NB_NATIVE_OFF: the interpreter only.
     * NB_NATIVE_NOW: compiled natively when the function is compiled (the first call
     * waits). Both tiers give the same bits. With no C compiler, or when compiling fails,
     * the interpreter runs (the reason is logged at NB_LOG_LEVEL_WARN). The environment variable
     * NABLA_NATIVE=off|auto|now overrides AUTO for every function (read once). */
    int native;
} nb_jit_opts;

/* nb_jit_opts.native */
enum { NB_NATIVE_AUTO = 0, NB_NATIVE_OFF = 1, NB_NATIVE_NOW = 2 };

NB_API nb_jit_opts nb_jit_opts_default(void);

/* A jitted version of f (a new function wrapping it; f is borrowed and retained). Calling
 * it behaves like calling f, with the options above. */
NB_API nb_status nb_jit(nb_fn *f, const nb_jit_opts *opts, nb_fn **out);
/* A wrapper that fails the (n+1)-th trace of its own body with NB_ERR_RETRACE; usable
 * outside or inside nb_jit with the same count. n >= 1. */
NB_API nb_status nb_max_traces(nb_fn *f, int n, nb_fn **out);

/* ---- calling ------------------------------------------------------------------------ */
typedef struct nb_call_opts {
    /* Donated inputs: NULL (none), or a tree of args' structure with bool leaves (true:
     * donate that array; nulls and other leaves: not donated), or a single bool leaf
     * (true: donate every array). A donated array may be overwritten with an output of the
     * same dtype and shape, which is then returned as that same array -- so a training
     * step updates parameters in place (an output subtree whose every array went back into
     * the args subtree it came from, with the same static structure, is returned as that
     * args subtree itself, retained). Donation never changes results: where the output
     * is made while the array is still to be read, it is made elsewhere and copied in.
     * Do not read a donated array's data after the call except through the outputs. */
    const nb_tree *donate;
} nb_call_opts;

NB_API nb_call_opts nb_call_opts_default(void);

/* Call f on args (borrowed) outside any trace: look up the cache, trace and compile on a
 * miss, run. *out is a new tree: the output structure with new arrays at dynamic leaves.
 * Returns NB_OK; NB_ERR_MISUSE; the status of a failed trace (with its message: op,
 * shapes, function, path); NB_ERR_RETRACE when max_traces is exceeded; NB_ERR_OOM.
 * Allocates (traces, executables, output arrays). */
NB_API nb_status nb_fn_call(nb_fn *f, const nb_tree *args, nb_tree **out);
NB_API nb_status nb_fn_call_ex(nb_fn *f, const nb_tree *args, const nb_call_opts *opts,
                               nb_tree **out);

/* Eager use in one call: the same as nb_fn_create(ctx, "eval", body, self) + nb_fn_call +
 * nb_fn_destroy. Tracing and compiling go through the cache (keyed by body and the static
 * parts, as always), so calling again on arguments of the same signature only runs the
 * cached executable. Statuses as nb_fn_call. */
NB_API nb_status nb_eval(nb_ctx *ctx, nb_fn_body body, const nb_tree *self, const nb_tree *args,
                         nb_tree **out);

/* Call f inside a body being traced: args hold vars (and static leaves); returns the
 * output tree (owned by the trace, freed with it), or NULL after a sticky error. */
NB_API const nb_tree *nb_apply(nb_trace *tr, nb_fn *f, const nb_tree *args);
/* The common case of one var in, one var out: f is called on the 1-tuple (x) and must
 * return a single var leaf. */
NB_API nb_var *nb_apply1(nb_trace *tr, nb_fn *f, nb_var *x);

/* ---- accounting and introspection --------------------------------------------------- */
typedef struct nb_fn_stats {
    int64_t n_calls;    /* calls from outside a trace */
    int64_t n_traces;   /* traces of this function's body */
    int64_t n_hits;     /* calls served from the cache without tracing */
    int64_t n_retraces; /* traces after the first */
    /* Workspace bytes of the executable the last call ran (its planned intermediates and
     * kernel scratch: the peak memory of a run beyond inputs and outputs). */
    size_t workspace_bytes;
    /* The tier that ran the last call's executable: 0 the interpreter, 1 native code. */
    int tier;
    int64_t n_native; /* calls run by native code */
} nb_fn_stats;

/* Counters of f's cache identity (shared by equal functions). Never allocates. */
NB_API nb_status nb_fn_stats_get(const nb_fn *f, nb_fn_stats *out);
/* The reason of retrace i (0-based, i < n_retraces), snprintf contract. */
NB_API nb_status nb_fn_retrace_reason(const nb_fn *f, int64_t i, char *buf, size_t cap,
                                      size_t *needed);

/* Drop every compiled executable and all trace accounting of ctx (as jax.clear_caches).
 * Functions stay valid; their next call traces again. NULL is a no-op. */
NB_API void nb_ctx_clear_cache(nb_ctx *ctx);

enum {
    NB_IR_TRACED = 0,    /* the IR as traced */
    NB_IR_OPTIMIZED = 1, /* after constant folding, CSE and DCE: what is compiled */
    NB_IR_NATIVE_C = 2   /* the C source the native tier compiles for it (nb_jit_opts.native) */
};
/* Trace f on args (no cache, no run) and print its IR in the stable text form used by the
 * golden tests, or the native tier's C source. snprintf contract. */
NB_API nb_status nb_fn_format_ir(nb_fn *f, const nb_tree *args, int which, char *buf, size_t cap,
                                 size_t *needed);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_FN_H */
