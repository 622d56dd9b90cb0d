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
    nb_var *v = nbi_emit_param(&f->tr, i, dt, rank, shape);
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

/* 64-byte aligned, filled with a junk pattern so unwritten outputs show up. */
static void *buf_alloc(size_t bytes) {
    size_t r = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, r);
    assert_non_null(p);
    memset(p, 0xA5, r);
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
#define SPEC_FLOAT(T, S)                                                                   \
    static T spec_tree_##S(const T *b, int64_t n) {                                        \
        if (n == 1) {                                                                      \
            return b[0];                                                                   \
        }                                                                                  \
        int64_t p = 1;                                                                     \
        while (p * 2 < n) {                                                                \
            p *= 2;                                                                        \
        }                                                                                  \
        return spec_tree_##S(b, p) + spec_tree_##S(b + p, n - p);                          \
    }                                                                                      \
    static T spec_##S(nbi_op op, const T *x, int64_t n) {                                  \
        if (n == 0) {                                                                      \
            return op == NBI_OP_PROD ? (T)1 : (T)0;                                        \
        }                                                                                  \
        T acc = x[0];                                                                      \
        if (op == NBI_OP_SUM) {                                                            \
            int64_t nb = (n + 127) / 128;                                                  \
            T *b = malloc((size_t)nb * sizeof(T));                                         \
            assert_non_null(b);                                                            \
            for (int64_t k = 0; k < nb; k++) {                                             \
                T s = x[k * 128];                                                          \
                for (int64_t i = k * 128 + 1; i < n && i < (k + 1) * 128; i++) {          \
                    s = s + x[i];                                                          \
                }                                                                          \
                b[k] = s;                                                                  \
            }                                                                              \
            acc = spec_tree_##S(b, nb);                                                    \
            free(b);                                                                       \
            return acc;                                                                    \
        }                                                                                  \
        for (int64_t i = 1; i < n; i++) {                                                  \
            T v = x[i];                                                                    \
            if (op == NBI_OP_PROD) {                                                       \
                acc = acc * v;                                                             \
            } else if (op == NBI_OP_MAX) {                                                 \
                acc = (v > acc || v != v) ? v : acc;                                       \
            } else {                                                                       \
                acc = (v < acc || v != v) ? v : acc;                                       \
            }                                                                              \
        }                                                                                  \
        return acc;                                                                        \
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
    {0, {0}, 0, {0}, true, false},                  /* rank 0, every axis (none) */
    {0, {0}, 0, {0}, true, true},                   /* rank 0, keepdims */
    {1, {5}, 1, {0}, false, false},                 /* rank 1 to a scalar */
    {1, {5}, 1, {-1}, false, true},                 /* negative axis, keepdims */
    {2, {3, 4}, 1, {1}, false, false},              /* rows (innermost) */
    {2, {3, 4}, 1, {0}, false, false},              /* columns */
    {2, {3, 4}, 1, {-2}, false, true},              /* columns, keepdims */
    {2, {3, 4}, 2, {1, 0}, false, false},           /* unsorted axes */
    {2, {3, 4}, 0, {0}, false, false},              /* n_axes 0: reduce nothing */
    {2, {3, 4}, 0, {0}, true, true},                /* NULL: every axis, keepdims */
    {3, {2, 1, 3}, 1, {1}, false, false},           /* a size-1 axis only: a copy */
    {3, {2, 1, 3}, 2, {0, 1}, false, true},         /* size-1 and real */
    {3, {1, 4, 1}, 2, {-1, 0}, false, false},       /* size-1 axes, negative */
    {4, {2, 3, 4, 5}, 2, {0, 2}, false, false},     /* R K R K: column-wise, strided */
    {4, {2, 3, 4, 5}, 2, {1, 3}, false, true},      /* K R K R: row-wise, several runs */
    {4, {2, 3, 4, 5}, 3, {0, 1, 3}, false, false},  /* R R K R */
    {4, {2, 3, 4, 5}, 1, {2}, false, false},        /* one middle axis */
    {4, {2, 3, 4, 5}, 2, {-1, 0}, false, false},    /* outer and inner */
    {2, {0, 3}, 1, {0}, false, false},              /* empty reduction: identity */
    {2, {0, 3}, 1, {1}, false, false},              /* empty output */
    {2, {3, 0}, 1, {1}, false, true},               /* empty reduction, keepdims */
    {2, {3, 0}, 1, {0}, false, false},              /* empty output */
    {3, {4, 1, 300}, 1, {0}, false, false},         /* column-wise over two chunks */
    {2, {300, 5}, 1, {0}, false, false},            /* column-wise, pending block sums */
    {2, {2, 700}, 1, {1}, false, false},            /* row-wise, several blocks */
    {4, {3, 2, 50, 7}, 2, {0, 2}, false, false},    /* column-wise, 150 per output */
    {3, {3, 2, 1100}, 2, {0, 2}, false, false},     /* runs starting mid-block; long runs */
    {1, {5000}, 1, {0}, false, false},              /* one long run: 40 blocks */
    {2, {1030, 3}, 1, {0}, false, true},            /* column-wise, 9 blocks */
    {3, {129, 2, 2}, 2, {0, 2}, false, false},      /* 258 per output, strided runs */
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
            v[i] = fl ? rnd_in(0.8, 1.25) : rnd_int(-2, 2);
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
    /* 2^24 + 1 + 1 + ... in f32: a left-to-right sum loses every 1; blocks keep them. */
    int64_t n = 4096;
    float *x = buf_alloc((size_t)n * sizeof(float));
    x[0] = 16777216.0f;
    for (int64_t i = 1; i < n; i++) {
        x[i] = 1.0f;
    }
    int64_t m;
    float *y = run_one(NBI_OP_SUM, NB_DTYPE_F32, 1, &n, NULL, 0, x, &m);
    NBT_EQ_I64(m, 1);
    NBT_EQ_F64(y[0], 16777216.0 + 4095.0); /* exact here: every block sum of ones is exact */
    free(y);
    /* The same data as columns: identical bits. */
    float *xc = buf_alloc((size_t)n * 2 * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        xc[2 * i] = xc[2 * i + 1] = x[i];
    }
    int64_t shape2[2] = {n, 2};
    y = run_one(NBI_OP_SUM, NB_DTYPE_F32, 2, shape2, (const int[]){0}, 1, xc, &m);
    NBT_EQ_I64(m, 2);
    NBT_EQ_F64(y[0], 16777216.0 + 4095.0);
    NBT_EQ_F64(y[1], 16777216.0 + 4095.0);
    free(y);
    free(xc);
    free(x);

    /* 10^6 values of 0.1f: the error stays at a few ulps of the sum. */
    n = 1000000;
    x = buf_alloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        x[i] = 0.1f;
    }
    y = run_one(NBI_OP_SUM, NB_DTYPE_F32, 1, &n, NULL, 0, x, &m);
    NBT_NEAR(y[0], (double)0.1f * 1e6, 1e6 * 0.1 * 4 * 6e-8);
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
