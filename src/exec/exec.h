/*
 * src/exec/exec.h -- an executable's layout, shared by the interpreter (exec.c) and the
 * native tier (codegen.c, native.c). Not API.
 */
#ifndef NABLA_SRC_EXEC_EXEC_H
#define NABLA_SRC_EXEC_EXEC_H

#include "ad/ir.h"

/* The entry point of an executable's native code (codegen.c writes it as nbx_run): runs
 * every instruction, as nbi_exec_run_raw's loop does, with outputs placed by direct[]. */
struct nbi_native_env;
typedef void (*nbi_native_fn)(const struct nbi_native_env *env, const void *const *in,
                              void *const *out, const bool *direct);

typedef struct nbi_instr {
    int32_t node; /* index into nodes */
    int32_t n_in;
    int32_t *in;     /* value (node) indices of the inputs */
    int32_t n_store; /* a fused node's stored values: */
    int32_t *store;  /* the fused_output node of each (-1: none left) */
    /* Where each input and the output are when that is fixed at compile time (a value in
     * the workspace that is not an output of the executable), else NULL: found per run. */
    const void **fixed_in;
    void *fixed_out;
} nbi_instr;

struct nbi_exec {
    nb_ctx *ctx;
    int64_t refcount;
    int32_t n_nodes;
    nb_var *nodes;     /* copies; in[] point into this array */
    int64_t *offset;   /* per node: workspace offset, or -1 for a parameter */
    int32_t *param_of; /* per node: the input index of a PARAM node, else -1 */
    int32_t n_instrs;
    nbi_instr *instrs;
    /* Instructions [0, n_pre) depend only on the first inputs (the graph's n_fixed, a
     * callee's bound data) and constants; their values read later keep their slots to the
     * end: a loop runs them once (nbi_exec_run_step). */
    int32_t n_pre;
    int32_t n_inputs;
    int32_t n_outputs;
    int32_t *outputs;   /* node index of each output (always a workspace value) */
    int32_t *out_instr; /* per output: the instruction that makes it */
    int32_t *out_first; /* per output: the first output with the same node */
    int32_t *out_of;    /* per node: the first output it is, or -1 */
    /* per input: 2t for the last instruction t reading it, 2t + 1 when that instruction
     * reads it through an alias (alias_of), or -1 */
    int32_t *param_last;
    /* per node: the value whose bytes native code reads it from (a reshape, or a contiguous
     * dynamic slice, of that value: nbi_native_codegen writes a pointer, not a copy), or -1.
     * The root is kept (not written over, not taken over in place) until the alias's last
     * reader. The interpreter still copies. */
    int32_t *alias_of;
    int64_t *param_bytes; /* per input: its data bytes (0 when unused) */
    int32_t *param_node;  /* per input: its PARAM node, or -1 */
    bool *out_direct;     /* per output, per run: written into the caller's buffer (in ws) */
    int32_t *in_hash;     /* donated runs: inputs by data pointer (in ws; hash_mask + 1 heads) */
    int32_t *in_next;     /* ... and the chain through inputs sharing a bucket */
    uint32_t hash_mask;
    /* The last donated run's input and output pointers and donation flags (in ws): the
     * output plan is reused while they stay the same. */
    const void **last_io;
    bool last_valid;
    /* The outputs the planned run copies into the caller's buffers (not direct, not
     * empty), in ws; set with out_direct. */
    int32_t *copy_out;
    int32_t n_copy_out;
    int32_t max_in;
    size_t ws_bytes;    /* planned values */
    size_t scratch_off; /* kernel scratch, after the values */
    size_t scratch_bytes;
    unsigned char *ws; /* ws_bytes + scratch + pointer tables, 64-byte aligned */
    size_t ws_alloc;
    const void **in_ptrs; /* max_in entries, inside ws */
    const void **io_in;   /* n_inputs entries, inside ws (nbi_exec_run) */
    void **io_out;        /* n_outputs entries, inside ws */
    void *mem;            /* one allocation for nodes, tables, instrs */
    nbi_pool *pool;       /* the context's threads, or NULL */
    int n_workers;        /* threads that may run a kernel's tasks (scratch slices) */
    size_t mem_bytes;
    unsigned debug; /* NBI_DEBUG_*: every instruction's result checked (run_raw) */
    /* The native tier (native.c): the compiled function, when one is installed, and its
     * state; owned and changed by the context's thread only (a background compile hands
     * its result over through the job). */
    nbi_native_fn native_fn;
    struct nbi_native *native;
    char *dbg_strings; /* debug: the nodes' fn and path strings, copied (fn, path) */
    size_t dbg_bytes;
};

/* The native tier (native.c); nbi_native_attach is declared in ir.h. */
/* Called by nbi_exec_run_raw before a run of an executable with e->native set and no
 * native code yet: counts runs, queues a hot executable, installs a finished background
 * compile. */
NBI_HIDDEN void nbi_native_tick(nbi_exec *e);
/* Free e's native state (nbi_exec_destroy). */
NBI_HIDDEN void nbi_native_release(nbi_exec *e);
/* The running call wants the interpreter (nbi_native_set_interp_only). */
NBI_HIDDEN bool nbi_native_interp_only(void);
/* NABLA_NATIVE=check is set. */
NBI_HIDDEN bool nbi_native_checking(void);
/* Run e's native code (installed) with e->out_direct as planned. */
NBI_HIDDEN void nbi_native_run(const nbi_exec *e, const void *const *inputs, void *const *outputs);
/* Check mode: run the native code into scratch outputs (before the interpreter runs), and
 * after it compare them with the interpreter's; a difference is recorded as the run's
 * failure. begin returns the scratch (NULL: no check this run). */
NBI_HIDDEN void *nbi_native_check_begin(const nbi_exec *e, const void *const *inputs);
NBI_HIDDEN void nbi_native_check_end(const nbi_exec *e, void *scratch, void *const *outputs);
/* The C source of e's native code (snprintf contract through s; codegen.c). */
NBI_HIDDEN void nbi_native_codegen(const nbi_exec *e, nbi_sbuf *s);
/* The executables whose code nbi_native_codegen writes into e's file as functions of their
 * own (the cond and body of every while loop, a checkpointed reversal's cond, body and step
 * vjp, each loop's together and once; the loops inside them after all of e's), in the
 * order of the environments the generated code expects (nbx_env.sub): their count, and
 * the first cap of them into out (may be NULL). 0 when the whole would be too large to
 * compile (then every loop is a kernel call). */
NBI_HIDDEN int32_t nbi_native_subs(const nbi_exec *e, const nbi_exec **out, int32_t cap);
/* Is loop node v of e written out in e's file (its executables among nbi_native_subs)? */
NBI_HIDDEN bool nbi_native_loop_inlined(const nbi_exec *e, const nb_var *v);
#define NBI_NATIVE_MAX_SUBS 64 /* at most this many (more: 0) */

#endif /* NABLA_SRC_EXEC_EXEC_H */
