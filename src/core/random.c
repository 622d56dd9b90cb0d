/*
 * random.c -- Threefry-2x32 (20 rounds) keys and the streams made from them, as jax.random
 * with jax_threefry_partitionable (see include/nabla/random.h). The samplers work on raw
 * buffers (random_internal.h) so that the eager calls here and the kernels of the traced
 * ones (src/ad/op_random.c) run the same code.
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
        /* JAX's form: u uniform in [erf(lower/sqrt2), erf(upper/sqrt2)), sqrt2 erfinv(u),
         * clipped strictly inside (lower, upper) */
        if (f32) {
            float *o = out, ea = (float)erf(a / s2), eb = (float)erf(b / s2);
            float lo = nextafterf((float)a, INFINITY), hi = nextafterf((float)b, -INFINITY);
            for (int64_t i = first; i < end; i++) {
                float v = (float)s2 * (float)nbi_erfinv(nbi_uniform_f32(k0, k1, i, ea, eb - ea));
                o[i] = v < lo ? lo : v > hi ? hi : v;
            }
        } else {
            double *o = out, ea = erf(a / s2), eb = erf(b / s2);
            double lo = nextafter(a, INFINITY), hi = nextafter(b, -INFINITY);
            for (int64_t i = first; i < end; i++) {
                double v = s2 * nbi_erfinv(nbi_uniform_f64(k0, k1, i, ea, eb - ea));
                o[i] = v < lo ? lo : v > hi ? hi : v;
            }
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
    if (ctx == NULL || out == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE, "nb_random_key: ctx or out is NULL");
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
    nb_status st = out == NULL ? NB_ERR_MISUSE : nbi_key_words(key, fn, &k0, &k1);
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

nb_status nb_random_fold_in(const nb_array *key, uint32_t data, nb_array **out) {
    static const char fn[] = "nb_random_fold_in";
    if (out != NULL) {
        *out = NULL;
    }
    uint32_t k0 = 0, k1 = 0;
    nb_status st = out == NULL ? NB_ERR_MISUSE : nbi_key_words(key, fn, &k0, &k1);
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
    nb_status st = out == NULL ? NB_ERR_MISUSE : nbi_key_words(key, fn, &k0, &k1);
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
    nb_status st = out == NULL ? NB_ERR_MISUSE : nbi_key_words(key, fn, &k0, &k1);
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
