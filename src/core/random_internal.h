/*
 * src/core/random_internal.h -- the samplers of random.c on raw buffers, shared by the
 * eager calls (nb_random_*) and the kernels of the traced ones (nb_rng_*, src/ad/op_random.c),
 * so both give the same bits from one copy of the code. Not API.
 *
 * Keys are passed as their two words (k0, k1) = the i32[2] key's elements as unsigned.
 * Nothing here allocates, records errors or checks its arguments: callers validate first
 * with nbi_rng_check.
 */
#ifndef NABLA_SRC_CORE_RANDOM_INTERNAL_H
#define NABLA_SRC_CORE_RANDOM_INTERNAL_H

#include "core/internal.h"

/* The samplers whose element i depends only on the key and i (the counter), so any range
 * of elements can be computed on its own: chunks on threads give the same bits. */
typedef enum nbi_rng_kind {
    NBI_RNG_BITS,             /* i32 words (bit patterns); a, b unused */
    NBI_RNG_UNIFORM,          /* f32/f64 in [a, b) */
    NBI_RNG_NORMAL,           /* f32/f64 standard normal; a, b unused */
    NBI_RNG_TRUNCATED_NORMAL, /* f32/f64 standard normal truncated to (a, b); far in a tail
                                 by rejection, its attempts under keys derived from (k0, k1) */
    NBI_RNG_BERNOULLI         /* bool, true with probability a */
} nbi_rng_kind;

/* Check the parameters of a sampler of kind: dtype (result dtype of the float samplers;
 * ignored for bits and bernoulli) and bounds a, b. NB_OK, or the status (NB_ERR_INVALID)
 * with what is wrong and the fix written into msg (no op name: callers prefix it). */
NBI_HIDDEN nb_status nbi_rng_check(nbi_rng_kind kind, nb_dtype dtype, double a, double b, char *msg,
                                   size_t cap);
/* The dtype a sampler of kind produces (dtype for the float ones). */
NBI_HIDDEN nb_dtype nbi_rng_dtype(nbi_rng_kind kind, nb_dtype dtype);
/* Elements [first, first + n) of the stream of kind under key (k0, k1), written to
 * out[first .. first + n) (out is the base of the whole result, of nbi_rng_dtype). */
NBI_HIDDEN void nbi_rng_fill(nbi_rng_kind kind, nb_dtype dtype, double a, double b, uint32_t k0,
                             uint32_t k1, void *out, int64_t first, int64_t n);

/* split: n keys, row-major into out[2n]; n in [1, 2^32] (NBI_RNG_SPLIT_MAX). */
#define NBI_RNG_SPLIT_MAX ((int64_t)1 << 32)
NBI_HIDDEN void nbi_rng_split(uint32_t k0, uint32_t k1, int64_t n, int32_t *out);
/* fold_in: the new key's two words into out[2]. */
NBI_HIDDEN void nbi_rng_fold_in(uint32_t k0, uint32_t k1, uint32_t data, int32_t *out);

/* permutation of 0 .. n-1 into out[n], n in [0, 2^40] (NBI_RNG_PERM_MAX), using scratch of
 * nbi_rng_permutation_scratch(n) bytes, 8-byte aligned. */
#define NBI_RNG_PERM_MAX ((int64_t)1 << 40)
NBI_HIDDEN size_t nbi_rng_permutation_scratch(int64_t n);
NBI_HIDDEN void nbi_rng_permutation(uint32_t k0, uint32_t k1, int64_t n, int64_t *out,
                                    void *scratch);

#endif /* NABLA_SRC_CORE_RANDOM_INTERNAL_H */
