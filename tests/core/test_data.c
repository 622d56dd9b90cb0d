/*
 * test_data.c -- train/test splits, standardisation and the minibatch batcher (data.h):
 * sizes and rounding, rows kept with their labels, determinism from the key, every row
 * once per epoch in the documented order, fresh shuffles per epoch, no allocation per
 * batch, misuse, and the UCI digits data through all of it.
 */
#define _POSIX_C_SOURCE 200809L

#include "nbtest.h"

#include <stdio.h>
#include <unistd.h>
#include <zlib.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* x f64[n, 3] with row i = (i, 10 i, 100 i); y i64[n] = i. */
static void make_xy(nb_ctx *ctx, int64_t n, nb_array **x, nb_array **y) {
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){n, 3}, x));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I64, 1, &n, y));
    double *xd = nb_array_data(*x);
    int64_t *yd = nb_array_data(*y);
    for (int64_t i = 0; i < n; i++) {
        xd[3 * i] = (double)i;
        xd[3 * i + 1] = 10.0 * (double)i;
        xd[3 * i + 2] = 100.0 * (double)i;
        yd[i] = i;
    }
}

static nb_array *key_of(nb_ctx *ctx, uint64_t seed) {
    nb_array *k = NULL;
    NBT_OK(ctx, nb_random_key(ctx, seed, &k));
    return k;
}

/* Every row of (x, y) made by make_xy is still paired: x[r] = (y, 10 y, 100 y). */
static void assert_paired(const nb_array *x, const nb_array *y) {
    NBT_EQ_I64(nb_array_dim(x, 0), nb_array_dim(y, 0));
    const double *xd = nb_array_data(x);
    const int64_t *yd = nb_array_data(y);
    for (int64_t r = 0; r < nb_array_dim(x, 0); r++) {
        NBT_EQ_F64(xd[3 * r], (double)yd[r]);
        NBT_EQ_F64(xd[3 * r + 1], 10.0 * (double)yd[r]);
        NBT_EQ_F64(xd[3 * r + 2], 100.0 * (double)yd[r]);
    }
}

/* ---- split -------------------------------------------------------------------------- */

static void test_split_sizes_pairs_and_order(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *x = NULL, *y = NULL, *key = key_of(ctx, 7);
    make_xy(ctx, 50, &x, &y);
    nb_array *xtr = NULL, *ytr = NULL, *xte = NULL, *yte = NULL;
    NBT_OK(ctx, nb_data_split(x, y, key, 0.2, &xtr, &ytr, &xte, &yte));
    NBT_EQ_I64(nb_array_dim(xtr, 0), 40);
    NBT_EQ_I64(nb_array_dim(xte, 0), 10);
    NBT_EQ_I64(nb_array_dim(xtr, 1), 3);
    assert_paired(xtr, ytr);
    assert_paired(xte, yte);
    /* the documented order: test = p[0 .. 10), train = p[10 .. 50) */
    nb_array *p = NULL;
    NBT_OK(ctx, nb_random_permutation(key, 50, &p));
    const int64_t *pd = nb_array_data(p);
    for (int i = 0; i < 10; i++) {
        NBT_EQ_I64(((const int64_t *)nb_array_data(yte))[i], pd[i]);
    }
    for (int i = 0; i < 40; i++) {
        NBT_EQ_I64(((const int64_t *)nb_array_data(ytr))[i], pd[10 + i]);
    }
    /* determinism: the same key splits the same way; another key differently */
    nb_array *xtr2 = NULL, *ytr2 = NULL, *xte2 = NULL, *yte2 = NULL, *k2 = key_of(ctx, 8);
    bool eq = false;
    NBT_OK(ctx, nb_data_split(x, y, key, 0.2, &xtr2, &ytr2, &xte2, &yte2));
    NBT_OK(ctx, nb_array_identical(ytr, ytr2, &eq));
    NBT_TRUE(eq);
    NBT_OK(ctx, nb_array_identical(xte, xte2, &eq));
    NBT_TRUE(eq);
    nb_array *a[4] = {xtr2, ytr2, xte2, yte2};
    for (int i = 0; i < 4; i++) {
        nb_array_destroy(a[i]);
    }
    NBT_OK(ctx, nb_data_split(x, y, k2, 0.2, &xtr2, &ytr2, &xte2, &yte2));
    NBT_OK(ctx, nb_array_identical(yte, yte2, &eq));
    NBT_TRUE(!eq);
    assert_paired(xtr2, ytr2);
    nb_array *b[4] = {xtr2, ytr2, xte2, yte2};
    for (int i = 0; i < 4; i++) {
        nb_array_destroy(b[i]);
    }
    nb_array *c[7] = {xtr, ytr, xte, yte, p, k2, key};
    for (int i = 0; i < 7; i++) {
        nb_array_destroy(c[i]);
    }
    nb_array_destroy(x);
    nb_array_destroy(y);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* n_test = round(f n), to nearest, halves up, also where f n is a hair below the half. */
static void test_split_rounding_dtypes_no_labels(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = key_of(ctx, 1);
    static const struct {
        int64_t n;
        double f;
        int64_t n_test;
    } R[] = {{1797, 0.2, 359}, {10, 0.15, 2}, {5, 0.5, 3}, {10, 0.0, 0},
             {10, 0.3, 3},     {3, 0.1, 0},   {7, 0.8, 6}};
    static const nb_dtype DT[] = {NB_DTYPE_F32, NB_DTYPE_I32, NB_DTYPE_BOOL, NB_DTYPE_I64};
    for (size_t i = 0; i < sizeof R / sizeof R[0]; i++) {
        /* features of any dtype and rank (images: [n, 2, 2]); no labels */
        nb_dtype dt = DT[i % 4];
        nb_array *x = NULL, *xtr = NULL, *xte = NULL, *ytr = (nb_array *)&ytr, *yte = NULL;
        NBT_OK(ctx, nb_array_arange(ctx, dt == NB_DTYPE_BOOL ? NB_DTYPE_I32 : dt, 0,
                                    (double)(R[i].n * 4), 1, &x));
        if (dt == NB_DTYPE_BOOL) {
            nb_array *bx = NULL;
            NBT_OK(ctx, nb_array_cast(x, NB_DTYPE_BOOL, &bx));
            nb_array_destroy(x);
            x = bx;
        }
        nb_array *x3 = NULL;
        NBT_OK(ctx, nb_array_reshape(x, 3, (int64_t[]){R[i].n, 2, 2}, &x3));
        NBT_OK(ctx, nb_data_split(x3, NULL, key, R[i].f, &xtr, &ytr, &xte, &yte));
        NBT_EQ_I64(nb_array_dim(xte, 0), R[i].n_test);
        NBT_EQ_I64(nb_array_dim(xtr, 0), R[i].n - R[i].n_test);
        NBT_EQ_I64(nb_array_rank(xtr), 3);
        NBT_EQ_I64(nb_array_dtype(xtr), dt);
        NBT_TRUE(ytr == NULL && yte == NULL);
        if (dt != NB_DTYPE_BOOL) { /* rows intact: row r holds 4 consecutive values */
            for (int64_t r = 0; r < nb_array_dim(xtr, 0); r++) {
                double v0 = 0, v3 = 0;
                NBT_OK(ctx, nb_array_get_flat(xtr, 4 * r, &v0));
                NBT_OK(ctx, nb_array_get_flat(xtr, 4 * r + 3, &v3));
                NBT_EQ_F64(v3, v0 + 3);
                NBT_EQ_F64(fmod(v0, 4), 0);
            }
        }
        nb_array_destroy(xtr);
        nb_array_destroy(xte);
        nb_array_destroy(x3);
        nb_array_destroy(x);
    }
    nb_array_destroy(key);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_split_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *x = NULL, *y = NULL, *y9 = NULL, *s = NULL, *fkey = NULL, *key = key_of(ctx, 1);
    make_xy(ctx, 10, &x, &y);
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){9}, &y9));
    NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_F32, 1, &s));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, &fkey));
    nb_array *a = (nb_array *)&a, *b = (nb_array *)&b, *c = (nb_array *)&c, *d = (nb_array *)&d;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_data_split(x, y, key, 1.0, &a, &b, &c, &d));
    NBT_ERRMSG_HAS(ctx, "nb_data_split: test_fraction is 1; it must be in [0, 1)");
    NBT_TRUE(a == NULL && b == NULL && c == NULL && d == NULL);
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_data_split(x, y, key, NAN, &a, &b, &c, &d));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_data_split(x, y, key, -0.1, &a, &b, &c, &d));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_data_split(x, y, key, 0.96, &a, &b, &c, &d));
    NBT_ERRMSG_HAS(ctx, "x is f64[10,3]: a test_fraction of 0.96 takes 10 of its 10 rows and "
                        "leaves none to train on");
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_data_split(x, y9, key, 0.2, &a, &b, &c, &d));
    NBT_ERRMSG_HAS(ctx, "nb_data_split: x is f64[10,3] but y is i32[9]: they need the same "
                        "number of rows");
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_data_split(s, NULL, key, 0.2, &a, NULL, &c, NULL));
    NBT_ERRMSG_HAS(ctx, "nb_data_split: x is f32[]; samples are the rows");
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_data_split(x, y, fkey, 0.2, &a, &b, &c, &d));
    NBT_ERRMSG_HAS(ctx, "nb_data_split: key is f32[2]; a key is an i32[2] array");
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_data_split(x, y, key, 0.2, &a, NULL, &c, &d));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_data_split(NULL, y, key, 0.2, &a, &b, &c, &d));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_data_split(x, y, NULL, 0.2, &a, &b, &c, &d));
    NBT_TRUE(a == NULL && b == NULL && c == NULL && d == NULL);
    nb_array *all[6] = {x, y, y9, s, fkey, key};
    for (int i = 0; i < 6; i++) {
        nb_array_destroy(all[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- standardisation ---------------------------------------------------------------- */

static void test_standardize(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    /* 4 training rows, 3 features; feature 2 constant (0.1: no exact sum) */
    const double tr[12] = {1, -2, 0.1, 2, 0, 0.1, 3, 2, 0.1, 6, 4, 0.1};
    const double te[6] = {2, 1, 0.1, 4, -1, 5};
    for (int k = 0; k < 2; k++) {
        nb_dtype dt = k ? NB_DTYPE_F32 : NB_DTYPE_F64;
        nb_array *t64 = nbt_arr_f64(ctx, 2, (int64_t[]){4, 3}, tr);
        nb_array *e64 = nbt_arr_f64(ctx, 2, (int64_t[]){2, 3}, te);
        nb_array *train = NULL, *test = NULL, *mean = NULL, *sd = NULL;
        NBT_OK(ctx, nb_array_cast(t64, dt, &train));
        NBT_OK(ctx, nb_array_cast(e64, dt, &test));
        NBT_OK(ctx, nb_data_standardize(train, test, &mean, &sd));
        NBT_EQ_I64(nb_array_rank(mean), 1);
        NBT_EQ_I64(nb_array_dim(mean, 0), 3);
        NBT_EQ_I64(nb_array_dtype(sd), dt);
        double m[3], s[3],
            want_m[3] = {3, 1, 0.1},
            want_s[3] = {sqrt((4 + 1 + 0 + 9) / 4.0), sqrt((9 + 1 + 1 + 9) / 4.0), 0};
        double tol = k ? 1e-6 : 1e-15;
        for (int f = 0; f < 3; f++) {
            NBT_OK(ctx, nb_array_get_flat(mean, f, &m[f]));
            NBT_OK(ctx, nb_array_get_flat(sd, f, &s[f]));
            NBT_NEAR(m[f], want_m[f], tol * 4);
            NBT_NEAR(s[f], want_s[f], tol * 4);
        }
        NBT_EQ_F64(s[2], 0); /* constant: exactly 0, so only centred */
        for (int r = 0; r < 4; r++) {
            for (int f = 0; f < 3; f++) {
                double v = 0;
                NBT_OK(ctx, nb_array_get_flat(train, 3 * r + f, &v));
                double want = f == 2 ? 0.0 : (tr[3 * r + f] - want_m[f]) / want_s[f];
                NBT_NEAR(v, want, tol * 8);
                if (f == 2) {
                    NBT_EQ_F64(v, 0);
                }
            }
        }
        for (int r = 0; r < 2; r++) { /* the test rows use the training statistics */
            for (int f = 0; f < 3; f++) {
                double v = 0;
                NBT_OK(ctx, nb_array_get_flat(test, 3 * r + f, &v));
                double want =
                    f == 2 ? te[3 * r + f] - 0.1 : (te[3 * r + f] - want_m[f]) / want_s[f];
                NBT_NEAR(v, want, tol * 8);
            }
        }
        /* apply: later data, the same transformation as test got */
        nb_array *later = NULL;
        bool same = false;
        NBT_OK(ctx, nb_array_cast(e64, dt, &later));
        NBT_OK(ctx, nb_data_standardize_apply(later, mean, sd));
        NBT_OK(ctx, nb_array_identical(later, test, &same));
        NBT_TRUE(same);
        /* misuse */
        nb_array *ints = NULL, *wide = NULL;
        NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 2, (int64_t[]){4, 3}, &ints));
        NBT_OK(ctx, nb_array_zeros(ctx, dt, 2, (int64_t[]){2, 4}, &wide));
        NBT_STATUS(ctx, NB_ERR_DTYPE, nb_data_standardize(ints, NULL, NULL, NULL));
        NBT_ERRMSG_HAS(ctx, "nb_data_standardize: train is i32[4,3]; standardised features are "
                            "f32 or f64 (convert with nb_array_cast first)");
        NBT_STATUS(ctx, NB_ERR_SHAPE, nb_data_standardize(train, wide, NULL, NULL));
        NBT_ERRMSG_HAS(ctx, "but test is");
        NBT_STATUS(ctx, NB_ERR_SHAPE, nb_data_standardize_apply(wide, mean, sd));
        NBT_ERRMSG_HAS(ctx, "nb_data_standardize_apply: x is");
        NBT_STATUS(ctx, NB_ERR_MISUSE, nb_data_standardize(NULL, NULL, NULL, NULL));
        nb_array *all[10] = {t64, e64, train, test, mean, sd, later, ints, wide, NULL};
        for (int i = 0; i < 10; i++) {
            nb_array_destroy(all[i]);
        }
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- the batcher -------------------------------------------------------------------- */

/* One epoch through b into xb/yb: checks pairing and the documented order (p_e), marks the
 * rows seen; returns the number of rows. */
static int64_t run_epoch(nb_ctx *ctx, nb_batcher *b, const nb_array *key, int64_t e, int64_t n,
                         nb_array *xb, nb_array *yb, int *seen, int64_t *order) {
    NBT_OK(ctx, nb_batcher_epoch(b, e));
    nb_array *ke = NULL, *p = NULL;
    NBT_OK(ctx, nb_random_fold_in(key, (uint32_t)e, &ke));
    NBT_OK(ctx, nb_random_permutation(ke, n, &p));
    const int64_t *pd = nb_array_data(p);
    int64_t total = 0, rows = 0, batches = 0;
    while (true) {
        NBT_OK(ctx, nb_batcher_next(b, xb, yb, &rows));
        if (rows == 0) {
            break;
        }
        batches++;
        const double *xd = nb_array_data(xb);
        const int64_t *yd = nb_array_data(yb);
        for (int64_t r = 0; r < rows; r++) {
            NBT_EQ_F64(xd[3 * r], (double)yd[r]);
            NBT_EQ_F64(xd[3 * r + 2], 100.0 * (double)yd[r]);
            NBT_EQ_I64(yd[r], pd[total + r]);
            seen[yd[r]]++;
            if (order != NULL) {
                order[total + r] = yd[r];
            }
        }
        total += rows;
    }
    NBT_EQ_I64(batches, nb_batcher_num_batches(b));
    NBT_OK(ctx, nb_batcher_next(b, xb, yb, &rows)); /* stays at the end */
    NBT_EQ_I64(rows, 0);
    nb_array_destroy(p);
    nb_array_destroy(ke);
    return total;
}

static void test_batcher_epochs(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const int64_t n = 103;
    nb_array *x = NULL, *y = NULL, *key = key_of(ctx, 11), *xb = NULL, *yb = NULL;
    make_xy(ctx, n, &x, &y);
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){10, 3}, &xb));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I64, 1, (int64_t[]){10}, &yb));
    nb_batcher *b = NULL;
    NBT_OK(ctx, nb_batcher_create(x, y, key, 10, NULL, &b));
    NBT_EQ_I64(nb_batcher_num_batches(b), 10);
    int seen[103];
    int64_t order[3][103];
    for (int e = 0; e < 3; e++) {
        memset(seen, 0, sizeof seen);
        NBT_EQ_I64(run_epoch(ctx, b, key, e, n, xb, yb, seen, order[e]), 100);
        int once = 0;
        for (int i = 0; i < n; i++) {
            NBT_TRUE(seen[i] <= 1);
            once += seen[i];
        }
        NBT_EQ_I64(once, 100); /* drop_last: 3 rows skipped, each row at most once */
    }
    NBT_TRUE(memcmp(order[0], order[1], sizeof order[0]) != 0);
    NBT_TRUE(memcmp(order[1], order[2], sizeof order[0]) != 0);
    /* replaying an epoch gives its batches again */
    int64_t again[103];
    memset(seen, 0, sizeof seen);
    run_epoch(ctx, b, key, 1, n, xb, yb, seen, again);
    NBT_TRUE(memcmp(order[1], again, 100 * sizeof(int64_t)) == 0);
    nb_batcher_destroy(b);

    /* drop_last false: 11 batches, the last of 3 rows; every row exactly once */
    nb_batcher_opts o = nb_batcher_opts_default();
    NBT_TRUE(o.drop_last);
    o.drop_last = false;
    NBT_OK(ctx, nb_batcher_create(x, y, key, 10, &o, &b));
    NBT_EQ_I64(nb_batcher_num_batches(b), 11);
    for (int e = 0; e < 2; e++) {
        memset(seen, 0, sizeof seen);
        NBT_EQ_I64(run_epoch(ctx, b, key, e + 5, n, xb, yb, seen, NULL), n);
        for (int i = 0; i < n; i++) {
            NBT_EQ_I64(seen[i], 1);
        }
    }
    /* new arrays of exactly the batch's rows */
    NBT_OK(ctx, nb_batcher_epoch(b, 0));
    int64_t total = 0;
    for (int i = 0;; i++) {
        nb_array *nx = NULL, *ny = NULL;
        NBT_OK(ctx, nb_batcher_next_new(b, &nx, &ny));
        if (nx == NULL) {
            NBT_TRUE(ny == NULL);
            NBT_EQ_I64(i, 11);
            break;
        }
        NBT_EQ_I64(nb_array_dim(nx, 0), i < 10 ? 10 : 3);
        assert_paired(nx, ny);
        total += nb_array_dim(nx, 0);
        nb_array_destroy(nx);
        nb_array_destroy(ny);
    }
    NBT_EQ_I64(total, n);
    nb_batcher_destroy(b);
    /* the batcher holds x and y: the caller may release its own references first */
    NBT_OK(ctx, nb_batcher_create(x, NULL, key, 103, NULL, &b));
    nb_array_destroy(x);
    int64_t rows = 0;
    nb_array *xall = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){103, 3}, &xall));
    NBT_OK(ctx, nb_batcher_next(b, xall, NULL, &rows));
    NBT_EQ_I64(rows, 103);
    nb_batcher_destroy(b);
    nb_batcher_destroy(NULL);
    nb_array *all[5] = {y, key, xb, yb, xall};
    for (int i = 0; i < 5; i++) {
        nb_array_destroy(all[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* nb_batcher_next_rows: a batch read in parts (as the processes of a data-parallel run read
 * their micro-batches) is the batch read whole; a short last batch gives the rows it has;
 * rows outside the batch are refused. */
static void test_batcher_next_rows(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const int64_t n = 23;
    nb_array *x = NULL, *y = NULL, *key = key_of(ctx, 5), *xb = NULL, *yb = NULL;
    nb_array *xp = NULL, *yp = NULL;
    make_xy(ctx, n, &x, &y);
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){8, 3}, &xb));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I64, 1, (int64_t[]){8}, &yb));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){3, 3}, &xp));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I64, 1, (int64_t[]){3}, &yp));
    nb_batcher_opts o = nb_batcher_opts_default();
    o.drop_last = false; /* batches of 8, 8 and 7 rows */
    nb_batcher *whole = NULL, *part = NULL;
    NBT_OK(ctx, nb_batcher_create(x, y, key, 8, &o, &whole));
    NBT_OK(ctx, nb_batcher_create(x, y, key, 8, &o, &part));
    for (int e = 0; e < 2; e++) {
        NBT_OK(ctx, nb_batcher_epoch(whole, e));
        for (int i = 0; i < 3; i++) {
            int64_t rows = 0, prow = -1;
            NBT_OK(ctx, nb_batcher_next(whole, xb, yb, &rows));
            NBT_EQ_I64(rows, i < 2 ? 8 : 7);
            /* rows 5 .. 7 of the same batch, from a batcher of the same key */
            NBT_OK(ctx, nb_batcher_epoch(part, e));
            for (int k = 0; k < i; k++) {
                NBT_OK(ctx, nb_batcher_next_rows(part, 0, 3, xp, NULL, &prow));
            }
            NBT_OK(ctx, nb_batcher_next_rows(part, 5, 3, xp, yp, &prow));
            NBT_EQ_I64(prow, i < 2 ? 3 : 2); /* the short batch has rows 5 and 6 only */
            const double *wx = nb_array_data(xb), *px = nb_array_data(xp);
            const int64_t *wy = nb_array_data(yb), *py = nb_array_data(yp);
            NBT_TRUE(memcmp(px, wx + 5 * 3, (size_t)prow * 3 * sizeof(double)) == 0);
            NBT_TRUE(memcmp(py, wy + 5, (size_t)prow * sizeof(int64_t)) == 0);
        }
    }
    int64_t rows = 0;
    NBT_OK(ctx, nb_batcher_next_rows(part, 5, 3, xp, yp, &rows)); /* the epoch is over */
    NBT_EQ_I64(rows, 0);
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_batcher_next_rows(part, 6, 3, xp, yp, &rows));
    NBT_ERRMSG_HAS(ctx, "nb_batcher_next_rows: rows 6 .. 8 are not inside a batch of 8 rows");
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_batcher_next_rows(part, 0, 0, xp, yp, &rows));
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_batcher_next_rows(part, 0, 2, xp, yp, &rows));
    NBT_ERRMSG_HAS(ctx, "xb is f64[3,3]; a batch of x f64[23,3] needs f64[2,3] (2 rows)");
    nb_batcher_destroy(whole);
    nb_batcher_destroy(part);
    nb_array *all[7] = {x, y, key, xb, yb, xp, yp};
    for (int i = 0; i < 7; i++) {
        nb_array_destroy(all[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A training loop's batches allocate nothing: epochs and batches after create. */
static void test_batcher_no_allocation(void **state) {
    (void)state;
    nbt_alloc al;
    memset(&al, 0, sizeof al);
    nb_ctx *ctx = nbt_ctx_with(&al);
    nb_array *x = NULL, *y = NULL, *key = key_of(ctx, 3), *xb = NULL, *yb = NULL;
    make_xy(ctx, 1000, &x, &y);
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){32, 3}, &xb));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I64, 1, (int64_t[]){32}, &yb));
    nb_batcher *b = NULL;
    NBT_OK(ctx, nb_batcher_create(x, y, key, 32, NULL, &b));
    int64_t calls = al.n_calls, steps = 0;
    for (int e = 0; e < 4; e++) {
        NBT_OK(ctx, nb_batcher_epoch(b, e));
        int64_t rows = 0;
        while (nb_batcher_next(b, xb, yb, &rows) == NB_OK && rows > 0) {
            steps++;
        }
    }
    NBT_EQ_I64(steps, 4 * 31);
    NBT_EQ_I64(al.n_calls, calls);
    nb_batcher_destroy(b);
    nb_array *all[5] = {x, y, key, xb, yb};
    for (int i = 0; i < 5; i++) {
        nb_array_destroy(all[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
    NBT_EQ_I64(al.n_live, 0);
}

static void test_batcher_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *x = NULL, *y = NULL, *y9 = NULL, *key = key_of(ctx, 1);
    make_xy(ctx, 20, &x, &y);
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I64, 1, (int64_t[]){9}, &y9));
    nb_batcher *b = (nb_batcher *)&b;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_batcher_create(x, y, key, 0, NULL, &b));
    NBT_ERRMSG_HAS(ctx, "nb_batcher_create: batch_size 0 for x f64[20,3]; it must be between 1 "
                        "and the number of rows, 20");
    NBT_TRUE(b == NULL);
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_batcher_create(x, y, key, 21, NULL, &b));
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_batcher_create(x, y9, key, 4, NULL, &b));
    NBT_ERRMSG_HAS(ctx, "nb_batcher_create: x is f64[20,3] but y is i64[9]");
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_batcher_create(x, y, y, 4, NULL, &b));
    NBT_ERRMSG_HAS(ctx, "nb_batcher_create: key is i64[20]; a key is an i32[2] array");
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_batcher_create(x, y, key, 4, NULL, NULL));

    NBT_OK(ctx, nb_batcher_create(x, y, key, 4, NULL, &b));
    nb_array *xb_rows = NULL, *xb_f32 = NULL, *xb = NULL, *yb = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){5, 3}, &xb_rows));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){4, 3}, &xb_f32));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){4, 3}, &xb));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){4}, &yb));
    int64_t rows = -1;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_batcher_next(b, xb_rows, NULL, &rows));
    NBT_ERRMSG_HAS(ctx, "nb_batcher_next: xb is f64[5,3]; a batch of x f64[20,3] needs f64[4,3] "
                        "(4 rows)");
    NBT_EQ_I64(rows, 0);
    NBT_STATUS(ctx, NB_ERR_DTYPE, nb_batcher_next(b, xb_f32, NULL, &rows));
    NBT_ERRMSG_HAS(ctx, "xb is f32[4,3]");
    NBT_STATUS(ctx, NB_ERR_DTYPE, nb_batcher_next(b, xb, yb, &rows));
    NBT_ERRMSG_HAS(ctx, "nb_batcher_next: yb is i32[4]; a batch of y i64[20] needs i64[4]");
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_batcher_next(b, xb, NULL, NULL));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_batcher_next(b, NULL, NULL, &rows));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_batcher_epoch(b, -1));
    NBT_ERRMSG_HAS(ctx, "nb_batcher_epoch: epoch -1");
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_batcher_epoch(b, (int64_t)1 << 32));
    /* the failed calls consumed nothing: the first batch is still batch 0 */
    NBT_OK(ctx, nb_batcher_next(b, xb, NULL, &rows));
    NBT_EQ_I64(rows, 4);
    nb_batcher_destroy(b);
    /* no labels given: a yb is misuse; a destroyed handle is misuse */
    NBT_OK(ctx, nb_batcher_create(x, NULL, key, 4, NULL, &b));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_batcher_next(b, xb, yb, &rows));
    NBT_ERRMSG_HAS(ctx, "the batcher has no labels");
    nb_batcher_destroy(b);
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_batcher_next(b, xb, NULL, &rows));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_batcher_epoch(b, 0));
    NBT_EQ_I64(nb_batcher_num_batches(b), -1);
    nb_batcher_destroy(b); /* a double destroy is reported, not a crash */
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_ERR_MISUSE);
    nbt_expect_double_destroys(1);
    NBT_ERRMSG_HAS(ctx, "nb_batcher_destroy: handle");
    nb_array *all[8] = {x, y, y9, key, xb_rows, xb_f32, xb, yb};
    for (int i = 0; i < 8; i++) {
        nb_array_destroy(all[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- allocation failures ------------------------------------------------------------ */

/* split, standardize, a batcher and its batches (into new arrays too): every failed
 * allocation returns NB_ERR_OOM and leaks nothing. */
static nb_status scenario_data(nb_ctx *ctx) {
    nb_array *x = NULL, *y = NULL, *key = NULL, *xtr = NULL, *ytr = NULL, *xte = NULL, *yte = NULL,
             *mean = NULL, *sd = NULL, *nx = NULL, *ny = NULL;
    nb_batcher *b = NULL;
    nb_status st = nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){30, 3}, &x);
    if (st == NB_OK) {
        st = nb_array_arange(ctx, NB_DTYPE_I64, 0, 30, 1, &y);
    }
    if (st == NB_OK) {
        ((double *)nb_array_data(x))[4] = 1.5;
        st = nb_random_key(ctx, 4, &key);
    }
    if (st == NB_OK) {
        st = nb_data_split(x, y, key, 0.25, &xtr, &ytr, &xte, &yte);
    }
    if (st == NB_OK) {
        st = nb_data_standardize(xtr, xte, &mean, &sd);
    }
    if (st == NB_OK) {
        st = nb_batcher_create(xtr, ytr, key, 4, NULL, &b);
    }
    if (st == NB_OK) {
        st = nb_batcher_epoch(b, 3);
    }
    if (st == NB_OK) {
        st = nb_batcher_next_new(b, &nx, &ny);
    }
    nb_batcher_destroy(b);
    nb_array *all[11] = {x, y, key, xtr, ytr, xte, yte, mean, sd, nx, ny};
    for (int i = 0; i < 11; i++) {
        nb_array_destroy(all[i]);
    }
    return st;
}

static void test_allocation_failures(void **state) {
    (void)state;
    int points = nbt_oom_sweep("scenario_data", scenario_data, true, true);
    NBT_TRUE(points >= 10);
}

/* ---- the UCI digits, end to end ----------------------------------------------------- */

static void test_digits(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *x = NULL, *y = NULL, *key = key_of(ctx, 0), *ks = NULL;
    NBT_OK(ctx, nb_csv_load(ctx, NBT_DATA_DIR "/digits.csv.gz", NULL, &x, &y));
    NBT_EQ_I64(nb_array_dim(x, 0), 1797);
    NBT_EQ_I64(nb_array_dim(x, 1), 64);
    nb_array *xtr = NULL, *ytr = NULL, *xte = NULL, *yte = NULL, *mean = NULL, *sd = NULL;
    NBT_OK(ctx, nb_random_split(key, 2, &ks));
    nb_array *k_split = NULL, *k_batch = NULL;
    NBT_OK(ctx, nb_random_fold_in(key, 1, &k_split));
    NBT_OK(ctx, nb_random_fold_in(key, 2, &k_batch));
    NBT_OK(ctx, nb_data_split(x, y, k_split, 0.2, &xtr, &ytr, &xte, &yte));
    NBT_EQ_I64(nb_array_dim(xtr, 0), 1438);
    NBT_EQ_I64(nb_array_dim(xte, 0), 359);
    /* pairs survive the split: every training row is one of x's rows with its label */
    const float *xd = nb_array_data(x), *td = nb_array_data(xtr);
    const int32_t *yd = nb_array_data(y), *tyd = nb_array_data(ytr);
    for (int r = 0; r < 1438; r += 97) {
        bool found = false;
        for (int i = 0; i < 1797 && !found; i++) {
            found = memcmp(xd + 64 * i, td + 64 * r, 64 * sizeof(float)) == 0 && yd[i] == tyd[r];
        }
        NBT_TRUE(found);
    }
    NBT_OK(ctx, nb_data_standardize(xtr, xte, &mean, &sd));
    int constant = 0;
    for (int f = 0; f < 64; f++) {
        double s = 0, ss = 0, sf = 0;
        for (int r = 0; r < 1438; r++) {
            double v = td[64 * r + f];
            s += v;
            ss += v * v;
        }
        NBT_OK(ctx, nb_array_get_flat(sd, f, &sf));
        NBT_NEAR(s / 1438, 0, 1e-5);
        NBT_NEAR(sqrt(ss / 1438), sf == 0 ? 0 : 1, 1e-5);
        constant += sf == 0;
    }
    NBT_TRUE(constant >= 1); /* the digits have always-blank corner pixels */
    nb_batcher *b = NULL;
    nb_array *xb = NULL, *yb = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){128, 64}, &xb));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){128}, &yb));
    NBT_OK(ctx, nb_batcher_create(xtr, ytr, k_batch, 128, NULL, &b));
    NBT_EQ_I64(nb_batcher_num_batches(b), 11);
    int64_t rows = 0, total = 0;
    while (nb_batcher_next(b, xb, yb, &rows) == NB_OK && rows > 0) {
        total += rows;
        for (int i = 0; i < 128; i++) {
            int32_t label = ((const int32_t *)nb_array_data(yb))[i];
            NBT_TRUE(label >= 0 && label <= 9);
        }
    }
    NBT_EQ_I64(total, 11 * 128);
    nb_batcher_destroy(b);
    nb_array *all[13] = {x, y, key, ks, xtr, ytr, xte, yte, mean, sd, xb, yb, k_split};
    for (int i = 0; i < 13; i++) {
        nb_array_destroy(all[i]);
    }
    nb_array_destroy(k_batch);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- malformed rows: errors that name the file and the line ------------------------------ */

static void write_text(const char *path, const char *text, bool gz) {
    if (gz) {
        gzFile g = gzopen(path, "wb");
        assert_non_null(g);
        assert_true(gzputs(g, text) >= 0);
        gzclose(g);
    } else {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
    }
}

static void test_csv_errors_name_file_and_line(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const struct {
        const char *text, *msg;
    } cases[] = {
        {"1,2,0\n3,4,1\n5,6\n", ":3: expected 3 fields, found 2"},
        {"1,2,0\n3,x,1\n", ":2: field 2 (\"x\") is not a finite number"},
        {"1,2,0\n\n3,4,1.5\n", ":3: the label (last field, \"1.5\") is not an integer"},
        {"1,2,0\n3,nan,1\n", ":2: field 2 (\"nan\") is not a finite number"},
        {"", ": no data rows"},
    };
    char path[64];
    for (int gz = 0; gz < 2; gz++) {
        snprintf(path, sizeof path, "/tmp/nbt_csv_%d%s", (int)getpid(), gz ? ".csv.gz" : ".csv");
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            write_text(path, cases[c].text, gz);
            nb_array *x = NULL, *y = NULL;
            NBT_STATUS(ctx, NB_ERR_FORMAT, nb_csv_load(ctx, path, NULL, &x, &y));
            NBT_ERRMSG_HAS(ctx, path);
            NBT_ERRMSG_HAS(ctx, cases[c].msg);
            assert_null(x);
            assert_null(y);
        }
        remove(path);
    }
    /* a damaged gzip stream: an I/O or format error, never a crash */
    snprintf(path, sizeof path, "/tmp/nbt_csv_%d.csv.gz", (int)getpid());
    write_text(path, "1,2,0\n3,4,1\n5,6,0\n", true);
    FILE *f = fopen(path, "r+b");
    fseek(f, 12, SEEK_SET);
    fputc(0x55, f);
    fclose(f);
    nb_array *x = NULL, *y = NULL;
    nb_status st = nb_csv_load(ctx, path, NULL, &x, &y);
    NBT_TRUE(st == NB_ERR_IO || st == NB_ERR_FORMAT || st == NB_OK);
    nb_array_destroy(x);
    nb_array_destroy(y);
    remove(path);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void write_bytes(const char *path, const char *bytes, size_t n, bool gz) {
    if (gz) {
        gzFile g = gzopen(path, "wb");
        assert_non_null(g);
        assert_true(gzwrite(g, bytes, (unsigned)n) == (int)n);
        gzclose(g);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_true(fwrite(bytes, 1, n, f) == n);
        fclose(f);
    }
}

/* Found by fuzz_csv: a NUL byte cut a line short and glued the next one on (or dropped a
 * row) without a word; a subnormal was refused; a field beyond FLT_MAX loaded as inf. */
static void test_csv_nul_subnormal_f32_range(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    char path[64];
    for (int gz = 0; gz < 2; gz++) {
        snprintf(path, sizeof path, "/tmp/nbt_csvz_%d%s", (int)getpid(), gz ? ".csv.gz" : ".csv");
        static const char glue[] = "1,2,0\n3,4\0junk\n,1\n";
        static const char drop[] = "1,2,0\n\0\n3,4,1\n";
        const struct {
            const char *bytes;
            size_t n;
            const char *msg;
        } nul[] = {{glue, sizeof glue - 1, ":2: a NUL byte"},
                   {drop, sizeof drop - 1, ":2: a NUL byte"}};
        for (int c = 0; c < 2; c++) {
            write_bytes(path, nul[c].bytes, nul[c].n, gz);
            nb_array *x = NULL, *y = NULL;
            NBT_STATUS(ctx, NB_ERR_FORMAT, nb_csv_load(ctx, path, NULL, &x, &y));
            NBT_ERRMSG_HAS(ctx, path);
            NBT_ERRMSG_HAS(ctx, nul[c].msg);
            assert_null(x);
            assert_null(y);
        }
        /* 1e300 is finite in f64 but not in f32 */
        write_text(path, "1,2,0\n1e300,1,0\n", gz);
        nb_array *x = NULL, *y = NULL;
        NBT_STATUS(ctx, NB_ERR_FORMAT, nb_csv_load(ctx, path, NULL, &x, &y));
        NBT_ERRMSG_HAS(ctx, ":2: field 1 (\"1e300\") is not a finite number that fits f32");
        nb_csv_opts o = nb_csv_opts_default();
        o.feature_dtype = NB_DTYPE_F64;
        NBT_OK(ctx, nb_csv_load(ctx, path, &o, &x, &y));
        NBT_TRUE(((const double *)nb_array_data(x))[2] == 1e300);
        nb_array_destroy(x);
        nb_array_destroy(y);
        /* a subnormal (strtod's ERANGE on underflow) is a number */
        write_text(path, "1,2,0\n4.9e-324,1,1\n", gz);
        NBT_OK(ctx, nb_csv_load(ctx, path, &o, &x, &y));
        NBT_TRUE(((const double *)nb_array_data(x))[2] == 4.9e-324);
        NBT_TRUE(((const double *)nb_array_data(x))[2] > 0.0);
        nb_array_destroy(x);
        nb_array_destroy(y);
        remove(path);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* nb_text_load: Tiny Shakespeare as character codes (the alphabet sorted, each byte its
 * index), and its errors. */
static void test_text_load(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *c = NULL;
    char vocab[256];
    int nv = 0;
    NBT_OK(ctx, nb_text_load(ctx, NBT_DATA_DIR "/tinyshakespeare.txt.gz", &c, vocab, &nv));
    NBT_EQ_I64(nb_array_dtype(c), NB_DTYPE_I32);
    NBT_EQ_I64(nb_array_dim(c, 0), 1115394); /* data/README.md: the uncompressed size */
    NBT_EQ_I64(nv, 65);
    for (int i = 1; i < nv; i++) {
        NBT_TRUE((unsigned char)vocab[i - 1] < (unsigned char)vocab[i]);
    }
    const int32_t *d = nb_array_data(c);
    char head[15];
    for (int i = 0; i < 14; i++) {
        NBT_TRUE(d[i] >= 0 && d[i] < nv);
        head[i] = vocab[d[i]];
    }
    head[14] = '\0';
    NBT_STREQ(head, "First Citizen:");
    nb_array_destroy(c);
    /* a missing file, an empty one, NULL arguments */
    NBT_STATUS(ctx, NB_ERR_IO, nb_text_load(ctx, NBT_DATA_DIR "/no-such-file.txt", &c, NULL, NULL));
    NBT_ERRMSG_HAS(ctx, "nb_text_load: cannot open");
    NBT_TRUE(c == NULL);
    char path[] = "/tmp/nbt_empty_XXXXXX";
    int fd = mkstemp(path);
    NBT_TRUE(fd >= 0);
    close(fd);
    NBT_STATUS(ctx, NB_ERR_FORMAT, nb_text_load(ctx, path, &c, NULL, &nv));
    NBT_ERRMSG_HAS(ctx, "is empty");
    NBT_EQ_I64(nv, 0);
    unlink(path);
    /* a truncated .gz: an error, not a short text */
    FILE *in = fopen(NBT_DATA_DIR "/tinyshakespeare.txt.gz", "rb");
    char tpath[] = "/tmp/nbt_trunc_XXXXXX";
    int tfd = mkstemp(tpath);
    NBT_TRUE(in != NULL && tfd >= 0);
    static unsigned char half[100000];
    size_t got = fread(half, 1, sizeof half, in);
    NBT_TRUE(got == sizeof half && write(tfd, half, got) == (ssize_t)got);
    fclose(in);
    close(tfd);
    NBT_STATUS(ctx, NB_ERR_IO, nb_text_load(ctx, tpath, &c, NULL, NULL));
    NBT_ERRMSG_HAS(ctx, "is truncated or corrupt");
    NBT_TRUE(c == NULL);
    unlink(tpath);
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_text_load(ctx, NULL, &c, NULL, NULL));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_text_load(ctx, path, NULL, NULL, NULL));
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_sizes_pairs_and_order),
        cmocka_unit_test(test_csv_errors_name_file_and_line),
        cmocka_unit_test(test_csv_nul_subnormal_f32_range),
        cmocka_unit_test(test_split_rounding_dtypes_no_labels),
        cmocka_unit_test(test_split_errors),
        cmocka_unit_test(test_standardize),
        cmocka_unit_test(test_batcher_epochs),
        cmocka_unit_test(test_batcher_no_allocation),
        cmocka_unit_test(test_batcher_next_rows),
        cmocka_unit_test(test_batcher_errors),
        cmocka_unit_test(test_allocation_failures),
        cmocka_unit_test(test_digits),
        cmocka_unit_test(test_text_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
