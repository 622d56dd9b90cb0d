/*
 * nabla/random.h -- counter-based random numbers: Threefry-2x32 keys, as in JAX. (Still to
 * come: the same samplers inside traces.)
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
 *                                machine), at least lo, in the dtype.
 * Threefry-2x32 with 20 rounds: J. K. Salmon, M. A. Moraes, R. O. Dror and D. E. Shaw,
 * "Parallel random numbers: as easy as 1, 2, 3", SC 2011 (its Random123 known-answer
 * vectors are in the tests).
 *
 * These calls run eagerly on arrays (outside traces). Statuses: NB_OK; NB_ERR_MISUSE for a
 * NULL or destroyed handle or out; NB_ERR_SHAPE when key is not an i32[2] array (the
 * message says so); NB_ERR_INVALID for a bad count, dtype or bounds; NB_ERR_OOM. Each
 * result is a new array, yours to destroy; on failure *out is NULL.
 */
#ifndef NABLA_RANDOM_H
#define NABLA_RANDOM_H

#include "array.h"
#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The key of seed (jax.random.PRNGKey). */
NB_API nb_status nb_random_key(nb_ctx *ctx, uint64_t seed, nb_array **out);
/* n >= 1 new keys from key, as an i32[n, 2] array (row i is key i). */
NB_API nb_status nb_random_split(const nb_array *key, int64_t n, nb_array **out);
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
/* Standard normal floats truncated to (lower, upper), lower < upper (infinities allowed), as
 * jax.random.truncated_normal: u uniform between erf(lower/sqrt2) and erf(upper/sqrt2),
 * sqrt(2) erfinv(u), clipped strictly inside the bounds. To a few ULP of JAX's values. */
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

#ifdef __cplusplus
}
#endif
#endif /* NABLA_RANDOM_H */
