/*
 * op_misc.c -- inputs (param), constants (constant, full, iota), stop_gradient, and calls
 * to sub-executables (call, call_output).
 */
#include "ad/ir.h"

#include <stdio.h>
#include <string.h>

/* ---- inference ---------------------------------------------------------------------- */

/* full and iota carry their result's dtype and shape in the attributes. */
static nb_status nbi_infer_from_attrs(nb_trace *tr, nb_var *p) {
    (void)tr;
    p->dtype = p->at.to;
    p->rank = (int8_t)p->at.n_axes;
    for (int i = 0; i < p->rank; i++) {
        p->shape[i] = p->at.a[i];
    }
    return NB_OK;
}

static nb_status nbi_infer_constant(nb_trace *tr, nb_var *p) {
    (void)tr;
    const nb_array *a = p->at.array;
    p->dtype = nb_array_dtype(a);
    p->rank = (int8_t)nb_array_rank(a);
    memcpy(p->shape, nb_array_shape(a), (size_t)p->rank * sizeof(int64_t));
    return NB_OK;
}

static nb_status nbi_infer_identity(nb_trace *tr, nb_var *p) {
    (void)tr;
    const nb_var *x = p->in[0];
    p->dtype = x->dtype;
    p->rank = x->rank;
    memcpy(p->shape, x->shape, sizeof p->shape);
    p->flags |= x->flags & NBI_NODE_WEAK;
    return NB_OK;
}

/* ---- builders ----------------------------------------------------------------------- */

static nb_status nbi_shape_attrs(nb_trace *tr, const char *fn, nb_dtype dtype, int rank,
                                 const int64_t *shape, nbi_attrs *at) {
    memset(at, 0, sizeof *at);
    if (nb_dtype_size(dtype) == 0) {
        return nbi_trace_err(tr, NB_ERR_DTYPE, "%s: unknown dtype %d", fn, (int)dtype);
    }
    if (rank < 0 || rank > NB_MAX_RANK || (rank > 0 && shape == NULL)) {
        return nbi_trace_err(tr, NB_ERR_SHAPE, "%s: rank %d with %s shape", fn, rank,
                             shape ? "a" : "a NULL");
    }
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0) {
            return nbi_trace_err(tr, NB_ERR_SHAPE, "%s: dim %d is %lld; dims must be >= 0", fn, i,
                                 (long long)shape[i]);
        }
        at->a[i] = shape[i];
    }
    at->n_axes = rank;
    at->to = dtype;
    return NB_OK;
}

nb_var *nb_full(nb_trace *tr, nb_dtype dtype, int rank, const int64_t *shape, double value) {
    if (tr == NULL) {
        return NULL;
    }
    if (tr->status != NB_OK) {
        return tr->poison;
    }
    nbi_attrs at;
    if (nbi_shape_attrs(tr, "nb_full", dtype, rank, shape, &at) != NB_OK) {
        return tr->poison;
    }
    at.value = value;
    return nbi_emit(tr, NBI_OP_FULL, 0, NULL, &at);
}

nb_var *nb_scalar_typed(nb_trace *tr, nb_dtype dtype, double value) {
    return nb_full(tr, dtype, 0, NULL, value);
}

nb_var *nb_scalar(nb_trace *tr, double value) {
    nb_var *v = nb_full(tr, NB_DTYPE_F32, 0, NULL, value);
    if (v != NULL && !(v->flags & NBI_NODE_POISON)) {
        v->flags |= NBI_NODE_WEAK;
    }
    return v;
}

nb_var *nb_constant(nb_trace *tr, const nb_array *a) {
    if (tr == NULL) {
        return NULL;
    }
    if (tr->status != NB_OK) {
        return tr->poison;
    }
    nb_array *copy = NULL;
    nb_status st = nb_array_copy(a, &copy);
    if (st != NB_OK) {
        return nbi_trace_errv(tr, st, "nb_constant: %s",
                              st == NB_ERR_MISUSE ? "NULL or destroyed array"
                                                  : "out of memory copying the array");
    }
    if (!nbi_arena_own_array(&tr->arena, copy)) {
        return nbi_trace_errv(tr, NB_ERR_OOM, "nb_constant: out of memory");
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.array = copy;
    return nbi_emit(tr, NBI_OP_CONST, 0, NULL, &at);
}

nb_var *nb_iota(nb_trace *tr, nb_dtype dtype, int rank, const int64_t *shape, int axis) {
    if (tr == NULL) {
        return NULL;
    }
    if (tr->status != NB_OK) {
        return tr->poison;
    }
    nbi_attrs at;
    if (nbi_shape_attrs(tr, "nb_iota", dtype, rank, shape, &at) != NB_OK) {
        return tr->poison;
    }
    int ax;
    if (!nbi_norm_axis(axis, rank, &ax) || dtype == NB_DTYPE_BOOL) {
        return nbi_trace_errv(tr, NB_ERR_INVALID,
                              "nb_iota: axis %d is out of range for rank %d (or dtype is bool)",
                              axis, rank);
    }
    at.axis = ax;
    return nbi_emit(tr, NBI_OP_IOTA, 0, NULL, &at);
}

nb_var *nb_stop_gradient(nb_var *x) {
    bool poisoned;
    nb_trace *tr = nbi_trace_of(1, &x, &poisoned);
    return tr ? nbi_emit(tr, NBI_OP_STOP_GRADIENT, 1, &x, NULL) : NULL;
}

/* ---- kernels ------------------------------------------------------------------------ */

/* Element i of out (dtype d) = v, converted by the library's one rule (nbi_elem_from_f64). */
static void nbi_store_value(nb_dtype d, void *out, int64_t i, double v) {
    unsigned char b[8];
    size_t es = nbi_elem_from_f64(d, v, b);
    memcpy((unsigned char *)out + (size_t)i * es, b, es);
}

static void nbi_k_full(const nbi_kargs *k) {
    const nb_var *n = k->node;
    if (n->size == 0) {
        return;
    }
    nbi_store_value(n->dtype, k->out, 0, n->at.value);
    /* the filled prefix doubles: log2(size) copies, not one call per element */
    size_t total = (size_t)n->size * nb_dtype_size(n->dtype), done = nb_dtype_size(n->dtype);
    unsigned char *o = k->out;
    while (done < total) {
        size_t c = done < total - done ? done : total - done;
        memcpy(o + done, o, c);
        done += c;
    }
}

static void nbi_k_constant(const nbi_kargs *k) {
    const nb_var *n = k->node;
    if (n->size > 0) {
        memcpy(k->out, nb_array_data(n->at.array), nb_array_nbytes(n->at.array));
    }
}

static void nbi_k_iota(const nbi_kargs *k) {
    const nb_var *n = k->node;
    int64_t inner = 1;
    for (int i = n->at.axis + 1; i < n->rank; i++) {
        inner *= n->shape[i];
    }
    int64_t len = n->shape[n->at.axis];
    for (int64_t i = 0; i < n->size; i++) {
        nbi_store_value(n->dtype, k->out, i, (double)((i / inner) % len));
    }
}

static void nbi_k_copy(const nbi_kargs *k) {
    const nb_var *n = k->node;
    if (n->size > 0 && k->out != k->in[0]) { /* in place: nothing to do */
        memcpy(k->out, k->in[0], (size_t)n->size * nb_dtype_size(n->dtype));
    }
}

/* A call writes every output of the callee into its own buffer, one after another at
 * 64-byte aligned offsets; call_output nodes copy their part out. */
static void nbi_k_call(const nbi_kargs *k) {
    const nb_var *n = k->node;
    const nbi_exec *e = n->at.callee;
    int32_t n_out = nbi_exec_n_outputs(e);
    void **outs = k->scratch; /* n_out pointers (nbi_scratch_call) */
    size_t off = 0;
    for (int32_t i = 0; i < n_out; i++) {
        outs[i] = (unsigned char *)k->out + off;
        const nb_var *o = nbi_exec_output(e, i);
        off += ((size_t)o->size * nb_dtype_size(o->dtype) + 63) / 64 * 64;
    }
    nbi_exec_run_raw(e, k->in, outs, NULL); /* outputs are slots of their own */
}

static void nbi_k_call_output(const nbi_kargs *k) {
    const nb_var *n = k->node;
    if (n->size > 0) {
        memcpy(k->out, (const unsigned char *)k->in[0] + n->at.a[0],
               (size_t)n->size * nb_dtype_size(n->dtype));
    }
}

static size_t nbi_scratch_call(const nb_var *node) {
    return (size_t)nbi_exec_n_outputs(node->at.callee) * sizeof(void *);
}

/* A call's own value is the byte buffer holding all the callee's outputs. */
static nb_status nbi_infer_call(nb_trace *tr, nb_var *p) {
    (void)tr;
    const nbi_exec *e = p->at.callee;
    size_t off = 0;
    for (int32_t i = 0; i < nbi_exec_n_outputs(e); i++) {
        const nb_var *o = nbi_exec_output(e, i);
        off += ((size_t)o->size * nb_dtype_size(o->dtype) + 63) / 64 * 64;
    }
    p->dtype = NB_DTYPE_BOOL;
    p->rank = 1;
    p->shape[0] = (int64_t)off;
    return NB_OK;
}

static nb_status nbi_infer_call_output(nb_trace *tr, nb_var *p) {
    (void)tr;
    const nb_var *o = nbi_exec_output(p->in[0]->at.callee, (int32_t)p->at.ivalue);
    p->dtype = o->dtype;
    p->rank = o->rank;
    memcpy(p->shape, o->shape, sizeof p->shape);
    return NB_OK;
}

/* ---- registry entries --------------------------------------------------------------- */

const nbi_op_info nbi_opinfo_param = {.name = "param", .n_in = 0};
const nbi_op_info nbi_opinfo_constant = {
    .name = "constant", .n_in = 0, .infer = nbi_infer_constant, .kernel = nbi_k_constant};
const nbi_op_info nbi_opinfo_full = {
    .name = "full", .n_in = 0, .infer = nbi_infer_from_attrs, .kernel = nbi_k_full};
const nbi_op_info nbi_opinfo_iota = {
    .name = "iota", .n_in = 0, .infer = nbi_infer_from_attrs, .kernel = nbi_k_iota};
/* ---- batching ------------------------------------------------------------------------
 * Markers and copies batch as themselves. params, constants, full and iota have no inputs
 * and are never batched. A call inside a vmapped function is inlined (vmap.c), so call and
 * call_output never meet a batched input; custom_vjp's node (made under a gradient) would
 * need its rule's bwd batched too: not yet. */
/* The unbatched node of a print or check ran on the examples (zeros): it becomes a plain
 * copy, so that only the batched one prints or checks (they are kept however unused). */
static void nbi_vmap_silence(nb_var *node) {
    node->op = NBI_OP_IDENTITY;
    node->n_in = 1;
}

static nb_var *nbi_vmap_same(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    nb_var *in[2];
    for (int32_t j = 0; j < node->n_in && j < 2; j++) {
        in[j] = bin[j] != NULL ? bin[j] : node->in[j];
        if (bin[j] == NULL && node->op == NBI_OP_IMPLICIT) {
            in[j] = nbi_vmap_bcast(node->in[j], B); /* value and derivative alike */
        }
    }
    nb_var *r = nbi_emit(tr, (nbi_op)node->op, node->n_in, in, &node->at);
    if (node->op == NBI_OP_PRINT) {
        nbi_vmap_silence(node);
    }
    return r;
}

/* custom_vjp's node is made under a gradient; under vmap without one around (vmap(grad(f))),
 * that gradient was taken before the region is batched, so the node is its value, in[0]. A
 * gradient around the vmap would need bwd batched: not yet. */
static nb_var *nbi_vmap_custom(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    if (tr->ad_depth > 0) {
        return nbi_trace_errv(tr, NB_ERR_UNSUPPORTED,
                              "nb_vmap: a derivative taken around a vmapped function made with "
                              "%s is not supported yet -- take the derivative inside "
                              "the vmap (vmap(grad(f)), per-lane gradients; sum them for "
                              "grad(vmap(f)))",
                              node->op == NBI_OP_CUSTOM_JVP ? "nb_custom_jvp" : "nb_custom_vjp");
    }
    return bin[0] != NULL ? bin[0] : nbi_vmap_bcast(node->in[0], B);
}

/* check(x, cond, vals): fails when any lane's cond does, with the first such lane's vals */
static nb_var *nbi_vmap_check(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    nb_var *cond = node->in[1], *vals = node->in[2];
    if (bin[1] != NULL) {
        nb_var *c = nb_reshape(nb_cast(bin[1], NB_DTYPE_I32), 1, (int64_t[]){B});
        nb_var *lane = nb_argmax(c, 0, false);
        cond = nb_gt(nb_max(c, NULL, 0, false), nb_scalar_typed(tr, NB_DTYPE_I32, 0.0));
        cond = nb_reshape(cond, node->in[1]->rank, node->in[1]->shape);
        if (bin[2] != NULL) {
            vals = nb_take(bin[2], lane, 0);
        }
    } else if (bin[2] != NULL) {
        vals = nb_take(bin[2], nb_scalar_typed(tr, NB_DTYPE_I32, 0.0), 0);
    }
    nb_var *x = bin[0] != NULL ? bin[0] : nbi_vmap_bcast(node->in[0], B);
    nb_var *in[3] = {x, cond, vals};
    nb_var *r = nbi_emit(tr, NBI_OP_CHECK, 3, in, &node->at);
    nbi_vmap_silence(node);
    return r;
}

static nb_var *nbi_vmap_refuse(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    (void)bin;
    (void)B;
    return nbi_trace_errv(tr, NB_ERR_INTERNAL,
                          "nb_vmap: %s met a batched input: calls inside nb_vmap are inlined, "
                          "so this is an internal error",
                          nbi_op_get((nbi_op)node->op)->name);
}

const nbi_op_info nbi_opinfo_stop_gradient = {.name = "stop_gradient",
                                              .n_in = 1,
                                              .infer = nbi_infer_identity,
                                              .kernel = nbi_k_copy,
                                              .nondiff = 1,
                                              .elementwise = true,
                                              .vmap = nbi_vmap_same};
static void nbi_vjp_identity(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    (void)tr;
    (void)node;
    in_ct[0] = ct;
}

static nb_var *nbi_jvp_identity(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    (void)tr;
    (void)node;
    return tan[0];
}

/* implicit(a, b): the value of a with the derivative of b (b's value unused). How a value
 * found by an iteration that is not differentiated -- a Newton solve -- gets the derivative
 * the implicit function theorem gives it: a = stop_gradient(z*), b = z* - M^{-1} F(z*, p)
 * with M = dF/dz at z* (stopped), so db = -M^{-1} dF/dp dp (src/ode/solve.c). Its role
 * ends with autodiff: the simplify pass replaces it by a, and b's graph, unused, goes with
 * DCE -- a forward-only run never computes it. */
static nb_status nbi_infer_implicit(nb_trace *tr, nb_var *p) {
    const nb_var *a = p->in[0], *b = p->in[1];
    if (a->dtype != b->dtype || a->rank != b->rank ||
        memcmp(a->shape, b->shape, (size_t)a->rank * sizeof(int64_t)) != 0) {
        char sa[NBI_SIG_CAP], sb[NBI_SIG_CAP];
        return nbi_trace_err(tr, NB_ERR_INTERNAL, "implicit: value %s and derivative %s differ",
                             nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b));
    }
    return nbi_infer_identity(tr, p);
}

static void nbi_vjp_implicit(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    (void)tr;
    (void)node;
    in_ct[1] = ct;
}

static nb_var *nbi_jvp_implicit(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    (void)tr;
    (void)node;
    return tan[1];
}

const nbi_op_info nbi_opinfo_implicit = {.name = "implicit",
                                         .n_in = 2,
                                         .infer = nbi_infer_implicit,
                                         .kernel = nbi_k_copy,
                                         .nondiff = 1,
                                         .vjp = nbi_vjp_implicit,
                                         .jvp = nbi_jvp_implicit,
                                         .vmap = nbi_vmap_same};

nb_var *nbi_implicit(nb_var *value, nb_var *derivative) {
    nb_var *in[2] = {value, derivative};
    bool poisoned;
    nb_trace *tr = nbi_trace_of(2, in, &poisoned);
    return tr ? nbi_emit(tr, NBI_OP_IMPLICIT, 2, in, NULL) : NULL;
}

/* identity: a distinct node for the same value (what gradient transforms differentiate
 * with respect to); the simplify pass removes it before compiling. */
const nbi_op_info nbi_opinfo_identity = {.name = "identity",
                                         .n_in = 1,
                                         .infer = nbi_infer_identity,
                                         .kernel = nbi_k_copy,
                                         .elementwise = true,
                                         .vjp = nbi_vjp_identity,
                                         .jvp = nbi_jvp_identity,
                                         .vmap = nbi_vmap_same};

/* custom_vjp: out = in[0] (computed by the user's fwd from stopped inputs); the other
 * inputs are the primal arguments (which receive the user's bwd cotangents) and the
 * residuals. The simplify pass removes it before compiling, like identity. */
const nbi_op_info nbi_opinfo_custom_vjp = {.name = "custom_vjp",
                                           .n_in = -1,
                                           .infer = nbi_infer_identity,
                                           .kernel = nbi_k_copy,
                                           .nondiff = 1,
                                           .vjp = nbi_vjp_custom,
                                           .jvp = nbi_jvp_custom,
                                           .vmap = nbi_vmap_custom};

/* custom_jvp: out = in[0] (f on stopped inputs); in[1..] the float arguments, whose tangents
 * the user's rule maps to the output's (jvp) and whose cotangents are that map transposed
 * (vjp: reverse mode over the rule). Removed before compiling, like identity. */
const nbi_op_info nbi_opinfo_custom_jvp = {.name = "custom_jvp",
                                           .n_in = -1,
                                           .infer = nbi_infer_identity,
                                           .kernel = nbi_k_copy,
                                           .nondiff = 1,
                                           .vjp = nbi_vjp_custom_jvp,
                                           .jvp = nbi_jvp_custom_jvp,
                                           .vmap = nbi_vmap_custom};

const nbi_op_info nbi_opinfo_call = {.name = "call",
                                     .n_in = -1,
                                     .infer = nbi_infer_call,
                                     .kernel = nbi_k_call,
                                     .scratch = nbi_scratch_call,
                                     .vmap = nbi_vmap_refuse};
/* Calls are inlined before differentiating, so a call_output reached by a derivative reads
 * a loop's carry; the loop's own rule reports first (it runs before, or fails the trace). */
static void nbi_vjp_call_output(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    (void)ct;
    (void)in_ct;
    if (node->in[0]->op == NBI_OP_WHILE) {
        nbi_while_report(tr, node->in[0], true);
    } else if (tr->status == NB_OK) {
        nbi_trace_err(tr, NB_ERR_INTERNAL, "reverse mode reached the output of a %s op",
                      nbi_op_name((nbi_op)node->in[0]->op));
    }
}

static nb_var *nbi_jvp_call_output(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    (void)tan;
    if (node->in[0]->op == NBI_OP_WHILE) {
        nbi_while_report(tr, node->in[0], false);
    } else if (tr->status == NB_OK) {
        nbi_trace_err(tr, NB_ERR_INTERNAL, "forward mode reached the output of a %s op",
                      nbi_op_name((nbi_op)node->in[0]->op));
    }
    return NULL;
}

const nbi_op_info nbi_opinfo_call_output = {.name = "call_output",
                                            .n_in = 1,
                                            .infer = nbi_infer_call_output,
                                            .kernel = nbi_k_call_output,
                                            .vjp = nbi_vjp_call_output,
                                            .jvp = nbi_jvp_call_output,
                                            .vmap = nbi_vmap_refuse};

/* ---- run-time checks ------------------------------------------------------------------ */

typedef struct nbi_check_state {
    bool set;
    nbi_check_fmt fmt;
    double vals[NBI_CHECK_VALUES];
    char text[512]; /* fmt NULL: the message itself (nbi_check_fail_text) */
} nbi_check_state;

static _Thread_local nbi_check_state nbi_check_tl;

static void nbi_k_check(const nbi_kargs *k) {
    const nb_var *n = k->node;
    if (n->size > 0 && k->out != k->in[0]) {
        memcpy(k->out, k->in[0], (size_t)n->size * nb_dtype_size(n->dtype));
    }
    if (!nbi_check_tl.set && *(const bool *)k->in[1]) {
        nbi_check_tl.set = true;
        nbi_check_tl.fmt = (nbi_check_fmt)(uintptr_t)n->at.callee;
        int64_t m = n->in[2]->size < NBI_CHECK_VALUES ? n->in[2]->size : NBI_CHECK_VALUES;
        memset(nbi_check_tl.vals, 0, sizeof nbi_check_tl.vals);
        memcpy(nbi_check_tl.vals, k->in[2], (size_t)m * sizeof(double));
    }
}

static nb_status nbi_infer_check(nb_trace *tr, nb_var *p) {
    const nb_var *f = p->in[1], *v = p->in[2];
    if (f->dtype != NB_DTYPE_BOOL || f->rank != 0 || v->dtype != NB_DTYPE_F64 || v->rank != 1) {
        return nbi_trace_err(tr, NB_ERR_INTERNAL, "check: needs a 0-d bool and f64 values");
    }
    p->dtype = p->in[0]->dtype;
    p->rank = p->in[0]->rank;
    memcpy(p->shape, p->in[0]->shape, sizeof p->shape);
    return NB_OK;
}

nb_var *nbi_check(nb_var *x, nb_var *fail, nb_var *vals, nbi_check_fmt fmt) {
    nb_var *in[3] = {x, fail, vals};
    bool poisoned = false;
    nb_trace *tr = nbi_trace_of(3, in, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.callee = (void *)(uintptr_t)fmt;
    return nbi_emit(tr, NBI_OP_CHECK, 3, in, &at);
}

void nbi_check_clear(void) {
    nbi_check_tl.set = false;
}

bool nbi_check_failed(void) {
    return nbi_check_tl.set;
}

bool nbi_check_fail_text(const char *msg) {
    if (nbi_check_tl.set) {
        return false;
    }
    nbi_check_tl.set = true;
    nbi_check_tl.fmt = NULL;
    snprintf(nbi_check_tl.text, sizeof nbi_check_tl.text, "%s", msg);
    return true;
}

nb_status nbi_check_take(nb_ctx *ctx) {
    if (!nbi_check_tl.set) {
        return NB_OK;
    }
    nbi_check_tl.set = false;
    char msg[512] = "a run-time check failed";
    if (nbi_check_tl.fmt != NULL) {
        nbi_check_tl.fmt(msg, sizeof msg, nbi_check_tl.vals);
    } else if (nbi_check_tl.text[0] != '\0') {
        snprintf(msg, sizeof msg, "%s", nbi_check_tl.text);
    }
    return nbi_err(ctx, NB_ERR_RUNTIME, "%s", msg);
}

/* The derivatives pass through checked again: under nb_grad the checked value itself may
 * be dead (only cotangents are outputs), so the check rides on the derivative. */
static void nbi_vjp_check(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    (void)tr;
    in_ct[0] = nbi_check(ct, node->in[1], node->in[2], (nbi_check_fmt)(uintptr_t)node->at.callee);
}

static nb_var *nbi_jvp_check(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    (void)tr;
    return tan[0] == NULL ? NULL
                          : nbi_check(tan[0], node->in[1], node->in[2],
                                      (nbi_check_fmt)(uintptr_t)node->at.callee);
}

/* ---- nb_debug_print ------------------------------------------------------------------ */

/* out = x, and "label: <x as numpy prints it>" to the context's log (or stderr). in[1] holds
 * the label's bytes as i32 (a constant kept by the executable); at.callee is the context,
 * at.ivalue the print's number in its trace (so no two prints are ever merged). */
static void nbi_k_print(const nbi_kargs *k) {
    const nb_var *n = k->node;
    size_t bytes = (size_t)n->size * nb_dtype_size(n->dtype);
    if (bytes > 0 && k->out != k->in[0]) {
        memcpy(k->out, k->in[0], bytes);
    }
    if (nbi_native_shadow_run()) {
        return; /* NABLA_NATIVE=check's extra run of the same step: print once */
    }
    nb_ctx *ctx = n->at.callee;
    char label[256];
    int64_t len = n->in[1]->size < 255 ? n->in[1]->size : 255;
    for (int64_t i = 0; i < len; i++) {
        label[i] = (char)((const int32_t *)k->in[1])[i];
    }
    label[len] = '\0';
    /* the value as an array of its own, without copying or allocating one */
    nb_array a;
    memset(&a, 0, sizeof a);
    a.hdr.magic = NBI_MAGIC_ARRAY;
    a.hdr.ctx = ctx;
    a.hdr.refcount = 1;
    a.dtype = n->dtype;
    a.rank = n->rank;
    memcpy(a.shape, n->shape, sizeof a.shape);
    a.size = n->size;
    a.nbytes = bytes;
    a.data = (void *)k->in[0];
    size_t need = 0;
    (void)nb_array_format(&a, NULL, 0, &need);
    size_t cap = strlen(label) + 2 + need + 1;
    char *text = nbi_alloc(ctx, cap, 8); /* printing is for debugging: it may allocate */
    if (text == NULL) {
        nbi_print_line(ctx, label);
        return;
    }
    int off = snprintf(text, cap, "%s: ", label);
    (void)nb_array_format(&a, text + off, cap - (size_t)off, NULL);
    nbi_print_line(ctx, text);
    nbi_free(ctx, text, cap);
}

static nb_status nbi_infer_print(nb_trace *tr, nb_var *p) {
    if (p->in[1]->dtype != NB_DTYPE_I32 || p->in[1]->rank != 1) {
        return nbi_trace_err(tr, NB_ERR_INTERNAL, "print: needs the label as i32[n]");
    }
    p->dtype = p->in[0]->dtype;
    p->rank = p->in[0]->rank;
    memcpy(p->shape, p->in[0]->shape, sizeof p->shape);
    return NB_OK;
}

/* Derivatives pass through; the print stays where it was (the primal values). */
static void nbi_vjp_print(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    (void)tr;
    (void)node;
    in_ct[0] = ct;
}

static nb_var *nbi_jvp_print(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    (void)tr;
    (void)node;
    return tan[0];
}

nb_var *nb_debug_print(nb_var *x, const char *label) {
    bool poisoned = false;
    nb_trace *tr = nbi_trace_of(1, &x, &poisoned);
    if (tr == NULL) {
        tr = nbi_trace_current();
        return tr != NULL ? nbi_trace_errv(tr, NB_ERR_MISUSE, "nb_debug_print: x is a NULL var")
                          : NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    if (label == NULL) {
        return nbi_trace_errv(tr, NB_ERR_MISUSE,
                              "nb_debug_print: label is NULL (pass a string, \"\" for none)");
    }
    size_t len = strlen(label);
    if (len > 255) {
        len = 255; /* the first 255 bytes */
    }
    int32_t codes[256];
    for (size_t i = 0; i < len; i++) {
        codes[i] = (int32_t)(unsigned char)label[i];
    }
    nb_array *la = NULL;
    int64_t n = (int64_t)len;
    if (nb_array_from_data(tr->ctx, NB_DTYPE_I32, 1, &n, codes, &la) != NB_OK) {
        return nbi_trace_errv(tr, NB_ERR_OOM, "nb_debug_print: out of memory");
    }
    nb_var *lv = nb_constant(tr, la);
    nb_array_destroy(la);
    static _Thread_local int64_t serial;
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.callee = tr->ctx;
    at.ivalue = ++serial;
    nb_var *in[2] = {x, lv};
    return nbi_emit(tr, NBI_OP_PRINT, 2, in, &at);
}

const nbi_op_info nbi_opinfo_print = {.name = "print",
                                      .n_in = 2,
                                      .infer = nbi_infer_print,
                                      .kernel = nbi_k_print,
                                      .nondiff = 2,
                                      .vjp = nbi_vjp_print,
                                      .jvp = nbi_jvp_print,
                                      .vmap = nbi_vmap_same};

const nbi_op_info nbi_opinfo_check = {.name = "check",
                                      .n_in = 3,
                                      .infer = nbi_infer_check,
                                      .kernel = nbi_k_check,
                                      .nondiff = 6,
                                      .vjp = nbi_vjp_check,
                                      .jvp = nbi_jvp_check,
                                      .vmap = nbi_vmap_check};
