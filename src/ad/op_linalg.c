/*
 * op_linalg.c -- matrix products: matmul (numpy.matmul semantics) and the dot composite.
 *
 * matmul(a, b) multiplies stacks of matrices: a is [..., m, k], b is [..., k, n], the batch
 * dims (all but the last two) broadcast numpy-style, and the result is [batch..., m, n]. A
 * rank-1 a is read as [1, k] and a rank-1 b as [k, 1], and the added dim is dropped from the
 * result, so [k] @ [k] is rank 0. The promotion lives inside the node: it keeps the original
 * operands, its inferred shape already lacks the promoted dims, and the kernel reads a rank-1
 * operand as a one-row (a) or one-column (b) matrix. No reshape nodes are emitted.
 *
 * Float dtypes go to BLIS's typed expert API (bli_sgemm_ex / bli_dgemm_ex), one call per
 * batch element, with the row-major strides passed as they are (rs = row length, cs = 1):
 * operands are never copied or transposed, and a broadcast batch dim simply revisits the
 * same matrix (zero batch stride). Why BLIS: its GotoBLAS-style blocking around one small
 * register-tiled micro-kernel per architecture reaches vendor-BLAS speed with explicit
 * strides for every operand; F. G. Van Zee and R. A. van de Geijn, "BLIS: A Framework for
 * Rapidly Instantiating BLAS Functionality", ACM TOMS 41(3), 2015.
 *
 * Small float products (under NBI_MM_SMALL multiply-adds) use a plain loop instead, where
 * BLIS's set-up would cost more than the arithmetic. Integer dtypes use a plain loop that wraps
 * (two's complement, computed in the unsigned type), every output summed over k in increasing
 * order.
 *
 * Behaviour pinned by the tests: beta = 0 makes BLIS overwrite C without reading it, so the
 * uninitialised output buffer never leaks NaN or garbage into the result; k == 0 writes zeros
 * here without calling BLIS (BLIS 0.9 also gives zeros then, but the result does not depend
 * on it and no pointer into an empty operand is handed over); an empty result does nothing.
 * The output must not alias an input.
 */
#include "ad/ir.h"

#include <blis.h>
#include <string.h>

/* ---- geometry ----------------------------------------------------------------------- */

/* One matmul as a batch of [m, k] @ [k, n] products over a broadcast batch shape.
 *
 * Transposed operands. The attributes at.axes[0] and at.axes[1] mark the first and second
 * operand as stored transposed (their last two dims swapped): the matmul then multiplies
 * by the transpose of what it is given. Builders never set them; the optimizer's
 * transpose-folding pass does (passes.c), so that matmul(transpose(w), x) hands w to BLIS
 * with swapped strides instead of copying it. */
typedef struct nbi_mm_geom {
    int64_t m, n, k;
    int64_t a_rs, a_cs, b_rs, b_cs; /* element strides of one matrix of a and of b */
    int64_t c_rs;                   /* row stride of the output block (n of the full C) */
    int ra_bat, rb_bat;             /* batch ranks of a and b (leading dims of their shapes) */
    int rbat;                       /* rank of the broadcast batch shape */
    int64_t bat[NB_MAX_RANK];
} nbi_mm_geom;

static bool nbi_mm_trans(const nb_var *node, int operand) {
    return node->at.axes[operand] != 0 && node->in[operand]->rank >= 2;
}

/* The geometry of node = a @ b (both of rank >= 1); false if the batch dims do not
 * broadcast. */
static bool nbi_mm_geometry(const nb_var *node, nbi_mm_geom *g) {
    const nb_var *a = node->in[0], *b = node->in[1];
    bool ta = nbi_mm_trans(node, 0), tb = nbi_mm_trans(node, 1);
    memset(g, 0, sizeof *g);
    int ra = a->rank, rb = b->rank;
    g->m = ra >= 2 ? a->shape[ra - (ta ? 1 : 2)] : 1;
    g->k = a->shape[ra - (ta ? 2 : 1)];
    g->n = rb >= 2 ? b->shape[rb - (tb ? 2 : 1)] : 1;
    /* row-major storage: [m,k] has strides (k,1); stored as [k,m] it has (1,m) */
    g->a_rs = ta ? 1 : g->k;
    g->a_cs = ta ? g->m : 1;
    g->b_rs = tb ? 1 : g->n;
    g->b_cs = tb ? g->k : 1;
    g->c_rs = g->n;
    g->ra_bat = ra > 2 ? ra - 2 : 0;
    g->rb_bat = rb > 2 ? rb - 2 : 0;
    return nbi_broadcast_shapes(g->ra_bat, a->shape, g->rb_bat, b->shape, &g->rbat, g->bat);
}

/* ---- inference ---------------------------------------------------------------------- */

/* Equal, numeric dtypes (shared by nb_matmul's inference and nb_dot). */
static nb_status nbi_mm_check_dtypes(nb_trace *tr, const char *fn, const nb_var *a,
                                     const nb_var *b) {
    char sa[NBI_SIG_CAP], sb[NBI_SIG_CAP];
    if (a->dtype != b->dtype) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "%s: dtypes differ: %s and %s (convert one with nb_cast)", fn,
                             nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b));
    }
    if (a->dtype == NB_DTYPE_BOOL) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "%s: operands are %s and %s; a matrix product needs a numeric "
                             "dtype (f32, f64, i32 or i64; use nb_cast)",
                             fn, nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b));
    }
    return NB_OK;
}

/* "[d0,d1,...]" of the first rank dims of shape, into buf. */
static const char *nbi_mm_dims(char *buf, size_t cap, int rank, const int64_t *shape) {
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    nbi_sbuf_putc(&s, '[');
    for (int i = 0; i < rank; i++) {
        nbi_sbuf_printf(&s, i ? ",%lld" : "%lld", (long long)shape[i]);
    }
    nbi_sbuf_putc(&s, ']');
    return buf;
}

static nb_status nbi_infer_matmul(nb_trace *tr, nb_var *p) {
    const nb_var *a = p->in[0], *b = p->in[1];
    char sa[NBI_SIG_CAP], sb[NBI_SIG_CAP];
    nb_status st = nbi_mm_check_dtypes(tr, "nb_matmul", a, b);
    if (st != NB_OK) {
        return st;
    }
    if (a->rank == 0 || b->rank == 0) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_matmul: %s @ %s: the %s operand is rank 0; matmul needs rank "
                             ">= 1 (to scale by a scalar use nb_mul)",
                             nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b),
                             a->rank == 0 ? "first" : "second");
    }
    bool ta = nbi_mm_trans(p, 0), tb = nbi_mm_trans(p, 1);
    int64_t ka = a->shape[a->rank - (ta ? 2 : 1)];
    int64_t kb = b->rank >= 2 ? b->shape[b->rank - (tb ? 1 : 2)] : b->shape[0];
    if (ka != kb) {
        const char *hint;
        if (b->rank >= 2 && b->shape[b->rank - 1] == ka) {
            hint = "did you mean to transpose the second operand?";
        } else if (a->rank >= 2 && a->shape[a->rank - 2] == kb) {
            hint = "did you mean to transpose the first operand?";
        } else {
            hint = b->rank >= 2 ? "the last dim of the first operand must equal the "
                                  "second-to-last dim of the second"
                                : "the last dim of the first operand must equal the length "
                                  "of the second";
        }
        return nbi_trace_err(tr, NB_ERR_SHAPE, "nb_matmul: %s @ %s: inner dims %lld != %lld (%s)",
                             nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b),
                             (long long)ka, (long long)kb, hint);
    }
    nbi_mm_geom g;
    if (!nbi_mm_geometry(p, &g)) {
        char da[NBI_SIG_CAP], db[NBI_SIG_CAP];
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_matmul: %s @ %s: batch dims %s and %s do not broadcast "
                             "(aligned from the right, each pair must be equal or contain a "
                             "1; reshape or nb_expand_dims one operand)",
                             nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b),
                             nbi_mm_dims(da, sizeof da, g.ra_bat, a->shape),
                             nbi_mm_dims(db, sizeof db, g.rb_bat, b->shape));
    }
    int r = g.rbat;
    memcpy(p->shape, g.bat, (size_t)r * sizeof(int64_t));
    if (a->rank >= 2) {
        p->shape[r++] = g.m;
    }
    if (b->rank >= 2) {
        p->shape[r++] = g.n;
    }
    p->rank = (int8_t)r;
    p->dtype = a->dtype;
    return NB_OK;
}

/* ---- builders ----------------------------------------------------------------------- */

nb_var *nb_matmul(nb_var *a, nb_var *b) {
    nb_var *in[2] = {a, b};
    bool poisoned;
    nb_trace *tr = nbi_trace_of(2, in, &poisoned);
    return tr ? nbi_emit(tr, NBI_OP_MATMUL, 2, in, NULL) : NULL;
}

/* A composite: the [k] @ [k] case of matmul, with its own checks so that the message names
 * nb_dot. NULL, poison and foreign inputs are left to nb_matmul (through nbi_emit). */
nb_var *nb_dot(nb_var *a, nb_var *b) {
    nb_var *in[2] = {a, b};
    bool poisoned;
    nb_trace *tr = nbi_trace_of(2, in, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned || a->tr != tr || b->tr != tr) {
        return nb_matmul(a, b);
    }
    if (nbi_mm_check_dtypes(tr, "nb_dot", a, b) != NB_OK) {
        return tr->poison;
    }
    char sa[NBI_SIG_CAP], sb[NBI_SIG_CAP];
    if (a->rank != 1 || b->rank != 1) {
        return nbi_trace_errv(tr, NB_ERR_SHAPE,
                              "nb_dot: %s and %s: both operands must be rank 1 (use nb_matmul "
                              "for matrices and batches)",
                              nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b));
    }
    if (a->shape[0] != b->shape[0]) {
        return nbi_trace_errv(tr, NB_ERR_SHAPE, "nb_dot: %s and %s: lengths %lld != %lld",
                              nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b),
                              (long long)a->shape[0], (long long)b->shape[0]);
    }
    return nb_matmul(a, b);
}

/* ---- kernels ------------------------------------------------------------------------ */

/* One [m, k] @ [k, n] product (operands addressed through the geometry's strides) into a
 * row-major c (m, n, k > 0). */
typedef void (*nbi_mm_fn)(const nbi_mm_geom *g, const void *a, const void *b, void *c,
                          void *scratch);

/* BLIS runs with exactly one thread, set on a local runtime object rather than taken from
 * BLIS_NUM_THREADS / OMP_NUM_THREADS or bli_thread_set_num_threads: results and timing must
 * not depend on the environment, and nabla's own pool will parallelise over batch elements
 * and row blocks with boundaries fixed independently of the thread count (a later issue).
 * BLIS does not split the k loop, so each output is summed in an order fixed by the shapes
 * and the micro-kernel BLIS selects for the CPU: results are bit-identical run to run. */
static void nbi_mm_f32(const nbi_mm_geom *g, const void *a, const void *b, void *c, void *scratch) {
    (void)scratch;
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm);
    float one = 1.0f, zero = 0.0f;
    /* BLIS's typed API takes non-const pointers; it only reads a and b. */
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, g->m, g->n, g->k, &one, (float *)a, g->a_rs,
                 g->a_cs, (float *)b, g->b_rs, g->b_cs, &zero, c, g->c_rs, 1, NULL, &rntm);
}

static void nbi_mm_f64(const nbi_mm_geom *g, const void *a, const void *b, void *c, void *scratch) {
    (void)scratch;
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm);
    double one = 1.0, zero = 0.0;
    bli_dgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, g->m, g->n, g->k, &one, (double *)a, g->a_rs,
                 g->a_cs, (double *)b, g->b_rs, g->b_cs, &zero, c, g->n, 1, NULL, &rntm);
}

/* Integers: row i of c accumulates a[i, p] * b[p, :] for p = 0, 1, ..., k-1, in the unsigned
 * type (the output is written through the unsigned type, which may alias the signed one). */
#define NBI_MM_INT_FN(name, T, U)                                                                  \
    static void name(const nbi_mm_geom *g, const void *a_, const void *b_, void *c_,               \
                     void *scratch) {                                                              \
        (void)scratch;                                                                             \
        const T *restrict a = a_, *restrict b = b_;                                                \
        U *restrict c = c_;                                                                        \
        for (int64_t i = 0; i < g->m; i++) {                                                       \
            U *restrict ci = c + i * g->c_rs;                                                      \
            for (int64_t j = 0; j < g->n; j++) {                                                   \
                ci[j] = 0;                                                                         \
            }                                                                                      \
            for (int64_t p = 0; p < g->k; p++) {                                                   \
                U x = (U)a[i * g->a_rs + p * g->a_cs];                                             \
                const T *restrict bp = b + p * g->b_rs;                                            \
                for (int64_t j = 0; j < g->n; j++) {                                               \
                    ci[j] += x * (U)bp[j * g->b_cs];                                               \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }
NBI_MM_INT_FN(nbi_mm_i32, int32_t, uint32_t)
NBI_MM_INT_FN(nbi_mm_i64, int64_t, uint64_t)

/* Small float products: a plain loop, c[i, :] += a[i, p] * b[p, :] for p = 0, 1, ..., k-1
 * (each output summed in increasing p, the j loop vectorised). Below NBI_MM_SMALL
 * multiply-adds a BLIS call costs more than the arithmetic: it sets up its blocking and
 * enters its threading layer even for one thread. Which kernel runs depends on the
 * shapes only, so results stay bit-identical run to run and for any thread count. */
#define NBI_MM_SMALL 32768

#define NBI_MM_SMALL_W 16 /* outputs of one row held in registers across the k loop */
/* fully unrolled, so that the accumulators live in registers rather than on the stack */
#if defined(__clang__)
#define NBI_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define NBI_UNROLL _Pragma("GCC unroll 16")
#else
#define NBI_UNROLL
#endif

#define NBI_MM_SMALL_FN(name, T, ATTR)                                                             \
    ATTR static void name(const nbi_mm_geom *g, const void *a_, const void *b_, void *c_,          \
                          void *scratch) {                                                         \
        const T *a = a_, *b = b_;                                                                  \
        T *c = c_;                                                                                 \
        int64_t ldb = g->b_rs;                                                                     \
        if (g->b_cs != 1) { /* b stored transposed: pack it row-major first */                     \
            T *pk = scratch;                                                                       \
            for (int64_t p = 0; p < g->k; p++) {                                                   \
                for (int64_t j = 0; j < g->n; j++) {                                               \
                    pk[p * g->n + j] = b[p * g->b_rs + j * g->b_cs];                               \
                }                                                                                  \
            }                                                                                      \
            b = pk;                                                                                \
            ldb = g->n;                                                                            \
        }                                                                                          \
        for (int64_t i = 0; i < g->m; i++) {                                                       \
            const T *ai = a + i * g->a_rs;                                                         \
            T *ci = c + i * g->c_rs;                                                               \
            int64_t j0 = 0;                                                                        \
            for (; j0 + NBI_MM_SMALL_W <= g->n; j0 += NBI_MM_SMALL_W) {                            \
                T acc[NBI_MM_SMALL_W] = {0};                                                       \
                for (int64_t p = 0; p < g->k; p++) {                                               \
                    T x = ai[p * g->a_cs];                                                         \
                    const T *bp = b + p * ldb + j0;                                                \
                    NBI_UNROLL                                                                     \
                    for (int jj = 0; jj < NBI_MM_SMALL_W; jj++) {                                  \
                        acc[jj] += x * bp[jj];                                                     \
                    }                                                                              \
                }                                                                                  \
                memcpy(ci + j0, acc, sizeof acc);                                                  \
            }                                                                                      \
            for (int64_t j = j0; j < g->n; j++) {                                                  \
                T acc = 0;                                                                         \
                for (int64_t p = 0; p < g->k; p++) {                                               \
                    acc += ai[p * g->a_cs] * b[p * ldb + j];                                       \
                }                                                                                  \
                ci[j] = acc;                                                                       \
            }                                                                                      \
        }                                                                                          \
    }
NBI_MM_SMALL_FN(nbi_mm_small_f32, float, )
NBI_MM_SMALL_FN(nbi_mm_small_f64, double, )
/* The same loop with 256-bit vectors where the CPU has AVX2. Not FMA: each step is still a
 * rounded multiply then a rounded add, so both versions give the same bits. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define NBI_MM_AVX2 1
NBI_MM_SMALL_FN(nbi_mm_small_f32_avx2, float, __attribute__((target("avx2"))))
NBI_MM_SMALL_FN(nbi_mm_small_f64_avx2, double, __attribute__((target("avx2"))))
#else
#define NBI_MM_AVX2 0
#endif

static nbi_mm_fn nbi_mm_fn_of(nb_dtype d, const nbi_mm_geom *g) {
    bool small = g->m * g->n * g->k <= NBI_MM_SMALL && nb_dtype_is_float(d);
    if (small && nbi_use_avx2()) {
#if NBI_MM_AVX2
        return d == NB_DTYPE_F32 ? nbi_mm_small_f32_avx2 : nbi_mm_small_f64_avx2;
#endif
    }
    switch (d) {
    case NB_DTYPE_F32:
        return small ? nbi_mm_small_f32 : nbi_mm_f32;
    case NB_DTYPE_F64:
        return small ? nbi_mm_small_f64 : nbi_mm_f64;
    case NB_DTYPE_I32:
        return nbi_mm_i32;
    case NB_DTYPE_I64:
        return nbi_mm_i64;
    default:
        return NULL; /* bool: rejected by inference */
    }
}

/* The work is cut into blocks of NBI_MM_ROWS x nbi_mm_cols(n) of the output per batch element
 * -- sizes fixed here, never chosen by the thread count -- and each block is one
 * single-threaded BLIS call (or integer loop) on sub-matrices addressed by offsets and
 * strides. The k loop is never split, so each output element is computed by the same code
 * on the same data whatever the number of threads: results are bit-identical. */
#define NBI_MM_ROWS 1024
#define NBI_MM_COLS 256

/* Columns per block: NBI_MM_COLS, or half that for n <= NBI_MM_COLS so that a product
 * of that width still has two blocks for two threads. Every block is a BLIS call that
 * packs its own panels, so blocks are wide and rows are split only past NBI_MM_ROWS
 * (64-row blocks made a 512x512 f64 product 1.5x slower than one BLIS call). */
static int64_t nbi_mm_cols(int64_t n) {
    return n <= NBI_MM_COLS ? NBI_MM_COLS / 2 : NBI_MM_COLS;
}

typedef struct nbi_mm_job {
    const nbi_kargs *k;
    nbi_mm_geom g;
    nbi_mm_fn f;
    size_t es;
    int64_t cols; /* columns per block (nbi_mm_cols) */
    int64_t row_blocks, col_blocks;
    size_t scratch_bytes; /* per worker */
    int64_t sa[NB_MAX_RANK], sb[NB_MAX_RANK];
} nbi_mm_job;

static void nbi_mm_task(void *ud, int64_t task, int worker) {
    const nbi_mm_job *j = ud;
    const nbi_mm_geom *g = &j->g;
    int64_t per_batch = j->row_blocks * j->col_blocks;
    int64_t t = task / per_batch, rb = (task % per_batch) / j->col_blocks,
            cb = task % j->col_blocks;
    /* the batch element's offsets in a and b (whole matrices), from its multi-index */
    int64_t oa = 0, ob = 0, rest = t;
    for (int d = g->rbat - 1; d >= 0; d--) {
        int64_t i = rest % g->bat[d];
        rest /= g->bat[d];
        oa += i * j->sa[d];
        ob += i * j->sb[d];
    }
    nbi_mm_geom sub = *g;
    int64_t r0 = rb * NBI_MM_ROWS, c0 = cb * j->cols;
    sub.m = g->m - r0 < NBI_MM_ROWS ? g->m - r0 : NBI_MM_ROWS;
    sub.n = g->n - c0 < j->cols ? g->n - c0 : j->cols;
    size_t es = j->es;
    const unsigned char *a = (const unsigned char *)j->k->in[0] +
                             ((size_t)(oa * g->m * g->k) + (size_t)(r0 * g->a_rs)) * es;
    const unsigned char *b = (const unsigned char *)j->k->in[1] +
                             ((size_t)(ob * g->k * g->n) + (size_t)(c0 * g->b_cs)) * es;
    unsigned char *c =
        (unsigned char *)j->k->out + ((size_t)(t * g->m * g->n) + (size_t)(r0 * g->n + c0)) * es;
    j->f(&sub, a, b, c, (unsigned char *)j->k->scratch + (size_t)worker * j->scratch_bytes);
}

/* Per worker: room to pack a transposed b for the small-product loop. */
static size_t nbi_mm_scratch(const nb_var *node) {
    nbi_mm_geom g;
    if (!nbi_mm_geometry(node, &g) || !nb_dtype_is_float(node->dtype) ||
        g.m * g.n * g.k > NBI_MM_SMALL || g.b_cs == 1) {
        return 0;
    }
    int64_t cols = g.n < nbi_mm_cols(g.n) ? g.n : nbi_mm_cols(g.n);
    return ((size_t)(g.k * cols) * nb_dtype_size(node->dtype) + 63) / 64 * 64;
}

static void nbi_k_matmul(const nbi_kargs *k) {
    const nb_var *node = k->node;
    if (node->size == 0) {
        return; /* m, n or a batch dim is 0 */
    }
    const nb_var *x = node->in[0], *y = node->in[1];
    nbi_mm_job j;
    memset(&j, 0, sizeof j);
    (void)nbi_mm_geometry(node, &j.g); /* checked by inference */
    j.es = nb_dtype_size(node->dtype);
    if (j.g.k == 0) {
        memset(k->out, 0, (size_t)node->size * j.es); /* all-bits-zero is 0 / +0.0 */
        return;
    }
    j.f = nbi_mm_fn_of(node->dtype, &j.g);
    if (j.f == NULL) {
        return;
    }
    j.k = k;
    j.scratch_bytes = nbi_mm_scratch(node);
    nbi_bcast_strides(j.g.ra_bat, x->shape, j.g.rbat, j.g.bat, j.sa);
    nbi_bcast_strides(j.g.rb_bat, y->shape, j.g.rbat, j.g.bat, j.sb);
    j.row_blocks = (j.g.m + NBI_MM_ROWS - 1) / NBI_MM_ROWS;
    j.cols = nbi_mm_cols(j.g.n);
    j.col_blocks = (j.g.n + j.cols - 1) / j.cols;
    int64_t n_batch = nbi_shape_size(j.g.rbat, j.g.bat);
    nbi_pool_run(k->pool, n_batch * j.row_blocks * j.col_blocks, nbi_mm_task, &j);
}

/* ---- VJP and JVP rules ---------------------------------------------------------------
 *
 * With A and B the matrices the node multiplies (an operand flagged as stored transposed
 * read through a transpose of its last two axes; a rank-1 a read as [1, k], a rank-1 b as
 * [k, 1]) and C = A @ B over the broadcast batch:
 *   vjp: ct_A = ct @ B^T and ct_B = A^T @ ct, each summed over the batch dims its operand
 *        broadcast (nbi_unbroadcast), then brought back to the operand's stored form (the
 *        promoted dim dropped, a flagged operand transposed back);
 *   jvp: dC = dA @ B + A @ dB (nb_matmul does the promotion itself).
 * Written with the public builders only: the transposes they emit are folded into the
 * products' strides by the optimizer's transpose-matmul pass, as for user code. Integer
 * products never reach these rules (autodiff visits float nodes only). */

/* x with its last two axes swapped (rank >= 2) */
static nb_var *nbi_mm_swap(nb_var *x) {
    int r = nb_var_rank(x), perm[NB_MAX_RANK];
    for (int i = 0; i < r; i++) {
        perm[i] = i;
    }
    perm[r - 2] = r - 1;
    perm[r - 1] = r - 2;
    return nb_transpose(x, perm);
}

/* What the node multiplies for operand j (value x of that operand's stored shape): the
 * stored-transposed flag undone and a rank-1 operand promoted to a matrix. */
static nb_var *nbi_mm_operand(const nb_var *node, int j, nb_var *x) {
    if (x == NULL) {
        return NULL;
    }
    if (nbi_mm_trans(node, j)) {
        return nbi_mm_swap(x);
    }
    if (node->in[j]->rank == 1) {
        int64_t k = node->in[j]->shape[0];
        int64_t s[2] = {j == 0 ? 1 : k, j == 0 ? k : 1};
        return nb_reshape(x, 2, s);
    }
    return x;
}

/* The cotangent ctm of operand j's matrix form (batch dims broadcast) back to the operand
 * as stored. */
static nb_var *nbi_mm_back(const nb_var *node, int j, nb_var *ctm) {
    const nb_var *x = node->in[j];
    bool t = nbi_mm_trans(node, j);
    int64_t s[NB_MAX_RANK];
    int r = x->rank;
    if (r == 1) {
        s[0] = j == 0 ? 1 : x->shape[0];
        s[1] = j == 0 ? x->shape[0] : 1;
        r = 2;
    } else {
        memcpy(s, x->shape, (size_t)r * sizeof(int64_t));
        if (t) {
            s[r - 2] = x->shape[r - 1];
            s[r - 1] = x->shape[r - 2];
        }
    }
    nb_var *c = nbi_unbroadcast(ctm, r, s);
    if (t) {
        return nbi_mm_swap(c);
    }
    return nb_reshape(c, x->rank, x->shape); /* drops a promoted dim; no node otherwise */
}

static void nbi_vjp_matmul(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    (void)tr;
    nb_var *a = nbi_mm_operand(node, 0, node->in[0]);
    nb_var *b = nbi_mm_operand(node, 1, node->in[1]);
    /* ct as [batch..., m, n]: the dims a rank-1 operand dropped put back */
    int rbat = node->rank - (node->in[0]->rank >= 2) - (node->in[1]->rank >= 2);
    int64_t s[NB_MAX_RANK];
    memcpy(s, node->shape, (size_t)rbat * sizeof(int64_t));
    s[rbat] = nb_var_dim(a, -2);
    s[rbat + 1] = nb_var_dim(b, -1);
    nb_var *g = nb_reshape(ct, rbat + 2, s);
    in_ct[0] = nbi_mm_back(node, 0, nb_matmul(g, nbi_mm_swap(b)));
    in_ct[1] = nbi_mm_back(node, 1, nb_matmul(nbi_mm_swap(a), g));
}

static nb_var *nbi_jvp_matmul(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    (void)tr;
    nb_var *p = NULL, *q = NULL;
    /* rank-1 operands stay rank 1: nb_matmul promotes them and drops the dims itself */
    nb_var *a = nbi_mm_trans(node, 0) ? nbi_mm_swap(node->in[0]) : node->in[0];
    nb_var *b = nbi_mm_trans(node, 1) ? nbi_mm_swap(node->in[1]) : node->in[1];
    if (tan[0] != NULL) {
        p = nb_matmul(nbi_mm_trans(node, 0) ? nbi_mm_swap(tan[0]) : tan[0], b);
    }
    if (tan[1] != NULL) {
        q = nb_matmul(a, nbi_mm_trans(node, 1) ? nbi_mm_swap(tan[1]) : tan[1]);
    }
    return p && q ? nb_add(p, q) : p ? p : q;
}

/* ---- registry entries --------------------------------------------------------------- */

const nbi_op_info nbi_opinfo_matmul = {.name = "matmul",
                                       .n_in = 2,
                                       .infer = nbi_infer_matmul,
                                       .kernel = nbi_k_matmul,
                                       .scratch = nbi_mm_scratch,
                                       .vjp = nbi_vjp_matmul,
                                       .jvp = nbi_jvp_matmul};
