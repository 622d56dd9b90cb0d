/*
 * test_random.c -- Threefry-2x32 keys against Random123's published known-answer vectors
 * and against JAX 0.10's own outputs (tests/core/oracle/jax_random.txt, made by
 * gen_jax_random.py beside it), truncated normals against JAX's bits
 * (jax_truncated_normal.txt, from gen_truncated_normal.py) and in the far tails against the
 * truncated normal's moments, plus misuse.
 */
#include "nbtest.h"

#include "core/internal.h"

#include <math.h>
#include <nabla/random.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef NBT_ORACLE_DIR
#define NBT_ORACLE_DIR "tests/core/oracle"
#endif

/* The words of the oracle line `name` (up to cap of them); their count. */
static int oracle_words(const char *name, uint32_t *w, int cap) {
    FILE *f = fopen(NBT_ORACLE_DIR "/jax_random.txt", "r");
    if (f == NULL) {
        fail_msg("cannot open %s/jax_random.txt", NBT_ORACLE_DIR);
    }
    char line[1024];
    int n = -1;
    size_t len = strlen(name);
    while (n < 0 && fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, name, len) != 0 || line[len] != ' ') {
            continue;
        }
        n = 0;
        char *p = line + len, *end = NULL;
        for (unsigned long v = strtoul(p, &end, 16); end != p && n < cap;
             p = end, v = strtoul(p, &end, 16)) {
            w[n++] = (uint32_t)v;
        }
    }
    fclose(f);
    if (n <= 0) {
        fail_msg("no oracle line %s", name);
    }
    return n;
}

static void assert_words(const nb_array *a, const char *name) {
    uint32_t want[64];
    int n = oracle_words(name, want, 64);
    NBT_EQ_I64((int64_t)nb_array_nbytes(a), (int64_t)n * 4);
    const uint32_t *got = nb_array_data(a);
    for (int i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            fail_msg("%s: word %d is %08x, JAX gives %08x", name, i, got[i], want[i]);
        }
    }
}

/* Random123's kat_vectors for threefry2x32 with 20 rounds: (counter, key) -> block. */
static void test_threefry_known_answers(void **state) {
    (void)state;
    const struct {
        uint32_t ctr[2], key[2], out[2];
    } kat[] = {
        {{0, 0}, {0, 0}, {0x6b200159u, 0x99ba4efeu}},
        {{0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}, {0x1cb996fcu, 0xbb002be7u}},
        {{0x243f6a88u, 0x85a308d3u}, {0x13198a2eu, 0x03707344u}, {0xc4923a9cu, 0x483df7a0u}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t y0 = 0, y1 = 0;
        nbi_threefry2x32(kat[i].key[0], kat[i].key[1], kat[i].ctr[0], kat[i].ctr[1], &y0, &y1);
        if (y0 != kat[i].out[0] || y1 != kat[i].out[1]) {
            fail_msg("vector %d: %08x %08x, Random123 gives %08x %08x", (int)i, y0, y1,
                     kat[i].out[0], kat[i].out[1]);
        }
    }
}

/* JAX's PRNGKey, split, fold_in, bits and uniform (f32, f64), word for word. */
static void test_jax_oracle(void **state) {
    (void)state;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(NULL, &ctx));
    nb_array *k0 = NULL, *k42 = NULL, *a = NULL;
    const uint64_t seeds[] = {0, 1, 42, 4294967303ull};
    const char *names[] = {"key_0", "key_1", "key_42", "key_4294967303"};
    for (int i = 0; i < 4; i++) {
        NBT_OK(ctx, nb_random_key(ctx, seeds[i], &a));
        assert_words(a, names[i]);
        nb_array_destroy(a);
    }
    NBT_OK(ctx, nb_random_key(ctx, 0, &k0));
    NBT_OK(ctx, nb_random_key(ctx, 42, &k42));
    NBT_OK(ctx, nb_random_split(k0, 2, &a));
    assert_words(a, "split_0_2");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_split(k0, 5, &a));
    assert_words(a, "split_0_5");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_split(k42, 3, &a));
    assert_words(a, "split_42_3");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_fold_in(k0, 7, &a));
    assert_words(a, "fold_in_0_7");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_fold_in(k42, 123456, &a));
    assert_words(a, "fold_in_42_123456");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_bits(k0, 1, (int64_t[]){10}, &a));
    assert_words(a, "bits32_0_10");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_bits(k42, 2, (int64_t[]){2, 3}, &a));
    assert_words(a, "bits32_42_2x3");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_uniform(k42, NB_DTYPE_F32, 1, (int64_t[]){7}, 0, 1, &a));
    assert_words(a, "uniform_f32_42_7");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_uniform(k0, NB_DTYPE_F32, 1, (int64_t[]){5}, -2, 3, &a));
    assert_words(a, "uniform_f32_0_5_m2_3");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_uniform(k42, NB_DTYPE_F64, 1, (int64_t[]){4}, 0, 1, &a));
    assert_words(a, "uniform_f64_42_4");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_bernoulli(k42, 0.3, 1, (int64_t[]){16}, &a));
    uint32_t want[16];
    NBT_EQ_I64(oracle_words("bernoulli_42_p03_16", want, 16), 16);
    for (int i = 0; i < 16; i++) {
        NBT_EQ_I64(((const uint8_t *)nb_array_data(a))[i], want[i]);
    }
    nb_array_destroy(a);
    /* normal: JAX's erfinv is XLA's own polynomial; ours is refined to double accuracy,
     * so the f32 values agree to a few ULP and the f64 ones to 1e-13 */
    NBT_OK(ctx, nb_random_normal(k42, NB_DTYPE_F32, 1, (int64_t[]){8}, &a));
    NBT_EQ_I64(oracle_words("normal_f32_42_8", want, 16), 8);
    for (int i = 0; i < 8; i++) {
        float w;
        memcpy(&w, &want[i], sizeof w);
        double got = ((const float *)nb_array_data(a))[i];
        NBT_NEAR(got, w, 4e-7 * fabs(w) + 1e-9);
    }
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_normal(k0, NB_DTYPE_F64, 1, (int64_t[]){4}, &a));
    NBT_EQ_I64(oracle_words("normal_f64_0_4", want, 16), 8);
    for (int i = 0; i < 4; i++) {
        uint64_t bits = ((uint64_t)want[2 * i + 1] << 32) | want[2 * i];
        double w;
        memcpy(&w, &bits, sizeof w);
        NBT_NEAR(((const double *)nb_array_data(a))[i], w, 1e-13 * fabs(w));
    }
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_truncated_normal(k42, NB_DTYPE_F64, -2, 1, 1, (int64_t[]){6}, &a));
    NBT_EQ_I64(oracle_words("truncated_normal_f64_42_m2_1_6", want, 16), 12);
    for (int i = 0; i < 6; i++) {
        uint64_t bits = ((uint64_t)want[2 * i + 1] << 32) | want[2 * i];
        double w, got = ((const double *)nb_array_data(a))[i];
        memcpy(&w, &bits, sizeof w);
        NBT_NEAR(got, w, 1e-12 * fabs(w) + 1e-15);
        NBT_TRUE(got > -2 && got < 1);
    }
    nb_array_destroy(a);
    const struct {
        nb_array *key;
        int64_t n;
        const char *name;
    } perms[] = {{k42, 10, "permutation_42_10"}, {k0, 37, "permutation_0_37"}};
    for (int c = 0; c < 2; c++) {
        NBT_OK(ctx, nb_random_permutation(perms[c].key, perms[c].n, &a));
        uint32_t pw[64];
        NBT_EQ_I64(oracle_words(perms[c].name, pw, 64), perms[c].n);
        for (int64_t i = 0; i < perms[c].n; i++) {
            NBT_EQ_I64(((const int64_t *)nb_array_data(a))[i], (int64_t)pw[i]);
        }
        nb_array_destroy(a);
    }
    nb_array_destroy(k42);
    nb_array_destroy(k0);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- truncated normal: JAX's bits, and the far tails -------------------------------- */

/* The bit pattern of element i of a (f32 or f64) as an unsigned 64-bit number. */
static uint64_t elem_bits(const nb_array *a, int64_t i) {
    if (nb_array_dtype(a) == NB_DTYPE_F32) {
        uint32_t w;
        memcpy(&w, (const float *)nb_array_data(a) + i, sizeof w);
        return w;
    }
    uint64_t w;
    memcpy(&w, (const double *)nb_array_data(a) + i, sizeof w);
    return w;
}

/* The oracle line "libm <fn> x0..x7 y0..y7": does this C library give the same y? */
static bool libm_matches(const char *line, double (*fn)(double)) {
    const char *p = line;
    uint64_t v[16];
    for (int i = 0; i < 16; i++) {
        char *end = NULL;
        v[i] = strtoull(p, &end, 16);
        if (end == p) {
            fail_msg("short libm line: %s", line);
        }
        p = end;
    }
    bool same = true;
    for (int i = 0; i < 8; i++) {
        double x, y;
        memcpy(&x, &v[i], sizeof x);
        y = fn(x);
        uint64_t yb;
        memcpy(&yb, &y, sizeof yb);
        same = same && yb == v[8 + i];
    }
    return same;
}

/* jax.random.truncated_normal's own values (tests/core/oracle/jax_truncated_normal.txt, made
 * by gen_truncated_normal.py beside it), f32 and f64, for bounds where nabla uses JAX's
 * inverse-CDF form: bit for bit. f64 runs through the C library's erf and log, as XLA's CPU
 * backend does: where this C library gives other values than the oracle's (its "libm" lines),
 * f64 is compared to 1e-6 relative instead, and the test says so. */
static void test_truncated_normal_jax_oracle(void **state) {
    (void)state;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(NULL, &ctx));
    FILE *f = fopen(NBT_ORACLE_DIR "/jax_truncated_normal.txt", "r");
    if (f == NULL) {
        fail_msg("cannot open %s/jax_truncated_normal.txt", NBT_ORACLE_DIR);
    }
    static char line[1 << 16];
    bool libm_same = true;
    int64_t n_vals[2] = {0, 0}, n_exact[2] = {0, 0};
    int n_cases = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "libm erf ", 9) == 0) {
            libm_same = libm_same && libm_matches(line + 9, erf);
        } else if (strncmp(line, "libm log ", 9) == 0) {
            libm_same = libm_same && libm_matches(line + 9, log);
        }
        if (strncmp(line, "tn ", 3) != 0) {
            continue;
        }
        char dts[8];
        unsigned long long seed = 0;
        char los[64], his[64];
        long long rows = 0, cols = 0;
        int used = 0;
        if (sscanf(line, "tn %7s %llu %63s %63s %lld %lld %n", dts, &seed, los, his, &rows, &cols,
                   &used) != 6) {
            fail_msg("bad oracle line: %.80s", line);
        }
        bool f64 = strcmp(dts, "f64") == 0;
        double lo = strtod(los, NULL), hi = strtod(his, NULL);
        nb_array *key = NULL, *a = NULL;
        NBT_OK(ctx, nb_random_key(ctx, seed, &key));
        int64_t shape[2] = {rows, cols};
        NBT_OK(ctx, nb_random_truncated_normal(key, f64 ? NB_DTYPE_F64 : NB_DTYPE_F32, lo, hi,
                                               cols ? 2 : 1, shape, &a));
        const char *p = line + used;
        for (int64_t i = 0; i < nb_array_size(a); i++) {
            char *end = NULL;
            uint64_t want = strtoull(p, &end, 16), got = elem_bits(a, i);
            if (end == p) {
                fail_msg("%s (%g, %g) seed %llu: the oracle has %lld values, nabla %lld", dts, lo,
                         hi, seed, (long long)i, (long long)nb_array_size(a));
            }
            p = end;
            n_vals[f64]++;
            if (got == want) {
                n_exact[f64]++;
                continue;
            }
            double g, w;
            if (f64) {
                memcpy(&g, &got, sizeof g);
                memcpy(&w, &want, sizeof w);
            } else {
                float gf, wf;
                uint32_t g32 = (uint32_t)got, w32 = (uint32_t)want;
                memcpy(&gf, &g32, sizeof gf);
                memcpy(&wf, &w32, sizeof wf);
                g = gf;
                w = wf;
            }
            if (!f64 || libm_same || !(fabs(g - w) <= 1e-6 * fabs(w))) {
                fail_msg("%s (%g, %g) seed %llu, element %lld: nabla %.17g (%llx), JAX %.17g "
                         "(%llx)",
                         dts, lo, hi, seed, (long long)i, g, (unsigned long long)got, w,
                         (unsigned long long)want);
            }
        }
        NBT_TRUE(strspn(p, " \n") == strlen(p));
        n_cases++;
        nb_array_destroy(a);
        nb_array_destroy(key);
    }
    fclose(f);
    printf("truncated normal: %d cases; f32 %lld of %lld values bit for bit, f64 %lld of %lld%s\n",
           n_cases, (long long)n_exact[0], (long long)n_vals[0], (long long)n_exact[1],
           (long long)n_vals[1],
           libm_same ? "" : " (this C library's erf/log differ from the oracle's: f64 to 1e-6)");
    NBT_TRUE(n_cases >= 40);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Mean and variance of the standard normal truncated to (a, b), one side of 0, in double:
 * for finite b by Simpson's rule on the density relative to its value at a (exp(-a t - t^2/2)
 * for x = a + t), for b = inf from Mills' ratio R(a) = Q(a) / phi(a) (the mean is 1 / R(a)),
 * by erfc, or by its continued fraction 1 / (a + 1 / (a + 2 / (a + ...))) where erfc
 * underflows. */
static void tn_moments(double a, double b, double *mean, double *var) {
    if (b <= 0) { /* by symmetry */
        tn_moments(-b, -a, mean, var);
        *mean = -*mean;
        return;
    }
    if (isinf(b)) {
        double r = exp(-0.5 * a * a) / (1.2533141373155003 * erfc(a / 1.4142135623730951));
        double dr = r - a; /* mean - a */
        if (a > 30) {
            double t = a;
            for (int k = 60; k >= 2; k--) {
                t = a + k / t;
            }
            dr = 1.0 / t; /* the fraction's tail, so that var keeps its digits */
            r = a + dr;
        }
        *mean = r; /* 1 / R(a) */
        *var = 1.0 - r * dr;
        return;
    }
    const int n = 200000;
    double w = b - a, h = w / n, s0 = 0.0, s1 = 0.0, s2 = 0.0;
    for (int i = 0; i <= n; i++) {
        double t = i * h, g = exp(-a * t - 0.5 * t * t) * (i == 0 || i == n ? 1 : i % 2 ? 4 : 2);
        s0 += g;
        s1 += g * t;
        s2 += g * t * t;
    }
    double mt = s1 / s0;
    *mean = a + mt;
    *var = s2 / s0 - mt * mt;
}

/* Bounds far in a tail, where the inverse-CDF form loses in the working precision (JAX gives
 * a few distinct values or the clip bound there): every value finite and strictly inside the
 * bounds, mean and variance those of the truncated normal. */
static void test_truncated_normal_tails(void **state) {
    (void)state;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(NULL, &ctx));
    const double inf = INFINITY;
    const double bounds[][2] = {
        {5, 6},        {7, 8},      {8, 9},     {9, 10},       {20, 21},     {-8, -7},
        {-10, -9},     {-inf, -30}, {30, inf},  {3, 3 + 1e-6}, {4, 5},       {5.5, 6},
        {-6, -5},      {1e4, inf},  {-inf, -8}, {8, inf},      {100, 100.5}, {0.5, 0.5 + 1e-5},
        {-40, -39.99}, {6.5, 6.6},
    };
    const int64_t n = 100000;
    nb_array *key = NULL;
    NBT_OK(ctx, nb_random_key(ctx, 11, &key));
    for (int d = 0; d < 2; d++) {
        nb_dtype dt = d ? NB_DTYPE_F64 : NB_DTYPE_F32;
        for (size_t c = 0; c < sizeof bounds / sizeof bounds[0]; c++) {
            double a = bounds[c][0], b = bounds[c][1];
            if (!d) { /* the bounds as the dtype has them */
                a = (float)a;
                b = (float)b;
            }
            nb_array *x = NULL;
            NBT_OK(ctx, nb_random_truncated_normal(key, dt, bounds[c][0], bounds[c][1], 1, &n, &x));
            const double *x64 = nb_array_data(x);
            const float *x32 = nb_array_data(x);
            double sum = 0.0;
            for (int64_t i = 0; i < n; i++) {
                double v = d ? x64[i] : x32[i];
                if (!(v > a && v < b)) {
                    fail_msg("%s (%.9g, %.9g): element %lld is %.17g, not strictly inside",
                             nb_dtype_name(dt), bounds[c][0], bounds[c][1], (long long)i, v);
                }
                sum += v;
            }
            double mean = sum / (double)n, var = 0.0, m, s2;
            for (int64_t i = 0; i < n; i++) {
                double v = (d ? x64[i] : x32[i]) - mean;
                var += v * v / (double)n;
            }
            tn_moments(a, b, &m, &s2);
            /* five standard errors, plus the dtype's resolution where the interval is narrow */
            double eps = d ? 0x1p-52 : 0x1p-23,
                   tol = 5.0 * sqrt(s2 / (double)n) + 4 * eps * fabs(m);
            printf("%s (%.9g, %.9g): mean %.9g, analytic %.9g; sd %.4g, analytic %.4g\n",
                   nb_dtype_name(dt), bounds[c][0], bounds[c][1], mean, m, sqrt(var), sqrt(s2));
            if (!(fabs(mean - m) <= tol)) {
                fail_msg("%s (%.9g, %.9g): mean %.12g, the truncated normal's is %.12g (tol %.3g)",
                         nb_dtype_name(dt), bounds[c][0], bounds[c][1], mean, m, tol);
            }
            /* the spread too, where the dtype resolves it */
            if (b - a > 1e-3 && sqrt(s2) > 100 * eps * fabs(m) && !(fabs(var - s2) <= 0.05 * s2)) {
                fail_msg("%s (%.9g, %.9g): variance %.6g, the truncated normal's is %.6g",
                         nb_dtype_name(dt), bounds[c][0], bounds[c][1], var, s2);
            }
            nb_array_destroy(x);
        }
    }
    nb_array_destroy(key);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Bad keys, counts, dtypes and bounds: an error status, a message naming the call and the
 * fix, *out NULL, and nothing leaked. */
static void test_random_misuse(void **state) {
    (void)state;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(NULL, &ctx));
    nb_array *bad = NULL, *k = NULL, *out = (nb_array *)&out;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, &bad));
    NBT_OK(ctx, nb_random_key(ctx, 3, &k));
    NBT_EQ_I64(nb_random_split(bad, 2, &out), NB_ERR_SHAPE);
    NBT_TRUE(out == NULL);
    NBT_TRUE(strstr(nb_ctx_errmsg(ctx), "nb_random_split: a key is an i32[2] array, got "
                                        "f32[2]") != NULL);
    NBT_EQ_I64(nb_random_split(k, 0, &out), NB_ERR_INVALID);
    NBT_EQ_I64(nb_random_uniform(k, NB_DTYPE_I32, 0, NULL, 0, 1, &out), NB_ERR_INVALID);
    NBT_EQ_I64(nb_random_uniform(k, NB_DTYPE_F32, 0, NULL, 1, 1, &out), NB_ERR_INVALID);
    NBT_TRUE(strstr(nb_ctx_errmsg(ctx), "lo < hi") != NULL);
    NBT_EQ_I64(nb_random_bits(k, 1, (int64_t[]){-1}, &out), NB_ERR_SHAPE);
    NBT_TRUE(out == NULL);
    NBT_EQ_I64(nb_random_fold_in(NULL, 1, &out), NB_ERR_MISUSE);
    NBT_EQ_I64(nb_random_fold_in(k, 1, NULL), NB_ERR_MISUSE);
    NBT_EQ_I64(nb_random_key(NULL, 1, &out), NB_ERR_MISUSE);
    NBT_EQ_I64(nb_random_bernoulli(k, 1.5, 0, NULL, &out), NB_ERR_INVALID);
    NBT_TRUE(strstr(nb_ctx_errmsg(ctx), "a probability is in [0, 1]") != NULL);
    NBT_EQ_I64(nb_random_normal(k, NB_DTYPE_I64, 0, NULL, &out), NB_ERR_INVALID);
    NBT_EQ_I64(nb_random_permutation(k, -1, &out), NB_ERR_INVALID);
    NBT_EQ_I64(nb_random_truncated_normal(k, NB_DTYPE_F32, 1, 1, 0, NULL, &out), NB_ERR_INVALID);
    /* no value of the dtype strictly between the bounds */
    NBT_EQ_I64(nb_random_truncated_normal(k, NB_DTYPE_F32, 1, 1 + 1e-9, 0, NULL, &out),
               NB_ERR_INVALID);
    NBT_TRUE(strstr(nb_ctx_errmsg(ctx), "no f32 value lies strictly between") != NULL);
    NBT_EQ_I64(nb_random_truncated_normal(k, NB_DTYPE_F64, 1, nextafter(1, 2), 0, NULL, &out),
               NB_ERR_INVALID);
    NBT_EQ_I64(nb_random_truncated_normal(k, NB_DTYPE_F64, NAN, 1, 0, NULL, &out), NB_ERR_INVALID);
    NBT_TRUE(out == NULL);
    nb_array_destroy(k);
    nb_array_destroy(bad);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threefry_known_answers),
        cmocka_unit_test(test_jax_oracle),
        cmocka_unit_test(test_truncated_normal_jax_oracle),
        cmocka_unit_test(test_truncated_normal_tails),
        cmocka_unit_test(test_random_misuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
