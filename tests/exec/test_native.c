/*
 * test_native.c -- the native tier (src/exec/native.c, codegen.c): the same bits as the
 * interpreter, NOW and AUTO (a background compile swapped in between calls), the C source
 * a user can read, a compile that fails falling back to the interpreter with a logged
 * reason, a warm disk cache.
 *
 * Environment: NABLA_NATIVE_CACHE is set to a fresh directory and NABLA_NATIVE_HOT low
 * before the first call (both are read once per process), NABLA_NATIVE is unset.
 */
#include "nbtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nabla/fn.h>
#include <nabla/loops.h>
#include <nabla/trace.h>

#include "exec/native.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static nb_fn_stats stats_of(const nb_fn *f) {
    nb_fn_stats s;
    NBT_OK(NULL, nb_fn_stats_get(f, &s));
    return s;
}

/* ---- a body that uses every kind of fused instruction --------------------------------- */

/* args: (x f32[5], y f64[3,4], k i32[4]) */
static nb_status body_mix(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *x = nb_get(tr, args, "[0]"), *y = nb_get(tr, args, "[1]"), *k = nb_get(tr, args, "[2]");
    nb_var *a = nb_mul(nb_tanh(nb_add(nb_mul(x, nb_scalar(tr, 2.0)), nb_scalar(tr, 1.0))),
                       nb_exp(nb_neg(x)));
    nb_var *b = nb_add(nb_add(nb_sigmoid(x), nb_softplus(x)), nb_gelu(x));
    nb_var *c = nb_pow(nb_add(nb_abs(x), nb_scalar(tr, 1.0)), nb_scalar(tr, 0.7));
    nb_var *d = nb_sum(nb_mul(y, y), (const int[]){1}, 1, false); /* a short run per row */
    nb_var *e = nb_max(nb_sub(y, nb_scalar(tr, 0.5)), (const int[]){1}, 1, true);
    nb_var *f = nb_add(nb_pad(nb_slice(x, (const int64_t[]){1}, (const int64_t[]){4}, NULL),
                              (const int64_t[]){2}, (const int64_t[]){1}, -3.5),
                       nb_scalar(tr, 1.0)); /* a padded view of a slice */
    nb_var *g = nb_add(y, nb_reshape(nb_cast(k, NB_DTYPE_F64), 2, (const int64_t[]){1, 4}));
    nb_var *h = nb_div(nb_neg(k), nb_sub(k, nb_scalar_typed(tr, NB_DTYPE_I32, 2))); /* / 0 */
    nb_var *i = nb_cast(nb_mul(nb_cast(x, NB_DTYPE_F64), nb_scalar(tr, 1e12)), NB_DTYPE_I32);
    nb_var *j = nb_select(nb_gt(x, nb_scalar(tr, 1.5)), nb_sqrt(x), nb_rsqrt(nb_add(x, x)));
    nb_var *l = nb_min(nb_log1p(nb_abs(y)), NULL, 0, false);
    nb_var *m = nb_sum(nb_cast(nb_lt(x, nb_scalar(tr, 2.0)), NB_DTYPE_I64), NULL, 0, false);
    nb_var *vs[] = {a, b, c, d, e, f, g, h, i, j, l, m};
    nb_tree *leaves[12];
    for (int q = 0; q < 12; q++) {
        leaves[q] = nb_leaf(vs[q]);
    }
    return nb_tree_tuple(ctx, 12, leaves, out);
}

static nb_tree *mix_args(nb_ctx *ctx, int variant) {
    float xv[5] = {-1.25f, 0.0f, 0.5f, 1.75f, 3.0f};
    double yv[12];
    for (int q = 0; q < 12; q++) {
        yv[q] = 0.37 * (q - 5) + 0.01 * variant;
    }
    xv[1] += 0.125f * (float)variant;
    nb_array *x = nbt_arr_f32(ctx, 1, (const int64_t[]){5}, xv);
    nb_array *y = nbt_arr_f64(ctx, 2, (const int64_t[]){3, 4}, yv);
    nb_array *k = NULL;
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_I32, 0, 4, 1, &k));
    nb_tree *lx = NULL, *ly = NULL, *lk = NULL, *t = NULL;
    NBT_OK(ctx, nb_tree_array(x, &lx));
    NBT_OK(ctx, nb_tree_array(y, &ly));
    NBT_OK(ctx, nb_tree_array(k, &lk));
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){lx, ly, lk}, &t));
    nb_array_destroy(x);
    nb_array_destroy(y);
    nb_array_destroy(k);
    nb_tree_destroy(lx);
    nb_tree_destroy(ly);
    nb_tree_destroy(lk);
    return t;
}

/* Every leaf of a and b the same bits (NaNs by NaN-ness). */
static void assert_same_bits(const nb_tree *a, const nb_tree *b) {
    nb_tree *la = NULL, *lb = NULL;
    nb_treedef *da = NULL, *db = NULL;
    NBT_OK(NULL, nb_tree_flatten(a, &la, &da));
    NBT_OK(NULL, nb_tree_flatten(b, &lb, &db));
    nb_treedef_destroy(da);
    nb_treedef_destroy(db);
    int64_t n = nb_tree_len(la);
    assert_int_equal(n, nb_tree_len(lb));
    for (int64_t q = 0; q < n; q++) {
        const nb_array *x = nb_tree_get_array(nb_tree_child(la, q));
        const nb_array *y = nb_tree_get_array(nb_tree_child(lb, q));
        assert_non_null(x);
        assert_non_null(y);
        size_t bytes = nb_array_nbytes(x);
        assert_int_equal(bytes, nb_array_nbytes(y));
        if (memcmp(nb_array_data(x), nb_array_data(y), bytes) != 0) {
            fail_msg("output %lld differs between the tiers", (long long)q);
        }
    }
    nb_tree_destroy(la);
    nb_tree_destroy(lb);
}

static nb_fn *jit_mode(nb_ctx *ctx, nb_fn_body body, const char *name, int mode) {
    nb_fn *f = NULL, *j = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, name, body, NULL, &f));
    nb_jit_opts o = nb_jit_opts_default();
    o.native = mode;
    NBT_OK(ctx, nb_jit(f, &o, &j));
    nb_fn_destroy(f);
    return j;
}

/* The C source of f's program for args (malloc'ed): nb_fn_format_ir(NB_IR_NATIVE_C). */
static char *fn_source(nb_ctx *ctx, nb_fn *f, const nb_tree *args) {
    size_t need = 0;
    assert_int_equal(nb_fn_format_ir(f, args, NB_IR_NATIVE_C, NULL, 0, &need), NB_ERR_TRUNCATED);
    char *buf = malloc(need + 1);
    assert_non_null(buf);
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_NATIVE_C, buf, need + 1, NULL));
    return buf;
}

/* NOW: native code from the first call, the interpreter's bits. */
static void test_now_same_bits(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *off = jit_mode(ctx, body_mix, "mix", NB_NATIVE_OFF);
    nb_fn *now = jit_mode(ctx, body_mix, "mix_now", NB_NATIVE_NOW);
    for (int v = 0; v < 3; v++) {
        nb_tree *args = mix_args(ctx, v), *a = NULL, *b = NULL;
        /* (equal functions share their counters: each is read right after its call) */
        NBT_OK(ctx, nb_fn_call(off, args, &a));
        assert_int_equal(stats_of(off).tier, 0);
        NBT_OK(ctx, nb_fn_call(now, args, &b));
        assert_int_equal(stats_of(now).tier, 1);
        assert_same_bits(a, b);
        nb_tree_destroy(a);
        nb_tree_destroy(b);
        nb_tree_destroy(args);
    }
    nb_fn_destroy(off);
    nb_fn_destroy(now);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- no fused multiply-add: each product rounded, then the sum, as the interpreter ----- */

/* args: (x f64[5]) -> [b c - a, d + b e], one fused program storing one of the two values:
 * gcc 12's basic-block vectoriser made one vfmaddsub of the pair (its a - and a + lane)
 * despite -ffp-contract=off */
static nb_status body_fmas(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]"), *v[5];
    for (int i = 0; i < 5; i++) {
        v[i] = nb_slice(x, (const int64_t[]){i}, (const int64_t[]){i + 1}, NULL);
    }
    nb_var *p = nb_add(nb_neg(v[0]), nb_mul(v[1], v[2]));
    nb_var *q = nb_add(v[3], nb_mul(v[1], v[4]));
    return nb_return(nb_concatenate(2, (nb_var *[]){p, q}, 0), out);
}

static void test_native_no_fma(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *off = jit_mode(ctx, body_fmas, "fmas", NB_NATIVE_OFF);
    nb_fn *now = jit_mode(ctx, body_fmas, "fmas_now", NB_NATIVE_NOW);
    int differ = 0;
    for (int v = 0; v < 64; v++) {
        double xv[5];
        for (int i = 0; i < 5; i++) {
            xv[i] = sin(1.7 * v + 0.9 * i) * (1 + i); /* a product's low bits matter */
        }
        nb_array *xa = nbt_arr_f64(ctx, 1, (const int64_t[]){5}, xv);
        nb_tree *lx = NULL, *a = NULL, *b = NULL;
        NBT_OK(ctx, nb_tree_array(xa, &lx));
        nb_array_destroy(xa);
        nb_tree *args = nbt_tuple_take(ctx, 1, (nb_tree *[]){lx});
        NBT_OK(ctx, nb_fn_call(off, args, &a));
        NBT_OK(ctx, nb_fn_call(now, args, &b));
        assert_int_equal(stats_of(now).tier, 1);
        const double *da = nb_array_data(nb_tree_get_array(a));
        const double *db = nb_array_data(nb_tree_get_array(b));
        differ += memcmp(da, db, 2 * sizeof(double)) != 0;
        nb_tree_destroy(a);
        nb_tree_destroy(b);
        nb_tree_destroy(args);
    }
    printf("b c - a beside d + b e: %d of 64 inputs differ from the interpreter\n", differ);
    assert_int_equal(differ, 0);
    nb_fn_destroy(off);
    nb_fn_destroy(now);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- large flat programs: written out, split across a pool's threads when there is one -- */

/* args: (x f32[6000], y f64[5000], k i32[5000]); programs over more elements than the
 * generator writes out when small, none calling vector math: an Adam-like chain with
 * scalars read as one value and two stored intermediates, integer arithmetic with a
 * division by zero, a view (a slice) read at its own index, two dtypes in one program. */
static nb_status body_big(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *x = nb_get(tr, args, "[0]"), *y = nb_get(tr, args, "[1]"), *k = nb_get(tr, args, "[2]");
    nb_var *mu = nb_add(nb_mul(x, nb_scalar(tr, 0.9)), nb_scalar(tr, 0.1));
    nb_var *nu = nb_add(nb_mul(nb_square(x), nb_scalar(tr, 0.999)), nb_scalar(tr, 1e-3));
    nb_var *p = nb_sub(
        x, nb_div(nb_mul(mu, nb_scalar(tr, 1e-3)), nb_add(nb_sqrt(nu), nb_scalar(tr, 1e-8))));
    nb_var *q = nb_div(nb_mul(k, nb_scalar_typed(tr, NB_DTYPE_I32, 3)),
                       nb_sub(k, nb_scalar_typed(tr, NB_DTYPE_I32, 7)));
    nb_var *r = nb_neg(y);
    nb_var *s = nb_mul(nb_add(nb_slice(x, (const int64_t[]){500}, (const int64_t[]){5500}, NULL),
                              nb_scalar(tr, 2.0)),
                       nb_cast(y, NB_DTYPE_F32));
    nb_var *vs[] = {mu, nu, p, q, r, s};
    nb_tree *leaves[6];
    for (int i = 0; i < 6; i++) {
        leaves[i] = nb_leaf(vs[i]);
    }
    return nb_tree_tuple(ctx, 6, leaves, out);
}

static nb_tree *big_args(nb_ctx *ctx) {
    enum { NX = 6000, NY = 5000 };
    float *xv = malloc(NX * sizeof *xv);
    double *yv = malloc(NY * sizeof *yv);
    assert_non_null(xv);
    assert_non_null(yv);
    for (int i = 0; i < NX; i++) {
        xv[i] = (float)sin(0.01 * i) * 3.0f;
    }
    for (int i = 0; i < NY; i++) {
        yv[i] = cos(0.003 * i) - 0.25;
    }
    nb_array *x = nbt_arr_f32(ctx, 1, (const int64_t[]){NX}, xv);
    nb_array *y = nbt_arr_f64(ctx, 1, (const int64_t[]){NY}, yv);
    free(xv);
    free(yv);
    nb_array *k = NULL;
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_I32, -2000, 3000, 1, &k));
    nb_tree *l[3] = {NULL, NULL, NULL};
    NBT_OK(ctx, nb_tree_array(x, &l[0]));
    NBT_OK(ctx, nb_tree_array(y, &l[1]));
    NBT_OK(ctx, nb_tree_array(k, &l[2]));
    nb_array_destroy(x);
    nb_array_destroy(y);
    nb_array_destroy(k);
    return nbt_tuple_take(ctx, 3, l);
}

static void test_big_same_bits(void **state) {
    (void)state;
    nb_tree *res[2][2] = {{NULL, NULL}, {NULL, NULL}};
    nb_ctx *ctxs[2] = {NULL, NULL};
    for (int threads = 1; threads <= 2; threads++) {
        nb_ctx_opts co = nb_ctx_opts_default();
        co.n_threads = threads;
        NBT_OK(NULL, nb_ctx_create(&co, &ctxs[threads - 1]));
        nb_ctx *ctx = ctxs[threads - 1];
        nb_tree *args = big_args(ctx);
        if (threads == 1) { /* the generated C writes the programs out as workers over a range
                             * of elements (all of them, or chunks across a pool's threads) */
            nb_fn *f = NULL;
            NBT_OK(ctx, nb_fn_create(ctx, "big", body_big, NULL, &f));
            char *buf = fn_source(ctx, f, args);
            int n_big = 0;
            for (const char *c = buf; (c = strstr(c, "env->par(env->pool, ")) != NULL; c++) {
                n_big++;
            }
            assert_int_equal(n_big, 3); /* the f32[6000] chain, the i32 one, the f32/f64[5000] */
            assert_non_null(strstr(buf, "env->par(env->pool, 6000, "));
            assert_non_null(strstr(buf, "for (i64 i = first; i < first + count; i++)"));
            assert_non_null(strstr(buf, "[500 + i]")); /* the slice, read in place */
            free(buf);
            nb_fn_destroy(f);
        }
        nb_fn *off = jit_mode(ctx, body_big, "big", NB_NATIVE_OFF);
        nb_fn *now = jit_mode(ctx, body_big, "big_now", NB_NATIVE_NOW);
        NBT_OK(ctx, nb_fn_call(off, args, &res[threads - 1][0]));
        NBT_OK(ctx, nb_fn_call(now, args, &res[threads - 1][1]));
        assert_int_equal(stats_of(now).tier, 1);
        nb_fn_destroy(off);
        nb_fn_destroy(now);
        nb_tree_destroy(args);
    }
    assert_same_bits(res[0][0], res[0][1]); /* 1 thread: written out vs the interpreter */
    assert_same_bits(res[1][0], res[1][1]); /* 2 threads: chunks on the pool vs the kernel */
    assert_same_bits(res[0][1], res[1][1]);
    for (int i = 0; i < 4; i++) {
        nb_tree_destroy(res[i / 2][i % 2]);
    }
    for (int i = 0; i < 2; i++) {
        nbt_assert_no_live(ctxs[i]);
        nb_ctx_destroy(ctxs[i]);
    }
}

/* ---- tiled programs: vector math over more than a few elements, folds, gathers --------- */

/* args: (x f32[16,32,65], b f32[65], s f32[], g f32[32,64], z f32[20,40,100],
 *        y f64[2000,3], c f64[1,3], d f64[2000,1], k i32[100,65], w f32[1200],
 *        m f32[2000,10]);
 * programs the generator writes out tiled: log softmax over rows of 65 (a max and a sum
 * of exps, folded four rows at a time, and a log), a max over rows of x * s (ties of -0
 * and +0, a NaN), sigmoid, softplus and gelu over [32, 64], a max over two axes (an
 * output spans 40 rows of 100), an f64 program over [2000, 3] cut into tiles of 512 with
 * inputs broadcast along either axis (gathered), an integer sum over rows and a strided
 * slice (gathered along a row of 600 cut into two tiles); a program storing an
 * intermediate and ending in exp, f64 sigmoid, softplus and pow, and a max over rows of 10
 * folded across tiles (one row of 20000: an output's elements in two tiles). */
static nb_status body_tiled(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *x = nb_get(tr, args, "[0]"), *b = nb_get(tr, args, "[1]");
    nb_var *s = nb_get(tr, args, "[2]"), *g = nb_get(tr, args, "[3]");
    nb_var *z = nb_get(tr, args, "[4]"), *y = nb_get(tr, args, "[5]");
    nb_var *c = nb_get(tr, args, "[6]"), *d = nb_get(tr, args, "[7]");
    nb_var *k = nb_get(tr, args, "[8]"), *w = nb_get(tr, args, "[9]");
    nb_var *m = nb_get(tr, args, "[10]");
    nb_var *ls = nb_log_softmax(nb_add(x, b), -1);
    nb_var *mx = nb_max(nb_mul(x, s), (const int[]){-1}, 1, false);
    nb_var *act = nb_add(nb_sigmoid(g), nb_mul(nb_softplus(g), nb_gelu(g)));
    nb_var *m2 = nb_max(nb_mul(nb_exp(z), s), (const int[]){1, 2}, 2, false);
    nb_var *yy = nb_mul(nb_exp(nb_add(y, c)), d);
    nb_var *ks = nb_sum(nb_mul(k, k), (const int[]){-1}, 1, false);
    nb_var *ws = nb_mul(
        nb_tanh(nb_slice(w, (const int64_t[]){0}, (const int64_t[]){1200}, (const int64_t[]){2})),
        s);
    nb_var *u = nb_mul(g, nb_add(s, s));
    nb_var *eu = nb_exp(u);
    nb_var *y2 = nb_add(nb_mul(nb_sigmoid(y), nb_softplus(y)),
                        nb_pow(nb_add(nb_square(y), nb_scalar(tr, 1.0)), nb_scalar(tr, 0.75)));
    nb_var *mm = nb_max(nb_mul(m, s), (const int[]){-1}, 1, false);
    nb_var *vs[] = {ls, mx, act, m2, yy, ks, ws, u, eu, y2, mm};
    nb_tree *leaves[11];
    for (int i = 0; i < 11; i++) {
        leaves[i] = nb_leaf(vs[i]);
    }
    return nb_tree_tuple(ctx, 11, leaves, out);
}

static nb_array *tiled_f32(nb_ctx *ctx, int rank, const int64_t *shape, double scale, double freq) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        n *= shape[i];
    }
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) {
        v[i] = (float)(scale * sin(freq * (double)i + 0.3));
    }
    nb_array *a = nbt_arr_f32(ctx, rank, shape, v);
    free(v);
    return a;
}

static nb_tree *tiled_args(nb_ctx *ctx) {
    nb_array *a[11] = {NULL};
    a[0] = tiled_f32(ctx, 3, (const int64_t[]){16, 32, 65}, 4.0, 0.37);
    float *xv = nb_array_data(a[0]);
    for (int j = 0; j < 65; j++) { /* row 0: zeros of both signs, the max a tie */
        xv[j] = j % 2 ? 0.0f : -0.0f;
        xv[65 + j] = j % 3 ? 0.0f : -0.0f;
        xv[2 * 65 + j] = (float)j - 64.0f;
        xv[4 * 65 + j] = j == 0 ? 0.0f : -0.0f;
    }
    xv[3 * 65 + 7] = NAN; /* row 3: a NaN */
    a[1] = tiled_f32(ctx, 1, (const int64_t[]){65}, 0.5, 1.1);
    a[2] = nbt_arr_f32(ctx, 0, NULL, (const float[]){1.0f});
    a[3] = tiled_f32(ctx, 2, (const int64_t[]){32, 64}, 6.0, 0.11);
    a[4] = tiled_f32(ctx, 3, (const int64_t[]){20, 40, 100}, 3.0, 0.013);
    double *yv = malloc(2000 * 3 * sizeof *yv), *dv = malloc(2000 * sizeof *dv);
    assert_non_null(yv);
    assert_non_null(dv);
    for (int i = 0; i < 6000; i++) {
        yv[i] = cos(0.017 * i);
    }
    for (int i = 0; i < 2000; i++) {
        dv[i] = 1.0 + 0.001 * i;
    }
    a[5] = nbt_arr_f64(ctx, 2, (const int64_t[]){2000, 3}, yv);
    a[6] = nbt_arr_f64(ctx, 2, (const int64_t[]){1, 3}, (const double[]){0.25, -1.5, 3.0});
    a[7] = nbt_arr_f64(ctx, 2, (const int64_t[]){2000, 1}, dv);
    free(yv);
    free(dv);
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_I32, -3000, 3500, 1, &a[8]));
    nb_array *k2 = NULL;
    NBT_OK(ctx, nb_array_reshape(a[8], 2, (const int64_t[]){100, 65}, &k2));
    nb_array_destroy(a[8]);
    a[8] = k2;
    a[9] = tiled_f32(ctx, 1, (const int64_t[]){1200}, 2.0, 0.05);
    a[10] = tiled_f32(ctx, 2, (const int64_t[]){2000, 10}, 5.0, 0.7);
    float *mv = nb_array_data(a[10]);
    for (int j = 0; j < 10; j++) { /* row 51 straddles tiles 0 and 1 (elements 510-519) */
        mv[51 * 10 + j] = j < 4 ? -0.0f : j == 9 ? -1.0f : 0.0f; /* first zero -0 */
        mv[52 * 10 + j] = j == 0 ? 0.0f : -0.0f;                 /* first zero +0 */
    }
    mv[53 * 10 + 2] = NAN;
    nb_tree *l[11];
    for (int i = 0; i < 11; i++) {
        NBT_OK(ctx, nb_tree_array(a[i], &l[i]));
        nb_array_destroy(a[i]);
    }
    return nbt_tuple_take(ctx, 11, l);
}

/* NOW: every program above written out tiled, the interpreter's bits for 1 and 2 threads. */
static void test_tiled_same_bits(void **state) {
    (void)state;
    nb_tree *res[2][2] = {{NULL, NULL}, {NULL, NULL}};
    nb_ctx *ctxs[2] = {NULL, NULL};
    for (int threads = 1; threads <= 2; threads++) {
        nb_ctx_opts co = nb_ctx_opts_default();
        co.n_threads = threads;
        NBT_OK(NULL, nb_ctx_create(&co, &ctxs[threads - 1]));
        nb_ctx *ctx = ctxs[threads - 1];
        nb_tree *args = tiled_args(ctx);
        if (threads == 1) {
            nb_fn *f = NULL;
            NBT_OK(ctx, nb_fn_create(ctx, "tiled", body_tiled, NULL, &f));
            char *buf = fn_source(ctx, f, args);
            int n_kern = 0, n_tiled = 0;
            for (const char *q = buf; (q = strstr(q, "env->kern[")) != NULL; q++) {
                n_kern++;
            }
            for (const char *q = buf; (q = strstr(q, "for (i64 q = first;")) != NULL; q++) {
                n_tiled++;
            }
            printf("tiled: %d programs written out tiled, %d kernel calls\n", n_tiled, n_kern);
            assert_int_equal(n_kern, 0); /* no program left to the interpreter's kernel */
            assert_true(n_tiled >= 10);
            assert_non_null(strstr(buf, "vm->f32[0]("));           /* exp over a tile */
            assert_non_null(strstr(buf, "vm->f64[0]("));           /* the f64 one */
            assert_non_null(strstr(buf, "a0 = B[0], a1 = B[65]")); /* four rows' folds */
            assert_non_null(strstr(buf, "for (i64 t0 = 0; t0 < 6000; t0 += 512)"));
            assert_non_null(strstr(buf, "for (i64 t0 = 0; t0 < 600; t0 += 512)"));
            assert_non_null(strstr(buf, "(t0 + j) * 2]"));  /* the strided slice, gathered */
            assert_non_null(strstr(buf, "if (++c1 == 3)")); /* the odometer of [2000, 3] */
            assert_non_null(strstr(buf, "env->par(env->pool, 800, 200,")); /* whole outputs */
            free(buf);
            nb_fn_destroy(f);
        }
        nb_fn *off = jit_mode(ctx, body_tiled, "tiled", NB_NATIVE_OFF);
        nb_fn *now = jit_mode(ctx, body_tiled, "tiled_now", NB_NATIVE_NOW);
        NBT_OK(ctx, nb_fn_call(off, args, &res[threads - 1][0]));
        NBT_OK(ctx, nb_fn_call(now, args, &res[threads - 1][1]));
        assert_int_equal(stats_of(now).tier, 1);
        nb_fn_destroy(off);
        nb_fn_destroy(now);
        nb_tree_destroy(args);
    }
    /* the ties: row 0's max is -0 (its first zero), row 1's too; row 3's a NaN */
    const nb_array *mx = nb_tree_get_array(nb_tree_child(res[0][1], 1));
    const float *mv = nb_array_data(mx);
    assert_true(signbit(mv[0]) && mv[0] == 0.0f);
    assert_true(signbit(mv[1]) && mv[1] == 0.0f);
    assert_true(mv[2] == 0.0f && !signbit(mv[2])); /* its last element, +0 */
    assert_true(isnan(mv[3]));
    assert_true(mv[4] == 0.0f && !signbit(mv[4])); /* +0 first, then -0s */
    const float *m3 = nb_array_data(nb_tree_get_array(nb_tree_child(res[0][1], 10)));
    assert_true(signbit(m3[51]) && m3[51] == 0.0f); /* folded across two tiles */
    assert_true(m3[52] == 0.0f && !signbit(m3[52]));
    assert_true(isnan(m3[53]));
    assert_same_bits(res[0][0], res[0][1]); /* 1 thread: written out vs the interpreter */
    assert_same_bits(res[1][0], res[1][1]); /* 2 threads: rows split on the pool */
    assert_same_bits(res[0][1], res[1][1]);
    for (int i = 0; i < 4; i++) {
        nb_tree_destroy(res[i / 2][i % 2]);
    }
    for (int i = 0; i < 2; i++) {
        nbt_assert_no_live(ctxs[i]);
        nb_ctx_destroy(ctxs[i]);
    }
}

/* ---- loops: the body's executable has native code of its own ------------------------- */

static nb_status body_step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *i = nb_cast(nb_get(tr, args, "[0]"), NB_DTYPE_F64);
    nb_var *x = nb_get(tr, args, "[1]");
    nb_var *y = nb_add(nb_mul(x, nb_scalar(tr, 0.999)), nb_mul(nb_sin(i), nb_scalar(tr, 1e-3)));
    return nb_return(nb_sub(y, nb_mul(nb_sum(nb_mul(y, y), NULL, 0, false), nb_scalar(tr, 1e-4))),
                     out);
}

static nb_status body_loop(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_fn *step = NULL;
    nb_status st = nb_fn_create(ctx, "step", body_step, NULL, &step);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *r = nb_fori_loop(tr, 0, 500, step, nb_tree_child(args, 0), NULL);
    nb_fn_destroy(step);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)r);
    return NB_OK;
}

/* a loop in a loop: the outer body runs body_step's loop 7 times, then one step more */
static nb_status body_outer(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_fn *step = NULL;
    nb_status st = nb_fn_create(ctx, "step", body_step, NULL, &step);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *r = nb_fori_loop(tr, 0, 7, step, nb_tree_child(args, 1), NULL);
    nb_fn_destroy(step);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *x = nb_var_of(tr, r);
    return nb_return(
        nb_add(x, nb_mul(nb_cast(nb_get(tr, args, "[0]"), NB_DTYPE_F64), nb_scalar(tr, 1e-3))),
        out);
}

static nb_status body_nested(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_fn *outer = NULL;
    nb_status st = nb_fn_create(ctx, "outer", body_outer, NULL, &outer);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *r = nb_fori_loop(tr, 0, 20, outer, nb_tree_child(args, 0), NULL);
    nb_fn_destroy(outer);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)r);
    return NB_OK;
}

/* sum of the carry after a checkpointed loop of body_step (7 checkpoints for 500 steps) */
static nb_status body_ckpt(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_fn *step = NULL;
    nb_status st = nb_fn_create(ctx, "step", body_step, NULL, &step);
    if (st != NB_OK) {
        return st;
    }
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = NB_LOOP_CHECKPOINTED;
    o.checkpoints = 7;
    const nb_tree *r = nb_fori_loop(tr, 0, 500, step, nb_tree_child(args, 0), &o);
    nb_fn_destroy(step);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *x = nb_var_of(tr, r);
    return nb_return(nb_sum(nb_mul(x, x), NULL, 0, false), out);
}

static nb_tree *vec_args(nb_ctx *ctx, int n) {
    double v[16];
    for (int q = 0; q < n; q++) {
        v[q] = 0.1 * q - 0.3;
    }
    nb_array *a = nbt_arr_f64(ctx, 1, (const int64_t[]){n}, v);
    nb_tree *l = NULL, *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &l));
    NBT_OK(ctx, nb_tree_tuple(ctx, 1, &l, &t));
    nb_array_destroy(a);
    nb_tree_destroy(l);
    return t;
}

/* The C source of body's program for args (malloc'ed). */
static char *source_of(nb_ctx *ctx, nb_fn_body body, const nb_tree *args) {
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "src", body, NULL, &f));
    char *buf = fn_source(ctx, f, args);
    nb_fn_destroy(f);
    return buf;
}

/* A while loop is a C loop in the file (its cond and body functions of their own, nested
 * loops' too), with the interpreter's bits. */
static void test_loop_same_bits(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    for (int nested = 0; nested < 2; nested++) {
        nb_fn_body body = nested ? body_nested : body_loop;
        nb_fn *off = jit_mode(ctx, body, "loop", NB_NATIVE_OFF);
        nb_fn *now = jit_mode(ctx, body, "loop_now", NB_NATIVE_NOW);
        nb_tree *args = vec_args(ctx, 7), *a = NULL, *b = NULL;
        char *src = source_of(ctx, body, args);
        assert_non_null(strstr(src, "static void nbx_f0("));     /* the cond */
        assert_non_null(strstr(src, "static void nbx_f1("));     /* the body */
        assert_non_null(strstr(src, "nbx_f1(eb, bi, bo, bd);")); /* called in a C loop */
        if (nested) { /* the inner loop's cond and body, called from the outer body */
            assert_non_null(strstr(src, "static void nbx_f3("));
            assert_non_null(strstr(src, "nbx_f3(eb, bi, bo, bd);"));
        } else {
            assert_null(strstr(src, "nbx_f2("));
        }
        assert_null(strstr(src, "env->kern[")); /* no loop kernel (nor any other) */
        free(src);
        NBT_OK(ctx, nb_fn_call(off, args, &a));
        NBT_OK(ctx, nb_fn_call(now, args, &b));
        assert_int_equal(stats_of(now).tier, 1);
        assert_same_bits(a, b);
        nb_tree_destroy(a);
        nb_tree_destroy(b);
        nb_tree_destroy(args);
        nb_fn_destroy(off);
        nb_fn_destroy(now);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A body with a loop-invariant prefix: x = tanh(x @ w^T) * sum(s) (x [12]) with w and s the
 * bound data (w's transpose and sum(s) made once per loop; sum(s), one value, would be a local
 * of written-out code -- it must be in the workspace for the later steps): the body's function
 * has a second one without the prefix, nbx_f1_r, called from the second step on; the
 * interpreter's bits. */
static nb_status body_inv_step(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    nb_var *x = nb_get(tr, args, "[1]"), *w = nb_get(tr, self, "w"), *s = nb_get(tr, self, "s");
    return nb_return(
        nb_mul(nb_tanh(nb_matmul(x, nb_transpose(w, NULL))), nb_sum(s, NULL, 0, false)), out);
}

static nb_status body_inv_loop(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_tree *s = NULL;
    nb_fn *step = NULL;
    nb_status st = nb_tree_dict(
        ctx, 2, (const char *[]){"w", "s"},
        (nb_tree *[]){(nb_tree *)nb_tree_child(args, 0), (nb_tree *)nb_tree_child(args, 2)}, &s);
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "inv_step", body_inv_step, s, &step);
    }
    nb_tree_destroy(s);
    const nb_tree *r =
        st == NB_OK ? nb_fori_loop(tr, 0, 9, step, nb_tree_child(args, 1), NULL) : NULL;
    nb_fn_destroy(step);
    if (r == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)r);
    return NB_OK;
}

static void test_loop_prefix(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    float w[12 * 12], x[12];
    for (int i = 0; i < 12 * 12; i++) {
        w[i] = 0.2f * sinf(0.9f * (float)i);
    }
    for (int i = 0; i < 12; i++) {
        x[i] = 0.1f * (float)(i % 7) - 0.3f;
    }
    float sv[12];
    for (int i = 0; i < 12; i++) {
        sv[i] = 0.05f * (float)i - 0.2f;
    }
    nb_array *aw = nbt_arr_f32(ctx, 2, (int64_t[]){12, 12}, w);
    nb_array *ax = nbt_arr_f32(ctx, 1, (int64_t[]){12}, x);
    nb_array *as = nbt_arr_f32(ctx, 1, (int64_t[]){12}, sv);
    nb_tree *lw = NULL, *lx = NULL, *ls = NULL;
    NBT_OK(ctx, nb_tree_array(aw, &lw));
    NBT_OK(ctx, nb_tree_array(ax, &lx));
    NBT_OK(ctx, nb_tree_array(as, &ls));
    nb_array_destroy(aw);
    nb_array_destroy(ax);
    nb_array_destroy(as);
    nb_tree *args = nbt_tuple_take(ctx, 3, (nb_tree *[]){lw, lx, ls}), *a = NULL, *b = NULL;
    char *src = source_of(ctx, body_inv_loop, args);
    assert_non_null(strstr(src, "static void nbx_f1_r("));
    assert_non_null(strstr(src, "(step == 0 ? nbx_f1 : nbx_f1_r)(eb, bi, bo, bd);"));
    free(src);
    nb_fn *off = jit_mode(ctx, body_inv_loop, "inv_loop", NB_NATIVE_OFF);
    nb_fn *now = jit_mode(ctx, body_inv_loop, "inv_loop_now", NB_NATIVE_NOW);
    /* native code first: the body's workspace holds nothing from an interpreted run yet */
    NBT_OK(ctx, nb_fn_call(now, args, &b));
    assert_int_equal(stats_of(now).tier, 1);
    NBT_OK(ctx, nb_fn_call(off, args, &a));
    assert_same_bits(a, b);
    nb_tree_destroy(a);
    nb_tree_destroy(b);
    nb_tree_destroy(args);
    nb_fn_destroy(off);
    nb_fn_destroy(now);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- aliases: a reshape or contiguous dynamic slice is a pointer in native code -------- */

#define AW 256 /* h's rows: a tile each when written out (a program gathers hrow per tile) */

/* A loop step over (h [4, AW], acc [AW]) with xs [6, 4, AW] bound: row = xs[i] (a pointer
 * into the bound tape), hrow = h[min(i, 3)] (a pointer into the carry) read by the new h
 * alone: the new h must not be written into h's buffer (it would change hrow as it
 * goes). */
static nb_status body_alias_step(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *i = nb_get(tr, args, "[0]"), *h = nb_get(tr, args, "[1][0]"),
           *acc = nb_get(tr, args, "[1][1]"), *xs = nb_get(tr, self, "xs");
    nb_var *z = nb_scalar_typed(tr, NB_DTYPE_I32, 0);
    nb_var *row = nb_reshape(nb_dynamic_slice(xs, (nb_var *[]){i, z, z}, (int64_t[]){1, 4, AW}), 2,
                             (int64_t[]){4, AW});
    nb_var *hrow =
        nb_reshape(nb_dynamic_slice(h, (nb_var *[]){i, z}, (int64_t[]){1, AW}), 1, (int64_t[]){AW});
    nb_var *h2 = nb_add(nb_add(nb_mul(h, nb_scalar(tr, 0.5)), nb_tanh(row)),
                        nb_mul(hrow, nb_scalar(tr, 0.1)));
    nb_var *acc2 = nb_add(nb_mul(acc, nb_scalar(tr, 0.9)), nb_sum(row, (const int[]){0}, 1, false));
    return nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(h2), nb_leaf(acc2)}, out);
}

/* fori_loop(0, n) of body over init args[1], with {key: args[0]} bound as its self */
static nb_status fori_bound(nb_trace *tr, const nb_tree *args, const char *key, nb_fn_body body,
                            int64_t n, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_tree *bound = NULL;
    nb_fn *step = NULL;
    nb_status st = nb_tree_dict(ctx, 1, (const char *[]){key},
                                (nb_tree *[]){(nb_tree *)nb_tree_child(args, 0)}, &bound);
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "alias_step", body, bound, &step);
    }
    nb_tree_destroy(bound);
    const nb_tree *r =
        st == NB_OK ? nb_fori_loop(tr, 0, n, step, nb_tree_child(args, 1), NULL) : NULL;
    nb_fn_destroy(step);
    if (r == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)r);
    return NB_OK;
}

static nb_status body_alias_loop(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    (void)self;
    return fori_bound(tr, args, "xs", body_alias_step, 6, out);
}

/* Not in a loop: y = x @ x^T (8 x 8), its reshape [4, 16] read by a product after exp(y)
 * (which must not take over y's slot), and a [2, 8] block of x at a run-time row (clamped:
 * -3, 2, 10) read after a product -- aliases of a value and of an input. */
static nb_status body_alias_flat(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *x = nb_get(tr, args, "[0]"), *k = nb_get(tr, args, "[1]");
    nb_var *y = nb_matmul(x, nb_transpose(x, NULL));
    nb_var *flat = nb_reshape(y, 2, (int64_t[]){4, 16});
    nb_var *e = nb_exp(nb_mul(y, nb_scalar(tr, 0.1)));
    nb_var *blk = nb_dynamic_slice(x, (nb_var *[]){k, nb_scalar_typed(tr, NB_DTYPE_I32, 0)},
                                   (int64_t[]){2, 8});
    nb_var *p = nb_matmul(e, nb_transpose(x, NULL));
    nb_var *q = nb_add(nb_reshape(blk, 1, (int64_t[]){16}), nb_scalar(tr, 1.0));
    nb_var *s2 = nb_matmul(flat, nb_reshape(x, 2, (int64_t[]){16, 4}));
    nb_var *r = nb_add(nb_sum(p, NULL, 0, false), nb_sum(s2, NULL, 0, false));
    return nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(r), nb_leaf(q)}, out);
}

static double leaf_f64(const nb_tree *t, int64_t child, int64_t i) {
    const nb_array *a = nb_tree_get_array(nb_tree_child(t, child));
    assert_non_null(a);
    return ((const double *)nb_array_data(a))[i];
}

static void test_alias_same_bits(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static double xs[6 * 4 * AW], h0[4 * AW], acc0[AW];
    double x[8 * 8];
    for (int q = 0; q < 6 * 4 * AW; q++) {
        xs[q] = 0.7 * sin(0.37 * q);
    }
    for (int q = 0; q < 4 * AW; q++) {
        h0[q] = 0.05 * (q % 9) - 0.2;
    }
    for (int q = 0; q < AW; q++) {
        acc0[q] = 1.0 + 0.1 * q;
    }
    for (int q = 0; q < 64; q++) {
        x[q] = 0.3 * cos(0.7 * q);
    }
    /* the loop, against the step written in plain C */
    nb_array *axs = nbt_arr_f64(ctx, 3, (int64_t[]){6, 4, AW}, xs);
    nb_array *ah = nbt_arr_f64(ctx, 2, (int64_t[]){4, AW}, h0);
    nb_array *aacc = nbt_arr_f64(ctx, 1, (int64_t[]){AW}, acc0);
    nb_tree *lxs = NULL, *lh = NULL, *lacc = NULL;
    NBT_OK(ctx, nb_tree_array(axs, &lxs));
    NBT_OK(ctx, nb_tree_array(ah, &lh));
    NBT_OK(ctx, nb_tree_array(aacc, &lacc));
    nb_array_destroy(axs);
    nb_array_destroy(ah);
    nb_array_destroy(aacc);
    nb_tree *carry = nbt_tuple_take(ctx, 2, (nb_tree *[]){lh, lacc});
    nb_tree *args = nbt_tuple_take(ctx, 2, (nb_tree *[]){lxs, carry}), *a = NULL, *b = NULL;
    char *src = source_of(ctx, body_alias_loop, args);
    assert_non_null(strstr(src, "u8 *A")); /* the slices are pointers */
    free(src);
    nb_fn *off = jit_mode(ctx, body_alias_loop, "alias_loop", NB_NATIVE_OFF);
    nb_fn *now = jit_mode(ctx, body_alias_loop, "alias_loop_now", NB_NATIVE_NOW);
    NBT_OK(ctx, nb_fn_call(now, args, &b));
    assert_int_equal(stats_of(now).tier, 1);
    NBT_OK(ctx, nb_fn_call(off, args, &a));
    assert_same_bits(a, b);
    static double h[4 * AW], acc[AW];
    memcpy(h, h0, sizeof h);
    memcpy(acc, acc0, sizeof acc);
    for (int i = 0; i < 6; i++) {
        int r = i < 3 ? i : 3;
        double hrow[AW];
        for (int c = 0; c < AW; c++) {
            hrow[c] = h[r * AW + c];
        }
        for (int q = 0; q < 4 * AW; q++) {
            h[q] = h[q] * 0.5 + tanh(xs[i * 4 * AW + q]) + hrow[q % AW] * 0.1;
        }
        for (int c = 0; c < AW; c++) {
            double s = 0;
            for (int q = 0; q < 4; q++) {
                s += xs[i * 4 * AW + q * AW + c];
            }
            acc[c] = acc[c] * 0.9 + s;
        }
    }
    for (int q = 0; q < 4 * AW; q++) {
        NBT_NEAR(leaf_f64(b, 0, q), h[q], 1e-14);
    }
    for (int c = 0; c < AW; c++) {
        NBT_NEAR(leaf_f64(b, 1, c), acc[c], 1e-13 * fabs(acc[c]));
    }
    nb_tree_destroy(a);
    nb_tree_destroy(b);
    nb_tree_destroy(args);
    nb_fn_destroy(off);
    nb_fn_destroy(now);
    /* the flat program at three rows, against plain C */
    off = jit_mode(ctx, body_alias_flat, "alias_flat", NB_NATIVE_OFF);
    now = jit_mode(ctx, body_alias_flat, "alias_flat_now", NB_NATIVE_NOW);
    for (int s = 0; s < 3; s++) {
        int32_t row = (int32_t[]){-3, 2, 10}[s];
        nb_array *ax = nbt_arr_f64(ctx, 2, (int64_t[]){8, 8}, x), *ak = NULL;
        NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 0, NULL, &row, &ak));
        nb_tree *lx = NULL, *lk = NULL;
        NBT_OK(ctx, nb_tree_array(ax, &lx));
        NBT_OK(ctx, nb_tree_array(ak, &lk));
        nb_array_destroy(ax);
        nb_array_destroy(ak);
        nb_tree *fa = nbt_tuple_take(ctx, 2, (nb_tree *[]){lx, lk});
        if (s == 0) {
            src = source_of(ctx, body_alias_flat, fa);
            assert_non_null(strstr(src, "u8 *A"));
            free(src);
        }
        NBT_OK(ctx, nb_fn_call(now, fa, &b));
        NBT_OK(ctx, nb_fn_call(off, fa, &a));
        assert_same_bits(a, b);
        int r0 = row < 0 ? 0 : row > 6 ? 6 : row;
        for (int q = 0; q < 16; q++) {
            NBT_NEAR(leaf_f64(b, 1, q), x[r0 * 8 + q] + 1.0, 0.0);
        }
        double sy = 0, y[64];
        for (int i = 0; i < 8; i++) {
            for (int j = 0; j < 8; j++) {
                double d = 0;
                for (int c = 0; c < 8; c++) {
                    d += x[i * 8 + c] * x[j * 8 + c];
                }
                y[i * 8 + j] = d;
            }
        }
        for (int i = 0; i < 4; i++) { /* y as [4, 16] @ x as [16, 4], summed */
            for (int j = 0; j < 4; j++) {
                for (int c = 0; c < 16; c++) {
                    sy += y[i * 16 + c] * x[c * 4 + j];
                }
            }
        }
        double sp = 0;
        for (int i = 0; i < 8; i++) {
            for (int j = 0; j < 8; j++) {
                for (int c = 0; c < 8; c++) {
                    sp += exp(0.1 * y[i * 8 + c]) * x[j * 8 + c];
                }
            }
        }
        NBT_NEAR(leaf_f64(b, 0, 0), sp + sy, 1e-12 * fabs(sp + sy));
        nb_tree_destroy(a);
        nb_tree_destroy(b);
        nb_tree_destroy(fa);
    }
    nb_fn_destroy(off);
    nb_fn_destroy(now);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* More aliases in loops, the interpreter's bits: (a) a body whose prefix makes a value and
 * reshapes it (the reshape is no pointer in the prefix; the rest's slices of it are),
 * slices of a bound value directly and through a reshape, and a row of a reshape of the
 * carry; (b) a carry a dynamic_update_slice writes, reshaped and read after the update (no
 * alias: the update stays in place); (c) nested loops, the inner loop's bound data a row of
 * the outer carry; (d), (e) and (f) below. */
static nb_tree *sin_leaf(nb_ctx *ctx, int rank, const int64_t *shape, int64_t n, double sc) {
    double d[256];
    assert_true(n <= 256);
    for (int64_t q = 0; q < n; q++) {
        d[q] = sc * sin(0.37 * (double)q + 0.1);
    }
    nb_array *a = nbt_arr_f64(ctx, rank, shape, d);
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

static nb_status alias_a_step(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    nb_var *i = nb_get(tr, args, "[0]"), *h = nb_get(tr, args, "[1]"), *w = nb_get(tr, self, "w");
    nb_var *z = nb_scalar_typed(tr, NB_DTYPE_I32, 0);
    nb_var *w2 = nb_reshape(nb_mul(w, nb_scalar(tr, 1.5)), 1, (int64_t[]){48});
    nb_var *i8 = nb_mul(i, nb_scalar_typed(tr, NB_DTYPE_I32, 8));
    nb_var *r1 = nb_dynamic_slice(w2, (nb_var *[]){i8}, (int64_t[]){8});
    nb_var *r2 =
        nb_dynamic_slice(nb_reshape(w, 1, (int64_t[]){48}), (nb_var *[]){i8}, (int64_t[]){8});
    nb_var *r3 =
        nb_reshape(nb_dynamic_slice(w, (nb_var *[]){i, z}, (int64_t[]){1, 8}), 1, (int64_t[]){8});
    nb_var *hr = nb_reshape(nb_dynamic_slice(nb_reshape(h, 2, (int64_t[]){2, 4}),
                                             (nb_var *[]){i, z}, (int64_t[]){1, 4}),
                            1, (int64_t[]){4});
    nb_var *hh = nb_concatenate(2, (nb_var *[]){hr, hr}, 0);
    return nb_return(
        nb_add(nb_add(nb_mul(h, nb_scalar(tr, 0.5)), nb_tanh(r1)), nb_add(nb_mul(r2, r3), hh)),
        out);
}

static nb_status alias_b_step(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    nb_var *i = nb_get(tr, args, "[0]"), *buf = nb_get(tr, args, "[1][0]"),
           *s = nb_get(tr, args, "[1][1]");
    nb_var *z = nb_scalar_typed(tr, NB_DTYPE_I32, 0);
    nb_var *row = nb_reshape(nb_mul(s, nb_scalar(tr, 2.0)), 2, (int64_t[]){1, 8});
    nb_var *u = nb_dynamic_update_slice(buf, row, (nb_var *[]){i, z});
    nb_var *a = nb_reshape(buf, 1, (int64_t[]){32});
    nb_var *s2 = nb_add(nb_mul(s, nb_scalar(tr, 0.5)),
                        nb_add(nb_slice(a, (int64_t[]){8}, (int64_t[]){16}, NULL),
                               nb_slice(a, (int64_t[]){0}, (int64_t[]){8}, NULL)));
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(u), nb_leaf(s2)}, out);
}

/* (d) a row of the carry read, added to and written back (a reverse loop's cotangent
 * buffer): every reader of the row comes before the update, so the row is a pointer;
 * (e) a row read and then cleared, its value read after the clearing: a copy. Rows of
 * DE_N elements: more than written-out code keeps in locals. */
#define DE_N 40
static nb_status alias_de_step(nb_trace *tr, const nb_tree *args, bool clear, nb_tree **out) {
    nb_var *i = nb_get(tr, args, "[0]"), *buf = nb_get(tr, args, "[1][0]"),
           *s = nb_get(tr, args, "[1][1]");
    nb_var *z = nb_scalar_typed(tr, NB_DTYPE_I32, 0);
    nb_var *row = nb_dynamic_slice(buf, (nb_var *[]){i, z}, (int64_t[]){1, DE_N});
    nb_var *s8 = nb_reshape(s, 2, (int64_t[]){1, DE_N});
    nb_var *upd = clear ? nb_full(tr, NB_DTYPE_F64, 2, (int64_t[]){1, DE_N}, 0.0)
                        : nb_add(nb_mul(row, nb_scalar(tr, 0.5)), s8);
    nb_var *u = nb_dynamic_update_slice(buf, upd, (nb_var *[]){i, z});
    nb_var *s2 = nb_mul(s, nb_scalar(tr, 0.5));
    if (clear) {
        s2 = nb_add(s2, nb_reshape(nb_exp(row), 1, (int64_t[]){DE_N}));
    }
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(u), nb_leaf(s2)}, out);
}

/* (g) a row whose update is the row shifted by one (a padded slice, which the fused
 * program reads as a view of the row) plus s: the program reads the row at other indices
 * than it writes, so the update is not made in the row itself (an element would change
 * before the next one read it) */
static nb_status alias_g_step(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    nb_var *i = nb_get(tr, args, "[0]"), *buf = nb_get(tr, args, "[1][0]"),
           *s = nb_get(tr, args, "[1][1]");
    nb_var *z = nb_scalar_typed(tr, NB_DTYPE_I32, 0);
    nb_var *row = nb_dynamic_slice(buf, (nb_var *[]){i, z}, (int64_t[]){1, DE_N});
    nb_var *prev = nb_pad(nb_slice(row, (int64_t[]){0, 0}, (int64_t[]){1, DE_N - 1}, NULL),
                          (int64_t[]){0, 1}, (int64_t[]){0, 0}, 0.0);
    nb_var *upd = nb_add(prev, nb_reshape(s, 2, (int64_t[]){1, DE_N}));
    nb_var *u = nb_dynamic_update_slice(buf, upd, (nb_var *[]){i, z});
    return nb_tree_tuple(nb_trace_ctx(tr), 2,
                         (nb_tree *[]){nb_leaf(u), nb_leaf(nb_mul(s, nb_scalar(tr, 0.5)))}, out);
}

static nb_status alias_d_step(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    return alias_de_step(tr, args, false, out);
}

static nb_status alias_e_step(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    return alias_de_step(tr, args, true, out);
}

/* (f) a row the body's loop-invariant prefix makes (from the bound w only), copied into a
 * new row of the carry at every step: written in place at the first step would leave the
 * later steps' copy (the body's rest) without its source */
static nb_status alias_f_step(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    nb_var *i = nb_get(tr, args, "[0]"), *buf = nb_get(tr, args, "[1][0]"),
           *s = nb_get(tr, args, "[1][1]"), *w = nb_get(tr, self, "w");
    nb_var *z = nb_scalar_typed(tr, NB_DTYPE_I32, 0);
    nb_var *wr =
        nb_slice(nb_reshape(w, 1, (int64_t[]){48}), (int64_t[]){0}, (int64_t[]){DE_N}, NULL);
    nb_var *row = nb_reshape(nb_mul(nb_exp(wr), nb_scalar(tr, 2.0)), 2, (int64_t[]){1, DE_N});
    nb_var *u = nb_dynamic_update_slice(buf, row, (nb_var *[]){i, z});
    return nb_tree_tuple(nb_trace_ctx(tr), 2,
                         (nb_tree *[]){nb_leaf(u), nb_leaf(nb_mul(s, nb_scalar(tr, 0.5)))}, out);
}

static nb_status alias_c_inner(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    nb_var *x = nb_get(tr, args, "[1]"), *r = nb_get(tr, self, "r");
    return nb_return(nb_add(nb_mul(x, nb_scalar(tr, 0.9)), nb_sin(r)), out);
}

static nb_status alias_c_step(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *i = nb_get(tr, args, "[0]"), *h = nb_get(tr, args, "[1][0]"),
           *acc = nb_get(tr, args, "[1][1]");
    nb_var *z = nb_scalar_typed(tr, NB_DTYPE_I32, 0);
    nb_var *row =
        nb_reshape(nb_dynamic_slice(h, (nb_var *[]){i, z}, (int64_t[]){1, 8}), 1, (int64_t[]){8});
    nb_tree *bound = NULL;
    nb_fn *inner = NULL;
    nb_status st = nb_tree_dict(ctx, 1, (const char *[]){"r"}, (nb_tree *[]){nb_leaf(row)}, &bound);
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "alias_c_inner", alias_c_inner, bound, &inner);
    }
    nb_tree_destroy(bound);
    const nb_tree *r = st == NB_OK ? nb_fori_loop(tr, 0, 3, inner, nb_leaf(acc), NULL) : NULL;
    nb_fn_destroy(inner);
    if (r == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    nb_var *h2 = nb_add(nb_mul(h, nb_scalar(tr, 0.5)), nb_scalar(tr, 0.25));
    return nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(h2), (nb_tree *)r}, out);
}

/* self: {"step": which step (0 a .. 6 g)}; args: (bound w or unused, carry) */
static nb_status alias_loops(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    int64_t which = 0;
    NBT_OK(ctx, nb_tree_get_int(nb_tree_get(self, "step"), &which));
    nb_fn_body steps[7] = {alias_a_step, alias_b_step, alias_c_step, alias_d_step,
                           alias_e_step, alias_f_step, alias_g_step};
    return fori_bound(tr, args, "w", steps[which], which == 0 ? 6 : 4, out);
}

static void test_alias_loops(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    for (int which = 0; which < 7; which++) {
        nb_tree *w = sin_leaf(ctx, 2, (int64_t[]){6, 8}, 48, 0.7), *carry = NULL;
        if (which == 0) {
            carry = sin_leaf(ctx, 1, (int64_t[]){8}, 8, 0.3);
        } else if (which >= 3) {
            carry =
                nbt_tuple_take(ctx, 2,
                               (nb_tree *[]){sin_leaf(ctx, 2, (int64_t[]){4, DE_N}, 4 * DE_N, 0.7),
                                             sin_leaf(ctx, 1, (int64_t[]){DE_N}, DE_N, 0.3)});
        } else {
            carry = nbt_tuple_take(ctx, 2,
                                   (nb_tree *[]){sin_leaf(ctx, 2, (int64_t[]){4, 8}, 32, 0.7),
                                                 sin_leaf(ctx, 1, (int64_t[]){8}, 8, 0.3)});
        }
        nb_tree *args = nbt_tuple_take(ctx, 2, (nb_tree *[]){w, carry}), *self = NULL;
        nb_tree *k = NULL;
        NBT_OK(ctx, nb_tree_int(ctx, which, &k));
        NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"step"}, &k, &self));
        nb_tree_destroy(k);
        nb_fn *fo = NULL, *fn = NULL, *off = NULL, *now = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "alias_loops", alias_loops, self, &fo));
        NBT_OK(ctx, nb_fn_create(ctx, "alias_loops_now", alias_loops, self, &fn));
        nb_jit_opts o = nb_jit_opts_default();
        o.native = NB_NATIVE_OFF;
        NBT_OK(ctx, nb_jit(fo, &o, &off));
        o.native = NB_NATIVE_NOW;
        NBT_OK(ctx, nb_jit(fn, &o, &now));
        char *src = fn_source(ctx, fn, args);
        if (which < 3 && which != 1) {
            assert_non_null(strstr(src, "u8 *A")); /* some slices are pointers */
        } else if (which == 3 || which == 4) {     /* (d) the row a pointer, (e) a copy */
            char mark[64];
            snprintf(mark, sizeof mark, "= dynamic_slice: f64[1,%d] */\n    u8 *A", DE_N);
            assert_true((strstr(src, mark) != NULL) == (which == 3));
        }
        /* (d): the update made in the row it reads (nbx_rows_reads_ok); (g): not */
        if (which == 3 || which == 6) {
            assert_true((strstr(src, "into its row of") != NULL) == (which == 3));
        }
        free(src);
        nb_tree *a = NULL, *b = NULL;
        NBT_OK(ctx, nb_fn_call(now, args, &b));
        assert_int_equal(stats_of(now).tier, 1);
        NBT_OK(ctx, nb_fn_call(off, args, &a));
        assert_same_bits(a, b);
        nb_tree_destroy(a);
        nb_tree_destroy(b);
        nb_tree_destroy(args);
        nb_tree_destroy(self);
        nb_fn_destroy(fo);
        nb_fn_destroy(fn);
        nb_fn_destroy(off);
        nb_fn_destroy(now);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* The gradient through a checkpointed loop: the reversal's kernel runs its cond, body and
 * step vjp as functions of the gradient's file; the interpreter's bits and the same
 * schedule (recomputed steps). */
static void test_reverse_same_bits(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *g = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "ckpt", body_ckpt, NULL, &f));
    NBT_OK(ctx, nb_grad(f, NULL, &g));
    nb_tree *args = vec_args(ctx, 7), *a = NULL, *b = NULL;
    char *src = fn_source(ctx, g, args);
    assert_non_null(strstr(src, "env->loop_reverse(&k, &f);"));
    assert_non_null(strstr(src, "static void nbx_f2(")); /* cond, body, step vjp */
    free(src);
    nb_jit_opts jo = nb_jit_opts_default();
    nb_fn *off = NULL, *now = NULL;
    jo.native = NB_NATIVE_OFF;
    NBT_OK(ctx, nb_jit(g, &jo, &off));
    jo.native = NB_NATIVE_NOW;
    NBT_OK(ctx, nb_jit(g, &jo, &now));
    nb_loop_stats s0, s1;
    NBT_OK(ctx, nb_fn_call(off, args, &a));
    NBT_OK(ctx, nb_loop_last_stats(&s0));
    NBT_OK(ctx, nb_fn_call(now, args, &b));
    NBT_OK(ctx, nb_loop_last_stats(&s1));
    assert_int_equal(stats_of(now).tier, 1);
    assert_same_bits(a, b);
    assert_true(s0.recomputed_steps > 0);
    assert_int_equal(s0.recomputed_steps, s1.recomputed_steps);
    assert_int_equal(s0.taped_steps, s1.taped_steps);
    nb_tree_destroy(a);
    nb_tree_destroy(b);
    nb_tree_destroy(args);
    nb_fn_destroy(off);
    nb_fn_destroy(now);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Reverse mode's tapes start undefined (ir.h's nbi_while_uninit): a bounded scan's taped run
 * writes each row before the reverse sweep reads it, so the zeros are not written. Checked
 * through the tiers' reuse of their buffers: a gradient run on inputs that fill every tape
 * with NaN, then on finite ones -- a row read before its write would carry a NaN over. Both
 * tiers give the bits of a fresh compile (after nb_ctx_clear_cache: new buffers) and of the
 * unrolled steps, and the written-out code has no fill for the tapes (a scan's stacked
 * outputs are buffers: their 1-row tapes, never written, keep theirs). */
#define UT 9 /* steps */
#define UN 24
static nb_status uninit_step(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *w = nb_get(tr, self, "w"), *c = nb_get(tr, args, "[0]"), *x = nb_get(tr, args, "[1]");
    nb_var *p = nb_reshape(nb_matmul(nb_reshape(c, 2, (int64_t[]){1, UN}), w), 1, (int64_t[]){UN});
    nb_var *c2 = nb_tanh(nb_add(p, x));
    nb_var *y = nb_mul(nb_sigmoid(c2), c);
    return nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(c2), nb_leaf(y)}, out);
}

/* args = (w, c0 [n], xs [steps, n]) -> sum(ys^2) + sum(c_T) for the scan of body (bound
 * {"w": w}; (c, x) -> (c', y)); self.unrolled: the steps traced one after another instead */
static nb_status scan_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, const char *name,
                           nb_fn_body body, int steps, int64_t n, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *c = nb_get(tr, args, "[1]"), *xs = nb_get(tr, args, "[2]");
    bool unrolled = false;
    nb_tree_get_bool(nb_tree_get(self, "unrolled"), &unrolled);
    nb_tree *wl = nb_leaf(nb_get(tr, args, "[0]")), *bound = NULL;
    nb_status st = nb_tree_dict(ctx, 1, (const char *[]){"w"}, &wl, &bound);
    nb_fn *step = NULL;
    if (st == NB_OK) {
        st = nb_fn_create(ctx, name, body, bound, &step);
    }
    nb_tree_destroy(bound);
    if (st != NB_OK) {
        return st;
    }
    nb_var *ys = NULL;
    if (unrolled) {
        nb_var *yl[64];
        assert_true(steps <= 64);
        for (int t = 0; t < steps; t++) {
            nb_var *x = nb_reshape(nb_slice(xs, (int64_t[]){t, 0}, (int64_t[]){t + 1, n}, NULL), 1,
                                   (int64_t[]){n});
            nb_tree *a = NULL;
            const nb_tree *r = NULL;
            if (nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(c), nb_leaf(x)}, &a) == NB_OK) {
                r = nb_apply(tr, step, a);
            }
            nb_tree_destroy(a);
            if (r == NULL) {
                nb_fn_destroy(step);
                return nb_trace_status(tr);
            }
            c = nb_var_of(tr, nb_tree_child(r, 0));
            yl[t] = nb_var_of(tr, nb_tree_child(r, 1));
        }
        ys = nb_stack(steps, yl, 0);
    } else {
        nb_loop_opts o = nb_loop_opts_default();
        o.kind = NB_LOOP_BOUNDED;
        o.max_steps = steps;
        const nb_tree *r = nb_scan(tr, step, nb_leaf(c), nb_leaf(xs), steps, &o);
        if (r == NULL) {
            nb_fn_destroy(step);
            return nb_trace_status(tr);
        }
        ys = nb_var_of(tr, nb_tree_child(r, 1));
        c = nb_var_of(tr, nb_tree_child(r, 0));
    }
    nb_fn_destroy(step);
    return nb_return(nb_add(nb_sum(nb_mul(ys, ys), NULL, 0, false), nb_sum(c, NULL, 0, false)),
                     out);
}

/* args = (w [UN, UN], c0 [UN], xs [UT, UN]) */
static nb_status uninit_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    return scan_loss(tr, self, args, "uninit_step", uninit_step, UT, UN, out);
}

/* The gradients (w.r.t. args[0]) of loss as a scan (g[0]) and unrolled (g[1]) */
static void grad_pair(nb_ctx *ctx, const char *name, nb_fn_body loss, nb_fn **g) {
    for (int u = 0; u < 2; u++) {
        nb_tree *fl = NULL, *self = NULL;
        nb_fn *f = NULL;
        NBT_OK(ctx, nb_tree_bool(ctx, u == 1, &fl));
        NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"unrolled"}, &fl, &self));
        NBT_OK(ctx, nb_fn_create(ctx, name, loss, self, &f));
        NBT_OK(ctx, nb_grad(f, NULL, &g[u]));
        nb_fn_destroy(f);
        nb_tree_destroy(fl);
        nb_tree_destroy(self);
    }
}

static nb_tree *uninit_args(nb_ctx *ctx, double poison) {
    double w[UN * UN], c0[UN], xs[UT * UN];
    for (int i = 0; i < UN * UN; i++) {
        w[i] = 0.3 * sin(0.71 * i + 0.4);
    }
    for (int i = 0; i < UN; i++) {
        c0[i] = 0.4 * cos(1.3 * i);
    }
    for (int i = 0; i < UT * UN; i++) {
        xs[i] = 0.2 * sin(0.17 * i + 1.0);
    }
    for (int i = 0; i < UN; i++) {
        c0[i] += poison; /* NaN: every step's carry, so every row of every float tape, is NaN */
    }
    nb_array *a[3] = {nbt_arr_f64(ctx, 2, (const int64_t[]){UN, UN}, w),
                      nbt_arr_f64(ctx, 1, (const int64_t[]){UN}, c0),
                      nbt_arr_f64(ctx, 2, (const int64_t[]){UT, UN}, xs)};
    nb_tree *l[3];
    for (int i = 0; i < 3; i++) {
        NBT_OK(ctx, nb_tree_array(a[i], &l[i]));
        nb_array_destroy(a[i]);
    }
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, l, &t));
    for (int i = 0; i < 3; i++) {
        nb_tree_destroy(l[i]);
    }
    return t;
}

static void test_taped_rows_uninit(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *g[2] = {NULL, NULL};
    grad_pair(ctx, "uninit_loss", uninit_loss, g);
    nb_tree *bad = uninit_args(ctx, NAN), *good = uninit_args(ctx, 0.0);
    char *src = fn_source(ctx, g[0], good);
    /* the carry c and the stored residuals are taped without a fill; ys (a buffer) has its
     * 1-row tape cleared */
    const char *mark = "a tape written row by row";
    int n_marks = 0;
    for (const char *p = strstr(src, mark); p != NULL; p = strstr(p + 1, mark)) {
        n_marks++;
    }
    assert_true(n_marks >= 1);
    free(src);
    nb_tree *ref = NULL, *fresh = NULL;
    NBT_OK(ctx, nb_fn_call(g[1], good, &ref)); /* unrolled */
    nb_jit_opts jo = nb_jit_opts_default();
    for (int mode = 0; mode < 2; mode++) {
        jo.native = mode == 0 ? NB_NATIVE_OFF : NB_NATIVE_NOW;
        nb_fn *j = NULL;
        NBT_OK(ctx, nb_jit(g[0], &jo, &j));
        nb_tree *r0 = NULL, *r1 = NULL, *r2 = NULL;
        NBT_OK(ctx, nb_fn_call(j, bad, &r0));
        double w0 = ((const double *)nb_array_data(nb_tree_get_array(r0)))[0]; /* d/dw */
        assert_true(isnan(w0));                /* the poisoned run went through NaN everywhere */
        NBT_OK(ctx, nb_fn_call(j, good, &r1)); /* on the poisoned run's buffers */
        assert_int_equal(stats_of(j).tier, mode);
        nb_ctx_clear_cache(ctx);
        NBT_OK(ctx, nb_fn_call(j, good, &r2)); /* compiled again: fresh buffers */
        assert_int_equal(stats_of(j).tier, mode);
        assert_same_bits(r1, r2);
        assert_same_bits(r1, ref);
        if (mode == 0) {
            fresh = r1;
        } else {
            assert_same_bits(r1, fresh);
            nb_tree_destroy(r1);
        }
        nb_tree_destroy(r0);
        nb_tree_destroy(r2);
        nb_fn_destroy(j);
    }
    nb_tree_destroy(fresh);
    nb_tree_destroy(ref);
    nb_tree_destroy(bad);
    nb_tree_destroy(good);
    nb_fn_destroy(g[0]);
    nb_fn_destroy(g[1]);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A zero full that only loops read as a carry's start is never written (exec.c's unread
 * zero fills): the gradient of a bounded scan over [ZT, ZN] f32 (128 KB tapes and stacked
 * outputs, above the resident size) has two in its optimized IR but no instruction for them
 * in the written-out code (every instruction has a "%id = op: type" comment there); both
 * tiers still give the bits of the unrolled steps, run after run. */
#define ZT 16
#define ZN 2048
static nb_status zfill_step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *w = nb_get(tr, self, "w"), *c = nb_get(tr, args, "[0]"), *x = nb_get(tr, args, "[1]");
    nb_var *c2 = nb_tanh(nb_add(nb_mul(c, w), x));
    return nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(c2), nb_leaf(nb_mul(c2, c))}, out);
}

/* args = (w [ZN], c0 [ZN], xs [ZT, ZN]) */
static nb_status zfill_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    return scan_loss(tr, self, args, "zfill_step", zfill_step, ZT, ZN, out);
}

static void test_unread_zero_fills(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *g[2] = {NULL, NULL};
    grad_pair(ctx, "zfill_loss", zfill_loss, g);
    static float w[ZN], c0[ZN], xs[ZT * ZN];
    for (int i = 0; i < ZN; i++) {
        w[i] = 0.9f * sinf(0.37f * (float)i);
        c0[i] = 0.5f * cosf(0.11f * (float)i);
    }
    for (int i = 0; i < ZT * ZN; i++) {
        xs[i] = 0.3f * sinf(0.013f * (float)i + 1.0f);
    }
    nb_tree *l[3], *args = NULL;
    const float *data[3] = {w, c0, xs};
    const int64_t shapes[3][2] = {{ZN, 0}, {ZN, 0}, {ZT, ZN}};
    for (int i = 0; i < 3; i++) {
        nb_array *a = NULL;
        NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F32, i == 2 ? 2 : 1, shapes[i], data[i], &a));
        NBT_OK(ctx, nb_tree_array(a, &l[i]));
        nb_array_destroy(a);
    }
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, l, &args));
    for (int i = 0; i < 3; i++) {
        nb_tree_destroy(l[i]);
    }
    /* the zeros the tapes and ys start from ([ZT, ZN], also bound data of the reverse loop
     * that its body does not read) and the stacked outputs' 1-row tape's ([1, ZT, ZN]) are
     * in the optimized IR ... */
    char shape[2][64], sh[64];
    snprintf(shape[0], sizeof shape[0], "f32[%d,%d] = full {value=0}", ZT, ZN);
    snprintf(shape[1], sizeof shape[1], "f32[1,%d,%d] = full {value=0}", ZT, ZN);
    size_t need = 0;
    assert_int_equal(nb_fn_format_ir(g[0], args, NB_IR_OPTIMIZED, NULL, 0, &need),
                     NB_ERR_TRUNCATED);
    char *ir = malloc(need + 1);
    assert_non_null(ir);
    NBT_OK(ctx, nb_fn_format_ir(g[0], args, NB_IR_OPTIMIZED, ir, need + 1, NULL));
    assert_non_null(strstr(ir, shape[0]));
    assert_non_null(strstr(ir, shape[1]));
    free(ir);
    /* ... without an instruction (written out as a comment line "%id = full: f32[..]") */
    char *src = fn_source(ctx, g[0], args);
    snprintf(sh, sizeof sh, "= full: f32[%d,%d]", ZT, ZN);
    assert_null(strstr(src, sh));
    snprintf(sh, sizeof sh, "= full: f32[1,%d,%d]", ZT, ZN);
    assert_null(strstr(src, sh));
    assert_non_null(strstr(src, "= while: ")); /* (the comments' form) */
    /* the taped run's stored value (tanh's derivative needs c2) is written into its tape's
     * row by the program that makes it (codegen.c's nbx_rows) */
    assert_non_null(strstr(src, "into its row of"));
    free(src);
    nb_tree *ref = NULL;
    NBT_OK(ctx, nb_fn_call(g[1], args, &ref));
    nb_jit_opts jo = nb_jit_opts_default();
    for (int mode = 0; mode < 2; mode++) {
        jo.native = mode == 0 ? NB_NATIVE_OFF : NB_NATIVE_NOW;
        nb_fn *j = NULL;
        NBT_OK(ctx, nb_jit(g[0], &jo, &j));
        for (int rep = 0; rep < 2; rep++) { /* the second run on the first's buffers */
            nb_tree *r = NULL;
            NBT_OK(ctx, nb_fn_call(j, args, &r));
            assert_int_equal(stats_of(j).tier, mode);
            assert_same_bits(r, ref);
            nb_tree_destroy(r);
        }
        nb_fn_destroy(j);
    }
    nb_tree_destroy(ref);
    nb_tree_destroy(args);
    nb_fn_destroy(g[0]);
    nb_fn_destroy(g[1]);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A checkpointed loop over a body that has a checkpointed loop of its own: the outer
 * reversal's functions are listed together (the inner loops' after them), so both
 * reversals run from the file -- no kernel call left -- with the interpreter's bits. */
static nb_status body_outer_ckpt(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_fn *step = NULL;
    nb_status st = nb_fn_create(ctx, "step", body_step, NULL, &step);
    if (st != NB_OK) {
        return st;
    }
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = NB_LOOP_CHECKPOINTED;
    o.checkpoints = 2;
    const nb_tree *r = nb_fori_loop(tr, 0, 7, step, nb_tree_child(args, 1), &o);
    nb_fn_destroy(step);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *x = nb_var_of(tr, r);
    return nb_return(
        nb_add(x, nb_mul(nb_cast(nb_get(tr, args, "[0]"), NB_DTYPE_F64), nb_scalar(tr, 1e-3))),
        out);
}

static nb_status body_ckpt_nested(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                  nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_fn *outer = NULL;
    nb_status st = nb_fn_create(ctx, "outer", body_outer_ckpt, NULL, &outer);
    if (st != NB_OK) {
        return st;
    }
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = NB_LOOP_CHECKPOINTED;
    o.checkpoints = 3;
    const nb_tree *r = nb_fori_loop(tr, 0, 30, outer, nb_tree_child(args, 0), &o);
    nb_fn_destroy(outer);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *x = nb_var_of(tr, r);
    return nb_return(nb_sum(nb_mul(x, x), NULL, 0, false), out);
}

static void test_reverse_nested(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *g = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "ckpt_nested", body_ckpt_nested, NULL, &f));
    NBT_OK(ctx, nb_grad(f, NULL, &g));
    nb_tree *args = vec_args(ctx, 7), *a = NULL, *b = NULL;
    char *src = fn_source(ctx, g, args);
    assert_non_null(strstr(src, "env->loop_reverse(&k, &f);"));
    assert_null(strstr(src, "env->kern[")); /* every loop, outer and inner, from the file */
    free(src);
    nb_jit_opts jo = nb_jit_opts_default();
    nb_fn *off = NULL, *now = NULL;
    jo.native = NB_NATIVE_OFF;
    NBT_OK(ctx, nb_jit(g, &jo, &off));
    jo.native = NB_NATIVE_NOW;
    NBT_OK(ctx, nb_jit(g, &jo, &now));
    NBT_OK(ctx, nb_fn_call(off, args, &a));
    NBT_OK(ctx, nb_fn_call(now, args, &b));
    assert_int_equal(stats_of(now).tier, 1);
    assert_same_bits(a, b);
    nb_tree_destroy(a);
    nb_tree_destroy(b);
    nb_tree_destroy(args);
    nb_fn_destroy(off);
    nb_fn_destroy(now);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A loop whose cond calls the loop's own body (a jitted function kept as a call): the same
 * executable runs inside the cond on other buffers, which changes its output plan between
 * the loop's steps -- each run is planned again, as the interpreter does, so the bits are
 * the interpreter's. */
static nb_fn *shared_body;

static nb_status body_swap(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *a = nb_get(tr, args, "[0]"), *b = nb_get(tr, args, "[1]");
    nb_var *o0 = nb_add(nb_mul(b, nb_scalar(tr, 0.5)), nb_sum(nb_mul(b, b), NULL, 0, false));
    nb_var *o1 = nb_add(nb_mul(a, nb_scalar(tr, 0.25)), nb_sum(nb_mul(a, a), NULL, 0, false));
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(o0), nb_leaf(o1)}, out);
}

static nb_status cond_swap(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *r = nb_apply(tr, shared_body, args);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *x = nb_get(tr, r, "[0]");
    return nb_return(nb_lt(nb_sum(nb_mul(x, x), NULL, 0, false), nb_scalar(tr, 1e6)), out);
}

static nb_status body_swap_loop(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    (void)self;
    nb_fn *c = NULL;
    nb_status st = nb_fn_create(nb_trace_ctx(tr), "cond_swap", cond_swap, NULL, &c);
    if (st != NB_OK) {
        return st;
    }
    nb_loop_opts o = nb_loop_opts_default();
    o.max_steps = 50;
    const nb_tree *r = nb_while_loop(tr, c, shared_body, args, &o);
    nb_fn_destroy(c);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)r);
    return NB_OK;
}

static void test_loop_shared_body(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *sw = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "swap", body_swap, NULL, &sw));
    nb_jit_opts jo = nb_jit_opts_default();
    jo.inline_calls = false;
    jo.native = NB_NATIVE_OFF;
    NBT_OK(ctx, nb_jit(sw, &jo, &shared_body));
    nb_fn_destroy(sw);
    double v[7], w[7];
    for (int q = 0; q < 7; q++) {
        v[q] = 0.01 * q - 0.02;
        w[q] = 0.03 * q + 0.01;
    }
    nb_array *a0 = nbt_arr_f64(ctx, 1, (const int64_t[]){7}, v);
    nb_array *b0 = nbt_arr_f64(ctx, 1, (const int64_t[]){7}, w);
    nb_tree *l[2] = {NULL, NULL};
    NBT_OK(ctx, nb_tree_array(a0, &l[0]));
    NBT_OK(ctx, nb_tree_array(b0, &l[1]));
    nb_array_destroy(a0);
    nb_array_destroy(b0);
    nb_tree *args = nbt_tuple_take(ctx, 2, l), *a = NULL, *b = NULL;
    char *src = source_of(ctx, body_swap_loop, args);
    assert_non_null(strstr(src, "nbx_f1(eb, bi, bo, bd);")); /* the loop is written out */
    free(src);
    nb_fn *off = jit_mode(ctx, body_swap_loop, "swap_loop", NB_NATIVE_OFF);
    nb_fn *now = jit_mode(ctx, body_swap_loop, "swap_loop_now", NB_NATIVE_NOW);
    NBT_OK(ctx, nb_fn_call(off, args, &a));
    NBT_OK(ctx, nb_fn_call(now, args, &b));
    assert_int_equal(stats_of(now).tier, 1);
    assert_same_bits(a, b);
    nb_tree_destroy(a);
    nb_tree_destroy(b);
    nb_tree_destroy(args);
    nb_fn_destroy(off);
    nb_fn_destroy(now);
    nb_fn_destroy(shared_body);
    shared_body = NULL;
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* AUTO: interpreted until hot (NABLA_NATIVE_HOT, set low here), then compiled on the
 * compile thread and swapped in between calls; every call gives the same bits. */
static void test_auto_swaps_in(void **state) {
    (void)state;
    /* a cache of its own: the body's code is in none yet (the tests above compiled it) */
    char dir[] = "/tmp/nabla-test-native-auto-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *was = strdup(getenv("NABLA_NATIVE_CACHE"));
    setenv("NABLA_NATIVE_CACHE", dir, 1);
    nbi_native_config_reset();
    nb_ctx *ctx = nbt_ctx();
    nb_fn *off = jit_mode(ctx, body_mix, "mix_ref", NB_NATIVE_OFF);
    nb_fn *aut = jit_mode(ctx, body_mix, "mix_auto", NB_NATIVE_AUTO);
    nb_tree *args = mix_args(ctx, 1), *ref = NULL;
    NBT_OK(ctx, nb_fn_call(off, args, &ref));
    int64_t calls = 0;
    double t0 = now_s();
    bool interpreted_first = false;
    while (stats_of(aut).tier == 0 || calls < 2) {
        nb_tree *b = NULL;
        NBT_OK(ctx, nb_fn_call(aut, args, &b));
        interpreted_first = interpreted_first || (calls == 0 && stats_of(aut).tier == 0);
        assert_same_bits(ref, b);
        nb_tree_destroy(b);
        calls++;
        if (now_s() - t0 > 60) {
            fail_msg("AUTO: no native code after %lld calls and 60 s", (long long)calls);
        }
        if (stats_of(aut).tier == 0) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    assert_true(interpreted_first);
    nb_tree *b = NULL;
    NBT_OK(ctx, nb_fn_call(aut, args, &b));
    assert_int_equal(stats_of(aut).tier, 1);
    assert_same_bits(ref, b);
    print_message("AUTO: native after %lld calls, %.3f s\n", (long long)calls, now_s() - t0);
    nb_tree_destroy(b);
    nb_fn_destroy(aut);
    nb_ctx_clear_cache(ctx); /* the executable and its loaded code go */
    /* the cache is warm now: a fresh function in AUTO runs native code from its first call */
    aut = jit_mode(ctx, body_mix, "mix_auto_warm", NB_NATIVE_AUTO);
    NBT_OK(ctx, nb_fn_call(aut, args, &b));
    assert_int_equal(stats_of(aut).tier, 1);
    assert_same_bits(ref, b);
    nb_tree_destroy(b);
    nb_tree_destroy(ref);
    nb_tree_destroy(args);
    nb_fn_destroy(off);
    nb_fn_destroy(aut);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
    setenv("NABLA_NATIVE_CACHE", was, 1);
    free(was);
    nbi_native_config_reset();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* The C source is there to read: nb_fn_format_ir(NB_IR_NATIVE_C). */
static void test_format_c(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "mix", body_mix, NULL, &f));
    nb_tree *args = mix_args(ctx, 0);
    size_t need = 0;
    assert_int_equal(nb_fn_format_ir(f, args, NB_IR_NATIVE_C, NULL, 0, &need), NB_ERR_TRUNCATED);
    char *buf = malloc(need + 1);
    assert_non_null(buf);
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_NATIVE_C, buf, need + 1, NULL));
    assert_non_null(strstr(buf, "void nbx_run("));
    assert_non_null(strstr(buf, "fused programs written out"));
    assert_null(strstr(buf, "#include")); /* self-contained */
    free(buf);
    nb_tree_destroy(args);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A compiler that fails: the interpreter runs (same results), and the log says why. */
typedef struct log_rec {
    char last[1024];
    int n;
} log_rec;

static void log_cb(void *ud, nb_log_level level, const char *msg) {
    log_rec *r = ud;
    if (level <= NB_LOG_LEVEL_WARN && strstr(msg, "native tier") != NULL) {
        snprintf(r->last, sizeof r->last, "%s", msg);
        r->n++;
    }
}

static void test_fallback_logged(void **state) {
    (void)state;
    log_rec rec = {{0}, 0};
    nb_ctx_opts o = nb_ctx_opts_default();
    o.log = log_cb;
    o.log_ud = &rec;
    o.n_threads = 1;
    nb_ctx *ctx = NULL;
    assert_int_equal(nb_ctx_create(&o, &ctx), NB_OK);
    setenv("NABLA_CC", "/bin/false", 1);
    nbi_native_config_reset();
    nb_fn *off = jit_mode(ctx, body_mix, "mix_ref", NB_NATIVE_OFF);
    nb_fn *now = jit_mode(ctx, body_mix, "mix_bad_cc", NB_NATIVE_NOW);
    nb_tree *args = mix_args(ctx, 2), *a = NULL, *b = NULL;
    NBT_OK(ctx, nb_fn_call(off, args, &a));
    NBT_OK(ctx, nb_fn_call(now, args, &b));
    assert_int_equal(stats_of(now).tier, 0);
    assert_same_bits(a, b);
    assert_true(rec.n >= 1);
    print_message("logged: %s\n", rec.last);
    assert_non_null(strstr(rec.last, "false"));
    unsetenv("NABLA_CC");
    nbi_native_config_reset();
    nb_tree_destroy(a);
    nb_tree_destroy(b);
    nb_tree_destroy(args);
    nb_fn_destroy(off);
    nb_fn_destroy(now);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A second context compiling the same program: a hit in the disk cache (a dlopen, no
 * compiler), much faster than the first compile. */
static void test_warm_cache(void **state) {
    (void)state;
    double t[2];
    for (int round = 0; round < 2; round++) {
        nb_ctx *ctx = nbt_ctx();
        nb_fn *now = jit_mode(ctx, body_loop, "loop_cache", NB_NATIVE_NOW);
        nb_tree *args = vec_args(ctx, 5), *b = NULL;
        double t0 = now_s();
        NBT_OK(ctx, nb_fn_call(now, args, &b));
        t[round] = now_s() - t0;
        assert_int_equal(stats_of(now).tier, 1);
        nb_tree_destroy(b);
        nb_tree_destroy(args);
        nb_fn_destroy(now);
        nbt_assert_no_live(ctx);
        nb_ctx_destroy(ctx);
    }
    print_message("first call with compile %.1f ms, with a warm cache %.1f ms\n", 1e3 * t[0],
                  1e3 * t[1]);
    assert_true(t[1] < t[0]);
}

int main(void) {
    char dir[] = "/tmp/nabla-test-native-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        return 1;
    }
    setenv("NABLA_NATIVE_CACHE", dir, 1);
    setenv("NABLA_NATIVE_HOT", "200", 1);
    unsetenv("NABLA_NATIVE");
    unsetenv("NABLA_CC");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_now_same_bits),     cmocka_unit_test(test_native_no_fma),
        cmocka_unit_test(test_big_same_bits),     cmocka_unit_test(test_tiled_same_bits),
        cmocka_unit_test(test_loop_same_bits),    cmocka_unit_test(test_loop_prefix),
        cmocka_unit_test(test_reverse_same_bits), cmocka_unit_test(test_reverse_nested),
        cmocka_unit_test(test_loop_shared_body),  cmocka_unit_test(test_auto_swaps_in),
        cmocka_unit_test(test_format_c),          cmocka_unit_test(test_fallback_logged),
        cmocka_unit_test(test_warm_cache),        cmocka_unit_test(test_alias_same_bits),
        cmocka_unit_test(test_alias_loops),       cmocka_unit_test(test_taped_rows_uninit),
        cmocka_unit_test(test_unread_zero_fills),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
        return 1;
    }
    return rc;
}
