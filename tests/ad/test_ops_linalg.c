/*
 * test_ops_linalg.c -- matmul and dot: shape and dtype inference, error messages, and the
 * kernel against a double-precision triple loop (numpy.matmul semantics: rank-1 promotion,
 * broadcast batch dims), for every numeric dtype, empty dims, and bit-for-bit determinism.
 *
 * Nodes are built directly on a trace (params) and the kernel is run through the registry
 * on buffers the test owns, as the executor would.
 */
#include "nbtest.h"

#include "ad/ir.h"

#include <blis.h>
#include <float.h>
#include <stdlib.h>

/* ---- helpers ------------------------------------------------------------------------ */

typedef struct lt_env {
    nb_ctx *ctx;
    nb_trace tr;
} lt_env;

static void lt_begin(lt_env *e) {
    e->ctx = nbt_ctx();
    NBT_OK(e->ctx, nbi_trace_init(&e->tr, e->ctx, "test"));
}

static void lt_end(lt_env *e) {
    nbi_trace_release(&e->tr);
    nbt_assert_no_live(e->ctx);
    nb_ctx_destroy(e->ctx);
}

static nb_var *lt_param(lt_env *e, int32_t index, nb_dtype dtype, int rank, const int64_t *shape) {
    nb_var *v = nbi_emit_param(&e->tr, index, dtype, rank, shape, NULL);
    NBT_TRUE(!nb_var_is_poison(v));
    return v;
}

/* A 64-byte aligned buffer of at least one cache line (as the executor's workspace). */
static void *lt_alloc(size_t bytes) {
    size_t n = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, n ? n : 64);
    NBT_TRUE(p != NULL);
    return p;
}

/* Deterministic test data: floats in [-1, 1), integers in [-8, 8]. */
static uint64_t lt_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void lt_fill(nb_dtype dtype, void *buf, int64_t n, uint64_t seed) {
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = lt_next(&s);
        double f = (double)(r % 2000001) / 1000000.0 - 1.0;
        int64_t q = (int64_t)(r % 17) - 8;
        switch (dtype) {
        case NB_DTYPE_F32:
            ((float *)buf)[i] = (float)f;
            break;
        case NB_DTYPE_F64:
            ((double *)buf)[i] = f;
            break;
        case NB_DTYPE_I32:
            ((int32_t *)buf)[i] = (int32_t)q;
            break;
        case NB_DTYPE_I64:
            ((int64_t *)buf)[i] = q;
            break;
        case NB_DTYPE_BOOL:
            ((uint8_t *)buf)[i] = (uint8_t)(r & 1);
            break;
        }
    }
}

/* Fill with a value the kernel must overwrite: NaN for floats, a pattern for integers. */
static void lt_poison_fill(nb_dtype dtype, void *buf, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        switch (dtype) {
        case NB_DTYPE_F32:
            ((float *)buf)[i] = NAN;
            break;
        case NB_DTYPE_F64:
            ((double *)buf)[i] = NAN;
            break;
        case NB_DTYPE_I32:
            ((int32_t *)buf)[i] = 0x5a5a5a5a;
            break;
        case NB_DTYPE_I64:
            ((int64_t *)buf)[i] = 0x5a5a5a5a5a5a5a5a;
            break;
        case NB_DTYPE_BOOL:
            ((uint8_t *)buf)[i] = 0x5a;
            break;
        }
    }
}

static double lt_get_f(nb_dtype dtype, const void *buf, int64_t i) {
    return dtype == NB_DTYPE_F32 ? (double)((const float *)buf)[i] : ((const double *)buf)[i];
}

static uint64_t lt_get_u(nb_dtype dtype, const void *buf, int64_t i) {
    return dtype == NB_DTYPE_I32 ? (uint64_t)(int64_t)((const int32_t *)buf)[i]
                                 : (uint64_t)((const int64_t *)buf)[i];
}

static void lt_run(const nb_var *v, void *out, const void *a, const void *b) {
    const nbi_op_info *info = nbi_op_get((nbi_op)v->op);
    NBT_TRUE(info != NULL && info->kernel != NULL);
    size_t sb = info->scratch != NULL ? info->scratch(v) : 0;
    void *scratch = sb > 0 ? lt_alloc(sb) : NULL;
    nbi_kargs k = {.node = v, .out = out, .in = (const void *const[]){a, b}, .scratch = scratch};
    info->kernel(&k);
    free(scratch);
}

/* The matrix of operand x (shape sx, rank rx) that output batch index ob[] reads, numpy
 * rules: batch dims aligned from the right, a size-1 dim repeats. Returns its offset in
 * elements. */
static int64_t lt_batch_offset(int rx, const int64_t *sx, int rbat, const int64_t *ob) {
    int rxb = rx > 2 ? rx - 2 : 0;
    int64_t mat = rx >= 2 ? sx[rx - 2] * sx[rx - 1] : sx[0];
    int64_t off = 0;
    for (int i = 0; i < rxb; i++) {
        int64_t idx = sx[i] == 1 ? 0 : ob[i + (rbat - rxb)];
        off = off * sx[i] + idx;
    }
    return off * mat;
}

/* Check v = a @ b against a triple loop in double (floats) or in wrapping 64-bit integers
 * reduced to the dtype (integers). Floats: |got - ref| <= rel * k * max_p |a_ip b_pj|, with
 * rel = 1e-5 (f32) or 1e-12 (f64); integers exact. */
static void lt_check(const nb_var *v, const void *out, const void *a, const void *b) {
    const nb_var *x = v->in[0], *y = v->in[1];
    nb_dtype dt = v->dtype;
    int ra = x->rank, rb = y->rank;
    int64_t m = ra >= 2 ? x->shape[ra - 2] : 1, kk = x->shape[ra - 1];
    int64_t n = rb >= 2 ? y->shape[rb - 1] : 1;
    int rbat = v->rank - (ra >= 2) - (rb >= 2);
    int64_t nbatch = 1;
    for (int i = 0; i < rbat; i++) {
        nbatch *= v->shape[i];
    }
    NBT_EQ_I64(v->size, nbatch * m * n);
    double rel = dt == NB_DTYPE_F32 ? 1e-5 : 1e-12;
    int64_t ob[NB_MAX_RANK] = {0};
    for (int64_t t = 0; t < nbatch; t++) {
        int64_t rem = t;
        for (int i = rbat - 1; i >= 0; i--) {
            ob[i] = rem % v->shape[i];
            rem /= v->shape[i];
        }
        int64_t oa = lt_batch_offset(ra, x->shape, rbat, ob);
        int64_t obb = lt_batch_offset(rb, y->shape, rbat, ob);
        for (int64_t i = 0; i < m; i++) {
            for (int64_t j = 0; j < n; j++) {
                int64_t o = (t * m + i) * n + j;
                if (nb_dtype_is_float(dt)) {
                    double s = 0, mx = 0;
                    for (int64_t p = 0; p < kk; p++) {
                        double term =
                            lt_get_f(dt, a, oa + i * kk + p) * lt_get_f(dt, b, obb + p * n + j);
                        s += term;
                        mx = fabs(term) > mx ? fabs(term) : mx;
                    }
                    double got = lt_get_f(dt, out, o);
                    double tol = rel * (double)kk * mx;
                    if (!(fabs(got - s) <= tol)) {
                        fail_msg("element %lld (batch %lld, row %lld, col %lld): got %.17g, "
                                 "want %.17g (tol %g)",
                                 (long long)o, (long long)t, (long long)i, (long long)j, got, s,
                                 tol);
                    }
                } else {
                    uint64_t s = 0;
                    for (int64_t p = 0; p < kk; p++) {
                        s += lt_get_u(dt, a, oa + i * kk + p) * lt_get_u(dt, b, obb + p * n + j);
                    }
                    uint64_t got = lt_get_u(dt, out, o);
                    uint64_t want =
                        dt == NB_DTYPE_I32 ? (uint64_t)(int64_t)(int32_t)(uint32_t)s : s;
                    if (got != want) {
                        fail_msg("element %lld: got %lld, want %lld", (long long)o, (long long)got,
                                 (long long)want);
                    }
                }
            }
        }
    }
}

/* Build a @ b from params of the given shapes, check the inferred shape against want, run
 * the kernel twice on NaN-filled outputs, check against the reference, and check that the
 * two runs agree bit for bit. */
static void lt_case(nb_dtype dt, int ra, const int64_t *sa, int rb, const int64_t *sb,
                    int want_rank, const int64_t *want_shape, bool use_dot) {
    lt_env e;
    lt_begin(&e);
    nb_var *a = lt_param(&e, 0, dt, ra, sa);
    nb_var *b = lt_param(&e, 1, dt, rb, sb);
    nb_var *v = use_dot ? nb_dot(a, b) : nb_matmul(a, b);
    NBT_OK(e.ctx, nb_trace_status(&e.tr));
    NBT_TRUE(!nb_var_is_poison(v));
    NBT_EQ_I64(v->op, NBI_OP_MATMUL);
    NBT_EQ_I64(v->n_in, 2);
    NBT_TRUE(v->in[0] == a && v->in[1] == b);
    NBT_EQ_I64(nb_var_dtype(v), dt);
    NBT_EQ_I64(nb_var_rank(v), want_rank);
    for (int i = 0; i < want_rank; i++) {
        NBT_EQ_I64(nb_var_shape(v)[i], want_shape[i]);
    }
    size_t es = nb_dtype_size(dt);
    void *abuf = lt_alloc((size_t)a->size * es), *bbuf = lt_alloc((size_t)b->size * es);
    void *o1 = lt_alloc((size_t)v->size * es), *o2 = lt_alloc((size_t)v->size * es);
    lt_fill(dt, abuf, a->size, 1 + (uint64_t)a->size);
    lt_fill(dt, bbuf, b->size, 7 + (uint64_t)b->size);
    lt_poison_fill(dt, o1, v->size);
    lt_poison_fill(dt, o2, v->size);
    lt_run(v, o1, abuf, bbuf);
    lt_check(v, o1, abuf, bbuf);
    lt_run(v, o2, abuf, bbuf);
    NBT_TRUE(memcmp(o1, o2, (size_t)v->size * es) == 0);
    free(abuf);
    free(bbuf);
    free(o1);
    free(o2);
    lt_end(&e);
}

static const nb_dtype lt_numeric[] = {NB_DTYPE_F32, NB_DTYPE_F64, NB_DTYPE_I32, NB_DTYPE_I64};
#define LT_N_NUMERIC ((int)(sizeof lt_numeric / sizeof lt_numeric[0]))

/* A builder that must fail: status want, message exactly msg (if given) or containing sub. */
static void lt_expect_error(nb_dtype da, int ra, const int64_t *sa, nb_dtype db, int rb,
                            const int64_t *sb, bool use_dot, nb_status want, const char *msg,
                            const char *sub) {
    lt_env e;
    lt_begin(&e);
    nb_var *a = lt_param(&e, 0, da, ra, sa);
    nb_var *b = lt_param(&e, 1, db, rb, sb);
    int32_t n_nodes = e.tr.g.n_nodes;
    nb_var *v = use_dot ? nb_dot(a, b) : nb_matmul(a, b);
    NBT_TRUE(nb_var_is_poison(v));
    NBT_TRUE(v == e.tr.poison);
    NBT_EQ_I64(nb_var_rank(v), -1);
    NBT_STATUS(e.ctx, want, nb_trace_status(&e.tr));
    NBT_EQ_I64(e.tr.g.n_nodes, n_nodes); /* nothing was added */
    if (msg != NULL) {
        NBT_STREQ(nb_ctx_errmsg(e.ctx), msg);
    }
    if (sub != NULL) {
        NBT_ERRMSG_HAS(e.ctx, sub);
    }
    lt_end(&e);
}

/* ---- registry ----------------------------------------------------------------------- */

static void test_registry_entry(void **state) {
    (void)state;
    const nbi_op_info *info = nbi_op_get(NBI_OP_MATMUL);
    NBT_TRUE(info == &nbi_opinfo_matmul);
    NBT_STREQ(info->name, "matmul");
    NBT_STREQ(nbi_op_name(NBI_OP_MATMUL), "matmul");
    NBT_EQ_I64(info->n_in, -1); /* 2, or 3 when accumulating (pass_accumulate.c) */
    NBT_TRUE(info->infer != NULL);
    NBT_TRUE(info->kernel != NULL);
    NBT_TRUE(info->scratch != NULL);
    NBT_EQ_I64(info->nondiff, 0);
    NBT_TRUE(!info->elementwise);
    NBT_TRUE(info->vjp != NULL);
    NBT_TRUE(info->jvp != NULL);
}

/* ---- shapes and values -------------------------------------------------------------- */

static void test_matmul_2d_2d(void **state) {
    (void)state;
    for (int d = 0; d < LT_N_NUMERIC; d++) {
        lt_case(lt_numeric[d], 2, (int64_t[]){3, 4}, 2, (int64_t[]){4, 5}, 2, (int64_t[]){3, 5},
                false);
        lt_case(lt_numeric[d], 2, (int64_t[]){1, 1}, 2, (int64_t[]){1, 1}, 2, (int64_t[]){1, 1},
                false);
        /* non-square, thin and wide, k = 1 */
        lt_case(lt_numeric[d], 2, (int64_t[]){7, 1}, 2, (int64_t[]){1, 9}, 2, (int64_t[]){7, 9},
                false);
        lt_case(lt_numeric[d], 2, (int64_t[]){1, 13}, 2, (int64_t[]){13, 1}, 2, (int64_t[]){1, 1},
                false);
        lt_case(lt_numeric[d], 2, (int64_t[]){17, 3}, 2, (int64_t[]){3, 2}, 2, (int64_t[]){17, 2},
                false);
        lt_case(lt_numeric[d], 2, (int64_t[]){2, 37}, 2, (int64_t[]){37, 29}, 2, (int64_t[]){2, 29},
                false);
    }
}

/* Sizes that take BLIS's large-matrix (packed) path as well as the small-matrix one, and
 * nabla's own loops for small float products (at most 32768 multiply-adds; checked bit for
 * bit in test_matmul_small_bits): whole column tiles, a column tail, and the sizes just
 * either side of the switch. */
static void test_matmul_large(void **state) {
    (void)state;
    for (int d = 0; d < 2; d++) {
        lt_case(lt_numeric[d], 2, (int64_t[]){16, 32}, 2, (int64_t[]){32, 32}, 2,
                (int64_t[]){16, 32}, false);
        lt_case(lt_numeric[d], 2, (int64_t[]){5, 20}, 2, (int64_t[]){20, 17}, 2, (int64_t[]){5, 17},
                false);
        lt_case(lt_numeric[d], 2, (int64_t[]){32, 32}, 2, (int64_t[]){32, 32}, 2,
                (int64_t[]){32, 32}, false);
        lt_case(lt_numeric[d], 2, (int64_t[]){32, 32}, 2, (int64_t[]){32, 33}, 2,
                (int64_t[]){32, 33}, false);
    }
    lt_case(NB_DTYPE_F32, 2, (int64_t[]){128, 784}, 2, (int64_t[]){784, 64}, 2,
            (int64_t[]){128, 64}, false);
    lt_case(NB_DTYPE_F64, 2, (int64_t[]){130, 300}, 2, (int64_t[]){300, 70}, 2,
            (int64_t[]){130, 70}, false);
    lt_case(NB_DTYPE_F32, 2, (int64_t[]){301, 257}, 2, (int64_t[]){257, 259}, 2,
            (int64_t[]){301, 259}, false);
    lt_case(NB_DTYPE_I32, 2, (int64_t[]){65, 100}, 2, (int64_t[]){100, 33}, 2, (int64_t[]){65, 33},
            false);
    /* more than 1024 rows: row blocks, through BLIS and through the small-product loop */
    lt_case(NB_DTYPE_F32, 2, (int64_t[]){1030, 40}, 2, (int64_t[]){40, 300}, 2,
            (int64_t[]){1030, 300}, false);
    lt_case(NB_DTYPE_F64, 2, (int64_t[]){1100, 3}, 2, (int64_t[]){3, 5}, 2, (int64_t[]){1100, 5},
            false);
    /* f64 products wide enough to be cut into column blocks: each block's rows are the full
     * output's rows apart (a regression: the f64 path once wrote them n-of-the-block apart,
     * so an outer product such as a weight gradient of a 256-wide layer came out wrong, and
     * differently for 2 threads) */
    lt_case(NB_DTYPE_F64, 2, (int64_t[]){256, 1}, 2, (int64_t[]){1, 256}, 2, (int64_t[]){256, 256},
            false);
    lt_case(NB_DTYPE_F64, 2, (int64_t[]){40, 50}, 2, (int64_t[]){50, 700}, 2, (int64_t[]){40, 700},
            false);
    lt_case(NB_DTYPE_F32, 2, (int64_t[]){256, 1}, 2, (int64_t[]){1, 700}, 2, (int64_t[]){256, 700},
            false);
    /* matrix-vector products through gemv: a long dot, rank-1 operands either side (several
     * 256-output blocks), a column and a row of a batch, a broadcast matrix */
    for (int d = 0; d < 2; d++) {
        lt_case(lt_numeric[d], 1, (int64_t[]){40000}, 1, (int64_t[]){40000}, 0, NULL, true);
        lt_case(lt_numeric[d], 2, (int64_t[]){700, 300}, 1, (int64_t[]){300}, 1, (int64_t[]){700},
                false);
        lt_case(lt_numeric[d], 1, (int64_t[]){300}, 2, (int64_t[]){300, 1100}, 1, (int64_t[]){1100},
                false);
        lt_case(lt_numeric[d], 3, (int64_t[]){3, 300, 200}, 3, (int64_t[]){3, 200, 1}, 3,
                (int64_t[]){3, 300, 1}, false);
        lt_case(lt_numeric[d], 3, (int64_t[]){2, 1, 300}, 2, (int64_t[]){300, 400}, 3,
                (int64_t[]){2, 1, 400}, false);
    }
}

static void test_matmul_1d_2d(void **state) {
    (void)state;
    for (int d = 0; d < LT_N_NUMERIC; d++) {
        lt_case(lt_numeric[d], 1, (int64_t[]){4}, 2, (int64_t[]){4, 5}, 1, (int64_t[]){5}, false);
        lt_case(lt_numeric[d], 1, (int64_t[]){1}, 2, (int64_t[]){1, 3}, 1, (int64_t[]){3}, false);
        lt_case(lt_numeric[d], 1, (int64_t[]){40}, 2, (int64_t[]){40, 1}, 1, (int64_t[]){1}, false);
    }
}

static void test_matmul_2d_1d(void **state) {
    (void)state;
    for (int d = 0; d < LT_N_NUMERIC; d++) {
        lt_case(lt_numeric[d], 2, (int64_t[]){3, 4}, 1, (int64_t[]){4}, 1, (int64_t[]){3}, false);
        lt_case(lt_numeric[d], 2, (int64_t[]){1, 6}, 1, (int64_t[]){6}, 1, (int64_t[]){1}, false);
        lt_case(lt_numeric[d], 2, (int64_t[]){50, 1}, 1, (int64_t[]){1}, 1, (int64_t[]){50}, false);
    }
}

static void test_matmul_1d_1d_and_dot(void **state) {
    (void)state;
    for (int d = 0; d < LT_N_NUMERIC; d++) {
        lt_case(lt_numeric[d], 1, (int64_t[]){7}, 1, (int64_t[]){7}, 0, NULL, true);
        lt_case(lt_numeric[d], 1, (int64_t[]){7}, 1, (int64_t[]){7}, 0, NULL, false);
        lt_case(lt_numeric[d], 1, (int64_t[]){1}, 1, (int64_t[]){1}, 0, NULL, true);
        lt_case(lt_numeric[d], 1, (int64_t[]){1000}, 1, (int64_t[]){1000}, 0, NULL, true);
    }
}

static void test_matmul_batched(void **state) {
    (void)state;
    for (int d = 0; d < LT_N_NUMERIC; d++) {
        lt_case(lt_numeric[d], 3, (int64_t[]){3, 2, 4}, 3, (int64_t[]){3, 4, 5}, 3,
                (int64_t[]){3, 2, 5}, false);
        lt_case(lt_numeric[d], 4, (int64_t[]){2, 3, 5, 4}, 4, (int64_t[]){2, 3, 4, 6}, 4,
                (int64_t[]){2, 3, 5, 6}, false);
    }
}

static void test_matmul_batch_broadcast(void **state) {
    (void)state;
    for (int d = 0; d < LT_N_NUMERIC; d++) {
        nb_dtype dt = lt_numeric[d];
        /* [2,1,3,4] @ [5,4,2] -> [2,5,3,2] */
        lt_case(dt, 4, (int64_t[]){2, 1, 3, 4}, 3, (int64_t[]){5, 4, 2}, 4, (int64_t[]){2, 5, 3, 2},
                false);
        /* a batch against a plain matrix, both ways */
        lt_case(dt, 3, (int64_t[]){4, 3, 5}, 2, (int64_t[]){5, 2}, 3, (int64_t[]){4, 3, 2}, false);
        lt_case(dt, 2, (int64_t[]){3, 5}, 3, (int64_t[]){4, 5, 2}, 3, (int64_t[]){4, 3, 2}, false);
        /* size-1 batch dims on both sides */
        lt_case(dt, 3, (int64_t[]){1, 3, 4}, 4, (int64_t[]){2, 3, 4, 2}, 4, (int64_t[]){2, 3, 3, 2},
                false);
        lt_case(dt, 4, (int64_t[]){3, 1, 2, 4}, 4, (int64_t[]){1, 5, 4, 3}, 4,
                (int64_t[]){3, 5, 2, 3}, false);
        /* rank-1 operands against batches */
        lt_case(dt, 1, (int64_t[]){4}, 3, (int64_t[]){2, 4, 5}, 2, (int64_t[]){2, 5}, false);
        lt_case(dt, 3, (int64_t[]){2, 3, 4}, 1, (int64_t[]){4}, 2, (int64_t[]){2, 3}, false);
    }
}

/* k = 0: every output is a zero sum, whatever was in the output buffer before. */
static void test_matmul_k_zero(void **state) {
    (void)state;
    for (int d = 0; d < LT_N_NUMERIC; d++) {
        nb_dtype dt = lt_numeric[d];
        lt_case(dt, 2, (int64_t[]){3, 0}, 2, (int64_t[]){0, 4}, 2, (int64_t[]){3, 4}, false);
        lt_case(dt, 3, (int64_t[]){2, 3, 0}, 2, (int64_t[]){0, 4}, 3, (int64_t[]){2, 3, 4}, false);
        lt_case(dt, 1, (int64_t[]){0}, 1, (int64_t[]){0}, 0, NULL, true);
        lt_case(dt, 1, (int64_t[]){0}, 2, (int64_t[]){0, 5}, 1, (int64_t[]){5}, false);
    }
    /* explicitly: zeros (+0.0) even though the output held NaN, and no input is read (the
     * input buffers are NULL here, as an executor may give for empty values) */
    lt_env e;
    lt_begin(&e);
    nb_var *a = lt_param(&e, 0, NB_DTYPE_F32, 2, (int64_t[]){2, 0});
    nb_var *b = lt_param(&e, 1, NB_DTYPE_F32, 2, (int64_t[]){0, 3});
    nb_var *v = nb_matmul(a, b);
    NBT_OK(e.ctx, nb_trace_status(&e.tr));
    float out[6];
    lt_poison_fill(NB_DTYPE_F32, out, 6);
    lt_run(v, out, NULL, NULL);
    for (int i = 0; i < 6; i++) {
        NBT_TRUE(out[i] == 0.0f && !signbit(out[i]));
    }
    lt_end(&e);
}

/* m = 0, n = 0 or an empty batch: an empty result, and the kernel writes nothing. */
static void test_matmul_empty_result(void **state) {
    (void)state;
    struct {
        int ra, rb, rv;
        int64_t sa[3], sb[3], sv[3];
    } cases[] = {
        {2, 2, 2, {0, 4}, {4, 5}, {0, 5}},
        {2, 2, 2, {3, 4}, {4, 0}, {3, 0}},
        {2, 2, 2, {0, 0}, {0, 0}, {0, 0}},
        {3, 2, 3, {0, 2, 4}, {4, 5}, {0, 2, 5}},
        {3, 3, 3, {1, 2, 4}, {0, 4, 5}, {0, 2, 5}},
        {1, 2, 1, {4}, {4, 0}, {0}},
        {2, 1, 1, {0, 4}, {4}, {0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int d = 0; d < LT_N_NUMERIC; d++) {
            nb_dtype dt = lt_numeric[d];
            lt_env e;
            lt_begin(&e);
            nb_var *a = lt_param(&e, 0, dt, cases[c].ra, cases[c].sa);
            nb_var *b = lt_param(&e, 1, dt, cases[c].rb, cases[c].sb);
            nb_var *v = nb_matmul(a, b);
            NBT_OK(e.ctx, nb_trace_status(&e.tr));
            NBT_EQ_I64(nb_var_rank(v), cases[c].rv);
            for (int i = 0; i < cases[c].rv; i++) {
                NBT_EQ_I64(nb_var_shape(v)[i], cases[c].sv[i]);
            }
            NBT_EQ_I64(nb_var_size(v), 0);
            size_t es = nb_dtype_size(dt);
            void *abuf = lt_alloc((size_t)a->size * es), *bbuf = lt_alloc((size_t)b->size * es);
            lt_fill(dt, abuf, a->size, 3);
            lt_fill(dt, bbuf, b->size, 5);
            unsigned char canary[64];
            memset(canary, 0xA5, sizeof canary);
            lt_run(v, canary, abuf, bbuf);
            for (size_t i = 0; i < sizeof canary; i++) {
                NBT_EQ_I64(canary[i], 0xA5);
            }
            free(abuf);
            free(bbuf);
            lt_end(&e);
        }
    }
}

/* Integer products wrap (two's complement), with no undefined overflow (UBSan watches). */
static void test_matmul_int_wraps(void **state) {
    (void)state;
    lt_env e;
    lt_begin(&e);
    nb_var *a = lt_param(&e, 0, NB_DTYPE_I32, 2, (int64_t[]){1, 2});
    nb_var *b = lt_param(&e, 1, NB_DTYPE_I32, 2, (int64_t[]){2, 2});
    nb_var *v = nb_matmul(a, b);
    int32_t av[2] = {INT32_MAX, INT32_MIN};
    int32_t bv[4] = {2, -1, 3, INT32_MIN};
    int32_t out[2];
    lt_run(v, out, av, bv);
    /* mod 2^32: 2*MAX + 3*MIN = -2 + MIN = MAX - 1; -MAX + MIN*MIN = -MAX + 0 = MIN + 1 */
    NBT_EQ_I64(out[0], INT32_MAX - 1);
    NBT_EQ_I64(out[1], INT32_MIN + 1);
    lt_check(v, out, av, bv);

    nb_var *a64 = lt_param(&e, 2, NB_DTYPE_I64, 1, (int64_t[]){2});
    nb_var *b64 = lt_param(&e, 3, NB_DTYPE_I64, 1, (int64_t[]){2});
    nb_var *d = nb_dot(a64, b64);
    NBT_OK(e.ctx, nb_trace_status(&e.tr));
    int64_t x[2] = {INT64_MAX, 3}, y[2] = {INT64_MAX, INT64_MIN};
    int64_t r;
    lt_run(d, &r, x, y);
    /* MAX*MAX = 1 (mod 2^64); 3*MIN = MIN (mod 2^64) */
    NBT_EQ_I64(r, INT64_MIN + 1);
    lt_end(&e);
}

/* The output buffer is uninitialised: NaN or Inf left in it must not reach the result
 * (BLIS with beta = 0 overwrites C without reading it). */
static void test_matmul_ignores_output_contents(void **state) {
    (void)state;
    lt_env e;
    lt_begin(&e);
    nb_var *a = lt_param(&e, 0, NB_DTYPE_F64, 2, (int64_t[]){64, 48});
    nb_var *b = lt_param(&e, 1, NB_DTYPE_F64, 2, (int64_t[]){48, 40});
    nb_var *v = nb_matmul(a, b);
    double *abuf = lt_alloc(64 * 48 * 8), *bbuf = lt_alloc(48 * 40 * 8);
    double *o1 = lt_alloc(64 * 40 * 8), *o2 = lt_alloc(64 * 40 * 8);
    lt_fill(NB_DTYPE_F64, abuf, 64 * 48, 11);
    lt_fill(NB_DTYPE_F64, bbuf, 48 * 40, 12);
    for (int i = 0; i < 64 * 40; i++) {
        o1[i] = NAN;
        o2[i] = i % 2 ? INFINITY : -INFINITY;
    }
    lt_run(v, o1, abuf, bbuf);
    lt_run(v, o2, abuf, bbuf);
    lt_check(v, o1, abuf, bbuf);
    NBT_TRUE(memcmp(o1, o2, 64 * 40 * 8) == 0);
    free(abuf);
    free(bbuf);
    free(o1);
    free(o2);
    lt_end(&e);
}

/* Same inputs -> the same bits: twice in a row, through different (broadcast) batch
 * strides, and after BLIS's global thread count is raised (the kernel pins one thread). */
static void test_matmul_deterministic(void **state) {
    (void)state;
    lt_env e;
    lt_begin(&e);
    nb_var *a = lt_param(&e, 0, NB_DTYPE_F32, 3, (int64_t[]){3, 200, 96});
    nb_var *b = lt_param(&e, 1, NB_DTYPE_F32, 2, (int64_t[]){96, 150});
    nb_var *v = nb_matmul(a, b);
    NBT_OK(e.ctx, nb_trace_status(&e.tr));
    size_t asz = 3 * 200 * 96, bsz = 96 * 150, osz = 3 * 200 * 150;
    float *abuf = lt_alloc(asz * 4), *bbuf = lt_alloc(bsz * 4);
    float *o1 = lt_alloc(osz * 4), *o2 = lt_alloc(osz * 4), *o3 = lt_alloc(osz * 4);
    lt_fill(NB_DTYPE_F32, abuf, (int64_t)asz, 21);
    /* the same matrix in every batch element: every batch result must be identical too */
    for (size_t t = 1; t < 3; t++) {
        memcpy(abuf + t * 200 * 96, abuf, 200 * 96 * 4);
    }
    lt_fill(NB_DTYPE_F32, bbuf, (int64_t)bsz, 22);
    lt_run(v, o1, abuf, bbuf);
    lt_run(v, o2, abuf, bbuf);
    NBT_TRUE(memcmp(o1, o2, osz * 4) == 0);
    NBT_TRUE(memcmp(o1, o1 + 200 * 150, 200 * 150 * 4) == 0);
    NBT_TRUE(memcmp(o1, o1 + 2 * 200 * 150, 200 * 150 * 4) == 0);
    dim_t saved = bli_thread_get_num_threads();
    bli_thread_set_num_threads(4);
    lt_run(v, o3, abuf, bbuf);
    bli_thread_set_num_threads(saved > 0 ? saved : 1);
    NBT_TRUE(memcmp(o1, o3, osz * 4) == 0);
    lt_check(v, o1, abuf, bbuf);
    free(abuf);
    free(bbuf);
    free(o1);
    free(o2);
    free(o3);
    lt_end(&e);
}

/* nb_matmul(x, x): both inputs are one buffer. */
static void test_matmul_same_operand(void **state) {
    (void)state;
    lt_env e;
    lt_begin(&e);
    nb_var *x = lt_param(&e, 0, NB_DTYPE_F64, 2, (int64_t[]){5, 5});
    nb_var *v = nb_matmul(x, x);
    NBT_OK(e.ctx, nb_trace_status(&e.tr));
    double xb[25], out[25];
    lt_fill(NB_DTYPE_F64, xb, 25, 9);
    lt_run(v, out, xb, xb);
    lt_check(v, out, xb, xb);
    lt_end(&e);
}

/* ---- the small-product loops, bit for bit ------------------------------------------ */

/* Float products of at most this many multiply-adds run nabla's register-tiled loops
 * (NBI_MM_SMALL in op_linalg.c); those promise every output summed exactly as below, so
 * they are checked bit for bit. Larger ones go to BLIS, which sums in its own blocks. */
#define LT_SMALL 32768

/* c[i, j] = acc after acc = 0; acc = acc + a[i, p] * b[p, j] for p = 0, 1, ..., k-1, with a
 * rounded multiply and a rounded add: two statements, so that the contraction C allows
 * within one expression cannot fuse them into an FMA. a[i, p] is at a[i * a_rs + p * a_cs],
 * b[p, j] at b[p * b_rs + j * b_cs]. */
#define LT_REF_FN(name, T)                                                                         \
    static void name(int64_t m, int64_t n, int64_t k, const T *a, int64_t a_rs, int64_t a_cs,      \
                     const T *b, int64_t b_rs, int64_t b_cs, T *c) {                               \
        for (int64_t i = 0; i < m; i++) {                                                          \
            for (int64_t j = 0; j < n; j++) {                                                      \
                T acc = 0;                                                                         \
                for (int64_t p = 0; p < k; p++) {                                                  \
                    T prod = a[i * a_rs + p * a_cs] * b[p * b_rs + j * b_cs];                      \
                    acc = acc + prod;                                                              \
                }                                                                                  \
                c[i * n + j] = acc;                                                                \
            }                                                                                      \
        }                                                                                          \
    }
LT_REF_FN(lt_ref_f32, float)
LT_REF_FN(lt_ref_f64, double)

/* The accumulating form of node v (a matmul of params a and b): matmul(a, b, c) with a new
 * param c of v's type, as the accumulate pass makes it (pass_accumulate.c). */
static nb_var *lt_acc_node(lt_env *e, const nb_var *v, int32_t index) {
    nb_var *c = lt_param(e, index, v->dtype, v->rank, v->shape);
    nb_var *in[3] = {v->in[0], v->in[1], c};
    nb_var *w = nbi_emit(&e->tr, NBI_OP_MATMUL, 3, in, &v->at);
    NBT_OK(e->ctx, nb_trace_status(&e->tr));
    NBT_EQ_I64(w->n_in, 3);
    return w;
}

/* Run an accumulating node w on (a, b, c) into a separate output (c must stay as it is),
 * leaving the result in out; then in place (the output is a copy of c that the kernel adds
 * into, as the memory plan may give it), leaving that result in inpl when it is not NULL.
 * Where the memory plan allows in place (nbi_matmul_acc_in_place) the two must agree bit
 * for bit. */
static void lt_run_acc2(const nb_var *w, void *out, void *inpl, const void *a, const void *b,
                        const void *c) {
    const nbi_op_info *info = nbi_op_get(NBI_OP_MATMUL);
    size_t bytes = (size_t)w->size * nb_dtype_size(w->dtype), sb = info->scratch(w);
    unsigned char *scratch = lt_alloc(sb), *cc = lt_alloc(bytes), *ip = lt_alloc(bytes);
    memcpy(cc, c, bytes);
    lt_poison_fill(w->dtype, out, w->size);
    nbi_kargs k1 = {
        .node = w, .out = out, .in = (const void *const[]){a, b, cc}, .scratch = scratch};
    info->kernel(&k1);
    NBT_TRUE(memcmp(cc, c, bytes) == 0); /* the accumulator is an input: left alone */
    memcpy(ip, c, bytes);
    nbi_kargs k2 = {
        .node = w, .out = ip, .in = (const void *const[]){a, b, ip}, .scratch = scratch};
    info->kernel(&k2);
    if (nbi_matmul_acc_in_place(w) && memcmp(out, ip, bytes) != 0) {
        fail_msg("an accumulating %s product gives other bits in place", nb_dtype_name(w->dtype));
    }
    if (inpl != NULL) {
        memcpy(inpl, ip, bytes);
    }
    free(scratch);
    free(cc);
    free(ip);
}

static void lt_run_acc(const nb_var *w, void *out, const void *a, const void *b, const void *c) {
    lt_run_acc2(w, out, NULL, a, b, c);
}

/* One [m, k] @ [k, n] product, a stored transposed if ta, b if tb (the flags the optimizer
 * sets), run through the registry like the executor does, on its exact scratch size and an
 * output that are both followed by guard bytes: the result must equal the reference bit for
 * bit and nothing past the scratch or the output may be written. Then accumulated into a c
 * (lt_run_acc): exactly the reference plus c, rounded once more -- the product and the add
 * made separately. */
static void lt_small_case(lt_env *e, nb_dtype dt, int64_t m, int64_t k, int64_t n, int ta, int tb) {
    int64_t sa[2] = {ta ? k : m, ta ? m : k}, sb[2] = {tb ? n : k, tb ? k : n};
    nb_var *in[2] = {lt_param(e, 0, dt, 2, sa), lt_param(e, 1, dt, 2, sb)};
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.axes[0] = ta;
    at.axes[1] = tb;
    nb_var *v = nbi_emit(&e->tr, NBI_OP_MATMUL, 2, in, &at);
    NBT_OK(e->ctx, nb_trace_status(&e->tr));
    const nbi_op_info *info = nbi_op_get(NBI_OP_MATMUL);
    size_t es = nb_dtype_size(dt), guard = 256, sbytes = info->scratch(v);
    size_t cbytes = (size_t)(m * n) * es;
    unsigned char *abuf = lt_alloc((size_t)(m * k) * es), *bbuf = lt_alloc((size_t)(k * n) * es);
    unsigned char *cbuf = lt_alloc(cbytes + guard), *want = lt_alloc(cbytes);
    unsigned char *scratch = lt_alloc(sbytes + guard);
    uint64_t seed = (uint64_t)(m * 1000000 + k * 1000 + n);
    lt_fill(dt, abuf, m * k, seed);
    lt_fill(dt, bbuf, k * n, seed + 1);
    /* negative zeros in a: a row of them sums to +0 (0 + -0 = +0), which a loop that starts
     * from the first product instead of from 0 would get wrong */
    for (int64_t p = 0; m > 1 && p < k; p++) {
        int64_t o = ta ? p * m : p; /* a[0, p] */
        if (dt == NB_DTYPE_F32) {
            ((float *)abuf)[o] = -0.0f;
        } else {
            ((double *)abuf)[o] = -0.0;
        }
    }
    memset(cbuf + cbytes, 0xa5, guard);
    memset(scratch, 0x5a, sbytes + guard);
    lt_poison_fill(dt, cbuf, m * n);
    nbi_kargs ka = {
        .node = v, .out = cbuf, .in = (const void *const[]){abuf, bbuf}, .scratch = scratch};
    info->kernel(&ka);
    int64_t a_rs = ta ? 1 : k, a_cs = ta ? m : 1, b_rs = tb ? 1 : n, b_cs = tb ? k : 1;
    if (dt == NB_DTYPE_F32) {
        lt_ref_f32(m, n, k, (const float *)abuf, a_rs, a_cs, (const float *)bbuf, b_rs, b_cs,
                   (float *)want);
    } else {
        lt_ref_f64(m, n, k, (const double *)abuf, a_rs, a_cs, (const double *)bbuf, b_rs, b_cs,
                   (double *)want);
    }
    for (int64_t o = 0; o < m * n; o++) {
        if (memcmp(cbuf + (size_t)o * es, want + (size_t)o * es, es) != 0) {
            fail_msg("%s %s[%lld,%lld]%s @ [%lld,%lld]%s: element (%lld, %lld) is %.17g, the "
                     "in-order sum is %.17g",
                     nbi_use_avx2() ? "avx2" : "baseline", nb_dtype_name(dt), (long long)m,
                     (long long)k, ta ? " (stored transposed)" : "", (long long)k, (long long)n,
                     tb ? " (stored transposed)" : "", (long long)(o / n), (long long)(o % n),
                     lt_get_f(dt, cbuf, o), lt_get_f(dt, want, o));
        }
    }
    for (size_t i = 0; i < guard; i++) {
        NBT_TRUE(cbuf[cbytes + i] == 0xa5);
        NBT_TRUE(scratch[sbytes + i] == 0x5a);
    }
    nb_var *w = lt_acc_node(e, v, 2);
    NBT_EQ_I64(info->scratch(w), (int64_t)sbytes);
    unsigned char *acc = lt_alloc(cbytes), *got = lt_alloc(cbytes);
    lt_fill(dt, acc, m * n, seed + 2);
    lt_run_acc(w, got, abuf, bbuf, acc);
    for (int64_t o = 0; o < m * n; o++) {
        unsigned char x[8];
        if (dt == NB_DTYPE_F32) {
            float sum = ((const float *)want)[o] + ((const float *)acc)[o];
            memcpy(x, &sum, sizeof sum);
        } else {
            double sum = ((const double *)want)[o] + ((const double *)acc)[o];
            memcpy(x, &sum, sizeof sum);
        }
        if (memcmp(got + (size_t)o * es, x, es) != 0) {
            fail_msg("%s %s[%lld,%lld] @ [%lld,%lld] (flags %d%d) accumulated: element (%lld, "
                     "%lld) is %.17g, the in-order sum plus c is %.17g",
                     nbi_use_avx2() ? "avx2" : "baseline", nb_dtype_name(dt), (long long)m,
                     (long long)k, (long long)k, (long long)n, ta, tb, (long long)(o / n),
                     (long long)(o % n), lt_get_f(dt, got, o), lt_get_f(dt, x, 0));
        }
    }
    free(acc);
    free(got);
    free(abuf);
    free(bbuf);
    free(cbuf);
    free(want);
    free(scratch);
}

/* Every m and n in 1..37 (whole vectors, vector tails and scalar tails of 4- and 8-lane
 * vectors, row remainders of every tile) with k from 1 (where a "transposed" operand has
 * unit strides both ways) through sizes that leave remainders in the 8x8 and 4x4 packing
 * blocks, all four transpose flags, f32 and f64, in the baseline and the AVX2 loops. Then
 * larger ones: an a too large to be copied transposed for the column tail, and products
 * cut into row blocks (over 1024 rows) and column blocks (over 128 columns), each block
 * with its own copies in the same scratch; and outer products (k = 1), which nabla's loop
 * computes at any size, in blocks of whole rows. Each also accumulated (lt_small_case). */
static void test_matmul_small_bits(void **state) {
    (void)state;
    static const int64_t ks[] = {1, 2, 5, 8, 16, 37};
    static const nb_dtype dts[] = {NB_DTYPE_F32, NB_DTYPE_F64};
    int saved = nbi_isa_override;
    for (int isa = 0; isa < 2; isa++) {
        nbi_isa_override = isa == 0 ? 0 : -1;
        for (int d = 0; d < 2; d++) {
            lt_env e;
            lt_begin(&e);
            for (int64_t m = 1; m <= 37; m++) {
                for (int64_t n = 1; n <= 37; n++) {
                    for (size_t q = 0; q < sizeof ks / sizeof ks[0]; q++) {
                        if (m * n * ks[q] > LT_SMALL) {
                            continue;
                        }
                        for (int t = 0; t < 4; t++) {
                            lt_small_case(&e, dts[d], m, ks[q], n, t & 1, t >> 1);
                        }
                    }
                }
                nbi_trace_release(&e.tr); /* keep the trace small */
                NBT_OK(e.ctx, nbi_trace_init(&e.tr, e.ctx, "test"));
            }
            static const int64_t big[][3] = {{64, 80, 3},     {130, 40, 5},  {1030, 3, 5},
                                             {1100, 2, 9},    {8, 4, 300},   {5, 3, 700},
                                             {1000, 1, 1000}, {1030, 1, 37}, {3, 1, 2053}};
            for (size_t q = 0; q < sizeof big / sizeof big[0]; q++) {
                for (int t = 0; t < 4; t++) {
                    lt_small_case(&e, dts[d], big[q][0], big[q][1], big[q][2], t & 1, t >> 1);
                }
            }
            lt_end(&e);
        }
    }
    nbi_isa_override = saved;
    if (!nbi_use_avx2()) {
        print_message("note: this CPU has no AVX2; both runs used the baseline loops\n");
    }
}

/* ---- accumulation and matrix-vector products through BLIS ---------------------------- */

/* Check an accumulated w = c + a @ b (w from lt_acc_node, operands rank 2 or a rank-1 a/b as
 * numpy promotes them, stored transposed per w's flags) against a double-precision c + sum:
 * |got - ref| <= rel * (k * max_p |a_ip b_pj| + |c|). */
static void lt_check_acc(const nb_var *w, const void *out, const void *a, const void *b,
                         const void *c) {
    const nb_var *x = w->in[0], *y = w->in[1];
    bool ta = w->at.axes[0] && x->rank >= 2, tb = w->at.axes[1] && y->rank >= 2;
    int64_t m = x->rank >= 2 ? x->shape[ta ? 1 : 0] : 1, k = x->shape[x->rank - (ta ? 2 : 1)];
    int64_t n = y->rank >= 2 ? y->shape[tb ? 0 : 1] : 1;
    nb_dtype dt = w->dtype;
    double rel = dt == NB_DTYPE_F32 ? 1e-5 : 1e-12;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double sum = 0, mx = 0;
            for (int64_t p = 0; p < k; p++) {
                double t = lt_get_f(dt, a, ta ? p * m + i : i * k + p) *
                           lt_get_f(dt, b, tb ? j * k + p : p * n + j);
                sum += t;
                mx = fabs(t) > mx ? fabs(t) : mx;
            }
            double cv = lt_get_f(dt, c, i * n + j), got = lt_get_f(dt, out, i * n + j);
            double tol = rel * ((double)k * mx + fabs(cv));
            if (!(fabs(got - (sum + cv)) <= tol)) {
                fail_msg("(%lld, %lld): got %.17g, want %.17g (tol %g)", (long long)i, (long long)j,
                         got, sum + cv, tol);
            }
        }
    }
}

/* a @ b + c through BLIS -- gemm (one block and several; k past BLIS's 256-deep k-blocks),
 * gemv for a matrix-vector product (n == 1 or m == 1, the matrix read by rows or by
 * columns) -- and integer products: exactly the product made alone plus c (floats rounded
 * once more, integers wrapping), and within tolerance of the double reference. Every
 * accumulating product may be planned in place, and in place (the output is c's buffer:
 * BLIS makes the block's product in scratch, then adds it into c) gives the same bits
 * (lt_run_acc2). */
static void test_matmul_accumulate(void **state) {
    (void)state;
    const struct {
        int64_t m, k, n;
        int ta, tb;
    } sh[] = {{64, 48, 40, 0, 0},
              {300, 40, 300, 1, 0},
              {200, 600, 70, 0, 1},
              {40, 300, 1, 0, 0},
              {600, 300, 1, 1, 0},
              {1, 300, 700, 0, 0},
              {1, 300, 700, 0, 1},
              {1, 400, 1, 0, 0},
              {1100, 30, 3, 0, 0},
              /* last column blocks one wide */
              {64, 48, 129, 0, 0},
              {300, 40, 257, 1, 0},
              {200, 600, 129, 0, 0},
              {1000, 300, 257, 0, 1},
              {130, 129, 129, 0, 0}};
    for (size_t q = 0; q < sizeof sh / sizeof sh[0]; q++) {
        for (int d = 0; d < LT_N_NUMERIC; d++) {
            nb_dtype dt = lt_numeric[d];
            int64_t m = sh[q].m, k = sh[q].k, n = sh[q].n;
            lt_env e;
            lt_begin(&e);
            int64_t sa[2] = {sh[q].ta ? k : m, sh[q].ta ? m : k};
            int64_t sb[2] = {sh[q].tb ? n : k, sh[q].tb ? k : n};
            nb_var *in[2] = {lt_param(&e, 0, dt, 2, sa), lt_param(&e, 1, dt, 2, sb)};
            nbi_attrs at;
            memset(&at, 0, sizeof at);
            at.axes[0] = sh[q].ta;
            at.axes[1] = sh[q].tb;
            nb_var *v = nbi_emit(&e.tr, NBI_OP_MATMUL, 2, in, &at);
            nb_var *w = lt_acc_node(&e, v, 2);
            NBT_TRUE(nbi_matmul_acc_in_place(w));
            size_t es = nb_dtype_size(dt), bytes = (size_t)(m * n) * es;
            void *abuf = lt_alloc((size_t)(m * k) * es), *bbuf = lt_alloc((size_t)(k * n) * es);
            void *c = lt_alloc(bytes), *o1 = lt_alloc(bytes), *o2 = lt_alloc(bytes);
            void *i1 = lt_alloc(bytes), *i2 = lt_alloc(bytes), *p = lt_alloc(bytes);
            lt_fill(dt, abuf, m * k, 100 + q);
            lt_fill(dt, bbuf, k * n, 200 + q);
            lt_fill(dt, c, m * n, 300 + q);
            lt_run_acc2(w, o1, i1, abuf, bbuf, c);
            lt_run_acc2(w, o2, i2, abuf, bbuf, c);
            NBT_TRUE(memcmp(o1, o2, bytes) == 0);
            NBT_TRUE(memcmp(i1, o1, bytes) == 0); /* in place: the same bits */
            lt_run(v, p, abuf, bbuf);
            for (int64_t i = 0; i < m * n; i++) {
                bool same;
                if (dt == NB_DTYPE_F32) {
                    float x = ((const float *)p)[i] + ((const float *)c)[i];
                    same = memcmp(&x, (const float *)o1 + i, 4) == 0;
                } else if (dt == NB_DTYPE_F64) {
                    double x = ((const double *)p)[i] + ((const double *)c)[i];
                    same = memcmp(&x, (const double *)o1 + i, 8) == 0;
                } else { /* wrapping */
                    uint64_t x = lt_get_u(dt, p, i) + lt_get_u(dt, c, i);
                    x = dt == NB_DTYPE_I32 ? (uint64_t)(int64_t)(int32_t)(uint32_t)x : x;
                    same = lt_get_u(dt, o1, i) == x;
                }
                if (!same) {
                    fail_msg("%s [%lld,%lld] @ [%lld,%lld] accumulated: element %lld is not the "
                             "product plus c",
                             nb_dtype_name(dt), (long long)m, (long long)k, (long long)k,
                             (long long)n, (long long)i);
                }
            }
            if (nb_dtype_is_float(dt)) {
                lt_check_acc(w, o1, abuf, bbuf, c);
                lt_check_acc(w, i1, abuf, bbuf, c);
            }
            void *bufs[] = {abuf, bbuf, c, o1, o2, i1, i2, p};
            for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; b++) {
                free(bufs[b]);
            }
            lt_end(&e);
        }
    }
}

/* k = 0 accumulated: c + 0 (a -0 in c comes out +0, as from add(zeros, c)); integers: c. */
static void test_matmul_accumulate_k_zero(void **state) {
    (void)state;
    for (int d = 0; d < LT_N_NUMERIC; d++) {
        nb_dtype dt = lt_numeric[d];
        lt_env e;
        lt_begin(&e);
        nb_var *a = lt_param(&e, 0, dt, 2, (int64_t[]){2, 0});
        nb_var *b = lt_param(&e, 1, dt, 2, (int64_t[]){0, 3});
        nb_var *w = lt_acc_node(&e, nb_matmul(a, b), 2);
        unsigned char c[6 * 8], out[6 * 8];
        lt_fill(dt, c, 6, 9);
        if (dt == NB_DTYPE_F32) {
            ((float *)c)[0] = -0.0f;
        } else if (dt == NB_DTYPE_F64) {
            ((double *)c)[0] = -0.0;
        }
        lt_run_acc(w, out, NULL, NULL, c);
        for (int64_t i = 0; i < 6; i++) {
            if (nb_dtype_is_float(dt)) {
                double x = lt_get_f(dt, out, i), y = lt_get_f(dt, c, i);
                NBT_TRUE(x == y);
                NBT_TRUE(!signbit(x) || (i != 0 && signbit(y)));
            } else {
                NBT_EQ_I64((int64_t)lt_get_u(dt, out, i), (int64_t)lt_get_u(dt, c, i));
            }
        }
        lt_end(&e);
    }
}

/* A matrix-vector product of more than NBI_MM_SMALL multiply-adds is BLIS's gemv, called
 * exactly as below: the same bits as a direct call -- the matrix read by rows (dot products;
 * nabla cuts it into blocks of 256 outputs, so that 600 rows are three calls) or by columns
 * (one call) -- and, accumulated, those bits plus c. */
static void test_matmul_gemv_bits(void **state) {
    (void)state;
    const struct {
        int64_t m, k, n;
        int ta, tb;
    } sh[] = {{600, 300, 1, 0, 0}, {600, 300, 1, 1, 0}, {1, 300, 700, 0, 0}, {1, 300, 700, 0, 1}};
    for (size_t q = 0; q < sizeof sh / sizeof sh[0]; q++) {
        for (int d = 0; d < 2; d++) {
            nb_dtype dt = d ? NB_DTYPE_F64 : NB_DTYPE_F32;
            int64_t m = sh[q].m, k = sh[q].k, n = sh[q].n;
            lt_env e;
            lt_begin(&e);
            int64_t sa[2] = {sh[q].ta ? k : m, sh[q].ta ? m : k};
            int64_t sb[2] = {sh[q].tb ? n : k, sh[q].tb ? k : n};
            /* rank-1 vectors, as nabla's gradients have them: [m, k] @ [k], [k] @ [k, n] */
            nb_var *in[2] = {m == 1 ? lt_param(&e, 0, dt, 1, &k) : lt_param(&e, 0, dt, 2, sa),
                             n == 1 ? lt_param(&e, 1, dt, 1, &k) : lt_param(&e, 1, dt, 2, sb)};
            nbi_attrs at;
            memset(&at, 0, sizeof at);
            at.axes[0] = sh[q].ta;
            at.axes[1] = sh[q].tb;
            nb_var *v = nbi_emit(&e.tr, NBI_OP_MATMUL, 2, in, &at);
            NBT_OK(e.ctx, nb_trace_status(&e.tr));
            nb_var *w = lt_acc_node(&e, v, 2);
            size_t es = nb_dtype_size(dt), bytes = (size_t)(m * n) * es;
            unsigned char *abuf = lt_alloc((size_t)(m * k) * es);
            unsigned char *bbuf = lt_alloc((size_t)(k * n) * es), *c = lt_alloc(bytes);
            unsigned char *o = lt_alloc(bytes), *want = lt_alloc(bytes), *wacc = lt_alloc(bytes);
            lt_fill(dt, abuf, m * k, 7 + q);
            lt_fill(dt, bbuf, k * n, 8 + q);
            lt_fill(dt, c, m * n, 9 + q);
            rntm_t rntm = BLIS_RNTM_INITIALIZER;
            bli_rntm_set_num_threads(1, &rntm);
            /* y = A x: A m x k for n == 1; for m == 1, y^T = B^T a^T with B k x n */
            trans_t tr = n == 1 ? BLIS_NO_TRANSPOSE : BLIS_TRANSPOSE;
            dim_t rows = n == 1 ? m : k, cols = n == 1 ? k : n;
            void *given = n == 1 ? (void *)abuf : (void *)bbuf, *vec = n == 1 ? bbuf : abuf;
            inc_t grs = n == 1 ? (sh[q].ta ? 1 : k) : (sh[q].tb ? 1 : n);
            inc_t gcs = n == 1 ? (sh[q].ta ? m : 1) : (sh[q].tb ? k : 1);
            /* nabla hands BLIS the matrix row-stored (one stored transposed is copied first:
             * BLIS's order depends on the storage), so: gemv on its row-major copy */
            void *mat = lt_alloc((size_t)(rows * cols) * es);
            for (int64_t i = 0; i < rows; i++) {
                for (int64_t j = 0; j < cols; j++) {
                    memcpy((unsigned char *)mat + (size_t)(i * cols + j) * es,
                           (unsigned char *)given + (size_t)(i * grs + j * gcs) * es, es);
                }
            }
            inc_t rs = cols, cs = 1;
            if (dt == NB_DTYPE_F32) {
                float one = 1, zero = 0;
                bli_sgemv_ex(tr, BLIS_NO_CONJUGATE, rows, cols, &one, mat, rs, cs, vec, 1, &zero,
                             (void *)want, 1, NULL, &rntm);
                for (int64_t i = 0; i < m * n; i++) {
                    ((float *)wacc)[i] = ((float *)want)[i] + ((float *)c)[i];
                }
            } else {
                double one = 1, zero = 0;
                bli_dgemv_ex(tr, BLIS_NO_CONJUGATE, rows, cols, &one, mat, rs, cs, vec, 1, &zero,
                             (void *)want, 1, NULL, &rntm);
                for (int64_t i = 0; i < m * n; i++) {
                    ((double *)wacc)[i] = ((double *)want)[i] + ((double *)c)[i];
                }
            }
            lt_poison_fill(dt, o, m * n);
            lt_run(v, o, abuf, bbuf);
            if (memcmp(o, want, bytes) != 0) {
                fail_msg("%s [%lld,%lld]%s @ [%lld,%lld]%s: not BLIS's gemv bits",
                         nb_dtype_name(dt), (long long)m, (long long)k, sh[q].ta ? "^T" : "",
                         (long long)k, (long long)n, sh[q].tb ? "^T" : "");
            }
            lt_run_acc(w, o, abuf, bbuf, c);
            if (memcmp(o, wacc, bytes) != 0) {
                fail_msg("%s [%lld,%lld] @ [%lld,%lld] accumulated: not gemv's bits plus c",
                         nb_dtype_name(dt), (long long)m, (long long)k, (long long)k, (long long)n);
            }
            lt_check_acc(w, o, abuf, bbuf, c);
            free(abuf);
            free(bbuf);
            free(c);
            free(o);
            free(want);
            free(wacc);
            free(mat);
            lt_end(&e);
        }
    }
}

/* ---- errors ------------------------------------------------------------------------- */

static void test_matmul_bool_rejected(void **state) {
    (void)state;
    lt_expect_error(NB_DTYPE_BOOL, 2, (int64_t[]){2, 3}, NB_DTYPE_BOOL, 2, (int64_t[]){3, 4}, false,
                    NB_ERR_DTYPE,
                    "nb_matmul: operands are bool[2,3] and bool[3,4]; a matrix product needs a "
                    "numeric dtype (f32, f64, i32 or i64; use nb_cast) (in 'test')",
                    NULL);
    lt_expect_error(NB_DTYPE_BOOL, 1, (int64_t[]){3}, NB_DTYPE_BOOL, 1, (int64_t[]){3}, true,
                    NB_ERR_DTYPE, NULL, "nb_dot: operands are bool[3] and bool[3]");
}

static void test_matmul_dtype_mismatch(void **state) {
    (void)state;
    lt_expect_error(NB_DTYPE_F32, 2, (int64_t[]){2, 3}, NB_DTYPE_F64, 2, (int64_t[]){3, 4}, false,
                    NB_ERR_DTYPE,
                    "nb_matmul: dtypes differ: f32[2,3] and f64[3,4] (convert one with nb_cast) "
                    "(in 'test')",
                    NULL);
    lt_expect_error(NB_DTYPE_I32, 2, (int64_t[]){2, 3}, NB_DTYPE_I64, 2, (int64_t[]){3, 4}, false,
                    NB_ERR_DTYPE, NULL, "dtypes differ: i32[2,3] and i64[3,4]");
    lt_expect_error(NB_DTYPE_F32, 1, (int64_t[]){3}, NB_DTYPE_F64, 1, (int64_t[]){3}, true,
                    NB_ERR_DTYPE, NULL, "nb_dot: dtypes differ: f32[3] and f64[3]");
}

static void test_matmul_inner_dim_message(void **state) {
    (void)state;
    /* the house-style example, word for word */
    lt_expect_error(NB_DTYPE_F32, 2, (int64_t[]){128, 784}, NB_DTYPE_F32, 2, (int64_t[]){256, 784},
                    false, NB_ERR_SHAPE,
                    "nb_matmul: f32[128,784] @ f32[256,784]: inner dims 784 != 256 (did you mean "
                    "to transpose the second operand?) (in 'test')",
                    NULL);
    lt_expect_error(NB_DTYPE_F32, 2, (int64_t[]){784, 128}, NB_DTYPE_F32, 2, (int64_t[]){784, 256},
                    false, NB_ERR_SHAPE,
                    "nb_matmul: f32[784,128] @ f32[784,256]: inner dims 128 != 784 (did you mean "
                    "to transpose the first operand?) (in 'test')",
                    NULL);
    lt_expect_error(NB_DTYPE_F64, 2, (int64_t[]){2, 3}, NB_DTYPE_F64, 2, (int64_t[]){4, 5}, false,
                    NB_ERR_SHAPE,
                    "nb_matmul: f64[2,3] @ f64[4,5]: inner dims 3 != 4 (the last dim of the "
                    "first operand must equal the second-to-last dim of the second) (in 'test')",
                    NULL);
    lt_expect_error(NB_DTYPE_F64, 2, (int64_t[]){2, 3}, NB_DTYPE_F64, 1, (int64_t[]){4}, false,
                    NB_ERR_SHAPE, NULL, "f64[2,3] @ f64[4]: inner dims 3 != 4");
    lt_expect_error(NB_DTYPE_I32, 1, (int64_t[]){3}, NB_DTYPE_I32, 2, (int64_t[]){4, 3}, false,
                    NB_ERR_SHAPE, NULL,
                    "i32[3] @ i32[4,3]: inner dims 3 != 4 (did you mean to transpose the "
                    "second operand?)");
    lt_expect_error(NB_DTYPE_F32, 3, (int64_t[]){5, 2, 3}, NB_DTYPE_F32, 3, (int64_t[]){5, 2, 3},
                    false, NB_ERR_SHAPE, NULL, "f32[5,2,3] @ f32[5,2,3]: inner dims 3 != 2");
    lt_expect_error(NB_DTYPE_F32, 1, (int64_t[]){3}, NB_DTYPE_F32, 1, (int64_t[]){4}, true,
                    NB_ERR_SHAPE, "nb_dot: f32[3] and f32[4]: lengths 3 != 4 (in 'test')", NULL);
}

static void test_matmul_rank0_error(void **state) {
    (void)state;
    lt_expect_error(NB_DTYPE_F32, 0, NULL, NB_DTYPE_F32, 2, (int64_t[]){3, 4}, false, NB_ERR_SHAPE,
                    "nb_matmul: f32[] @ f32[3,4]: the first operand is rank 0; matmul needs "
                    "rank >= 1 (to scale by a scalar use nb_mul) (in 'test')",
                    NULL);
    lt_expect_error(NB_DTYPE_F64, 1, (int64_t[]){3}, NB_DTYPE_F64, 0, NULL, false, NB_ERR_SHAPE,
                    NULL, "the second operand is rank 0");
    lt_expect_error(NB_DTYPE_F64, 0, NULL, NB_DTYPE_F64, 0, NULL, false, NB_ERR_SHAPE, NULL,
                    "rank 0");
    /* nb_dot wants rank 1 exactly */
    lt_expect_error(NB_DTYPE_F32, 0, NULL, NB_DTYPE_F32, 1, (int64_t[]){3}, true, NB_ERR_SHAPE,
                    NULL, "nb_dot: f32[] and f32[3]: both operands must be rank 1");
    lt_expect_error(NB_DTYPE_F32, 2, (int64_t[]){2, 3}, NB_DTYPE_F32, 1, (int64_t[]){3}, true,
                    NB_ERR_SHAPE, NULL,
                    "nb_dot: f32[2,3] and f32[3]: both operands must be rank 1");
}

static void test_matmul_batch_mismatch(void **state) {
    (void)state;
    lt_expect_error(NB_DTYPE_F32, 3, (int64_t[]){2, 3, 4}, NB_DTYPE_F32, 3, (int64_t[]){5, 4, 6},
                    false, NB_ERR_SHAPE,
                    "nb_matmul: f32[2,3,4] @ f32[5,4,6]: batch dims [2] and [5] do not broadcast "
                    "(aligned from the right, each pair must be equal or contain a 1; reshape or "
                    "nb_expand_dims one operand) (in 'test')",
                    NULL);
    lt_expect_error(NB_DTYPE_F32, 4, (int64_t[]){7, 2, 3, 4}, NB_DTYPE_F32, 4,
                    (int64_t[]){7, 3, 4, 6}, false, NB_ERR_SHAPE, NULL,
                    "batch dims [7,2] and [7,3] do not broadcast");
}

/* Errors are sticky: after one, matmul returns poison without a new message; NULL inputs
 * are recorded as misuse; a trace-less call returns NULL. */
static void test_matmul_poison_and_null(void **state) {
    (void)state;
    lt_env e;
    lt_begin(&e);
    nb_var *a = lt_param(&e, 0, NB_DTYPE_F32, 2, (int64_t[]){2, 3});
    nb_var *b = lt_param(&e, 1, NB_DTYPE_F32, 2, (int64_t[]){4, 5});
    nb_var *bad = nb_matmul(a, b);
    NBT_TRUE(nb_var_is_poison(bad));
    char first[512];
    snprintf(first, sizeof first, "%s", nb_ctx_errmsg(e.ctx));
    NBT_TRUE(strstr(first, "inner dims 3 != 4") != NULL);
    nb_var *c = lt_param(&e, 2, NB_DTYPE_F32, 2, (int64_t[]){3, 2});
    NBT_TRUE(nb_matmul(bad, c) == e.tr.poison);
    NBT_TRUE(nb_matmul(a, c) == e.tr.poison); /* the trace already failed */
    NBT_TRUE(nb_dot(bad, bad) == e.tr.poison);
    NBT_STREQ(nb_ctx_errmsg(e.ctx), first);
    NBT_STATUS(e.ctx, NB_ERR_SHAPE, nb_trace_status(&e.tr));
    lt_end(&e);

    lt_begin(&e);
    a = lt_param(&e, 0, NB_DTYPE_F32, 2, (int64_t[]){2, 3});
    NBT_TRUE(nb_matmul(a, NULL) == e.tr.poison);
    NBT_STATUS(e.ctx, NB_ERR_MISUSE, nb_trace_status(&e.tr));
    NBT_ERRMSG_HAS(e.ctx, "nb_matmul: input 1 is a NULL var");
    lt_end(&e);

    lt_begin(&e);
    a = lt_param(&e, 0, NB_DTYPE_F32, 1, (int64_t[]){3});
    NBT_TRUE(nb_dot(NULL, a) == e.tr.poison);
    NBT_STATUS(e.ctx, NB_ERR_MISUSE, nb_trace_status(&e.tr));
    lt_end(&e);

    NBT_TRUE(nb_matmul(NULL, NULL) == NULL);
    NBT_TRUE(nb_dot(NULL, NULL) == NULL);
}

/* Vars of two different traces cannot be multiplied. */
static void test_matmul_foreign_trace(void **state) {
    (void)state;
    lt_env e1, e2;
    lt_begin(&e1);
    lt_begin(&e2);
    nb_var *a = lt_param(&e1, 0, NB_DTYPE_F32, 1, (int64_t[]){3});
    nb_var *b = lt_param(&e2, 0, NB_DTYPE_F32, 1, (int64_t[]){3});
    NBT_TRUE(nb_dot(a, b) == e1.tr.poison);
    NBT_STATUS(e1.ctx, NB_ERR_INVALID, nb_trace_status(&e1.tr));
    NBT_ERRMSG_HAS(e1.ctx, "belongs to another trace");
    NBT_OK(e2.ctx, nb_trace_status(&e2.tr));
    lt_end(&e2);
    lt_end(&e1);
}

/* ---- VJP and JVP rules -------------------------------------------------------------- */

/* matmul is bilinear, so its rules can be checked exactly rather than by finite
 * differences: with f(a, b) = a @ b run forward through nabla, the cotangent of a at element
 * k is <ct, f(e_k, b)>, that of b is <ct, f(a, e_k)>, and the tangent is f(da, b) + f(a, db).
 * self = (ta, tb): the operand flags "stored transposed", set here on the node directly as
 * the optimizer's transpose-matmul pass would (rules must be right with them set too). */
static nb_status lt_body_mm(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t ta = 0, tb = 0;
    nb_tree_get_int(nb_tree_child(self, 0), &ta);
    nb_tree_get_int(nb_tree_child(self, 1), &tb);
    nb_var *in[2] = {nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]")};
    if (ta == 0 && tb == 0) {
        return nb_return(nb_matmul(in[0], in[1]), out);
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.axes[0] = (int32_t)ta;
    at.axes[1] = (int32_t)tb;
    return nb_return(nbi_emit(tr, NBI_OP_MATMUL, 2, in, &at), out);
}

static nb_array *lt_arr(nb_ctx *ctx, int rank, const int64_t *shape, uint64_t seed) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, rank, shape, &a));
    if (seed != 0) {
        lt_fill(NB_DTYPE_F64, nb_array_data(a), nb_array_size(a), seed);
    }
    return a;
}

static nb_tree *lt_pair(nb_ctx *ctx, nb_array *a, nb_array *b) {
    nb_tree *la = NULL, *lb = NULL, *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &la));
    NBT_OK(ctx, nb_tree_array(b, &lb));
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){la, lb}, &t));
    nb_tree_destroy(la);
    nb_tree_destroy(lb);
    return t;
}

/* f(a, b) as a new array */
static nb_array *lt_call(nb_fn *f, nb_array *a, nb_array *b) {
    nb_ctx *ctx = nb_array_ctx(a);
    nb_tree *args = lt_pair(ctx, a, b), *out = NULL;
    NBT_OK(ctx, nb_fn_call(f, args, &out));
    nb_array *y = nb_array_retain(nb_tree_get_array(out));
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    return y;
}

static double lt_dot(const nb_array *x, const nb_array *y, double *abs_sum) {
    const double *p = nb_array_data(x), *q = nb_array_data(y);
    double s = 0;
    for (int64_t i = 0; i < nb_array_size(x); i++) {
        s += p[i] * q[i];
        *abs_sum += fabs(p[i] * q[i]);
    }
    return s;
}

static void lt_grad_case(int ra, const int64_t *sa, int rb, const int64_t *sb, int ta, int tb) {
    nb_ctx *ctx = nbt_ctx();
    nb_tree *fl[2] = {NULL, NULL}, *self = NULL;
    NBT_OK(ctx, nb_tree_int(ctx, ta, &fl[0]));
    NBT_OK(ctx, nb_tree_int(ctx, tb, &fl[1]));
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, fl, &self));
    nb_fn *f = NULL, *vf = NULL, *jf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "mm", lt_body_mm, self, &f));
    NBT_OK(ctx, nb_vjp(f, &vf));
    NBT_OK(ctx, nb_jvp(f, &jf));
    nb_array *a = lt_arr(ctx, ra, sa, 11), *b = lt_arr(ctx, rb, sb, 12);
    nb_array *da = lt_arr(ctx, ra, sa, 13), *db = lt_arr(ctx, rb, sb, 14);
    nb_array *y = lt_call(f, a, b);
    nb_array *ct = lt_arr(ctx, nb_array_rank(y), nb_array_shape(y), 15);
    /* vjp: ((a, b), ct) -> (y, (ct_a, ct_b)) */
    nb_tree *ab = lt_pair(ctx, a, b), *ctl = NULL, *vargs = NULL, *vout = NULL;
    NBT_OK(ctx, nb_tree_array(ct, &ctl));
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){ab, ctl}, &vargs));
    NBT_OK(ctx, nb_fn_call(vf, vargs, &vout));
    for (int j = 0; j < 2; j++) {
        nb_array *x = j ? b : a;
        nb_array *g = nb_tree_get_array(nb_tree_child(nb_tree_child(vout, 1), j));
        NBT_TRUE(g != NULL && nb_array_rank(g) == nb_array_rank(x));
        for (int d = 0; d < nb_array_rank(x); d++) {
            NBT_EQ_I64(nb_array_dim(g, d), nb_array_dim(x, d));
        }
        nb_array *e = lt_arr(ctx, nb_array_rank(x), nb_array_shape(x), 0);
        for (int64_t k = 0; k < nb_array_size(x); k++) {
            ((double *)nb_array_data(e))[k] = 1.0;
            nb_array *fe = j ? lt_call(f, a, e) : lt_call(f, e, b);
            double scale = 0, want = lt_dot(ct, fe, &scale);
            double got = ((const double *)nb_array_data(g))[k];
            if (!(fabs(got - want) <= 1e-13 * fmax(1.0, scale))) {
                fail_msg("matmul vjp (ta=%d tb=%d): ct of operand %d [%lld] = %.17g, want %.17g",
                         ta, tb, j, (long long)k, got, want);
            }
            nb_array_destroy(fe);
            ((double *)nb_array_data(e))[k] = 0.0;
        }
        nb_array_destroy(e);
    }
    /* jvp: ((a, b), (da, db)) -> (y, f(da, b) + f(a, db)) */
    nb_tree *dab = lt_pair(ctx, da, db), *jargs = NULL, *jout = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){ab, dab}, &jargs));
    NBT_OK(ctx, nb_fn_call(jf, jargs, &jout));
    nb_array *t = nb_tree_get_array(nb_tree_child(jout, 1));
    nb_array *p = lt_call(f, da, b), *q = lt_call(f, a, db);
    NBT_EQ_I64(nb_array_size(t), nb_array_size(y));
    for (int64_t i = 0; i < nb_array_size(y); i++) {
        double want = ((double *)nb_array_data(p))[i] + ((double *)nb_array_data(q))[i];
        double got = ((double *)nb_array_data(t))[i];
        if (!(fabs(got - want) <= 1e-13 * fmax(1.0, fabs(want)) * 16)) {
            fail_msg("matmul jvp (ta=%d tb=%d): [%lld] = %.17g, want %.17g", ta, tb, (long long)i,
                     got, want);
        }
    }
    nb_array_destroy(p);
    nb_array_destroy(q);
    nb_tree_destroy(jout);
    nb_tree_destroy(jargs);
    nb_tree_destroy(dab);
    nb_tree_destroy(vout);
    nb_tree_destroy(vargs);
    nb_tree_destroy(ctl);
    nb_tree_destroy(ab);
    nb_array_destroy(ct);
    nb_array_destroy(y);
    nb_array_destroy(a);
    nb_array_destroy(b);
    nb_array_destroy(da);
    nb_array_destroy(db);
    nb_fn_destroy(jf);
    nb_fn_destroy(vf);
    nb_fn_destroy(f);
    nb_tree_destroy(self);
    nb_tree_destroy(fl[0]);
    nb_tree_destroy(fl[1]);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* numpy.matmul's cases: 2-d, rank-1 either side (promoted, the dim dropped again), batch
 * broadcasting both ways (cotangents summed over the broadcast batch dims), k = 0. */
static void test_matmul_grad_rules(void **state) {
    (void)state;
    lt_grad_case(2, (int64_t[]){3, 4}, 2, (int64_t[]){4, 2}, 0, 0);
    lt_grad_case(1, (int64_t[]){4}, 2, (int64_t[]){4, 2}, 0, 0);
    lt_grad_case(2, (int64_t[]){3, 4}, 1, (int64_t[]){4}, 0, 0);
    lt_grad_case(1, (int64_t[]){4}, 1, (int64_t[]){4}, 0, 0);
    lt_grad_case(4, (int64_t[]){2, 1, 2, 3}, 3, (int64_t[]){3, 3, 2}, 0, 0);
    lt_grad_case(2, (int64_t[]){3, 4}, 3, (int64_t[]){2, 4, 2}, 0, 0);
    lt_grad_case(1, (int64_t[]){3}, 3, (int64_t[]){2, 3, 2}, 0, 0);
    lt_grad_case(3, (int64_t[]){2, 2, 3}, 1, (int64_t[]){3}, 0, 0);
    lt_grad_case(2, (int64_t[]){3, 0}, 2, (int64_t[]){0, 2}, 0, 0);
}

/* The same with operands flagged as stored transposed (a as [.., k, m], b as [.., n, k]);
 * a rank-1 operand's flag has no effect. */
static void test_matmul_grad_rules_transposed_operands(void **state) {
    (void)state;
    lt_grad_case(2, (int64_t[]){4, 3}, 2, (int64_t[]){4, 2}, 1, 0);
    lt_grad_case(2, (int64_t[]){3, 4}, 2, (int64_t[]){2, 4}, 0, 1);
    lt_grad_case(2, (int64_t[]){4, 3}, 2, (int64_t[]){2, 4}, 1, 1);
    lt_grad_case(3, (int64_t[]){2, 4, 3}, 3, (int64_t[]){1, 2, 4}, 1, 1);
    lt_grad_case(1, (int64_t[]){4}, 2, (int64_t[]){2, 4}, 1, 1);
    lt_grad_case(2, (int64_t[]){4, 3}, 1, (int64_t[]){4}, 1, 1);
}

/* BLIS's own behaviour, as nabla's determinism argument relies on it (op_linalg.c): for
 * the products of an MLP step (forward, weight gradients with a stored transposed,
 * input gradients) in f32 and f64, BLIS run with 1, 2 and 4 threads of its own gives the
 * same bits -- it splits the m and n loops, never k. nabla still runs BLIS with one thread
 * per fixed block; this pins what BLIS 0.9 does, so that an upgrade that changes it shows
 * here. Linked to Debian's single-threaded BLIS (preferred when installed, FindBLIS.cmake)
 * the requests for 2 and 4 threads run on one, and the test checks only that. */
static void test_blis_threads_same_bits(void **state) {
    (void)state;
    const struct {
        int64_t m, n, k;
        bool ta;
    } sh[] = {{128, 256, 784, false}, {128, 10, 256, false}, {784, 256, 128, true},
              {256, 10, 128, true},   {128, 256, 10, false}, {300, 300, 300, false}};
    for (size_t q = 0; q < sizeof sh / sizeof sh[0]; q++) {
        for (int dt = 0; dt < 2; dt++) {
            int64_t m = sh[q].m, n = sh[q].n, k = sh[q].k;
            size_t es = dt ? 8 : 4;
            unsigned char *a = lt_alloc((size_t)(m * k) * es), *b = lt_alloc((size_t)(k * n) * es);
            unsigned char *c[3];
            lt_fill(dt ? NB_DTYPE_F64 : NB_DTYPE_F32, a, m * k, 31 + (int)q);
            lt_fill(dt ? NB_DTYPE_F64 : NB_DTYPE_F32, b, k * n, 41 + (int)q);
            inc_t rsa = sh[q].ta ? 1 : k, csa = sh[q].ta ? m : 1;
            for (int t = 0; t < 3; t++) {
                c[t] = lt_alloc((size_t)(m * n) * es);
                rntm_t rntm = BLIS_RNTM_INITIALIZER;
                bli_rntm_set_num_threads(t == 0 ? 1 : 2 * t, &rntm);
                if (dt) {
                    double one = 1, zero = 0;
                    bli_dgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one, (double *)a,
                                 rsa, csa, (double *)b, n, 1, &zero, (double *)c[t], n, 1, NULL,
                                 &rntm);
                } else {
                    float one = 1, zero = 0;
                    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one, (float *)a,
                                 rsa, csa, (float *)b, n, 1, &zero, (float *)c[t], n, 1, NULL,
                                 &rntm);
                }
            }
            for (int t = 1; t < 3; t++) {
                if (memcmp(c[0], c[t], (size_t)(m * n) * es) != 0) {
                    fail_msg("BLIS %lldx%lld @ %lldx%lld %s%s: %d threads differ from 1",
                             (long long)m, (long long)k, (long long)k, (long long)n,
                             dt ? "f64" : "f32", sh[q].ta ? " (a transposed)" : "", 2 * t);
                }
            }
            for (int t = 0; t < 3; t++) {
                free(c[t]);
            }
            free(a);
            free(b);
        }
    }
}

/* The rules of the accumulating form matmul(a, b, c), which only the optimizer makes (after
 * differentiation, so they never run there; kept right all the same), checked on the IR
 * they emit: the cotangent of c is the output's own, a and b get cotangents of their
 * shapes (the plain product's rules, checked above); the tangent is the plain product's
 * plus dc, or dc alone. */
static void test_matmul_accumulate_rules(void **state) {
    (void)state;
    lt_env e;
    lt_begin(&e);
    nb_var *a = lt_param(&e, 0, NB_DTYPE_F64, 2, (int64_t[]){4, 3});
    nb_var *b = lt_param(&e, 1, NB_DTYPE_F64, 2, (int64_t[]){3, 5});
    nb_var *v = nb_matmul(a, b);
    nb_var *w = lt_acc_node(&e, v, 2);
    nb_var *ct = lt_param(&e, 3, NB_DTYPE_F64, 2, (int64_t[]){4, 5});
    nb_var *da = lt_param(&e, 4, NB_DTYPE_F64, 2, (int64_t[]){4, 3});
    const nbi_op_info *info = nbi_op_get(NBI_OP_MATMUL);
    nb_var *in_ct[3] = {NULL, NULL, NULL};
    info->vjp(&e.tr, w, ct, in_ct);
    NBT_OK(e.ctx, nb_trace_status(&e.tr));
    NBT_TRUE(in_ct[2] == ct);
    NBT_TRUE(in_ct[0] != NULL && in_ct[0]->rank == 2 && in_ct[0]->shape[0] == 4 &&
             in_ct[0]->shape[1] == 3);
    NBT_TRUE(in_ct[1] != NULL && in_ct[1]->rank == 2 && in_ct[1]->shape[0] == 3 &&
             in_ct[1]->shape[1] == 5);
    nb_var *tan[3] = {da, NULL, ct}; /* ct stands in for dc: any [4, 5] */
    nb_var *t = info->jvp(&e.tr, w, tan);
    NBT_OK(e.ctx, nb_trace_status(&e.tr));
    NBT_TRUE(t != NULL && t->op == NBI_OP_ADD && t->in[1] == ct);
    NBT_TRUE(t->in[0]->op == NBI_OP_MATMUL && t->in[0]->in[0] == da && t->in[0]->in[1] == b);
    nb_var *only_c[3] = {NULL, NULL, ct};
    NBT_TRUE(info->jvp(&e.tr, w, only_c) == ct);
    nb_var *none[3] = {NULL, NULL, NULL};
    NBT_TRUE(info->jvp(&e.tr, w, none) == NULL);
    lt_end(&e);
}

/* A batched product of constants, folded at compile time: iota f64[5,3] @ iota f64[5,3,1]
 * (a broadcast batch, no scratch). Folding runs the kernel without a scratch buffer; the
 * kernel offset a NULL scratch pointer per worker (undefined behaviour: clang's
 * -fsanitize=pointer-overflow, which the sanitizer build has, reports it). */
static nb_status body_folded_bmm(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    (void)self;
    (void)args;
    nb_var *a = nb_iota(tr, NB_DTYPE_F64, 2, (int64_t[]){5, 3}, 1);
    nb_var *b = nb_iota(tr, NB_DTYPE_F64, 3, (int64_t[]){5, 3, 1}, 0);
    return nb_return(nb_matmul(a, b), out);
}

/* self: (ta, tb, acc) ints. args: (a, b[, c]) -> matmul(ta ? a^T : a, tb ? b^T : b) [+ c] */
static nb_status body_tmm(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t ta = 0, tb = 0, acc = 0;
    nb_tree_get_int(nb_tree_child(self, 0), &ta);
    nb_tree_get_int(nb_tree_child(self, 1), &tb);
    nb_tree_get_int(nb_tree_child(self, 2), &acc);
    nb_var *x[2] = {nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]")};
    for (int j = 0; j < 2; j++) {
        int r = nb_var_rank(x[j]), perm[NB_MAX_RANK];
        for (int d = 0; d < r; d++) {
            perm[d] = d;
        }
        perm[r - 2] = r - 1;
        perm[r - 1] = r - 2;
        if (j == 0 ? ta : tb) {
            x[j] = nb_transpose(x[j], perm);
        }
    }
    nb_var *y = nb_matmul(x[0], x[1]);
    return nb_return(acc ? nb_add(y, nb_get(tr, args, "[2]")) : y, out);
}

/* args: (x) -> x with its last two axes swapped */
static nb_status body_swap(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    int r = nb_var_rank(x), perm[NB_MAX_RANK];
    for (int d = 0; d < r; d++) {
        perm[d] = d;
    }
    perm[r - 2] = r - 1;
    perm[r - 1] = r - 2;
    return nb_return(nb_transpose(x, perm), out);
}

static nb_tree *tmm_leaf(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape, uint64_t seed) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, dt, rank, shape, &a));
    int64_t n = nb_array_size(a);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double v = 0.25 + 1.25 * (double)(s >> 11) * 0x1.0p-53;
        if (dt == NB_DTYPE_F32) {
            ((float *)nb_array_data(a))[i] = (float)v;
        } else {
            ((double *)nb_array_data(a))[i] = v;
        }
    }
    nb_tree *l = NULL;
    NBT_OK(ctx, nb_tree_array(a, &l));
    nb_array_destroy(a);
    return l;
}

/* A transpose folded into the product (the jitted program: the transpose-matmul pass hands
 * the operand over stored transposed) gives the bits of the same product made from the
 * materialised transpose (the ops run one by one), for BLIS's products of every kind --
 * gemm of skinny and large shapes, several column blocks, gemv both ways, batches, with and
 * without an accumulator. BLIS sums differently over column-stored operands; nabla copies
 * them row-major first. (Found by fuzz_programs: 2 x 32771 @ 32771 x 2, f32, an ulp.) The
 * copies of 64K elements and more go along their rows (nbi_mm_pack_f32x8): 389 x 2051 @
 * 2051 x 37 has rows and columns left over past the 8 x 8 blocks in both operands. A
 * transposed matrix that a batch's products share is not folded (made once, not copied for
 * each product): the same bits too. */
static void test_matmul_transposed_same_bits(void **state) {
    (void)state;
    static const struct {
        int rank;
        int64_t bat, m, k, n;
        int shared; /* bit 0: a one matrix for the whole batch (rank 2); bit 1: b */
    } S[] = {{2, 1, 2, 32771, 2, 0},  {2, 1, 64, 128, 10, 0},  {2, 1, 128, 784, 256, 0},
             {2, 1, 10, 256, 300, 0}, {2, 1, 600, 300, 1, 0},  {2, 1, 1, 300, 700, 0},
             {3, 3, 40, 500, 60, 0},  {2, 1, 1100, 40, 20, 0}, {2, 1, 389, 2051, 37, 0},
             {3, 5, 144, 32, 64, 1},  {3, 5, 64, 32, 144, 2}};
    nb_ctx_opts co = nb_ctx_opts_default();
    co.n_threads = 2;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(&co, &ctx));
    nb_fn *swap = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "swap", body_swap, NULL, &swap));
    int checked = 0;
    for (size_t q = 0; q < sizeof S / sizeof S[0]; q++) {
        for (int d = 0; d < 2; d++) {
            for (int t = 1; t < 8; t++) { /* bit 0: a transposed, 1: b, 2: accumulated */
                nb_dtype dt = d ? NB_DTYPE_F64 : NB_DTYPE_F32;
                int ta = t & 1, tb = (t >> 1) & 1, acc = (t >> 2) & 1, r = S[q].rank;
                int64_t m = S[q].m, k = S[q].k, n = S[q].n, sa[3], sb[3], sc[3];
                int ra = S[q].shared & 1 ? 2 : r, rb = S[q].shared & 2 ? 2 : r;
                sa[0] = sb[0] = sc[0] = S[q].bat;
                sa[ra - 2] = ta ? k : m;
                sa[ra - 1] = ta ? m : k;
                sb[rb - 2] = tb ? n : k;
                sb[rb - 1] = tb ? k : n;
                sc[r - 2] = m;
                sc[r - 1] = n;
                nb_tree *la = tmm_leaf(ctx, dt, ra, sa, 2 * q + 1),
                        *lb = tmm_leaf(ctx, dt, rb, sb, 2 * q + 2),
                        *lc = tmm_leaf(ctx, dt, r, sc, 7);
                nb_tree *self = NULL, *iv[3] = {NULL, NULL, NULL};
                NBT_OK(ctx, nb_tree_int(ctx, ta, &iv[0]));
                NBT_OK(ctx, nb_tree_int(ctx, tb, &iv[1]));
                NBT_OK(ctx, nb_tree_int(ctx, acc, &iv[2]));
                self = nbt_tuple_take(ctx, 3, iv);
                nb_fn *f = NULL, *jf = NULL, *plain = NULL;
                NBT_OK(ctx, nb_fn_create(ctx, "tmm", body_tmm, self, &f));
                NBT_OK(ctx, nb_jit(f, NULL, &jf));
                nb_tree *args = NULL, *jout = NULL, *ea = NULL, *eb = NULL;
                NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){la, lb, lc}, &args));
                NBT_OK(ctx, nb_fn_call(jf, args, &jout));
                if ((S[q].shared & 1 && ta) || (S[q].shared & 2 && tb)) {
                    /* made once, not folded into each product */
                    static char ir[1 << 14];
                    NBT_OK(ctx, nb_fn_format_ir(jf, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
                    NBT_TRUE(strstr(ir, "= transpose") != NULL);
                    NBT_TRUE(strstr(ir, S[q].shared & 1 ? "transposed=[a" : "b]") == NULL);
                }
                /* op by op: the transposes made first, then the product of plain operands */
                nb_tree *xa = la, *xb = lb;
                if (ta) {
                    nb_tree *a1 = nbt_tuple_take(ctx, 1, (nb_tree *[]){nb_tree_retain(la)});
                    NBT_OK(ctx, nb_fn_call(swap, a1, &ea));
                    nb_tree_destroy(a1);
                    xa = ea;
                }
                if (tb) {
                    nb_tree *b1 = nbt_tuple_take(ctx, 1, (nb_tree *[]){nb_tree_retain(lb)});
                    NBT_OK(ctx, nb_fn_call(swap, b1, &eb));
                    nb_tree_destroy(b1);
                    xb = eb;
                }
                nb_tree *z[3] = {NULL, NULL, NULL}, *pself = NULL, *pargs = NULL, *pout = NULL;
                NBT_OK(ctx, nb_tree_int(ctx, 0, &z[0]));
                NBT_OK(ctx, nb_tree_int(ctx, 0, &z[1]));
                NBT_OK(ctx, nb_tree_int(ctx, acc, &z[2]));
                pself = nbt_tuple_take(ctx, 3, z);
                NBT_OK(ctx, nb_fn_create(ctx, "mm", body_tmm, pself, &plain));
                NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){xa, xb, lc}, &pargs));
                NBT_OK(ctx, nb_fn_call(plain, pargs, &pout));
                bool same = false;
                NBT_OK(ctx,
                       nb_array_identical(nb_tree_get_array(jout), nb_tree_get_array(pout), &same));
                if (!same) {
                    fail_msg("%s [%lld,%lld,%lld]%s%s%s: the folded transpose changed the bits",
                             nb_dtype_name(dt), (long long)m, (long long)k, (long long)n,
                             ta ? " a^T" : "", tb ? " b^T" : "", acc ? " + c" : "");
                }
                checked++;
                nb_tree *trees[] = {la, lb, lc, self, args, jout, ea, eb, pself, pargs, pout};
                for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
                    nb_tree_destroy(trees[i]);
                }
                nb_fn_destroy(plain);
                nb_fn_destroy(jf);
                nb_fn_destroy(f);
            }
        }
    }
    NBT_EQ_I64(checked, 11 * 2 * 7);
    nb_fn_destroy(swap);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_matmul_folded_batched(void **state) {
    (void)state;
    nb_ctx_opts o = nb_ctx_opts_default();
    o.n_threads = 2;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(&o, &ctx));
    nb_tree *args = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 0, NULL, &args));
    NBT_OK(ctx, nb_eval(ctx, body_folded_bmm, NULL, args, &out));
    const nb_array *r = nb_tree_get_array(out);
    NBT_EQ_I64(nb_array_rank(r), 3);
    /* batch t: a row i is [0, 1, 2], b[t] = [t, t, t]^T: every element 3t */
    for (int64_t t = 0; t < 5; t++) {
        for (int64_t i = 0; i < 5; i++) {
            double v = 0;
            NBT_OK(ctx, nb_array_get(r, (int64_t[]){t, i, 0}, &v));
            NBT_EQ_F64(v, 3.0 * (double)t);
        }
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_entry),
        cmocka_unit_test(test_matmul_2d_2d),
        cmocka_unit_test(test_matmul_folded_batched),
        cmocka_unit_test(test_matmul_large),
        cmocka_unit_test(test_matmul_1d_2d),
        cmocka_unit_test(test_matmul_2d_1d),
        cmocka_unit_test(test_matmul_1d_1d_and_dot),
        cmocka_unit_test(test_matmul_batched),
        cmocka_unit_test(test_matmul_batch_broadcast),
        cmocka_unit_test(test_matmul_k_zero),
        cmocka_unit_test(test_matmul_empty_result),
        cmocka_unit_test(test_matmul_int_wraps),
        cmocka_unit_test(test_matmul_ignores_output_contents),
        cmocka_unit_test(test_matmul_deterministic),
        cmocka_unit_test(test_matmul_same_operand),
        cmocka_unit_test(test_matmul_small_bits),
        cmocka_unit_test(test_matmul_accumulate),
        cmocka_unit_test(test_matmul_accumulate_k_zero),
        cmocka_unit_test(test_matmul_gemv_bits),
        cmocka_unit_test(test_matmul_transposed_same_bits),
        cmocka_unit_test(test_matmul_bool_rejected),
        cmocka_unit_test(test_matmul_dtype_mismatch),
        cmocka_unit_test(test_matmul_inner_dim_message),
        cmocka_unit_test(test_matmul_rank0_error),
        cmocka_unit_test(test_matmul_batch_mismatch),
        cmocka_unit_test(test_matmul_poison_and_null),
        cmocka_unit_test(test_matmul_foreign_trace),
        cmocka_unit_test(test_matmul_grad_rules),
        cmocka_unit_test(test_matmul_grad_rules_transposed_operands),
        cmocka_unit_test(test_matmul_accumulate_rules),
        cmocka_unit_test(test_blis_threads_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
