/*
 * test_ops_reduce.c -- the reduce family (src/ad/op_reduce.c): sum, max, min, prod, argmax,
 * argmin and the composites mean, logsumexp, softmax and log_softmax.
 *
 * Nodes are built directly on a trace (no executor): shapes, dtypes and error messages come
 * from the builders; kernels run on plain buffers, node by node (run_graph), and are
 * compared with two references computed here: a double-precision one (accuracy), and, for
 * the primitive reductions, one that follows the documented evaluation order in the dtype
 * itself (blocked pairwise float sums, left-to-right folds, wrapping integers), which the
 * kernels must match bit for bit on every path (row-wise, column-wise, mixed, long runs).
 *
 * The VJP and JVP rules are checked twice: called directly on nodes (dtype and shape of
 * what they build, exact values on small integers with ties and zeros), and through the
 * public API (nb_vjp, nb_jvp, nb_grad on small f64 functions) against central finite
 * differences of the forward function, with exact expected values at ties.
 */
#include "nbtest.h"

#include "ad/ir.h"

#include <stdlib.h>

static const nb_dtype k_num[4] = {NB_DTYPE_F32, NB_DTYPE_F64, NB_DTYPE_I32, NB_DTYPE_I64};

/* ---- fixture ------------------------------------------------------------------------ */

typedef struct fx {
    nb_ctx *ctx;
    nb_trace tr;
} fx;

static void fx_open(fx *f) {
    f->ctx = nbt_ctx();
    NBT_OK(f->ctx, nbi_trace_init(&f->tr, f->ctx, "test"));
}

static void fx_close(fx *f) {
    nbi_trace_release(&f->tr);
    nbt_assert_no_live(f->ctx);
    nb_ctx_destroy(f->ctx);
}

static nb_var *param(fx *f, int i, nb_dtype dt, int rank, const int64_t *shape) {
    nb_var *v = nbi_emit_param(&f->tr, i, dt, rank, shape, NULL);
    assert_non_null(v);
    return v;
}

static void check_sig(const nb_var *v, nb_dtype dt, int rank, const int64_t *shape) {
    NBT_TRUE(!nb_var_is_poison(v));
    NBT_EQ_I64(nb_var_dtype(v), dt);
    NBT_EQ_I64(nb_var_rank(v), rank);
    for (int i = 0; i < rank; i++) {
        NBT_EQ_I64(nb_var_shape(v)[i], shape[i]);
    }
}

/* ---- buffers ------------------------------------------------------------------------ */

/* 64-byte aligned and exactly sized (so ASan sees overruns), filled with a junk pattern so
 * that unwritten outputs show up. */
static void *buf_alloc(size_t bytes) {
    void *p = NULL;
    assert_int_equal(posix_memalign(&p, 64, bytes ? bytes : 1), 0);
    memset(p, 0xA5, bytes ? bytes : 1);
    return p;
}

static void buf_set(nb_dtype dt, void *p, int64_t i, double v) {
    switch (dt) {
    case NB_DTYPE_F32:
        ((float *)p)[i] = (float)v;
        break;
    case NB_DTYPE_F64:
        ((double *)p)[i] = v;
        break;
    case NB_DTYPE_I32:
        ((int32_t *)p)[i] = (int32_t)v;
        break;
    case NB_DTYPE_I64:
        ((int64_t *)p)[i] = (int64_t)v;
        break;
    case NB_DTYPE_BOOL:
        ((uint8_t *)p)[i] = v != 0;
        break;
    }
}

static double buf_get(nb_dtype dt, const void *p, int64_t i) {
    switch (dt) {
    case NB_DTYPE_F32:
        return ((const float *)p)[i];
    case NB_DTYPE_F64:
        return ((const double *)p)[i];
    case NB_DTYPE_I32:
        return ((const int32_t *)p)[i];
    case NB_DTYPE_I64:
        return (double)((const int64_t *)p)[i];
    case NB_DTYPE_BOOL:
        return ((const uint8_t *)p)[i];
    }
    return 0;
}

static void *buf_from(nb_dtype dt, int64_t n, const double *v) {
    void *p = buf_alloc((size_t)n * nb_dtype_size(dt));
    for (int64_t i = 0; i < n; i++) {
        buf_set(dt, p, i, v[i]);
    }
    return p;
}

/* Deterministic pseudo-random numbers (a 64-bit LCG). */
static uint64_t g_rng = 12345;
static double rnd_unit(void) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}
static double rnd_in(double lo, double hi) {
    return lo + (hi - lo) * rnd_unit();
}
static double rnd_int(int lo, int hi) {
    return (double)(lo + (int)(rnd_unit() * (hi - lo + 1)));
}

/* Equal values, NaN equal to NaN. */
static bool same(double a, double b) {
    return (a != a && b != b) || a == b;
}

/* ---- running a graph ---------------------------------------------------------------- */

/* Run every node of the trace's graph in order: PARAM i reads inputs[i]; every other node
 * runs its kernel into a fresh buffer, with scratch when the op asks for it (filled with
 * junk: kernels must not expect it zeroed). Returns one buffer per node (free_graph). */
static void **run_graph(const nb_trace *tr, const void *const *inputs) {
    int32_t n = tr->g.n_nodes;
    void **bufs = calloc((size_t)n, sizeof(void *));
    assert_non_null(bufs);
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = tr->g.nodes[i];
        if (v->op == NBI_OP_PARAM) {
            bufs[i] = (void *)inputs[v->at.ivalue];
            continue;
        }
        const nbi_op_info *info = nbi_op_get((nbi_op)v->op);
        assert_non_null(info);
        assert_non_null(info->kernel);
        if (info->infer != NULL) { /* what the IR verifier does: inference re-runs cleanly */
            nb_var probe = *v;
            probe.rank = 0;
            memset(probe.shape, 0, sizeof probe.shape);
            NBT_EQ_I64(info->infer((nb_trace *)tr, &probe), NB_OK);
            NBT_EQ_I64(probe.dtype, v->dtype);
            NBT_EQ_I64(probe.rank, v->rank);
            NBT_TRUE(memcmp(probe.shape, v->shape, (size_t)v->rank * sizeof(int64_t)) == 0);
        }
        bufs[i] = buf_alloc((size_t)v->size * nb_dtype_size(v->dtype));
        const void *in[8] = {NULL};
        assert_true(v->n_in <= 8);
        for (int j = 0; j < v->n_in; j++) {
            in[j] = bufs[v->in[j]->id];
        }
        size_t sb = info->scratch ? info->scratch(v) : 0;
        void *scratch = sb ? buf_alloc(sb) : NULL;
        nbi_kargs k = {.node = v, .out = bufs[i], .in = in, .scratch = scratch};
        info->kernel(&k);
        free(scratch);
    }
    return bufs;
}

static void free_graph(const nb_trace *tr, void **bufs) {
    for (int32_t i = 0; i < tr->g.n_nodes; i++) {
        if (tr->g.nodes[i]->op != NBI_OP_PARAM) {
            free(bufs[i]);
        }
    }
    free(bufs);
}

static int count_ops(const nb_trace *tr, nbi_op op) {
    int c = 0;
    for (int32_t i = 0; i < tr->g.n_nodes; i++) {
        c += tr->g.nodes[i]->op == op;
    }
    return c;
}

/* ---- references --------------------------------------------------------------------- */

/* The documented order, in the dtype: blocks of 128 summed left to right from their first
 * element, block sums combined as T(b) = T(first p) + T(rest), p the largest power of two
 * below the count -- written recursively here, unlike the kernel's binary counter. */
#define SPEC_FLOAT(T, S)                                                                           \
    static T spec_tree_##S(const T *b, int64_t n) {                                                \
        if (n == 1) {                                                                              \
            return b[0];                                                                           \
        }                                                                                          \
        int64_t p = 1;                                                                             \
        while (p * 2 < n) {                                                                        \
            p *= 2;                                                                                \
        }                                                                                          \
        return spec_tree_##S(b, p) + spec_tree_##S(b + p, n - p);                                  \
    }                                                                                              \
    static T spec_##S(nbi_op op, const T *x, int64_t n) {                                          \
        if (n == 0) {                                                                              \
            return op == NBI_OP_PROD ? (T)1 : (T)0;                                                \
        }                                                                                          \
        T acc = x[0];                                                                              \
        if (op == NBI_OP_SUM) {                                                                    \
            int64_t nb = (n + 127) / 128;                                                          \
            T *b = malloc((size_t)nb * sizeof(T));                                                 \
            assert_non_null(b);                                                                    \
            for (int64_t k = 0; k < nb; k++) {                                                     \
                T s = x[k * 128];                                                                  \
                for (int64_t i = k * 128 + 1; i < n && i < (k + 1) * 128; i++) {                   \
                    s = s + x[i];                                                                  \
                }                                                                                  \
                b[k] = s;                                                                          \
            }                                                                                      \
            acc = spec_tree_##S(b, nb);                                                            \
            free(b);                                                                               \
            return acc;                                                                            \
        }                                                                                          \
        for (int64_t i = 1; i < n; i++) {                                                          \
            T v = x[i];                                                                            \
            if (op == NBI_OP_PROD) {                                                               \
                acc = acc * v;                                                                     \
            } else if (op == NBI_OP_MAX) {                                                         \
                acc = (v > acc || v != v) ? v : acc;                                               \
            } else {                                                                               \
                acc = (v < acc || v != v) ? v : acc;                                               \
            }                                                                                      \
        }                                                                                          \
        return acc;                                                                                \
    }
SPEC_FLOAT(float, f32)
SPEC_FLOAT(double, f64)

/* Integers: wrapping (exact modulo 2^64, truncated to the dtype by the caller). */
static int64_t spec_int(nbi_op op, const int64_t *x, int64_t n) {
    uint64_t acc = op == NBI_OP_PROD ? 1 : 0;
    if (op == NBI_OP_MAX || op == NBI_OP_MIN) {
        int64_t m = x[0];
        for (int64_t i = 1; i < n; i++) {
            m = op == NBI_OP_MAX ? (x[i] > m ? x[i] : m) : (x[i] < m ? x[i] : m);
        }
        return m;
    }
    for (int64_t i = 0; i < n; i++) {
        acc = op == NBI_OP_SUM ? acc + (uint64_t)x[i] : acc * (uint64_t)x[i];
    }
    return (int64_t)acc;
}

/* ---- primitive reductions against the references ------------------------------------ */

typedef struct rcase {
    int rank;
    int64_t shape[4];
    int n_axes;
    int axes[4];
    bool null_axes;
    bool keepdims;
} rcase;

static const rcase k_cases[] = {
    {0, {0}, 0, {0}, true, false},                 /* rank 0, every axis (none) */
    {0, {0}, 0, {0}, true, true},                  /* rank 0, keepdims */
    {1, {5}, 1, {0}, false, false},                /* rank 1 to a scalar */
    {1, {5}, 1, {-1}, false, true},                /* negative axis, keepdims */
    {2, {3, 4}, 1, {1}, false, false},             /* rows (innermost) */
    {2, {3, 4}, 1, {0}, false, false},             /* columns */
    {2, {3, 4}, 1, {-2}, false, true},             /* columns, keepdims */
    {2, {3, 4}, 2, {1, 0}, false, false},          /* unsorted axes */
    {2, {3, 4}, 0, {0}, false, false},             /* n_axes 0: reduce nothing */
    {2, {3, 4}, 0, {0}, true, true},               /* NULL: every axis, keepdims */
    {3, {2, 1, 3}, 1, {1}, false, false},          /* a size-1 axis only: a copy */
    {3, {2, 1, 3}, 2, {0, 1}, false, true},        /* size-1 and real */
    {3, {1, 4, 1}, 2, {-1, 0}, false, false},      /* size-1 axes, negative */
    {4, {2, 3, 4, 5}, 2, {0, 2}, false, false},    /* R K R K: column-wise, strided */
    {4, {2, 3, 4, 5}, 2, {1, 3}, false, true},     /* K R K R: row-wise, several runs */
    {4, {2, 3, 4, 5}, 3, {0, 1, 3}, false, false}, /* R R K R */
    {4, {2, 3, 4, 5}, 1, {2}, false, false},       /* one middle axis */
    {4, {2, 3, 4, 5}, 2, {-1, 0}, false, false},   /* outer and inner */
    {2, {0, 3}, 1, {0}, false, false},             /* empty reduction: identity */
    {2, {0, 3}, 1, {1}, false, false},             /* empty output */
    {2, {3, 0}, 1, {1}, false, true},              /* empty reduction, keepdims */
    {2, {3, 0}, 1, {0}, false, false},             /* empty output */
    {3, {4, 1, 300}, 1, {0}, false, false},        /* column-wise, size-1 middle */
    {2, {130, 4100}, 1, {0}, false, true},         /* column-wise over two chunks */
    {2, {300, 5}, 1, {0}, false, false},           /* column-wise, pending block sums */
    {2, {2, 700}, 1, {1}, false, false},           /* row-wise, several blocks */
    {4, {3, 2, 50, 7}, 2, {0, 2}, false, false},   /* column-wise, 150 per output */
    {3, {3, 2, 1100}, 2, {0, 2}, false, false},    /* runs starting mid-block; long runs */
    {1, {5000}, 1, {0}, false, false},             /* one long run: 40 blocks */
    {2, {1030, 3}, 1, {0}, false, true},           /* column-wise, 9 blocks */
    {3, {129, 2, 2}, 2, {0, 2}, false, false},     /* 258 per output, strided runs */
};

typedef nb_var *(*reduce_fn)(nb_var *, const int *, int, bool);

static reduce_fn builder_of(nbi_op op) {
    switch (op) {
    case NBI_OP_SUM:
        return nb_sum;
    case NBI_OP_MAX:
        return nb_max;
    case NBI_OP_MIN:
        return nb_min;
    default:
        return nb_prod;
    }
}

static void fill_values(nbi_op op, nb_dtype dt, double *v, int64_t n) {
    bool fl = nb_dtype_is_float(dt);
    for (int64_t i = 0; i < n; i++) {
        if (op == NBI_OP_PROD) {
            v[i] = fl ? rnd_in(0.95, 1.05) : rnd_int(-2, 2);
        } else {
            v[i] = fl ? rnd_in(-2.0, 2.0) : rnd_int(-50, 50);
        }
    }
}

static void check_case(nbi_op op, nb_dtype dt, const rcase *c) {
    fx f;
    fx_open(&f);
    nb_var *x = param(&f, 0, dt, c->rank, c->shape);
    int64_t n = nbi_shape_size(c->rank, c->shape);

    bool red[4] = {false, false, false, false};
    if (c->null_axes) {
        for (int i = 0; i < c->rank; i++) {
            red[i] = true;
        }
    }
    for (int i = 0; !c->null_axes && i < c->n_axes; i++) {
        red[c->axes[i] < 0 ? c->axes[i] + c->rank : c->axes[i]] = true;
    }
    int64_t want[4], ostride[4], nout = 1, nred = 1;
    int wr = 0;
    for (int i = 0; i < c->rank; i++) {
        if (red[i]) {
            nred *= c->shape[i];
            if (c->keepdims) {
                want[wr++] = 1;
            }
        } else {
            nout *= c->shape[i];
            want[wr++] = c->shape[i];
        }
    }
    for (int i = c->rank - 1, s = 1; i >= 0; i--) {
        ostride[i] = red[i] ? 0 : s;
        s *= red[i] ? 1 : (int)c->shape[i];
    }

    nb_var *y = builder_of(op)(x, c->null_axes ? NULL : c->axes, c->n_axes, c->keepdims);
    if ((op == NBI_OP_MAX || op == NBI_OP_MIN) && nred == 0 && nout > 0) {
        NBT_TRUE(nb_var_is_poison(y));
        NBT_STATUS(f.ctx, NB_ERR_SHAPE, nb_trace_status(&f.tr));
        NBT_ERRMSG_HAS(f.ctx, op == NBI_OP_MAX ? "nb_max: " : "nb_min: ");
        NBT_ERRMSG_HAS(f.ctx, "has no identity");
        fx_close(&f);
        return;
    }
    NBT_OK(f.ctx, nb_trace_status(&f.tr));
    check_sig(y, dt, wr, want);
    NBT_EQ_I64(y->op, op);

    double *vals = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    assert_non_null(vals);
    fill_values(op, dt, vals, n);
    void *xb = buf_from(dt, n, vals);
    void **bufs = run_graph(&f.tr, (const void *[]){xb});
    const void *yb = bufs[y->id];

    /* Each output's reduced sequence, in increasing flat index order. */
    int64_t *cnt = calloc((size_t)(nout > 0 ? nout : 1), sizeof(int64_t));
    double *seq = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    assert_true(cnt != NULL && seq != NULL);
    int64_t idx[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n; i++) {
        int64_t o = 0;
        for (int d = 0; d < c->rank; d++) {
            o += idx[d] * ostride[d];
        }
        seq[o * nred + cnt[o]++] = buf_get(dt, xb, i);
        for (int d = c->rank - 1; d >= 0; d--) {
            if (++idx[d] < c->shape[d]) {
                break;
            }
            idx[d] = 0;
        }
    }
    float *s32 = malloc((size_t)(nred > 0 ? nred : 1) * sizeof(float));
    int64_t *si = malloc((size_t)(nred > 0 ? nred : 1) * sizeof(int64_t));
    assert_true(s32 != NULL && si != NULL);
    for (int64_t o = 0; o < nout; o++) {
        const double *sq = seq + o * nred;
        double got = buf_get(dt, yb, o), spec = 0;
        if (dt == NB_DTYPE_F32) {
            for (int64_t i = 0; i < nred; i++) {
                s32[i] = (float)sq[i];
            }
            spec = spec_f32(op, s32, nred);
        } else if (dt == NB_DTYPE_F64) {
            spec = spec_f64(op, sq, nred);
        } else {
            for (int64_t i = 0; i < nred; i++) {
                si[i] = (int64_t)sq[i];
            }
            int64_t r = spec_int(op, si, nred);
            spec = dt == NB_DTYPE_I32 ? (double)(int32_t)(uint32_t)(uint64_t)r : (double)r;
        }
        if (!same(got, spec)) {
            fail_msg("nb_%s %s case rank %d shape[0] %lld: output %lld is %.17g, the "
                     "documented order gives %.17g",
                     nbi_op_name(op), nb_dtype_name(dt), c->rank, (long long)c->shape[0],
                     (long long)o, got, spec);
        }
        /* Accuracy against double precision. */
        if (nb_dtype_is_float(dt) && (op == NBI_OP_SUM || op == NBI_OP_PROD)) {
            double exact = op == NBI_OP_SUM ? 0.0 : 1.0, mag = 0.0;
            for (int64_t i = 0; i < nred; i++) {
                exact = op == NBI_OP_SUM ? exact + sq[i] : exact * sq[i];
                mag += fabs(sq[i]);
            }
            double eps = dt == NB_DTYPE_F32 ? 6e-8 : 1.2e-16;
            double tol = op == NBI_OP_SUM ? 16 * eps * mag : 2 * eps * (double)nred * fabs(exact);
            NBT_NEAR(got, exact, tol + 1e-300);
        }
    }
    free(si);
    free(s32);
    free(seq);
    free(cnt);
    free_graph(&f.tr, bufs);
    free(xb);
    free(vals);
    fx_close(&f);
}

static void test_reduce_every_op_dtype_and_shape(void **state) {
    (void)state;
    const nbi_op ops[4] = {NBI_OP_SUM, NBI_OP_MAX, NBI_OP_MIN, NBI_OP_PROD};
    for (int o = 0; o < 4; o++) {
        for (int d = 0; d < 4; d++) {
            for (size_t c = 0; c < sizeof k_cases / sizeof k_cases[0]; c++) {
                check_case(ops[o], k_num[d], &k_cases[c]);
            }
        }
    }
}

/* Run one reduction of a given input buffer; returns the output buffer (malloc'd). */
static void *run_one(nbi_op op, nb_dtype dt, int rank, const int64_t *shape, const int *axes,
                     int n_axes, const void *xb, int64_t *out_size) {
    fx f;
    fx_open(&f);
    nb_var *x = param(&f, 0, dt, rank, shape);
    nb_var *y = builder_of(op)(x, axes, n_axes, false);
    NBT_OK(f.ctx, nb_trace_status(&f.tr));
    void **bufs = run_graph(&f.tr, (const void *[]){xb});
    size_t bytes = (size_t)y->size * nb_dtype_size(dt);
    void *out = buf_alloc(bytes);
    memcpy(out, bufs[y->id], bytes);
    *out_size = y->size;
    free_graph(&f.tr, bufs);
    fx_close(&f);
    return out;
}

static void test_float_sum_is_pairwise_and_accurate(void **state) {
    (void)state;
    /* 2^24 followed by 4095 ones, in f32. Left to right, every 1 is lost (2^24 + 1 rounds
     * back to 2^24). Blocked: only the first block's 127 ones are lost; the other 31 blocks
     * sum to 128 exactly and the tree adds them exactly. */
    int64_t n = 4096;
    float *x = buf_alloc((size_t)n * sizeof(float));
    x[0] = 16777216.0f;
    for (int64_t i = 1; i < n; i++) {
        x[i] = 1.0f;
    }
    int64_t m;
    float *y = run_one(NBI_OP_SUM, NB_DTYPE_F32, 1, &n, NULL, 0, x, &m);
    NBT_EQ_I64(m, 1);
    NBT_EQ_F64(y[0], 16777216.0 + 31 * 128);
    free(y);
    /* The same data as columns: identical bits. */
    float *xc = buf_alloc((size_t)n * 2 * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        xc[2 * i] = xc[2 * i + 1] = x[i];
    }
    int64_t shape2[2] = {n, 2};
    y = run_one(NBI_OP_SUM, NB_DTYPE_F32, 2, shape2, (const int[]){0}, 1, xc, &m);
    NBT_EQ_I64(m, 2);
    NBT_EQ_F64(y[0], 16777216.0 + 31 * 128);
    NBT_EQ_F64(y[1], 16777216.0 + 31 * 128);
    free(y);
    free(xc);
    free(x);

    /* 10^6 values of 0.1f: the relative error stays within (128 + log2(blocks)) ulps, where
     * a left-to-right f32 sum is off by about 1%. */
    n = 1000000;
    x = buf_alloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        x[i] = 0.1f;
    }
    y = run_one(NBI_OP_SUM, NB_DTYPE_F32, 1, &n, NULL, 0, x, &m);
    double exact = (double)0.1f * 1e6;
    NBT_NEAR(y[0], exact, exact * 141 * 6e-8);
    free(y);
    free(x);
}

static void test_int_sum_and_prod_wrap(void **state) {
    (void)state;
    int64_t m;
    int32_t a32[3] = {INT32_MAX, 1, 1};
    int64_t three = 3;
    int32_t *r32 = run_one(NBI_OP_SUM, NB_DTYPE_I32, 1, &three, NULL, 0, a32, &m);
    NBT_EQ_I64(r32[0], (int64_t)INT32_MIN + 1);
    free(r32);
    int32_t p32[3] = {65536, 65536, 3};
    r32 = run_one(NBI_OP_PROD, NB_DTYPE_I32, 1, &three, NULL, 0, p32, &m);
    NBT_EQ_I64(r32[0], 0);
    free(r32);
    int64_t a64[3] = {INT64_MAX, 2, -1};
    int64_t *r64 = run_one(NBI_OP_PROD, NB_DTYPE_I64, 1, &three, NULL, 0, a64, &m);
    NBT_EQ_I64(r64[0], 2); /* INT64_MAX * 2 = -2 (mod 2^64), * -1 = 2 */
    free(r64);
    r64 = run_one(NBI_OP_SUM, NB_DTYPE_I64, 1, &three, NULL, 0, a64, &m);
    NBT_EQ_I64(r64[0], INT64_MIN); /* INT64_MAX + 2 - 1 */
    free(r64);
    /* Column-wise: [3, 2] over axis 0. */
    int64_t c64[6] = {INT64_MAX, INT64_MIN, 1, -1, 0, 0};
    int64_t shape[2] = {3, 2};
    r64 = run_one(NBI_OP_SUM, NB_DTYPE_I64, 2, shape, (const int[]){0}, 1, c64, &m);
    NBT_EQ_I64(r64[0], INT64_MIN);
    NBT_EQ_I64(r64[1], INT64_MAX);
    free(r64);
}

static void test_max_min_nan_and_inf(void **state) {
    (void)state;
    const nb_dtype fdt[2] = {NB_DTYPE_F32, NB_DTYPE_F64};
    for (int d = 0; d < 2; d++) {
        nb_dtype dt = fdt[d];
        /* [3, 4]: row 0 has a NaN in the middle, row 1 at the end, row 2 only +-inf. */
        double v[12] = {1, NAN, 5, -7, 2, 3, 4, NAN, -INFINITY, INFINITY, -INFINITY, 0};
        void *xb = buf_from(dt, 12, v);
        int64_t shape[2] = {3, 4}, m;
        for (int mx = 0; mx < 2; mx++) {
            nbi_op op = mx ? NBI_OP_MAX : NBI_OP_MIN;
            void *r = run_one(op, dt, 2, shape, (const int[]){1}, 1, xb, &m);
            NBT_TRUE(isnan(buf_get(dt, r, 0)));
            NBT_TRUE(isnan(buf_get(dt, r, 1)));
            NBT_EQ_F64(buf_get(dt, r, 2), mx ? INFINITY : -INFINITY);
            free(r);
            /* Column-wise: NaN in column 1 (row 0) and column 3 (row 1). */
            r = run_one(op, dt, 2, shape, (const int[]){0}, 1, xb, &m);
            NBT_EQ_I64(m, 4);
            NBT_EQ_F64(buf_get(dt, r, 0), mx ? 2 : -INFINITY);
            NBT_TRUE(isnan(buf_get(dt, r, 1)));
            NBT_EQ_F64(buf_get(dt, r, 2), mx ? 5 : -INFINITY);
            NBT_TRUE(isnan(buf_get(dt, r, 3)));
            free(r);
            /* A NaN first stays. */
            double w[3] = {NAN, 1, 2};
            void *wb = buf_from(dt, 3, w);
            int64_t three = 3;
            r = run_one(op, dt, 1, &three, NULL, 0, wb, &m);
            NBT_TRUE(isnan(buf_get(dt, r, 0)));
            free(r);
            free(wb);
        }
        free(xb);
    }
}

static void test_shapes_and_weak(void **state) {
    (void)state;
    fx f;
    fx_open(&f);
    nb_var *x = param(&f, 0, NB_DTYPE_F32, 3, (int64_t[]){2, 3, 4});
    check_sig(nb_sum(x, NULL, 0, false), NB_DTYPE_F32, 0, NULL);
    check_sig(nb_sum(x, NULL, 7, true), NB_DTYPE_F32, 3, (int64_t[]){1, 1, 1});
    check_sig(nb_max(x, (const int[]){-1, 0}, 2, false), NB_DTYPE_F32, 1, (int64_t[]){3});
    check_sig(nb_min(x, (const int[]){1}, 1, true), NB_DTYPE_F32, 3, (int64_t[]){2, 1, 4});
    check_sig(nb_prod(x, (const int[]){0}, 0, true), NB_DTYPE_F32, 3, (int64_t[]){2, 3, 4});
    nb_var *y = nb_sum(x, (const int[]){2, 0}, 2, false);
    NBT_EQ_I64(y->at.n_axes, 2);
    NBT_EQ_I64(y->at.axes[0], 0);
    NBT_EQ_I64(y->at.axes[1], 2);
    NBT_TRUE(!y->at.keepdims);
    /* A weak scalar stays weak; a typed one does not become weak. */
    nb_var *w = nb_sum(nb_scalar(&f.tr, 2.0), NULL, 0, false);
    NBT_TRUE((w->flags & NBI_NODE_WEAK) != 0);
    nb_var *t = nb_max(nb_scalar_typed(&f.tr, NB_DTYPE_F64, 2.0), NULL, 0, false);
    NBT_TRUE((t->flags & NBI_NODE_WEAK) == 0);
    NBT_EQ_I64(t->dtype, NB_DTYPE_F64);
    /* Argmax shapes. */
    check_sig(nb_argmax(x, 1, false), NB_DTYPE_I64, 2, (int64_t[]){2, 4});
    check_sig(nb_argmin(x, -1, true), NB_DTYPE_I64, 3, (int64_t[]){2, 3, 1});
    NBT_OK(f.ctx, nb_trace_status(&f.tr));
    fx_close(&f);
}

/* ---- argmax / argmin ---------------------------------------------------------------- */

/* First index of the extremum along axis; a NaN beats everything, the first NaN wins. */
static int64_t ref_arg(bool is_max, const double *x, int64_t n, int64_t stride) {
    int64_t bi = 0;
    double b = x[0];
    for (int64_t i = 1; i < n; i++) {
        double v = x[i * stride];
        bool better = b == b && (v != v || (is_max ? v > b : v < b));
        if (better) {
            bi = i;
            b = v;
        }
    }
    return bi;
}

static void check_arg(nbi_op op, nb_dtype dt, int rank, const int64_t *shape, int axis,
                      bool keepdims) {
    fx f;
    fx_open(&f);
    nb_var *x = param(&f, 0, dt, rank, shape);
    nb_var *y = (op == NBI_OP_ARGMAX ? nb_argmax : nb_argmin)(x, axis, keepdims);
    NBT_OK(f.ctx, nb_trace_status(&f.tr));
    int ax = axis < 0 ? axis + rank : axis;
    int64_t want[4], outer = 1, inner = 1;
    int wr = 0;
    for (int i = 0; i < rank; i++) {
        if (i != ax) {
            want[wr++] = shape[i];
        } else if (keepdims) {
            want[wr++] = 1;
        }
        if (i < ax) {
            outer *= shape[i];
        } else if (i > ax) {
            inner *= shape[i];
        }
    }
    check_sig(y, NB_DTYPE_I64, wr, want);
    int64_t n = nbi_shape_size(rank, shape), len = shape[ax];
    double *vals = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    assert_non_null(vals);
    for (int64_t i = 0; i < n; i++) {
        /* Few distinct values: plenty of ties. Floats also get NaN and infinities. */
        vals[i] = dt == NB_DTYPE_BOOL ? rnd_int(0, 1) : rnd_int(-2, 2);
        if (nb_dtype_is_float(dt)) {
            double u = rnd_unit();
            vals[i] = u < 0.08 ? NAN : u < 0.12 ? INFINITY : u < 0.16 ? -INFINITY : vals[i];
        }
    }
    void *xb = buf_from(dt, n, vals);
    void **bufs = run_graph(&f.tr, (const void *[]){xb});
    const int64_t *r = bufs[y->id];
    for (int64_t a = 0; a < outer; a++) {
        for (int64_t c = 0; c < inner; c++) {
            int64_t want_i = ref_arg(op == NBI_OP_ARGMAX, vals + a * len * inner + c, len, inner);
            NBT_EQ_I64(r[a * inner + c], want_i);
        }
    }
    free_graph(&f.tr, bufs);
    free(xb);
    free(vals);
    fx_close(&f);
}

static void test_argmax_argmin(void **state) {
    (void)state;
    const nb_dtype all[5] = {NB_DTYPE_F32, NB_DTYPE_F64, NB_DTYPE_I32, NB_DTYPE_I64, NB_DTYPE_BOOL};
    for (int o = 0; o < 2; o++) {
        nbi_op op = o ? NBI_OP_ARGMIN : NBI_OP_ARGMAX;
        for (int d = 0; d < 5; d++) {
            for (int kd = 0; kd < 2; kd++) {
                check_arg(op, all[d], 2, (int64_t[]){6, 7}, 0, kd);
                check_arg(op, all[d], 2, (int64_t[]){6, 7}, 1, kd);
                check_arg(op, all[d], 2, (int64_t[]){6, 7}, -1, kd);
                check_arg(op, all[d], 3, (int64_t[]){3, 9, 4}, 1, kd);
                check_arg(op, all[d], 3, (int64_t[]){3, 9, 4}, -3, kd);
                check_arg(op, all[d], 3, (int64_t[]){3, 1, 4}, 1, kd);
                check_arg(op, all[d], 1, (int64_t[]){40}, 0, kd);
                /* past one 64-column chunk of the kernel: 64 + 64 + 22 columns */
                check_arg(op, all[d], 3, (int64_t[]){3, 5, 150}, 1, kd);
                check_arg(op, all[d], 2, (int64_t[]){9, 64}, 0, kd);
                check_arg(op, all[d], 2, (int64_t[]){0, 3}, 1, kd); /* empty output */
                check_arg(op, all[d], 2, (int64_t[]){0, 0}, 0, kd);
            }
        }
    }
}

static void test_argmax_specifics(void **state) {
    (void)state;
    fx f;
    fx_open(&f);
    /* bool: any nonzero byte is true; ties give the first index. */
    nb_var *b = param(&f, 0, NB_DTYPE_BOOL, 1, (int64_t[]){4});
    nb_var *f32 = param(&f, 1, NB_DTYPE_F32, 1, (int64_t[]){5});
    nb_var *am = nb_argmax(b, 0, false), *an = nb_argmin(b, 0, false);
    nb_var *fm = nb_argmax(f32, 0, false), *fn = nb_argmin(f32, 0, false);
    nb_var *fk = nb_argmax(f32, -1, true);
    NBT_OK(f.ctx, nb_trace_status(&f.tr));
    uint8_t bv[4] = {0, 2, 1, 0};
    float fv[5] = {-1.0f, 3.0f, NAN, 3.0f, NAN};
    void **bufs = run_graph(&f.tr, (const void *[]){bv, fv});
    NBT_EQ_I64(((int64_t *)bufs[am->id])[0], 1);
    NBT_EQ_I64(((int64_t *)bufs[an->id])[0], 0);
    NBT_EQ_I64(((int64_t *)bufs[fm->id])[0], 2); /* NaN counts as the max: the first NaN */
    NBT_EQ_I64(((int64_t *)bufs[fn->id])[0], 2); /* ... and as the min */
    NBT_EQ_I64(((int64_t *)bufs[fk->id])[0], 2);
    check_sig(fk, NB_DTYPE_I64, 1, (int64_t[]){1});
    free_graph(&f.tr, bufs);
    fx_close(&f);
}

/* ---- errors ------------------------------------------------------------------------- */

typedef nb_var *(*err_body)(nb_trace *tr);

static void expect_err(err_body body, nb_status want, const char *sub_a, const char *sub_b) {
    fx f;
    fx_open(&f);
    nb_var *v = body(&f.tr);
    NBT_TRUE(v != NULL && nb_var_is_poison(v));
    NBT_STATUS(f.ctx, want, nb_trace_status(&f.tr));
    NBT_ERRMSG_HAS(f.ctx, sub_a);
    if (sub_b != NULL) {
        NBT_ERRMSG_HAS(f.ctx, sub_b);
    }
    NBT_ERRMSG_HAS(f.ctx, "(in 'test')");
    NBT_TRUE(strchr(nb_ctx_errmsg(f.ctx), '\n') == NULL);
    fx_close(&f);
}

static nb_var *x23(nb_trace *tr, nb_dtype dt) {
    return nbi_emit_param(tr, 0, dt, 2, (int64_t[]){2, 3}, NULL);
}

static nb_var *e_sum_bool(nb_trace *tr) {
    return nb_sum(x23(tr, NB_DTYPE_BOOL), NULL, 0, false);
}
static nb_var *e_max_bool(nb_trace *tr) {
    return nb_max(x23(tr, NB_DTYPE_BOOL), (const int[]){1}, 1, false);
}
static nb_var *e_prod_bool(nb_trace *tr) {
    return nb_prod(x23(tr, NB_DTYPE_BOOL), NULL, 0, true);
}
static nb_var *e_axis_high(nb_trace *tr) {
    return nb_sum(x23(tr, NB_DTYPE_F32), (const int[]){2}, 1, false);
}
static nb_var *e_axis_low(nb_trace *tr) {
    return nb_min(x23(tr, NB_DTYPE_I32), (const int[]){0, -3}, 2, false);
}
static nb_var *e_axis_dup(nb_trace *tr) {
    return nb_sum(x23(tr, NB_DTYPE_F32), (const int[]){1, -1}, 2, false);
}
static nb_var *e_axis_too_many(nb_trace *tr) {
    return nb_prod(x23(tr, NB_DTYPE_F64), (const int[]){0, 1, 0}, 3, false);
}
static nb_var *e_n_axes_negative(nb_trace *tr) {
    return nb_sum(x23(tr, NB_DTYPE_F32), (const int[]){0}, -1, false);
}
static nb_var *e_rank0_axis(nb_trace *tr) {
    return nb_sum(nb_scalar_typed(tr, NB_DTYPE_F32, 1.0), (const int[]){0}, 1, false);
}
static nb_var *e_max_empty(nb_trace *tr) {
    return nb_max(nbi_emit_param(tr, 0, NB_DTYPE_F32, 2, (int64_t[]){2, 0}, NULL), (const int[]){1},
                  1, false);
}
static nb_var *e_min_empty_all(nb_trace *tr) {
    return nb_min(nbi_emit_param(tr, 0, NB_DTYPE_I64, 2, (int64_t[]){2, 0}, NULL), NULL, 0, false);
}
static nb_var *e_argmax_rank0(nb_trace *tr) {
    return nb_argmax(nb_scalar(tr, 1.0), 0, false);
}
static nb_var *e_argmin_axis(nb_trace *tr) {
    return nb_argmin(x23(tr, NB_DTYPE_I64), -3, false);
}
static nb_var *e_argmax_empty(nb_trace *tr) {
    return nb_argmax(nbi_emit_param(tr, 0, NB_DTYPE_F32, 2, (int64_t[]){3, 0}, NULL), 1, true);
}
static nb_var *e_mean_int(nb_trace *tr) {
    return nb_mean(x23(tr, NB_DTYPE_I32), NULL, 0, false);
}
static nb_var *e_mean_dup(nb_trace *tr) {
    return nb_mean(x23(tr, NB_DTYPE_F32), (const int[]){0, 0}, 2, false);
}
static nb_var *e_lse_bool(nb_trace *tr) {
    return nb_logsumexp(x23(tr, NB_DTYPE_BOOL), NULL, 0, false);
}
static nb_var *e_lse_axis(nb_trace *tr) {
    return nb_logsumexp(x23(tr, NB_DTYPE_F64), (const int[]){5}, 1, false);
}
static nb_var *e_softmax_axis(nb_trace *tr) {
    return nb_softmax(x23(tr, NB_DTYPE_F32), 2);
}
static nb_var *e_softmax_int(nb_trace *tr) {
    return nb_softmax(x23(tr, NB_DTYPE_I64), 1);
}
static nb_var *e_log_softmax_rank0(nb_trace *tr) {
    return nb_log_softmax(nb_scalar_typed(tr, NB_DTYPE_F64, 1.0), 0);
}
/* Attributes a pass could get wrong: inference re-checks them. */
static nb_var *e_bad_attrs(nb_trace *tr) {
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.n_axes = 2;
    at.axes[0] = 1;
    at.axes[1] = 0;
    nb_var *x = x23(tr, NB_DTYPE_F32);
    return nbi_emit(tr, NBI_OP_SUM, 1, &x, &at);
}
static nb_var *e_bad_arg_attrs(nb_trace *tr) {
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.axis = 2;
    nb_var *x = x23(tr, NB_DTYPE_F32);
    return nbi_emit(tr, NBI_OP_ARGMIN, 1, &x, &at);
}

static void test_errors(void **state) {
    (void)state;
    expect_err(e_sum_bool, NB_ERR_DTYPE, "nb_sum: operand is bool[2,3]", "nb_cast");
    expect_err(e_max_bool, NB_ERR_DTYPE, "nb_max: operand is bool[2,3]", "numeric dtype");
    expect_err(e_prod_bool, NB_ERR_DTYPE, "nb_prod: operand is bool[2,3]", NULL);
    expect_err(e_axis_high, NB_ERR_INVALID, "nb_sum: axis 2 is out of range for f32[2,3]",
               "valid axes are 0..1, or -2..-1");
    expect_err(e_axis_low, NB_ERR_INVALID, "nb_min: axis -3 is out of range for i32[2,3]", NULL);
    expect_err(e_axis_dup, NB_ERR_INVALID, "nb_sum: axis 1 of f32[2,3] is listed twice",
               "(as 1 and -1)");
    expect_err(e_axis_too_many, NB_ERR_INVALID, "nb_prod: axis 0 of f64[2,3] is listed twice",
               NULL);
    expect_err(e_n_axes_negative, NB_ERR_INVALID, "nb_sum: n_axes is -1 for f32[2,3]", "axes NULL");
    expect_err(e_rank0_axis, NB_ERR_INVALID, "nb_sum: axis 0 is out of range for f32[]",
               "rank-0 operand has no axes");
    expect_err(e_max_empty, NB_ERR_SHAPE, "nb_max: f32[2,0] reduced over axes [1] has no elements",
               "no identity");
    expect_err(e_min_empty_all, NB_ERR_SHAPE, "nb_min: i64[2,0] reduced over axes [0,1]", NULL);
    expect_err(e_argmax_rank0, NB_ERR_INVALID, "nb_argmax: axis 0 is out of range for f32[]",
               "rank-0");
    expect_err(e_argmin_axis, NB_ERR_INVALID, "nb_argmin: axis -3 is out of range for i64[2,3]",
               NULL);
    expect_err(e_argmax_empty, NB_ERR_SHAPE, "nb_argmax: axis 1 of f32[3,0] is empty", NULL);
    expect_err(e_mean_int, NB_ERR_DTYPE, "nb_mean: operand is i32[2,3]", "float dtype");
    expect_err(e_mean_dup, NB_ERR_INVALID, "nb_mean: axis 0 of f32[2,3] is listed twice", NULL);
    expect_err(e_lse_bool, NB_ERR_DTYPE, "nb_logsumexp: operand is bool[2,3]", NULL);
    expect_err(e_lse_axis, NB_ERR_INVALID, "nb_logsumexp: axis 5 is out of range for f64[2,3]",
               NULL);
    expect_err(e_softmax_axis, NB_ERR_INVALID, "nb_softmax: axis 2 is out of range", NULL);
    expect_err(e_softmax_int, NB_ERR_DTYPE, "nb_softmax: operand is i64[2,3]", NULL);
    expect_err(e_log_softmax_rank0, NB_ERR_INVALID,
               "nb_log_softmax: axis 0 is out of range for f64[]", NULL);
    expect_err(e_bad_attrs, NB_ERR_INTERNAL, "nb_sum: the axes attribute", "not sorted");
    expect_err(e_bad_arg_attrs, NB_ERR_INTERNAL, "nb_argmin: axis attribute 2", NULL);
}

static void test_sticky_poison_and_null(void **state) {
    (void)state;
    fx f;
    fx_open(&f);
    nb_var *x = x23(&f.tr, NB_DTYPE_F32);
    nb_var *p = nb_sum(x, (const int[]){9}, 1, false);
    NBT_TRUE(nb_var_is_poison(p));
    char first[512];
    snprintf(first, sizeof first, "%s", nb_ctx_errmsg(f.ctx));
    int32_t n_nodes = f.tr.g.n_nodes;
    /* Poison in, poison out; a valid input after the error too; no new message or node. */
    nb_var *outs[] = {nb_sum(p, NULL, 0, false),      nb_max(x, NULL, 0, false),
                      nb_argmax(p, 0, false),         nb_argmin(x, 0, true),
                      nb_mean(p, NULL, 0, false),     nb_mean(x, (const int[]){7}, 1, false),
                      nb_logsumexp(x, NULL, 0, true), nb_softmax(p, 0),
                      nb_log_softmax(x, 1),           nb_prod(x, (const int[]){1, 1}, 2, false)};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
        NBT_TRUE(nb_var_is_poison(outs[i]));
    }
    NBT_STREQ(nb_ctx_errmsg(f.ctx), first);
    NBT_STATUS(f.ctx, NB_ERR_INVALID, nb_trace_status(&f.tr));
    NBT_EQ_I64(f.tr.g.n_nodes, n_nodes);
    fx_close(&f);

    /* NULL in: NULL out (there is no trace to record on). */
    NBT_TRUE(nb_sum(NULL, NULL, 0, false) == NULL);
    NBT_TRUE(nb_max(NULL, NULL, 0, false) == NULL);
    NBT_TRUE(nb_min(NULL, NULL, 0, false) == NULL);
    NBT_TRUE(nb_prod(NULL, NULL, 0, false) == NULL);
    NBT_TRUE(nb_argmax(NULL, 0, false) == NULL);
    NBT_TRUE(nb_argmin(NULL, 0, false) == NULL);
    NBT_TRUE(nb_mean(NULL, NULL, 0, false) == NULL);
    NBT_TRUE(nb_logsumexp(NULL, NULL, 0, false) == NULL);
    NBT_TRUE(nb_softmax(NULL, 0) == NULL);
    NBT_TRUE(nb_log_softmax(NULL, 0) == NULL);
}

/* ---- composites --------------------------------------------------------------------- */

typedef enum ckind { C_MEAN, C_LSE, C_SOFTMAX, C_LOG_SOFTMAX } ckind;

/* The stable forms in double, with the same conventions (shift 0 where the max is not
 * finite or there is nothing to reduce). */
static void ref_stats(const double *sq, int64_t n, double *shift, double *sumexp) {
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        m = (sq[i] > m || sq[i] != sq[i]) ? sq[i] : m;
    }
    *shift = (n > 0 && fabs(m) < INFINITY) ? m : 0.0;
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        s += exp(sq[i] - *shift);
    }
    *sumexp = s;
}

static void check_composite(ckind kind, nb_dtype dt, int rank, const int64_t *shape,
                            const int *axes, int n_axes, bool keepdims, const double *vals) {
    fx f;
    fx_open(&f);
    nb_var *x = param(&f, 0, dt, rank, shape);
    nb_var *y = NULL;
    switch (kind) {
    case C_MEAN:
        y = nb_mean(x, axes, n_axes, keepdims);
        break;
    case C_LSE:
        y = nb_logsumexp(x, axes, n_axes, keepdims);
        break;
    case C_SOFTMAX:
        y = nb_softmax(x, axes[0]);
        break;
    case C_LOG_SOFTMAX:
        y = nb_log_softmax(x, axes[0]);
        break;
    }
    NBT_OK(f.ctx, nb_trace_status(&f.tr));
    bool red[4] = {false, false, false, false};
    for (int i = 0; i < rank; i++) {
        red[i] = axes == NULL;
    }
    for (int i = 0; axes != NULL && i < n_axes; i++) {
        red[axes[i] < 0 ? axes[i] + rank : axes[i]] = true;
    }
    int64_t want[4], ostride[4], nout = 1, nred = 1, n = nbi_shape_size(rank, shape);
    int wr = 0;
    bool elementwise = kind == C_SOFTMAX || kind == C_LOG_SOFTMAX;
    for (int i = 0; i < rank; i++) {
        if (red[i]) {
            nred *= shape[i];
        } else {
            nout *= shape[i];
        }
        if (elementwise || !red[i] || keepdims) {
            want[wr++] = red[i] && !elementwise ? 1 : shape[i];
        }
    }
    for (int i = rank - 1, s = 1; i >= 0; i--) {
        ostride[i] = red[i] ? 0 : s;
        s *= red[i] ? 1 : (int)shape[i];
    }
    check_sig(y, dt, wr, want);

    void *xb = buf_from(dt, n, vals);
    void **bufs = run_graph(&f.tr, (const void *[]){xb});
    const void *yb = bufs[y->id];
    int64_t *cnt = calloc((size_t)(nout > 0 ? nout : 1), sizeof(int64_t));
    int64_t *oof = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    double *seq = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    assert_true(cnt != NULL && oof != NULL && seq != NULL);
    int64_t idx[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n; i++) {
        int64_t o = 0;
        for (int d = 0; d < rank; d++) {
            o += idx[d] * ostride[d];
        }
        oof[i] = o;
        seq[o * nred + cnt[o]++] = buf_get(dt, xb, i);
        for (int d = rank - 1; d >= 0; d--) {
            if (++idx[d] < shape[d]) {
                break;
            }
            idx[d] = 0;
        }
    }
    double rel = dt == NB_DTYPE_F32 ? 2e-6 : 1e-14;
    int64_t n_check = elementwise ? n : nout;
    for (int64_t j = 0; j < n_check; j++) {
        int64_t o = elementwise ? oof[j] : j;
        const double *sq = seq + o * nred;
        double shift, se, want_v = 0;
        ref_stats(sq, nred, &shift, &se);
        if (kind == C_MEAN) {
            double s = 0;
            for (int64_t i = 0; i < nred; i++) {
                s += sq[i];
            }
            want_v = nred > 0 ? s / (double)nred : NAN;
        } else if (kind == C_LSE) {
            want_v = shift + log(se);
        } else {
            double xv = buf_get(dt, xb, j);
            want_v = kind == C_SOFTMAX ? exp(xv - shift) / se : (xv - shift) - log(se);
        }
        double got = buf_get(dt, yb, j);
        if (!same(got, want_v) && !(fabs(got - want_v) <= rel * (8.0 + fabs(want_v)))) {
            fail_msg("composite %d %s: element %lld is %.17g, want %.17g", (int)kind,
                     nb_dtype_name(dt), (long long)j, got, want_v);
        }
    }
    free(seq);
    free(oof);
    free(cnt);
    free_graph(&f.tr, bufs);
    free(xb);
    fx_close(&f);
}

/* [5, 6] rows: random; large; all -inf; +inf and -inf; a NaN. */
static void special_rows(double *v) {
    const double rows[5][6] = {
        {0.5, -1.25, 2.0, 0.0, -3.5, 1.0},
        {1000.0, 999.0, -1000.0, 0.0, 1000.0, 998.5},
        {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
        {INFINITY, 1.0, 2.0, 3.0, -INFINITY, 0.0},
        {1.0, NAN, 2.0, -INFINITY, 0.0, 4.0},
    };
    for (int i = 0; i < 5; i++) {
        for (int j = 0; j < 6; j++) {
            v[i * 6 + j] = rows[i][j];
        }
    }
}

static void test_mean(void **state) {
    (void)state;
    double v[120];
    for (int i = 0; i < 120; i++) {
        v[i] = rnd_in(-3, 3);
    }
    for (int d = 0; d < 2; d++) {
        nb_dtype dt = k_num[d];
        check_composite(C_MEAN, dt, 2, (int64_t[]){4, 5}, (const int[]){1}, 1, false, v);
        check_composite(C_MEAN, dt, 2, (int64_t[]){4, 5}, (const int[]){-2}, 1, true, v);
        check_composite(C_MEAN, dt, 2, (int64_t[]){4, 5}, NULL, 0, false, v);
        check_composite(C_MEAN, dt, 2, (int64_t[]){4, 5}, (const int[]){0}, 0, false, v);
        check_composite(C_MEAN, dt, 3, (int64_t[]){2, 3, 20}, (const int[]){0, 2}, 2, true, v);
        check_composite(C_MEAN, dt, 0, NULL, NULL, 0, false, v);
        check_composite(C_MEAN, dt, 2, (int64_t[]){3, 0}, (const int[]){1}, 1, false, v);
        check_composite(C_MEAN, dt, 2, (int64_t[]){0, 3}, (const int[]){1}, 1, false, v);
    }
    /* Over zero elements: NaN; a weak scalar stays weak; the graph is a sum and a div. */
    fx f;
    fx_open(&f);
    nb_var *x = param(&f, 0, NB_DTYPE_F32, 2, (int64_t[]){3, 0});
    nb_var *y = nb_mean(x, (const int[]){1}, 1, false);
    nb_var *w = nb_mean(nb_scalar(&f.tr, 3.0), NULL, 0, false);
    NBT_OK(f.ctx, nb_trace_status(&f.tr));
    NBT_TRUE((w->flags & NBI_NODE_WEAK) != 0);
    NBT_EQ_I64(y->op, NBI_OP_DIV);
    NBT_EQ_I64(y->in[0]->op, NBI_OP_SUM);
    float dummy = 0;
    void **bufs = run_graph(&f.tr, (const void *[]){&dummy});
    for (int i = 0; i < 3; i++) {
        NBT_TRUE(isnan(((float *)bufs[y->id])[i]));
    }
    NBT_EQ_F64(((float *)bufs[w->id])[0], 3.0);
    free_graph(&f.tr, bufs);
    fx_close(&f);
}

static void test_logsumexp(void **state) {
    (void)state;
    double sp[30], rv[120];
    special_rows(sp);
    for (int i = 0; i < 120; i++) {
        rv[i] = rnd_in(-5, 5);
    }
    for (int d = 0; d < 2; d++) {
        nb_dtype dt = k_num[d];
        for (int kd = 0; kd < 2; kd++) {
            check_composite(C_LSE, dt, 2, (int64_t[]){5, 6}, (const int[]){1}, 1, kd, sp);
            check_composite(C_LSE, dt, 2, (int64_t[]){5, 6}, (const int[]){-2}, 1, kd, sp);
            check_composite(C_LSE, dt, 2, (int64_t[]){5, 6}, (const int[]){0}, 0, kd, sp);
            check_composite(C_LSE, dt, 2, (int64_t[]){4, 5}, NULL, 0, kd, rv);
            check_composite(C_LSE, dt, 3, (int64_t[]){2, 3, 20}, (const int[]){0, 2}, 2, kd, rv);
            check_composite(C_LSE, dt, 3, (int64_t[]){4, 1, 30}, (const int[]){2, 1}, 2, kd, rv);
            check_composite(C_LSE, dt, 2, (int64_t[]){3, 0}, (const int[]){1}, 1, kd, rv);
            check_composite(C_LSE, dt, 0, NULL, NULL, 0, kd, rv);
        }
    }
    /* The graph: one max of x, the isfinite select under stop_gradient, and without keepdims
     * a reshape to drop m's kept dims. Over nothing: no max, -inf. */
    fx f;
    fx_open(&f);
    nb_var *x = param(&f, 0, NB_DTYPE_F32, 2, (int64_t[]){2, 3});
    nb_var *e = param(&f, 1, NB_DTYPE_F32, 2, (int64_t[]){2, 0});
    nb_var *y = nb_logsumexp(x, (const int[]){1}, 1, false);
    NBT_EQ_I64(count_ops(&f.tr, NBI_OP_MAX), 1);
    NBT_EQ_I64(count_ops(&f.tr, NBI_OP_STOP_GRADIENT), 1);
    NBT_EQ_I64(count_ops(&f.tr, NBI_OP_SELECT), 1);
    NBT_EQ_I64(count_ops(&f.tr, NBI_OP_SUM), 1);
    NBT_EQ_I64(count_ops(&f.tr, NBI_OP_RESHAPE), 1);
    NBT_EQ_I64(y->op, NBI_OP_ADD);
    NBT_EQ_I64(y->in[0]->op, NBI_OP_RESHAPE);
    NBT_EQ_I64(y->in[0]->in[0]->op, NBI_OP_STOP_GRADIENT);
    NBT_EQ_I64(y->in[0]->in[0]->in[0]->op, NBI_OP_SELECT);
    nb_var *z = nb_logsumexp(e, (const int[]){-1}, 1, true);
    NBT_EQ_I64(count_ops(&f.tr, NBI_OP_MAX), 1);
    check_sig(z, NB_DTYPE_F32, 2, (int64_t[]){2, 1});
    NBT_OK(f.ctx, nb_trace_status(&f.tr));
    float xv[6] = {1, 2, 3, 4, 5, 6}, ev[1] = {0};
    void **bufs = run_graph(&f.tr, (const void *[]){xv, ev});
    NBT_EQ_F64(((float *)bufs[z->id])[0], -INFINITY);
    NBT_EQ_F64(((float *)bufs[z->id])[1], -INFINITY);
    NBT_NEAR(((float *)bufs[y->id])[0], 3.0 + log(1 + exp(-1.0) + exp(-2.0)), 1e-6);
    free_graph(&f.tr, bufs);
    fx_close(&f);
}

static void test_softmax_and_log_softmax(void **state) {
    (void)state;
    double sp[30], rv[120];
    special_rows(sp);
    for (int i = 0; i < 120; i++) {
        rv[i] = rnd_in(-5, 5);
    }
    const ckind kinds[2] = {C_SOFTMAX, C_LOG_SOFTMAX};
    for (int d = 0; d < 2; d++) {
        for (int k = 0; k < 2; k++) {
            nb_dtype dt = k_num[d];
            check_composite(kinds[k], dt, 2, (int64_t[]){5, 6}, (const int[]){1}, 1, false, sp);
            check_composite(kinds[k], dt, 2, (int64_t[]){5, 6}, (const int[]){-1}, 1, false, sp);
            check_composite(kinds[k], dt, 2, (int64_t[]){5, 6}, (const int[]){0}, 1, false, sp);
            check_composite(kinds[k], dt, 3, (int64_t[]){2, 3, 20}, (const int[]){1}, 1, false, rv);
            check_composite(kinds[k], dt, 1, (int64_t[]){120}, (const int[]){0}, 1, false, rv);
            check_composite(kinds[k], dt, 2, (int64_t[]){4, 1}, (const int[]){1}, 1, false, rv);
            check_composite(kinds[k], dt, 2, (int64_t[]){3, 0}, (const int[]){1}, 1, false, rv);
            check_composite(kinds[k], dt, 2, (int64_t[]){0, 3}, (const int[]){1}, 1, false, rv);
        }
    }
    /* Rows sum to 1; a row of -inf and finite values gives exact zeros; large logits do not
     * overflow; the graph has the documented shape. */
    fx f;
    fx_open(&f);
    nb_var *x = param(&f, 0, NB_DTYPE_F32, 2, (int64_t[]){2, 4});
    nb_var *s = nb_softmax(x, -1);
    nb_var *l = nb_log_softmax(x, 1);
    NBT_OK(f.ctx, nb_trace_status(&f.tr));
    NBT_EQ_I64(s->op, NBI_OP_DIV);
    NBT_EQ_I64(l->op, NBI_OP_SUB);
    NBT_EQ_I64(count_ops(&f.tr, NBI_OP_STOP_GRADIENT), 2);
    NBT_EQ_I64(count_ops(&f.tr, NBI_OP_MAX), 2);
    float xv[8] = {-INFINITY, 0.0f, 1.0f, -INFINITY, 88.0f, 89.0f, 300.0f, 300.0f};
    void **bufs = run_graph(&f.tr, (const void *[]){xv});
    const float *sv = bufs[s->id], *lv = bufs[l->id];
    NBT_EQ_F64(sv[0], 0.0);
    NBT_EQ_F64(sv[3], 0.0);
    NBT_EQ_F64(lv[0], -INFINITY);
    for (int r = 0; r < 2; r++) {
        double t = 0;
        for (int j = 0; j < 4; j++) {
            t += sv[r * 4 + j];
            NBT_TRUE(isfinite(sv[r * 4 + j]));
        }
        NBT_NEAR(t, 1.0, 1e-6);
    }
    NBT_NEAR(sv[6], sv[7], 0.0);
    NBT_NEAR(lv[4], 88.0 - (300.0 + log(2.0)), 1e-4);
    free_graph(&f.tr, bufs);
    fx_close(&f);
}

/* ---- gradients through the public API ----------------------------------------------
 *
 * Each case is a small function of one or two f64 arrays, built from the family's ops. It
 * is checked through nb_vjp, nb_jvp and nb_grad (include/nabla/ad.h) against central finite
 * differences of the forward function called through nb_fn_call at perturbed inputs (step
 * h = 1e-6 max(1, |x_k|), tolerance 1e-7 relative to max(1, |value|)):
 *   - vjp: ct_x for a random cotangent u, element by element against <u, (f(x + h e_k) -
 *     f(x - h e_k)) / 2h>;
 *   - jvp: the output tangent for a random tangent v against (f(x + h v) - f(x - h v)) / 2h;
 *   - grad of <u, f(x)> (u passed as a second, non-differentiated argument) equal to the
 *     vjp's ct_x;
 *   - <u, J v> = <J^T u, v> between the two modes (to 1e-12);
 *   - second order: jvp(grad(sum(u sin f(x)))) along v against central differences of
 *     that gradient (the rules' own IR differentiates again);
 *   - every cotangent and tangent has the dtype and shape of its primal.
 * Cases at a kink (ties of max/min) give exact expected values instead of differences. */

typedef nb_var *(*gfn)(nb_trace *tr, nb_var *const *x);

typedef struct adcase {
    const char *name;
    gfn f;
    int n_in;
    int rank[2];
    int64_t shape[2][4];
    const double *data[2]; /* fixed inputs (ties, zeros), or NULL for random values */
    const double *want[2]; /* exact expected ct_x for the all-ones cotangent (kinks), or NULL */
} adcase;

static double g_fd_err; /* the largest FD error seen, relative to max(1, |value|) */
static int g_fd_checks;

static gfn fn_of(const nb_tree *self) {
    nb_fnptr p = NULL;
    const char *name = NULL;
    if (nb_tree_get_fnref(self, &p, &name) != NB_OK) {
        return NULL;
    }
    return (gfn)p;
}

/* f(args): args = (x0[, x1]). */
static nb_status body_f(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    gfn f = fn_of(self);
    nb_var *x[2] = {nb_get(tr, args, "[0]"), NULL};
    if (nb_tree_len(args) > 1) {
        x[1] = nb_get(tr, args, "[1]");
    }
    return nb_return(f(tr, x), out);
}

/* <u, f(x)>: args = ((x0[, x1]), u). */
static nb_status body_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    gfn f = fn_of(self);
    const nb_tree *xs = nb_tree_child(args, 0);
    nb_var *x[2] = {nb_get(tr, args, "[0][0]"), NULL};
    if (nb_tree_len(xs) > 1) {
        x[1] = nb_get(tr, args, "[0][1]");
    }
    nb_var *u = nb_get(tr, args, "[1]");
    return nb_return(nb_sum(nb_mul(f(tr, x), u), NULL, 0, false), out);
}

static nb_tree *leaf_f64(nb_ctx *ctx, int rank, const int64_t *shape, const double *d) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, rank, shape, d, &a));
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

/* The f64 array at path of t, checked against rank/shape, copied into d (n elements). */
static void read_f64(const nb_tree *t, const char *path, int rank, const int64_t *shape,
                     double *d) {
    const nb_tree *leaf = NULL;
    if (nb_tree_lookup(t, path, &leaf) != NB_OK || nb_tree_get_array(leaf) == NULL) {
        fail_msg("no array at '%s'", path);
    }
    const nb_array *a = nb_tree_get_array(leaf);
    NBT_EQ_I64(nb_array_dtype(a), NB_DTYPE_F64);
    NBT_EQ_I64(nb_array_rank(a), rank);
    for (int i = 0; i < rank; i++) {
        NBT_EQ_I64(nb_array_shape(a)[i], shape[i]);
    }
    int64_t n = nb_array_size(a);
    if (n > 0) {
        memcpy(d, nb_array_data(a), (size_t)n * sizeof(double));
    }
}

typedef struct gctx {
    nb_ctx *ctx;
    const adcase *c;
    nb_fn *f;
    int64_t nx[2], ny;
    int yrank;
    int64_t yshape[NB_MAX_RANK];
} gctx;

static nb_tree *args_of(gctx *g, double *const *x) {
    nb_tree *items[2] = {NULL, NULL};
    for (int i = 0; i < g->c->n_in; i++) {
        items[i] = leaf_f64(g->ctx, g->c->rank[i], g->c->shape[i], x[i]);
    }
    return nbt_tuple_take(g->ctx, g->c->n_in, items);
}

/* y = f(x) into y (g->ny elements). */
static void eval_f(gctx *g, double *const *x, double *y) {
    nb_tree *args = args_of(g, x), *out = NULL;
    NBT_OK(g->ctx, nb_fn_call(g->f, args, &out));
    read_f64(out, "", g->yrank, g->yshape, y);
    nb_tree_destroy(out);
    nb_tree_destroy(args);
}

static void fd_expect(const char *what, const char *name, int64_t k, double got, double want,
                      double tol) {
    double scale = fmax(1.0, fmax(fabs(got), fabs(want)));
    double e = fabs(got - want) / scale;
    g_fd_checks++;
    if (e > g_fd_err) {
        g_fd_err = e;
    }
    if (!(e <= tol)) {
        fail_msg("%s: %s[%lld] = %.17g, expected %.17g (relative error %.3g > %.3g)", name, what,
                 (long long)k, got, want, e, tol);
    }
}

/* A deterministic sequence in [-1, 1) (a 64-bit LCG). */
static uint64_t g_grng = 987654321;
static double rnd_g(void) {
    g_grng = g_grng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(g_grng >> 11) / 4503599627370496.0 - 1.0;
}

/* sum(u * sin(f(x))): args = ((x0[, x1]), u); its Hessian is not zero where f is linear. */
static nb_status body_loss2(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    gfn f = fn_of(self);
    const nb_tree *xs = nb_tree_child(args, 0);
    nb_var *x[2] = {nb_get(tr, args, "[0][0]"), NULL};
    if (nb_tree_len(xs) > 1) {
        x[1] = nb_get(tr, args, "[0][1]");
    }
    nb_var *u = nb_get(tr, args, "[1]");
    return nb_return(nb_sum(nb_mul(nb_sin(f(tr, x)), u), NULL, 0, false), out);
}

/* grad(loss2) at (x, u) into gx[i]. */
static void eval_grad2(gctx *g, nb_fn *grad2, double *const *x, const double *u, double **gx) {
    nb_tree *items[2] = {args_of(g, x), leaf_f64(g->ctx, g->yrank, g->yshape, u)};
    nb_tree *args = nbt_tuple_take(g->ctx, 2, items), *out = NULL;
    NBT_OK(g->ctx, nb_fn_call(grad2, args, &out));
    for (int i = 0; i < g->c->n_in; i++) {
        char path[16];
        snprintf(path, sizeof path, "[%d]", i);
        read_f64(out, path, g->c->rank[i], g->c->shape[i], gx[i]);
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
}

/* Second order: the Hessian-vector product jvp(grad(loss2)) along v against central
 * differences of grad(loss2) at x +- h v (xs, xm): the rules' IR differentiates again. */
static void check_second_order(gctx *g, const nb_tree *self, double *const *x, const double *u,
                               double *const *v, double *const *xs, double *const *xm, double h) {
    const adcase *c = g->c;
    nb_fn *loss2 = NULL, *grad2 = NULL, *hvp = NULL;
    NBT_OK(g->ctx, nb_fn_create(g->ctx, c->name, body_loss2, self, &loss2));
    NBT_OK(g->ctx, nb_grad(loss2, NULL, &grad2));
    NBT_OK(g->ctx, nb_jvp(grad2, &hvp));
    double *hv[2] = {NULL, NULL}, *gp[2] = {NULL, NULL}, *gm[2] = {NULL, NULL};
    for (int i = 0; i < c->n_in; i++) {
        size_t b = (size_t)(g->nx[i] > 0 ? g->nx[i] : 1) * sizeof(double);
        hv[i] = malloc(b);
        gp[i] = malloc(b);
        gm[i] = malloc(b);
        assert_true(hv[i] && gp[i] && gm[i]);
    }
    nb_tree *vt[2] = {NULL, NULL}, *ut = NULL;
    for (int i = 0; i < c->n_in; i++) {
        vt[i] = leaf_f64(g->ctx, c->rank[i], c->shape[i], v[i]);
    }
    NBT_OK(g->ctx, nb_tree_null(g->ctx, &ut));
    nb_tree *prim[2] = {args_of(g, x), leaf_f64(g->ctx, g->yrank, g->yshape, u)};
    nb_tree *tang[2] = {nbt_tuple_take(g->ctx, c->n_in, vt), ut};
    nb_tree *items[2] = {nbt_tuple_take(g->ctx, 2, prim), nbt_tuple_take(g->ctx, 2, tang)};
    nb_tree *args = nbt_tuple_take(g->ctx, 2, items), *out = NULL;
    NBT_OK(g->ctx, nb_fn_call(hvp, args, &out));
    for (int i = 0; i < c->n_in; i++) {
        char path[16];
        snprintf(path, sizeof path, "[1][%d]", i);
        read_f64(out, path, c->rank[i], c->shape[i], hv[i]);
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    eval_grad2(g, grad2, xs, u, gp);
    eval_grad2(g, grad2, xm, u, gm);
    for (int i = 0; i < c->n_in; i++) {
        for (int64_t k = 0; k < g->nx[i]; k++) {
            fd_expect("Hv", c->name, k, hv[i][k], (gp[i][k] - gm[i][k]) / (2 * h), 1e-7);
        }
        free(hv[i]);
        free(gp[i]);
        free(gm[i]);
    }
    nb_fn_destroy(hvp);
    nb_fn_destroy(grad2);
    nb_fn_destroy(loss2);
}

static void check_grad_case(const adcase *c) {
    gctx g;
    memset(&g, 0, sizeof g);
    g.ctx = nbt_ctx();
    g.c = c;
    nb_tree *self = NULL;
    NBT_OK(g.ctx, nb_tree_fnref(g.ctx, (nb_fnptr)c->f, c->name, &self));
    nb_fn *loss = NULL, *vjp = NULL, *jvp = NULL, *grad = NULL;
    NBT_OK(g.ctx, nb_fn_create(g.ctx, c->name, body_f, self, &g.f));
    NBT_OK(g.ctx, nb_fn_create(g.ctx, c->name, body_loss, self, &loss));
    NBT_OK(g.ctx, nb_vjp(g.f, &vjp));
    NBT_OK(g.ctx, nb_jvp(g.f, &jvp));
    NBT_OK(g.ctx, nb_grad(loss, NULL, &grad));

    double *x[2] = {NULL, NULL}, *v[2] = {NULL, NULL}, *ct[2] = {NULL, NULL}, *gr[2] = {NULL, NULL};
    for (int i = 0; i < c->n_in; i++) {
        g.nx[i] = 1;
        for (int d = 0; d < c->rank[i]; d++) {
            g.nx[i] *= c->shape[i][d];
        }
        size_t b = (size_t)(g.nx[i] > 0 ? g.nx[i] : 1) * sizeof(double);
        x[i] = malloc(b);
        v[i] = malloc(b);
        ct[i] = malloc(b);
        gr[i] = malloc(b);
        assert_true(x[i] && v[i] && ct[i] && gr[i]);
        for (int64_t k = 0; k < g.nx[i]; k++) {
            x[i][k] = c->data[i] ? c->data[i][k] : 2.0 * rnd_g();
            v[i][k] = rnd_g();
        }
    }
    /* the output's signature, from one forward call */
    {
        nb_tree *args = args_of(&g, x), *out = NULL;
        NBT_OK(g.ctx, nb_fn_call(g.f, args, &out));
        const nb_array *y = nb_tree_get_array(out);
        assert_non_null(y);
        g.yrank = nb_array_rank(y);
        memcpy(g.yshape, nb_array_shape(y), (size_t)g.yrank * sizeof(int64_t));
        g.ny = nb_array_size(y);
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    size_t yb = (size_t)(g.ny > 0 ? g.ny : 1) * sizeof(double);
    double *u = malloc(yb), *y0 = malloc(yb), *yp = malloc(yb), *ym = malloc(yb), *ty = malloc(yb);
    assert_true(u && y0 && yp && ym && ty);
    for (int64_t k = 0; k < g.ny; k++) {
        u[k] = c->want[0] ? 1.0 : rnd_g();
    }
    eval_f(&g, x, y0);

    /* vjp: ((x...), u) -> (y, (ct...)) */
    {
        nb_tree *items[2] = {args_of(&g, x), leaf_f64(g.ctx, g.yrank, g.yshape, u)};
        nb_tree *args = nbt_tuple_take(g.ctx, 2, items), *out = NULL;
        NBT_OK(g.ctx, nb_fn_call(vjp, args, &out));
        double *yv = malloc(yb);
        read_f64(out, "[0]", g.yrank, g.yshape, yv);
        for (int64_t k = 0; k < g.ny; k++) {
            NBT_EQ_F64(yv[k], y0[k]);
        }
        free(yv);
        for (int i = 0; i < c->n_in; i++) {
            char path[16];
            snprintf(path, sizeof path, "[1][%d]", i);
            read_f64(out, path, c->rank[i], c->shape[i], ct[i]);
        }
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    /* grad of <u, f(x)>: args ((x...), u) -> (ct...) */
    {
        nb_tree *items[2] = {args_of(&g, x), leaf_f64(g.ctx, g.yrank, g.yshape, u)};
        nb_tree *args = nbt_tuple_take(g.ctx, 2, items), *out = NULL;
        NBT_OK(g.ctx, nb_fn_call(grad, args, &out));
        for (int i = 0; i < c->n_in; i++) {
            char path[16];
            snprintf(path, sizeof path, "[%d]", i);
            read_f64(out, path, c->rank[i], c->shape[i], gr[i]);
            for (int64_t k = 0; k < g.nx[i]; k++) {
                if (!(fabs(gr[i][k] - ct[i][k]) <= 1e-14 * fmax(1.0, fabs(ct[i][k])))) {
                    fail_msg("%s: grad[%d][%lld] = %.17g but the vjp gives %.17g", c->name, i,
                             (long long)k, gr[i][k], ct[i][k]);
                }
            }
        }
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    /* jvp: ((x...), (v...)) -> (y, ty) */
    {
        nb_tree *vt[2] = {NULL, NULL};
        for (int i = 0; i < c->n_in; i++) {
            vt[i] = leaf_f64(g.ctx, c->rank[i], c->shape[i], v[i]);
        }
        nb_tree *items[2] = {args_of(&g, x), nbt_tuple_take(g.ctx, c->n_in, vt)};
        nb_tree *args = nbt_tuple_take(g.ctx, 2, items), *out = NULL;
        NBT_OK(g.ctx, nb_fn_call(jvp, args, &out));
        read_f64(out, "[1]", g.yrank, g.yshape, ty);
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    /* with two inputs, a null tangent for either: the two partial tangents add up */
    if (c->n_in == 2) {
        double *part = malloc(yb);
        assert_non_null(part);
        for (int64_t j = 0; j < g.ny; j++) {
            part[j] = 0;
        }
        for (int which = 0; which < 2; which++) {
            nb_tree *vt[2] = {NULL, NULL};
            vt[which] = leaf_f64(g.ctx, c->rank[which], c->shape[which], v[which]);
            NBT_OK(g.ctx, nb_tree_null(g.ctx, &vt[1 - which]));
            nb_tree *items[2] = {args_of(&g, x), nbt_tuple_take(g.ctx, 2, vt)};
            nb_tree *args = nbt_tuple_take(g.ctx, 2, items), *out = NULL;
            NBT_OK(g.ctx, nb_fn_call(jvp, args, &out));
            read_f64(out, "[1]", g.yrank, g.yshape, yp);
            for (int64_t j = 0; j < g.ny; j++) {
                part[j] += yp[j];
            }
            nb_tree_destroy(out);
            nb_tree_destroy(args);
        }
        for (int64_t j = 0; j < g.ny; j++) {
            if (!(fabs(part[j] - ty[j]) <= 1e-14 * fmax(1.0, fabs(ty[j])))) {
                fail_msg("%s: partial tangents add up to %.17g at %lld, the full one is %.17g",
                         c->name, part[j], (long long)j, ty[j]);
            }
        }
        free(part);
    }
    /* <u, J v> = <J^T u, v> */
    double ujv = 0, jtuv = 0, mag = 0;
    for (int64_t k = 0; k < g.ny; k++) {
        ujv += u[k] * ty[k];
        mag += fabs(u[k] * ty[k]);
    }
    for (int i = 0; i < c->n_in; i++) {
        for (int64_t k = 0; k < g.nx[i]; k++) {
            jtuv += ct[i][k] * v[i][k];
            mag += fabs(ct[i][k] * v[i][k]);
        }
    }
    if (!(fabs(ujv - jtuv) <= 1e-12 * fmax(1.0, mag))) {
        fail_msg("%s: <u, Jv> = %.17g but <J^T u, v> = %.17g", c->name, ujv, jtuv);
    }

    if (c->want[0] != NULL) { /* a kink: exact values */
        for (int i = 0; i < c->n_in; i++) {
            for (int64_t k = 0; k < g.nx[i]; k++) {
                if (!(ct[i][k] == c->want[i][k])) {
                    fail_msg("%s: ct_x%d[%lld] = %.17g, expected exactly %.17g", c->name, i,
                             (long long)k, ct[i][k], c->want[i][k]);
                }
            }
        }
    } else {
        /* vjp element by element */
        for (int i = 0; i < c->n_in; i++) {
            for (int64_t k = 0; k < g.nx[i]; k++) {
                double x0 = x[i][k], h = 1e-6 * fmax(1.0, fabs(x0));
                x[i][k] = x0 + h;
                eval_f(&g, x, yp);
                x[i][k] = x0 - h;
                eval_f(&g, x, ym);
                x[i][k] = x0;
                double d = 0;
                for (int64_t j = 0; j < g.ny; j++) {
                    d += u[j] * (yp[j] - ym[j]);
                }
                fd_expect("ct_x", c->name, k, ct[i][k], d / (2 * h), 1e-7);
            }
        }
        /* jvp along v */
        double xn = 0;
        for (int i = 0; i < c->n_in; i++) {
            for (int64_t k = 0; k < g.nx[i]; k++) {
                xn = fmax(xn, fabs(x[i][k]));
            }
        }
        double h = 1e-6 * fmax(1.0, xn);
        double *xs[2] = {NULL, NULL}, *xm[2] = {NULL, NULL};
        for (int i = 0; i < c->n_in; i++) {
            size_t b = (size_t)(g.nx[i] > 0 ? g.nx[i] : 1) * sizeof(double);
            xs[i] = malloc(b);
            xm[i] = malloc(b);
            assert_true(xs[i] && xm[i]);
            for (int64_t k = 0; k < g.nx[i]; k++) {
                xs[i][k] = x[i][k] + h * v[i][k];
                xm[i][k] = x[i][k] - h * v[i][k];
            }
        }
        eval_f(&g, xs, yp);
        eval_f(&g, xm, ym);
        for (int64_t j = 0; j < g.ny; j++) {
            fd_expect("t_y", c->name, j, ty[j], (yp[j] - ym[j]) / (2 * h), 1e-7);
        }
        check_second_order(&g, self, x, u, v, xs, xm, h);
        for (int i = 0; i < c->n_in; i++) {
            free(xs[i]);
            free(xm[i]);
        }
    }

    for (int i = 0; i < c->n_in; i++) {
        free(x[i]);
        free(v[i]);
        free(ct[i]);
        free(gr[i]);
    }
    free(u);
    free(y0);
    free(yp);
    free(ym);
    free(ty);
    nb_fn_destroy(grad);
    nb_fn_destroy(jvp);
    nb_fn_destroy(vjp);
    nb_fn_destroy(loss);
    nb_fn_destroy(g.f);
    nb_tree_destroy(self);
    nbt_assert_no_live(g.ctx);
    nb_ctx_destroy(g.ctx);
}

static void check_grad_cases(const adcase *cases, int n) {
    g_fd_err = 0;
    g_fd_checks = 0;
    for (int i = 0; i < n; i++) {
        check_grad_case(&cases[i]);
    }
    print_message("%d cases, %d checks against finite differences; largest relative error "
                  "%.3g\n",
                  n, g_fd_checks, g_fd_err);
}

#define AX(...) ((const int[]){__VA_ARGS__})

static nb_var *gf_sum_1(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_sum(x[0], AX(1), 1, false);
}
static nb_var *gf_sum_neg_keep(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_sum(x[0], AX(-1, 0), 2, true);
}
static nb_var *gf_sum_all(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_sum(x[0], NULL, 0, false);
}
static nb_var *gf_sum_none(nb_trace *tr, nb_var *const *x) { /* no axes listed: a copy */
    (void)tr;
    return nb_sum(x[0], AX(0), 0, false);
}
static nb_var *gf_sum_chain(nb_trace *tr, nb_var *const *x) { /* x * sum(x^2, axis -2) */
    (void)tr;
    return nb_mul(x[0], nb_sum(nb_square(x[0]), AX(-2), 1, true));
}
static nb_var *gf_max_0(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_max(x[0], AX(0), 1, false);
}
static nb_var *gf_max_neg_keep(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_max(x[0], AX(-1), 1, true);
}
static nb_var *gf_max_chain(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_mul(nb_max(nb_sin(x[0]), AX(1), 1, true), x[0]);
}
static nb_var *gf_min_all(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_min(x[0], NULL, 0, false);
}
static nb_var *gf_min_02(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_min(x[0], AX(0, 2), 2, false);
}
static nb_var *gf_max_1(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_max(x[0], AX(1), 1, false);
}
static nb_var *gf_min_m2_keep(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_min(x[0], AX(-2), 1, true);
}
static nb_var *gf_max_all_keep(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_max(x[0], NULL, 0, true);
}
static nb_var *gf_prod_1(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_prod(x[0], AX(1), 1, false);
}
static nb_var *gf_prod_all_keep(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_prod(x[0], NULL, 0, true);
}
static nb_var *gf_prod_0m1(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_prod(x[0], AX(0, -1), 2, false);
}
static nb_var *gf_prod_0(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_prod(x[0], AX(0), 1, false);
}
static nb_var *gf_prod_chain(nb_trace *tr, nb_var *const *x) { /* prod(sin x, 0) * x */
    (void)tr;
    return nb_mul(nb_prod(nb_sin(x[0]), AX(0), 1, true), x[0]);
}
static nb_var *gf_two(nb_trace *tr, nb_var *const *x) { /* sum(x0, 0) * max(x1, 0, keep) */
    (void)tr;
    return nb_mul(nb_sum(x[0], AX(0), 1, false), nb_max(x[1], AX(0), 1, true));
}
static nb_var *gf_mean(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_mean(x[0], AX(-1), 1, false);
}
static nb_var *gf_logsumexp(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_logsumexp(x[0], AX(0, 1), 2, true);
}
static nb_var *gf_softmax(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_softmax(x[0], 1);
}
static nb_var *gf_log_softmax(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_log_softmax(x[0], 0);
}
static nb_var *gf_argmax_pick(nb_trace *tr, nb_var *const *x) { /* x at its argmax, via take */
    (void)tr;
    nb_var *i = nb_argmax(x[0], 1, true);
    return nb_mul(nb_take_along_axis(x[0], i, 1), nb_cast(nb_argmin(x[0], 0, false), NB_DTYPE_F64));
}

/* ties and zeros */
static const double k_tie3[9] = {1, 3, 3, 2, 2, 2, 5, 1, 0};
static const double k_tie3_want[9] = {0, 0.5, 0.5, 1.0 / 3, 1.0 / 3, 1.0 / 3, 1, 0, 0};
static const double k_tiemin[6] = {1, 4, 1, 2, 7, 1};
static const double k_tiemin_want[6] = {0.5, 0, 0.5, 0, 0, 1};
static const double k_tieall[4] = {3, 3, 3, 3};
static const double k_tieall_want[4] = {0.25, 0.25, 0.25, 0.25};
/* one zero (row 0, at the odd position the tree pads), two zeros (row 1), none (row 2),
 * all zeros (row 3) */
static const double k_zeros[20] = {1.5, -0.75, 1.25, 0.5, 0,   0, 1.1, 0, 0.9, 1.3,
                                   0.6, 1.7,   -1.2, 0.8, 1.4, 0, 0,   0, 0,   0};
static const double k_zero_col[12] = {0.5, 1.5, -1.25, 0, 0.75, 1.1, 1.3, -0.6, 0.9, 2, 0, 1};

#define G1(nm, fn, r, ...)                                                                         \
    {                                                                                              \
        .name = nm, .f = fn, .n_in = 1, .rank = {r}, .shape = { {__VA_ARGS__} }                    \
    }

static const adcase k_reduce_grad_cases[] = {
    G1("sum axis 1", gf_sum_1, 3, 3, 4, 2),
    G1("sum axes -1,0 keepdims", gf_sum_neg_keep, 3, 3, 4, 2),
    G1("sum all", gf_sum_all, 2, 3, 4),
    {.name = "sum all of rank 0", .f = gf_sum_all, .n_in = 1},
    G1("sum no axes", gf_sum_none, 2, 2, 3),
    G1("x * sum(x^2, -2, keepdims)", gf_sum_chain, 2, 3, 4),
    G1("max axis 0", gf_max_0, 2, 4, 3),
    G1("max axis -1 keepdims", gf_max_neg_keep, 3, 2, 3, 4),
    G1("max(sin x, 1, keepdims) * x", gf_max_chain, 2, 3, 4),
    G1("min all", gf_min_all, 2, 3, 4),
    G1("min axes 0,2", gf_min_02, 3, 2, 3, 4),
    {.name = "max ties (2 and 3 way)",
     .f = gf_max_1,
     .n_in = 1,
     .rank = {2},
     .shape = {{3, 3}},
     .data = {k_tie3},
     .want = {k_tie3_want}},
    {.name = "min ties axis -2 keepdims",
     .f = gf_min_m2_keep,
     .n_in = 1,
     .rank = {2},
     .shape = {{3, 2}},
     .data = {k_tiemin},
     .want = {k_tiemin_want}},
    {.name = "max all equal",
     .f = gf_max_all_keep,
     .n_in = 1,
     .rank = {2},
     .shape = {{2, 2}},
     .data = {k_tieall},
     .want = {k_tieall_want}},
    G1("prod axis 1", gf_prod_1, 2, 3, 5),
    G1("prod all keepdims (12: an odd level)", gf_prod_all_keep, 3, 2, 3, 2),
    G1("prod axes 0,-1", gf_prod_0m1, 3, 3, 2, 5),
    G1("prod of one row", gf_prod_0, 2, 1, 4),
    {.name = "prod of rank 0", .f = gf_prod_all_keep, .n_in = 1},
    G1("prod over an empty axis", gf_prod_0, 2, 0, 3),
    G1("prod(sin x, 0, keepdims) * x", gf_prod_chain, 2, 7, 2),
    {.name = "prod with zeros (one, two, none, all)",
     .f = gf_prod_1,
     .n_in = 1,
     .rank = {2},
     .shape = {{4, 5}},
     .data = {k_zeros}},
    {.name = "prod with zeros along axis 0",
     .f = gf_prod_0,
     .n_in = 1,
     .rank = {2},
     .shape = {{4, 3}},
     .data = {k_zero_col}},
    {.name = "sum(x0, 0) * max(x1, 0, keepdims)",
     .f = gf_two,
     .n_in = 2,
     .rank = {2, 2},
     .shape = {{3, 4}, {2, 4}}},
    G1("mean axis -1", gf_mean, 2, 3, 4),
    G1("logsumexp all keepdims", gf_logsumexp, 2, 3, 4),
    G1("softmax axis 1", gf_softmax, 2, 3, 4),
    G1("log_softmax axis 0", gf_log_softmax, 3, 2, 3, 2),
    G1("x at argmax (take_along) * argmin", gf_argmax_pick, 2, 3, 4),
};

static void test_grad_through_api(void **state) {
    (void)state;
    check_grad_cases(k_reduce_grad_cases,
                     (int)(sizeof k_reduce_grad_cases / sizeof k_reduce_grad_cases[0]));
}

/* The Hessian of prod at a zero, by jvp of grad (the product tree differentiates again):
 * f(x) = prod(x) for x = (0, 2, 3, 5): grad = (30, 0, 0, 0) and H[i][j] = the product of
 * the elements other than i and j (0 on the diagonal): H = [[0, 15, 10, 6], [15, 0, 0, 0],
 * [10, 0, 0, 0], [6, 0, 0, 0]]. */
static nb_status body_prod_all(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    return nb_return(nb_prod(nb_get(tr, args, "[0]"), NULL, 0, false), out);
}

static void test_prod_hessian_at_zero(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *g = NULL, *hvp = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "prod", body_prod_all, NULL, &f));
    NBT_OK(ctx, nb_grad(f, NULL, &g));
    NBT_OK(ctx, nb_jvp(g, &hvp));
    const double x[4] = {0, 2, 3, 5};
    const double h[4][4] = {{0, 15, 10, 6}, {15, 0, 0, 0}, {10, 0, 0, 0}, {6, 0, 0, 0}};
    for (int j = 0; j < 4; j++) {
        double e[4] = {0, 0, 0, 0};
        e[j] = 1;
        nb_tree *p[1] = {leaf_f64(ctx, 1, (const int64_t[]){4}, x)};
        nb_tree *t[1] = {leaf_f64(ctx, 1, (const int64_t[]){4}, e)};
        nb_tree *items[2] = {nbt_tuple_take(ctx, 1, p), nbt_tuple_take(ctx, 1, t)};
        nb_tree *args = nbt_tuple_take(ctx, 2, items), *out = NULL;
        NBT_OK(ctx, nb_fn_call(hvp, args, &out));
        double gr[4], col[4];
        read_f64(out, "[0]", 1, (const int64_t[]){4}, gr);
        read_f64(out, "[1]", 1, (const int64_t[]){4}, col);
        for (int i = 0; i < 4; i++) {
            NBT_EQ_F64(gr[i], i == 0 ? 30.0 : 0.0);
            NBT_EQ_F64(col[i], h[i][j]);
        }
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    nb_fn_destroy(hvp);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- the rules, called directly ------------------------------------------------------
 *
 * For every reduction op, axes list and keepdims: the VJP rule gives a var of x's dtype
 * and shape and the JVP rule one of the node's; run on concrete buffers, the sum's VJP is
 * the broadcast cotangent, max/min split it over ties, and prod's is the product of the
 * other elements (exact with small integers, zeros included), in f32 and f64. */

static void test_rules_direct(void **state) {
    (void)state;
    static const struct {
        int n;
        int axes[3];
    } axsets[] = {{0, {0}}, {1, {0}}, {1, {-1}}, {2, {0, 2}}, {3, {2, 0, 1}}, {-1, {0}}};
    static const nbi_op ops[4] = {NBI_OP_SUM, NBI_OP_MAX, NBI_OP_MIN, NBI_OP_PROD};
    const int64_t xs[3] = {2, 3, 4};
    /* small integers with ties and zeros, so every result is exact */
    double xv[24];
    for (int i = 0; i < 24; i++) {
        xv[i] = (double)((i * 7) % 5) - 1.0; /* -1, 0, 1, 2, 3 */
    }
    for (int di = 0; di < 2; di++) {
        nb_dtype dt = di == 0 ? NB_DTYPE_F32 : NB_DTYPE_F64;
        for (size_t oi = 0; oi < 4; oi++) {
            for (size_t ai = 0; ai < sizeof axsets / sizeof axsets[0]; ai++) {
                for (int keep = 0; keep < 2; keep++) {
                    fx f;
                    fx_open(&f);
                    nb_var *x = param(&f, 0, dt, 3, xs);
                    const int *axes = axsets[ai].n < 0 ? NULL : axsets[ai].axes;
                    int n_axes = axsets[ai].n < 0 ? 0 : axsets[ai].n;
                    nb_var *y = builder_of(ops[oi])(x, axes, n_axes, keep);
                    check_sig(y, dt, y->rank, y->shape);
                    nb_var *ct = param(&f, 1, dt, y->rank, y->shape);
                    nb_var *t = param(&f, 2, dt, 3, xs);
                    const nbi_op_info *info = nbi_op_get(ops[oi]);
                    nb_var *in_ct[1] = {NULL};
                    info->vjp(&f.tr, y, ct, in_ct);
                    check_sig(in_ct[0], dt, 3, xs);
                    nb_var *ty = info->jvp(&f.tr, y, (nb_var *const[]){t});
                    check_sig(ty, dt, y->rank, y->shape);
                    NBT_OK(f.ctx, nb_trace_status(&f.tr));
                    /* run: ct = 1, 2, 3, ... over the outputs */
                    double cv[24], tv[24];
                    for (int i = 0; i < 24; i++) {
                        cv[i] = (double)(i + 1);
                        tv[i] = (double)(i % 3);
                    }
                    void *bx = buf_from(dt, 24, xv), *bc = buf_from(dt, y->size, cv);
                    void *bt = buf_from(dt, 24, tv);
                    void **bufs = run_graph(&f.tr, (const void *const[]){bx, bc, bt});
                    /* reference: for each input element, its output and the group */
                    bool red[3] = {false, false, false};
                    for (int i = 0; i < y->at.n_axes; i++) {
                        red[y->at.axes[i]] = true;
                    }
                    for (int64_t i = 0; i < 24; i++) {
                        int64_t idx[3] = {i / 12, (i / 4) % 3, i % 4}, o = 0;
                        for (int d = 0; d < 3; d++) {
                            o = red[d] ? o : o * xs[d] + idx[d];
                        }
                        double yv = ops[oi] == NBI_OP_PROD ? 1 : ops[oi] == NBI_OP_SUM ? 0 : xv[i];
                        double others = 1, count = 0, tsum = 0;
                        for (int64_t j = 0; j < 24; j++) {
                            int64_t jd[3] = {j / 12, (j / 4) % 3, j % 4};
                            bool same_out = true;
                            for (int d = 0; d < 3; d++) {
                                same_out = same_out && (red[d] || jd[d] == idx[d]);
                            }
                            if (!same_out) {
                                continue;
                            }
                            if (ops[oi] == NBI_OP_MAX) {
                                yv = xv[j] > yv ? xv[j] : yv;
                            } else if (ops[oi] == NBI_OP_MIN) {
                                yv = xv[j] < yv ? xv[j] : yv;
                            }
                            if (j != i) {
                                others *= xv[j];
                            }
                        }
                        for (int64_t j = 0; j < 24; j++) {
                            int64_t jd[3] = {j / 12, (j / 4) % 3, j % 4};
                            bool same_out = true;
                            for (int d = 0; d < 3; d++) {
                                same_out = same_out && (red[d] || jd[d] == idx[d]);
                            }
                            if (same_out && xv[j] == yv) {
                                count++;
                                tsum += tv[j];
                            }
                        }
                        double want = cv[o];
                        if (ops[oi] == NBI_OP_MAX || ops[oi] == NBI_OP_MIN) {
                            want = xv[i] == yv ? cv[o] / count : 0.0;
                        } else if (ops[oi] == NBI_OP_PROD) {
                            want = cv[o] * others;
                        }
                        double got = buf_get(dt, bufs[in_ct[0]->id], i);
                        double w = dt == NB_DTYPE_F32 ? (double)(float)want : want;
                        if (!(got == w || fabs(got - w) <= 1e-6 * fabs(w))) {
                            fail_msg("%s axes set %zu keepdims %d (%s): ct_x[%lld] = %g, want %g",
                                     nbi_op_name(ops[oi]), ai, keep, nb_dtype_name(dt),
                                     (long long)i, got, w);
                        }
                        if (ops[oi] == NBI_OP_MAX || ops[oi] == NBI_OP_MIN) {
                            double tw = tsum / count, tg = buf_get(dt, bufs[ty->id], o);
                            NBT_NEAR(tg, tw, 1e-6 * fabs(tw));
                        }
                    }
                    free_graph(&f.tr, bufs);
                    free(bx);
                    free(bc);
                    free(bt);
                    fx_close(&f);
                }
            }
        }
    }
}

/* ---- registry ----------------------------------------------------------------------- */

static void test_registry(void **state) {
    (void)state;
    const nbi_op ops[6] = {NBI_OP_SUM,  NBI_OP_MAX,    NBI_OP_MIN,
                           NBI_OP_PROD, NBI_OP_ARGMAX, NBI_OP_ARGMIN};
    const char *names[6] = {"sum", "max", "min", "prod", "argmax", "argmin"};
    for (int i = 0; i < 6; i++) {
        const nbi_op_info *info = nbi_op_get(ops[i]);
        assert_non_null(info);
        NBT_STREQ(info->name, names[i]);
        NBT_STREQ(nbi_op_name(ops[i]), names[i]);
        NBT_EQ_I64(info->n_in, 1);
        NBT_TRUE(info->infer != NULL && info->kernel != NULL);
        NBT_EQ_I64(info->nondiff, i >= 4 ? 1 : 0);
        NBT_TRUE(!info->elementwise);
        /* rules for the float reductions; an index has none */
        NBT_TRUE((info->vjp != NULL) == (i < 4) && (info->jvp != NULL) == (i < 4));
    }
    /* Scratch only for column-wise float sums over more than one block. */
    fx f;
    fx_open(&f);
    nb_var *a = param(&f, 0, NB_DTYPE_F32, 2, (int64_t[]){300, 5});
    nb_var *b = param(&f, 1, NB_DTYPE_F64, 3, (int64_t[]){2, 1100, 400});
    nb_var *c = param(&f, 2, NB_DTYPE_I32, 2, (int64_t[]){300, 5});
    const nbi_op_info *sum = nbi_op_get(NBI_OP_SUM);
    /* 300 per output: 3 blocks, 3 levels; 5 columns of f32 */
    NBT_EQ_I64(sum->scratch(nb_sum(a, (const int[]){0}, 1, false)), 3 * 5 * 4);
    NBT_EQ_I64(sum->scratch(nb_sum(a, (const int[]){1}, 1, false)), 0);
    NBT_EQ_I64(sum->scratch(nb_sum(c, (const int[]){0}, 1, false)), 0);
    /* 2200 per output: 18 blocks, 6 levels; 400 f64 columns */
    NBT_EQ_I64(sum->scratch(nb_sum(b, (const int[]){0, 1}, 2, false)), 6 * 400 * 8);
    /* Rows wider than a chunk: the chunk's width (4096) */
    nb_var *d = param(&f, 3, NB_DTYPE_F32, 2, (int64_t[]){200, 5000});
    NBT_EQ_I64(sum->scratch(nb_sum(d, (const int[]){-2}, 1, true)), 3 * 4096 * 4);
    NBT_OK(f.ctx, nb_trace_status(&f.tr));
    fx_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduce_every_op_dtype_and_shape),
        cmocka_unit_test(test_float_sum_is_pairwise_and_accurate),
        cmocka_unit_test(test_int_sum_and_prod_wrap),
        cmocka_unit_test(test_max_min_nan_and_inf),
        cmocka_unit_test(test_shapes_and_weak),
        cmocka_unit_test(test_argmax_argmin),
        cmocka_unit_test(test_argmax_specifics),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_sticky_poison_and_null),
        cmocka_unit_test(test_mean),
        cmocka_unit_test(test_logsumexp),
        cmocka_unit_test(test_softmax_and_log_softmax),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_rules_direct),
        cmocka_unit_test(test_grad_through_api),
        cmocka_unit_test(test_prod_hessian_at_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
