/*
 * random.c -- Threefry-2x32 (20 rounds) keys and the streams made from them, as jax.random
 * with jax_threefry_partitionable (see include/nabla/random.h).
 */
#include "core/internal.h"

#include <math.h>
#include <nabla/random.h>
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

/* The two words of key, or an error naming fn. */
static nb_status nbi_key_words(const nb_array *key, const char *fn, uint32_t *k0, uint32_t *k1) {
    if (nb_array_check(key) != NB_OK) {
        return NB_ERR_MISUSE;
    }
    if (key->dtype != NB_DTYPE_I32 || key->rank != 1 || key->shape[0] != 2) {
        char sig[NBI_SIG_CAP];
        nbi_sig(sig, sizeof sig, key->dtype, key->rank, key->shape);
        return nbi_err(key->hdr.ctx, NB_ERR_SHAPE,
                       "%s: a key is an i32[2] array, got %s (make one with nb_random_key, or "
                       "take a row of nb_random_split's result)",
                       fn, sig);
    }
    const int32_t *w = key->data;
    *k0 = (uint32_t)w[0];
    *k1 = (uint32_t)w[1];
    return NB_OK;
}

static nb_status nbi_key_new(nb_ctx *ctx, const char *fn, uint32_t k0, uint32_t k1,
                             nb_array **out) {
    int64_t two = 2;
    nb_status st = nbi_array_new(ctx, fn, NB_DTYPE_I32, 1, &two, out);
    if (st == NB_OK) {
        int32_t *w = (*out)->data;
        w[0] = (int32_t)k0;
        w[1] = (int32_t)k1;
    }
    return st;
}

nb_status nb_random_key(nb_ctx *ctx, uint64_t seed, nb_array **out) {
    if (out != NULL) {
        *out = NULL;
    }
    if (ctx == NULL || out == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE, "nb_random_key: ctx or out is NULL");
    }
    return nbi_key_new(ctx, "nb_random_key", (uint32_t)(seed >> 32), (uint32_t)seed, out);
}

nb_status nb_random_split(const nb_array *key, int64_t n, nb_array **out) {
    static const char fn[] = "nb_random_split";
    if (out != NULL) {
        *out = NULL;
    }
    uint32_t k0, k1;
    nb_status st = out == NULL ? NB_ERR_MISUSE : nbi_key_words(key, fn, &k0, &k1);
    if (st != NB_OK) {
        return st;
    }
    if (n < 1 || n > (int64_t)1 << 32) {
        return nbi_err(key->hdr.ctx, NB_ERR_INVALID, "%s: n is %lld; it must be between 1 and 2^32",
                       fn, (long long)n);
    }
    int64_t shape[2] = {n, 2};
    st = nbi_array_new(key->hdr.ctx, fn, NB_DTYPE_I32, 2, shape, out);
    if (st != NB_OK) {
        return st;
    }
    int32_t *w = (*out)->data;
    for (int64_t i = 0; i < n; i++) {
        uint32_t y0, y1;
        nbi_threefry2x32(k0, k1, 0, (uint32_t)i, &y0, &y1);
        w[2 * i] = (int32_t)y0;
        w[2 * i + 1] = (int32_t)y1;
    }
    return NB_OK;
}

nb_status nb_random_fold_in(const nb_array *key, uint32_t data, nb_array **out) {
    static const char fn[] = "nb_random_fold_in";
    if (out != NULL) {
        *out = NULL;
    }
    uint32_t k0, k1, y0, y1;
    nb_status st = out == NULL ? NB_ERR_MISUSE : nbi_key_words(key, fn, &k0, &k1);
    if (st != NB_OK) {
        return st;
    }
    nbi_threefry2x32(k0, k1, 0, data, &y0, &y1);
    return nbi_key_new(key->hdr.ctx, fn, y0, y1, out);
}

/* Element i's counter is i as a 64-bit number split into (high, low) words. */
static void nbi_counter_words(uint32_t k0, uint32_t k1, int64_t i, uint32_t *y0, uint32_t *y1) {
    nbi_threefry2x32(k0, k1, (uint32_t)((uint64_t)i >> 32), (uint32_t)i, y0, y1);
}

nb_status nb_random_bits(const nb_array *key, int rank, const int64_t *shape, nb_array **out) {
    static const char fn[] = "nb_random_bits";
    if (out != NULL) {
        *out = NULL;
    }
    uint32_t k0, k1;
    nb_status st = out == NULL ? NB_ERR_MISUSE : nbi_key_words(key, fn, &k0, &k1);
    if (st == NB_OK) {
        st = nbi_array_new(key->hdr.ctx, fn, NB_DTYPE_I32, rank, shape, out);
    }
    if (st != NB_OK) {
        return st;
    }
    int32_t *w = (*out)->data;
    for (int64_t i = 0; i < (*out)->size; i++) {
        uint32_t y0, y1;
        nbi_counter_words(k0, k1, i, &y0, &y1);
        w[i] = (int32_t)(y0 ^ y1);
    }
    return NB_OK;
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

/* The prologue of the float samplers: key words, dtype check, the new array. */
static nb_status nbi_sampler_begin(const nb_array *key, const char *fn, nb_dtype dtype, int rank,
                                   const int64_t *shape, uint32_t *k0, uint32_t *k1,
                                   nb_array **out) {
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = out == NULL ? NB_ERR_MISUSE : nbi_key_words(key, fn, k0, k1);
    if (st != NB_OK) {
        return st;
    }
    if (dtype != NB_DTYPE_F32 && dtype != NB_DTYPE_F64) {
        return nbi_err(key->hdr.ctx, NB_ERR_INVALID, "%s: dtype %s; samples are f32 or f64", fn,
                       nb_dtype_name(dtype));
    }
    return nbi_array_new(key->hdr.ctx, fn, dtype, rank, shape, out);
}

nb_status nb_random_uniform(const nb_array *key, nb_dtype dtype, int rank, const int64_t *shape,
                            double lo, double hi, nb_array **out) {
    static const char fn[] = "nb_random_uniform";
    if (out != NULL) {
        *out = NULL;
    }
    if (nb_array_check(key) == NB_OK && (!isfinite(lo) || !isfinite(hi) || !(lo < hi))) {
        return nbi_err(key->hdr.ctx, NB_ERR_INVALID,
                       "%s: bounds [%g, %g) must be finite with lo < hi", fn, lo, hi);
    }
    uint32_t k0, k1;
    nb_status st = nbi_sampler_begin(key, fn, dtype, rank, shape, &k0, &k1, out);
    if (st != NB_OK) {
        return st;
    }
    int64_t n = (*out)->size;
    if (dtype == NB_DTYPE_F32) {
        float *o = (*out)->data, flo = (float)lo, span = (float)hi - (float)lo;
        for (int64_t i = 0; i < n; i++) {
            o[i] = nbi_uniform_f32(k0, k1, i, flo, span);
        }
    } else {
        double *o = (*out)->data;
        for (int64_t i = 0; i < n; i++) {
            o[i] = nbi_uniform_f64(k0, k1, i, lo, hi - lo);
        }
    }
    return NB_OK;
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

nb_status nb_random_normal(const nb_array *key, nb_dtype dtype, int rank, const int64_t *shape,
                           nb_array **out) {
    uint32_t k0, k1;
    nb_status st = nbi_sampler_begin(key, "nb_random_normal", dtype, rank, shape, &k0, &k1, out);
    if (st != NB_OK) {
        return st;
    }
    int64_t n = (*out)->size;
    if (dtype == NB_DTYPE_F32) { /* u uniform in the open interval (-1, 1), as JAX */
        float *o = (*out)->data, lo = nextafterf(-1.0f, 1.0f), span = 1.0f - lo;
        for (int64_t i = 0; i < n; i++) {
            o[i] =
                (float)1.4142135623730951 * (float)nbi_erfinv(nbi_uniform_f32(k0, k1, i, lo, span));
        }
    } else {
        double *o = (*out)->data, lo = nextafter(-1.0, 1.0), span = 1.0 - lo;
        for (int64_t i = 0; i < n; i++) {
            o[i] = 1.4142135623730951 * nbi_erfinv(nbi_uniform_f64(k0, k1, i, lo, span));
        }
    }
    return NB_OK;
}

nb_status nb_random_truncated_normal(const nb_array *key, nb_dtype dtype, double lower,
                                     double upper, int rank, const int64_t *shape, nb_array **out) {
    static const char fn[] = "nb_random_truncated_normal";
    if (out != NULL) {
        *out = NULL;
    }
    if (nb_array_check(key) == NB_OK && !(lower < upper)) {
        return nbi_err(key->hdr.ctx, NB_ERR_INVALID,
                       "%s: bounds [%g, %g]: lower must be below upper", fn, lower, upper);
    }
    uint32_t k0, k1;
    nb_status st = nbi_sampler_begin(key, fn, dtype, rank, shape, &k0, &k1, out);
    if (st != NB_OK) {
        return st;
    }
    /* JAX's form: u uniform in [erf(lower/sqrt2), erf(upper/sqrt2)), sqrt2 erfinv(u),
     * clipped strictly inside (lower, upper) */
    const double s2 = 1.4142135623730951;
    int64_t n = (*out)->size;
    if (dtype == NB_DTYPE_F32) {
        float *o = (*out)->data, a = (float)erf(lower / s2), b = (float)erf(upper / s2);
        float lo = nextafterf((float)lower, INFINITY), hi = nextafterf((float)upper, -INFINITY);
        for (int64_t i = 0; i < n; i++) {
            float v = (float)s2 * (float)nbi_erfinv(nbi_uniform_f32(k0, k1, i, a, b - a));
            o[i] = v < lo ? lo : v > hi ? hi : v;
        }
    } else {
        double *o = (*out)->data, a = erf(lower / s2), b = erf(upper / s2);
        double lo = nextafter(lower, INFINITY), hi = nextafter(upper, -INFINITY);
        for (int64_t i = 0; i < n; i++) {
            double v = s2 * nbi_erfinv(nbi_uniform_f64(k0, k1, i, a, b - a));
            o[i] = v < lo ? lo : v > hi ? hi : v;
        }
    }
    return NB_OK;
}

nb_status nb_random_bernoulli(const nb_array *key, double p, int rank, const int64_t *shape,
                              nb_array **out) {
    static const char fn[] = "nb_random_bernoulli";
    if (out != NULL) {
        *out = NULL;
    }
    uint32_t k0, k1;
    nb_status st = out == NULL ? NB_ERR_MISUSE : nbi_key_words(key, fn, &k0, &k1);
    if (st != NB_OK) {
        return st;
    }
    if (!(p >= 0.0 && p <= 1.0)) {
        return nbi_err(key->hdr.ctx, NB_ERR_INVALID, "%s: p is %g; a probability is in [0, 1]", fn,
                       p);
    }
    st = nbi_array_new(key->hdr.ctx, fn, NB_DTYPE_BOOL, rank, shape, out);
    if (st != NB_OK) {
        return st;
    }
    uint8_t *o = (*out)->data;
    float fp = (float)p;
    for (int64_t i = 0; i < (*out)->size; i++) { /* uniform f32 in [0, 1) < p, as JAX */
        o[i] = nbi_uniform_f32(k0, k1, i, 0.0f, 1.0f) < fp;
    }
    return NB_OK;
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

nb_status nb_random_permutation(const nb_array *key, int64_t n, nb_array **out) {
    static const char fn[] = "nb_random_permutation";
    if (out != NULL) {
        *out = NULL;
    }
    uint32_t k0, k1;
    nb_status st = out == NULL ? NB_ERR_MISUSE : nbi_key_words(key, fn, &k0, &k1);
    if (st != NB_OK) {
        return st;
    }
    nb_ctx *ctx = key->hdr.ctx;
    if (n < 0 || n > ((int64_t)1 << 40)) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: n is %lld; it must be between 0 and 2^40", fn,
                       (long long)n);
    }
    st = nbi_array_new(ctx, fn, NB_DTYPE_I64, 1, &n, out);
    if (st != NB_OK || n == 0) {
        return st;
    }
    size_t bytes = (size_t)n * (2 * sizeof(uint32_t) + sizeof(int64_t));
    unsigned char *tmp = nbi_alloc(ctx, bytes, 8);
    if (tmp == NULL) {
        nb_array_destroy(*out);
        *out = NULL;
        return nbi_oom(ctx, fn, bytes);
    }
    int64_t *idx = (*out)->data, *tidx = (int64_t *)(void *)tmp;
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
    nbi_free(ctx, tmp, bytes);
    return NB_OK;
}
