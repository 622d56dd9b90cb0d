/*
 * op_random.c -- the random-number samplers inside traces (nb_rng_*, nabla/random.h):
 * rng_split, rng_fold_in, rng_bits, rng_uniform, rng_normal, rng_truncated_normal,
 * rng_bernoulli, rng_permutation.
 *
 * Each op takes the key as an i32[2] input value, so the numbers are computed when the
 * executable runs: a jitted function called with another key gives other numbers, without
 * a retrace. The kernels call the eager samplers' own code (src/core/random_internal.h), so
 * traced and eager results are the same bits. Element i of the elementwise samplers depends
 * only on the key and i, so their kernels split the work in chunks over the thread pool
 * (the result does not depend on the thread count). Being pure functions of their inputs,
 * the ops fold when the key is a constant, merge in CSE only when key and attributes are
 * the same (then they are the same numbers), and die in DCE when unused.
 *
 * No gradients: every input is non-differentiable and there are no VJP/JVP rules, so grad
 * and jvp treat the outputs (floats included) as constants.
 *
 * Attributes: rng_split and rng_permutation: ivalue = n. The samplers: the result shape in
 * a[0 .. n_axes), to = the requested dtype (float samplers), value = the first bound
 * (lo, lower, p), b[0] = the bit pattern of the second (hi, upper) as a double.
 */
#include "ad/ir.h"
#include "core/random_internal.h"

#include <stdio.h>
#include <string.h>

#define NBI_RNG_CHUNK 8192

static double nbi_rng_attr_f64(int64_t bits) {
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

static int64_t nbi_rng_f64_attr(double d) {
    int64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return bits;
}

/* The sampler behind an elementwise op. */
static nbi_rng_kind nbi_rng_kind_of(nbi_op op) {
    switch (op) {
    case NBI_OP_RNG_UNIFORM:
        return NBI_RNG_UNIFORM;
    case NBI_OP_RNG_NORMAL:
        return NBI_RNG_NORMAL;
    case NBI_OP_RNG_TRUNCATED_NORMAL:
        return NBI_RNG_TRUNCATED_NORMAL;
    case NBI_OP_RNG_BERNOULLI:
        return NBI_RNG_BERNOULLI;
    default:
        return NBI_RNG_BITS;
    }
}

/* "[3,4]" into buf. */
static const char *nbi_rng_shape_str(char *buf, size_t cap, int rank, const int64_t *shape) {
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < rank && len < cap; i++) {
        len += (size_t)snprintf(buf + len, cap - len, i ? ",%lld" : "%lld", (long long)shape[i]);
    }
    if (len < cap) {
        snprintf(buf + len, cap - len, "]");
    }
    return buf;
}

/* ---- inference ---------------------------------------------------------------------- */

/* The key (input 0) must be an i32[2] value. */
static nb_status nbi_rng_check_key(nb_trace *tr, const nb_var *p) {
    const nb_var *key = p->in[0];
    if (key->dtype == NB_DTYPE_I32 && key->rank == 1 && key->shape[0] == 2) {
        return NB_OK;
    }
    char sk[NBI_SIG_CAP];
    const char *name = nbi_op_name((nbi_op)p->op);
    return nbi_trace_err(tr, NB_ERR_SHAPE,
                         "nb_%s: key is %s; a key is an i32[2] var (pass an array made by "
                         "nb_random_key as an argument, or take row i of nb_rng_split's "
                         "i32[n,2] result with nb_take(keys, i, 0), i a rank-0 integer var)",
                         name, nbi_var_sig(sk, sizeof sk, key));
}

static nb_status nbi_infer_rng_split(nb_trace *tr, nb_var *p) {
    nb_status st = nbi_rng_check_key(tr, p);
    if (st != NB_OK) {
        return st;
    }
    if (p->at.ivalue < 1 || p->at.ivalue > NBI_RNG_SPLIT_MAX) {
        char sk[NBI_SIG_CAP];
        return nbi_trace_err(tr, NB_ERR_INVALID,
                             "nb_rng_split: n is %lld for key %s; split into n keys with 1 <= n "
                             "<= 2^32",
                             (long long)p->at.ivalue, nbi_var_sig(sk, sizeof sk, p->in[0]));
    }
    p->dtype = NB_DTYPE_I32;
    p->rank = 2;
    p->shape[0] = p->at.ivalue;
    p->shape[1] = 2;
    return NB_OK;
}

static nb_status nbi_infer_rng_fold_in(nb_trace *tr, nb_var *p) {
    nb_status st = nbi_rng_check_key(tr, p);
    if (st != NB_OK) {
        return st;
    }
    const nb_var *d = p->in[1];
    if (d->rank != 0 || (d->dtype != NB_DTYPE_I32 && d->dtype != NB_DTYPE_I64)) {
        char sd[NBI_SIG_CAP];
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "nb_rng_fold_in: data is %s; it must be a rank-0 i32 or i64 var "
                             "(e.g. nb_scalar_typed(tr, NB_DTYPE_I32, step), or nb_cast of a "
                             "counter)",
                             nbi_var_sig(sd, sizeof sd, d));
    }
    p->dtype = NB_DTYPE_I32;
    p->rank = 1;
    p->shape[0] = 2;
    return NB_OK;
}

/* bits, uniform, normal, truncated_normal, bernoulli: the shape from the attributes. */
static nb_status nbi_infer_rng_sample(nb_trace *tr, nb_var *p) {
    nb_status st = nbi_rng_check_key(tr, p);
    if (st != NB_OK) {
        return st;
    }
    nbi_rng_kind kind = nbi_rng_kind_of((nbi_op)p->op);
    char msg[256], ss[NBI_SIG_CAP];
    st = nbi_rng_check(kind, p->at.to, p->at.value, nbi_rng_attr_f64(p->at.b[0]), msg, sizeof msg);
    if (st != NB_OK) {
        return nbi_trace_err(tr, st, "nb_%s: %s (sample of shape %s)", nbi_op_name((nbi_op)p->op),
                             msg, nbi_rng_shape_str(ss, sizeof ss, p->at.n_axes, p->at.a));
    }
    p->dtype = nbi_rng_dtype(kind, p->at.to);
    p->rank = (int8_t)p->at.n_axes;
    for (int i = 0; i < p->rank; i++) {
        p->shape[i] = p->at.a[i];
    }
    return NB_OK;
}

static nb_status nbi_infer_rng_permutation(nb_trace *tr, nb_var *p) {
    nb_status st = nbi_rng_check_key(tr, p);
    if (st != NB_OK) {
        return st;
    }
    if (p->at.ivalue < 0 || p->at.ivalue > NBI_RNG_PERM_MAX) {
        return nbi_trace_err(tr, NB_ERR_INVALID,
                             "nb_rng_permutation: n is %lld; a permutation of 0 .. n-1 needs 0 "
                             "<= n <= 2^40",
                             (long long)p->at.ivalue);
    }
    p->dtype = NB_DTYPE_I64;
    p->rank = 1;
    p->shape[0] = p->at.ivalue;
    return NB_OK;
}

/* ---- builders ----------------------------------------------------------------------- */

/* An op on the key (and data) with attributes at. */
static nb_var *nbi_rng_emit(nbi_op op, int n_in, nb_var *const *in, const nbi_attrs *at) {
    bool poisoned;
    nb_trace *tr = nbi_trace_of(n_in, in, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    return nbi_emit(tr, op, n_in, in, poisoned ? NULL : at);
}

nb_var *nb_rng_split(nb_var *key, int64_t n) {
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.ivalue = n;
    return nbi_rng_emit(NBI_OP_RNG_SPLIT, 1, &key, &at);
}

nb_var *nb_rng_fold_in(nb_var *key, nb_var *data) {
    nb_var *in[2] = {key, data};
    return nbi_rng_emit(NBI_OP_RNG_FOLD_IN, 2, in, NULL);
}

nb_var *nb_rng_permutation(nb_var *key, int64_t n) {
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.ivalue = n;
    return nbi_rng_emit(NBI_OP_RNG_PERMUTATION, 1, &key, &at);
}

static nb_var *nbi_rng_sample(nbi_op op, nb_var *key, nb_dtype dtype, int rank,
                              const int64_t *shape, double a, double b) {
    bool poisoned;
    nb_trace *tr = nbi_trace_of(1, &key, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return nbi_emit(tr, op, 1, &key, NULL); /* the NULL-input message, or poison */
    }
    const char *name = nbi_op_name(op);
    if (rank < 0 || rank > NB_MAX_RANK || (rank > 0 && shape == NULL)) {
        return nbi_trace_errv(tr, NB_ERR_SHAPE,
                              "nb_%s: rank %d with %s shape; pass 0 <= rank <= %d and rank dims",
                              name, rank, shape ? "a" : "a NULL", NB_MAX_RANK);
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0) {
            char ss[NBI_SIG_CAP];
            return nbi_trace_errv(tr, NB_ERR_SHAPE, "nb_%s: shape %s has dim %d < 0; dims are >= 0",
                                  name, nbi_rng_shape_str(ss, sizeof ss, rank, shape), i);
        }
        at.a[i] = shape[i];
    }
    at.n_axes = rank;
    at.to = dtype;
    at.value = a;
    at.b[0] = nbi_rng_f64_attr(b);
    return nbi_emit(tr, op, 1, &key, &at);
}

nb_var *nb_rng_bits(nb_var *key, int rank, const int64_t *shape) {
    return nbi_rng_sample(NBI_OP_RNG_BITS, key, NB_DTYPE_I32, rank, shape, 0, 0);
}

nb_var *nb_rng_uniform(nb_var *key, nb_dtype dtype, int rank, const int64_t *shape, double lo,
                       double hi) {
    return nbi_rng_sample(NBI_OP_RNG_UNIFORM, key, dtype, rank, shape, lo, hi);
}

nb_var *nb_rng_normal(nb_var *key, nb_dtype dtype, int rank, const int64_t *shape) {
    return nbi_rng_sample(NBI_OP_RNG_NORMAL, key, dtype, rank, shape, 0, 0);
}

nb_var *nb_rng_truncated_normal(nb_var *key, nb_dtype dtype, double lower, double upper, int rank,
                                const int64_t *shape) {
    return nbi_rng_sample(NBI_OP_RNG_TRUNCATED_NORMAL, key, dtype, rank, shape, lower, upper);
}

nb_var *nb_rng_bernoulli(nb_var *key, double p, int rank, const int64_t *shape) {
    return nbi_rng_sample(NBI_OP_RNG_BERNOULLI, key, NB_DTYPE_BOOL, rank, shape, p, 0);
}

/* ---- kernels ------------------------------------------------------------------------ */

static void nbi_rng_key(const nbi_kargs *k, uint32_t *k0, uint32_t *k1) {
    const int32_t *w = k->in[0];
    *k0 = (uint32_t)w[0];
    *k1 = (uint32_t)w[1];
}

static void nbi_k_rng_split(const nbi_kargs *k) {
    uint32_t k0, k1;
    nbi_rng_key(k, &k0, &k1);
    nbi_rng_split(k0, k1, k->node->at.ivalue, k->out);
}

static void nbi_k_rng_fold_in(const nbi_kargs *k) {
    uint32_t k0, k1, data;
    nbi_rng_key(k, &k0, &k1);
    if (k->node->in[1]->dtype == NB_DTYPE_I64) {
        data = (uint32_t)(uint64_t) * (const int64_t *)k->in[1]; /* the low 32 bits */
    } else {
        data = (uint32_t) * (const int32_t *)k->in[1];
    }
    nbi_rng_fold_in(k0, k1, data, k->out);
}

typedef struct nbi_rng_job {
    const nbi_kargs *k;
    nbi_rng_kind kind;
    uint32_t k0, k1;
} nbi_rng_job;

static void nbi_rng_range(void *ud, int64_t first, int64_t count, int worker) {
    (void)worker;
    const nbi_rng_job *j = ud;
    const nb_var *n = j->k->node;
    nbi_rng_fill(j->kind, n->at.to, n->at.value, nbi_rng_attr_f64(n->at.b[0]), j->k0, j->k1,
                 j->k->out, first, count);
}

static void nbi_k_rng_sample(const nbi_kargs *k) {
    nbi_rng_job j = {.k = k, .kind = nbi_rng_kind_of((nbi_op)k->node->op)};
    nbi_rng_key(k, &j.k0, &j.k1);
    nbi_par_range(k->pool, k->node->size, NBI_RNG_CHUNK, nbi_rng_range, &j);
}

static void nbi_k_rng_permutation(const nbi_kargs *k) {
    uint32_t k0, k1;
    nbi_rng_key(k, &k0, &k1);
    nbi_rng_permutation(k0, k1, k->node->at.ivalue, k->out, k->scratch);
}

static size_t nbi_scratch_rng_permutation(const nb_var *node) {
    return nbi_rng_permutation_scratch(node->at.ivalue);
}

/* ---- registry entries --------------------------------------------------------------- */

const nbi_op_info nbi_opinfo_rng_split = {.name = "rng_split",
                                          .n_in = 1,
                                          .infer = nbi_infer_rng_split,
                                          .kernel = nbi_k_rng_split,
                                          .nondiff = ~0u,
                                          .vmap = nbi_vmap_unroll};
const nbi_op_info nbi_opinfo_rng_fold_in = {.name = "rng_fold_in",
                                            .n_in = 2,
                                            .infer = nbi_infer_rng_fold_in,
                                            .kernel = nbi_k_rng_fold_in,
                                            .nondiff = ~0u,
                                            .vmap = nbi_vmap_unroll};
const nbi_op_info nbi_opinfo_rng_bits = {.name = "rng_bits",
                                         .n_in = 1,
                                         .infer = nbi_infer_rng_sample,
                                         .kernel = nbi_k_rng_sample,
                                         .nondiff = ~0u,
                                         .vmap = nbi_vmap_unroll};
const nbi_op_info nbi_opinfo_rng_uniform = {.name = "rng_uniform",
                                            .n_in = 1,
                                            .infer = nbi_infer_rng_sample,
                                            .kernel = nbi_k_rng_sample,
                                            .nondiff = ~0u,
                                            .vmap = nbi_vmap_unroll};
const nbi_op_info nbi_opinfo_rng_normal = {.name = "rng_normal",
                                           .n_in = 1,
                                           .infer = nbi_infer_rng_sample,
                                           .kernel = nbi_k_rng_sample,
                                           .nondiff = ~0u,
                                           .vmap = nbi_vmap_unroll};
const nbi_op_info nbi_opinfo_rng_truncated_normal = {.name = "rng_truncated_normal",
                                                     .n_in = 1,
                                                     .infer = nbi_infer_rng_sample,
                                                     .kernel = nbi_k_rng_sample,
                                                     .nondiff = ~0u,
                                                     .vmap = nbi_vmap_unroll};
const nbi_op_info nbi_opinfo_rng_bernoulli = {.name = "rng_bernoulli",
                                              .n_in = 1,
                                              .infer = nbi_infer_rng_sample,
                                              .kernel = nbi_k_rng_sample,
                                              .nondiff = ~0u,
                                              .vmap = nbi_vmap_unroll};
const nbi_op_info nbi_opinfo_rng_permutation = {.name = "rng_permutation",
                                                .n_in = 1,
                                                .infer = nbi_infer_rng_permutation,
                                                .kernel = nbi_k_rng_permutation,
                                                .scratch = nbi_scratch_rng_permutation,
                                                .nondiff = ~0u,
                                                .vmap = nbi_vmap_unroll};
