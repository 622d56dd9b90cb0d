/*
 * nabla/random.h -- counter-based random numbers: Threefry-2x32 keys, as in JAX, eagerly on
 * arrays (nb_random_*) and inside traced functions (nb_rng_*), with the same bits.
 *
 * A key is an i32[2] array holding two 32-bit words (bit patterns: read them as unsigned).
 * Nothing is stateful: the same key gives the same numbers on any machine and for any
 * thread count, and keys are split or folded with data to get independent streams.
 * Everything here follows jax.random with jax_threefry_partitionable (JAX's default since
 * 0.5), bit for bit (tests/core/test_random.c checks JAX 0.10's own outputs):
 *   - nb_random_key(seed)      = jax.random.PRNGKey(seed): words (seed >> 32, seed & ~0u);
 *   - nb_random_split(key, n)  : key i = threefry2x32(key, (0, i));
 *   - nb_random_fold_in(key, d) = threefry2x32(key, (0, d));
 *   - nb_random_bits           : element i (row-major) = y0 ^ y1 of threefry2x32(key, (0, i))
 *                                for 32 bits; (y0 << 32) | y1 for 64 (f64 uniform);
 *   - nb_random_uniform        : the top mantissa bits of those under the exponent of 1.0,
 *                                minus 1, times (hi - lo) plus lo as one fused multiply-add
 *                                (as XLA compiles it; C's fma is correctly rounded on every
 *                                machine), at least lo, in the dtype;
 *   - nb_random_truncated_normal: JAX's inverse CDF, except far in a tail (see below).
 * Threefry-2x32 with 20 rounds: J. K. Salmon, M. A. Moraes, R. O. Dror and D. E. Shaw,
 * "Parallel random numbers: as easy as 1, 2, 3", SC 2011 (its Random123 known-answer
 * vectors are in the tests).
 *
 * The nb_random_* calls run eagerly on arrays (outside traces). Statuses: NB_OK;
 * NB_ERR_MISUSE for a NULL or destroyed handle or out; NB_ERR_SHAPE when key is not an
 * i32[2] array (the message says so); NB_ERR_INVALID for a bad count, dtype or bounds;
 * NB_ERR_OOM. Each result is a new array, yours to destroy; on failure *out is NULL.
 *
 * The nb_rng_* calls are their twins inside a body being traced (trace.h): the key is an
 * i32[2] var -- typically an argument of the function, so that a jitted function called
 * with another key gives other numbers without a retrace -- and the result is a var. The
 * numbers are computed when the compiled function runs, by the same code as the eager
 * call, so for the same key value both give the same bits (for any thread count; whether
 * the key is an argument or a constant that the compiler folds). Errors follow the trace's
 * sticky rule (trace.h): a key that is not i32[2], a bad dtype, count or bounds records one
 * message naming the op, the shapes and the fix, and returns poison. Samplers with the
 * same key and arguments give the same numbers (the compiler may compute them once); use
 * nb_rng_split or nb_rng_fold_in to get independent streams, e.g. one key per step with
 * nb_rng_fold_in(key, step). Row i of nb_rng_split's i32[n,2] result is a key:
 * nb_take(keys, nb_scalar_typed(tr, NB_DTYPE_I32, i), 0).
 *
 * No gradients flow through the nb_rng_* ops: their outputs, floats included, are
 * constants to nb_grad, nb_vjp and nb_jvp (as a sample of jax.random is: a function of the
 * key alone, which is an integer). Differentiate through the transformation instead, e.g.
 * mu + sigma * nb_rng_normal(...) has gradients with respect to mu and sigma.
 */
#ifndef NABLA_RANDOM_H
#define NABLA_RANDOM_H

#include "array.h"
#include "core.h"
#include "trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The key of seed (jax.random.PRNGKey). */
NB_API nb_status nb_random_key(nb_ctx *ctx, uint64_t seed, nb_array **out);
/* n >= 1 new keys from key, as an i32[n, 2] array (row i is key i: nb_array_index(keys, i,
 * &k) is it as a key). */
NB_API nb_status nb_random_split(const nb_array *key, int64_t n, nb_array **out);
/* The same n keys as n separate keys a caller can hold one by one: keys (room for n) gets
 * keys[i] = row i of nb_random_split(key, n), each a new reference (a view of one array,
 * which it keeps alive); on failure every keys[i] is NULL.
 *     nb_array *k[3];                       // split, init, shuffle
 *     nb_random_split_keys(key, 3, k);      // ... nb_array_destroy(k[i]) each */
NB_API nb_status nb_random_split_keys(const nb_array *key, int64_t n, nb_array **keys);
/* A new key from key and data (jax.random.fold_in). */
NB_API nb_status nb_random_fold_in(const nb_array *key, uint32_t data, nb_array **out);
/* Random 32-bit words of the given shape, as i32 bit patterns (jax.random.bits, uint32). */
NB_API nb_status nb_random_bits(const nb_array *key, int rank, const int64_t *shape,
                                nb_array **out);
/* Uniform floats in [lo, hi) of the given shape; dtype NB_DTYPE_F32 or NB_DTYPE_F64; lo < hi,
 * both finite. */
NB_API nb_status nb_random_uniform(const nb_array *key, nb_dtype dtype, int rank,
                                   const int64_t *shape, double lo, double hi, nb_array **out);

/* Standard normal floats (f32 or f64): sqrt(2) erfinv(u), u uniform in (-1, 1) as
 * jax.random.normal draws it. erfinv runs in double (Giles's approximation refined by two
 * Newton steps with libm's erf), so values agree with JAX's to within a few ULP, not bit
 * for bit: XLA's own f32 erfinv is a polynomial of its own. */
NB_API nb_status nb_random_normal(const nb_array *key, nb_dtype dtype, int rank,
                                  const int64_t *shape, nb_array **out);
/* Standard normal floats truncated to (lower, upper): lower < upper (infinities allowed),
 * with at least one value of the dtype strictly between them once they are rounded to it
 * (else NB_ERR_INVALID). Every value is finite and strictly inside the rounded bounds.
 *
 * Where the dtype resolves the interval, this is jax.random.truncated_normal bit for bit
 * (tests/core/test_random.c checks JAX 0.10.2's own outputs, x86-64 with FMA): u uniform
 * between ea = erf(lower/sqrt2) and eb = erf(upper/sqrt2), x = sqrt2 erf_inv(u), clipped to
 * the nearest values inside the bounds -- computed as XLA's CPU backend compiles it: its f32
 * erf, log1p and erf_inv polynomials with the same fused multiply-adds, and for f64 the C
 * library's erf and log where XLA calls them (so f64 bits follow the C library). "Resolves"
 * means: the bounds are on both sides of 0, or the mass between them, eb - ea in the dtype,
 * spans at least 2^12 units in the last place of the larger |erf| -- for one-sided bounds in
 * f32 up to about 3.7 sigma, in f64 about 7.3. As in JAX, an infinite bound comes out as the
 * finite clip value (-FLT_MAX, ...) when all the uniform's bits are 0 (probability 2^-23 in
 * f32, 2^-52 in f64); and subnormal results differ (XLA flushes them to zero: JAX returns 0,
 * outside the interval, for (0, 1e-40) in f32).
 *
 * Farther out, on one side of 0, JAX's arithmetic cannot resolve the interval any more: it
 * returns a few distinct values, then only the clip bound (f32 (5, 6): 10 distinct values;
 * f32 (5.5, 6): 5.9999995 every time, (30, inf): FLT_MAX every time; f64 (8, 9): 12 values,
 * (9, 10): 9.999999999999998 every time; an inverse CDF that is not clipped gives NaN).
 * There nabla samples by rejection instead (C. P. Robert, "Simulation of truncated normal
 * variables", Statistics and Computing 5, 1995): from the bound nearer 0, an exponential
 * proposal truncated to the interval (at least 76% of the proposals are accepted), in
 * double. Its uniforms come from counter-based streams under keys derived from key, so
 * element i still depends only on the key and i: the same bits eagerly and traced, for any
 * thread count. These values are not JAX's (JAX's are not the distribution there). No
 * allocation beyond the result. */
NB_API nb_status nb_random_truncated_normal(const nb_array *key, nb_dtype dtype, double lower,
                                            double upper, int rank, const int64_t *shape,
                                            nb_array **out);
/* Bool samples, true with probability p in [0, 1]: uniform f32 < p (jax.random.bernoulli,
 * bit for bit). */
NB_API nb_status nb_random_bernoulli(const nb_array *key, double p, int rank, const int64_t *shape,
                                     nb_array **out);
/* A random permutation of 0 .. n-1 as an i64[n] array (jax.random.permutation(key, n),
 * element for element): rounds of sorting by fresh random 32-bit keys, stably. Allocates
 * 16 bytes per element of scratch. */
NB_API nb_status nb_random_permutation(const nb_array *key, int64_t n, nb_array **out);

/* ---- inside traces ------------------------------------------------------------------
 * Twins of the calls above for a body being traced: key is an i32[2] var; each returns a
 * var (or the trace's poison, with the sticky error recorded). Same parameters, ranges and
 * bits as the eager call of the same name. The results have no gradient (see above). */

/* n >= 1 keys as an i32[n, 2] var (row i is key i). */
NB_API nb_var *nb_rng_split(nb_var *key, int64_t n);
/* A new key from key and data, a rank-0 i32 or i64 var whose low 32 bits are used (an i64
 * data d gives the key of nb_random_fold_in(key, (uint32_t)d)). */
NB_API nb_var *nb_rng_fold_in(nb_var *key, nb_var *data);
/* Random 32-bit words as an i32 var of the shape (rank 0: a scalar; shape may be NULL). */
NB_API nb_var *nb_rng_bits(nb_var *key, int rank, const int64_t *shape);
/* Uniform floats in [lo, hi): dtype NB_DTYPE_F32 or NB_DTYPE_F64; lo < hi, both finite. */
NB_API nb_var *nb_rng_uniform(nb_var *key, nb_dtype dtype, int rank, const int64_t *shape,
                              double lo, double hi);
/* Standard normal floats (f32 or f64), as nb_random_normal. */
NB_API nb_var *nb_rng_normal(nb_var *key, nb_dtype dtype, int rank, const int64_t *shape);
/* Standard normal floats truncated to (lower, upper), as nb_random_truncated_normal. */
NB_API nb_var *nb_rng_truncated_normal(nb_var *key, nb_dtype dtype, double lower, double upper,
                                       int rank, const int64_t *shape);
/* A bool var, true with probability p in [0, 1], as nb_random_bernoulli. */
NB_API nb_var *nb_rng_bernoulli(nb_var *key, double p, int rank, const int64_t *shape);
/* A random permutation of 0 .. n-1 (0 <= n <= 2^40) as an i64[n] var, as
 * nb_random_permutation; the compiled function holds 16 bytes per element of scratch in its
 * workspace (no allocation while it runs). */
NB_API nb_var *nb_rng_permutation(nb_var *key, int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_RANDOM_H */
