/*
 * nabla/array.h -- dense n-d host arrays.
 *
 * An nb_array is a dense, row-major array of one dtype and rank 0..NB_MAX_RANK whose data
 * is 64-byte aligned (except a view of rows, below, which starts where its rows start).
 * Arrays are refcounted: every function that returns an array returns a new reference,
 * released with nb_array_destroy; trees that hold an array keep their own reference.
 * nb_array_reshape, nb_array_index and nb_array_rows return a new array that shares the
 * data of its input (a view, as in numpy): writes through one are seen through the other,
 * and the view keeps the data alive after its input is destroyed.
 *
 * Shapes are int64_t; every element count and byte size is overflow-checked, so a
 * negative or overflowing shape is an error (NB_ERR_SHAPE / NB_ERR_OVERFLOW), never a
 * crash. Element values cross the API as double (or int64_t in the _i64 variants, which
 * are exact for integer dtypes); conversions follow C's rules, except that converting a
 * value that does not fit an integer dtype (NaN, out of range) is NB_ERR_INVALID.
 */
#ifndef NABLA_ARRAY_H
#define NABLA_ARRAY_H

#include "core.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NB_MAX_RANK 8

/* Element types. Values are ABI; new ones are only appended. */
typedef enum nb_dtype {
    NB_DTYPE_F32 = 0,
    NB_DTYPE_F64 = 1,
    NB_DTYPE_I32 = 2,
    NB_DTYPE_I64 = 3,
    NB_DTYPE_BOOL = 4 /* one byte, 0 or 1 */
} nb_dtype;
#define NB_DTYPE_COUNT 5

/* "f32", "f64", "i32", "i64", "bool"; "?" for an unknown value. */
NB_API const char *nb_dtype_name(nb_dtype dtype);
/* Bytes per element (4, 8, 4, 8, 1), or 0 for an unknown value. */
NB_API size_t nb_dtype_size(nb_dtype dtype);
/* true for f32 and f64 (JAX's "inexact"). */
NB_API bool nb_dtype_is_float(nb_dtype dtype);

typedef struct nb_array nb_array;

/* ---- lifecycle ---------------------------------------------------------------------- */
/* All constructors: ctx borrowed; shape (rank entries, may be NULL when rank is 0) is
 * copied; on success *out is a new reference. They allocate.
 * Returns NB_OK; NB_ERR_MISUSE (NULL ctx or out, NULL shape with rank > 0);
 * NB_ERR_DTYPE (unknown dtype); NB_ERR_SHAPE (rank outside 0..8 or a negative dim);
 * NB_ERR_OVERFLOW (element count or bytes overflow); NB_ERR_OOM. */

NB_API nb_status nb_array_zeros(nb_ctx *ctx, nb_dtype dtype, int rank, const int64_t *shape,
                                nb_array **out);
NB_API nb_status nb_array_ones(nb_ctx *ctx, nb_dtype dtype, int rank, const int64_t *shape,
                               nb_array **out);
/* Every element = value converted to dtype (NB_ERR_INVALID if it does not fit). */
NB_API nb_status nb_array_full(nb_ctx *ctx, nb_dtype dtype, int rank, const int64_t *shape,
                               double value, nb_array **out);
/* A rank-0 array holding value. */
NB_API nb_status nb_array_scalar(nb_ctx *ctx, nb_dtype dtype, double value, nb_array **out);
/* A copy of data, which holds size(shape) elements of dtype in row-major order (data may
 * be NULL only when that size is 0). data is borrowed and need not be aligned. */
NB_API nb_status nb_array_from_data(nb_ctx *ctx, nb_dtype dtype, int rank, const int64_t *shape,
                                    const void *data, nb_array **out);
/* numpy.arange: the rank-1 array start, start+step, start+2*step, ... of length
 * ceil((stop-start)/step) (0 if that is negative), which is numpy's rule: the values stop
 * before stop, except that rounding can make the last one equal or pass it (numpy's
 * arange(1, 1.3, 0.1) has 4 elements). step == 0 or a non-finite argument is
 * NB_ERR_INVALID. Element i is computed as start + i*step in double, then converted. */
NB_API nb_status nb_array_arange(nb_ctx *ctx, nb_dtype dtype, double start, double stop,
                                 double step, nb_array **out);
/* numpy.linspace(start, stop, num, endpoint=True): num >= 0 evenly spaced values, the last
 * exactly stop (when num >= 2). Negative num is NB_ERR_SHAPE. */
NB_API nb_status nb_array_linspace(nb_ctx *ctx, nb_dtype dtype, double start, double stop,
                                   int64_t num, nb_array **out);
/* numpy.eye(n, m, k): an n x m matrix with ones on diagonal k (0 = main, > 0 above). */
NB_API nb_status nb_array_eye(nb_ctx *ctx, nb_dtype dtype, int64_t n, int64_t m, int64_t k,
                              nb_array **out);

/* A new array with a copy of a's data. */
NB_API nb_status nb_array_copy(const nb_array *a, nb_array **out);
/* A new array holding a's elements converted to dtype (C conversion rules; float to
 * integer truncates toward zero, and NaN or out-of-range values are NB_ERR_INVALID, naming
 * the first offending index; any nonzero becomes true for bool). */
NB_API nb_status nb_array_cast(const nb_array *a, nb_dtype dtype, nb_array **out);
/* A new array with the same data (shared, not copied) and a new shape with the same
 * element count. At most one dim may be -1, inferred as in numpy. Mismatched counts are
 * NB_ERR_SHAPE with both shapes in the message. */
NB_API nb_status nb_array_reshape(const nb_array *a, int rank, const int64_t *shape,
                                  nb_array **out);

/* a[i]: the sub-array at index i of axis 0 (rank - 1; i < 0 counts back from the end), a
 * view of a's data without a copy -- row i of a matrix, key i of nb_random_split's keys, one
 * example of a batch. NB_ERR_INDEX naming i, the valid range and a's shape when out of
 * range; NB_ERR_SHAPE for a rank-0 a. */
NB_API nb_status nb_array_index(const nb_array *a, int64_t i, nb_array **out);
/* a[start:stop] along axis 0 (same rank; negative start or stop counts back from the end,
 * so -1 is the last row; stop = the dim for the end), a view without a copy: a minibatch of
 * consecutive rows. After counting back, 0 <= start <= stop <= dim 0, else NB_ERR_INDEX
 * naming both, the valid range and a's shape (no silent clamping); NB_ERR_SHAPE for a
 * rank-0 a. */
NB_API nb_status nb_array_rows(const nb_array *a, int64_t start, int64_t stop, nb_array **out);

/* Take one more reference to a (for code that stores it). Returns a, or NULL if a is NULL
 * or destroyed. */
NB_API nb_array *nb_array_retain(nb_array *a);
/* Release the caller's reference; the array is freed when the last reference goes. NULL is
 * a no-op. Destroying an already destroyed handle records NB_ERR_MISUSE on its context
 * (detected while its slot has not been reused). */
NB_API void nb_array_destroy(nb_array *a);

/* ---- accessors (never allocate, never fail on a valid handle) ----------------------- */
/* On a NULL or destroyed handle these return the value in brackets. */
NB_API nb_ctx *nb_array_ctx(const nb_array *a);           /* [NULL] */
NB_API nb_dtype nb_array_dtype(const nb_array *a);        /* [NB_DTYPE_F32] */
NB_API int nb_array_rank(const nb_array *a);              /* [-1] */
NB_API const int64_t *nb_array_shape(const nb_array *a);  /* [NULL]; rank entries, borrowed */
NB_API int64_t nb_array_dim(const nb_array *a, int axis); /* [-1]; negative axis counts back */
NB_API int64_t nb_array_size(const nb_array *a);          /* [-1]; element count */
NB_API size_t nb_array_nbytes(const nb_array *a);         /* [0] */
/* The data pointer, 64-byte aligned (a view of rows: where its rows start), valid while any
 * reference to the data is alive. May
 * be written through: the array's contents are the caller's to change. [NULL] Empty
 * arrays still return a valid aligned pointer. */
NB_API void *nb_array_data(const nb_array *a);
/* A validity check: NB_OK for a live array, NB_ERR_MISUSE for NULL or destroyed (a destroyed
 * handle also records why on its context). */
NB_API nb_status nb_array_check(const nb_array *a);

/* ---- element access ----------------------------------------------------------------- */
/* idx holds rank indices (NULL allowed for rank 0); negative indices count back from the
 * end as in numpy. Out-of-range is NB_ERR_INDEX naming the axis, index and shape. */
NB_API nb_status nb_array_get(const nb_array *a, const int64_t *idx, double *out);
NB_API nb_status nb_array_set(nb_array *a, const int64_t *idx, double value);
NB_API nb_status nb_array_get_i64(const nb_array *a, const int64_t *idx, int64_t *out);
NB_API nb_status nb_array_set_i64(nb_array *a, const int64_t *idx, int64_t value);
/* The element at flat (row-major) position i, 0 <= i < size. */
NB_API nb_status nb_array_get_flat(const nb_array *a, int64_t i, double *out);

/* ---- comparison --------------------------------------------------------------------- */
/* numpy.array_equal: same dtype, same shape and equal values (NaN != NaN, -0 == +0). */
NB_API nb_status nb_array_equal(const nb_array *a, const nb_array *b, bool *out);
/* Bit-for-bit identity: same dtype, shape and bytes (NaNs with equal bits are identical,
 * -0 and +0 are not). The test of the determinism guarantees. */
NB_API nb_status nb_array_identical(const nb_array *a, const nb_array *b, bool *out);
/* numpy.allclose without broadcasting: same shape (dtypes may differ; values compared in
 * double) and |a - b| <= atol + rtol * |b| everywhere; NaN is close to nothing. rtol and
 * atol must be >= 0 (else NB_ERR_INVALID). */
NB_API nb_status nb_array_allclose(const nb_array *a, const nb_array *b, double rtol, double atol,
                                   bool *out);

/* ---- eager reductions (no trace: for metrics and checks on results) ----------------- */
/* Values are read as double (integers exact up to 2^53) and visited in row-major order, so
 * the answers are the same on every run.
 * The sum and the mean of every element (the mean of an empty array is NaN). */
NB_API nb_status nb_array_sum(const nb_array *a, double *out);
NB_API nb_status nb_array_mean(const nb_array *a, double *out);
/* numpy.argmax along axis (negative counts back): a new i64 array of a's shape without that
 * axis, the index of the first largest element (a NaN counts as the largest, as in numpy).
 * NB_ERR_SHAPE for a rank-0 a, an axis out of range or an empty axis. */
NB_API nb_status nb_array_argmax(const nb_array *a, int axis, nb_array **out);
/* How many elements of a and b are equal (same shape, any dtypes, compared as values; NaN
 * equals nothing): with argmax, the number of correct predictions:
 *     nb_array_argmax(logits, -1, &pred);
 *     nb_array_count_equal(pred, labels, &correct); */
NB_API nb_status nb_array_count_equal(const nb_array *a, const nb_array *b, int64_t *out);

/* ---- printing ----------------------------------------------------------------------- */
/* Format a in numpy's style:
 *     array([[0., 1.],
 *            [2., 3.]], dtype=float32)
 * Arrays of more than 1000 elements are summarised with "..." (3 items at each edge).
 * snprintf contract: writes at most cap bytes including the NUL (buf may be NULL when cap
 * is 0) and sets *needed (may be NULL) to the full length without the NUL. Returns NB_OK
 * or NB_ERR_TRUNCATED when the text did not fit (buf then holds a NUL-terminated prefix).
 * Never allocates. */
NB_API nb_status nb_array_format(const nb_array *a, char *buf, size_t cap, size_t *needed);
/* nb_array_format then fputs to f, followed by a newline. Allocates a temporary buffer
 * through the context's allocator. */
NB_API nb_status nb_array_fprint(const nb_array *a, FILE *f);
/* "f32[2,3]" ("f64[]" for rank 0): the signature used in every message. Same snprintf
 * contract as nb_array_format. */
NB_API nb_status nb_array_format_sig(const nb_array *a, char *buf, size_t cap, size_t *needed);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_ARRAY_H */
