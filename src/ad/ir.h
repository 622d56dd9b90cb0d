/*
 * src/ad/ir.h -- the IR: nodes (vars), graphs, the op registry, arenas. Not API.
 *
 * A graph is a flat SSA list of nodes in topological order. Each node is one primitive op
 * with its inputs (earlier nodes), attributes, and the dtype and shape of its one output.
 * Graphs live in an arena freed as a whole. Every pass is graph -> graph.
 */
#ifndef NABLA_SRC_AD_IR_H
#define NABLA_SRC_AD_IR_H

#include "core/internal.h"

#include <nabla/fn.h>
#include <nabla/trace.h>

#include <string.h>

/* ---- arenas ------------------------------------------------------------------------- */
typedef struct nbi_arena_chunk nbi_arena_chunk;
typedef struct nbi_arena_ref nbi_arena_ref;
typedef struct nbi_arena {
    nb_ctx *ctx;
    nbi_arena_chunk *head;
    nbi_arena_ref *refs; /* arrays, trees and functions released with the arena */
    size_t used_total;
} nbi_arena;

NBI_HIDDEN void nbi_arena_init(nbi_arena *a, nb_ctx *ctx);
/* size bytes aligned to 16, zeroed; NULL on OOM (no message recorded). */
NBI_HIDDEN void *nbi_arena_alloc(nbi_arena *a, size_t size);
/* The same, not zeroed: for memory the caller fills completely (a node copied from its
 * prototype, an array copied over). */
NBI_HIDDEN void *nbi_arena_alloc_raw(nbi_arena *a, size_t size);
/* Hand a reference to the arena: released by nbi_arena_free_all. On OOM the reference is
 * released at once and false returned. */
NBI_HIDDEN bool nbi_arena_own_array(nbi_arena *a, nb_array *x);
NBI_HIDDEN bool nbi_arena_own_tree(nbi_arena *a, nb_tree *t);
NBI_HIDDEN bool nbi_arena_own_fn(nbi_arena *a, nb_fn *f);
NBI_HIDDEN void nbi_arena_free_all(nbi_arena *a);

/* ---- ops ---------------------------------------------------------------------------- */
typedef enum nbi_op {
#define NBI_OP(NAME, name, family) NBI_OP_##NAME,
#include "ops.def"
#undef NBI_OP
    NBI_OP_COUNT
} nbi_op;

/* Node flags. */
enum {
    NBI_NODE_WEAK = 1u << 0,   /* a weak scalar: takes the other operand's dtype */
    NBI_NODE_POISON = 1u << 1, /* the trace's error value */
};

typedef struct nbi_attrs {
    int32_t axes[NB_MAX_RANK]; /* reduce/squeeze axes, transpose perm */
    int32_t n_axes;
    int32_t axis; /* concat/stack/take/argmax/iota/expand_dims axis */
    bool keepdims;
    int64_t a[NB_MAX_RANK]; /* slice start, pad lo, dynamic-slice sizes */
    int64_t b[NB_MAX_RANK]; /* slice stop, pad hi */
    int64_t c[NB_MAX_RANK]; /* slice step */
    double value;           /* full/pad value */
    int64_t ivalue;         /* param index, one_hot depth, output index of a call */
    nb_dtype to;            /* cast / one_hot dtype */
    nb_array *array;        /* constant data (a reference held by the graph's owner) */
    void *callee;           /* call: the sub-executable (nbi_exec *); while: the body's */
    void *callee2;          /* while, loop_reverse: the cond's executable */
    void *callee3;          /* loop_reverse: the body's executable (callee: its vjp's) */
} nbi_attrs;

struct nb_var {
    uint16_t op;
    uint8_t flags;
    int8_t rank;
    nb_dtype dtype;
    int32_t id; /* position in its graph */
    int32_t n_in;
    nb_var **in;
    int64_t shape[NB_MAX_RANK];
    int64_t size;
    nbi_attrs at;
    nb_trace *tr;     /* the trace that built it (NULL in graphs made by passes) */
    const char *path; /* a param's leaf path ("args[0]", "self.layers[1].w"), or NULL */
    const char *fn;   /* the function being traced when it was made (trace lifetime) */
    int32_t src;      /* its id in the traced graph (copies made by passes keep it) */
};

/* A graph: nodes in topological order; inputs are the PARAM nodes in parameter order;
 * outputs may repeat nodes and may be inputs or constants. */
typedef struct nbi_graph {
    nbi_arena *arena;
    nb_var **nodes;
    int32_t n_nodes, cap_nodes;
    nb_var **inputs;
    int32_t n_inputs;
    nb_var **outputs;
    int32_t n_outputs;
    /* The first n_fixed inputs are a callee's bound data: the same in every step of a loop
     * whose body it is (nbi_exec_run_step runs what depends only on them once). */
    int32_t n_fixed;
} nbi_graph;

NBI_HIDDEN nb_status nbi_graph_init(nbi_graph *g, nbi_arena *arena);
/* Append a node (copied into the arena, inputs array included) and return the copy. */
NBI_HIDDEN nb_var *nbi_graph_add(nbi_graph *g, const nb_var *proto);

/* The bytes a value takes as one of several leaves packed in a buffer: its data rounded up
 * to 64 (a loop's state and an executable's outputs lie at 64-byte offsets). */
static inline size_t nbi_leaf_bytes(const nb_var *v) {
    return ((size_t)v->size * nbi_dsize(v->dtype) + 63) / 64 * 64;
}

/* The kernel's view of one node at run time. */
typedef struct nbi_kargs {
    const nb_var *node;    /* dtype, shape, attrs of the output; node->in for inputs */
    void *out;             /* output buffer (node->size elements) */
    const void *const *in; /* input buffers, node->n_in of them */
    void *scratch;         /* scratch_bytes(node) bytes, 64-byte aligned */
    nbi_pool *pool;        /* the context's threads (NULL: run serially) */
    int n_workers;         /* scratch holds this many per-worker slices of scratch_fn bytes */
    void *const *outs;     /* a fused node's stored values: fused_output k's buffer (NULL: none) */
} nbi_kargs;

/* Split n items into chunks of `chunk` (a size fixed by the data, never by the thread
 * count) and run fn(ud, first, count) on each, on the pool. Serial when the pool is NULL
 * or there is one chunk. */
typedef void (*nbi_range_fn)(void *ud, int64_t first, int64_t count, int worker);
NBI_HIDDEN void nbi_par_range(nbi_pool *pool, int64_t n, int64_t chunk, nbi_range_fn fn, void *ud);

typedef void (*nbi_kernel_fn)(const nbi_kargs *k);

/* Reverse mode: given node and ct, the cotangent of its output (same dtype and shape),
 * set in_ct[i] to the cotangent contribution of input i (as more IR, built with the public
 * builders), or leave it NULL where input i gets none (non-differentiable inputs, inputs
 * whose contribution is zero). in_ct has node->n_in entries, all NULL on entry. Rules undo
 * broadcasting (nbi_unbroadcast). */
typedef void (*nbi_vjp_fn)(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct);
/* Forward mode: given the tangents of node's inputs (NULL: zero or not differentiable),
 * return the tangent of its output, or NULL for zero. */
typedef nb_var *(*nbi_jvp_fn)(nb_trace *tr, nb_var *node, nb_var *const *tan);
/* Batching (nb_vmap, vmap.c): given node and its inputs batched over B lanes -- bin[i] the
 * batched value of input i, with the batch on axis 0 (shape [B] + the input's shape), or
 * NULL where input i is the same for every lane (node->in[i]) -- return the batched output,
 * batch on axis 0. Built with the public builders and nbi_emit. */
typedef nb_var *(*nbi_vmap_fn)(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B);
/* Shape and dtype inference for a prototype node whose op, inputs and attrs are set: fill
 * proto->dtype, rank, shape, or return an error through nbi_trace_err. */
typedef nb_status (*nbi_infer_fn)(nb_trace *tr, nb_var *proto);
typedef size_t (*nbi_scratch_fn)(const nb_var *node);

typedef struct nbi_op_info {
    const char *name;
    int n_in;               /* -1: variadic */
    nbi_infer_fn infer;     /* NULL: the builder fills the shape itself */
    nbi_kernel_fn kernel;   /* NULL: no kernel (params, constants: handled by the executor) */
    nbi_scratch_fn scratch; /* NULL: no scratch */
    uint32_t nondiff;       /* bit i: input i has no gradient */
    bool elementwise;       /* same-shape map of broadcast inputs (a fusion candidate) */
    nbi_vjp_fn vjp;         /* NULL: the op has no gradient (integer/bool output, markers) */
    nbi_jvp_fn jvp;         /* NULL likewise */
    nbi_vmap_fn vmap;       /* NULL: not batched yet (nb_vmap fails naming the op) */
} nbi_op_info;

/* Has input j of an op of this kind no gradient? (nondiff holds inputs 0..31; a variadic
 * op's later inputs -- a loop's 33rd carry leaf -- are differentiable.) */
static inline bool nbi_input_nondiff(const nbi_op_info *info, int32_t j) {
    return j < 32 && ((info->nondiff >> j) & 1u) != 0;
}

/* Is v a full whose every element is all-zero bits (0, +0.0, false)? A loop's carry that
 * starts so is cleared rather than copied from the full's buffer. */
static inline bool nbi_is_zero_fill(const nb_var *v) {
    uint64_t bits = 0;
    memcpy(&bits, &v->at.value, sizeof bits);
    return v->op == NBI_OP_FULL && bits == 0;
}

/* The registry: one entry per op, defined by the op's family file as nbi_opinfo_<name>. */
NBI_HIDDEN const nbi_op_info *nbi_op_get(nbi_op op);
NBI_HIDDEN const char *nbi_op_name(nbi_op op);

#define NBI_OP(NAME, name, family) extern const nbi_op_info nbi_opinfo_##name;
#include "ops.def"
#undef NBI_OP

/* ---- traces ------------------------------------------------------------------------- */
struct nb_trace {
    nb_ctx *ctx;
    nbi_arena arena;
    nbi_graph g;
    nb_status status;
    const char *fn_name; /* the function being traced (for messages) */
    nb_var *poison;
    uint64_t id;
    struct nbi_jit_state *jit; /* the cache machinery driving this trace */
    int depth;                 /* nesting of inlined calls, bounded */
    bool quiet;                /* no trace accounting (IR printing) */
    int ad_depth;              /* > 0 while tracing under grad/vjp/jvp: calls are inlined */
    int vmap_depth;            /* > 0 while tracing under vmap: calls are inlined too */
    /* Trace accounting this trace did (jit.c), taken back if it fails: a refused or failed
     * trace produced no executable, so it is not a trace the user sees counted. */
    struct nbi_trace_undo *undo;
};

/* The trace whose body is running on this thread (innermost), or NULL: where an op that was
 * given no var at all (nb_concatenate of 0 vars) records its error. */
NBI_HIDDEN nb_trace *nbi_trace_current(void);
NBI_HIDDEN nb_trace *nbi_trace_set_current(nb_trace *tr); /* returns the previous one */

/* One element of dtype d holding v, by the library's one rule for a double stored in an
 * array (nb_full, nb_pad's fill value, constants; nb_cast's rule too): floats rounded to
 * nearest; integers truncated toward zero, saturating at the type's range, NaN -> 0; bool
 * true for anything nonzero (NaN included). buf has room for 8 bytes; returns the element
 * size (op_shape.c). */
NBI_HIDDEN size_t nbi_elem_from_f64(nb_dtype d, double v, unsigned char *buf);

/* Start a trace for fn_name; the graph is empty. */
NBI_HIDDEN nb_status nbi_trace_init(nb_trace *tr, nb_ctx *ctx, const char *fn_name);
NBI_HIDDEN void nbi_trace_release(nb_trace *tr);
/* Record a sticky error (first one wins; the function's name is appended). Returns the
 * trace's poison var so builders can "return nbi_trace_err(...)". */
NBI_HIDDEN nb_var *nbi_trace_errv(nb_trace *tr, nb_status st, const char *fmt, ...)
    NBI_PRINTF(3, 4);
NBI_HIDDEN nb_status nbi_trace_err(nb_trace *tr, nb_status st, const char *fmt, ...)
    NBI_PRINTF(3, 4);
/* Keep a tree alive until the trace ends (takes the caller's reference). */
NBI_HIDDEN nb_status nbi_trace_own(nb_trace *tr, nb_tree *t);

/* The common prologue of a builder: the trace of the first non-NULL input; NULL if every
 * input is NULL (nothing can be recorded then). *poisoned is set if any input is poison or
 * NULL, or if the trace already failed. */
NBI_HIDDEN nb_trace *nbi_trace_of(int n, nb_var *const *in, bool *poisoned);
/* Build a node: check inputs (same trace), run the op's infer function, add the node.
 * Returns the new var or poison. proto holds op, attrs and flags; in are the inputs. */
NBI_HIDDEN nb_var *nbi_emit(nb_trace *tr, nbi_op op, int n_in, nb_var *const *in,
                            const nbi_attrs *at);
/* A PARAM node for input index i (dtype/shape given); path (copied, may be NULL) is the
 * leaf path it came from, for messages. */
NBI_HIDDEN nb_var *nbi_emit_param(nb_trace *tr, int32_t index, nb_dtype dtype, int rank,
                                  const int64_t *shape, const char *path);
/* The convolution's data movement (op_conv.c): x [C, N, S..] (nd = 1..3 spatial dims) to
 * its columns [C, K, N, So..] (the padding of value pad_value), and the transpose (cols
 * back to [C, N, spatial..], summed). nd + NBI_CONV_BATCH_FIRST: the batch-first layout,
 * x [N, C, S..] and cols [N, C, K, So..]. kernel, stride, dil, lo, hi: nd entries each. */
#define NBI_CONV_BATCH_FIRST 16
/* Max pooling's selection (op_conv.c): op NBI_OP_POOL_TAKE -- v's element at each window's
 * first maximum of x (x, v [N, C, S..] -> [N, C, So..]; value where it is a padding
 * position) -- or NBI_OP_POOL_SCATTER -- v [N, C, So..] added at those positions into zeros
 * [N, C, S..]. Windows as a batch-first im2col's (nd = 1..3, no layout flag). */
NBI_HIDDEN nb_var *nbi_pool_op(nbi_op op, nb_var *x, nb_var *v, int nd, const int64_t *kernel,
                               const int64_t *stride, const int64_t *dil, const int64_t *lo,
                               const int64_t *hi, double value);
NBI_HIDDEN nb_var *nbi_im2col(nb_var *x, int nd, const int64_t *kernel, const int64_t *stride,
                              const int64_t *dil, const int64_t *lo, const int64_t *hi,
                              double pad_value);
NBI_HIDDEN nb_var *nbi_col2im(nb_var *cols, int nd, const int64_t *kernel, const int64_t *stride,
                              const int64_t *dil, const int64_t *lo, const int64_t *hi,
                              const int64_t *spatial);
/* out[r*ors + c] = in[r + c*ics] for r < rows, c < cols (element offsets, es-byte
 * elements, es <= 8): a strided 2-D transpose in cache-friendly tiles (op_shape.c). */
NBI_HIDDEN void nbi_transpose_tiles(unsigned char *o, int64_t ors, const unsigned char *in,
                                    int64_t ics, int64_t rows, int64_t cols, size_t es);
/* "f32[2,3]" of a var (into buf). */
NBI_HIDDEN const char *nbi_var_sig(char *buf, size_t cap, const nb_var *v);

/* ---- functions (jit.c, transforms.c) ------------------------------------------------ */
/* Trace f (through its wrappers and transforms) into tr on (self, args) whose dynamic
 * leaves are vars of tr; *out is the output tree (a new reference). */
NBI_HIDDEN nb_status nbi_trace_fn(nb_trace *tr, const nb_fn *f, const nb_tree *self,
                                  const nb_tree *args, nb_tree **out);
/* The body of a GRAD, VJP or JVP layer. */
NBI_HIDDEN nb_status nbi_trace_transform(nb_trace *tr, const nb_fn *f, const nb_tree *self,
                                         const nb_tree *args, nb_tree **out);
/* The body of a JAC layer (jacobian.c): jacrev, jacfwd, jacobian. */
NBI_HIDDEN nb_status nbi_trace_jac(nb_trace *tr, const nb_fn *f, const nb_tree *self,
                                   const nb_tree *args, nb_tree **out);
/* The body of a TRAIN layer (src/optim/train.c): the training step. */
NBI_HIDDEN nb_status nbi_trace_train(nb_trace *tr, const nb_fn *f, const nb_tree *self,
                                     const nb_tree *args, nb_tree **out);
/* Call f inline in tr on args (vars of tr, static leaves, concrete arrays that become
 * constants), converting f's bound data the same way. *out is a new reference. */
NBI_HIDDEN nb_status nbi_inline_call(nb_trace *tr, const nb_fn *f, const nb_tree *args,
                                     nb_tree **out);
/* vmap (vmap.c): the layer's body; the batched region (like nbi_jvp_region: bins are the
 * batched values of ins, batch on axis 0; bouts[i] NULL where output i is not batched);
 * helpers for the rules: bx (batch on axis 0) reshaped to rank + 1 with 1s inserted after
 * the batch axis (numpy alignment against unbatched operands of rank `rank`); x broadcast
 * over B lanes; axis `from` moved to `to`; and the generic rule (the op once per lane). */
NBI_HIDDEN nb_status nbi_trace_vmap(nb_trace *tr, const nb_fn *g, const nb_tree *self,
                                    const nb_tree *args, nb_tree **out);
NBI_HIDDEN nb_status nbi_vmap_region(nb_trace *tr, int32_t begin, int32_t end, int n_in,
                                     nb_var *const *ins, nb_var *const *bins, int64_t B, int n_out,
                                     nb_var *const *outs, nb_var **bouts);
NBI_HIDDEN nb_var *nbi_vmap_lift(nb_var *bx, int rank);
NBI_HIDDEN nb_var *nbi_vmap_bcast(nb_var *x, int64_t B);
NBI_HIDDEN nb_var *nbi_vmap_move(nb_var *x, int from, int to);
NBI_HIDDEN nb_var *nbi_vmap_unroll(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B);
/* dynamic_slice / dynamic_update_slice per lane (at.axis == 1; made by the batching rules,
 * never by the public builders): x's axis 0 holds the lanes, start d (d = 1 .. rank-1) is a
 * [B] integer vector with lane b's start on x's axis d, and lane b's block is read or
 * written at its own (clamped) starts. A slice's x and an update's block may have one lane,
 * shared by every lane. The slice's sizes are at.a (at.a[0] = B). */
/* A transcendental op (a vector-math call per element: exp, log, tanh, sigmoid, pow, ...):
 * costly to compute again (nbi_pass_remat), written out a tile at a time (codegen.c). */
static inline bool nbi_op_transcendental(nbi_op op) {
    switch (op) {
    case NBI_OP_EXP:
    case NBI_OP_EXPM1:
    case NBI_OP_LOG:
    case NBI_OP_LOG1P:
    case NBI_OP_SIN:
    case NBI_OP_COS:
    case NBI_OP_TAN:
    case NBI_OP_TANH:
    case NBI_OP_ERF:
    case NBI_OP_SIGMOID:
    case NBI_OP_SOFTPLUS:
    case NBI_OP_GELU:
    case NBI_OP_POW:
        return true;
    default:
        return false;
    }
}

static inline bool nbi_dyn_lanes(const nb_var *v) {
    return (v->op == NBI_OP_DYN_SLICE || v->op == NBI_OP_DYN_UPDATE) && v->at.axis == 1;
}
NBI_HIDDEN nb_var *nbi_dyn_slice_lanes(nb_var *x, nb_var *const *starts, const int64_t *sizes,
                                       int64_t B);
NBI_HIDDEN nb_var *nbi_dyn_update_lanes(nb_var *x, nb_var *u, nb_var *const *starts);
/* custom_vjp: the node's record (at.callee) and its reverse-mode rule. */
typedef struct nbi_custom_rec {
    const nb_fn *bwd;
    nb_tree *args; /* the primal arguments (owned by the trace's arena) */
    nb_tree *res;  /* the residuals fwd returned (owned likewise) */
} nbi_custom_rec;
NBI_HIDDEN void nbi_vjp_custom(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct);
NBI_HIDDEN nb_var *nbi_jvp_custom(nb_trace *tr, nb_var *node, nb_var *const *tan);
/* custom_jvp's node (at.callee: the record, bwd the user's JVP rule; res NULL). */
NBI_HIDDEN void nbi_vjp_custom_jvp(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct);
NBI_HIDDEN nb_var *nbi_jvp_custom_jvp(nb_trace *tr, nb_var *node, nb_var *const *tan);
/* A new function wrapping f (retained) as a layer of the given kind. */
NBI_HIDDEN nb_status nbi_fn_wrap(nb_fn *f, const char *fn_name, nbi_fn_kind kind, int max_traces,
                                 bool inline_calls, nb_fn **out);

/* ---- shapes ------------------------------------------------------------------------- */
/* numpy broadcasting of two shapes into out; false if incompatible. */
NBI_HIDDEN bool nbi_broadcast_shapes(int ra, const int64_t *sa, int rb, const int64_t *sb,
                                     int *rout, int64_t *out);
/* Row-major element strides of x's shape as seen from an output of rank rout/shape out
 * (0 on broadcast dims). */
NBI_HIDDEN void nbi_bcast_strides(int rin, const int64_t *sin, int rout, const int64_t *sout,
                                  int64_t *strides);
NBI_HIDDEN int64_t nbi_shape_size(int rank, const int64_t *shape);
/* Normalise an axis (negative counts back) against rank; false if out of range. */
NBI_HIDDEN bool nbi_norm_axis(int axis, int rank, int *out);

/* Evaluate elementwise op (result dtype, first input's dtype in_dtype, n_in inputs) on n
 * contiguous elements: in[i] holds n elements, or one value repeated when scalar[i] (for
 * binary ops and select; unary operands are always full).
 * The same per-element code as the op's own kernel, so a fused evaluation gives the same
 * bits. (op_elementwise.c) */
NBI_HIDDEN void nbi_ew_tile(nbi_op op, nb_dtype dtype, nb_dtype in_dtype, int n_in, void *out,
                            const void *const *in, const bool *scalar, int64_t n);

/* One op of a fused program resolved to the function that runs it on a tile, once per
 * executable (the fused kernel's plan): a binary kernel taking element strides (0: one
 * value for all), or a vector-math function; kind 0 goes through nbi_ew_tile. */
typedef void (*nbi_ew_bin_fn)(void *o, const void *a, const void *b, int64_t n, int64_t sa,
                              int64_t sb);
typedef struct nbi_ew_fast {
    uint8_t kind; /* 0: nbi_ew_tile; 1: bin; 2: un32 / un64 (by the op's dtype) */
    nbi_ew_bin_fn bin;
    void (*un32)(float *o, const float *x, int64_t n);
    void (*un64)(double *o, const double *x, int64_t n);
} nbi_ew_fast;
NBI_HIDDEN void nbi_ew_resolve(nbi_op op, nb_dtype dtype, nb_dtype in_dtype, int n_in,
                               nbi_ew_fast *out);

/* An elementwise map: the op computes output element i from input elements i only (after
 * broadcasting), so it may be fused, or run over an input it reads at the same index.
 * Identity and stop_gradient are excluded: they are copies the passes remove or keep as
 * markers. (passes.c) */
NBI_HIDDEN bool nbi_is_map(const nb_var *v);

/* Kernels with an AVX2 twin (float binary arithmetic, small matmuls) use it when this is
 * true: the CPU has AVX2 and nbi_isa_override is not 0 (tests set 0 to run the baseline
 * x86-64 kernels and check that both give the same bits). (op_elementwise.c) */
NBI_HIDDEN extern int nbi_isa_override;
NBI_HIDDEN bool nbi_use_avx2(void);

/* A fused elementwise program (src/exec/fused.c): plain data, copied by value. Instruction i
 * computes register i from operands src[] (>= 0: register, < 0: external input -src-1)
 * over the program's index space (map_rank, map_shape); the last instruction's register is
 * the node's output, or, with a trailing reduction (red_op != 0), the value reduced. The
 * registers store[k] (n_store of them) are outputs too: fused_output nodes {index=k} that
 * read the fused node stand for them, and the kernel writes them into those nodes' buffers
 * (nbi_kargs.outs) -- one pass makes every value the cluster owes the rest of the graph. */
#define NBI_FUSE_MAX_INSTR 32
#define NBI_FUSE_MAX_EXT 16
#define NBI_FUSE_MAX_STORE 8
typedef struct nbi_finstr {
    uint16_t op;
    uint8_t n_in;
    nb_dtype dtype;
    nb_dtype in_dtype;
    int16_t src[3];
} nbi_finstr;
typedef struct nbi_fprog {
    int32_t n_instr;
    int32_t n_ext;
    nbi_finstr ins[NBI_FUSE_MAX_INSTR];
    int32_t n_store;
    int16_t store[NBI_FUSE_MAX_STORE]; /* registers stored as fused_output 0, 1, ... */
    /* The index space the instructions run over: the node's own shape, or the shape the
     * trailing reduction reduces. */
    int32_t map_rank;
    int64_t map_shape[NB_MAX_RANK];
    /* Views: bit e set when external input e is a slice or broadcast of its node, read in
     * place: element idx of the index space is at view_off + sum idx[d] * view_st[e][d]
     * of the node's row-major buffer. A view has the map shape. */
    uint32_t view_mask;
    int64_t view_off[NBI_FUSE_MAX_EXT];
    int64_t view_st[NBI_FUSE_MAX_EXT][NB_MAX_RANK];
    /* Padded views (bit e of pad_mask, also set in view_mask): index idx reads the view
     * above at idx - pad_lo where that lies inside pad_dims (the shape that was padded:
     * the node itself, or a slice or broadcast of it), else pad_value. */
    uint32_t pad_mask;
    int64_t pad_lo[NBI_FUSE_MAX_EXT][NB_MAX_RANK];
    int64_t pad_dims[NBI_FUSE_MAX_EXT][NB_MAX_RANK];
    double pad_value[NBI_FUSE_MAX_EXT];
    /* A trailing reduction (sum, max or min; 0: none) over red_axes of the map shape, which
     * are its innermost non-unit dims: output o reduces the red_n consecutive elements
     * [o * red_n, (o + 1) * red_n) of the index space, in the order and with the blocked
     * pairwise sums of the reduction kernel (op_reduce.c), so the same bits. */
    uint16_t red_op;
    bool red_keepdims;
    int32_t red_n_axes;
    int32_t red_axes[NB_MAX_RANK];
    int64_t red_n;
    /* How the kernel reads its inputs and lays out its tiles, fixed by the shapes: set once
     * by nbi_fused_prepare when an executable is compiled (src/exec/fused.c's own layout). */
    bool planned;
    _Alignas(8) unsigned char plan[2816];
} nbi_fprog;
/* Compute node's plan (node: a fused node of an executable, with its inputs set). */
NBI_HIDDEN void nbi_fused_prepare(nb_var *node);
/* Fuse clusters of same-shape elementwise ops, with the reduction that consumes them when
 * it reduces innermost dims; members needed outside a cluster are stored by its kernel. */
NBI_HIDDEN nb_status nbi_pass_fuse(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out);

/* A reduction fed in pieces (op_reduce.c): the same result, bit for bit, as the reduction
 * kernel over the concatenation of the pieces (sum: blocked pairwise in floats, wrapping in
 * integers; max, min: left to right, NaN propagating). Segments of NBI_RSEG elements
 * (a power-of-two number of pairwise blocks) reduced separately combine exactly with
 * nbi_rstream_combine. */
#define NBI_RSEG 16384
typedef struct nbi_rstream {
    uint16_t op;
    nb_dtype dtype;
    int64_t n; /* elements fed so far */
    _Alignas(8) unsigned char st[66 * 8 + 32];
} nbi_rstream;
NBI_HIDDEN void nbi_rstream_begin(nbi_rstream *s, nbi_op op, nb_dtype dtype);
NBI_HIDDEN void nbi_rstream_feed(nbi_rstream *s, const void *x, int64_t n);
/* The result (at least one element was fed), written as one element of the dtype. */
NBI_HIDDEN void nbi_rstream_end(nbi_rstream *s, void *out);
/* rows whole runs of len contiguous elements each reduced by op into out[r], with the bits
 * a stream fed that run would give, several runs at a time; false (nothing done) where that
 * is not a plain left fold (a float sum of NBI_RBLOCK or more elements: pairwise) or for
 * other dtypes and ops than f32/f64 sum, max and min. */
NBI_HIDDEN bool nbi_reduce_short_runs(nbi_op op, nb_dtype dtype, const void *x, int64_t rows,
                                      int64_t len, void *out);
/* Combine the results of n consecutive segments (all but the last of NBI_RSEG elements). */
NBI_HIDDEN void nbi_rstream_combine(nbi_op op, nb_dtype dtype, const void *parts, int64_t n,
                                    void *out);

/* ---- autodiff helpers (src/ad/autodiff.c) ------------------------------------------- */
/* The value of `value` with the derivative of `derivative` (same dtype and shape): op
 * implicit (op_misc.c), removed after autodiff. */
NBI_HIDDEN nb_var *nbi_implicit(nb_var *value, nb_var *derivative);
/* Sum ct (shaped like a broadcast result) back to an input of rank/shape: over the leading
 * dims the input lacks and, keeping dims, over those where the input has 1. */
NBI_HIDDEN nb_var *nbi_unbroadcast(nb_var *ct, int rank, const int64_t *shape);
/* A tangent or cotangent that may be NULL (zero) turned into a real zero var like v. */
NBI_HIDDEN nb_var *nbi_zeros_like(nb_trace *tr, const nb_var *v);
/* Is v differentiable: a float dtype (gradients of integer and bool values are null)? */
NBI_HIDDEN bool nbi_is_float_var(const nb_var *v);
/* Reverse mode over the nodes with ids in [begin, end): outs[i] gets cotangent out_ct[i];
 * wrt_ct[k] receives the total cotangent of wrt[k] (zeros when it has none). */
NBI_HIDDEN nb_status nbi_vjp_region(nb_trace *tr, int32_t begin, int32_t end, int n_out,
                                    nb_var *const *outs, nb_var *const *out_ct, int n_wrt,
                                    nb_var *const *wrt, nb_var **wrt_ct);
/* Forward mode over [begin, end): ins[i] have tangents in_tan[i] (NULL: zero); out_tan[i]
 * receives the tangent of outs[i] (zeros when it has none). */
NBI_HIDDEN nb_status nbi_jvp_region(nb_trace *tr, int32_t begin, int32_t end, int n_in,
                                    nb_var *const *ins, nb_var *const *in_tan, int n_out,
                                    nb_var *const *outs, nb_var **out_tan);

/* ---- printing and checking ---------------------------------------------------------- */
NBI_HIDDEN void nbi_graph_format(nbi_sbuf *s, const nbi_graph *g, const char *name);
/* NB_OK if the graph is well formed (topological order, arities, ids, shapes consistent
 * with re-running inference), else NB_ERR_INTERNAL with a message naming the node. */
NBI_HIDDEN nb_status nbi_graph_verify(nb_ctx *ctx, const nbi_graph *g, const char *pass);
/* Whether the compiler verifies the IR after every pass: always in builds without NDEBUG
 * (Debug), else when the environment variable NABLA_VERIFY_IR is set to something other
 * than "" or "0" (the test suites set it). Read once per process. */
NBI_HIDDEN bool nbi_verify_ir_enabled(void);

/* ---- passes ------------------------------------------------------------------------- */
/* Each returns a new graph in the same arena (out), verified in debug builds and tests. */
NBI_HIDDEN nb_status nbi_pass_dce(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out);
NBI_HIDDEN nb_status nbi_pass_cse(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out);
NBI_HIDDEN nb_status nbi_pass_fold(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out);
/* Matmul operands that are transposes of their last two axes are read through swapped
 * strides instead (the transpose then usually dies in DCE). */
NBI_HIDDEN nb_status nbi_pass_transpose_matmul(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out);
/* A loop run twice -- once for its value, once again by reverse mode with a tape -- runs
 * once: a while node W2 with at.c[0] != 0 is a twin of the earlier while w whose at.a[6]
 * equals it (the same loop record), and W2's carry leaves from at.c[1] on, ncar of w's,
 * start from w's initial carry and end as w's outputs. w's outputs are then read from W2,
 * which moves to w's place (its other operands must come before w, or be constants), and w
 * goes (passes.c). */
NBI_HIDDEN nb_status nbi_pass_loop_share(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out);
/* A sum of zero pads along one axis, disjoint and covering it, as the concatenation of its
 * pieces, each added to +0 (passes.c). */
NBI_HIDDEN nb_status nbi_pass_pad_concat(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out);
/* Pads of small elementwise trees pushed onto the trees' leaves, under a mask (passes.c). */
NBI_HIDDEN nb_status nbi_pass_pad_push(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out);
/* Small elementwise trees with several fusible consumers copied into each (passes.c). */
NBI_HIDDEN nb_status nbi_pass_remat(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out);
/* A row sum of a product read only there, sum(op(a) @ op(b), axis 0), becomes the product
 * of the row sum, sum(op(a), axis 0) @ op(b), also through adds and subs of same-shape
 * operands (sum(c + p) = sum(c) + sum(p)); not bit-exact, in every pipeline (passes.c). */
NBI_HIDDEN nb_status nbi_pass_sum_matmul(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out);
/* add(matmul(a, b), c), either order, c of the sum's dtype and shape (not broadcast) and
 * the product read only there, becomes matmul(a, b, c): a matmul node with a third operand
 * computes a @ b + c, into c's buffer when the memory plan allows (op_linalg.c,
 * pass_accumulate.c). Runs after transpose-matmul (which reads only operands 0 and 1). */
NBI_HIDDEN nb_status nbi_pass_accumulate(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out);
/* May such a node's output take its accumulator's buffer (exec.c's memory plan asks)? Yes
 * where nabla's own loops make the product (small and outer float products, integers); no
 * where BLIS does, which makes the product in the output and adds c after (op_linalg.c). */
NBI_HIDDEN bool nbi_matmul_acc_in_place(const nb_var *node);
/* The standard pipeline: fold, transpose-matmul, CSE, DCE, accumulate, pad push, DCE, remat,
 * fuse, DCE (the debugging one: no accumulate, no fuse). */
/* The debugging checks of an executable (nb_jit_opts.debug_nans / debug_infs). */
enum { NBI_DEBUG_NANS = 1, NBI_DEBUG_INFS = 2, NBI_DEBUG_RETRACE = 4 };
/* debug != 0: no fusion, so every op's result is made, and checked, on its own. */
NBI_HIDDEN nb_status nbi_optimize(nb_ctx *ctx, const nbi_graph *in, unsigned debug,
                                  nbi_arena *arena, nbi_graph *out);

/* ---- callees of control flow (jit.c) ------------------------------------------------- */
/* The executable of f traced on args (a tree of vars of tr, arrays and static leaves),
 * found in or added to f's cache entry exactly as a non-inlined nb_apply does (the key: f's
 * body, the static parts of its self and of args, and the signatures of their leaves -- no
 * traced value is hashed), and the operands in the executable's input order: f's self
 * leaves (vars of tr lifted as operands: closure conversion; arrays as constants), then
 * args' leaves. ops live in tr's arena; out_def and exec are owned by the cache entry. */
typedef struct nbi_callee_info {
    struct nbi_exec *exec;
    nb_var **ops;
    int64_t n_ops, n_self;
    const nb_treedef *out_def;
} nbi_callee_info;

/* ---- executables -------------------------------------------------------------------- */
typedef struct nbi_exec nbi_exec;
/* Compile a graph (the graph and its arena may be freed afterwards). */
/* debug: NBI_DEBUG_* checks after every instruction (the first failure is recorded like a
 * failed check op's, and the run stops). */
NBI_HIDDEN nb_status nbi_exec_compile(nb_ctx *ctx, const nbi_graph *g, unsigned debug,
                                      nbi_exec **out);
NBI_HIDDEN void nbi_exec_retain(nbi_exec *e);
/* Release a reference (executables are refcounted: calls hold their callees). */
NBI_HIDDEN void nbi_exec_destroy(nbi_exec *e);
/* Run on input arrays (n_inputs, matching the params' dtypes/shapes) into output arrays
 * (n_outputs, already allocated with the outputs' dtypes/shapes). donated (NULL: none)
 * marks the outputs that are input arrays handed over by the caller, or may share memory
 * with an input; the others must be fresh buffers. Never allocates. */
NBI_HIDDEN void nbi_exec_run(const nbi_exec *e, nb_array *const *inputs, nb_array *const *outputs,
                             const bool *donated);
/* Run on raw buffers (used for calls between executables and for constant folding). */
NBI_HIDDEN void nbi_exec_run_raw(const nbi_exec *e, const void *const *inputs, void *const *outputs,
                                 const bool *donated);
/* One step of a loop whose body is e: as nbi_exec_run_raw, but where *pre_valid says that
 * e's last run was the previous step's, on the same bound data (inputs [0, n_fixed)), the
 * instructions that depend only on the bound data (e's loop-invariant prefix) are not run
 * again: their values are still in e's workspace. *pre_valid (false before the first step)
 * is updated: true after a run by the interpreter, false after native code (which keeps
 * values in locals). The caller guarantees that nothing runs e between its steps. */
NBI_HIDDEN void nbi_exec_run_step(const nbi_exec *e, const void *const *inputs,
                                  void *const *outputs, const bool *donated, bool *pre_valid);
/* Does running x run target (x's calls and loops, to depth 16: deeper counts as yes)? */
NBI_HIDDEN bool nbi_exec_reaches(const nbi_exec *x, const nbi_exec *target, int depth);
/* The number of e's loop-invariant instructions (tests). */
NBI_HIDDEN int32_t nbi_exec_n_pre(const nbi_exec *e);
/* e's debugging checks (NBI_DEBUG_*; 0: none). */
NBI_HIDDEN unsigned nbi_exec_debug(const nbi_exec *e);
/* Does while node w's carry leaf i start undefined rather than from its operand? The
 * tapes of a loop reverse mode runs taped (nbi_while_vjp, src/loops/loop.c): leaf
 * at.c[2] + r for each bit r of at.c[3..7] (NBI_UNINIT_MAX of them; at.c[2] = 0: none).
 * Every step writes its own row of such a tape, the loop runs exactly as many steps as
 * there are rows (a fori or a scan), and nothing reads a row before its step wrote it -- so
 * the initial zeros are never seen and are not written (1 MB a train step for a character
 * GRU's 8 tapes). Not with the debugging checks: they look at the tape after each write,
 * unwritten rows included. */
#define NBI_UNINIT_MAX 320
static inline bool nbi_while_uninit(const nb_var *w, int64_t i, const nbi_exec *body) {
    int64_t r = i - w->at.c[2];
    return w->at.c[2] > 0 && r >= 0 && r < NBI_UNINIT_MAX &&
           ((uint64_t)w->at.c[3 + r / 64] >> (r % 64) & 1u) != 0 && nbi_exec_debug(body) == 0;
}
/* A run's output plan (nbi_exec_run_raw's, without the run): out_direct for these buffers,
 * and how many outputs the run must copy afterwards (nbi_exec_copy_out). Native code runs
 * a loop's cond and body on the same buffers step after step: planned once per loop. */
NBI_HIDDEN const bool *nbi_exec_plan_io(const nbi_exec *e, const void *const *inputs,
                                        void *const *outputs, const bool *donated, int *n_copy);
NBI_HIDDEN void nbi_exec_copy_out(const nbi_exec *e, void *const *outputs);
/* The functions a checkpointed reversal (loop_reverse, src/loops/loop.c) runs its cond,
 * body and step vjp with, in that order: native code's functions of the loop's file on
 * their executables' environments, each on outputs planned once per reversal. */
typedef void (*nbi_loop_fn)(const void *env, const void *const *in, void *const *out,
                            const bool *direct);
typedef struct nbi_loop_fns {
    nbi_loop_fn fn[3];
    const void *env[3];
    int replan; /* plan before every run (running one can run one of them again), else once */
} nbi_loop_fns;
/* The loop_reverse kernel with f's functions (f NULL: every run through nbi_exec_run_raw,
 * as the kernel itself). */
NBI_HIDDEN void nbi_loop_reverse_run(const nbi_kargs *k, const nbi_loop_fns *f);
NBI_HIDDEN int32_t nbi_exec_n_inputs(const nbi_exec *e);
NBI_HIDDEN int32_t nbi_exec_n_outputs(const nbi_exec *e);
/* dtype/shape of output i. */
NBI_HIDDEN const nb_var *nbi_exec_output(const nbi_exec *e, int32_t i);
NBI_HIDDEN size_t nbi_exec_workspace_bytes(const nbi_exec *e);
/* The native tier (src/exec/native.c). Give e (and its callees) native code according to
 * mode (NB_NATIVE_* of nb_jit_opts, then NABLA_NATIVE): NOW compiles it at once, AUTO
 * counts its runs and compiles it on a background thread once hot, OFF nothing. A failed
 * compile is not an error: it is logged (NB_LOG_LEVEL_WARN) and the interpreter stays.
 * NB_ERR_OOM if the tier's bookkeeping cannot be allocated. Cheap when already attached. */
NBI_HIDDEN nb_status nbi_native_attach(nbi_exec *e, int mode);
/* The mode an option value runs in once NABLA_NATIVE is applied. */
NBI_HIDDEN int nbi_native_resolve(int mode);
/* Does e run native code now (on this thread)? */
NBI_HIDDEN bool nbi_exec_native(const nbi_exec *e);
/* Whether runs on this thread must stay interpreted (a call whose mode is OFF: executables
 * are shared by equal functions, so a function asking for the interpreter gets it even from
 * an executable that has native code). Returns the previous value. */
NBI_HIDDEN bool nbi_native_set_interp_only(bool on);
/* True while NABLA_NATIVE=check runs an executable's native code beside the interpreter
 * on this thread: side effects (nb_debug_print) happen in the interpreter's run only. */
NBI_HIDDEN bool nbi_native_shadow_run(void);
/* The C source of the executable g compiles to, for nb_fn_format_ir (NB_IR_NATIVE_C). */
NBI_HIDDEN nb_status nbi_native_format(nb_ctx *ctx, const nbi_graph *g, nbi_sbuf *s);
/* f's executable for args as the callee of a control-flow op (its self's and args' leaves
 * its operands, in out). loop_body: a while's body, whose bound data is the same in every
 * step (compiled with nbi_graph.n_fixed: its loop-invariant prefix). */
NBI_HIDDEN nb_status nbi_callee(nb_trace *tr, nb_fn *f, const nb_tree *args, const char *who,
                                bool loop_body, nbi_callee_info *out);
/* Derivatives through a while op (src/loops/loop.c): record why they cannot be taken (the
 * loop's kind and the fix), for reverse mode or forward mode. */
NBI_HIDDEN void nbi_while_report(nb_trace *tr, const nb_var *w, bool reverse);

/* ---- run-time checks (op_misc.c) -------------------------------------------------------
 * check(x, fail, vals) is x; when it runs with fail (a 0-d bool) true, it records vals
 * (f64[n], n <= NBI_CHECK_VALUES) and fmt on the running thread -- the first failure of a
 * run wins -- and the top-level call (nb_fn_call) then fails with NB_ERR_RUNTIME and the
 * message fmt writes from vals. Never folded at compile time; the derivative of x passes
 * through. */
#define NBI_CHECK_VALUES 8
typedef void (*nbi_check_fmt)(char *buf, size_t cap, const double *vals);
NBI_HIDDEN nb_var *nbi_check(nb_var *x, nb_var *fail, nb_var *vals, nbi_check_fmt fmt);
/* Clear the running thread's failure record (before a run). */
NBI_HIDDEN void nbi_check_clear(void);
/* Record a failure with its message (copied), unless one is recorded; true if recorded. */
NBI_HIDDEN bool nbi_check_fail_text(const char *msg);
NBI_HIDDEN bool nbi_check_failed(void);
/* NB_OK, or the recorded failure as NB_ERR_RUNTIME with its message on ctx (clears it). */
NBI_HIDDEN nb_status nbi_check_take(nb_ctx *ctx);
/* Reverse mode through while op w: cts[i] is the cotangent of carry leaf i (NULL: zero);
 * sets in_ct[j] for w's operands (src/loops/loop.c). */
NBI_HIDDEN void nbi_while_vjp(nb_trace *tr, nb_var *w, nb_var *const *cts, nb_var **in_ct);
/* Forward mode through w: in_tan[j] the tangent of operand j (NULL: zero); sets
 * out_tan[i] for carry leaf i (NULL for integer leaves). */
NBI_HIDDEN void nbi_while_jvp(nb_trace *tr, nb_var *w, nb_var *const *in_tan, nb_var **out_tan);
/* Batching a while or loop_reverse node (bin as for nbi_vmap_fn): outs[i] the batched value
 * of the node's output i (what its call_output i reads), batch on axis 0. */
NBI_HIDDEN nb_status nbi_loop_vmap(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B,
                                   nb_var **outs);

/* Evaluate one node's kernel on concrete buffers (constant folding, reference runs). */
NBI_HIDDEN void nbi_run_kernel(const nb_var *node, void *out, const void *const *in, void *scratch);

#endif /* NABLA_SRC_AD_IR_H */
