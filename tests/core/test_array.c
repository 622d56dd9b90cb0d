/*
 * test_array.c -- nabla/array.h: constructors, accessors, element access, copy/cast/reshape,
 * comparison, printing, overflow-checked shapes and refcounting.
 */
#include "nbtest.h"

#include <stdlib.h>

static const nb_dtype k_dtypes[NB_DTYPE_COUNT] = {NB_DTYPE_F32, NB_DTYPE_F64, NB_DTYPE_I32,
                                                  NB_DTYPE_I64, NB_DTYPE_BOOL};

/* ---- helpers ------------------------------------------------------------------------ */

/* Read element i straight from the data pointer (independent of nb_array_get). */
static double raw_at(const nb_array *a, int64_t i) {
    const void *d = nb_array_data(a);
    switch (nb_array_dtype(a)) {
    case NB_DTYPE_F32:
        return ((const float *)d)[i];
    case NB_DTYPE_F64:
        return ((const double *)d)[i];
    case NB_DTYPE_I32:
        return ((const int32_t *)d)[i];
    case NB_DTYPE_I64:
        return (double)((const int64_t *)d)[i];
    case NB_DTYPE_BOOL:
        return ((const uint8_t *)d)[i];
    }
    fail_msg("raw_at: bad dtype");
    return 0;
}

/* A malloc'd buffer of n elements of dt holding vals converted. */
static void *typed_buf(nb_dtype dt, int64_t n, const double *vals) {
    size_t es = nb_dtype_size(dt);
    void *p = malloc((size_t)(n > 0 ? n : 1) * (es ? es : 1));
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case NB_DTYPE_F32:
            ((float *)p)[i] = (float)vals[i];
            break;
        case NB_DTYPE_F64:
            ((double *)p)[i] = vals[i];
            break;
        case NB_DTYPE_I32:
            ((int32_t *)p)[i] = (int32_t)vals[i];
            break;
        case NB_DTYPE_I64:
            ((int64_t *)p)[i] = (int64_t)vals[i];
            break;
        case NB_DTYPE_BOOL:
            ((uint8_t *)p)[i] = vals[i] != 0.0;
            break;
        }
    }
    return p;
}

/* An array of dt/shape from doubles (through nb_array_from_data). */
static nb_array *mk(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape, const double *vals) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        n *= shape[i];
    }
    void *buf = typed_buf(dt, n, vals);
    nb_array *a = NULL;
    nb_status s = nb_array_from_data(ctx, dt, rank, shape, buf, &a);
    free(buf);
    NBT_OK(ctx, s);
    assert_non_null(a);
    return a;
}

/* Check a's elements (through get_flat and the raw data) against want[0..n-1]. */
static void expect_values(nb_ctx *ctx, const nb_array *a, int64_t n, const double *want) {
    NBT_EQ_I64(nb_array_size(a), n);
    for (int64_t i = 0; i < n; i++) {
        double v = -12345.0;
        NBT_OK(ctx, nb_array_get_flat(a, i, &v));
        if (!(v == want[i]) || !(raw_at(a, i) == want[i])) {
            fail_msg("element %lld: get_flat %.17g, raw %.17g, want %.17g", (long long)i, v,
                     raw_at(a, i), want[i]);
        }
    }
}

static void expect_shape(const nb_array *a, int rank, const int64_t *shape) {
    NBT_EQ_I64(nb_array_rank(a), rank);
    const int64_t *s = nb_array_shape(a);
    if (rank > 0) {
        assert_non_null(s);
    }
    for (int i = 0; i < rank; i++) {
        if (s[i] != shape[i]) {
            fail_msg("dim %d: got %lld, want %lld", i, (long long)s[i], (long long)shape[i]);
        }
        NBT_EQ_I64(nb_array_dim(a, i), shape[i]);
    }
}

static void expect_aligned(const nb_array *a) {
    void *d = nb_array_data(a);
    assert_non_null(d);
    if ((uintptr_t)d % 64 != 0) {
        fail_msg("data %p is not 64-byte aligned", d);
    }
}

static char g_buf[1 << 16];

/* Format a into a static buffer, checking OK and that *needed matches. */
static const char *fmt(nb_ctx *ctx, const nb_array *a) {
    size_t need = 0;
    memset(g_buf, 'X', sizeof g_buf);
    NBT_OK(ctx, nb_array_format(a, g_buf, sizeof g_buf, &need));
    NBT_EQ_I64(need, strlen(g_buf));
    return g_buf;
}

static void check_fmt(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape, const double *vals,
                      const char *want) {
    nb_array *a = mk(ctx, dt, rank, shape, vals);
    NBT_STREQ(fmt(ctx, a), want);
    nb_array_destroy(a);
}

/* The context's message contains one of two alternatives. */
static void errmsg_has_any(nb_ctx *ctx, const char *x, const char *y) {
    const char *m = nb_ctx_errmsg(ctx);
    if (strstr(m, x) == NULL && strstr(m, y) == NULL) {
        fail_msg("errmsg contains neither \"%s\" nor \"%s\"\n  errmsg: %s", x, y, m);
    }
}

static nb_array *const k_sentinel_arr = (nb_array *)(uintptr_t)0x10;

/* ---- dtype info --------------------------------------------------------------------- */

static void test_dtype_info(void **state) {
    (void)state;
    NBT_STREQ(nb_dtype_name(NB_DTYPE_F32), "f32");
    NBT_STREQ(nb_dtype_name(NB_DTYPE_F64), "f64");
    NBT_STREQ(nb_dtype_name(NB_DTYPE_I32), "i32");
    NBT_STREQ(nb_dtype_name(NB_DTYPE_I64), "i64");
    NBT_STREQ(nb_dtype_name(NB_DTYPE_BOOL), "bool");
    NBT_STREQ(nb_dtype_name((nb_dtype)99), "?");
    NBT_STREQ(nb_dtype_name((nb_dtype)-1), "?");
    NBT_EQ_I64(nb_dtype_size(NB_DTYPE_F32), 4);
    NBT_EQ_I64(nb_dtype_size(NB_DTYPE_F64), 8);
    NBT_EQ_I64(nb_dtype_size(NB_DTYPE_I32), 4);
    NBT_EQ_I64(nb_dtype_size(NB_DTYPE_I64), 8);
    NBT_EQ_I64(nb_dtype_size(NB_DTYPE_BOOL), 1);
    NBT_EQ_I64(nb_dtype_size((nb_dtype)99), 0);
    NBT_TRUE(nb_dtype_is_float(NB_DTYPE_F32));
    NBT_TRUE(nb_dtype_is_float(NB_DTYPE_F64));
    NBT_TRUE(!nb_dtype_is_float(NB_DTYPE_I32));
    NBT_TRUE(!nb_dtype_is_float(NB_DTYPE_I64));
    NBT_TRUE(!nb_dtype_is_float(NB_DTYPE_BOOL));
    NBT_TRUE(!nb_dtype_is_float((nb_dtype)99));
}

/* ---- constructors ------------------------------------------------------------------- */

typedef struct shape_case {
    int rank;
    int64_t shape[NB_MAX_RANK];
    int64_t size;
} shape_case;

static const shape_case k_shapes[] = {
    {0, {0}, 1},
    {1, {5}, 5},
    {3, {2, 3, 4}, 24},
    {8, {2, 1, 2, 1, 2, 1, 2, 1}, 16},
    {1, {0}, 0},
    {3, {3, 0, 2}, 0},
    {8, {1, 1, 1, 1, 1, 1, 1, 0}, 0},
};
#define N_SHAPES ((int)(sizeof k_shapes / sizeof k_shapes[0]))

static void check_meta(nb_ctx *ctx, const nb_array *a, nb_dtype dt, const shape_case *sc) {
    NBT_OK(ctx, nb_array_check(a));
    assert_ptr_equal(nb_array_ctx(a), ctx);
    NBT_EQ_I64(nb_array_dtype(a), dt);
    expect_shape(a, sc->rank, sc->shape);
    NBT_EQ_I64(nb_array_size(a), sc->size);
    NBT_EQ_I64(nb_array_nbytes(a), (int64_t)nb_dtype_size(dt) * sc->size);
    expect_aligned(a);
}

static void test_constructors_every_dtype_and_rank(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    double want[64], vals[64];
    for (int d = 0; d < NB_DTYPE_COUNT; d++) {
        nb_dtype dt = k_dtypes[d];
        for (int s = 0; s < N_SHAPES; s++) {
            const shape_case *sc = &k_shapes[s];
            const int64_t *shp = sc->rank > 0 ? sc->shape : NULL;
            nb_array *a = NULL;

            NBT_OK(ctx, nb_array_zeros(ctx, dt, sc->rank, shp, &a));
            check_meta(ctx, a, dt, sc);
            for (int64_t i = 0; i < sc->size; i++) {
                want[i] = 0.0;
            }
            expect_values(ctx, a, sc->size, want);
            nb_array_destroy(a);

            a = NULL;
            NBT_OK(ctx, nb_array_ones(ctx, dt, sc->rank, shp, &a));
            check_meta(ctx, a, dt, sc);
            for (int64_t i = 0; i < sc->size; i++) {
                want[i] = 1.0;
            }
            expect_values(ctx, a, sc->size, want);
            nb_array_destroy(a);

            double fv = dt == NB_DTYPE_BOOL ? 1.0 : -3.0;
            a = NULL;
            NBT_OK(ctx, nb_array_full(ctx, dt, sc->rank, shp, fv, &a));
            check_meta(ctx, a, dt, sc);
            for (int64_t i = 0; i < sc->size; i++) {
                want[i] = fv;
            }
            expect_values(ctx, a, sc->size, want);
            nb_array_destroy(a);

            for (int64_t i = 0; i < sc->size; i++) {
                vals[i] = dt == NB_DTYPE_BOOL ? (double)(i % 2) : (double)(i % 7) - 3.0;
            }
            void *buf = typed_buf(dt, sc->size, vals);
            a = NULL;
            NBT_OK(ctx, nb_array_from_data(ctx, dt, sc->rank, shp, buf, &a));
            free(buf);
            check_meta(ctx, a, dt, sc);
            expect_values(ctx, a, sc->size, vals);
            nb_array_destroy(a);

            /* NULL data is allowed exactly when the size is 0. */
            if (sc->size == 0) {
                a = NULL;
                NBT_OK(ctx, nb_array_from_data(ctx, dt, sc->rank, shp, NULL, &a));
                check_meta(ctx, a, dt, sc);
                nb_array_destroy(a);
            }
        }
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_scalar(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    for (int d = 0; d < NB_DTYPE_COUNT; d++) {
        nb_dtype dt = k_dtypes[d];
        double v = dt == NB_DTYPE_BOOL ? 1.0 : 7.0;
        nb_array *a = NULL;
        NBT_OK(ctx, nb_array_scalar(ctx, dt, v, &a));
        NBT_EQ_I64(nb_array_rank(a), 0);
        NBT_EQ_I64(nb_array_size(a), 1);
        NBT_EQ_I64(nb_array_nbytes(a), nb_dtype_size(dt));
        NBT_EQ_I64(nb_array_dtype(a), dt);
        expect_aligned(a);
        double got = 0;
        NBT_OK(ctx, nb_array_get(a, NULL, &got));
        NBT_EQ_F64(got, v);
        NBT_EQ_F64(raw_at(a, 0), v);
        NBT_OK(ctx, nb_array_set(a, NULL, 0.0));
        NBT_OK(ctx, nb_array_get(a, NULL, &got));
        NBT_EQ_F64(got, 0.0);
        nb_array_destroy(a);
    }
    /* f32 scalar rounds to float. */
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_F32, 0.1, &a));
    NBT_EQ_F64(raw_at(a, 0), (double)0.1f);
    nb_array_destroy(a);
    /* A value that does not fit the integer dtype. */
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_scalar(ctx, NB_DTYPE_I32, NAN, &a));
    assert_null(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_from_data_copies_unaligned_source(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    /* Source deliberately at an odd address. */
    unsigned char raw[1 + 6 * sizeof(float)];
    float src[6] = {1.5f, -2.0f, 3.25f, 4.0f, 5.0f, -6.5f};
    memcpy(raw + 1, src, sizeof src);
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, raw + 1, &a));
    expect_aligned(a);
    assert_ptr_not_equal(nb_array_data(a), raw + 1);
    /* Changing the source afterwards does not change the array. */
    memset(raw, 0, sizeof raw);
    expect_values(ctx, a, 6, (double[]){1.5, -2.0, 3.25, 4.0, 5.0, -6.5});
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_full_conversions(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = NULL;
    /* C conversion: truncation toward zero. */
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_I32, 1, (int64_t[]){3}, 2.7, &a));
    expect_values(ctx, a, 3, (double[]){2, 2, 2});
    nb_array_destroy(a);
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_I64, 1, (int64_t[]){2}, -2.7, &a));
    expect_values(ctx, a, 2, (double[]){-2, -2});
    nb_array_destroy(a);
    /* 3e9 fits i64 but not i32. */
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_I64, 1, (int64_t[]){2}, 3e9, &a));
    expect_values(ctx, a, 2, (double[]){3e9, 3e9});
    nb_array_destroy(a);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_full(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, 3e9, &a));
    assert_null(a);
    NBT_ERRMSG_HAS(ctx, "nb_array_full");
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_full(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, NAN, &a));
    assert_null(a);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_full(ctx, NB_DTYPE_I64, 1, (int64_t[]){2}, 1e30, &a));
    assert_null(a);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_INVALID,
               nb_array_full(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, -INFINITY, &a));
    assert_null(a);
    /* NaN is a fine float value. */
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, NAN, &a));
    NBT_TRUE(isnan(raw_at(a, 0)) && isnan(raw_at(a, 1)));
    nb_array_destroy(a);
    /* bool from 0 and 1. */
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_BOOL, 1, (int64_t[]){2}, 0.0, &a));
    expect_values(ctx, a, 2, (double[]){0, 0});
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_alignment(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *arrs[40];
    /* Many sizes, kept alive together so they cannot share a slot. */
    for (int i = 0; i < 40; i++) {
        arrs[i] = NULL;
        NBT_OK(ctx, nb_array_zeros(ctx, k_dtypes[i % NB_DTYPE_COUNT], 1, (int64_t[]){i}, &arrs[i]));
        expect_aligned(arrs[i]);
    }
    nb_array *c = NULL, *k = NULL, *r = NULL, *s = NULL;
    NBT_OK(ctx, nb_array_copy(arrs[13], &c));
    NBT_OK(ctx, nb_array_cast(arrs[13], NB_DTYPE_BOOL, &k));
    NBT_OK(ctx, nb_array_reshape(arrs[12], 2, (int64_t[]){3, 4}, &r));
    NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_BOOL, 1.0, &s));
    expect_aligned(c);
    expect_aligned(k);
    expect_aligned(r);
    expect_aligned(s);
    nb_array_destroy(c);
    nb_array_destroy(k);
    nb_array_destroy(r);
    nb_array_destroy(s);
    for (int i = 0; i < 40; i++) {
        nb_array_destroy(arrs[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- arange / linspace / eye -------------------------------------------------------- */

static void test_arange(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = NULL;

    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_F64, 0, 5, 1, &a));
    expect_shape(a, 1, (int64_t[]){5});
    expect_values(ctx, a, 5, (double[]){0, 1, 2, 3, 4});
    nb_array_destroy(a);

    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_I32, 0, 10, 3, &a));
    NBT_EQ_I64(nb_array_dtype(a), NB_DTYPE_I32);
    expect_shape(a, 1, (int64_t[]){4});
    expect_values(ctx, a, 4, (double[]){0, 3, 6, 9});
    nb_array_destroy(a);

    /* negative step */
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_I64, 5, 0, -1, &a));
    expect_shape(a, 1, (int64_t[]){5});
    expect_values(ctx, a, 5, (double[]){5, 4, 3, 2, 1});
    nb_array_destroy(a);

    /* negative fractional step: ceil(5/1.5) = 4 */
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_F64, 5, 0, -1.5, &a));
    expect_shape(a, 1, (int64_t[]){4});
    expect_values(ctx, a, 4, (double[]){5, 3.5, 2, 0.5});
    nb_array_destroy(a);

    /* fractional step, exact */
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_F32, 0, 1, 0.25, &a));
    NBT_EQ_I64(nb_array_dtype(a), NB_DTYPE_F32);
    expect_shape(a, 1, (int64_t[]){4});
    expect_values(ctx, a, 4, (double[]){0, 0.25, 0.5, 0.75});
    nb_array_destroy(a);

    /* fractional step, inexact: ceil(1/0.3) = 4, element i = start + i*step in double */
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_F64, 0, 1, 0.3, &a));
    expect_shape(a, 1, (int64_t[]){4});
    {
        double s = 0.3;
        expect_values(ctx, a, 4, (double[]){0.0, 0.0 + 1 * s, 0.0 + 2 * s, 0.0 + 3 * s});
    }
    nb_array_destroy(a);

    /* fractional step, integer dtype: 0, 0.5, 1, 1.5 truncated */
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_I32, 0, 2, 0.5, &a));
    expect_shape(a, 1, (int64_t[]){4});
    expect_values(ctx, a, 4, (double[]){0, 0, 1, 1});
    nb_array_destroy(a);

    /* ceil, not floor or round: (0, 10.5, 1) has 11 elements; (-1, 1.1, 0.5) has 5 */
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_F64, 0, 10.5, 1, &a));
    expect_shape(a, 1, (int64_t[]){11});
    NBT_EQ_F64(raw_at(a, 10), 10.0);
    nb_array_destroy(a);
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_F64, -1, 1.1, 0.5, &a));
    expect_shape(a, 1, (int64_t[]){5});
    expect_values(ctx, a, 5, (double[]){-1, -0.5, 0, 0.5, 1});
    nb_array_destroy(a);

    /* empty results */
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_F32, 5, 0, 1, &a));
    expect_shape(a, 1, (int64_t[]){0});
    expect_aligned(a);
    nb_array_destroy(a);
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_F32, 0, 5, -1, &a));
    expect_shape(a, 1, (int64_t[]){0});
    nb_array_destroy(a);
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_I32, 3, 3, 1, &a));
    expect_shape(a, 1, (int64_t[]){0});
    nb_array_destroy(a);

    /* errors */
    nb_ctx_clear_error(ctx);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_arange(ctx, NB_DTYPE_F32, 0, 5, 0, &a));
    assert_null(a);
    NBT_ERRMSG_HAS(ctx, "nb_array_arange");
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_ERR_INVALID);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_arange(ctx, NB_DTYPE_F32, 0, INFINITY, 1, &a));
    assert_null(a);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_arange(ctx, NB_DTYPE_F32, NAN, 5, 1, &a));
    assert_null(a);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_arange(ctx, NB_DTYPE_F32, 0, 5, NAN, &a));
    assert_null(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_linspace(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = NULL;

    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F64, 0, 1, 5, &a));
    expect_shape(a, 1, (int64_t[]){5});
    expect_values(ctx, a, 5, (double[]){0, 0.25, 0.5, 0.75, 1});
    nb_array_destroy(a);

    /* endpoint exact even where start + (n-1)*step would not be */
    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F64, 0.1, 0.7, 7, &a));
    expect_shape(a, 1, (int64_t[]){7});
    NBT_EQ_F64(raw_at(a, 0), 0.1);
    NBT_EQ_F64(raw_at(a, 6), 0.7);
    for (int i = 1; i < 6; i++) {
        NBT_NEAR(raw_at(a, i), 0.1 + 0.1 * i, 1e-15);
    }
    nb_array_destroy(a);

    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F64, 1.0, 1.0 / 3.0, 4, &a));
    NBT_EQ_F64(raw_at(a, 3), 1.0 / 3.0);
    NBT_EQ_F64(raw_at(a, 0), 1.0);
    nb_array_destroy(a);

    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F32, 0, 1, 3, &a));
    NBT_EQ_I64(nb_array_dtype(a), NB_DTYPE_F32);
    expect_values(ctx, a, 3, (double[]){0, 0.5, 1});
    nb_array_destroy(a);

    /* decreasing */
    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F64, 2, -2, 5, &a));
    expect_values(ctx, a, 5, (double[]){2, 1, 0, -1, -2});
    nb_array_destroy(a);

    /* integer dtype: C truncation of 0, 2.5, 5, 7.5, 10 */
    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_I32, 0, 10, 5, &a));
    expect_values(ctx, a, 5, (double[]){0, 2, 5, 7, 10});
    nb_array_destroy(a);

    /* num 1: just start */
    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F64, 2, 5, 1, &a));
    expect_shape(a, 1, (int64_t[]){1});
    expect_values(ctx, a, 1, (double[]){2});
    nb_array_destroy(a);

    /* num 0: empty */
    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F64, 2, 5, 0, &a));
    expect_shape(a, 1, (int64_t[]){0});
    expect_aligned(a);
    nb_array_destroy(a);

    nb_ctx_clear_error(ctx);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_linspace(ctx, NB_DTYPE_F64, 0, 1, -1, &a));
    assert_null(a);
    NBT_ERRMSG_HAS(ctx, "nb_array_linspace");
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void check_eye(nb_ctx *ctx, nb_dtype dt, int64_t n, int64_t m, int64_t k) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_eye(ctx, dt, n, m, k, &a));
    NBT_EQ_I64(nb_array_dtype(a), dt);
    expect_shape(a, 2, (int64_t[]){n, m});
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < m; j++) {
            double want = (j - i == k) ? 1.0 : 0.0;
            double got = -1;
            NBT_OK(ctx, nb_array_get(a, (int64_t[]){i, j}, &got));
            if (got != want) {
                fail_msg("eye(%lld,%lld,k=%lld)[%lld,%lld] = %g, want %g", (long long)n,
                         (long long)m, (long long)k, (long long)i, (long long)j, got, want);
            }
        }
    }
    nb_array_destroy(a);
}

static void test_eye(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    check_eye(ctx, NB_DTYPE_F32, 3, 3, 0);
    check_eye(ctx, NB_DTYPE_F64, 3, 3, -1);
    check_eye(ctx, NB_DTYPE_F64, 3, 4, -1);
    check_eye(ctx, NB_DTYPE_I32, 2, 4, 2);
    check_eye(ctx, NB_DTYPE_I64, 4, 2, 0);
    check_eye(ctx, NB_DTYPE_BOOL, 3, 5, 2);
    check_eye(ctx, NB_DTYPE_F32, 2, 2, 5); /* diagonal outside: all zeros */
    check_eye(ctx, NB_DTYPE_F32, 0, 3, 0);
    nb_array *a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_eye(ctx, NB_DTYPE_F32, -1, 3, 0, &a));
    assert_null(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- accessors ---------------------------------------------------------------------- */

static void test_accessors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I64, 3, (int64_t[]){2, 3, 4}, &a));
    NBT_EQ_I64(nb_array_rank(a), 3);
    NBT_EQ_I64(nb_array_dim(a, 0), 2);
    NBT_EQ_I64(nb_array_dim(a, 1), 3);
    NBT_EQ_I64(nb_array_dim(a, 2), 4);
    NBT_EQ_I64(nb_array_dim(a, -1), 4);
    NBT_EQ_I64(nb_array_dim(a, -2), 3);
    NBT_EQ_I64(nb_array_dim(a, -3), 2);
    NBT_EQ_I64(nb_array_dim(a, 3), -1);
    NBT_EQ_I64(nb_array_dim(a, -4), -1);
    NBT_EQ_I64(nb_array_size(a), 24);
    NBT_EQ_I64(nb_array_nbytes(a), 192);
    assert_ptr_equal(nb_array_ctx(a), ctx);
    NBT_EQ_I64(nb_array_dtype(a), NB_DTYPE_I64);
    NBT_OK(ctx, nb_array_check(a));
    nb_array_destroy(a);

    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_BOOL, 2, (int64_t[]){3, 5}, &a));
    NBT_EQ_I64(nb_array_nbytes(a), 15);
    NBT_EQ_I64(nb_array_dim(a, -1), 5);
    nb_array_destroy(a);

    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 0, NULL, &a));
    NBT_EQ_I64(nb_array_size(a), 1);
    NBT_EQ_I64(nb_array_nbytes(a), 4);
    NBT_EQ_I64(nb_array_dim(a, 0), -1);
    NBT_EQ_I64(nb_array_dim(a, -1), -1);
    nb_array_destroy(a);

    /* the shape is copied from the caller */
    int64_t shp[2] = {4, 5};
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, shp, &a));
    shp[0] = 99;
    NBT_EQ_I64(nb_array_dim(a, 0), 4);
    NBT_EQ_I64(nb_array_size(a), 20);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- element access ----------------------------------------------------------------- */

static void test_get_set(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = mk(ctx, NB_DTYPE_F64, 2, (int64_t[]){2, 3}, (double[]){0, 1, 2, 3, 4, 5});
    double v = -1;
    NBT_OK(ctx, nb_array_get(a, (int64_t[]){1, 2}, &v));
    NBT_EQ_F64(v, 5);
    NBT_OK(ctx, nb_array_get(a, (int64_t[]){0, 1}, &v));
    NBT_EQ_F64(v, 1);
    NBT_OK(ctx, nb_array_get(a, (int64_t[]){-1, -1}, &v));
    NBT_EQ_F64(v, 5);
    NBT_OK(ctx, nb_array_get(a, (int64_t[]){-2, -3}, &v));
    NBT_EQ_F64(v, 0);
    NBT_OK(ctx, nb_array_get(a, (int64_t[]){-1, 0}, &v));
    NBT_EQ_F64(v, 3);

    NBT_OK(ctx, nb_array_set(a, (int64_t[]){1, 0}, 42.5));
    NBT_EQ_F64(raw_at(a, 3), 42.5);
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){-2, -1}, -7.25));
    NBT_EQ_F64(raw_at(a, 2), -7.25);
    NBT_OK(ctx, nb_array_get_flat(a, 2, &v));
    NBT_EQ_F64(v, -7.25);
    NBT_OK(ctx, nb_array_get_flat(a, 3, &v));
    NBT_EQ_F64(v, 42.5);

    int64_t iv = 0;
    NBT_OK(ctx, nb_array_set_i64(a, (int64_t[]){0, 0}, -9));
    NBT_EQ_F64(raw_at(a, 0), -9);
    NBT_OK(ctx, nb_array_get_i64(a, (int64_t[]){0, -3}, &iv));
    NBT_EQ_I64(iv, -9);
    nb_array_destroy(a);

    /* rank 3, row-major */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 3, (int64_t[]){2, 3, 4}, &a));
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){1, 2, 3}, 17));
    NBT_EQ_F64(raw_at(a, 23), 17);
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){1, 0, 2}, 5));
    NBT_EQ_F64(raw_at(a, 14), 5);
    NBT_OK(ctx, nb_array_get(a, (int64_t[]){-1, -3, -2}, &v));
    NBT_EQ_F64(v, 5);
    nb_array_destroy(a);

    /* rank 8 */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 8, (int64_t[]){2, 1, 2, 1, 2, 1, 2, 1}, &a));
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){1, 0, 1, 0, 1, 0, 1, 0}, 3.5));
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){1, 0, 0, 0, 1, 0, 0, 0}, 1.5));
    NBT_OK(ctx, nb_array_get_flat(a, 15, &v));
    NBT_EQ_F64(v, 3.5);
    NBT_OK(ctx, nb_array_get_flat(a, 10, &v));
    NBT_EQ_F64(v, 1.5);
    NBT_OK(ctx, nb_array_get(a, (int64_t[]){-1, -1, -1, -1, -1, -1, -1, -1}, &v));
    NBT_EQ_F64(v, 3.5);
    nb_array_destroy(a);

    /* bool */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_BOOL, 1, (int64_t[]){3}, &a));
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){1}, 1.0));
    NBT_OK(ctx, nb_array_set_i64(a, (int64_t[]){2}, 1));
    expect_values(ctx, a, 3, (double[]){0, 1, 1});
    nb_array_destroy(a);

    /* get_i64 on a float array: C truncation */
    a = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){3}, (double[]){2.75, -2.75, NAN});
    NBT_OK(ctx, nb_array_get_i64(a, (int64_t[]){0}, &iv));
    NBT_EQ_I64(iv, 2);
    NBT_OK(ctx, nb_array_get_i64(a, (int64_t[]){1}, &iv));
    NBT_EQ_I64(iv, -2);
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_get_i64(a, (int64_t[]){2}, &iv));
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_index_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = mk(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, (double[]){0, 1, 2, 3, 4, 5});
    double v = 0;
    int64_t iv = 0;

    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_get(a, (int64_t[]){0, 7}, &v));
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_ERR_INDEX);
    NBT_ERRMSG_HAS(ctx, "nb_array_get");
    errmsg_has_any(ctx, "axis 1", "axis=1");
    NBT_ERRMSG_HAS(ctx, "7");
    errmsg_has_any(ctx, "2,3", "2, 3");

    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_get(a, (int64_t[]){-3, 0}, &v));
    errmsg_has_any(ctx, "axis 0", "axis=0");
    NBT_ERRMSG_HAS(ctx, "-3");
    errmsg_has_any(ctx, "2,3", "2, 3");

    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_get(a, (int64_t[]){2, 0}, &v));
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_get(a, (int64_t[]){0, 3}, &v));
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_get(a, (int64_t[]){0, -4}, &v));

    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_set(a, (int64_t[]){5, 0}, 1.0));
    NBT_ERRMSG_HAS(ctx, "nb_array_set");
    errmsg_has_any(ctx, "axis 0", "axis=0");
    NBT_ERRMSG_HAS(ctx, "5");

    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_get_i64(a, (int64_t[]){0, 3}, &iv));
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_set_i64(a, (int64_t[]){-3, 0}, 1));

    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_get_flat(a, 6, &v));
    NBT_ERRMSG_HAS(ctx, "nb_array_get_flat");
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_get_flat(a, -1, &v));

    /* nothing was written by the failed sets */
    expect_values(ctx, a, 6, (double[]){0, 1, 2, 3, 4, 5});
    nb_array_destroy(a);

    /* empty array: every index is out of range */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){3, 0}, &a));
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_get(a, (int64_t[]){0, 0}, &v));
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_get_flat(a, 0, &v));
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* core.h: "Results come back through out-parameters, which are set to NULL (or zero) on
 * failure." */
static void test_failed_get_zeroes_out(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){1, NAN});
    double v = 42;
    int64_t iv = 42;
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_get(a, (int64_t[]){5}, &v));
    NBT_EQ_F64(v, 0);
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_get_i64(a, (int64_t[]){-3}, &iv));
    NBT_EQ_I64(iv, 0);
    v = 42;
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_get_flat(a, 2, &v));
    NBT_EQ_F64(v, 0);
    iv = 42;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_get_i64(a, (int64_t[]){1}, &iv)); /* NaN */
    NBT_EQ_I64(iv, 0);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_set_values_that_do_not_fit(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, 5, &a));
    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_set(a, (int64_t[]){0}, NAN));
    NBT_ERRMSG_HAS(ctx, "nb_array_set");
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_set(a, (int64_t[]){0}, 1e30));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_set(a, (int64_t[]){1}, -1e30));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_set(a, (int64_t[]){1}, INFINITY));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_set(a, (int64_t[]){1}, 2147483648.0));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_set_i64(a, (int64_t[]){1}, (int64_t)1 << 40));
    expect_values(ctx, a, 2, (double[]){5, 5}); /* unchanged */
    /* the limits themselves fit */
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){0}, 2147483647.0));
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){1}, -2147483648.0));
    expect_values(ctx, a, 2, (double[]){2147483647.0, -2147483648.0});
    /* truncation toward zero */
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){0}, -3.9));
    NBT_EQ_F64(raw_at(a, 0), -3);
    nb_array_destroy(a);

    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I64, 1, (int64_t[]){1}, &a));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_set(a, (int64_t[]){0}, 9223372036854775808.0));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_set(a, (int64_t[]){0}, NAN));
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){0}, -9223372036854775808.0));
    int64_t iv = 0;
    NBT_OK(ctx, nb_array_get_i64(a, (int64_t[]){0}, &iv));
    NBT_EQ_I64(iv, INT64_MIN);
    nb_array_destroy(a);

    /* floats take NaN */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 1, (int64_t[]){1}, &a));
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){0}, NAN));
    NBT_TRUE(isnan(raw_at(a, 0)));
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_i64_exact(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const int64_t big = ((int64_t)1 << 62) + 1; /* not representable in double */
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I64, 1, (int64_t[]){3}, &a));
    NBT_OK(ctx, nb_array_set_i64(a, (int64_t[]){0}, big));
    NBT_OK(ctx, nb_array_set_i64(a, (int64_t[]){1}, INT64_MAX));
    NBT_OK(ctx, nb_array_set_i64(a, (int64_t[]){-1}, INT64_MIN));
    int64_t iv = 0;
    NBT_OK(ctx, nb_array_get_i64(a, (int64_t[]){0}, &iv));
    NBT_EQ_I64(iv, big);
    NBT_EQ_I64(((const int64_t *)nb_array_data(a))[0], big);
    NBT_OK(ctx, nb_array_get_i64(a, (int64_t[]){-2}, &iv));
    NBT_EQ_I64(iv, INT64_MAX);
    NBT_OK(ctx, nb_array_get_i64(a, (int64_t[]){2}, &iv));
    NBT_EQ_I64(iv, INT64_MIN);
    /* through double it rounds */
    double v = 0;
    NBT_OK(ctx, nb_array_get(a, (int64_t[]){0}, &v));
    NBT_EQ_F64(v, (double)big);
    /* copy and cast to i64 keep every bit */
    nb_array *c = NULL, *k = NULL;
    NBT_OK(ctx, nb_array_copy(a, &c));
    NBT_OK(ctx, nb_array_cast(a, NB_DTYPE_I64, &k));
    NBT_OK(ctx, nb_array_get_i64(c, (int64_t[]){0}, &iv));
    NBT_EQ_I64(iv, big);
    NBT_OK(ctx, nb_array_get_i64(k, (int64_t[]){0}, &iv));
    NBT_EQ_I64(iv, big);
    nb_array_destroy(c);
    nb_array_destroy(k);
    nb_array_destroy(a);

    /* from_data keeps every bit as well */
    int64_t src[2] = {big, -big};
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I64, 1, (int64_t[]){2}, src, &a));
    NBT_OK(ctx, nb_array_get_i64(a, (int64_t[]){1}, &iv));
    NBT_EQ_I64(iv, -big);
    nb_array_destroy(a);

    /* i32 via _i64 */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 0, NULL, &a));
    NBT_OK(ctx, nb_array_set_i64(a, NULL, INT32_MIN));
    NBT_OK(ctx, nb_array_get_i64(a, NULL, &iv));
    NBT_EQ_I64(iv, INT32_MIN);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- copy / cast / reshape ---------------------------------------------------------- */

static void test_copy(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = mk(ctx, NB_DTYPE_I32, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4});
    nb_array *c = NULL;
    NBT_OK(ctx, nb_array_copy(a, &c));
    assert_ptr_not_equal(c, a);
    assert_ptr_not_equal(nb_array_data(c), nb_array_data(a));
    NBT_EQ_I64(nb_array_dtype(c), NB_DTYPE_I32);
    expect_shape(c, 2, (int64_t[]){2, 2});
    expect_values(ctx, c, 4, (double[]){1, 2, 3, 4});
    nb_ctx_stats st;
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &st));
    NBT_EQ_I64(st.live_arrays, 2);
    NBT_EQ_I64(st.live_buffers, 2);
    /* independent data, both ways */
    NBT_OK(ctx, nb_array_set(c, (int64_t[]){0, 0}, 100));
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){1, 1}, -100));
    expect_values(ctx, a, 4, (double[]){1, 2, 3, -100});
    expect_values(ctx, c, 4, (double[]){100, 2, 3, 4});
    /* the copy survives the original */
    nb_array_destroy(a);
    expect_values(ctx, c, 4, (double[]){100, 2, 3, 4});
    nb_array_destroy(c);

    /* empty and rank 0 */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){0, 4}, &a));
    NBT_OK(ctx, nb_array_copy(a, &c));
    expect_shape(c, 2, (int64_t[]){0, 4});
    expect_aligned(c);
    nb_array_destroy(c);
    nb_array_destroy(a);
    NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_BOOL, 1, &a));
    NBT_OK(ctx, nb_array_copy(a, &c));
    NBT_EQ_I64(nb_array_rank(c), 0);
    NBT_EQ_F64(raw_at(c, 0), 1);
    nb_array_destroy(c);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_cast_every_pair(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const double num[5] = {0, 1, 3, 0, -2};
    const double boo[5] = {0, 1, 1, 0, 1};
    for (int s = 0; s < NB_DTYPE_COUNT; s++) {
        nb_dtype sdt = k_dtypes[s];
        const double *src = sdt == NB_DTYPE_BOOL ? boo : num;
        nb_array *a = mk(ctx, sdt, 2, (int64_t[]){1, 5}, src);
        for (int d = 0; d < NB_DTYPE_COUNT; d++) {
            nb_dtype ddt = k_dtypes[d];
            nb_array *b = NULL;
            NBT_OK(ctx, nb_array_cast(a, ddt, &b));
            NBT_EQ_I64(nb_array_dtype(b), ddt);
            expect_shape(b, 2, (int64_t[]){1, 5});
            expect_aligned(b);
            assert_ptr_not_equal(nb_array_data(b), nb_array_data(a));
            expect_values(ctx, b, 5, ddt == NB_DTYPE_BOOL ? boo : src);
            nb_array_destroy(b);
        }
        /* source untouched */
        expect_values(ctx, a, 5, src);
        nb_array_destroy(a);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_cast_semantics(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a =
        mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){6}, (double[]){-2.7, -0.5, 0.5, 2.7, -0.0, 0.0});
    nb_array *b = NULL;
    NBT_OK(ctx, nb_array_cast(a, NB_DTYPE_I32, &b));
    expect_values(ctx, b, 6, (double[]){-2, 0, 0, 2, 0, 0});
    nb_array_destroy(b);
    NBT_OK(ctx, nb_array_cast(a, NB_DTYPE_I64, &b));
    expect_values(ctx, b, 6, (double[]){-2, 0, 0, 2, 0, 0});
    nb_array_destroy(b);
    /* any nonzero is true; -0 is zero */
    NBT_OK(ctx, nb_array_cast(a, NB_DTYPE_BOOL, &b));
    expect_values(ctx, b, 6, (double[]){1, 1, 1, 1, 0, 0});
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* i32 nonzero to bool, bool to float */
    a = mk(ctx, NB_DTYPE_I32, 1, (int64_t[]){4}, (double[]){0, -5, 7, 0});
    NBT_OK(ctx, nb_array_cast(a, NB_DTYPE_BOOL, &b));
    expect_values(ctx, b, 4, (double[]){0, 1, 1, 0});
    nb_array *c = NULL;
    NBT_OK(ctx, nb_array_cast(b, NB_DTYPE_F32, &c));
    expect_values(ctx, c, 4, (double[]){0, 1, 1, 0});
    nb_array_destroy(c);
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* f64 to f32 rounds; f32 to f64 is exact */
    a = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){1}, (double[]){0.1});
    NBT_OK(ctx, nb_array_cast(a, NB_DTYPE_F32, &b));
    NBT_EQ_F64(raw_at(b, 0), (double)0.1f);
    NBT_OK(ctx, nb_array_cast(b, NB_DTYPE_F64, &c));
    NBT_EQ_F64(raw_at(c, 0), (double)0.1f);
    nb_array_destroy(c);
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* NaN to float stays NaN */
    a = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){NAN, 1});
    NBT_OK(ctx, nb_array_cast(a, NB_DTYPE_F32, &b));
    NBT_TRUE(isnan(raw_at(b, 0)));
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* NaN to int is an error naming the first offending index */
    a = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){6}, (double[]){1, 2, 3, 4, NAN, NAN});
    nb_ctx_clear_error(ctx);
    b = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_cast(a, NB_DTYPE_I32, &b));
    assert_null(b);
    NBT_ERRMSG_HAS(ctx, "nb_array_cast");
    NBT_ERRMSG_HAS(ctx, "4");
    b = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_cast(a, NB_DTYPE_I64, &b));
    assert_null(b);
    nb_array_destroy(a);

    /* out of range */
    a = mk(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, (double[]){1, 1e10});
    b = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_cast(a, NB_DTYPE_I32, &b));
    assert_null(b);
    NBT_OK(ctx, nb_array_cast(a, NB_DTYPE_I64, &b));
    expect_values(ctx, b, 2, (double[]){1, 1e10});
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* empty arrays cast fine */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){0, 3}, &a));
    NBT_OK(ctx, nb_array_cast(a, NB_DTYPE_BOOL, &b));
    expect_shape(b, 2, (int64_t[]){0, 3});
    NBT_EQ_I64(nb_array_nbytes(b), 0);
    nb_array_destroy(b);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* array.h: "converting a value that does not fit an integer dtype (NaN, out of range) is
 * NB_ERR_INVALID" -- integer sources included. */
static void test_cast_int_out_of_range(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    int64_t big[3] = {1, (int64_t)1 << 40, -((int64_t)1 << 40)};
    nb_array *a = NULL, *b = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I64, 1, (int64_t[]){3}, big, &a));
    b = k_sentinel_arr;
    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_cast(a, NB_DTYPE_I32, &b));
    assert_null(b);
    NBT_ERRMSG_HAS(ctx, "nb_array_cast");
    nb_array_destroy(a);
    /* the limits themselves fit */
    int64_t lim[2] = {INT32_MAX, INT32_MIN};
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I64, 1, (int64_t[]){2}, lim, &a));
    NBT_OK(ctx, nb_array_cast(a, NB_DTYPE_I32, &b));
    expect_values(ctx, b, 2, (double[]){INT32_MAX, INT32_MIN});
    nb_array_destroy(b);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_reshape_shares_data(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = mk(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, (double[]){0, 1, 2, 3, 4, 5});
    nb_array *r = NULL;
    NBT_OK(ctx, nb_array_reshape(a, 2, (int64_t[]){3, 2}, &r));
    assert_ptr_not_equal(r, a);
    expect_shape(r, 2, (int64_t[]){3, 2});
    expect_shape(a, 2, (int64_t[]){2, 3});
    NBT_EQ_I64(nb_array_dtype(r), NB_DTYPE_F32);
    assert_ptr_equal(nb_array_data(r), nb_array_data(a));
    double v = 0;
    NBT_OK(ctx, nb_array_get(r, (int64_t[]){2, 1}, &v));
    NBT_EQ_F64(v, 5);

    nb_ctx_stats st;
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &st));
    NBT_EQ_I64(st.live_arrays, 2);
    NBT_EQ_I64(st.live_buffers, 1);

    /* writes through one are seen through the other */
    NBT_OK(ctx, nb_array_set(r, (int64_t[]){1, 0}, 77));
    NBT_OK(ctx, nb_array_get(a, (int64_t[]){0, 2}, &v));
    NBT_EQ_F64(v, 77);
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){1, 2}, -1));
    NBT_OK(ctx, nb_array_get(r, (int64_t[]){2, 1}, &v));
    NBT_EQ_F64(v, -1);

    /* the view keeps the data alive after the original goes */
    nb_array_destroy(a);
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &st));
    NBT_EQ_I64(st.live_arrays, 1);
    NBT_EQ_I64(st.live_buffers, 1);
    expect_values(ctx, r, 6, (double[]){0, 1, 77, 3, 4, -1});

    /* a reshape of a reshape shares too */
    nb_array *r2 = NULL;
    NBT_OK(ctx, nb_array_reshape(r, 1, (int64_t[]){6}, &r2));
    assert_ptr_equal(nb_array_data(r2), nb_array_data(r));
    nb_array_destroy(r);
    expect_values(ctx, r2, 6, (double[]){0, 1, 77, 3, 4, -1});
    nb_array_destroy(r2);
    nbt_assert_no_live(ctx);

    /* rank 0 <-> rank 3 */
    NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_I64, 9, &a));
    NBT_OK(ctx, nb_array_reshape(a, 3, (int64_t[]){1, 1, 1}, &r));
    expect_shape(r, 3, (int64_t[]){1, 1, 1});
    NBT_OK(ctx, nb_array_reshape(r, 0, NULL, &r2));
    NBT_EQ_I64(nb_array_rank(r2), 0);
    NBT_OK(ctx, nb_array_get(r2, NULL, &v));
    NBT_EQ_F64(v, 9);
    nb_array_destroy(r2);
    nb_array_destroy(r);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_reshape_infer(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = NULL, *r = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 3, (int64_t[]){2, 3, 4}, &a));
    NBT_OK(ctx, nb_array_reshape(a, 1, (int64_t[]){-1}, &r));
    expect_shape(r, 1, (int64_t[]){24});
    nb_array_destroy(r);
    NBT_OK(ctx, nb_array_reshape(a, 2, (int64_t[]){4, -1}, &r));
    expect_shape(r, 2, (int64_t[]){4, 6});
    nb_array_destroy(r);
    NBT_OK(ctx, nb_array_reshape(a, 3, (int64_t[]){-1, 2, 2}, &r));
    expect_shape(r, 3, (int64_t[]){6, 2, 2});
    nb_array_destroy(r);
    NBT_OK(ctx, nb_array_reshape(a, 4, (int64_t[]){2, 1, -1, 3}, &r));
    expect_shape(r, 4, (int64_t[]){2, 1, 4, 3});
    nb_array_destroy(r);
    nb_array_destroy(a);

    /* zero-size: -1 inferred from the other dims */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){0, 3}, &a));
    NBT_OK(ctx, nb_array_reshape(a, 2, (int64_t[]){3, -1}, &r));
    expect_shape(r, 2, (int64_t[]){3, 0});
    nb_array_destroy(r);
    NBT_OK(ctx, nb_array_reshape(a, 1, (int64_t[]){-1}, &r));
    expect_shape(r, 1, (int64_t[]){0});
    nb_array_destroy(r);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_reshape_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = NULL, *r = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, &a));

    /* count mismatch: both shapes in the message */
    nb_ctx_clear_error(ctx);
    r = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_reshape(a, 2, (int64_t[]){4, 2}, &r));
    assert_null(r);
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_ERR_SHAPE);
    NBT_ERRMSG_HAS(ctx, "nb_array_reshape");
    errmsg_has_any(ctx, "2,3", "2, 3");
    errmsg_has_any(ctx, "4,2", "4, 2");

    /* two -1 */
    r = k_sentinel_arr;
    nb_status s = nb_array_reshape(a, 3, (int64_t[]){-1, -1, 2}, &r);
    if (s != NB_ERR_SHAPE && s != NB_ERR_INVALID) {
        fail_msg("two -1 dims returned %s", nb_status_name(s));
    }
    assert_null(r);
    NBT_ERRMSG_HAS(ctx, "nb_array_reshape");

    /* -1 that cannot divide */
    r = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_reshape(a, 2, (int64_t[]){4, -1}, &r));
    assert_null(r);
    /* other negative dims */
    r = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_reshape(a, 2, (int64_t[]){-2, -3}, &r));
    assert_null(r);
    /* rank 9 */
    r = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE,
               nb_array_reshape(a, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 2, 3}, &r));
    assert_null(r);
    /* rank 0 from 6 elements */
    r = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_reshape(a, 0, NULL, &r));
    assert_null(r);

    /* the original is untouched and nothing leaked */
    expect_shape(a, 2, (int64_t[]){2, 3});
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- comparison --------------------------------------------------------------------- */

static bool eq(nb_ctx *ctx, const nb_array *a, const nb_array *b) {
    bool out = false, out2 = true;
    NBT_OK(ctx, nb_array_equal(a, b, &out));
    /* the answer does not depend on a previous value of *out */
    NBT_OK(ctx, nb_array_equal(a, b, &out2));
    NBT_EQ_I64(out, out2);
    return out;
}

static bool ident(nb_ctx *ctx, const nb_array *a, const nb_array *b) {
    bool out = false, out2 = true;
    NBT_OK(ctx, nb_array_identical(a, b, &out));
    NBT_OK(ctx, nb_array_identical(a, b, &out2));
    NBT_EQ_I64(out, out2);
    return out;
}

static bool close_(nb_ctx *ctx, const nb_array *a, const nb_array *b, double rtol, double atol) {
    bool out = false, out2 = true;
    NBT_OK(ctx, nb_array_allclose(a, b, rtol, atol, &out));
    NBT_OK(ctx, nb_array_allclose(a, b, rtol, atol, &out2));
    NBT_EQ_I64(out, out2);
    return out;
}

static void test_equal(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const int64_t s3[1] = {3};
    nb_array *a = mk(ctx, NB_DTYPE_F64, 1, s3, (double[]){1, 2, 3});
    nb_array *b = mk(ctx, NB_DTYPE_F64, 1, s3, (double[]){1, 2, 3});
    nb_array *c = mk(ctx, NB_DTYPE_F64, 1, s3, (double[]){1, 2, 4});
    NBT_TRUE(eq(ctx, a, b));
    NBT_TRUE(eq(ctx, a, a));
    NBT_TRUE(!eq(ctx, a, c));
    nb_array_destroy(c);

    /* dtype mismatch: false even with equal values */
    c = mk(ctx, NB_DTYPE_F32, 1, s3, (double[]){1, 2, 3});
    NBT_TRUE(!eq(ctx, a, c));
    NBT_TRUE(!eq(ctx, c, a));
    nb_array_destroy(c);
    c = mk(ctx, NB_DTYPE_I64, 1, s3, (double[]){1, 2, 3});
    NBT_TRUE(!eq(ctx, a, c));
    nb_array_destroy(c);

    /* shape mismatch with the same elements */
    c = mk(ctx, NB_DTYPE_F64, 2, (int64_t[]){1, 3}, (double[]){1, 2, 3});
    NBT_TRUE(!eq(ctx, a, c));
    nb_array_destroy(c);
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* NaN != NaN, even for the same array */
    a = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){1, NAN});
    b = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){1, NAN});
    NBT_TRUE(!eq(ctx, a, b));
    NBT_TRUE(!eq(ctx, a, a));
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* -0 == +0 */
    a = mk(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, (double[]){-0.0, 1});
    b = mk(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, (double[]){0.0, 1});
    NBT_TRUE(eq(ctx, a, b));
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* i64 values that differ only below double precision */
    int64_t x[1] = {((int64_t)1 << 62) + 1}, y[1] = {(int64_t)1 << 62};
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I64, 1, (int64_t[]){1}, x, &a));
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I64, 1, (int64_t[]){1}, y, &b));
    NBT_TRUE(!eq(ctx, a, b));
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* bool, and empty */
    a = mk(ctx, NB_DTYPE_BOOL, 1, (int64_t[]){2}, (double[]){1, 0});
    b = mk(ctx, NB_DTYPE_BOOL, 1, (int64_t[]){2}, (double[]){1, 0});
    NBT_TRUE(eq(ctx, a, b));
    NBT_OK(ctx, nb_array_set(b, (int64_t[]){1}, 1));
    NBT_TRUE(!eq(ctx, a, b));
    nb_array_destroy(b);
    nb_array_destroy(a);
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){0, 2}, &a));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){0, 2}, &b));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 0}, &c));
    NBT_TRUE(eq(ctx, a, b));
    NBT_TRUE(!eq(ctx, a, c));
    nb_array_destroy(c);
    nb_array_destroy(b);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_identical(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){-0.0, 1});
    nb_array *b = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){0.0, 1});
    nb_array *c = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){-0.0, 1});
    NBT_TRUE(!ident(ctx, a, b)); /* -0 vs +0 differ bitwise */
    NBT_TRUE(ident(ctx, a, c));
    NBT_TRUE(ident(ctx, a, a));
    nb_array_destroy(c);
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* f32 -0 vs +0 */
    a = mk(ctx, NB_DTYPE_F32, 1, (int64_t[]){1}, (double[]){-0.0});
    b = mk(ctx, NB_DTYPE_F32, 1, (int64_t[]){1}, (double[]){0.0});
    NBT_TRUE(!ident(ctx, a, b));
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* NaNs with equal bits are identical, different payloads are not */
    uint64_t bits1 = UINT64_C(0x7ff8000000000001), bits2 = UINT64_C(0x7ff8000000000002);
    double n1[2], n2[2], n3[2];
    memcpy(&n1[0], &bits1, 8);
    memcpy(&n2[0], &bits1, 8);
    memcpy(&n3[0], &bits2, 8);
    n1[1] = n2[1] = n3[1] = 2.0;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, n1, &a));
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, n2, &b));
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, n3, &c));
    NBT_TRUE(ident(ctx, a, b));
    NBT_TRUE(ident(ctx, a, a));
    NBT_TRUE(!ident(ctx, a, c));
    NBT_TRUE(!eq(ctx, a, b)); /* but not equal */
    nb_array_destroy(c);
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* dtype and shape matter even with the same bytes */
    int32_t i4[2] = {0, 0};
    float f4[2] = {0, 0};
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, i4, &a));
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, f4, &b));
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 2, (int64_t[]){2, 1}, i4, &c));
    NBT_TRUE(!ident(ctx, a, b));
    NBT_TRUE(!ident(ctx, a, c));
    nb_array_destroy(c);
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* one different element */
    a = mk(ctx, NB_DTYPE_I64, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4});
    b = mk(ctx, NB_DTYPE_I64, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 5});
    NBT_TRUE(!ident(ctx, a, b));
    NBT_OK(ctx, nb_array_set(b, (int64_t[]){1, 1}, 4));
    NBT_TRUE(ident(ctx, a, b));
    nb_array_destroy(b);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_allclose(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const int64_t s1[1] = {1};
    nb_array *a = mk(ctx, NB_DTYPE_F64, 1, s1, (double[]){1.0});
    nb_array *b = mk(ctx, NB_DTYPE_F64, 1, s1, (double[]){1.1});
    /* |1 - 1.1| = 0.1 <= rtol * 1.1 */
    NBT_TRUE(close_(ctx, a, b, 0.1, 0));
    NBT_TRUE(!close_(ctx, a, b, 0.08, 0));
    NBT_TRUE(close_(ctx, a, b, 0, 0.11));
    NBT_TRUE(!close_(ctx, a, b, 0, 0.09));
    NBT_TRUE(close_(ctx, a, b, 0.05, 0.05));  /* 0.1 <= 0.05 + 0.055 */
    NBT_TRUE(!close_(ctx, a, b, 0.02, 0.05)); /* 0.1 > 0.05 + 0.022 */
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* asymmetric: rtol scales |b| */
    a = mk(ctx, NB_DTYPE_F64, 1, s1, (double[]){10});
    b = mk(ctx, NB_DTYPE_F64, 1, s1, (double[]){1});
    NBT_TRUE(!close_(ctx, a, b, 1.0, 0)); /* 9 > 1*1 */
    NBT_TRUE(close_(ctx, b, a, 1.0, 0));  /* 9 <= 1*10 */
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* atol for tiny values */
    a = mk(ctx, NB_DTYPE_F64, 1, s1, (double[]){0});
    b = mk(ctx, NB_DTYPE_F64, 1, s1, (double[]){1e-9});
    NBT_TRUE(close_(ctx, a, b, 0, 1e-8));
    NBT_TRUE(!close_(ctx, a, b, 1e-5, 1e-10));
    nb_array_destroy(b);
    nb_array_destroy(a);

    /* every element must be close; zero tolerance is exact */
    a = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){3}, (double[]){1, 2, 3});
    b = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){3}, (double[]){1, 2, 3.5});
    NBT_TRUE(!close_(ctx, a, b, 0.1, 0)); /* 0.5 > 0.35 */
    NBT_TRUE(close_(ctx, a, b, 0.15, 0)); /* 0.5 <= 0.525 */
    NBT_TRUE(close_(ctx, a, a, 0, 0));
    nb_array_destroy(b);

    /* dtypes may differ */
    b = mk(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
    NBT_TRUE(close_(ctx, a, b, 0, 0));
    nb_array_destroy(b);
    b = mk(ctx, NB_DTYPE_I32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
    NBT_TRUE(close_(ctx, a, b, 0, 0));
    nb_array_destroy(b);

    /* shape mismatch: false, not an error */
    b = mk(ctx, NB_DTYPE_F64, 2, (int64_t[]){3, 1}, (double[]){1, 2, 3});
    NBT_TRUE(!close_(ctx, a, b, 1, 1));
    nb_array_destroy(b);

    /* NaN is close to nothing */
    b = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){3}, (double[]){1, NAN, 3});
    NBT_TRUE(!close_(ctx, a, b, 1e9, 1e9));
    NBT_TRUE(!close_(ctx, b, b, 1e9, 1e9));
    nb_array_destroy(b);

    /* negative tolerances */
    bool out = true;
    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_allclose(a, a, -1e-5, 0, &out));
    NBT_ERRMSG_HAS(ctx, "nb_array_allclose");
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_array_allclose(a, a, 0, -1e-8, &out));
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- printing ----------------------------------------------------------------------- */

static void test_format_pinned(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    /* rank 0 */
    check_fmt(ctx, NB_DTYPE_F64, 0, NULL, (double[]){3.5}, "array(3.5)");
    check_fmt(ctx, NB_DTYPE_F64, 0, NULL, (double[]){2.0}, "array(2.)");
    check_fmt(ctx, NB_DTYPE_F32, 0, NULL, (double[]){3.5}, "array(3.5, dtype=float32)");
    check_fmt(ctx, NB_DTYPE_I64, 0, NULL, (double[]){7}, "array(7)");
    check_fmt(ctx, NB_DTYPE_I32, 0, NULL, (double[]){7}, "array(7, dtype=int32)");
    check_fmt(ctx, NB_DTYPE_BOOL, 0, NULL, (double[]){1}, "array(True)");
    /* 1-D float */
    check_fmt(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, (double[]){1, 2, 3},
              "array([1., 2., 3.], dtype=float32)");
    check_fmt(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){1, 2}, "array([1., 2.])");
    check_fmt(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){0.5, 0.25}, "array([0.5 , 0.25])");
    check_fmt(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){1.5, 2.0}, "array([1.5, 2. ])");
    check_fmt(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){-1, 2}, "array([-1.,  2.])");
    check_fmt(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, (double[]){0.1, 0.2},
              "array([0.1, 0.2], dtype=float32)");
    /* 1-D int */
    check_fmt(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, (double[]){1, 2}, "array([1, 2], dtype=int32)");
    check_fmt(ctx, NB_DTYPE_I64, 1, (int64_t[]){3}, (double[]){1, 2, 3}, "array([1, 2, 3])");
    check_fmt(ctx, NB_DTYPE_I32, 1, (int64_t[]){3}, (double[]){1, 10, 100},
              "array([  1,  10, 100], dtype=int32)");
    check_fmt(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, (double[]){-1, 2},
              "array([-1,  2], dtype=int32)");
    /* bool */
    check_fmt(ctx, NB_DTYPE_BOOL, 1, (int64_t[]){2}, (double[]){1, 0}, "array([ True, False])");
    check_fmt(ctx, NB_DTYPE_BOOL, 1, (int64_t[]){3}, (double[]){1, 0, 1},
              "array([ True, False,  True])");
    /* 2-D */
    check_fmt(ctx, NB_DTYPE_F64, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4},
              "array([[1., 2.],\n       [3., 4.]])");
    check_fmt(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 2}, (double[]){0, 1, 2, 3},
              "array([[0., 1.],\n       [2., 3.]], dtype=float32)");
    check_fmt(ctx, NB_DTYPE_I32, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4},
              "array([[1, 2],\n       [3, 4]], dtype=int32)");
    check_fmt(ctx, NB_DTYPE_I32, 2, (int64_t[]){2, 2}, (double[]){1, 10, 100, 2},
              "array([[  1,  10],\n       [100,   2]], dtype=int32)");
    /* empty */
    check_fmt(ctx, NB_DTYPE_F32, 1, (int64_t[]){0}, NULL, "array([], dtype=float32)");
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_format_loose(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = NULL;
    /* 3-D: nested brackets, a blank line between blocks */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 3, (int64_t[]){2, 2, 2}, &a));
    const char *s = fmt(ctx, a);
    NBT_TRUE(strncmp(s, "array([[[", 9) == 0);
    NBT_TRUE(strstr(s, "]]])") != NULL);
    NBT_TRUE(strstr(s, "\n\n") != NULL);
    NBT_TRUE(strstr(s, "dtype") == NULL);
    nb_array_destroy(a);
    /* NaN and inf */
    a = mk(ctx, NB_DTYPE_F64, 1, (int64_t[]){3}, (double[]){1, NAN, -INFINITY});
    s = fmt(ctx, a);
    NBT_TRUE(strstr(s, "nan") != NULL);
    NBT_TRUE(strstr(s, "-inf") != NULL);
    nb_array_destroy(a);
    /* empty of other dtypes and shapes */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 2, (int64_t[]){2, 0}, &a));
    s = fmt(ctx, a);
    NBT_TRUE(strncmp(s, "array([", 7) == 0);
    NBT_TRUE(strstr(s, "int32") != NULL);
    nb_array_destroy(a);
    /* rank 8 */
    NBT_OK(ctx, nb_array_ones(ctx, NB_DTYPE_I64, 8, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 2}, &a));
    s = fmt(ctx, a);
    NBT_TRUE(strstr(s, "[[[[[[[[1, 1]]]]]]]]") != NULL);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_format_summarised(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_ones(ctx, NB_DTYPE_F32, 1, (int64_t[]){2000}, &a));
    NBT_STREQ(fmt(ctx, a), "array([1., 1., 1., ..., 1., 1., 1.], dtype=float32)");
    nb_array_destroy(a);

    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_I64, 0, 2000, 1, &a));
    NBT_STREQ(fmt(ctx, a), "array([   0,    1,    2, ..., 1997, 1998, 1999])");
    nb_array_destroy(a);

    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_I32, 0, 1001, 1, &a));
    const char *s = fmt(ctx, a);
    NBT_TRUE(strstr(s, "...") != NULL);
    NBT_TRUE(strstr(s, "1000") != NULL);
    NBT_TRUE(strstr(s, "500") == NULL);
    nb_array_destroy(a);

    /* 2-D, 40 x 40 = 1600 elements: summarised and short */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){40, 40}, &a));
    s = fmt(ctx, a);
    NBT_TRUE(strstr(s, "...") != NULL);
    NBT_TRUE(strlen(s) < 1000);
    nb_array_destroy(a);

    /* exactly 1000 elements are printed in full */
    NBT_OK(ctx, nb_array_ones(ctx, NB_DTYPE_F32, 1, (int64_t[]){1000}, &a));
    s = fmt(ctx, a);
    NBT_TRUE(strstr(s, "...") == NULL);
    NBT_TRUE(strlen(s) >= 1000 * 4 - 2);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_format_snprintf_contract(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = mk(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
    const char *full = "array([1., 2., 3.], dtype=float32)";
    const size_t len = strlen(full);
    size_t need = 0;
    /* cap 0, NULL buf: just the length */
    nb_status s = nb_array_format(a, NULL, 0, &need);
    NBT_EQ_I64(s, NB_ERR_TRUNCATED);
    NBT_EQ_I64(need, len);
    /* small cap: NUL-terminated prefix */
    char buf[64];
    memset(buf, 'X', sizeof buf);
    need = 0;
    NBT_STATUS(ctx, NB_ERR_TRUNCATED, nb_array_format(a, buf, 6, &need));
    NBT_EQ_I64(need, len);
    NBT_STREQ(buf, "array");
    NBT_TRUE(buf[6] == 'X'); /* nothing past cap */
    /* cap == len: one short */
    memset(buf, 'X', sizeof buf);
    NBT_STATUS(ctx, NB_ERR_TRUNCATED, nb_array_format(a, buf, len, &need));
    NBT_EQ_I64(strlen(buf), len - 1);
    NBT_TRUE(strncmp(buf, full, len - 1) == 0);
    /* cap == len + 1: fits */
    memset(buf, 'X', sizeof buf);
    NBT_OK(ctx, nb_array_format(a, buf, len + 1, &need));
    NBT_STREQ(buf, full);
    NBT_EQ_I64(need, len);
    /* cap 1: empty string */
    memset(buf, 'X', sizeof buf);
    NBT_STATUS(ctx, NB_ERR_TRUNCATED, nb_array_format(a, buf, 1, NULL));
    NBT_EQ_I64(buf[0], 0);
    NBT_EQ_I64(buf[1], 'X');
    /* needed may be NULL */
    NBT_OK(ctx, nb_array_format(a, buf, sizeof buf, NULL));
    NBT_STREQ(buf, full);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_fprint(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = mk(ctx, NB_DTYPE_F64, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4});
    FILE *f = tmpfile();
    assert_non_null(f);
    NBT_OK(ctx, nb_array_fprint(a, f));
    rewind(f);
    char buf[256] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    NBT_STREQ(buf, "array([[1., 2.],\n       [3., 4.]])\n");
    nb_array_destroy(a);

    /* a summarised big array prints the same as format */
    NBT_OK(ctx, nb_array_ones(ctx, NB_DTYPE_F32, 1, (int64_t[]){5000}, &a));
    f = tmpfile();
    assert_non_null(f);
    NBT_OK(ctx, nb_array_fprint(a, f));
    rewind(f);
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    NBT_STREQ(buf, "array([1., 1., 1., ..., 1., 1., 1.], dtype=float32)\n");
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void check_sig(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape, const char *want) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, dt, rank, shape, &a));
    char buf[128];
    size_t need = 0;
    NBT_OK(ctx, nb_array_format_sig(a, buf, sizeof buf, &need));
    NBT_STREQ(buf, want);
    NBT_EQ_I64(need, strlen(want));
    nb_array_destroy(a);
}

static void test_format_sig(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    check_sig(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, "f32[2,3]");
    check_sig(ctx, NB_DTYPE_F64, 0, NULL, "f64[]");
    check_sig(ctx, NB_DTYPE_I32, 1, (int64_t[]){0}, "i32[0]");
    check_sig(ctx, NB_DTYPE_I64, 1, (int64_t[]){12345}, "i64[12345]");
    check_sig(ctx, NB_DTYPE_BOOL, 3, (int64_t[]){1, 2, 3}, "bool[1,2,3]");
    check_sig(ctx, NB_DTYPE_F32, 8, (int64_t[]){1, 2, 1, 2, 1, 2, 1, 2}, "f32[1,2,1,2,1,2,1,2]");

    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, &a));
    size_t need = 0;
    NBT_STATUS(ctx, NB_ERR_TRUNCATED, nb_array_format_sig(a, NULL, 0, &need));
    NBT_EQ_I64(need, 8);
    char buf[16];
    memset(buf, 'X', sizeof buf);
    NBT_STATUS(ctx, NB_ERR_TRUNCATED, nb_array_format_sig(a, buf, 4, &need));
    NBT_STREQ(buf, "f32");
    NBT_EQ_I64(buf[4], 'X');
    NBT_OK(ctx, nb_array_format_sig(a, buf, 9, NULL));
    NBT_STREQ(buf, "f32[2,3]");
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- overflow-checked shapes -------------------------------------------------------- */

static void test_shape_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a;

    /* negative dim */
    nb_ctx_clear_error(ctx);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){3, -2}, &a));
    assert_null(a);
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_ERR_SHAPE);
    NBT_ERRMSG_HAS(ctx, "nb_array_zeros");
    NBT_ERRMSG_HAS(ctx, "-2");
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_ones(ctx, NB_DTYPE_I32, 1, (int64_t[]){-1}, &a));
    assert_null(a);
    NBT_ERRMSG_HAS(ctx, "nb_array_ones");
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE,
               nb_array_full(ctx, NB_DTYPE_F64, 3, (int64_t[]){1, INT64_MIN, 1}, 1.0, &a));
    assert_null(a);
    NBT_ERRMSG_HAS(ctx, "nb_array_full");
    double dummy[4] = {0};
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE,
               nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){-2, -2}, dummy, &a));
    assert_null(a);
    NBT_ERRMSG_HAS(ctx, "nb_array_from_data");

    /* element count overflows int64 */
    nb_ctx_clear_error(ctx);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_OVERFLOW,
               nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){INT64_MAX, 2}, &a));
    assert_null(a);
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_ERR_OVERFLOW);
    NBT_ERRMSG_HAS(ctx, "nb_array_zeros");
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_OVERFLOW,
               nb_array_zeros(ctx, NB_DTYPE_BOOL, 3,
                              (int64_t[]){(int64_t)1 << 31, (int64_t)1 << 31, 4}, &a));
    assert_null(a);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_OVERFLOW,
               nb_array_ones(ctx, NB_DTYPE_I64, 4, (int64_t[]){65536, 65536, 65536, 65536}, &a));
    assert_null(a);
    NBT_ERRMSG_HAS(ctx, "nb_array_ones");
    /* element count fits, bytes do not */
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_OVERFLOW,
               nb_array_zeros(ctx, NB_DTYPE_F64, 1, (int64_t[]){(int64_t)1 << 61}, &a));
    assert_null(a);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_OVERFLOW,
               nb_array_full(ctx, NB_DTYPE_F32, 2, (int64_t[]){(int64_t)1 << 31, (int64_t)1 << 31},
                             0.0, &a));
    assert_null(a);

    /* rank outside 0..8 */
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    nb_ctx_clear_error(ctx);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_zeros(ctx, NB_DTYPE_F32, 9, nine, &a));
    assert_null(a);
    NBT_ERRMSG_HAS(ctx, "nb_array_zeros");
    NBT_ERRMSG_HAS(ctx, "9");
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_zeros(ctx, NB_DTYPE_F32, -1, nine, &a));
    assert_null(a);
    a = k_sentinel_arr;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_from_data(ctx, NB_DTYPE_F32, 9, nine, dummy, &a));
    assert_null(a);

    /* nothing leaked and the context still works */
    nbt_assert_no_live(ctx);
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 8, nine, &a));
    NBT_EQ_I64(nb_array_size(a), 1);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- refcount ----------------------------------------------------------------------- */

static void test_refcount(void **state) {
    (void)state;
    nbt_alloc al = {0};
    nb_ctx *ctx = nbt_ctx_with(&al);
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){100}, &a));
    assert_ptr_equal(nb_array_retain(a), a);
    nb_ctx_stats st;
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &st));
    NBT_EQ_I64(st.live_arrays, 1);
    NBT_EQ_I64(st.live_buffers, 1);
    NBT_TRUE(st.bytes_in_use >= 400);
    NBT_TRUE(st.bytes_peak >= st.bytes_in_use);
    NBT_TRUE(st.n_allocs >= 1);
    NBT_EQ_I64(st.n_alloc_failures, 0);

    nb_array_destroy(a); /* one reference left */
    NBT_OK(ctx, nb_array_check(a));
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &st));
    NBT_EQ_I64(st.live_arrays, 1);
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){99}, 5));
    double v = 0;
    NBT_OK(ctx, nb_array_get(a, (int64_t[]){-1}, &v));
    NBT_EQ_F64(v, 5);

    nb_array_destroy(a); /* freed */
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &st));
    NBT_EQ_I64(st.live_arrays, 0);
    NBT_EQ_I64(st.live_buffers, 0);
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_OK); /* the two destroys were not misuse */
    nbt_assert_no_live(ctx);

    /* many retains */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 0, NULL, &a));
    for (int i = 0; i < 10; i++) {
        assert_ptr_equal(nb_array_retain(a), a);
    }
    for (int i = 0; i < 10; i++) {
        nb_array_destroy(a);
        NBT_OK(ctx, nb_array_check(a));
    }
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_array_destroy(NULL); /* no-op */
    nb_ctx_destroy(ctx);
    /* the context returned every block to the allocator */
    NBT_EQ_I64(al.n_live, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_info),
        cmocka_unit_test(test_constructors_every_dtype_and_rank),
        cmocka_unit_test(test_scalar),
        cmocka_unit_test(test_from_data_copies_unaligned_source),
        cmocka_unit_test(test_full_conversions),
        cmocka_unit_test(test_alignment),
        cmocka_unit_test(test_arange),
        cmocka_unit_test(test_linspace),
        cmocka_unit_test(test_eye),
        cmocka_unit_test(test_accessors),
        cmocka_unit_test(test_get_set),
        cmocka_unit_test(test_index_errors),
        cmocka_unit_test(test_failed_get_zeroes_out),
        cmocka_unit_test(test_set_values_that_do_not_fit),
        cmocka_unit_test(test_i64_exact),
        cmocka_unit_test(test_copy),
        cmocka_unit_test(test_cast_every_pair),
        cmocka_unit_test(test_cast_semantics),
        cmocka_unit_test(test_cast_int_out_of_range),
        cmocka_unit_test(test_reshape_shares_data),
        cmocka_unit_test(test_reshape_infer),
        cmocka_unit_test(test_reshape_errors),
        cmocka_unit_test(test_equal),
        cmocka_unit_test(test_identical),
        cmocka_unit_test(test_allclose),
        cmocka_unit_test(test_format_pinned),
        cmocka_unit_test(test_format_loose),
        cmocka_unit_test(test_format_summarised),
        cmocka_unit_test(test_format_snprintf_contract),
        cmocka_unit_test(test_fprint),
        cmocka_unit_test(test_format_sig),
        cmocka_unit_test(test_shape_errors),
        cmocka_unit_test(test_refcount),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
