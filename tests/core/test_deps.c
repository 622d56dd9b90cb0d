/*
 * test_deps.c -- the third-party libraries are found, linked and give right answers.
 *
 * Calls BLIS (the typed API, bli_dgemm, with explicit row and column strides) and SLEEF
 * (the scalar entry points and the SSE2-width vector ones, which every x86-64 CPU has and
 * which dispatch at run time) directly, and compares them with plain loops and libm. A
 * failure here means the build picked up a broken or wrong library, not that nabla is
 * wrong.
 */
#include "nbtest.h"

#include <blis.h>
#include <sleef.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Distance in units in the last place between two finite doubles of any sign. */
static int64_t deps_ulp_diff_f64(double a, double b) {
    int64_t ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    /* Map the sign-magnitude bit patterns onto a monotonic integer line. */
    ia = ia < 0 ? INT64_MIN - ia : ia;
    ib = ib < 0 ? INT64_MIN - ib : ib;
    return ia > ib ? ia - ib : ib - ia;
}

static int64_t deps_ulp_diff_f32(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    int64_t la = ia < 0 ? (int64_t)INT32_MIN - ia : ia;
    int64_t lb = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
    return la > lb ? la - lb : lb - la;
}

/* SLEEF's u10 functions are within 1.0 ulp of the exact result and glibc's within about
 * 0.5, so two correct results can be up to 2 ulp apart (a float result against the
 * double result rounded to float: the same). */
#define DEPS_MAX_ULP 2

#define DEPS_ULP_CHECK(kind, got, want, x)                                                         \
    do {                                                                                           \
        int64_t deps_d_ = deps_ulp_diff_##kind((got), (want));                                     \
        if (deps_d_ > DEPS_MAX_ULP) {                                                              \
            fail_msg("%s(%.17g): got %.17g, libm %.17g (%lld ulp apart)", #got, (double)(x),       \
                     (double)(got), (double)(want), (long long)deps_d_);                           \
        }                                                                                          \
    } while (0)

static const double deps_exp_args[] = {
    -700.0, -20.5, -3.25, -1.0, -1e-9, 0.0, 1e-300, 0.5, 1.0, 2.302585092994046, 10.0, 88.7, 709.0};
static const double deps_sin_args[] = {-1e5, -10.0, -3.141592653589793, -1.5, -1e-12, 0.0,
                                       0.25, 1.0,   1.5707963267948966, 3.0,  100.0,  12345.678};
#define DEPS_N(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- BLIS ------------------------------------------------------------------------------ */

static void test_blis_version(void **state) {
    (void)state;
    const char *v = bli_info_get_version_str();
    NBT_TRUE(v != NULL && v[0] != '\0');
    print_message("BLIS %s\n", v);
}

/* C = alpha * A @ B + beta * C with A 3x4 row-major, B 4x2 column-major and C 3x2 with a
 * padded row stride, so that both stride kinds and a non-contiguous output are used. All
 * values are small integers or halves, so the result is exact in any summation order. */
static void test_blis_dgemm_strided(void **state) {
    (void)state;
    enum { M = 3, K = 4, N = 2, LDC = 5 };
    double a[M * K], b[K * N], c[M * LDC], want[M][N];
    for (int i = 0; i < M; i++) {
        for (int k = 0; k < K; k++) {
            a[i * K + k] = (double)(i * K + k) - 5.0; /* row-major: rs = K, cs = 1 */
        }
    }
    for (int k = 0; k < K; k++) {
        for (int j = 0; j < N; j++) {
            b[k + j * K] = 0.5 * (double)(k - 2 * j); /* column-major: rs = 1, cs = K */
        }
    }
    for (int i = 0; i < M * LDC; i++) {
        c[i] = 100.0 + (double)i; /* padding columns must stay untouched */
    }
    double alpha = 2.0, beta = 0.5;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++) {
                acc += a[i * K + k] * b[k + j * K];
            }
            want[i][j] = alpha * acc + beta * c[i * LDC + j];
        }
    }

    bli_dgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, M, N, K, &alpha, a, K, 1, b, 1, K, &beta, c,
              LDC, 1);

    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            NBT_EQ_F64(c[i * LDC + j], want[i][j]);
        }
        for (int j = N; j < LDC; j++) {
            NBT_EQ_F64(c[i * LDC + j], 100.0 + (double)(i * LDC + j));
        }
    }
}

/* ---- SLEEF ----------------------------------------------------------------------------- */

static void test_sleef_scalar(void **state) {
    (void)state;
    for (int i = 0; i < DEPS_N(deps_exp_args); i++) {
        double x = deps_exp_args[i];
        DEPS_ULP_CHECK(f64, Sleef_exp_u10(x), exp(x), x);
    }
    for (int i = 0; i < DEPS_N(deps_sin_args); i++) {
        double x = deps_sin_args[i];
        DEPS_ULP_CHECK(f64, Sleef_sin_u10(x), sin(x), x);
    }
}

#if defined(__SSE2__)
static void test_sleef_vector(void **state) {
    (void)state;
    for (int i = 0; i + 1 < DEPS_N(deps_exp_args); i += 2) {
        double out[2];
        _mm_storeu_pd(out, Sleef_expd2_u10(_mm_loadu_pd(&deps_exp_args[i])));
        for (int l = 0; l < 2; l++) {
            double x = deps_exp_args[i + l];
            DEPS_ULP_CHECK(f64, out[l], exp(x), x);
        }
    }
    for (int i = 0; i + 1 < DEPS_N(deps_sin_args); i += 2) {
        double out[2];
        _mm_storeu_pd(out, Sleef_sind2_u10(_mm_loadu_pd(&deps_sin_args[i])));
        for (int l = 0; l < 2; l++) {
            double x = deps_sin_args[i + l];
            DEPS_ULP_CHECK(f64, out[l], sin(x), x);
        }
    }
    /* f32, the dtype nabla computes in most: against the double result rounded. */
    static const float fx[8] = {-87.0f, -4.5f, -1.0f, 0.0f, 0.125f, 1.0f, 10.0f, 88.0f};
    for (int i = 0; i < 8; i += 4) {
        float out[4];
        _mm_storeu_ps(out, Sleef_expf4_u10(_mm_loadu_ps(&fx[i])));
        for (int l = 0; l < 4; l++) {
            float x = fx[i + l];
            DEPS_ULP_CHECK(f32, out[l], (float)exp((double)x), x);
        }
    }
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blis_version),
        cmocka_unit_test(test_blis_dgemm_strided),
        cmocka_unit_test(test_sleef_scalar),
#if defined(__SSE2__)
        cmocka_unit_test(test_sleef_vector),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
