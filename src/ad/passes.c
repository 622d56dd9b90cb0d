/*
 * passes.c -- graph -> graph passes: constant folding, common-subexpression elimination,
 * dead-code elimination, and the rest. Each builds a new graph (in the arena nbi_optimize
 * gives it: intermediate graphs are freed once read) and is followed by the verifier in
 * Debug builds and when NABLA_VERIFY_IR is set.
 */
#include "ad/ir.h"

#include <math.h>
#include <string.h>

/* Copy node v into out with its inputs remapped through map (old id -> new node). */
static nb_var *nbi_copy_node(nbi_graph *out, const nb_var *v, nb_var *const *map) {
    nb_var proto = *v;
    nb_var *ins[64];
    nb_var **in = ins;
    if (v->n_in > 64) {
        in = nbi_arena_alloc(out->arena, (size_t)v->n_in * sizeof(nb_var *));
        if (in == NULL) {
            return NULL;
        }
    }
    for (int32_t j = 0; j < v->n_in; j++) {
        in[j] = map[v->in[j]->id];
    }
    proto.in = in;
    if (v->op == NBI_OP_FUSED) {
        /* a fused node's program lives in its graph's arena, which is freed once the next
         * graph is built: the copy gets its own */
        nbi_fprog *prog = nbi_arena_alloc_raw(out->arena, sizeof(nbi_fprog));
        if (prog == NULL) {
            return NULL;
        }
        *prog = *(const nbi_fprog *)v->at.callee;
        proto.at.callee = prog;
    }
    return nbi_graph_add(out, &proto);
}

/* Start out in the arena nbi_optimize chose (out->arena; else in's); allocate the id map. */
static nb_status nbi_pass_begin(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out, nb_var ***map,
                                const char *pass) {
    nbi_arena *oa = out->arena != NULL ? out->arena : in->arena; /* set by nbi_optimize */
    nbi_graph_init(out, oa);
    *map = nbi_arena_alloc(in->arena, (size_t)(in->n_nodes + 1) * sizeof(nb_var *));
    out->inputs = nbi_arena_alloc(oa, (size_t)(in->n_inputs + 1) * sizeof(nb_var *));
    out->outputs = nbi_arena_alloc(oa, (size_t)(in->n_outputs + 1) * sizeof(nb_var *));
    if (*map == NULL || out->inputs == NULL || out->outputs == NULL) {
        return nbi_err(ctx, NB_ERR_OOM, "%s: out of memory", pass);
    }
    out->n_inputs = in->n_inputs;
    out->n_outputs = in->n_outputs;
    out->n_fixed = in->n_fixed;
    return NB_OK;
}

static nb_status nbi_pass_end(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out, nb_var **map,
                              const char *pass) {
    for (int32_t i = 0; i < in->n_outputs; i++) {
        out->outputs[i] = map[in->outputs[i]->id];
    }
    return nbi_verify_ir_enabled() ? nbi_graph_verify(ctx, out, pass) : NB_OK;
}

/* Keep a node when it is a param (inputs never change) or reaches an output. */
nb_status nbi_pass_dce(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out) {
    nb_var **map = NULL;
    nb_status st = nbi_pass_begin(ctx, in, out, &map, "dce");
    if (st != NB_OK) {
        return st;
    }
    bool *live = nbi_arena_alloc(in->arena, (size_t)(in->n_nodes + 1));
    if (live == NULL) {
        return nbi_err(ctx, NB_ERR_OOM, "dce: out of memory");
    }
    for (int32_t i = 0; i < in->n_outputs; i++) {
        live[in->outputs[i]->id] = true;
    }
    for (int32_t i = in->n_nodes - 1; i >= 0; i--) {
        const nb_var *v = in->nodes[i];
        if (v->op == NBI_OP_PARAM || v->op == NBI_OP_PRINT) {
            live[i] = true; /* a print is kept for what it does, used or not */
        }
        if (live[i]) {
            for (int32_t j = 0; j < v->n_in; j++) {
                live[v->in[j]->id] = true;
            }
        }
    }
    int32_t k = 0;
    for (int32_t i = 0; i < in->n_nodes; i++) {
        if (!live[i]) {
            continue;
        }
        map[i] = nbi_copy_node(out, in->nodes[i], map);
        if (map[i] == NULL) {
            return nbi_err(ctx, NB_ERR_OOM, "dce: out of memory");
        }
        if (map[i]->op == NBI_OP_PARAM) {
            out->inputs[k++] = map[i];
        }
    }
    return nbi_pass_end(ctx, in, out, map, "dce");
}

/* ---- CSE ---------------------------------------------------------------------------- */

static uint64_t nbi_mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

static uint64_t nbi_bits(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

/* Attributes compared field by field (never by memcmp: padding is not ours to trust). */
static bool nbi_attrs_equal(const nbi_attrs *a, const nbi_attrs *b) {
    if (a->n_axes != b->n_axes || a->axis != b->axis || a->keepdims != b->keepdims ||
        nbi_bits(a->value) != nbi_bits(b->value) || a->ivalue != b->ivalue || a->to != b->to ||
        a->array != b->array || a->callee != b->callee || a->callee2 != b->callee2 ||
        a->callee3 != b->callee3) {
        return false;
    }
    for (int i = 0; i < NB_MAX_RANK; i++) {
        if (a->axes[i] != b->axes[i] || a->a[i] != b->a[i] || a->b[i] != b->b[i] ||
            a->c[i] != b->c[i]) {
            return false;
        }
    }
    return true;
}

static uint64_t nbi_node_hash(const nb_var *v) {
    uint64_t h = nbi_mix(0, v->op);
    h = nbi_mix(h, (uint64_t)v->dtype);
    h = nbi_mix(h, (uint64_t)(int64_t)v->rank);
    for (int i = 0; i < v->rank; i++) {
        h = nbi_mix(h, (uint64_t)v->shape[i]);
    }
    for (int32_t j = 0; j < v->n_in; j++) {
        h = nbi_mix(h, (uint64_t)v->in[j]->id);
    }
    h = nbi_mix(h, nbi_bits(v->at.value));
    h = nbi_mix(h, (uint64_t)v->at.ivalue);
    h = nbi_mix(h, (uint64_t)(uintptr_t)v->at.array);
    for (int i = 0; i < NB_MAX_RANK; i++) {
        h = nbi_mix(h, (uint64_t)v->at.a[i] ^ ((uint64_t)v->at.axes[i] << 32));
    }
    return h;
}

static bool nbi_node_same(const nb_var *a, const nb_var *b) {
    if (a->op != b->op || a->dtype != b->dtype || a->rank != b->rank || a->n_in != b->n_in ||
        (a->flags & NBI_NODE_WEAK) != (b->flags & NBI_NODE_WEAK)) {
        return false;
    }
    for (int i = 0; i < a->rank; i++) {
        if (a->shape[i] != b->shape[i]) {
            return false;
        }
    }
    for (int32_t j = 0; j < a->n_in; j++) {
        if (a->in[j] != b->in[j]) {
            return false;
        }
    }
    return nbi_attrs_equal(&a->at, &b->at);
}

nb_status nbi_pass_cse(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out) {
    nb_var **map = NULL;
    nb_status st = nbi_pass_begin(ctx, in, out, &map, "cse");
    if (st != NB_OK) {
        return st;
    }
    size_t cap = 16;
    while (cap < (size_t)in->n_nodes * 2) {
        cap *= 2;
    }
    nb_var **table = nbi_arena_alloc(in->arena, cap * sizeof(nb_var *));
    if (table == NULL) {
        return nbi_err(ctx, NB_ERR_OOM, "cse: out of memory");
    }
    int32_t k = 0;
    for (int32_t i = 0; i < in->n_nodes; i++) {
        const nb_var *v = in->nodes[i];
        if (v->op == NBI_OP_PARAM) {
            map[i] = nbi_copy_node(out, v, map);
            if (map[i] == NULL) {
                return nbi_err(ctx, NB_ERR_OOM, "cse: out of memory");
            }
            out->inputs[k++] = map[i];
            continue;
        }
        /* Look the remapped node up before adding it. */
        nb_var probe = *v;
        nb_var *ins[64];
        nb_var **pin = ins;
        if (v->n_in > 64) {
            pin = nbi_arena_alloc(in->arena, (size_t)v->n_in * sizeof(nb_var *));
            if (pin == NULL) {
                return nbi_err(ctx, NB_ERR_OOM, "cse: out of memory");
            }
        }
        for (int32_t j = 0; j < v->n_in; j++) {
            pin[j] = map[v->in[j]->id];
        }
        probe.in = pin;
        uint64_t h = nbi_node_hash(&probe);
        size_t slot = (size_t)h & (cap - 1);
        nb_var *found = NULL;
        while (table[slot] != NULL) {
            if (nbi_node_same(table[slot], &probe)) {
                found = table[slot];
                break;
            }
            slot = (slot + 1) & (cap - 1);
        }
        if (found != NULL) {
            map[i] = found;
            continue;
        }
        map[i] = nbi_graph_add(out, &probe);
        if (map[i] == NULL) {
            return nbi_err(ctx, NB_ERR_OOM, "cse: out of memory");
        }
        table[slot] = map[i];
    }
    return nbi_pass_end(ctx, in, out, map, "cse");
}

/* ---- constant folding --------------------------------------------------------------- */

#define NBI_FOLD_MAX_ELEMS (1 << 16)

static bool nbi_is_const_source(const nb_var *v) {
    return v->op == NBI_OP_CONST || v->op == NBI_OP_FULL || v->op == NBI_OP_IOTA;
}

/* The data of a constant node of the new graph, materialised into an array the arena
 * owns (FULL and IOTA are run through their kernels). */
static nb_status nbi_const_data(nb_ctx *ctx, nbi_arena *arena, nb_var *v, const void **data) {
    if (v->op == NBI_OP_CONST) {
        *data = nb_array_data(v->at.array);
        return NB_OK;
    }
    nb_array *a = NULL;
    nb_status st = nbi_array_new(ctx, "fold", v->dtype, v->rank, v->shape, &a);
    if (st != NB_OK) {
        return st;
    }
    if (!nbi_arena_own_array(arena, a)) {
        return nbi_err(ctx, NB_ERR_OOM, "fold: out of memory");
    }
    nbi_run_kernel(v, nb_array_data(a), NULL, NULL);
    *data = nb_array_data(a);
    return NB_OK;
}

/* Are all of a's elements the same bits, a value a full of a's dtype makes exactly (the
 * double *value converts back to those bits)? One element: no (a constant stays). */
static bool nbi_fold_uniform(const nb_array *a, double *value) {
    int64_t n = nb_array_size(a);
    size_t es = nb_dtype_size(nb_array_dtype(a));
    const unsigned char *d = nb_array_data(a);
    if (n < 2 || es == 0) {
        return false;
    }
    for (int64_t i = 1; i < n; i++) {
        if (memcmp(d, d + (size_t)i * es, es) != 0) {
            return false;
        }
    }
    double x = 0;
    if (nb_array_get_flat(a, 0, &x) != NB_OK) {
        return false;
    }
    unsigned char back[16] = {0};
    nb_dtype dt = nb_array_dtype(a);
    if (dt == NB_DTYPE_F32) {
        float f = (float)x;
        memcpy(back, &f, sizeof f);
    } else if (dt == NB_DTYPE_F64) {
        memcpy(back, &x, sizeof x);
    } else if (dt == NB_DTYPE_I32) {
        int32_t q = (int32_t)x;
        memcpy(back, &q, sizeof q);
    } else if (dt == NB_DTYPE_I64) {
        if (!(fabs(x) < 9007199254740992.0)) {
            return false; /* beyond 2^53 a double cannot hold every i64 */
        }
        int64_t q = (int64_t)x;
        memcpy(back, &q, sizeof q);
    } else if (dt == NB_DTYPE_BOOL) {
        back[0] = x != 0;
    } else {
        return false;
    }
    if (es > sizeof back || memcmp(back, d, es) != 0) {
        return false;
    }
    *value = x;
    return true;
}

nb_status nbi_pass_fold(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out) {
    nb_var **map = NULL;
    nb_status st = nbi_pass_begin(ctx, in, out, &map, "fold");
    if (st != NB_OK) {
        return st;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < in->n_nodes; i++) {
        const nb_var *v = in->nodes[i];
        bool foldable = !nbi_is_const_source(v) && v->op != NBI_OP_PARAM && v->op != NBI_OP_CALL &&
                        v->op != NBI_OP_CALL_OUTPUT && v->op != NBI_OP_WHILE &&
                        v->op != NBI_OP_LOOP_REVERSE && v->op != NBI_OP_CHECK &&
                        v->op != NBI_OP_PRINT && v->n_in > 0 && v->size <= NBI_FOLD_MAX_ELEMS;
        for (int32_t j = 0; foldable && j < v->n_in; j++) {
            foldable = nbi_is_const_source(map[v->in[j]->id]) &&
                       map[v->in[j]->id]->size <= NBI_FOLD_MAX_ELEMS;
        }
        if (!foldable) {
            map[i] = nbi_copy_node(out, v, map);
            if (map[i] == NULL) {
                return nbi_err(ctx, NB_ERR_OOM, "fold: out of memory");
            }
            if (v->op == NBI_OP_PARAM) {
                out->inputs[k++] = map[i];
            }
            continue;
        }
        /* Evaluate the node now, on its constant inputs, with the executor's own kernel. */
        const void *ins[64];
        if (v->n_in > 64) {
            map[i] = nbi_copy_node(out, v, map);
            if (map[i] == NULL) {
                return nbi_err(ctx, NB_ERR_OOM, "fold: out of memory");
            }
            continue;
        }
        for (int32_t j = 0; j < v->n_in; j++) {
            st = nbi_const_data(ctx, in->arena, map[v->in[j]->id], &ins[j]);
            if (st != NB_OK) {
                return st;
            }
        }
        nb_array *res = NULL;
        st = nbi_array_new(ctx, "fold", v->dtype, v->rank, v->shape, &res);
        if (st != NB_OK) {
            return st;
        }
        if (!nbi_arena_own_array(in->arena, res)) {
            return nbi_err(ctx, NB_ERR_OOM, "fold: out of memory");
        }
        const nbi_op_info *info = nbi_op_get((nbi_op)v->op);
        size_t sbytes = info->scratch ? info->scratch(v) : 0;
        void *scratch = NULL;
        if (sbytes > 0) {
            scratch = nbi_arena_alloc(in->arena, sbytes + 64);
            if (scratch == NULL) {
                return nbi_err(ctx, NB_ERR_OOM, "fold: out of memory");
            }
            scratch = (void *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
        }
        /* The kernel sees the original node (its inputs' shapes are unchanged). */
        nbi_run_kernel(v, nb_array_data(res), ins, scratch);
        nb_var proto;
        memset(&proto, 0, sizeof proto);
        proto.op = NBI_OP_CONST;
        proto.dtype = v->dtype;
        proto.rank = v->rank;
        memcpy(proto.shape, v->shape, sizeof proto.shape);
        proto.size = v->size;
        proto.at.array = res;
        proto.flags = v->flags & NBI_NODE_WEAK;
        double uv = 0;
        if (nbi_fold_uniform(res, &uv)) {
            /* every element the same bits: a full of that value, which the algebra sees (a
             * gradient's ones times x is x) and which takes no stored array */
            proto.op = NBI_OP_FULL;
            proto.at.array = NULL;
            proto.at.value = uv;
            proto.at.to = v->dtype; /* a full's dtype and shape are its attributes */
            proto.at.n_axes = v->rank;
            for (int d = 0; d < v->rank; d++) {
                proto.at.a[d] = v->shape[d];
            }
        }
        map[i] = nbi_graph_add(out, &proto);
        if (map[i] == NULL) {
            return nbi_err(ctx, NB_ERR_OOM, "fold: out of memory");
        }
    }
    return nbi_pass_end(ctx, in, out, map, "fold");
}

/* ---- transposes into matmul strides ------------------------------------------------- */

/* A transpose that swaps only the last two axes. */
static bool nbi_is_matrix_transpose(const nb_var *v) {
    if (v->op != NBI_OP_TRANSPOSE || v->rank < 2) {
        return false;
    }
    int r = v->rank;
    for (int i = 0; i < r - 2; i++) {
        if (v->at.axes[i] != i) {
            return false;
        }
    }
    return v->at.axes[r - 2] == r - 1 && v->at.axes[r - 1] == r - 2;
}

/* ---- algebraic simplification --------------------------------------------------------
 * Only rewrites that are exact, bit for bit, for every input (so x + 0 -> x is NOT done:
 * -0 + 0 is +0). A rewrite that keeps an existing value requires that value to have the
 * node's dtype and shape already. */

static bool nbi_same_type(const nb_var *a, const nb_var *b) {
    if (a->dtype != b->dtype || a->rank != b->rank) {
        return false;
    }
    for (int i = 0; i < a->rank; i++) {
        if (a->shape[i] != b->shape[i]) {
            return false;
        }
    }
    return true;
}

/* Is v a constant whose every element is exactly value (the same bits for zeros)? */
static bool nbi_is_const(const nb_var *v, double value) {
    if (v->op == NBI_OP_BROADCAST || v->op == NBI_OP_RESHAPE) {
        return nbi_is_const(v->in[0], value); /* the same values, repeated or rearranged */
    }
    if (v->op == NBI_OP_FULL) {
        double x = v->at.value;
        if (!nb_dtype_is_float(v->dtype)) {
            return x == value; /* the stored double converts to the dtype exactly here */
        }
        double rx = v->dtype == NB_DTYPE_F32 ? (double)(float)x : x;
        return rx == value && signbit(rx) == signbit(value);
    }
    if (v->op == NBI_OP_CONST && v->size >= 1 && v->size <= 64) {
        for (int64_t i = 0; i < v->size; i++) {
            double x = 0;
            nb_array_get_flat(v->at.array, i, &x);
            if (!(x == value && signbit(x) == signbit(value))) {
                return false;
            }
        }
        return true;
    }
    return false;
}

/* An existing value equal to v (whose inputs, already mapped, are in), or NULL. */
static nb_var *nbi_simplify_to_existing(const nb_var *v, nb_var *const *in) {
    switch ((nbi_op)v->op) {
    case NBI_OP_MUL: /* x*1, 1*x */
        if (nbi_is_const(in[1], 1.0) && nbi_same_type(in[0], v)) {
            return in[0];
        }
        if (nbi_is_const(in[0], 1.0) && nbi_same_type(in[1], v)) {
            return in[1];
        }
        return NULL;
    case NBI_OP_DIV: /* x/1 */
        return nbi_is_const(in[1], 1.0) && nbi_same_type(in[0], v) ? in[0] : NULL;
    case NBI_OP_SUB: /* x-0 (also -0 - 0 = -0) */
        return nbi_is_const(in[1], 0.0) && nbi_same_type(in[0], v) ? in[0] : NULL;
    case NBI_OP_ADD: /* x+(-0), (-0)+x */
        if (nbi_is_const(in[1], -0.0) && nbi_same_type(in[0], v)) {
            return in[0];
        }
        if (nbi_is_const(in[0], -0.0) && nbi_same_type(in[1], v)) {
            return in[1];
        }
        return NULL;
    case NBI_OP_NEG: /* neg(neg(x)) */
        return in[0]->op == NBI_OP_NEG && nbi_same_type(in[0]->in[0], v) ? in[0]->in[0] : NULL;
    case NBI_OP_RESHAPE: /* a reshape back to the source's own shape */
        return nbi_same_type(in[0], v)                                           ? in[0]
               : (in[0]->op == NBI_OP_RESHAPE && nbi_same_type(in[0]->in[0], v)) ? in[0]->in[0]
                                                                                 : NULL;
    default:
        return NULL;
    }
}

/* Is reshape v of r (a reduction with keepdims) exactly r's result without its kept
 * dims? */
static bool nbi_drops_kept_dims(const nb_var *v, const nb_var *r) {
    if ((r->op != NBI_OP_SUM && r->op != NBI_OP_MAX && r->op != NBI_OP_MIN &&
         r->op != NBI_OP_PROD) ||
        !r->at.keepdims) {
        return false;
    }
    const nb_var *x = r->in[0];
    int k = 0;
    for (int d = 0; d < x->rank; d++) {
        bool red = false;
        for (int a = 0; a < r->at.n_axes; a++) {
            red = red || r->at.axes[a] == d;
        }
        if (!red) {
            if (k >= v->rank || v->shape[k] != x->shape[d]) {
                return false;
            }
            k++;
        }
    }
    return k == v->rank;
}

nb_status nbi_pass_transpose_matmul(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out) {
    nb_var **map = NULL;
    nb_status st = nbi_pass_begin(ctx, in, out, &map, "transpose-matmul");
    if (st != NB_OK) {
        return st;
    }
    int32_t *uses = nbi_arena_alloc(in->arena, (size_t)(in->n_nodes + 1) * sizeof(int32_t));
    if (uses == NULL) {
        return nbi_err(ctx, NB_ERR_OOM, "transpose-matmul: out of memory");
    }
    for (int32_t i = 0; i < in->n_nodes; i++) {
        for (int32_t j = 0; j < in->nodes[i]->n_in; j++) {
            uses[in->nodes[i]->in[j]->id]++;
        }
    }
    for (int32_t i = 0; i < in->n_outputs; i++) {
        uses[in->outputs[i]->id]++;
    }
    /* loop-invariant nodes of a loop body (depending only on its bound data, the first
     * n_fixed inputs): a transpose of one stays a node of its own, made once per loop (the
     * executable's prefix), where folded into the product it would be copied row-major
     * every step (nbi_mm_pack; the same bits either way) */
    bool *inv = nbi_arena_alloc(in->arena, (size_t)in->n_nodes + 1);
    if (inv == NULL) {
        return nbi_err(ctx, NB_ERR_OOM, "transpose-matmul: out of memory");
    }
    for (int32_t i = 0; i < in->n_nodes; i++) {
        const nb_var *v = in->nodes[i];
        bool x = v->op == NBI_OP_PARAM ? v->at.ivalue < in->n_fixed
                                       : in->n_fixed > 0 && v->op != NBI_OP_PRINT &&
                                             v->op != NBI_OP_CHECK && v->op != NBI_OP_CALL &&
                                             v->op != NBI_OP_WHILE && v->op != NBI_OP_LOOP_REVERSE;
        for (int32_t j = 0; x && j < v->n_in; j++) {
            x = inv[v->in[j]->id];
        }
        inv[i] = x;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < in->n_nodes; i++) {
        const nb_var *v = in->nodes[i];
        nb_var proto = *v;
        nb_var *ins[2];
        if (v->op == NBI_OP_IDENTITY || v->op == NBI_OP_STOP_GRADIENT ||
            v->op == NBI_OP_CUSTOM_VJP || v->op == NBI_OP_CUSTOM_JVP || v->op == NBI_OP_IMPLICIT) {
            /* forward-identities: the value itself (their role ended with autodiff) */
            map[i] = map[v->in[0]->id];
            continue;
        }
        /* algebra: keep an existing value, or rebuild a chain as one node */
        nb_var *mapped[4];
        if (v->n_in <= 4) {
            for (int32_t j = 0; j < v->n_in; j++) {
                mapped[j] = map[v->in[j]->id];
            }
            nb_var *same = nbi_simplify_to_existing(v, mapped);
            if (same != NULL) {
                map[i] = same;
                continue;
            }
        }
        if (v->op == NBI_OP_RESHAPE && map[v->in[0]->id]->op == NBI_OP_RESHAPE) {
            nb_var *src = map[v->in[0]->id]->in[0]; /* reshape(reshape(x)) = reshape(x) */
            proto.in = &src;
            map[i] = nbi_graph_add(out, &proto);
        } else if (v->op == NBI_OP_RESHAPE && uses[v->in[0]->id] == 1 &&
                   nbi_drops_kept_dims(v, map[v->in[0]->id])) {
            /* reshape(sum(x, keepdims)) dropping the kept dims = sum(x): one kernel, not a
             * reduction and a copy (every gradient of a broadcast bias ends so) */
            const nb_var *red = map[v->in[0]->id];
            proto = *red;
            proto.at.keepdims = false;
            proto.rank = v->rank;
            memcpy(proto.shape, v->shape, sizeof proto.shape);
            map[i] = nbi_graph_add(out, &proto);
        } else if (v->op == NBI_OP_TRANSPOSE && map[v->in[0]->id]->op == NBI_OP_TRANSPOSE) {
            /* transpose(transpose(x, p1), p2) = transpose(x, p1[p2[i]]), or x itself */
            const nb_var *inner = map[v->in[0]->id];
            nb_var *src = inner->in[0];
            bool ident = true;
            for (int a = 0; a < v->rank; a++) {
                proto.at.axes[a] = inner->at.axes[v->at.axes[a]];
                ident = ident && proto.at.axes[a] == a;
            }
            if (ident) {
                map[i] = src;
                continue;
            }
            proto.in = &src;
            map[i] = nbi_graph_add(out, &proto);
        } else if (nbi_is_matrix_transpose(v) && v->in[0]->op == NBI_OP_MATMUL &&
                   uses[v->in[0]->id] == 1 && map[v->in[0]->id]->op == NBI_OP_MATMUL &&
                   map[v->in[0]->id]->n_in == 2 && map[v->in[0]->id]->in[0]->rank >= 2 &&
                   map[v->in[0]->id]->in[1]->rank >= 2) {
            /* transpose(op(a) @ op(b)) = op(b)^T @ op(a)^T: the product made transposed, read
             * through swapped strides, instead of made and then copied (every weight
             * gradient of x @ w^T, a Linear's or a recurrent cell's, ends so). Only when the
             * transpose is the product's one reader (a product read elsewhere too is made
             * once and copied); the old product is left for DCE. The bits are those of the
             * swapped product: exact for integers and nabla's own loops (each output summed
             * over k in order), but BLIS may sum the swapped problem in another order, so a
             * product's transpose alone can differ in the last bits from the transpose of
             * that product when the product is also read -- deterministic either way (run to
             * run, any thread count, interpreter or native code). */
            const nb_var *mm = map[v->in[0]->id];
            proto = *mm;
            proto.rank = v->rank;
            memcpy(proto.shape, v->shape, sizeof proto.shape);
            ins[0] = mm->in[1];
            ins[1] = mm->in[0];
            proto.at.axes[0] = !mm->at.axes[1];
            proto.at.axes[1] = !mm->at.axes[0];
            proto.in = ins;
            map[i] = nbi_graph_add(out, &proto);
        } else if (nbi_op_get((nbi_op)v->op)->elementwise && v->n_in >= 2 && v->n_in <= 4) {
            /* an explicit broadcast feeding an elementwise op: the op broadcasts itself */
            int r = 0;
            int64_t shape[NB_MAX_RANK];
            for (int32_t j = 0; j < v->n_in; j++) {
                nb_var *m = mapped[j];
                if (m->op == NBI_OP_BROADCAST) {
                    mapped[j] = m->in[0];
                }
            }
            bool ok = true;
            r = mapped[0]->rank;
            memcpy(shape, mapped[0]->shape, sizeof shape);
            for (int32_t j = 1; j < v->n_in && ok; j++) {
                int64_t s2[NB_MAX_RANK];
                int r2 = 0;
                ok = nbi_broadcast_shapes(r, shape, mapped[j]->rank, mapped[j]->shape, &r2, s2);
                r = r2;
                memcpy(shape, s2, sizeof shape);
            }
            ok = ok && r == v->rank && memcmp(shape, v->shape, (size_t)r * sizeof(int64_t)) == 0;
            if (ok) {
                proto.in = mapped;
                map[i] = nbi_graph_add(out, &proto);
            } else {
                map[i] = nbi_copy_node(out, v, map);
            }
        } else if (v->op == NBI_OP_MATMUL) {
            int64_t batch = 1;
            for (int d = 0; d + 2 < v->rank; d++) {
                batch *= v->shape[d];
            }
            for (int j = 0; j < 2; j++) {
                nb_var *src = map[v->in[j]->id];
                /* matmul(transpose(w)) = matmul(w) with w read through swapped strides --
                 * but not a matrix that every product of a batch shares (a convolution's
                 * weight, transposed for its input gradient): transposed once, where folded
                 * it would be copied row-major for each product (nbi_mm_pack, 64 times for a
                 * batch of 64; the same bits either way) */
                bool shared = batch > 1 && src->rank == 2;
                if (nbi_is_matrix_transpose(src) && !inv[v->in[j]->id] && !shared) {
                    ins[j] = src->in[0];
                    proto.at.axes[j] = !proto.at.axes[j];
                } else {
                    ins[j] = src;
                }
            }
            proto.in = ins;
            map[i] = nbi_graph_add(out, &proto);
        } else {
            map[i] = nbi_copy_node(out, v, map);
        }
        if (map[i] == NULL) {
            return nbi_err(ctx, NB_ERR_OOM, "transpose-matmul: out of memory");
        }
        if (v->op == NBI_OP_PARAM) {
            out->inputs[k++] = map[i];
        }
    }
    return nbi_pass_end(ctx, in, out, map, "transpose-matmul");
}

/* ---- elementwise fusion ---------------------------------------------------------------
 * A cluster grows from its root (its last node) backwards through inputs that are
 * elementwise and have the root's shape, and sideways to earlier clusters of that shape
 * that read one of its inputs of that shape (siblings: the input is then read once). Each
 * cluster of two or more nodes becomes one fused node whose program replays the members
 * in order (src/exec/fused.c), in the root's place; a member needed outside the cluster (an
 * output of the graph, or read by a node outside) is stored by the same kernel as a
 * fused_output node -- Adam's new moments and parameters come from one pass over g, mu,
 * nu and p. So a cluster may only take in a node none of whose readers outside comes
 * before the root (they would read the value before the fused node makes it). An
 * external input that is a slice, a pad or an explicit broadcast to the root's shape is
 * read through a view of the node it slices, pads or broadcasts instead (no copy); that
 * node stays only if something else uses it. A sum, max or min over the innermost dims
 * whose input is a cluster's root takes the cluster in as its trailing reduction: the
 * mapped values are reduced tile by tile (and stored only where needed elsewhere). Such a
 * cluster is closed: nothing fuses it further. */

bool nbi_is_map(const nb_var *v) {
    return nbi_op_get((nbi_op)v->op)->elementwise && v->op != NBI_OP_IDENTITY &&
           v->op != NBI_OP_STOP_GRADIENT;
}

static bool nbi_fusible(const nb_var *v) {
    return nbi_is_map(v) && v->n_in >= 1 && v->n_in <= 3;
}

/* The node x is read from when x is a slice or broadcast_to of a non-empty node (that
 * node, with the offset and strides in elements of its row-major buffer, 0 along broadcast
 * dims, per index of x), else x itself (row-major). */
static const nb_var *nbi_view_base(const nb_var *x, int64_t *off, int64_t *st) {
    const nb_var *y = x->in != NULL && x->n_in >= 1 ? x->in[0] : NULL;
    *off = 0;
    if (x->op == NBI_OP_BROADCAST && y->size > 0) {
        nbi_bcast_strides(y->rank, y->shape, x->rank, x->shape, st);
        return y;
    }
    if (x->op == NBI_OP_SLICE && y->size > 0) {
        int64_t ys = 1;
        for (int d = y->rank - 1; d >= 0; d--) {
            *off += x->at.a[d] * ys;
            st[d] = x->at.c[d] * ys;
            ys *= y->shape[d];
        }
        return y;
    }
    int64_t xs = 1;
    for (int d = x->rank - 1; d >= 0; d--) {
        st[d] = xs;
        xs *= x->shape[d];
    }
    return x;
}

/* If src is a slice, pad or broadcast_to with root's shape, make external input e of prog
 * a view (root: the node whose shape is the program's index space): offset and strides
 * per index, and for a pad its low padding, the padded shape and the value; a pad of a
 * slice or broadcast reads through both. Returns the node the view reads, or NULL when
 * src is no view. With prog NULL, only says whether src can be read as a view. */
static const nb_var *nbi_fuse_view(const nb_var *src, const nb_var *root, nbi_fprog *prog,
                                   int32_t e) {
    if ((src->op != NBI_OP_SLICE && src->op != NBI_OP_BROADCAST && src->op != NBI_OP_PAD) ||
        src->rank != root->rank || src->size == 0 || src->in[0]->size == 0) {
        return NULL;
    }
    for (int d = 0; d < root->rank; d++) {
        if (src->shape[d] != root->shape[d] ||
            (src->op == NBI_OP_PAD && (src->at.a[d] < 0 || src->at.b[d] < 0))) {
            return NULL;
        }
    }
    int64_t off = 0, st[NB_MAX_RANK] = {0};
    const nb_var *x = src->in[0], *base = NULL;
    if (src->op == NBI_OP_PAD) { /* x itself, or what x slices or broadcasts */
        base = nbi_view_base(x, &off, st);
    } else {
        base = nbi_view_base(src, &off, st);
    }
    if (prog == NULL) {
        return base; /* only asked whether it can be a view */
    }
    memcpy(prog->view_st[e], st, sizeof st);
    if (src->op == NBI_OP_PAD) {
        for (int d = 0; d < src->rank; d++) {
            prog->pad_lo[e][d] = src->at.a[d];
            prog->pad_dims[e][d] = x->shape[d];
        }
        prog->pad_value[e] = src->at.value;
        prog->pad_mask |= 1u << e;
    }
    prog->view_off[e] = off;
    prog->view_mask |= 1u << e;
    return base;
}

/* A reduction the fused kernel can take as a trailing reduction: sum, max or min keeping
 * its dtype, over a non-empty input, whose reduced dims are the innermost ones once unit
 * dims are ignored (each output reduces one contiguous run of the input). */
static bool nbi_fuse_reduction_ok(const nb_var *v) {
    if (v->op != NBI_OP_SUM && v->op != NBI_OP_MAX && v->op != NBI_OP_MIN) {
        return false;
    }
    const nb_var *x = v->in[0];
    if (x->size == 0 || v->dtype != x->dtype || v->dtype == NB_DTYPE_BOOL) {
        return false;
    }
    bool isred[NB_MAX_RANK] = {false}, seen = false;
    for (int a = 0; a < v->at.n_axes; a++) {
        isred[v->at.axes[a]] = true;
    }
    for (int d = 0; d < x->rank; d++) {
        if (x->shape[d] == 1) {
            continue;
        }
        if (isred[d]) {
            seen = true;
        } else if (seen) {
            return false; /* a kept dim inside the reduced ones: not one run per output */
        }
    }
    return true;
}

/* Is input j of v one of its earlier inputs (x + x reads x once)? Passes count consumers,
 * not edges. */
static bool nbi_input_repeats(const nb_var *v, int32_t j) {
    for (int32_t q = 0; q < j; q++) {
        if (v->in[q] == v->in[j]) {
            return true;
        }
    }
    return false;
}

static bool nbi_same_shape(const nb_var *a, const nb_var *b) {
    if (a->rank != b->rank) {
        return false;
    }
    for (int d = 0; d < a->rank; d++) {
        if (a->shape[d] != b->shape[d]) {
            return false;
        }
    }
    return true;
}

/* ---- pads pushed through elementwise trees ---------------------------------------------
 * pad(f(a, b, ...)), f a tree of elementwise maps of one shape (at most NBI_PUSH_MAX ops;
 * its leaves are nodes of that shape or single elements), becomes
 *     select(inside, f(pad(a), pad(b), ...), value)
 * with the leaves' pads (padding 0) and the mask `inside` (a pad of a broadcast true) read
 * as views by the fused kernel: the tree and the pad fuse into one pass instead of the
 * tree being stored, then copied into the padded array. Where `inside` is true, f sees
 * exactly its old operands; elsewhere its result is discarded for the pad value: the same
 * bits. This is the VJP of a slice (Rosenbrock's x[1:] and x[:-1], stencils): the
 * gradient comes out in one pass over x. */
#define NBI_PUSH_MAX 24

typedef struct nbi_push {
    nbi_graph *out;
    nb_var *const *map;
    const nb_var *pad;                        /* the pad being pushed (in the input graph) */
    nb_status fail;                           /* why a copy failed: NB_ERR_OOM or _INTERNAL */
    const nb_var *orig[NBI_PUSH_MAX * 3 + 1]; /* input-graph nodes already copied ... */
    nb_var *copy[NBI_PUSH_MAX * 3 + 1];       /* ... and their copies */
    int32_t n;
} nbi_push;

/* A new node of op over in (attrs at), typed by the op's own inference. */
static nb_var *nbi_pass_emit(nbi_graph *out, nb_ctx *ctx, nbi_op op, int n_in, nb_var **in,
                             const nbi_attrs *at, nb_status *fail) {
    nb_var proto;
    memset(&proto, 0, sizeof proto);
    proto.op = (uint16_t)op;
    proto.n_in = n_in;
    proto.in = in;
    proto.at = *at;
    nb_trace scratch;
    memset(&scratch, 0, sizeof scratch);
    scratch.ctx = ctx;
    scratch.fn_name = "pad push";
    if (nbi_op_get(op)->infer(&scratch, &proto) != NB_OK) {
        *fail = NB_ERR_INTERNAL; /* a bug: the pushed node is built from valid ones */
        return NULL;
    }
    proto.size = nbi_shape_size(proto.rank, proto.shape);
    return nbi_graph_add(out, &proto); /* NULL: out of memory, *fail stays NB_ERR_OOM */
}

/* ---- sums of disjoint pads: a concatenation ------------------------------------------
 * Reverse mode makes, for a value cut into slices along one axis (a recurrent cell's gate
 * blocks of one product, a split), the sum of the slices' cotangents each padded with
 * zeros to the whole: pad(a) + pad(b) + pad(c). Pushed into their elementwise trees (pad
 * push, below), every element of the whole would compute every piece and select one: the
 * work of all the pieces over the whole shape. When the pads' pieces lie along one axis,
 * disjoint and covering it, the sum is their concatenation -- exactly, each piece added to
 * +0 first: an element's sum is its one piece's value plus zeros, and piece + 0 has the
 * same bits (a -0 becomes +0, a signalling NaN quiet, as in the sum). The add of +0 is
 * elementwise and fuses into the piece's own program. The new nodes carry the sum's
 * source position and function, for debugging reports. */

#define NBI_PADCAT_MAX 16

typedef struct nbi_padcat {
    const nb_var *x[NBI_PADCAT_MAX]; /* the pads' operands (input graph) */
    int64_t lo[NBI_PADCAT_MAX];      /* where each starts on the axis */
    int n, axis;
} nbi_padcat;

/* The leaves of v's tree of same-typed adds under top, each a pad with +0 of top's type
 * along one axis (the same for all), into pc; false when a leaf is anything else. */
static bool nbi_padcat_collect(const nb_var *v, const nb_var *top, nbi_padcat *pc, int depth) {
    if (depth > NBI_PADCAT_MAX || !nbi_same_type(v, top)) {
        return false;
    }
    if (v->op == NBI_OP_ADD && v->n_in == 2) {
        return nbi_padcat_collect(v->in[0], top, pc, depth + 1) &&
               nbi_padcat_collect(v->in[1], top, pc, depth + 1);
    }
    uint64_t bits = 1;
    if (v->op == NBI_OP_PAD) {
        memcpy(&bits, &v->at.value, sizeof bits);
    }
    if (bits != 0 || pc->n >= NBI_PADCAT_MAX || v->in[0]->dtype != v->dtype) {
        return false; /* not a pad with +0 */
    }
    int ax = -1;
    for (int d = 0; d < v->rank; d++) {
        if (v->at.a[d] != 0 || v->at.b[d] != 0) {
            if (ax >= 0) {
                return false; /* padded along two axes */
            }
            ax = d;
        }
    }
    if (ax < 0 || (pc->axis >= 0 && ax != pc->axis)) {
        return false;
    }
    pc->axis = ax;
    pc->x[pc->n] = v->in[0];
    pc->lo[pc->n++] = v->at.a[ax];
    return true;
}

/* Do v's pieces (v an add) cover its axis, disjoint? Sorted by where they start. */
static bool nbi_padcat_of(const nb_var *v, nbi_padcat *pc) {
    memset(pc, 0, sizeof *pc);
    pc->axis = -1;
    if (v->op != NBI_OP_ADD || v->size == 0 || !nb_dtype_is_float(v->dtype) ||
        !nbi_padcat_collect(v, v, pc, 0) || pc->n < 2) {
        return false;
    }
    for (int i = 1; i < pc->n; i++) { /* insertion sort by lo */
        for (int j = i; j > 0 && pc->lo[j] < pc->lo[j - 1]; j--) {
            const nb_var *tx = pc->x[j];
            int64_t tl = pc->lo[j];
            pc->x[j] = pc->x[j - 1];
            pc->lo[j] = pc->lo[j - 1];
            pc->x[j - 1] = tx;
            pc->lo[j - 1] = tl;
        }
    }
    int64_t at = 0;
    for (int i = 0; i < pc->n; i++) {
        if (pc->lo[i] != at || pc->x[i]->shape[pc->axis] == 0) {
            return false; /* a gap, an overlap, or an empty piece */
        }
        at += pc->x[i]->shape[pc->axis];
    }
    return at == v->shape[pc->axis];
}

nb_status nbi_pass_pad_concat(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out) {
    nb_var **map = NULL;
    nb_status st = nbi_pass_begin(ctx, in, out, &map, "pad concat");
    if (st != NB_OK) {
        return st;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < in->n_nodes; i++) {
        const nb_var *v = in->nodes[i];
        nbi_padcat pc;
        nb_status fail = NB_ERR_OOM;
        int32_t first_new = out->n_nodes;
        if (!nbi_padcat_of(v, &pc)) {
            map[i] = nbi_copy_node(out, v, map);
        } else {
            /* +0, a scalar broadcast to each piece's shape and added to it */
            nbi_attrs at;
            memset(&at, 0, sizeof at);
            at.to = v->dtype;
            nb_var *zero = nbi_pass_emit(out, ctx, NBI_OP_FULL, 0, NULL, &at, &fail);
            nb_var *pieces[NBI_PADCAT_MAX];
            for (int p = 0; zero != NULL && p < pc.n; p++) {
                const nb_var *x = pc.x[p];
                memset(&at, 0, sizeof at);
                at.n_axes = x->rank;
                memcpy(at.a, x->shape, sizeof at.a);
                nb_var *bz = nbi_pass_emit(out, ctx, NBI_OP_BROADCAST, 1, &zero, &at, &fail);
                nb_var *add[2] = {map[x->id], bz};
                memset(&at, 0, sizeof at);
                pieces[p] = bz ? nbi_pass_emit(out, ctx, NBI_OP_ADD, 2, add, &at, &fail) : NULL;
                zero = pieces[p] != NULL ? zero : NULL;
            }
            memset(&at, 0, sizeof at);
            at.axis = pc.axis;
            map[i] = zero ? nbi_pass_emit(out, ctx, NBI_OP_CONCAT, pc.n, pieces, &at, &fail) : NULL;
            for (int32_t q = first_new; map[i] != NULL && q < out->n_nodes; q++) {
                out->nodes[q]->src = v->src; /* the sum's, as a debugging report names it */
                out->nodes[q]->fn = v->fn;
            }
        }
        if (map[i] == NULL) {
            return nbi_err(ctx, fail, "pad concat: %s",
                           fail == NB_ERR_INTERNAL ? "a node failed its shape inference"
                                                   : "out of memory");
        }
        if (v->op == NBI_OP_PARAM) {
            out->inputs[k++] = map[i];
        }
    }
    return nbi_pass_end(ctx, in, out, map, "pad concat");
}

/* The tree of u: u, and every elementwise input of u's shape, recursively. Its size, or
 * NBI_PUSH_MAX + 1 once too big. */
static int32_t nbi_push_size(const nb_var *u, const nb_var *top) {
    int32_t n = 1;
    for (int32_t j = 0; j < u->n_in && n <= NBI_PUSH_MAX; j++) {
        const nb_var *w = u->in[j];
        if (nbi_fusible(w) && nbi_same_shape(w, top)) {
            n += nbi_push_size(w, top);
        } else if (w->size != 1 && !nbi_same_shape(w, top)) {
            return NBI_PUSH_MAX + 1; /* a partial broadcast: no pad of it fits */
        }
    }
    return n;
}

/* u's tree copied with its leaves padded like the pad (single elements kept). */
static nb_var *nbi_push_copy(nbi_push *ps, nb_ctx *ctx, const nb_var *u, bool tree) {
    for (int32_t q = 0; q < ps->n; q++) {
        if (ps->orig[q] == u) {
            return ps->copy[q];
        }
    }
    nb_var *c = NULL;
    const nb_var *top = ps->pad->in[0];
    if (!tree && !nbi_same_shape(u, top)) {
        c = ps->map[u->id]; /* one element, broadcast by its consumer as it is */
    } else if (!tree) {     /* a leaf of the tree's shape: padded with zeros */
        nbi_attrs at = ps->pad->at;
        at.value = 0;
        nb_var *in[1] = {ps->map[u->id]};
        c = nbi_pass_emit(ps->out, ctx, NBI_OP_PAD, 1, in, &at, &ps->fail);
    } else {
        nb_var *in[3];
        /* a broadcast of one value read by a binary op (or select) is read as that value,
         * unpadded, as long as another operand keeps the node at the padded shape */
        bool one[3] = {false, false, false}, full = false;
        for (int32_t j = 0; j < u->n_in; j++) {
            const nb_var *w = u->in[j];
            one[j] = u->n_in >= 2 && w->op == NBI_OP_BROADCAST && w->in[0]->size == 1;
            full = full || (!one[j] && nbi_same_shape(w, u)); /* stays padded-shaped */
        }
        for (int32_t j = 0; j < u->n_in; j++) {
            const nb_var *w = u->in[j];
            if (one[j] && (full || j > 0)) {
                in[j] = ps->map[w->in[0]->id];
                continue;
            }
            in[j] = nbi_push_copy(ps, ctx, w, nbi_fusible(w) && nbi_same_shape(w, u));
            if (in[j] == NULL) {
                return NULL;
            }
        }
        nb_var proto = *u; /* the same op over the padded shape */
        proto.in = in;
        proto.rank = ps->pad->rank;
        memcpy(proto.shape, ps->pad->shape, sizeof proto.shape);
        proto.size = ps->pad->size;
        c = nbi_graph_add(ps->out, &proto);
    }
    if (c != NULL && ps->n < (int32_t)(sizeof ps->orig / sizeof ps->orig[0])) {
        ps->orig[ps->n] = u;
        ps->copy[ps->n++] = c;
    }
    return c;
}

nb_status nbi_pass_pad_push(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out) {
    nb_var **map = NULL;
    nb_status st = nbi_pass_begin(ctx, in, out, &map, "pad push");
    if (st != NB_OK) {
        return st;
    }
    int32_t k = 0;
    nb_status ps_fail = NB_ERR_OOM;
    for (int32_t i = 0; i < in->n_nodes; i++) {
        const nb_var *v = in->nodes[i];
        const nb_var *u = v->op == NBI_OP_PAD ? v->in[0] : NULL;
        bool push =
            u != NULL && nbi_fusible(u) && u->size > 0 && nbi_push_size(u, u) <= NBI_PUSH_MAX;
        for (int d = 0; push && d < v->rank; d++) {
            push = v->at.a[d] >= 0 && v->at.b[d] >= 0;
        }
        if (!push) {
            map[i] = nbi_copy_node(out, v, map);
        } else {
            nbi_push ps;
            memset(&ps, 0, sizeof ps);
            ps.out = out;
            ps.map = map;
            ps.pad = v;
            ps.fail = NB_ERR_OOM;
            nb_var *f = nbi_push_copy(&ps, ctx, u, true);
            /* inside = pad(broadcast_to(true, u's shape), false); value as a scalar */
            nbi_attrs at;
            memset(&at, 0, sizeof at);
            at.to = NB_DTYPE_BOOL;
            at.value = 1;
            nb_var *t = f ? nbi_pass_emit(out, ctx, NBI_OP_FULL, 0, NULL, &at, &ps.fail) : NULL;
            memset(&at, 0, sizeof at);
            at.n_axes = u->rank;
            memcpy(at.a, u->shape, sizeof at.a);
            nb_var *bt = t ? nbi_pass_emit(out, ctx, NBI_OP_BROADCAST, 1, &t, &at, &ps.fail) : NULL;
            at = v->at;
            at.value = 0;
            nb_var *mask = bt ? nbi_pass_emit(out, ctx, NBI_OP_PAD, 1, &bt, &at, &ps.fail) : NULL;
            memset(&at, 0, sizeof at);
            at.to = v->dtype;
            at.value = v->at.value;
            nb_var *val =
                mask ? nbi_pass_emit(out, ctx, NBI_OP_FULL, 0, NULL, &at, &ps.fail) : NULL;
            nb_var *sel[3] = {mask, f, val};
            memset(&at, 0, sizeof at);
            map[i] = val ? nbi_pass_emit(out, ctx, NBI_OP_SELECT, 3, sel, &at, &ps.fail) : NULL;
            ps_fail = ps.fail;
        }
        if (map[i] == NULL) {
            return nbi_err(ctx, ps_fail, "pad push: %s",
                           ps_fail == NB_ERR_INTERNAL ? "a pushed node failed its shape inference"
                                                      : "out of memory");
        }
        if (v->op == NBI_OP_PARAM) {
            out->inputs[k++] = map[i];
        }
    }
    return nbi_pass_end(ctx, in, out, map, "pad push");
}

/* ---- sums of products over their rows ---------------------------------------------
 * sum over the rows of a product, sum_i (A B)_ij, is the product of A's row sum,
 * ((1^T A) B)_j: a [1, k] x [k, m] product where there was an [n, k] x [k, m] one, n times
 * fewer multiply-adds. Reverse mode makes this shape wherever a broadcast value feeds a
 * product: the gradient of theta in (theta - x) W, or of a bias added before a layer, is
 * the row sum of g W^T. The sum of an add or a sub of same-shape operands is split over
 * them when one of them (at any depth) is such a product, so sum(c r + g W^T) becomes
 * sum(c r) + sum(g) W^T.
 *
 * Unlike the other algebraic rewrites this one is not exact: a product of sums rounds
 * differently from a sum of products (the same value to rounding: the sums are over other
 * terms in another order, as with any reassociation). It changes no
 * determinism: the pass runs in every pipeline (the debugging one too), so a function
 * gives the same bits whatever the threads, the tier or the debugging flags.
 *
 * When: a sum over axis 0 of a rank-2 value (keepdims or not); the product two-operand,
 * both operands rank 2, at least 2 rows; an add or sub on the way of the sum's dtype and
 * shape on both sides. The test is on shapes and ops only, never on how many read a value:
 * a product also returned, printed, or (in a bounded loop's reverse sweep) carried out as
 * a cotangent gets its row sum made the same way as one read only there, so the same
 * computation gives the same bits however it is put together (the loop against its
 * unrolled form, a product returned or not). A product or add read elsewhere too stays
 * for its other readers, and the sum costs n k + k m multiply-adds instead of n m: at most
 * (1/n + 1/m) of the product's own. Runs after transpose folding (a product reads its
 * operands through its transpose flags) and before accumulation and fusion. */

#define NBI_SUMMM_DEPTH 4

/* Is x (of the input graph) a product the rewrite takes: rank 2 of rank 2s? */
static bool nbi_summm_prod(const nb_var *x) {
    return x->op == NBI_OP_MATMUL && x->n_in == 2 && x->rank == 2 && x->in[0]->rank == 2 &&
           x->in[1]->rank == 2 && x->shape[0] >= 2 &&
           (x->flags & (NBI_NODE_WEAK | NBI_NODE_POISON)) == 0;
}

/* Is x an add or sub of same-typed operands with such a product below it? */
static bool nbi_summm_split(const nb_var *x, int depth) {
    if ((x->op != NBI_OP_ADD && x->op != NBI_OP_SUB) || x->n_in != 2 || depth >= NBI_SUMMM_DEPTH ||
        (x->flags & (NBI_NODE_WEAK | NBI_NODE_POISON)) != 0 || !nbi_same_type(x->in[0], x) ||
        !nbi_same_type(x->in[1], x)) {
        return false;
    }
    for (int j = 0; j < 2; j++) {
        if (nbi_summm_prod(x->in[j]) || nbi_summm_split(x->in[j], depth + 1)) {
            return true;
        }
    }
    return false;
}

typedef struct nbi_summm {
    nbi_graph *out;
    nb_ctx *ctx;
    nb_var *const *map;
    const nb_var *root; /* the sum: the new nodes' provenance */
    nb_status fail;
} nbi_summm;

static nb_var *nbi_summm_emit(nbi_summm *s, nbi_op op, int n_in, nb_var **in, const nbi_attrs *at) {
    nb_var *v = nbi_pass_emit(s->out, s->ctx, op, n_in, in, at, &s->fail);
    if (v != NULL) {
        v->src = s->root->src;
        v->fn = s->root->fn;
    }
    return v;
}

/* The new graph's node for the row sum of x (of the input graph), kept as [1, m]. NULL:
 * s->fail says why. */
static nb_var *nbi_summm_rows(nbi_summm *s, const nb_var *x, int depth) {
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    if (nbi_summm_prod(x)) {
        /* op(A) is [n, k]: A itself [n, k] (summed over axis 0) or, read transposed,
         * [k, n] (summed over axis 1); the product then reads the [1, k] or [k, 1] sum
         * with the same flag */
        bool ta = x->at.axes[0] != 0;
        at.n_axes = 1;
        at.axes[0] = ta ? 1 : 0;
        at.keepdims = true;
        nb_var *a = s->map[x->in[0]->id];
        nb_var *sa = nbi_summm_emit(s, NBI_OP_SUM, 1, &a, &at);
        if (sa == NULL) {
            return NULL;
        }
        nb_var *ins[2] = {sa, s->map[x->in[1]->id]};
        return nbi_summm_emit(s, NBI_OP_MATMUL, 2, ins, &x->at);
    }
    if (nbi_summm_split(x, depth)) {
        nb_var *ins[2];
        for (int j = 0; j < 2; j++) {
            ins[j] = nbi_summm_rows(s, x->in[j], depth + 1);
            if (ins[j] == NULL) {
                return NULL;
            }
        }
        return nbi_summm_emit(s, (nbi_op)x->op, 2, ins, &at);
    }
    at.n_axes = 1;
    at.axes[0] = 0;
    at.keepdims = true;
    nb_var *a = s->map[x->id];
    return nbi_summm_emit(s, NBI_OP_SUM, 1, &a, &at);
}

nb_status nbi_pass_sum_matmul(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out) {
    nb_var **map = NULL;
    nb_status st = nbi_pass_begin(ctx, in, out, &map, "sum-matmul");
    if (st != NB_OK) {
        return st;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < in->n_nodes; i++) {
        const nb_var *v = in->nodes[i];
        const nb_var *x = v->n_in == 1 ? v->in[0] : NULL;
        bool rows = v->op == NBI_OP_SUM && x != NULL && x->rank == 2 && v->at.n_axes == 1 &&
                    v->at.axes[0] == 0 && x->dtype == v->dtype &&
                    (nbi_summm_prod(x) || nbi_summm_split(x, 0));
        if (!rows) {
            map[i] = nbi_copy_node(out, v, map);
        } else {
            /* the product and adds it replaces stay in the new graph, for their other
             * readers or, unread, for DCE */
            nbi_summm s = {.out = out, .ctx = ctx, .map = map, .root = v, .fail = NB_ERR_OOM};
            nb_var *r = nbi_summm_rows(&s, x, 0);
            if (r != NULL && !v->at.keepdims) {
                nbi_attrs at;
                memset(&at, 0, sizeof at);
                at.n_axes = 1;
                at.a[0] = v->shape[0];
                r = nbi_summm_emit(&s, NBI_OP_RESHAPE, 1, &r, &at);
            }
            if (r != NULL && !nbi_same_type(r, v)) {
                return nbi_err(ctx, NB_ERR_INTERNAL,
                               "sum-matmul: the rewritten sum has "
                               "another type than the sum (a bug)");
            }
            if (r == NULL) {
                return nbi_err(ctx, s.fail, "sum-matmul: %s",
                               s.fail == NB_ERR_INTERNAL ? "a new node failed its shape inference"
                                                         : "out of memory");
            }
            map[i] = r;
        }
        if (map[i] == NULL) {
            return nbi_err(ctx, NB_ERR_OOM, "sum-matmul: out of memory");
        }
        if (v->op == NBI_OP_PARAM) {
            out->inputs[k++] = map[i];
        }
    }
    return nbi_pass_end(ctx, in, out, map, "sum-matmul");
}

/* ---- rematerialisation ---------------------------------------------------------------
 * A small elementwise tree (at most NBI_REMAT_MAX ops: a map and the single-use maps that
 * feed it) whose value has several consumers, every one of them an elementwise op of its
 * shape or a reduction fusion can take, is copied into each consumer instead of being
 * stored once and read back: each copy then fuses into its consumer's chain. Recomputing
 * a few flops per element is cheaper than a round trip of the whole array through memory
 * (Rosenbrock's value_and_grad reads its residuals in three chains). A copy computes the
 * same bits as the original. Runs after CSE, which would merge the copies again. Not a
 * tree with a transcendental op (exp, log, tanh, sigmoid, pow, ...): one costs more than
 * the round trip (log_softmax's exp, read by its sum and by the gradient, was computed
 * twice per step). */
#define NBI_REMAT_MAX 4

typedef struct nbi_remat {
    const nbi_graph *in;
    nbi_graph *out;
    nb_var **map;
    const int32_t *uses;
    const bool *is_out, *remat;
} nbi_remat;

/* w feeds only into u and would fuse into it: part of u's tree */
static bool nbi_remat_absorbed(const nbi_remat *r, const nb_var *w, const nb_var *u) {
    return nbi_fusible(w) && r->uses[w->id] == 1 && !r->is_out[w->id] && nbi_same_shape(w, u);
}

static bool nbi_fuse_reduction_ok(const nb_var *v);

/* A copy of u's tree in r->out (inputs outside the tree: their mapped nodes; remat inputs
 * copied too, to depth 2). NULL on OOM. */
static nb_var *nbi_remat_clone(const nbi_remat *r, const nb_var *u, int depth) {
    nb_var *ins[3];
    for (int32_t j = 0; j < u->n_in && j < 3; j++) {
        const nb_var *w = u->in[j];
        bool copy = nbi_remat_absorbed(r, w, u) || (r->remat[w->id] && depth < 2);
        ins[j] = copy ? nbi_remat_clone(r, w, depth + 1) : r->map[w->id];
        if (ins[j] == NULL) {
            return NULL;
        }
    }
    nb_var proto = *u;
    proto.in = ins;
    return nbi_graph_add(r->out, &proto);
}

static int32_t nbi_remat_size(const nbi_remat *r, const nb_var *u) {
    int32_t n = nbi_op_transcendental((nbi_op)u->op) ? NBI_REMAT_MAX + 1 : 1;
    for (int32_t j = 0; j < u->n_in; j++) {
        if (nbi_remat_absorbed(r, u->in[j], u)) {
            n += nbi_remat_size(r, u->in[j]);
        }
    }
    return n;
}

nb_status nbi_pass_remat(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out) {
    nb_var **map = NULL;
    nb_status st = nbi_pass_begin(ctx, in, out, &map, "remat");
    if (st != NB_OK) {
        return st;
    }
    int32_t n = in->n_nodes;
    int32_t *uses = nbi_arena_alloc(in->arena, (size_t)(n + 1) * sizeof(int32_t));
    int32_t *seen = nbi_arena_alloc(in->arena, (size_t)(n + 1) * sizeof(int32_t));
    bool *is_out = nbi_arena_alloc(in->arena, (size_t)(n + 1) * sizeof(bool));
    bool *remat = nbi_arena_alloc(in->arena, (size_t)(n + 1) * sizeof(bool));
    bool *bad = nbi_arena_alloc(in->arena, (size_t)(n + 1) * sizeof(bool));
    if (uses == NULL || seen == NULL || is_out == NULL || remat == NULL || bad == NULL) {
        return nbi_err(ctx, NB_ERR_OOM, "remat: out of memory");
    }
    for (int32_t i = 0; i < in->n_outputs; i++) {
        is_out[in->outputs[i]->id] = true;
    }
    for (int32_t i = 0; i < n; i++) { /* distinct consumers, and whether each would fuse */
        const nb_var *c = in->nodes[i];
        for (int32_t j = 0; j < c->n_in; j++) {
            const nb_var *u = c->in[j];
            if (nbi_input_repeats(c, j)) {
                continue;
            }
            uses[u->id]++;
            bool fuses = (nbi_fusible(c) && nbi_same_shape(c, u)) ||
                         (nbi_fuse_reduction_ok(c) && c->in[0] == u);
            bad[u->id] = bad[u->id] || !fuses;
        }
    }
    nbi_remat r = {in, out, map, uses, is_out, remat};
    for (int32_t i = 0; i < n; i++) {
        const nb_var *u = in->nodes[i];
        remat[i] = nbi_fusible(u) && !is_out[i] && !bad[i] && uses[i] >= 2 &&
                   nbi_remat_size(&r, u) <= NBI_REMAT_MAX;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = in->nodes[i];
        nb_var *ins[64], *clone_of[64];
        const nb_var *orig[64];
        int32_t n_clones = 0;
        bool any = false;
        for (int32_t j = 0; j < v->n_in && v->n_in <= 64; j++) {
            const nb_var *u = v->in[j];
            ins[j] = map[u->id];
            if (!remat[u->id]) {
                continue;
            }
            int32_t q = 0;
            while (q < n_clones && orig[q] != u) {
                q++;
            }
            if (q < n_clones) { /* x * x: one copy for both operands */
                ins[j] = clone_of[q];
                any = true;
                continue;
            }
            if (seen[u->id]++ == 0) {
                continue; /* the first consumer reads the original */
            }
            nb_var *c = nbi_remat_clone(&r, u, 0);
            if (c == NULL) {
                return nbi_err(ctx, NB_ERR_OOM, "remat: out of memory");
            }
            orig[n_clones] = u;
            clone_of[n_clones++] = c;
            ins[j] = c;
            any = true;
        }
        if (any) {
            nb_var proto = *v;
            proto.in = ins;
            map[i] = nbi_graph_add(out, &proto);
        } else {
            map[i] = nbi_copy_node(out, v, map);
        }
        if (map[i] == NULL) {
            return nbi_err(ctx, NB_ERR_OOM, "remat: out of memory");
        }
        if (v->op == NBI_OP_PARAM) {
            out->inputs[k++] = map[i];
        }
    }
    return nbi_pass_end(ctx, in, out, map, "remat");
}

/* The fusion pass's clusters. root[i]: node i's cluster, named by its root's index (-1:
 * none); a cluster's members as a list: head[root], then next[] (-1 ends it), tail[root];
 * size: its members (a reduction root counts one); closed: a reduction took it. Each
 * node's distinct readers, in graph order: cons[cstart[i]] .. cons[cstart[i + 1] - 1]. */
typedef struct nbi_fuse {
    const nbi_graph *g;
    int32_t *root, *size, *head, *tail, *next, *cstart, *cons;
    bool *closed, *is_out;
} nbi_fuse;

/* Move cluster r's members into cluster i (the program orders members by their place in
 * the graph, not by this list); fresh: i has no members yet (a reduction taking r). */
static void nbi_fuse_merge(nbi_fuse *f, int32_t r, int32_t i, bool fresh) {
    for (int32_t m = f->head[r]; m >= 0; m = f->next[m]) {
        f->root[m] = i;
    }
    if (fresh) {
        f->head[i] = f->head[r];
        f->tail[i] = f->tail[r];
    } else {
        f->next[f->tail[r]] = f->head[i];
        f->head[i] = f->head[r];
    }
    f->root[i] = i;
}

/* The distinct inputs from outside that clusters a and b would read together. */
static int32_t nbi_fuse_ext_count(const nbi_fuse *f, int32_t a, int32_t b) {
    const nb_var *seen[3 * NBI_FUSE_MAX_INSTR + 3];
    int32_t n = 0;
    int32_t lists[2] = {a, b};
    for (int l = 0; l < 2; l++) {
        for (int32_t m = f->head[lists[l]]; m >= 0; m = f->next[m]) {
            const nb_var *v = f->g->nodes[m];
            for (int32_t j = 0; j < v->n_in; j++) {
                const nb_var *w = v->in[j];
                if (f->root[w->id] == a || f->root[w->id] == b) {
                    continue;
                }
                int32_t q = 0;
                while (q < n && seen[q] != w) {
                    q++;
                }
                if (q == n && n < (int32_t)(sizeof seen / sizeof seen[0])) {
                    seen[n++] = w;
                }
            }
        }
    }
    return n;
}

/* May cluster a join node i's cluster (i's own, or a new one when i is a reduction taking
 * a), i staying the root? The fused node takes i's place, so a member it stores is only
 * made there: every reader outside the two clusters must come after i. And at most
 * NBI_FUSE_MAX_STORE members besides i are stored (outputs, values read outside). */
static bool nbi_fuse_place_ok(const nbi_fuse *f, int32_t a, int32_t i) {
    int32_t n_store = 0;
    int32_t lists[2] = {a, f->root[i] == i ? i : -1};
    for (int l = 0; l < 2; l++) {
        for (int32_t m = lists[l] >= 0 ? f->head[lists[l]] : -1; m >= 0; m = f->next[m]) {
            bool stored = f->is_out[m];
            for (int32_t q = f->cstart[m]; q < f->cstart[m + 1]; q++) {
                int32_t c = f->cons[q];
                if (c == i || f->root[c] == a || f->root[c] == i) {
                    continue;
                }
                if (c < i) {
                    return false;
                }
                stored = true;
            }
            n_store += m != i && stored;
        }
    }
    return n_store <= NBI_FUSE_MAX_STORE;
}

/* Merge map cluster r into i's when it has i's shape and the bounds hold. */
static bool nbi_fuse_try(nbi_fuse *f, int32_t r, int32_t i) {
    if (r < 0 || r == i || f->closed[r] || !nbi_same_shape(f->g->nodes[r], f->g->nodes[i]) ||
        f->size[r] + f->size[i] > NBI_FUSE_MAX_INSTR ||
        nbi_fuse_ext_count(f, r, i) > NBI_FUSE_MAX_EXT || !nbi_fuse_place_ok(f, r, i)) {
        return false;
    }
    nbi_fuse_merge(f, r, i, false);
    f->size[i] += f->size[r];
    return true;
}

/* Sibling clusters tried per node: each try costs a pass over both member lists. */
#define NBI_FUSE_SIBLING_TRIES 8

/* Is cluster r's root stored whatever happens: no reader of it could take r in later (a
 * map of its shape, a reduction fusion accepts)? Only such a cluster joins a sibling: the
 * root would be stored by the merged kernel instead of fused into its reader. */
static bool nbi_fuse_settled(const nbi_fuse *f, int32_t r) {
    const nb_var *u = f->g->nodes[r];
    for (int32_t q = f->cstart[r]; q < f->cstart[r + 1]; q++) {
        const nb_var *c = f->g->nodes[f->cons[q]];
        if ((nbi_fusible(c) && nbi_same_shape(c, u)) ||
            (nbi_fuse_reduction_ok(c) && c->in[0] == u)) {
            return false;
        }
    }
    return true;
}

/* Node i's cluster, grown: its inputs' clusters, then earlier clusters of its shape that
 * read an input of that shape it reads (that input then read once for both). */
static void nbi_fuse_grow(nbi_fuse *f, int32_t i) {
    const nb_var *v = f->g->nodes[i];
    for (int32_t j = 0; j < v->n_in; j++) {
        nbi_fuse_try(f, f->root[v->in[j]->id], i);
    }
    int tries = 0;
    for (int32_t m = f->head[i]; m >= 0 && tries < NBI_FUSE_SIBLING_TRIES; m = f->next[m]) {
        const nb_var *u = f->g->nodes[m];
        for (int32_t j = 0; j < u->n_in && tries < NBI_FUSE_SIBLING_TRIES; j++) {
            const nb_var *x = u->in[j];
            if (f->root[x->id] == i || !nbi_same_shape(x, v) || nbi_input_repeats(u, j)) {
                continue;
            }
            for (int32_t q = f->cstart[x->id];
                 q < f->cstart[x->id + 1] && f->cons[q] < i && tries < NBI_FUSE_SIBLING_TRIES;
                 q++) {
                int32_t r = f->root[f->cons[q]];
                if (r >= 0 && r != i && !f->closed[r] && nbi_fuse_settled(f, r)) {
                    tries++;
                    nbi_fuse_try(f, r, i);
                }
            }
        }
    }
}

nb_status nbi_pass_fuse(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out) {
    nb_var **map = NULL;
    nb_status st = nbi_pass_begin(ctx, in, out, &map, "fuse");
    if (st != NB_OK) {
        return st;
    }
    int32_t n = in->n_nodes, n_edges = 0;
    for (int32_t i = 0; i < n; i++) {
        n_edges += in->nodes[i]->n_in;
    }
    nbi_fuse f = {.g = in};
    size_t ib = (size_t)(n + 1) * sizeof(int32_t), bb = (size_t)(n + 1) * sizeof(bool);
    f.root = nbi_arena_alloc(in->arena, ib);
    f.size = nbi_arena_alloc(in->arena, ib);
    f.head = nbi_arena_alloc(in->arena, ib);
    f.tail = nbi_arena_alloc(in->arena, ib);
    f.next = nbi_arena_alloc(in->arena, ib);
    f.cstart = nbi_arena_alloc(in->arena, ib + sizeof(int32_t));
    f.cons = nbi_arena_alloc(in->arena, (size_t)(n_edges + 1) * sizeof(int32_t));
    f.closed = nbi_arena_alloc(in->arena, bb);
    f.is_out = nbi_arena_alloc(in->arena, bb);
    int32_t *members = nbi_arena_alloc(in->arena, ib);
    if (f.root == NULL || f.size == NULL || f.head == NULL || f.tail == NULL || f.next == NULL ||
        f.cstart == NULL || f.cons == NULL || f.closed == NULL || f.is_out == NULL ||
        members == NULL) {
        return nbi_err(ctx, NB_ERR_OOM, "fuse: out of memory");
    }
    /* readers: x + x reads x once; cstart[i + 1] counts first, then is the fill cursor */
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = in->nodes[i];
        for (int32_t j = 0; j < v->n_in; j++) {
            f.cstart[v->in[j]->id + 1] += nbi_input_repeats(v, j) ? 0 : 1;
        }
        f.root[i] = -1;
    }
    for (int32_t i = 0; i < n; i++) {
        f.cstart[i + 1] += f.cstart[i];
        members[i] = f.cstart[i];
    }
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = in->nodes[i];
        for (int32_t j = 0; j < v->n_in; j++) {
            if (!nbi_input_repeats(v, j)) {
                f.cons[members[v->in[j]->id]++] = i;
            }
        }
    }
    for (int32_t i = 0; i < in->n_outputs; i++) {
        f.is_out[in->outputs[i]->id] = true;
    }
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = in->nodes[i];
        bool red = nbi_fuse_reduction_ok(v);
        if (!red && !nbi_fusible(v)) {
            continue;
        }
        if (red) {
            int32_t r = f.root[v->in[0]->id];
            if (r != v->in[0]->id || f.closed[r] || !nbi_fuse_place_ok(&f, r, i)) {
                continue;
            }
            nbi_fuse_merge(&f, r, i, true);
            f.size[i] = f.size[r] + 1; /* + 1: the reduction (never a lone member) */
            f.closed[i] = true;
            continue;
        }
        f.root[i] = i;
        f.size[i] = 1;
        f.head[i] = f.tail[i] = i;
        f.next[i] = -1;
        nbi_fuse_grow(&f, i);
    }
    /* every cluster's members in node order, bucketed by root once (collecting them per
     * root by a scan of all earlier nodes made this pass quadratic in the graph) */
    int32_t *mstart = nbi_arena_alloc(in->arena, ib + sizeof(int32_t));
    int32_t *mlist = nbi_arena_alloc(in->arena, ib);
    if (mstart == NULL || mlist == NULL) {
        return nbi_err(ctx, NB_ERR_OOM, "fuse: out of memory");
    }
    memset(mstart, 0, ib + sizeof(int32_t));
    for (int32_t m = 0; m < n; m++) {
        if (f.root[m] >= 0) {
            mstart[f.root[m] + 1]++;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        mstart[i + 1] += mstart[i];
    }
    for (int32_t m = 0, *fill = members; m < n; m++) { /* members: the fill cursors here */
        fill[m] = mstart[m];
    }
    for (int32_t m = 0; m < n; m++) {
        if (f.root[m] >= 0) {
            mlist[members[f.root[m]]++] = m;
        }
    }
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = in->nodes[i];
        const int32_t *root = f.root, *size = f.size;
        /* a lone op is worth a fused node too when it reads a view instead of a copy */
        bool lone_view = false;
        for (int32_t j = 0; root[i] == i && size[i] == 1 && j < v->n_in; j++) {
            lone_view = lone_view || nbi_fuse_view(v->in[j], v, NULL, 0) != NULL;
        }
        bool fused_root = root[i] == i && (size[i] >= 2 || lone_view);
        if (root[i] >= 0 && root[i] != i && size[root[i]] >= 2) {
            continue; /* a member: replayed inside its root's program */
        }
        if (!fused_root) {
            map[i] = nbi_copy_node(out, v, map);
            if (map[i] == NULL) {
                return nbi_err(ctx, NB_ERR_OOM, "fuse: out of memory");
            }
            if (v->op == NBI_OP_PARAM) {
                out->inputs[k++] = map[i];
            }
            continue;
        }
        /* the members in order, and their external inputs; a reduction root is not an
         * instruction but the program's trailing reduction, over its input's shape */
        bool red = f.closed[i];
        const nb_var *mapv = red ? v->in[0] : v;
        int32_t nm = 0;
        for (int32_t q = mstart[i]; q < mstart[i + 1]; q++) {
            if (mlist[q] < i + (red ? 0 : 1)) {
                members[nm++] = mlist[q];
            }
        }
        nbi_fprog *prog = nbi_arena_alloc(out->arena, sizeof(nbi_fprog)); /* outlives in */
        nb_var *ext[NBI_FUSE_MAX_EXT];
        const nb_var *ext_src[NBI_FUSE_MAX_EXT]; /* the input graph's node of each */
        int32_t n_ext = 0;
        bool ok = prog != NULL;
        if (ok) {
            memset(prog, 0, sizeof *prog);
            prog->map_rank = mapv->rank;
            memcpy(prog->map_shape, mapv->shape, sizeof prog->map_shape);
            if (red) {
                prog->red_op = v->op;
                prog->red_keepdims = v->at.keepdims;
                prog->red_n_axes = v->at.n_axes;
                memcpy(prog->red_axes, v->at.axes, sizeof prog->red_axes);
                prog->red_n = v->size > 0 ? mapv->size / v->size : 0;
            }
        }
        for (int32_t a = 0; ok && a < nm; a++) {
            const nb_var *m = in->nodes[members[a]];
            nbi_finstr *fi = &prog->ins[a];
            fi->op = m->op;
            fi->n_in = (uint8_t)m->n_in;
            fi->dtype = m->dtype;
            fi->in_dtype = m->in[0]->dtype;
            /* stored: needed outside (the last map of a reduction too; a map root is the
             * node's own output) */
            bool stored = f.is_out[m->id] && (red || m->id != i);
            for (int32_t q = f.cstart[m->id]; q < f.cstart[m->id + 1] && (red || m->id != i); q++) {
                stored = stored || root[f.cons[q]] != i;
            }
            if (stored && prog->n_store == NBI_FUSE_MAX_STORE) {
                ok = false;
                break;
            }
            if (stored) {
                prog->store[prog->n_store++] = (int16_t)a;
            }
            for (int32_t j = 0; j < m->n_in; j++) {
                const nb_var *src = m->in[j];
                int32_t reg = -1;
                for (int32_t b = 0; b < a; b++) {
                    if (members[b] == src->id) {
                        reg = b;
                    }
                }
                if (reg >= 0) {
                    fi->src[j] = (int16_t)reg;
                    continue;
                }
                int32_t e = 0;
                while (e < n_ext && ext_src[e] != src) {
                    e++;
                }
                if (e == n_ext) {
                    if (n_ext == NBI_FUSE_MAX_EXT) {
                        ok = false;
                        break;
                    }
                    ext_src[n_ext] = src;
                    ext[n_ext] = map[src->id];
                    const nb_var *base = nbi_fuse_view(src, mapv, prog, n_ext);
                    if (base != NULL) {
                        ext[n_ext] = map[base->id];
                    }
                    n_ext++;
                }
                fi->src[j] = (int16_t)(-e - 1);
            }
        }
        if (!ok) {
            return nbi_err(ctx, prog == NULL ? NB_ERR_OOM : NB_ERR_INTERNAL, "fuse: %s",
                           prog == NULL ? "out of memory" : "too many inputs or stored values");
        }
        prog->n_instr = nm;
        prog->n_ext = n_ext;
        nb_var proto;
        memset(&proto, 0, sizeof proto);
        proto.op = NBI_OP_FUSED;
        proto.dtype = v->dtype;
        proto.rank = v->rank;
        memcpy(proto.shape, v->shape, sizeof proto.shape);
        proto.size = v->size;
        proto.n_in = n_ext;
        proto.in = ext;
        proto.at.callee = prog;
        map[i] = nbi_graph_add(out, &proto);
        /* the stored members, right after: their readers all come later (place_ok) */
        for (int32_t s = 0; map[i] != NULL && s < prog->n_store; s++) {
            const nb_var *m = in->nodes[members[prog->store[s]]];
            nb_var *fin[1] = {map[i]};
            memset(&proto, 0, sizeof proto);
            proto.op = NBI_OP_FUSED_OUTPUT;
            proto.dtype = m->dtype;
            proto.rank = m->rank;
            memcpy(proto.shape, m->shape, sizeof proto.shape);
            proto.size = m->size;
            proto.n_in = 1;
            proto.in = fin;
            proto.at.ivalue = s;
            map[m->id] = nbi_graph_add(out, &proto);
            if (map[m->id] == NULL) {
                map[i] = NULL;
            }
        }
        if (map[i] == NULL) {
            return nbi_err(ctx, NB_ERR_OOM, "fuse: out of memory");
        }
    }
    return nbi_pass_end(ctx, in, out, map, "fuse");
}

/* The passes in order. Each builds a new graph; an intermediate one is needed only by the
 * next pass, so graphs alternate between two arenas, each freed once its graph has been
 * read: the memory held is two graphs (plus the trace's and the result), not one per pass
 * -- a 10^5-leaf Adam step held about 11 GB. */
typedef nb_status (*nbi_pass_fn)(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out);

/* ---- loop sharing ------------------------------------------------------------------- */

/* The earlier while that w2 (a twin: at.c[0] != 0) may stand for, or NULL: the loop of the
 * same record, whose carry starts where w2's carry leaves from at.c[1] on start, with the
 * same bound; w2's other operands come before it or are constants; it is read only through
 * call_output nodes. */
static const nb_var *nbi_loop_twin(const nbi_graph *in, const nb_var *w2, const int32_t *twin_of) {
    const nb_var *w = NULL;
    for (int32_t j = w2->id - 1; j >= 0 && w == NULL; j--) {
        const nb_var *u = in->nodes[j];
        if (u->op == NBI_OP_WHILE && u->at.a[6] == w2->at.c[0] && twin_of[j] < 0) {
            w = u;
        }
    }
    if (w == NULL || w->at.a[3] != w2->at.a[3] || w2->at.c[1] < 0 ||
        w2->at.c[1] + w->at.a[2] > w2->at.a[2]) {
        return NULL;
    }
    const int64_t ncar = w->at.a[2], c1 = w2->at.c[1];
    nb_var *const *c_w = w->in + w->at.a[0] + w->at.a[1];
    nb_var *const *c_w2 = w2->in + w2->at.a[0] + w2->at.a[1];
    for (int64_t j = 0; j < ncar; j++) {
        if (c_w[j] != c_w2[c1 + j]) {
            return NULL;
        }
    }
    for (int32_t j = 0; j < w2->n_in; j++) {
        const nb_var *x = w2->in[j];
        bool constant =
            x->n_in == 0 && (x->op == NBI_OP_FULL || x->op == NBI_OP_CONST || x->op == NBI_OP_IOTA);
        if (x->id >= w->id && !constant) {
            return NULL;
        }
    }
    for (int32_t i = w->id + 1; i < in->n_nodes; i++) {
        const nb_var *u = in->nodes[i];
        for (int32_t j = 0; j < u->n_in; j++) {
            if (u->in[j] == w && u->op != NBI_OP_CALL_OUTPUT) {
                return NULL;
            }
        }
    }
    for (int32_t i = 0; i < in->n_outputs; i++) {
        if (in->outputs[i] == w) {
            return NULL;
        }
    }
    return w;
}

nb_status nbi_pass_loop_share(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out) {
    nb_var **map = NULL;
    nb_status st = nbi_pass_begin(ctx, in, out, &map, "loop_share");
    if (st != NB_OK) {
        return st;
    }
    int32_t n = in->n_nodes;
    int32_t *twin_of = nbi_arena_alloc(in->arena, (size_t)(n + 1) * sizeof(int32_t));
    bool *early = nbi_arena_alloc(in->arena, (size_t)(n + 1));
    if (twin_of == NULL || early == NULL) {
        return nbi_err(ctx, NB_ERR_OOM, "loop_share: out of memory");
    }
    for (int32_t i = 0; i < n; i++) {
        twin_of[i] = -1;
    }
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = in->nodes[i];
        if (v->op == NBI_OP_WHILE && v->at.c[0] != 0) {
            const nb_var *w = nbi_loop_twin(in, v, twin_of);
            if (w != NULL) {
                twin_of[w->id] = i;
            }
        }
    }
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = in->nodes[i];
        if (early[i]) {
            continue; /* made at its twin's place */
        }
        if (twin_of[i] >= 0) { /* the twin here, its constants first; v goes */
            const nb_var *w2 = in->nodes[twin_of[i]];
            for (int32_t j = 0; j < w2->n_in; j++) {
                const nb_var *x = w2->in[j];
                if (x->id > i && !early[x->id]) {
                    map[x->id] = nbi_copy_node(out, x, map);
                    early[x->id] = true;
                    if (map[x->id] == NULL) {
                        return nbi_err(ctx, NB_ERR_OOM, "loop_share: out of memory");
                    }
                }
            }
            map[w2->id] = nbi_copy_node(out, w2, map);
            early[w2->id] = true;
            if (map[w2->id] == NULL) {
                return nbi_err(ctx, NB_ERR_OOM, "loop_share: out of memory");
            }
            map[i] = NULL;
            continue;
        }
        if (v->op == NBI_OP_CALL_OUTPUT && twin_of[v->in[0]->id] >= 0) {
            /* leaf j of v's loop is leaf c1 + j of the twin's: its index and byte offset
             * there (leaves at 64-byte offsets, as the while kernel packs them) */
            const nb_var *w2 = in->nodes[twin_of[v->in[0]->id]];
            int64_t idx = w2->at.c[1] + v->at.ivalue, off = 0;
            for (int64_t l = 0; l < idx; l++) {
                const nb_var *o = nbi_exec_output(w2->at.callee, (int32_t)l);
                off += (int64_t)nbi_leaf_bytes(o);
            }
            nb_var proto = *v, *src = map[w2->id];
            proto.in = &src;
            proto.at.ivalue = idx;
            proto.at.a[0] = off;
            map[i] = nbi_graph_add(out, &proto);
        } else {
            map[i] = nbi_copy_node(out, v, map);
        }
        if (map[i] == NULL) {
            return nbi_err(ctx, NB_ERR_OOM, "loop_share: out of memory");
        }
        if (map[i]->op == NBI_OP_PARAM) {
            out->inputs[k++] = map[i];
        }
    }
    return nbi_pass_end(ctx, in, out, map, "loop_share");
}

nb_status nbi_optimize(nb_ctx *ctx, const nbi_graph *in, unsigned debug, nbi_arena *arena,
                       nbi_graph *out) {
    /* DCE before loop_share: a taped loop whose reverse sweep is dead (a value_and_grad
     * whose gradient is never read) goes, rather than replacing its primal twin */
    const nbi_pass_fn all[] = {nbi_pass_fold,       nbi_pass_transpose_matmul,
                               nbi_pass_cse,        nbi_pass_dce,
                               nbi_pass_sum_matmul, nbi_pass_loop_share,
                               nbi_pass_dce,        nbi_pass_accumulate,
                               nbi_pass_pad_concat, nbi_pass_pad_push,
                               nbi_pass_dce,        nbi_pass_remat,
                               nbi_pass_fuse,       nbi_pass_dce};
    const nbi_pass_fn no_fuse[] = {nbi_pass_fold,       nbi_pass_transpose_matmul,
                                   nbi_pass_cse,        nbi_pass_dce,
                                   nbi_pass_sum_matmul, nbi_pass_loop_share,
                                   nbi_pass_dce,        nbi_pass_pad_concat,
                                   nbi_pass_pad_push,   nbi_pass_dce,
                                   nbi_pass_remat,      nbi_pass_dce};
    /* debug: every op on its own, to be checked (nbi_exec_compile) */
    const nbi_pass_fn *passes = debug != 0 ? no_fuse : all;
    int n =
        debug != 0 ? (int)(sizeof no_fuse / sizeof no_fuse[0]) : (int)(sizeof all / sizeof all[0]);
    nb_status st = nbi_verify_ir_enabled() ? nbi_graph_verify(ctx, in, "trace") : NB_OK;
    nbi_arena ar[2];
    nbi_arena_init(&ar[0], ctx);
    nbi_arena_init(&ar[1], ctx);
    nbi_graph g[2];
    const nbi_graph *cur = in;
    for (int k = 0; k < n && st == NB_OK; k++) {
        bool last = k == n - 1;
        nbi_graph *next = last ? out : &g[k % 2];
        nbi_arena *where = last ? arena : &ar[k % 2];
        nbi_arena_free_all(where == arena ? &ar[k % 2] : where); /* graph k - 2: read */
        memset(next, 0, sizeof *next);
        next->arena = where;
        st = passes[k](ctx, cur, next);
        cur = next;
    }
    nbi_arena_free_all(&ar[0]);
    nbi_arena_free_all(&ar[1]);
    return st;
}
