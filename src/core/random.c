/*
 * random.c -- Threefry-2x32 (20 rounds) keys and the streams made from them, as jax.random
 * with jax_threefry_partitionable (see include/nabla/random.h). The samplers work on raw
 * buffers (random_internal.h) so that the eager calls here and the kernels of the traced
 * ones (src/ad/op_random.c) run the same code. The truncated normal reproduces, operation
 * for operation, what XLA's CPU backend computes for jax.random.truncated_normal (its erf,
 * log1p and erf_inv), and samples far tails, where that loses, by rejection.
 */
#include "core/internal.h"
#include "core/random_internal.h"

#include <math.h>
#include <nabla/random.h>
#include <stdio.h>
#include <string.h>

static uint32_t nbi_rotl32(uint32_t x, int r) {
    return (x << r) | (x >> (32 - r));
}

/* Threefry-2x32, 20 rounds: counter (x0, x1) under key (k0, k1). The key schedule adds
 * k0 ^ k1 ^ 0x1BD11BDA as a third word and injects the key every 4 rounds, with the
 * injection count added to the second word; rotations are Threefry's 2x32 constants. */
void nbi_threefry2x32(uint32_t k0, uint32_t k1, uint32_t x0, uint32_t x1, uint32_t *y0,
                      uint32_t *y1) {
    static const int rot[8] = {13, 15, 26, 6, 17, 29, 16, 24};
    uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
    x0 += ks[0];
    x1 += ks[1];
    for (uint32_t inj = 1; inj <= 5; inj++) {
        for (int r = 0; r < 4; r++) {
            x0 += x1;
            x1 = nbi_rotl32(x1, rot[((inj - 1) % 2) * 4 + r]);
            x1 ^= x0;
        }
        x0 += ks[inj % 3];
        x1 += ks[(inj + 1) % 3] + inj;
    }
    *y0 = x0;
    *y1 = x1;
}

/* ---- the samplers on raw buffers ---------------------------------------------------- */

void nbi_rng_split(uint32_t k0, uint32_t k1, int64_t n, int32_t *out) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t y0, y1;
        nbi_threefry2x32(k0, k1, 0, (uint32_t)i, &y0, &y1);
        out[2 * i] = (int32_t)y0;
        out[2 * i + 1] = (int32_t)y1;
    }
}

void nbi_rng_fold_in(uint32_t k0, uint32_t k1, uint32_t data, int32_t *out) {
    uint32_t y0, y1;
    nbi_threefry2x32(k0, k1, 0, data, &y0, &y1);
    out[0] = (int32_t)y0;
    out[1] = (int32_t)y1;
}

/* Element i's counter is i as a 64-bit number split into (high, low) words. */
static void nbi_counter_words(uint32_t k0, uint32_t k1, int64_t i, uint32_t *y0, uint32_t *y1) {
    nbi_threefry2x32(k0, k1, (uint32_t)((uint64_t)i >> 32), (uint32_t)i, y0, y1);
}

/* Element i of the uniform stream in [lo, hi) (span = hi - lo, in the dtype). */
static float nbi_uniform_f32(uint32_t k0, uint32_t k1, int64_t i, float lo, float span) {
    uint32_t y0, y1;
    nbi_counter_words(k0, k1, i, &y0, &y1);
    uint32_t b = ((y0 ^ y1) >> 9) | 0x3F800000u; /* [1, 2) */
    float f;
    memcpy(&f, &b, sizeof f);
    float v = fmaf(f - 1.0f, span, lo); /* XLA fuses the multiply-add */
    return v > lo ? v : lo;
}

static double nbi_uniform_f64(uint32_t k0, uint32_t k1, int64_t i, double lo, double span) {
    uint32_t y0, y1;
    nbi_counter_words(k0, k1, i, &y0, &y1);
    uint64_t b = ((((uint64_t)y0 << 32) | y1) >> 12) | 0x3FF0000000000000u;
    double f;
    memcpy(&f, &b, sizeof f);
    double v = fma(f - 1.0, span, lo);
    return v > lo ? v : lo;
}

/* erf^-1(u) for -1 < u < 1: M. Giles's single-precision approximation ("Approximating the
 * erfinv function", GPU Computing Gems, 2011) as a start, then two Newton steps on
 * erf(x) = u in double, which bring it to double accuracy. */
static double nbi_erfinv(double u) {
    double w = -log((1.0 - u) * (1.0 + u)), p;
    if (w < 5.0) {
        w -= 2.5;
        p = 2.81022636e-08;
        p = 3.43273939e-07 + p * w;
        p = -3.5233877e-06 + p * w;
        p = -4.39150654e-06 + p * w;
        p = 0.00021858087 + p * w;
        p = -0.00125372503 + p * w;
        p = -0.00417768164 + p * w;
        p = 0.246640727 + p * w;
        p = 1.50140941 + p * w;
    } else {
        w = sqrt(w) - 3.0;
        p = -0.000200214257;
        p = 0.000100950558 + p * w;
        p = 0.00134934322 + p * w;
        p = -0.00367342844 + p * w;
        p = 0.00573950773 + p * w;
        p = -0.0076224613 + p * w;
        p = 0.00943887047 + p * w;
        p = 1.00167406 + p * w;
        p = 2.83297682 + p * w;
    }
    double x = p * u;
    for (int it = 0; it < 2; it++) {
        x -= (erf(x) - u) / (1.1283791670955126 * exp(-x * x)); /* 2/sqrt(pi) */
    }
    return x;
}

/* ---- truncated normal, JAX's way ----------------------------------------------------
 * jax.random.truncated_normal(key, lower, upper) computes, in the dtype,
 *     ea = erf(lower * (1/sqrt2)), eb = erf(upper * (1/sqrt2)),
 *     u = max(ea, uniform bits * (eb - ea) + ea), x = sqrt2 * erf_inv(u),
 *     clipped to [nextafter(lower, +inf), nextafter(upper, -inf)],
 * and XLA's CPU backend compiles erf, erf_inv and its log1p into the polynomials below (for
 * f64: the C library's erf and log for two of the steps), with every multiply-add whose
 * product has no other use fused into one FMA (LLVM's contraction on an FMA machine). These
 * are those computations, operation for operation, so that nabla gives JAX's bits. */

/* XLA's f32 erf: a rational approximation on [-3.74, 3.74], +-1 outside. */
static float nbi_xla_erf_f32(float x) {
    const float clamp = 0x1.df38d0p+1f;
    if (fabsf(x) >= clamp) {
        return copysignf(1.0f, x);
    }
    float c = x, c2 = c * c; /* (XLA clamps c to [-clamp, clamp]: a no-op here) */
    float p = fmaf(c2, 0x1.e05aa2p-13f, 0x1.bebb44p-9f);
    p = fmaf(p, c2, 0x1.a16dd6p-5f);
    p = fmaf(p, c2, 0x1.7b4e80p-3f);
    p = fmaf(p, c2, 0x1.20dd74p+0f);
    float q = fmaf(c2, -0x1.fa720cp-24f, 0x1.8b11bep-16f);
    q = fmaf(q, c2, 0x1.0ada50p-10f);
    q = fmaf(q, c2, 0x1.cd0fa8p-7f);
    q = fmaf(q, c2, 0x1.c69842p-4f);
    q = fmaf(q, c2, 0x1.fd6894p-2f);
    q = fmaf(q, c2, 1.0f);
    return c * p / q;
}

static float nbi_f32_of(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* XLA's f32 log for x in [0, 1] (Cephes' logf as Eigen writes it): x = m 2^e with m in
 * [sqrt(1/2), sqrt 2), a polynomial in m - 1. */
static float nbi_xla_log_f32(float x) {
    if (x == 0.0f) {
        return -INFINITY;
    }
    if (!(x > 0.0f)) {
        return NAN;
    }
    if (x == INFINITY) {
        return INFINITY;
    }
    float xm = x > 0x1p-126f ? x : 0x1p-126f;
    uint32_t b;
    memcpy(&b, &xm, sizeof b);
    float e = (float)((int32_t)(b >> 23) - 127) + 1.0f;
    float m = nbi_f32_of((b & 0x807FFFFFu) | 0x3F000000u); /* in [0.5, 1) */
    bool low = m < 0x1.6a09e6p-1f;
    float v = (m - 1.0f) + (low ? m : 0.0f);
    e -= low ? 1.0f : 0.0f;
    float v2 = v * v, v3 = v2 * v;
    float y = fmaf(fmaf(v, 0x1.204376p-4f, -0x1.d7a370p-4f), v, 0x1.de4a34p-4f);
    float y1 = fmaf(fmaf(v, -0x1.fcba9ep-4f, 0x1.23d37ep-3f), v, -0x1.555ca0p-3f);
    float y2 = fmaf(fmaf(v, 0x1.999d58p-3f, -0x1.fffff8p-3f), v, 0x1.555554p-2f);
    y = fmaf(y, v3, y1);
    y = fmaf(y, v3, y2);
    float r = fmaf(y, v3, e * -0x1.bd0106p-13f);
    float s = fmaf(-v2, 0.5f, v) + r;
    return fmaf(e, 0x1.630000p-1f, s);
}

/* XLA's f32 log1p(t): a rational approximation for |t| < sqrt2 - 1, else log(1 + t). */
static float nbi_xla_log1p_f32(float t) {
    if (!(fabsf(t) < 0x1.a8279ap-2f)) {
        return nbi_xla_log_f32(t + 1.0f);
    }
    float t2 = t * t, t0 = t * 0.0f;
    float q = t0 + 1.0f;
    q = fmaf(q, t, 0x1.e2035ap+3f);
    q = fmaf(q, t, 0x1.4c30b6p+6f);
    q = fmaf(q, t, 0x1.bb865ap+7f);
    q = fmaf(q, t, 0x1.351946p+8f);
    q = fmaf(q, t, 0x1.b0db14p+7f);
    q = fmaf(q, t, 0x1.e0f304p+5f);
    float p = t0 + 4.527e-05f;
    p = fmaf(p, t, 0x1.fe818ap-2f);
    p = fmaf(p, t, 0x1.a509f4p+2f);
    p = fmaf(p, t, 0x1.de9738p+4f);
    p = fmaf(p, t, 0x1.e798ecp+5f);
    p = fmaf(p, t, 0x1.c8e75ap+5f);
    p = fmaf(p, t, 0x1.40a202p+4f);
    float r = p / q;
    return t + fmaf(-t2, 0.5f, t * t2 * r);
}

/* XLA's f32 erf_inv: M. Giles's single-precision approximation ("Approximating the erfinv
 * function", GPU Computing Gems, 2011) in w = -log1p(-u^2). */
static float nbi_xla_erfinv_f32(float u) {
    static const float lo[9] = {0x1.e2cb10p-26f,  0x1.70966cp-22f, -0x1.d8e6aep-19f,
                                -0x1.26b582p-18f, 0x1.ca65b6p-13f, -0x1.48a810p-10f,
                                -0x1.11c9dep-8f,  0x1.f91ec6p-3f,  0x1.805c5ep+0f};
    static const float hi[9] = {-0x1.a3e136p-13f, 0x1.a76ad6p-14f, 0x1.61b8e4p-10f,
                                -0x1.e17bcep-9f,  0x1.7824f6p-8f,  -0x1.f38baep-8f,
                                0x1.354afcp-7f,   0x1.006db6p+0f,  0x1.6a9efcp+1f};
    float l = nbi_xla_log1p_f32(-u * u);
    bool small = l > -5.0f; /* w = -l < 5 */
    const float *c = small ? lo : hi;
    float z = small ? -2.5f - l : sqrtf(-l) - 3.0f;
    float p = fmaf(c[0], z, c[1]);
    for (int i = 2; i < 9; i++) {
        p = fmaf(p, z, c[i]);
    }
    return (fabsf(u) == 1.0f ? INFINITY : p) * u;
}

/* XLA's f64 log1p(t): a rational approximation for |t| < sqrt2 - 1, else the C library's
 * log(1 + t). */
static double nbi_xla_log1p_f64(double t) {
    if (!(fabs(t) < 0x1.a827999fcef32p-2)) {
        return log(t + 1.0);
    }
    double t2 = t * t, t0 = t * 0.0;
    double q = t0 + 1.0;
    q = fma(q, t, 0x1.e20359e903e37p+3);
    q = fma(q, t, 0x1.4c30b52213498p+6);
    q = fma(q, t, 0x1.bb86590fcfb56p+7);
    q = fma(q, t, 0x1.351945dc908a5p+8);
    q = fma(q, t, 0x1.b0db13e48e066p+7);
    q = fma(q, t, 0x1.e0f304466448ep+5);
    double p = t0 + 0x1.7bc0962b395cap-15;
    p = fma(p, t, 0x1.fe818a0fe1a83p-2);
    p = fma(p, t, 0x1.a509f46f4fa53p+2);
    p = fma(p, t, 0x1.de9738b8cb9c9p+4);
    p = fma(p, t, 0x1.e798eb86c3351p+5);
    p = fma(p, t, 0x1.c8e7597479a10p+5);
    p = fma(p, t, 0x1.40a202d99830ap+4);
    double r = p / q;
    return t + fma(-t2, 0.5, t * t2 * r);
}

/* XLA's f64 erf_inv: Giles's double-precision approximation, three ranges of w. */
static double nbi_xla_erfinv_f64(double u) {
    static const double w_lt_6_25[23] = {
        -0x1.135d2e746e627p-68, -0x1.8ddf93324d327p-63, 0x1.7b83eef0b7c9fp-60,
        0x1.9ba72cd589b91p-57,  -0x1.33689090a6b96p-53, 0x1.82e11898132e0p-56,
        0x1.de4acfd9e26bap-48,  -0x1.6d33eed66c487p-45, -0x1.6f2167040d8e2p-44,
        0x1.72a22c2d77e20p-39,  -0x1.c8859c4e5c0afp-37, -0x1.dc583d118a561p-35,
        0x1.20f47ccf46b3cp-30,  -0x1.1a9e38dc84d60p-28, -0x1.f36cd6d3d46a9p-26,
        0x1.c6b4f5d03b787p-22,  -0x1.6e8a5434ae8a2p-20, -0x1.d1d1f7b8736f6p-17,
        0x1.879c2a212f024p-13,  -0x1.845769484fca8p-11, -0x1.8b6c33114f909p-8,
        0x1.ebd80d9b13e28p-3,   0x1.a755e7c99ae86p+0};
    static const double w_lt_16[19] = {
        0x1.3040f87dbd932p-29, 0x1.85cbe52878635p-24,  -0x1.2777453dd3955p-22,
        0x1.395abcd554c6cp-26, 0x1.936388a3790adp-20,  -0x1.0d5db812b5083p-18,
        0x1.8860cd5d652f6p-19, 0x1.a29a0cacdfb23p-17,  -0x1.8cef1f80281f2p-15,
        0x1.1e684d0b9188ap-14, 0x1.932cd54c8a222p-16,  -0x1.7448a89ef8aa3p-12,
        0x1.f3cc55ad40c25p-11, -0x1.ba924132f38b1p-10, 0x1.468eeca533cf8p-9,
        -0x1.ebadabb891bbdp-9, 0x1.5ffcfe5b76afcp-8,   0x1.0158a6d641d39p+0,
        0x1.8abcc380d5a48p+1};
    static const double w_ge_16[17] = {
        -0x1.dcec3a7785389p-36, -0x1.18feec0e38727p-32, 0x1.9e6bf2dda45e3p-30,
        -0x1.0468fb24e2f5fp-28, 0x1.05ac6a8fba182p-27,  -0x1.0102e495fb9c0p-26,
        0x1.f4c20e1334af8p-26,  -0x1.22d220fdf9c3ep-24, 0x1.ebc8bb824cb54p-23,
        -0x1.0a8d40ea372ccp-20, 0x1.2fbd29d093d2bp-18,  -0x1.4a3497e1e0facp-16,
        0x1.3ebf4eb00938fp-14,  -0x1.c2f36a8fc5d53p-13, -0x1.22ea5df04047cp-13,
        0x1.02a30d1fba0dcp+0,   0x1.3664ddd1ad7fbp+2};
    double l = nbi_xla_log1p_f64(u * -u);
    const double *c;
    int n;
    double z;
    if (l > -6.25) {
        c = w_lt_6_25, n = 23, z = -3.125 - l;
    } else if (l > -16.0) {
        c = w_lt_16, n = 19, z = sqrt(-l) - 3.25;
    } else {
        c = w_ge_16, n = 17, z = sqrt(-l) - 5.0;
    }
    double p = fma(c[0], z, c[1]);
    for (int i = 2; i < n; i++) {
        p = fma(z, p, c[i]);
    }
    return (fabs(u) == 1.0 ? INFINITY : p) * u;
}

/* ---- truncated normal far in a tail ----------------------------------------------------
 * When the bounds are on one side of 0 and so far out that the probability mass between
 * them, eb - ea, spans fewer than NBI_TN_LEVELS units in the last place of the larger |erf|
 * (f32 from about 3.7 sigma on, f64 from about 7.3), the inverse CDF above resolves the
 * interval in a handful of values (or none: JAX then returns the clip bound). There nabla
 * samples by rejection instead, in double: C. P. Robert, "Simulation of truncated normal
 * variables", Statistics and Computing 5 (1995), for (a, b) with a >= 0 (b <= 0 by symmetry):
 * propose x = a + e with e exponential of rate lambda = (a + sqrt(a^2 + 4)) / 2, truncated
 * to [0, b - a], and accept with probability exp(-(x - lambda)^2 / 2) / M, M its largest
 * value on [a, b] (at least 76% of the proposals are accepted; the worst case is a = 0,
 * b = inf). Attempt j of element i draws its two uniforms from counters i and i | 2^63 under
 * the key threefry2x32(key, (NBI_TN_TAG, j)), so element i depends only on the key and i
 * (the high counter word of an element is below 2^31: counters never collide). */
#define NBI_TN_LEVELS 4096.0
#define NBI_TN_TAG 0x6e627463u /* "nbtc" */
#define NBI_TN_TRIES 64

/* A uniform double in [0, 1) from 53 bits of the block of counter (c0, c1) under key. */
static double nbi_u53(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1) {
    uint32_t y0, y1;
    nbi_threefry2x32(k0, k1, c0, c1, &y0, &y1);
    return (double)((((uint64_t)y0 << 32) | y1) >> 11) * 0x1p-53;
}

/* Element i of the standard normal truncated to (a, b), 0 <= a < b (b may be +inf). */
static double nbi_tn_tail(uint32_t k0, uint32_t k1, int64_t i, double a, double b) {
    double d = 2.0 / (a + hypot(a, 2.0)); /* lambda - a, in (0, 1] */
    double lambda = a + d, w = b - a;
    double mass = isinf(w) ? 1.0 : -expm1(-lambda * w); /* of the exponential on [0, w] */
    uint32_t c0 = (uint32_t)((uint64_t)i >> 32), c1 = (uint32_t)i;
    double e = 0.0;
    for (uint32_t j = 0; j < NBI_TN_TRIES; j++) {
        uint32_t t0, t1;
        nbi_threefry2x32(k0, k1, NBI_TN_TAG, j, &t0, &t1);
        double u = nbi_u53(t0, t1, c0, c1), v = nbi_u53(t0, t1, c0 | 0x80000000u, c1);
        e = -log1p(-u * mass) / lambda;
        e = e < w ? e : w;
        /* log of the acceptance probability: -(e - d)^2 / 2, over its largest value on
         * [0, w] (at e = d when d <= w, else at e = w) */
        double lp = d <= w ? -0.5 * (e - d) * (e - d) : -0.5 * (e - w) * (e + w - 2.0 * d);
        if (v < exp(lp)) {
            break;
        }
    } /* after NBI_TN_TRIES rejections (probability below 1e-39) the last proposal stands */
    return a + e;
}

/* Does the truncated normal on (lo, hi) take the tail sampler? span = eb - ea, gap = the
 * spacing of the dtype just below max(|ea|, |eb|). (Bounds on both sides of 0 never do: the
 * mass then spans at least 2^23 units.) */
static bool nbi_tn_use_tail(double lo, double hi, double span, double gap) {
    return (lo >= 0.0 || hi <= 0.0) && !(span >= NBI_TN_LEVELS * gap);
}

static void nbi_tn_fill_f32(double a, double b, uint32_t k0, uint32_t k1, float *o, int64_t first,
                            int64_t end) {
    float lo = (float)a, hi = (float)b;
    float ea = nbi_xla_erf_f32(lo * 0x1.6a09e6p-1f), eb = nbi_xla_erf_f32(hi * 0x1.6a09e6p-1f);
    float span = eb - ea, m = fmaxf(fabsf(ea), fabsf(eb));
    float clo = nextafterf(lo, INFINITY), chi = nextafterf(hi, -INFINITY);
    if (nbi_tn_use_tail(lo, hi, span, m - nextafterf(m, 0.0f))) {
        bool neg = hi <= 0.0f; /* the lower tail as the upper one, mirrored */
        double ta = neg ? -(double)hi : (double)lo, tb = neg ? -(double)lo : (double)hi;
        ta = ta > 0.0 ? ta : 0.0;
        for (int64_t i = first; i < end; i++) {
            double x = nbi_tn_tail(k0, k1, i, ta, tb);
            float v = (float)(neg ? -x : x);
            o[i] = v < clo ? clo : v > chi ? chi : v;
        }
        return;
    }
    for (int64_t i = first; i < end; i++) {
        float v = nbi_xla_erfinv_f32(nbi_uniform_f32(k0, k1, i, ea, span)) * 0x1.6a09e6p+0f;
        o[i] = v < clo ? clo : v > chi ? chi : v;
    }
}

static void nbi_tn_fill_f64(double lo, double hi, uint32_t k0, uint32_t k1, double *o,
                            int64_t first, int64_t end) {
    double ea = erf(lo * 0x1.6a09e667f3bccp-1), eb = erf(hi * 0x1.6a09e667f3bccp-1);
    double span = eb - ea, m = fmax(fabs(ea), fabs(eb));
    double clo = nextafter(lo, INFINITY), chi = nextafter(hi, -INFINITY);
    if (nbi_tn_use_tail(lo, hi, span, m - nextafter(m, 0.0))) {
        bool neg = hi <= 0.0;
        double ta = neg ? -hi : lo, tb = neg ? -lo : hi;
        ta = ta > 0.0 ? ta : 0.0;
        for (int64_t i = first; i < end; i++) {
            double x = nbi_tn_tail(k0, k1, i, ta, tb);
            double v = neg ? -x : x;
            o[i] = v < clo ? clo : v > chi ? chi : v;
        }
        return;
    }
    for (int64_t i = first; i < end; i++) {
        double v = nbi_xla_erfinv_f64(nbi_uniform_f64(k0, k1, i, ea, span)) * 0x1.6a09e667f3bcdp+0;
        o[i] = v < clo ? clo : v > chi ? chi : v;
    }
}

nb_dtype nbi_rng_dtype(nbi_rng_kind kind, nb_dtype dtype) {
    switch (kind) {
    case NBI_RNG_BITS:
        return NB_DTYPE_I32;
    case NBI_RNG_BERNOULLI:
        return NB_DTYPE_BOOL;
    default:
        return dtype;
    }
}

nb_status nbi_rng_check(nbi_rng_kind kind, nb_dtype dtype, double a, double b, char *msg,
                        size_t cap) {
    bool is_float =
        kind == NBI_RNG_UNIFORM || kind == NBI_RNG_NORMAL || kind == NBI_RNG_TRUNCATED_NORMAL;
    if (is_float && dtype != NB_DTYPE_F32 && dtype != NB_DTYPE_F64) {
        snprintf(msg, cap, "dtype %s; samples are f32 or f64 (NB_DTYPE_F32 or NB_DTYPE_F64)",
                 nb_dtype_name(dtype));
        return NB_ERR_INVALID;
    }
    if (kind == NBI_RNG_UNIFORM && (!isfinite(a) || !isfinite(b) || !(a < b))) {
        snprintf(msg, cap, "bounds [%g, %g) must be finite with lo < hi", a, b);
        return NB_ERR_INVALID;
    }
    if (kind == NBI_RNG_TRUNCATED_NORMAL && !(a < b)) {
        snprintf(msg, cap, "bounds [%g, %g]: lower must be below upper", a, b);
        return NB_ERR_INVALID;
    }
    if (kind == NBI_RNG_TRUNCATED_NORMAL &&
        (dtype == NB_DTYPE_F32 ? !(nextafterf((float)a, INFINITY) < (float)b)
                               : !(nextafter(a, INFINITY) < b))) {
        snprintf(msg, cap,
                 "bounds (%.9g, %.9g): no %s value lies strictly between them (widen the "
                 "interval, or sample in f64)",
                 a, b, nb_dtype_name(dtype));
        return NB_ERR_INVALID;
    }
    if (kind == NBI_RNG_BERNOULLI && !(a >= 0.0 && a <= 1.0)) {
        snprintf(msg, cap, "p is %g; a probability is in [0, 1]", a);
        return NB_ERR_INVALID;
    }
    return NB_OK;
}

void nbi_rng_fill(nbi_rng_kind kind, nb_dtype dtype, double a, double b, uint32_t k0, uint32_t k1,
                  void *out, int64_t first, int64_t n) {
    const double s2 = 1.4142135623730951;
    int64_t end = first + n;
    bool f32 = dtype == NB_DTYPE_F32;
    switch (kind) {
    case NBI_RNG_BITS: {
        int32_t *o = out;
        for (int64_t i = first; i < end; i++) {
            uint32_t y0, y1;
            nbi_counter_words(k0, k1, i, &y0, &y1);
            o[i] = (int32_t)(y0 ^ y1);
        }
        break;
    }
    case NBI_RNG_UNIFORM:
        if (f32) {
            float *o = out, lo = (float)a, span = (float)b - (float)a;
            for (int64_t i = first; i < end; i++) {
                o[i] = nbi_uniform_f32(k0, k1, i, lo, span);
            }
        } else {
            double *o = out;
            for (int64_t i = first; i < end; i++) {
                o[i] = nbi_uniform_f64(k0, k1, i, a, b - a);
            }
        }
        break;
    case NBI_RNG_NORMAL: /* u uniform in the open interval (-1, 1), as JAX */
        if (f32) {
            float *o = out, lo = nextafterf(-1.0f, 1.0f), span = 1.0f - lo;
            for (int64_t i = first; i < end; i++) {
                o[i] = (float)s2 * (float)nbi_erfinv(nbi_uniform_f32(k0, k1, i, lo, span));
            }
        } else {
            double *o = out, lo = nextafter(-1.0, 1.0), span = 1.0 - lo;
            for (int64_t i = first; i < end; i++) {
                o[i] = s2 * nbi_erfinv(nbi_uniform_f64(k0, k1, i, lo, span));
            }
        }
        break;
    case NBI_RNG_TRUNCATED_NORMAL:
        if (f32) {
            nbi_tn_fill_f32(a, b, k0, k1, out, first, end);
        } else {
            nbi_tn_fill_f64(a, b, k0, k1, out, first, end);
        }
        break;
    case NBI_RNG_BERNOULLI: {
        uint8_t *o = out;
        float fp = (float)a;
        for (int64_t i = first; i < end; i++) { /* uniform f32 in [0, 1) < p, as JAX */
            o[i] = nbi_uniform_f32(k0, k1, i, 0.0f, 1.0f) < fp;
        }
        break;
    }
    }
}

/* Sort idx[0..n) by key (ascending; equal keys keep their order): a merge sort through tmp. */
static void nbi_sort_by_key(uint32_t *key, int64_t *idx, uint32_t *tkey, int64_t *tidx, int64_t n) {
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t a = lo, b = mid, o = lo;
            while (a < mid || b < hi) {
                bool left = b >= hi || (a < mid && key[a] <= key[b]);
                tkey[o] = left ? key[a] : key[b];
                tidx[o++] = left ? idx[a++] : idx[b++];
            }
        }
        memcpy(key, tkey, (size_t)n * sizeof *key);
        memcpy(idx, tidx, (size_t)n * sizeof *idx);
    }
}

size_t nbi_rng_permutation_scratch(int64_t n) {
    return (size_t)n * (2 * sizeof(uint32_t) + sizeof(int64_t));
}

void nbi_rng_permutation(uint32_t k0, uint32_t k1, int64_t n, int64_t *idx, void *scratch) {
    if (n <= 0) {
        return;
    }
    int64_t *tidx = scratch;
    uint32_t *sk = (uint32_t *)(void *)(tidx + n), *tkey = sk + n;
    for (int64_t i = 0; i < n; i++) {
        idx[i] = i;
    }
    /* JAX's _shuffle: ceil(3 ln n / ln(2^32 - 1)) rounds, each splitting the key and
     * sorting by fresh 32-bit keys, enough rounds that ties leave the result uniform. */
    int rounds = (int)ceil(3.0 * log((double)(n > 1 ? n : 1)) / log(4294967295.0));
    for (int r = 0; r < rounds; r++) {
        uint32_t n0, n1, s0, s1;
        nbi_threefry2x32(k0, k1, 0, 0, &n0, &n1); /* split(key, 2): the next key, */
        nbi_threefry2x32(k0, k1, 0, 1, &s0, &s1); /* and the round's subkey */
        for (int64_t i = 0; i < n; i++) {
            uint32_t y0, y1;
            nbi_counter_words(s0, s1, i, &y0, &y1);
            sk[i] = y0 ^ y1;
        }
        nbi_sort_by_key(sk, idx, tkey, tidx, n);
        k0 = n0;
        k1 = n1;
    }
}

/* ---- the eager calls ---------------------------------------------------------------- */

/* The entry checks of an eager call on key: a live key (a destroyed one is reported on its
 * context), an out-parameter (NULL is reported on the key's context), then the key's two
 * words, or an error naming fn. */
static nb_status nbi_key_words(const nb_array *key, const char *fn, const void *out, uint32_t *k0,
                               uint32_t *k1) {
    nb_status st = nbi_check_handle(key, NBI_MAGIC_ARRAY, fn, "key");
    if (st != NB_OK) {
        return st;
    }
    if (out == NULL) {
        return nbi_err_null(key->hdr.ctx, fn, "out",
                            "pass the address of an nb_array * to receive the new array");
    }
    if (key->dtype != NB_DTYPE_I32 || key->rank != 1 || key->shape[0] != 2) {
        char sig[NBI_SIG_CAP];
        nbi_sig(sig, sizeof sig, key->dtype, key->rank, key->shape);
        return nbi_err(key->hdr.ctx, NB_ERR_SHAPE,
                       "%s: a key is an i32[2] array, got %s (make one with nb_random_key, or "
                       "take row i of nb_random_split's result with nb_array_index, or use "
                       "nb_random_split_keys)",
                       fn, sig);
    }
    const int32_t *w = key->data;
    *k0 = (uint32_t)w[0];
    *k1 = (uint32_t)w[1];
    return NB_OK;
}

static nb_status nbi_key_new(nb_ctx *ctx, const char *fn, const int32_t *words, nb_array **out) {
    int64_t two = 2;
    nb_status st = nbi_array_new(ctx, fn, NB_DTYPE_I32, 1, &two, out);
    if (st == NB_OK) {
        memcpy((*out)->data, words, 2 * sizeof(int32_t));
    }
    return st;
}

nb_status nb_random_key(nb_ctx *ctx, uint64_t seed, nb_array **out) {
    if (out != NULL) {
        *out = NULL;
    }
    if (ctx == NULL) {
        return NB_ERR_MISUSE; /* nowhere to say so */
    }
    if (out == NULL) {
        return nbi_err_null(ctx, "nb_random_key", "out",
                            "pass the address of an nb_array * to receive the key");
    }
    int32_t w[2] = {(int32_t)(uint32_t)(seed >> 32), (int32_t)(uint32_t)seed};
    return nbi_key_new(ctx, "nb_random_key", w, out);
}

nb_status nb_random_split(const nb_array *key, int64_t n, nb_array **out) {
    static const char fn[] = "nb_random_split";
    if (out != NULL) {
        *out = NULL;
    }
    uint32_t k0 = 0, k1 = 0;
    nb_status st = nbi_key_words(key, fn, out, &k0, &k1);
    if (st != NB_OK) {
        return st;
    }
    if (n < 1 || n > NBI_RNG_SPLIT_MAX) {
        return nbi_err(key->hdr.ctx, NB_ERR_INVALID, "%s: n is %lld; it must be between 1 and 2^32",
                       fn, (long long)n);
    }
    int64_t shape[2] = {n, 2};
    st = nbi_array_new(key->hdr.ctx, fn, NB_DTYPE_I32, 2, shape, out);
    if (st == NB_OK) {
        nbi_rng_split(k0, k1, n, (*out)->data);
    }
    return st;
}

nb_status nb_random_split_keys(const nb_array *key, int64_t n, nb_array **keys) {
    static const char fn[] = "nb_random_split_keys";
    for (int64_t i = 0; keys != NULL && i < n && i <= NBI_RNG_SPLIT_MAX; i++) {
        keys[i] = NULL;
    }
    uint32_t k0 = 0, k1 = 0;
    nb_status st = nbi_key_words(key, fn, keys, &k0, &k1);
    if (st != NB_OK) {
        return st;
    }
    if (n < 1 || n > NBI_RNG_SPLIT_MAX) {
        return nbi_err(key->hdr.ctx, NB_ERR_INVALID, "%s: n is %lld; it must be between 1 and 2^32",
                       fn, (long long)n);
    }
    nb_array *all = NULL;
    st = nbi_array_new(key->hdr.ctx, fn, NB_DTYPE_I32, 2, (int64_t[]){n, 2}, &all);
    if (st == NB_OK) {
        nbi_rng_split(k0, k1, n, all->data);
    }
    for (int64_t i = 0; st == NB_OK && i < n; i++) {
        st = nbi_array_row_view(all, fn, i, &keys[i]);
    }
    nb_array_destroy(all); /* the views keep the keys alive */
    for (int64_t i = 0; st != NB_OK && i < n; i++) {
        nb_array_destroy(keys[i]);
        keys[i] = NULL;
    }
    return st;
}

nb_status nb_random_fold_in(const nb_array *key, uint32_t data, nb_array **out) {
    static const char fn[] = "nb_random_fold_in";
    if (out != NULL) {
        *out = NULL;
    }
    uint32_t k0 = 0, k1 = 0;
    nb_status st = nbi_key_words(key, fn, out, &k0, &k1);
    if (st != NB_OK) {
        return st;
    }
    int32_t w[2];
    nbi_rng_fold_in(k0, k1, data, w);
    return nbi_key_new(key->hdr.ctx, fn, w, out);
}

/* The samplers of nbi_rng_fill: key words, parameter checks, the new array, the fill. */
static nb_status nbi_sample(const nb_array *key, const char *fn, nbi_rng_kind kind, nb_dtype dtype,
                            double a, double b, int rank, const int64_t *shape, nb_array **out) {
    if (out != NULL) {
        *out = NULL;
    }
    uint32_t k0 = 0, k1 = 0;
    nb_status st = nbi_key_words(key, fn, out, &k0, &k1);
    if (st != NB_OK) {
        return st;
    }
    char msg[256];
    st = nbi_rng_check(kind, dtype, a, b, msg, sizeof msg);
    if (st != NB_OK) {
        return nbi_err(key->hdr.ctx, st, "%s: %s", fn, msg);
    }
    st = nbi_array_new(key->hdr.ctx, fn, nbi_rng_dtype(kind, dtype), rank, shape, out);
    if (st == NB_OK) {
        nbi_rng_fill(kind, dtype, a, b, k0, k1, (*out)->data, 0, (*out)->size);
    }
    return st;
}

nb_status nb_random_bits(const nb_array *key, int rank, const int64_t *shape, nb_array **out) {
    return nbi_sample(key, "nb_random_bits", NBI_RNG_BITS, NB_DTYPE_I32, 0, 0, rank, shape, out);
}

nb_status nb_random_uniform(const nb_array *key, nb_dtype dtype, int rank, const int64_t *shape,
                            double lo, double hi, nb_array **out) {
    return nbi_sample(key, "nb_random_uniform", NBI_RNG_UNIFORM, dtype, lo, hi, rank, shape, out);
}

nb_status nb_random_normal(const nb_array *key, nb_dtype dtype, int rank, const int64_t *shape,
                           nb_array **out) {
    return nbi_sample(key, "nb_random_normal", NBI_RNG_NORMAL, dtype, 0, 0, rank, shape, out);
}

nb_status nb_random_truncated_normal(const nb_array *key, nb_dtype dtype, double lower,
                                     double upper, int rank, const int64_t *shape, nb_array **out) {
    return nbi_sample(key, "nb_random_truncated_normal", NBI_RNG_TRUNCATED_NORMAL, dtype, lower,
                      upper, rank, shape, out);
}

nb_status nb_random_bernoulli(const nb_array *key, double p, int rank, const int64_t *shape,
                              nb_array **out) {
    return nbi_sample(key, "nb_random_bernoulli", NBI_RNG_BERNOULLI, NB_DTYPE_BOOL, p, 0, rank,
                      shape, out);
}

nb_status nb_random_permutation(const nb_array *key, int64_t n, nb_array **out) {
    static const char fn[] = "nb_random_permutation";
    if (out != NULL) {
        *out = NULL;
    }
    uint32_t k0 = 0, k1 = 0;
    nb_status st = nbi_key_words(key, fn, out, &k0, &k1);
    if (st != NB_OK) {
        return st;
    }
    nb_ctx *ctx = key->hdr.ctx;
    if (n < 0 || n > NBI_RNG_PERM_MAX) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: n is %lld; it must be between 0 and 2^40", fn,
                       (long long)n);
    }
    st = nbi_array_new(ctx, fn, NB_DTYPE_I64, 1, &n, out);
    if (st != NB_OK || n == 0) {
        return st;
    }
    size_t bytes = nbi_rng_permutation_scratch(n);
    void *tmp = nbi_alloc(ctx, bytes, 8);
    if (tmp == NULL) {
        nb_array_destroy(*out);
        *out = NULL;
        return nbi_oom(ctx, fn, bytes);
    }
    nbi_rng_permutation(k0, k1, n, (*out)->data, tmp);
    nbi_free(ctx, tmp, bytes);
    return NB_OK;
}
