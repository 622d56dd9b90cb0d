/*
 * array.c -- dense n-d arrays: shapes, buffers, constructors, element access, comparison.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

/* ---- dtypes ------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
    bool is_float;
} nbi_dtypes[NB_DTYPE_COUNT] = {
    [NB_DTYPE_F32] = {"f32", 4, true},    [NB_DTYPE_F64] = {"f64", 8, true},
    [NB_DTYPE_I32] = {"i32", 4, false},   [NB_DTYPE_I64] = {"i64", 8, false},
    [NB_DTYPE_BOOL] = {"bool", 1, false},
};

static bool nbi_dtype_valid(nb_dtype d) {
    return (int)d >= 0 && (int)d < NB_DTYPE_COUNT;
}

const char *nb_dtype_name(nb_dtype dtype) {
    return nbi_dtype_valid(dtype) ? nbi_dtypes[dtype].name : "?";
}

size_t nb_dtype_size(nb_dtype dtype) {
    return nbi_dtype_valid(dtype) ? nbi_dtypes[dtype].size : 0;
}

bool nb_dtype_is_float(nb_dtype dtype) {
    return nbi_dtype_valid(dtype) && nbi_dtypes[dtype].is_float;
}

/* ---- shapes ------------------------------------------------------------------------- */

nb_status nbi_shape_check(nb_ctx *ctx, const char *fn, nb_dtype dtype, int rank,
                          const int64_t *shape, int64_t *size, size_t *nbytes) {
    if (!nbi_dtype_valid(dtype)) {
        return nbi_err(ctx, NB_ERR_DTYPE,
                       "%s: unknown dtype %d (use NB_DTYPE_F32, F64, I32, I64 or BOOL)", fn,
                       (int)dtype);
    }
    if (rank < 0 || rank > NB_MAX_RANK) {
        return nbi_err(ctx, NB_ERR_SHAPE, "%s: rank %d is outside 0..%d", fn, rank, NB_MAX_RANK);
    }
    if (rank > 0 && shape == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: shape is NULL but rank is %d (pass rank dims, or rank 0 for a scalar)",
                       fn, rank);
    }
    int64_t n = 1;
    bool overflow = false;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0) {
            return nbi_err(ctx, NB_ERR_SHAPE, "%s: dim %d of the shape is %lld; dims must be >= 0",
                           fn, i, (long long)shape[i]);
        }
        if (!overflow && nbi_mul_i64(n, shape[i], &n)) {
            overflow = true;
        }
    }
    /* A zero dim makes the size 0 even if other dims alone would overflow. */
    for (int i = 0; i < rank; i++) {
        if (shape[i] == 0) {
            overflow = false;
            n = 0;
        }
    }
    size_t bytes = 0;
    if (overflow || nbi_mul_size((size_t)n, nbi_dtypes[dtype].size, &bytes) ||
        bytes > (size_t)INT64_MAX - 4096) {
        char sig[NBI_SIG_CAP];
        return nbi_err(ctx, NB_ERR_OVERFLOW,
                       "%s: shape %s has more elements or bytes than can be addressed", fn,
                       nbi_sig(sig, sizeof sig, dtype, rank, shape));
    }
    if (size != NULL) {
        *size = n;
    }
    if (nbytes != NULL) {
        *nbytes = bytes;
    }
    return NB_OK;
}

/* ---- buffers and arrays ------------------------------------------------------------- */

static nbi_buffer *nbi_buffer_new(nb_ctx *ctx, size_t nbytes) {
    size_t total = NBI_ALIGN + (nbytes == 0 ? NBI_ALIGN : nbytes);
    nbi_buffer *b = nbi_alloc(ctx, total, NBI_ALIGN);
    if (b == NULL) {
        return NULL;
    }
    b->refcount = 1;
    b->alloc_size = total;
    b->donate_mark = 0;
    nbi_count_add(ctx, NBI_COUNT_BUFFER, 1);
    return b;
}

static void *nbi_buffer_data(nbi_buffer *b) {
    return (unsigned char *)b + NBI_ALIGN;
}

static void nbi_buffer_release(nb_ctx *ctx, nbi_buffer *b) {
    if (b != NULL && --b->refcount == 0) {
        nbi_count_add(ctx, NBI_COUNT_BUFFER, -1);
        nbi_free(ctx, b, b->alloc_size);
    }
}

/* A new array over buf (one more reference to it) whose elements start at data (NULL: the
 * buffer's start). */
static nb_status nbi_array_wrap(nb_ctx *ctx, const char *fn, nb_dtype dtype, int rank,
                                const int64_t *shape, int64_t size, size_t nbytes, nbi_buffer *buf,
                                void *data, nb_array **out) {
    nb_array *a = nbi_obj_new(ctx, NBI_MAGIC_ARRAY, fn);
    if (a == NULL) {
        return NB_ERR_OOM;
    }
    a->dtype = dtype;
    a->rank = rank;
    for (int i = 0; i < rank; i++) {
        a->shape[i] = shape[i];
    }
    a->size = size;
    a->nbytes = nbytes;
    a->buf = buf;
    a->data = data != NULL ? data : nbi_buffer_data(buf);
    buf->refcount++;
    nbi_count_add(ctx, NBI_COUNT_ARRAY, 1);
    *out = a;
    return NB_OK;
}

nb_status nbi_array_new(nb_ctx *ctx, const char *fn, nb_dtype dtype, int rank, const int64_t *shape,
                        nb_array **out) {
    int64_t size = 0;
    size_t nbytes = 0;
    nb_status st = nbi_shape_check(ctx, fn, dtype, rank, shape, &size, &nbytes);
    if (st != NB_OK) {
        return st;
    }
    nbi_buffer *buf = nbi_buffer_new(ctx, nbytes);
    if (buf == NULL) {
        return nbi_oom(ctx, fn, nbytes + NBI_ALIGN);
    }
    st = nbi_array_wrap(ctx, fn, dtype, rank, shape, size, nbytes, buf, NULL, out);
    nbi_buffer_release(ctx, buf); /* the array holds the only reference now (or none) */
    return st;
}

void nbi_array_free_owned(nb_array *a) {
    nb_ctx *ctx = a->hdr.ctx;
    nbi_buffer_release(ctx, a->buf);
    a->buf = NULL;
    a->data = NULL;
    nbi_count_add(ctx, NBI_COUNT_ARRAY, -1);
}

nb_array *nb_array_retain(nb_array *a) {
    if (!nbi_obj_live(a, NBI_MAGIC_ARRAY)) {
        return NULL;
    }
    a->hdr.refcount++;
    return a;
}

void nb_array_destroy(nb_array *a) {
    if (a == NULL) {
        return;
    }
    if (a->hdr.magic != NBI_MAGIC_ARRAY) {
        nbi_obj_double_destroy(a, "nb_array_destroy");
        return;
    }
    if (--a->hdr.refcount > 0) {
        return;
    }
    nbi_array_free_owned(a);
    nbi_obj_release(&a->hdr);
}

/* ---- element conversion ------------------------------------------------------------- */

double nbi_array_load(const nb_array *a, int64_t i) {
    switch (a->dtype) {
    case NB_DTYPE_F32:
        return ((const float *)a->data)[i];
    case NB_DTYPE_F64:
        return ((const double *)a->data)[i];
    case NB_DTYPE_I32:
        return ((const int32_t *)a->data)[i];
    case NB_DTYPE_I64:
        return (double)((const int64_t *)a->data)[i];
    case NB_DTYPE_BOOL:
        return ((const uint8_t *)a->data)[i] ? 1.0 : 0.0;
    }
    return 0.0;
}

static int64_t nbi_load_i64(const nb_array *a, int64_t i) {
    switch (a->dtype) {
    case NB_DTYPE_I32:
        return ((const int32_t *)a->data)[i];
    case NB_DTYPE_I64:
        return ((const int64_t *)a->data)[i];
    case NB_DTYPE_BOOL:
        return ((const uint8_t *)a->data)[i] ? 1 : 0;
    default:
        return 0;
    }
}

/* Does v convert to dtype without NaN or range trouble? */
static bool nbi_fits(nb_dtype dtype, double v) {
    switch (dtype) {
    case NB_DTYPE_I32:
        return v >= -2147483648.0 && v < 2147483648.0;
    case NB_DTYPE_I64:
        return v >= -9223372036854775808.0 && v < 9223372036854775808.0;
    default:
        return true;
    }
}

static void nbi_store(nb_dtype dtype, void *data, int64_t i, double v) {
    switch (dtype) {
    case NB_DTYPE_F32:
        ((float *)data)[i] = (float)v;
        break;
    case NB_DTYPE_F64:
        ((double *)data)[i] = v;
        break;
    case NB_DTYPE_I32:
        ((int32_t *)data)[i] = (int32_t)v;
        break;
    case NB_DTYPE_I64:
        ((int64_t *)data)[i] = (int64_t)v;
        break;
    case NB_DTYPE_BOOL:
        ((uint8_t *)data)[i] = v != 0.0;
        break;
    }
}

static void nbi_store_i64(nb_dtype dtype, void *data, int64_t i, int64_t v) {
    switch (dtype) {
    case NB_DTYPE_I32:
        ((int32_t *)data)[i] = (int32_t)v;
        break;
    case NB_DTYPE_I64:
        ((int64_t *)data)[i] = v;
        break;
    case NB_DTYPE_BOOL:
        ((uint8_t *)data)[i] = v != 0;
        break;
    default:
        nbi_store(dtype, data, i, (double)v);
        break;
    }
}

static nb_status nbi_value_check(nb_ctx *ctx, const char *fn, nb_dtype dtype, double v) {
    if (!nbi_fits(dtype, v)) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: value %g does not fit dtype %s (NaN, infinite or out of range)", fn, v,
                       nb_dtype_name(dtype));
    }
    return NB_OK;
}

static void nbi_fill(nb_array *a, double v) {
    if (v == 0.0 && !signbit(v)) {
        memset(a->data, 0, a->nbytes);
        return;
    }
    for (int64_t i = 0; i < a->size; i++) {
        nbi_store(a->dtype, a->data, i, v);
    }
}

/* ---- constructors ------------------------------------------------------------------- */

static nb_status nbi_full(nb_ctx *ctx, const char *fn, nb_dtype dtype, int rank,
                          const int64_t *shape, double value, nb_array **out) {
    if (out == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_array * to receive the result)",
                       fn);
    }
    *out = NULL;
    if (ctx == NULL) {
        return NB_ERR_MISUSE;
    }
    if (nbi_dtype_valid(dtype)) {
        nb_status st = nbi_value_check(ctx, fn, dtype, value);
        if (st != NB_OK) {
            return st;
        }
    }
    nb_array *a = NULL;
    nb_status st = nbi_array_new(ctx, fn, dtype, rank, shape, &a);
    if (st != NB_OK) {
        return st;
    }
    nbi_fill(a, value);
    *out = a;
    return NB_OK;
}

nb_status nb_array_zeros(nb_ctx *ctx, nb_dtype dtype, int rank, const int64_t *shape,
                         nb_array **out) {
    return nbi_full(ctx, "nb_array_zeros", dtype, rank, shape, 0.0, out);
}

nb_status nb_array_ones(nb_ctx *ctx, nb_dtype dtype, int rank, const int64_t *shape,
                        nb_array **out) {
    return nbi_full(ctx, "nb_array_ones", dtype, rank, shape, 1.0, out);
}

nb_status nb_array_full(nb_ctx *ctx, nb_dtype dtype, int rank, const int64_t *shape, double value,
                        nb_array **out) {
    return nbi_full(ctx, "nb_array_full", dtype, rank, shape, value, out);
}

nb_status nb_array_scalar(nb_ctx *ctx, nb_dtype dtype, double value, nb_array **out) {
    return nbi_full(ctx, "nb_array_scalar", dtype, 0, NULL, value, out);
}

nb_status nb_array_from_data(nb_ctx *ctx, nb_dtype dtype, int rank, const int64_t *shape,
                             const void *data, nb_array **out) {
    static const char fn[] = "nb_array_from_data";
    if (out == NULL || ctx == NULL) {
        if (out != NULL) {
            *out = NULL;
        }
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_array * to receive the result)",
                       fn);
    }
    *out = NULL;
    nb_array *a = NULL;
    nb_status st = nbi_array_new(ctx, fn, dtype, rank, shape, &a);
    if (st != NB_OK) {
        return st;
    }
    if (a->nbytes > 0) {
        if (data == NULL) {
            nb_array_destroy(a);
            return nbi_err(
                ctx, NB_ERR_MISUSE,
                "%s: data is NULL for %lld elements (pass that many elements of the dtype)", fn,
                (long long)a->size);
        }
        memcpy(a->data, data, a->nbytes);
    }
    if (dtype == NB_DTYPE_BOOL) {
        /* Normalise to 0/1 so that every bool array compares and prints consistently. */
        uint8_t *p = a->data;
        for (int64_t i = 0; i < a->size; i++) {
            p[i] = p[i] != 0;
        }
    }
    *out = a;
    return NB_OK;
}

nb_status nb_array_arange(nb_ctx *ctx, nb_dtype dtype, double start, double stop, double step,
                          nb_array **out) {
    static const char fn[] = "nb_array_arange";
    if (out == NULL || ctx == NULL) {
        if (out != NULL) {
            *out = NULL;
        }
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_array * to receive the result)",
                       fn);
    }
    *out = NULL;
    if (!isfinite(start) || !isfinite(stop) || !isfinite(step) || step == 0.0) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: start %g, stop %g, step %g: all must be finite and step nonzero", fn,
                       start, stop, step);
    }
    double len = ceil((stop - start) / step);
    if (!(len > 0)) {
        len = 0;
    }
    if (len >= 9.0e18) {
        return nbi_err(ctx, NB_ERR_OVERFLOW, "%s: %g elements is too many", fn, len);
    }
    int64_t n = (int64_t)len;
    nb_array *a = NULL;
    nb_status st = nbi_array_new(ctx, fn, dtype, 1, &n, &a);
    if (st != NB_OK) {
        return st;
    }
    for (int64_t i = 0; i < n; i++) {
        double v = start + (double)i * step;
        if (!nbi_fits(dtype, v)) {
            nb_array_destroy(a);
            return nbi_value_check(ctx, fn, dtype, v);
        }
        nbi_store(dtype, a->data, i, v);
    }
    *out = a;
    return NB_OK;
}

nb_status nb_array_linspace(nb_ctx *ctx, nb_dtype dtype, double start, double stop, int64_t num,
                            nb_array **out) {
    static const char fn[] = "nb_array_linspace";
    if (out == NULL || ctx == NULL) {
        if (out != NULL) {
            *out = NULL;
        }
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_array * to receive the result)",
                       fn);
    }
    *out = NULL;
    if (num < 0) {
        return nbi_err(ctx, NB_ERR_SHAPE, "%s: num is %lld; it must be >= 0", fn, (long long)num);
    }
    if (!isfinite(start) || !isfinite(stop)) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: start %g and stop %g must be finite", fn, start,
                       stop);
    }
    nb_array *a = NULL;
    nb_status st = nbi_array_new(ctx, fn, dtype, 1, &num, &a);
    if (st != NB_OK) {
        return st;
    }
    double step = num > 1 ? (stop - start) / (double)(num - 1) : 0.0;
    for (int64_t i = 0; i < num; i++) {
        double v = (num > 1 && i == num - 1) ? stop : start + (double)i * step;
        if (!nbi_fits(dtype, v)) {
            nb_array_destroy(a);
            return nbi_value_check(ctx, fn, dtype, v);
        }
        nbi_store(dtype, a->data, i, v);
    }
    *out = a;
    return NB_OK;
}

nb_status nb_array_eye(nb_ctx *ctx, nb_dtype dtype, int64_t n, int64_t m, int64_t k,
                       nb_array **out) {
    static const char fn[] = "nb_array_eye";
    nb_status st = nbi_full(ctx, fn, dtype, 2, (int64_t[]){n, m}, 0.0, out);
    if (st != NB_OK) {
        return st;
    }
    nb_array *a = *out;
    for (int64_t i = 0; i < n; i++) {
        int64_t j = i + k;
        if (j >= 0 && j < m) {
            nbi_store(dtype, a->data, i * m + j, 1.0);
        }
    }
    return NB_OK;
}

/* ---- copy, cast, reshape ------------------------------------------------------------ */

/* The entry check of an array argument: a NULL, destroyed or wrong-kind handle returns
 * NB_ERR_MISUSE, with a message on the handle's context when it has one. */
#define NBI_CHECK_ARRAY(a, fn)                                                                     \
    do {                                                                                           \
        nb_status check_st_ = nbi_check_handle((a), NBI_MAGIC_ARRAY, (fn), #a);                    \
        if (check_st_ != NB_OK) {                                                                  \
            return check_st_;                                                                      \
        }                                                                                          \
    } while (0)

nb_status nb_array_copy(const nb_array *a, nb_array **out) {
    if (out != NULL) {
        *out = NULL;
    }
    NBI_CHECK_ARRAY(a, "nb_array_copy");
    if (out == NULL) {
        return nbi_err(
            a->hdr.ctx, NB_ERR_MISUSE,
            "nb_array_copy: out is NULL (pass the address of an nb_array * to receive the copy)");
    }
    nb_array *c = NULL;
    nb_status st = nbi_array_new(a->hdr.ctx, "nb_array_copy", a->dtype, a->rank, a->shape, &c);
    if (st != NB_OK) {
        return st;
    }
    if (a->nbytes > 0) {
        memcpy(c->data, a->data, a->nbytes);
    }
    *out = c;
    return NB_OK;
}

nb_status nb_array_cast(const nb_array *a, nb_dtype dtype, nb_array **out) {
    static const char fn[] = "nb_array_cast";
    if (out != NULL) {
        *out = NULL;
    }
    NBI_CHECK_ARRAY(a, fn);
    nb_ctx *ctx = a->hdr.ctx;
    if (out == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_array * to receive the result)",
                       fn);
    }
    nb_array *c = NULL;
    nb_status st = nbi_array_new(ctx, fn, dtype, a->rank, a->shape, &c);
    if (st != NB_OK) {
        return st;
    }
    bool int_src = !nb_dtype_is_float(a->dtype);
    for (int64_t i = 0; i < a->size; i++) {
        if (int_src) {
            int64_t q = nbi_load_i64(a, i);
            if (dtype == NB_DTYPE_I32 && (q < INT32_MIN || q > INT32_MAX)) {
                char sig[NBI_SIG_CAP];
                nb_array_destroy(c);
                return nbi_err(ctx, NB_ERR_INVALID,
                               "%s: element %lld (%lld) of %s does not fit i32 (clip it first)", fn,
                               (long long)i, (long long)q,
                               nbi_sig(sig, sizeof sig, a->dtype, a->rank, a->shape));
            }
            nbi_store_i64(dtype, c->data, i, q);
            continue;
        }
        double v = nbi_array_load(a, i);
        if (!nbi_fits(dtype, v)) {
            char sig[NBI_SIG_CAP];
            nb_array_destroy(c);
            return nbi_err(ctx, NB_ERR_INVALID,
                           "%s: element %lld (%g) of %s does not fit %s (NaN, infinite or "
                           "out of range; clip or mask it first)",
                           fn, (long long)i, v,
                           nbi_sig(sig, sizeof sig, a->dtype, a->rank, a->shape),
                           nb_dtype_name(dtype));
        }
        nbi_store(dtype, c->data, i, v);
    }
    *out = c;
    return NB_OK;
}

nb_status nb_array_reshape(const nb_array *a, int rank, const int64_t *shape, nb_array **out) {
    static const char fn[] = "nb_array_reshape";
    if (out != NULL) {
        *out = NULL;
    }
    NBI_CHECK_ARRAY(a, fn);
    nb_ctx *ctx = a->hdr.ctx;
    if (out == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_array * to receive the result)",
                       fn);
    }
    if (rank < 0 || rank > NB_MAX_RANK) {
        return nbi_err(ctx, NB_ERR_SHAPE, "%s: rank %d is outside 0..%d", fn, rank, NB_MAX_RANK);
    }
    if (rank > 0 && shape == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: shape is NULL but rank is %d (pass rank dims, or rank 0 for a scalar)",
                       fn, rank);
    }
    int64_t dims[NB_MAX_RANK];
    int infer = -1;
    int64_t known = 1;
    char sa[NBI_SIG_CAP], sb[NBI_SIG_CAP];
    for (int i = 0; i < rank; i++) {
        dims[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0) {
                return nbi_err(ctx, NB_ERR_SHAPE,
                               "%s: %s to shape with more than one -1 (dims %d and %d); at "
                               "most one dim can be inferred",
                               fn, nbi_sig(sa, sizeof sa, a->dtype, a->rank, a->shape), infer, i);
            }
            infer = i;
            continue;
        }
        if (shape[i] < 0) {
            return nbi_err(ctx, NB_ERR_SHAPE, "%s: dim %d of the new shape is %lld", fn, i,
                           (long long)shape[i]);
        }
        if (nbi_mul_i64(known, shape[i], &known)) {
            return nbi_err(ctx, NB_ERR_OVERFLOW, "%s: the new shape overflows", fn);
        }
    }
    if (infer >= 0) {
        if (known == 0 || a->size % known != 0) {
            dims[infer] = -1;
            return nbi_err(ctx, NB_ERR_SHAPE,
                           "%s: cannot reshape %s (%lld elements) to %s: the -1 dim cannot be "
                           "inferred",
                           fn, nbi_sig(sa, sizeof sa, a->dtype, a->rank, a->shape),
                           (long long)a->size, nbi_sig(sb, sizeof sb, a->dtype, rank, dims));
        }
        dims[infer] = a->size / known;
        known = a->size;
    }
    if (known != a->size) {
        return nbi_err(ctx, NB_ERR_SHAPE,
                       "%s: cannot reshape %s (%lld elements) to %s (%lld elements); the "
                       "element count must stay the same",
                       fn, nbi_sig(sa, sizeof sa, a->dtype, a->rank, a->shape), (long long)a->size,
                       nbi_sig(sb, sizeof sb, a->dtype, rank, dims), (long long)known);
    }
    return nbi_array_wrap(ctx, fn, a->dtype, rank, dims, a->size, a->nbytes, a->buf, a->data, out);
}

/* ---- views -------------------------------------------------------------------------- */

/* rows [start, stop) of axis 0 (already checked) as a view: rank r (a's, or a's - 1 for one
 * row taken by nb_array_index). */
static nb_status nbi_rows_view(const nb_array *a, const char *fn, int64_t start, int64_t stop,
                               bool drop, nb_array **out) {
    int64_t row = a->shape[0] > 0 ? a->size / a->shape[0] : 0, dims[NB_MAX_RANK];
    int rank = drop ? a->rank - 1 : a->rank;
    for (int i = 0; i < rank; i++) {
        dims[i] = drop ? a->shape[i + 1] : a->shape[i];
    }
    if (!drop) {
        dims[0] = stop - start;
    }
    size_t es = nb_dtype_size(a->dtype);
    int64_t n = (stop - start) * row;
    void *data = (unsigned char *)a->data + (size_t)(start * row) * es;
    return nbi_array_wrap(a->hdr.ctx, fn, a->dtype, rank, dims, n, (size_t)n * es, a->buf, data,
                          out);
}

nb_status nbi_array_row_view(const nb_array *a, const char *fn, int64_t i, nb_array **out) {
    return nbi_rows_view(a, fn, i, i + 1, true, out);
}

static nb_status nbi_view_args(const nb_array *a, const char *fn, nb_array **out) {
    nb_ctx *ctx = a->hdr.ctx;
    char sig[NBI_SIG_CAP];
    if (out == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_array * to receive the view)",
                       fn);
    }
    if (a->rank == 0) {
        return nbi_err(ctx, NB_ERR_SHAPE,
                       "%s: %s has no axis to index (a rank-0 array: read it with "
                       "nb_array_get(a, NULL, &v))",
                       fn, nbi_sig(sig, sizeof sig, a->dtype, a->rank, a->shape));
    }
    return NB_OK;
}

nb_status nb_array_index(const nb_array *a, int64_t i, nb_array **out) {
    static const char fn[] = "nb_array_index";
    if (out != NULL) {
        *out = NULL;
    }
    NBI_CHECK_ARRAY(a, fn);
    nb_status st = nbi_view_args(a, fn, out);
    if (st != NB_OK) {
        return st;
    }
    int64_t n = a->shape[0], j = i < 0 ? i + n : i;
    if (j < 0 || j >= n) {
        char sig[NBI_SIG_CAP];
        return nbi_err(a->hdr.ctx, NB_ERR_INDEX,
                       "%s: index %lld is out of range for axis 0 of %s (valid: %lld..%lld)", fn,
                       (long long)i, nbi_sig(sig, sizeof sig, a->dtype, a->rank, a->shape),
                       (long long)-n, (long long)n - 1);
    }
    return nbi_rows_view(a, fn, j, j + 1, true, out);
}

nb_status nb_array_rows(const nb_array *a, int64_t start, int64_t stop, nb_array **out) {
    static const char fn[] = "nb_array_rows";
    if (out != NULL) {
        *out = NULL;
    }
    NBI_CHECK_ARRAY(a, fn);
    nb_status st = nbi_view_args(a, fn, out);
    if (st != NB_OK) {
        return st;
    }
    int64_t n = a->shape[0];
    int64_t s = start < 0 ? start + n : start, e = stop < 0 ? stop + n : stop;
    if (s < 0 || e > n || s > e) {
        char sig[NBI_SIG_CAP];
        return nbi_err(a->hdr.ctx, NB_ERR_INDEX,
                       "%s: rows %lld..%lld are out of range for axis 0 of %s (start and stop "
                       "in %lld..%lld, negative counting back, start <= stop)",
                       fn, (long long)start, (long long)stop,
                       nbi_sig(sig, sizeof sig, a->dtype, a->rank, a->shape), (long long)-n,
                       (long long)n);
    }
    return nbi_rows_view(a, fn, s, e, false, out);
}

/* ---- accessors ---------------------------------------------------------------------- */

nb_ctx *nb_array_ctx(const nb_array *a) {
    return nbi_obj_live(a, NBI_MAGIC_ARRAY) ? a->hdr.ctx : NULL;
}

nb_dtype nb_array_dtype(const nb_array *a) {
    return nbi_obj_live(a, NBI_MAGIC_ARRAY) ? a->dtype : NB_DTYPE_F32;
}

int nb_array_rank(const nb_array *a) {
    return nbi_obj_live(a, NBI_MAGIC_ARRAY) ? a->rank : -1;
}

const int64_t *nb_array_shape(const nb_array *a) {
    return nbi_obj_live(a, NBI_MAGIC_ARRAY) ? a->shape : NULL;
}

int64_t nb_array_dim(const nb_array *a, int axis) {
    if (!nbi_obj_live(a, NBI_MAGIC_ARRAY)) {
        return -1;
    }
    if (axis < 0) {
        axis += a->rank;
    }
    return (axis >= 0 && axis < a->rank) ? a->shape[axis] : -1;
}

int64_t nb_array_size(const nb_array *a) {
    return nbi_obj_live(a, NBI_MAGIC_ARRAY) ? a->size : -1;
}

size_t nb_array_nbytes(const nb_array *a) {
    return nbi_obj_live(a, NBI_MAGIC_ARRAY) ? a->nbytes : 0;
}

void *nb_array_data(const nb_array *a) {
    return nbi_obj_live(a, NBI_MAGIC_ARRAY) ? a->data : NULL;
}

nb_status nb_array_check(const nb_array *a) {
    return nbi_check_handle(a, NBI_MAGIC_ARRAY, "nb_array_check", "a");
}

/* ---- element access ----------------------------------------------------------------- */

static nb_status nbi_flat_index(const nb_array *a, const char *fn, const int64_t *idx,
                                int64_t *flat) {
    nb_ctx *ctx = a->hdr.ctx;
    if (a->rank > 0 && idx == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: idx is NULL for a rank-%d array (pass one index per axis)", fn,
                       a->rank);
    }
    int64_t f = 0;
    for (int i = 0; i < a->rank; i++) {
        int64_t j = idx[i] < 0 ? idx[i] + a->shape[i] : idx[i];
        if (j < 0 || j >= a->shape[i]) {
            char sig[NBI_SIG_CAP];
            return nbi_err(ctx, NB_ERR_INDEX,
                           "%s: index %lld is out of range for axis %d of %s (valid: %lld..%lld)",
                           fn, (long long)idx[i], i,
                           nbi_sig(sig, sizeof sig, a->dtype, a->rank, a->shape),
                           (long long)-a->shape[i], (long long)a->shape[i] - 1);
        }
        f = f * a->shape[i] + j;
    }
    *flat = f;
    return NB_OK;
}

nb_status nb_array_get(const nb_array *a, const int64_t *idx, double *out) {
    if (out != NULL) {
        *out = 0;
    }
    NBI_CHECK_ARRAY(a, "nb_array_get");
    if (out == NULL) {
        return nbi_err(
            a->hdr.ctx, NB_ERR_MISUSE,
            "nb_array_get: out is NULL (pass the address of a double to receive the element)");
    }
    int64_t f = 0;
    nb_status st = nbi_flat_index(a, "nb_array_get", idx, &f);
    if (st != NB_OK) {
        return st;
    }
    *out = nbi_array_load(a, f);
    return NB_OK;
}

nb_status nb_array_set(nb_array *a, const int64_t *idx, double value) {
    NBI_CHECK_ARRAY(a, "nb_array_set");
    int64_t f = 0;
    nb_status st = nbi_flat_index(a, "nb_array_set", idx, &f);
    if (st == NB_OK) {
        st = nbi_value_check(a->hdr.ctx, "nb_array_set", a->dtype, value);
    }
    if (st != NB_OK) {
        return st;
    }
    nbi_store(a->dtype, a->data, f, value);
    return NB_OK;
}

nb_status nb_array_get_i64(const nb_array *a, const int64_t *idx, int64_t *out) {
    static const char fn[] = "nb_array_get_i64";
    if (out != NULL) {
        *out = 0;
    }
    NBI_CHECK_ARRAY(a, fn);
    if (out == NULL) {
        return nbi_err(a->hdr.ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an int64_t to receive the element)",
                       fn);
    }
    int64_t f = 0;
    nb_status st = nbi_flat_index(a, fn, idx, &f);
    if (st != NB_OK) {
        return st;
    }
    if (nb_dtype_is_float(a->dtype)) {
        double v = nbi_array_load(a, f);
        st = nbi_value_check(a->hdr.ctx, fn, NB_DTYPE_I64, v);
        if (st != NB_OK) {
            return st;
        }
        *out = (int64_t)v;
    } else {
        *out = nbi_load_i64(a, f);
    }
    return NB_OK;
}

nb_status nb_array_set_i64(nb_array *a, const int64_t *idx, int64_t value) {
    static const char fn[] = "nb_array_set_i64";
    NBI_CHECK_ARRAY(a, fn);
    int64_t f = 0;
    nb_status st = nbi_flat_index(a, fn, idx, &f);
    if (st != NB_OK) {
        return st;
    }
    if (a->dtype == NB_DTYPE_I32 && (value < INT32_MIN || value > INT32_MAX)) {
        return nbi_err(a->hdr.ctx, NB_ERR_INVALID, "%s: value %lld does not fit i32", fn,
                       (long long)value);
    }
    nbi_store_i64(a->dtype, a->data, f, value);
    return NB_OK;
}

nb_status nb_array_get_flat(const nb_array *a, int64_t i, double *out) {
    static const char fn[] = "nb_array_get_flat";
    if (out != NULL) {
        *out = 0;
    }
    NBI_CHECK_ARRAY(a, fn);
    if (out == NULL) {
        return nbi_err(a->hdr.ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of a double to receive the element)", fn);
    }
    if (i < 0 || i >= a->size) {
        return nbi_err(a->hdr.ctx, NB_ERR_INDEX, "%s: flat index %lld is outside 0..%lld", fn,
                       (long long)i, (long long)a->size - 1);
    }
    *out = nbi_array_load(a, i);
    return NB_OK;
}

/* ---- comparison --------------------------------------------------------------------- */

static bool nbi_same_sig(const nb_array *a, const nb_array *b) {
    if (a->dtype != b->dtype || a->rank != b->rank) {
        return false;
    }
    for (int i = 0; i < a->rank; i++) {
        if (a->shape[i] != b->shape[i]) {
            return false;
        }
    }
    return true;
}

static bool nbi_same_shape(const nb_array *a, const nb_array *b) {
    if (a->rank != b->rank) {
        return false;
    }
    for (int i = 0; i < a->rank; i++) {
        if (a->shape[i] != b->shape[i]) {
            return false;
        }
    }
    return true;
}

bool nbi_array_values_equal(const nb_array *a, const nb_array *b, int64_t *where) {
    if (where != NULL) {
        *where = -1;
    }
    if (!nbi_same_sig(a, b)) {
        return false;
    }
    for (int64_t i = 0; i < a->size; i++) {
        bool eq;
        switch (a->dtype) {
        case NB_DTYPE_F32:
            eq = ((const float *)a->data)[i] == ((const float *)b->data)[i];
            break;
        case NB_DTYPE_F64:
            eq = ((const double *)a->data)[i] == ((const double *)b->data)[i];
            break;
        default:
            eq = nbi_load_i64(a, i) == nbi_load_i64(b, i);
            break;
        }
        if (!eq) {
            if (where != NULL) {
                *where = i;
            }
            return false;
        }
    }
    return true;
}

/* The entry checks of the comparisons: two live arrays (of one context) and an out. */
static nb_status nbi_array_pair_check(const nb_array *a, const nb_array *b, const bool *out,
                                      const char *fn) {
    nb_ctx *ctx = nbi_handle_ctx(a) != NULL ? nbi_handle_ctx(a) : nbi_handle_ctx(b);
    nb_status st = nbi_check_handle_in(ctx, a, NBI_MAGIC_ARRAY, fn, "a");
    if (st == NB_OK) {
        st = nbi_check_handle_in(ctx, b, NBI_MAGIC_ARRAY, fn, "b");
    }
    if (st == NB_OK && out == NULL) {
        st = nbi_err_null(ctx, fn, "out", "pass the address of a bool to receive the answer");
    }
    return st;
}

nb_status nb_array_equal(const nb_array *a, const nb_array *b, bool *out) {
    if (out != NULL) {
        *out = false;
    }
    nb_status st = nbi_array_pair_check(a, b, out, "nb_array_equal");
    if (st != NB_OK) {
        return st;
    }
    *out = nbi_array_values_equal(a, b, NULL);
    return NB_OK;
}

nb_status nb_array_identical(const nb_array *a, const nb_array *b, bool *out) {
    if (out != NULL) {
        *out = false;
    }
    nb_status st = nbi_array_pair_check(a, b, out, "nb_array_identical");
    if (st != NB_OK) {
        return st;
    }
    *out = nbi_same_sig(a, b) && (a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
    return NB_OK;
}

/* ---- eager reductions ---------------------------------------------------------------- */

static nb_status nbi_reduce_args(const nb_array *a, const void *out, const char *fn,
                                 const char *what) {
    NBI_CHECK_ARRAY(a, fn);
    if (out == NULL) {
        return nbi_err_null(a->hdr.ctx, fn, "out", what);
    }
    return NB_OK;
}

/* the elements' sum in double, in row-major order */
static double nbi_array_total(const nb_array *a) {
    double s = 0.0;
    for (int64_t i = 0; i < a->size; i++) {
        s += nbi_array_load(a, i);
    }
    return s;
}

nb_status nb_array_sum(const nb_array *a, double *out) {
    static const char fn[] = "nb_array_sum";
    if (out != NULL) {
        *out = 0.0;
    }
    nb_status st = nbi_reduce_args(a, out, fn, "pass the address of a double for the sum");
    if (st != NB_OK) {
        return st;
    }
    *out = nbi_array_total(a);
    return NB_OK;
}

nb_status nb_array_mean(const nb_array *a, double *out) {
    static const char fn[] = "nb_array_mean";
    if (out != NULL) {
        *out = 0.0;
    }
    nb_status st = nbi_reduce_args(a, out, fn, "pass the address of a double for the mean");
    if (st != NB_OK) {
        return st;
    }
    *out = a->size > 0 ? nbi_array_total(a) / (double)a->size : NAN;
    return NB_OK;
}

nb_status nb_array_argmax(const nb_array *a, int axis, nb_array **out) {
    static const char fn[] = "nb_array_argmax";
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbi_reduce_args(a, out, fn, "pass the address of an nb_array * for the indices");
    if (st != NB_OK) {
        return st;
    }
    char sig[NBI_SIG_CAP];
    int ax = axis < 0 ? axis + a->rank : axis;
    if (a->rank == 0 || ax < 0 || ax >= a->rank) {
        return nbi_err(
            a->hdr.ctx, NB_ERR_SHAPE, "%s: axis %d is out of range for %s (valid: %d..%d)", fn,
            axis, nbi_sig(sig, sizeof sig, a->dtype, a->rank, a->shape), -a->rank, a->rank - 1);
    }
    int64_t len = a->shape[ax], outer = 1, inner = 1, dims[NB_MAX_RANK];
    if (len == 0) {
        return nbi_err(a->hdr.ctx, NB_ERR_SHAPE,
                       "%s: axis %d of %s is empty: an empty axis has no largest element", fn, axis,
                       nbi_sig(sig, sizeof sig, a->dtype, a->rank, a->shape));
    }
    for (int d = 0, r = 0; d < a->rank; d++) {
        if (d != ax) {
            dims[r++] = a->shape[d];
        }
        if (d < ax) {
            outer *= a->shape[d];
        } else if (d > ax) {
            inner *= a->shape[d];
        }
    }
    st = nbi_array_new(a->hdr.ctx, fn, NB_DTYPE_I64, a->rank - 1, dims, out);
    if (st != NB_OK) {
        return st;
    }
    int64_t *o = (*out)->data;
    for (int64_t i = 0; i < outer; i++) {
        for (int64_t j = 0; j < inner; j++) {
            int64_t best = 0, base = i * len * inner + j;
            double bv = nbi_array_load(a, base);
            for (int64_t q = 1; q < len && !isnan(bv); q++) { /* numpy: the first NaN wins */
                double v = nbi_array_load(a, base + q * inner);
                if (v > bv || isnan(v)) {
                    bv = v;
                    best = q;
                }
            }
            o[i * inner + j] = best;
        }
    }
    return NB_OK;
}

nb_status nb_array_count_equal(const nb_array *a, const nb_array *b, int64_t *out) {
    static const char fn[] = "nb_array_count_equal";
    if (out != NULL) {
        *out = 0;
    }
    nb_ctx *ctx = nbi_handle_ctx(a) != NULL ? nbi_handle_ctx(a) : nbi_handle_ctx(b);
    nb_status st = nbi_check_handle_in(ctx, a, NBI_MAGIC_ARRAY, fn, "a");
    if (st == NB_OK) {
        st = nbi_check_handle_in(ctx, b, NBI_MAGIC_ARRAY, fn, "b");
    }
    if (st == NB_OK && out == NULL) {
        st = nbi_err_null(ctx, fn, "out", "pass the address of an int64_t for the count");
    }
    if (st != NB_OK) {
        return st;
    }
    if (!nbi_same_shape(a, b)) {
        char sa[NBI_SIG_CAP], sb[NBI_SIG_CAP];
        return nbi_err(ctx, NB_ERR_SHAPE,
                       "%s: a %s and b %s differ in shape; they are compared element by element "
                       "(no broadcasting)",
                       fn, nbi_sig(sa, sizeof sa, a->dtype, a->rank, a->shape),
                       nbi_sig(sb, sizeof sb, b->dtype, b->rank, b->shape));
    }
    int64_t n = 0;
    for (int64_t i = 0; i < a->size; i++) {
        n += nbi_array_load(a, i) == nbi_array_load(b, i);
    }
    *out = n;
    return NB_OK;
}

nb_status nb_array_allclose(const nb_array *a, const nb_array *b, double rtol, double atol,
                            bool *out) {
    if (out != NULL) {
        *out = false;
    }
    nb_status st = nbi_array_pair_check(a, b, out, "nb_array_allclose");
    if (st != NB_OK) {
        return st;
    }
    if (!(rtol >= 0.0) || !(atol >= 0.0)) {
        return nbi_err(a->hdr.ctx, NB_ERR_INVALID,
                       "nb_array_allclose: rtol %g and atol %g must both be >= 0", rtol, atol);
    }
    if (!nbi_same_shape(a, b)) {
        return NB_OK;
    }
    for (int64_t i = 0; i < a->size; i++) {
        double x = nbi_array_load(a, i), y = nbi_array_load(b, i);
        if (x == y) {
            continue; /* also equal infinities */
        }
        if (!(fabs(x - y) <= atol + rtol * fabs(y))) {
            return NB_OK;
        }
    }
    *out = true;
    return NB_OK;
}
