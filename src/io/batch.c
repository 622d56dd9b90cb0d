/*
 * batch.c -- train/test splits, standardisation and shuffled minibatches (nabla/data.h).
 *
 * The shuffles are the permutations of random.c (the same code as nb_random_permutation,
 * through random_internal.h), so they are reproducible from a key on any machine. A batcher
 * keeps its permutation and the permutation's sort buffers in two arrays made once, so an
 * epoch and its batches run without allocating.
 */
#include "core/internal.h"
#include "core/random_internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

struct nb_batcher {
    nbi_obj hdr;
    nb_array *x, *y;   /* retained; y may be NULL */
    nb_array *perm;    /* i64[n]: this epoch's order of the rows */
    nb_array *scratch; /* i64[2n]: the permutation's sort buffers (16 bytes a row) */
    uint32_t k0, k1;
    int64_t n, batch_size, n_batches;
    int64_t next; /* the next batch of this epoch */
    int64_t epoch;
    bool drop_last;
};

/* A batcher lives in an object block of the context's pool, like an array (so a destroyed
 * handle is detected while its block is not reused). */
_Static_assert(sizeof(struct nb_batcher) <= sizeof(struct nb_array),
               "a batcher fits an object block");

/* ---- helpers ------------------------------------------------------------------------ */

/* ctx: where a NULL key is reported (the other arguments' context). */
static nb_status nbi_data_key(nb_ctx *ctx, const nb_array *key, const char *fn, uint32_t *k0,
                              uint32_t *k1) {
    nb_status st = nbi_check_handle_in(ctx, key, NBI_MAGIC_ARRAY, fn, "key");
    if (st != NB_OK) {
        return st;
    }
    if (key->dtype != NB_DTYPE_I32 || key->rank != 1 || key->shape[0] != 2) {
        char sig[NBI_SIG_CAP];
        return nbi_err(key->hdr.ctx, NB_ERR_SHAPE,
                       "%s: key is %s; a key is an i32[2] array (make one with nb_random_key)", fn,
                       nbi_sig(sig, sizeof sig, key->dtype, key->rank, key->shape));
    }
    const int32_t *w = key->data;
    *k0 = (uint32_t)w[0];
    *k1 = (uint32_t)w[1];
    return NB_OK;
}

/* Bytes of one row (the elements after axis 0) of a. */
static size_t nbi_row_bytes(const nb_array *a) {
    return a->shape[0] > 0 ? a->nbytes / (size_t)a->shape[0] : 0;
}

/* x (and y, if not NULL) are live arrays of rank >= 1 with the same number of rows. */
static nb_status nbi_data_rows(const char *fn, const nb_array *x, const nb_array *y) {
    nb_ctx *ctx = nbi_handle_ctx(x) != NULL ? nbi_handle_ctx(x) : nbi_handle_ctx(y);
    nb_status st = nbi_check_handle_in(ctx, x, NBI_MAGIC_ARRAY, fn, "x");
    if (st == NB_OK && y != NULL) {
        st = nbi_check_handle_in(ctx, y, NBI_MAGIC_ARRAY, fn, "y");
    }
    if (st != NB_OK) {
        return st;
    }
    char sx[NBI_SIG_CAP], sy[NBI_SIG_CAP];
    nbi_sig(sx, sizeof sx, x->dtype, x->rank, x->shape);
    if (y != NULL) {
        nbi_sig(sy, sizeof sy, y->dtype, y->rank, y->shape);
    }
    if (x->rank == 0 || (y != NULL && y->rank == 0)) {
        return nbi_err(x->hdr.ctx, NB_ERR_SHAPE,
                       "%s: %s is %s; samples are the rows (axis 0) of x and y, so both need "
                       "rank >= 1 (reshape a scalar to [1])",
                       fn, x->rank == 0 ? "x" : "y", x->rank == 0 ? sx : sy);
    }
    if (y != NULL && y->shape[0] != x->shape[0]) {
        return nbi_err(x->hdr.ctx, NB_ERR_SHAPE,
                       "%s: x is %s but y is %s: they need the same number of rows (axis 0), "
                       "one label per sample",
                       fn, sx, sy);
    }
    return NB_OK;
}

/* dst's rows = src's rows idx[0 .. m). */
static void nbi_gather_rows(const nb_array *src, const int64_t *idx, int64_t m, nb_array *dst) {
    size_t rb = nbi_row_bytes(src);
    const unsigned char *s = src->data;
    unsigned char *d = dst->data;
    for (int64_t i = 0; i < m; i++) {
        memcpy(d + (size_t)i * rb, s + (size_t)idx[i] * rb, rb);
    }
}

/* A new array of src's dtype and shape with m rows, holding src's rows idx[0 .. m). */
static nb_status nbi_take_rows(const char *fn, const nb_array *src, const int64_t *idx, int64_t m,
                               nb_array **out) {
    int64_t shape[NB_MAX_RANK];
    memcpy(shape, src->shape, sizeof shape);
    shape[0] = m;
    nb_status st = nbi_array_new(src->hdr.ctx, fn, src->dtype, src->rank, shape, out);
    if (st == NB_OK) {
        nbi_gather_rows(src, idx, m, *out);
    }
    return st;
}

/* ---- split -------------------------------------------------------------------------- */

nb_status nb_data_split(const nb_array *x, const nb_array *y, const nb_array *key,
                        double test_fraction, nb_array **x_train, nb_array **y_train,
                        nb_array **x_test, nb_array **y_test) {
    static const char fn[] = "nb_data_split";
    nb_array **outs[4] = {x_train, y_train, x_test, y_test};
    for (int i = 0; i < 4; i++) {
        if (outs[i] != NULL) {
            *outs[i] = NULL;
        }
    }
    nb_status st = nbi_data_rows(fn, x, y);
    if (st != NB_OK) {
        return st;
    }
    nb_ctx *ctx = x->hdr.ctx;
    if (x_train == NULL || x_test == NULL || (y != NULL && (y_train == NULL || y_test == NULL))) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: a NULL out-parameter (x_train and x_test are "
                       "required, and y_train and y_test when y is given)",
                       fn);
    }
    uint32_t k0 = 0, k1 = 0;
    st = nbi_data_key(ctx, key, fn, &k0, &k1);
    if (st != NB_OK) {
        return st;
    }
    int64_t n = x->shape[0];
    char sx[NBI_SIG_CAP];
    nbi_sig(sx, sizeof sx, x->dtype, x->rank, x->shape);
    if (!(test_fraction >= 0.0 && test_fraction < 1.0)) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: test_fraction is %g; it must be in [0, 1) (e.g. 0.2 for a fifth of "
                       "the rows)",
                       fn, test_fraction);
    }
    /* to nearest, halves up; a product within rounding error of .5 counts as a half */
    double t = test_fraction * (double)n;
    int64_t n_test = (int64_t)floor(t + 0.5 + 8 * DBL_EPSILON * t);
    if (n_test > n) {
        n_test = n;
    }
    if (n - n_test < 1 || n > NBI_RNG_PERM_MAX) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: x is %s: a test_fraction of %g takes %lld of its %lld rows and "
                       "leaves none to train on (lower it, or use more rows)",
                       fn, sx, test_fraction, (long long)n_test, (long long)n);
    }
    size_t bytes = (size_t)n * sizeof(int64_t) + nbi_rng_permutation_scratch(n);
    int64_t *perm = nbi_alloc(ctx, bytes, 16);
    if (perm == NULL) {
        return nbi_oom(ctx, fn, bytes);
    }
    nbi_rng_permutation(k0, k1, n, perm, perm + n);
    st = nbi_take_rows(fn, x, perm + n_test, n - n_test, x_train);
    if (st == NB_OK) {
        st = nbi_take_rows(fn, x, perm, n_test, x_test);
    }
    if (st == NB_OK && y != NULL) {
        st = nbi_take_rows(fn, y, perm + n_test, n - n_test, y_train);
    }
    if (st == NB_OK && y != NULL) {
        st = nbi_take_rows(fn, y, perm, n_test, y_test);
    }
    nbi_free(ctx, perm, bytes);
    if (st != NB_OK) {
        for (int i = 0; i < 4; i++) {
            if (outs[i] != NULL) {
                nb_array_destroy(*outs[i]);
                *outs[i] = NULL;
            }
        }
    }
    return st;
}

/* ---- standardisation ---------------------------------------------------------------- */

/* x is a live f32/f64 array of rank >= 1; if ref is not NULL, x has its dtype and feature
 * shape. what names x in messages. */
static nb_status nbi_std_check(const char *fn, const char *what, const nb_array *x,
                               const nb_array *ref) {
    nb_status st = nbi_check_handle_in(ref ? ref->hdr.ctx : NULL, x, NBI_MAGIC_ARRAY, fn, what);
    if (st != NB_OK) {
        return st;
    }
    char sx[NBI_SIG_CAP], sr[NBI_SIG_CAP];
    nbi_sig(sx, sizeof sx, x->dtype, x->rank, x->shape);
    if (x->dtype != NB_DTYPE_F32 && x->dtype != NB_DTYPE_F64) {
        return nbi_err(x->hdr.ctx, NB_ERR_DTYPE,
                       "%s: %s is %s; standardised features are f32 or f64 (convert with "
                       "nb_array_cast first)",
                       fn, what, sx);
    }
    if (x->rank == 0) {
        return nbi_err(x->hdr.ctx, NB_ERR_SHAPE,
                       "%s: %s is %s; samples are rows (axis 0), so it needs rank >= 1", fn, what,
                       sx);
    }
    if (ref != NULL) {
        nbi_sig(sr, sizeof sr, ref->dtype, ref->rank, ref->shape);
        bool same = x->dtype == ref->dtype && x->rank == ref->rank;
        for (int d = 1; same && d < x->rank; d++) {
            same = x->shape[d] == ref->shape[d];
        }
        if (!same) {
            return nbi_err(x->hdr.ctx, x->dtype != ref->dtype ? NB_ERR_DTYPE : NB_ERR_SHAPE,
                           "%s: train is %s but %s is %s: they need the same dtype and the same "
                           "shape after axis 0 (the features)",
                           fn, sr, what, sx);
        }
    }
    return NB_OK;
}

static double nbi_elem(const nb_array *a, int64_t i) {
    return a->dtype == NB_DTYPE_F32 ? (double)((const float *)a->data)[i]
                                    : ((const double *)a->data)[i];
}

/* x = (x - mean) / std per feature (x - mean where std is 0); stats are doubles. */
static void nbi_std_apply(nb_array *x, const double *mean, const double *sd, int64_t nf) {
    int64_t rows = x->shape[0];
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t f = 0; f < nf; f++) {
            int64_t i = r * nf + f;
            double v = nbi_elem(x, i) - mean[f];
            v = sd[f] != 0.0 ? v / sd[f] : v;
            if (x->dtype == NB_DTYPE_F32) {
                ((float *)x->data)[i] = (float)v;
            } else {
                ((double *)x->data)[i] = v;
            }
        }
    }
}

nb_status nb_data_standardize(nb_array *train, nb_array *test, nb_array **mean, nb_array **std) {
    static const char fn[] = "nb_data_standardize";
    if (mean != NULL) {
        *mean = NULL;
    }
    if (std != NULL) {
        *std = NULL;
    }
    nb_status st = nbi_check_handle_in(nbi_handle_ctx(test), train, NBI_MAGIC_ARRAY, fn, "train");
    if (st == NB_OK) {
        st = nbi_std_check(fn, "train", train, NULL);
    }
    if (st == NB_OK && test != NULL) {
        st = nbi_std_check(fn, "test", test, train);
    }
    if (st != NB_OK) {
        return st;
    }
    nb_ctx *ctx = train->hdr.ctx;
    int64_t rows = train->shape[0], nf = rows > 0 ? train->size / rows : 0;
    if (rows == 0) {
        char s[NBI_SIG_CAP];
        return nbi_err(ctx, NB_ERR_SHAPE, "%s: train is %s; the statistics need at least one row",
                       fn, nbi_sig(s, sizeof s, train->dtype, train->rank, train->shape));
    }
    nb_array *m = NULL, *sd = NULL;
    size_t bytes = 2 * (size_t)nf * sizeof(double);
    double *acc = nbi_alloc(ctx, bytes > 0 ? bytes : 1, 16);
    if (acc == NULL) {
        return nbi_oom(ctx, fn, bytes);
    }
    st = nbi_array_new(ctx, fn, train->dtype, train->rank - 1, train->shape + 1, &m);
    if (st == NB_OK) {
        st = nbi_array_new(ctx, fn, train->dtype, train->rank - 1, train->shape + 1, &sd);
    }
    if (st != NB_OK) {
        nb_array_destroy(m);
        nbi_free(ctx, acc, bytes > 0 ? bytes : 1);
        return st;
    }
    /* two passes in double: the mean, then the mean squared deviation; a feature whose
     * rows all hold the same value gets std exactly 0 (not a rounding residue) */
    double *mu = acc, *s2 = acc + nf;
    for (int64_t f = 0; f < nf; f++) {
        double sum = 0;
        for (int64_t r = 0; r < rows; r++) {
            sum += nbi_elem(train, r * nf + f);
        }
        mu[f] = sum / (double)rows;
        double first = nbi_elem(train, f), ss = 0;
        bool constant = true;
        for (int64_t r = 0; r < rows; r++) {
            double v = nbi_elem(train, r * nf + f);
            constant = constant && v == first;
            ss += (v - mu[f]) * (v - mu[f]);
        }
        if (constant) {
            mu[f] = first;
        }
        s2[f] = constant ? 0.0 : sqrt(ss / (double)rows);
    }
    /* the statistics as returned, rounded to the dtype, are the ones applied */
    for (int64_t f = 0; f < nf; f++) {
        if (train->dtype == NB_DTYPE_F32) {
            ((float *)m->data)[f] = (float)mu[f];
            ((float *)sd->data)[f] = (float)s2[f];
            mu[f] = (double)(float)mu[f];
            s2[f] = (double)(float)s2[f];
        } else {
            ((double *)m->data)[f] = mu[f];
            ((double *)sd->data)[f] = s2[f];
        }
    }
    nbi_std_apply(train, mu, s2, nf);
    if (test != NULL) {
        nbi_std_apply(test, mu, s2, nf);
    }
    nbi_free(ctx, acc, bytes > 0 ? bytes : 1);
    if (mean != NULL) {
        *mean = m;
    } else {
        nb_array_destroy(m);
    }
    if (std != NULL) {
        *std = sd;
    } else {
        nb_array_destroy(sd);
    }
    return NB_OK;
}

nb_status nb_data_standardize_apply(nb_array *x, const nb_array *mean, const nb_array *std) {
    static const char fn[] = "nb_data_standardize_apply";
    nb_ctx *hint = nbi_handle_ctx(mean) != NULL ? nbi_handle_ctx(mean) : nbi_handle_ctx(std);
    nb_status st = nbi_check_handle_in(hint, x, NBI_MAGIC_ARRAY, fn, "x");
    if (st == NB_OK) {
        st = nbi_std_check(fn, "x", x, NULL);
    }
    if (st != NB_OK) {
        return st;
    }
    char sx[NBI_SIG_CAP], sm[NBI_SIG_CAP], ss[NBI_SIG_CAP];
    nbi_sig(sx, sizeof sx, x->dtype, x->rank, x->shape);
    const nb_array *stats[2] = {mean, std};
    for (int k = 0; k < 2; k++) {
        const nb_array *a = stats[k];
        st = nbi_check_handle_in(x->hdr.ctx, a, NBI_MAGIC_ARRAY, fn, k ? "std" : "mean");
        if (st != NB_OK) {
            return st;
        }
        bool same = a->dtype == x->dtype && a->rank == x->rank - 1 &&
                    memcmp(a->shape, x->shape + 1, (size_t)a->rank * sizeof(int64_t)) == 0;
        if (!same) {
            nbi_sig(sm, sizeof sm, a->dtype, a->rank, a->shape);
            nbi_sig(ss, sizeof ss, x->dtype, x->rank - 1, x->shape + 1);
            return nbi_err(x->hdr.ctx, a->dtype != x->dtype ? NB_ERR_DTYPE : NB_ERR_SHAPE,
                           "%s: x is %s but %s is %s; it must be %s (one value per feature, as "
                           "nb_data_standardize returns it)",
                           fn, sx, k ? "std" : "mean", sm, ss);
        }
    }
    int64_t rows = x->shape[0], nf = mean->size;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t f = 0; f < nf; f++) {
            int64_t i = r * nf + f;
            double m = nbi_elem(mean, f), s = nbi_elem(std, f);
            double v = nbi_elem(x, i) - m;
            v = s != 0.0 ? v / s : v;
            if (x->dtype == NB_DTYPE_F32) {
                ((float *)x->data)[i] = (float)v;
            } else {
                ((double *)x->data)[i] = v;
            }
        }
    }
    return NB_OK;
}

/* ---- the batcher -------------------------------------------------------------------- */

nb_batcher_opts nb_batcher_opts_default(void) {
    nb_batcher_opts o;
    memset(&o, 0, sizeof o);
    o.drop_last = true;
    return o;
}

static bool nbi_batcher_live(const nb_batcher *b) {
    return nbi_obj_live(b, NBI_MAGIC_BATCHER);
}

/* Draw epoch e's permutation into b->perm and rewind. */
static void nbi_batcher_shuffle(nb_batcher *b, int64_t e) {
    int32_t k[2];
    nbi_rng_fold_in(b->k0, b->k1, (uint32_t)e, k);
    nbi_rng_permutation((uint32_t)k[0], (uint32_t)k[1], b->n, b->perm->data, b->scratch->data);
    b->epoch = e;
    b->next = 0;
}

nb_status nb_batcher_create(const nb_array *x, const nb_array *y, const nb_array *key,
                            int64_t batch_size, const nb_batcher_opts *opts, nb_batcher **out) {
    static const char fn[] = "nb_batcher_create";
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbi_data_rows(fn, x, y);
    if (st != NB_OK) {
        return st;
    }
    nb_ctx *ctx = x->hdr.ctx;
    if (out == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_batcher * to receive it)", fn);
    }
    uint32_t k0 = 0, k1 = 0;
    st = nbi_data_key(ctx, key, fn, &k0, &k1);
    if (st != NB_OK) {
        return st;
    }
    int64_t n = x->shape[0];
    if (batch_size < 1 || batch_size > n || n > NBI_RNG_PERM_MAX) {
        char sx[NBI_SIG_CAP];
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: batch_size %lld for x %s; it must be between 1 and the number of "
                       "rows, %lld",
                       fn, (long long)batch_size,
                       nbi_sig(sx, sizeof sx, x->dtype, x->rank, x->shape), (long long)n);
    }
    nb_batcher_opts o = opts != NULL ? *opts : nb_batcher_opts_default();
    nb_batcher *b = nbi_obj_new(ctx, NBI_MAGIC_BATCHER, fn);
    if (b == NULL) {
        return NB_ERR_OOM;
    }
    int64_t two_n = 2 * n;
    st = nbi_array_new(ctx, fn, NB_DTYPE_I64, 1, &n, &b->perm);
    if (st == NB_OK) {
        st = nbi_array_new(ctx, fn, NB_DTYPE_I64, 1, &two_n, &b->scratch);
    }
    if (st != NB_OK) {
        nb_array_destroy(b->perm);
        nbi_obj_release(&b->hdr);
        return st;
    }
    b->x = nb_array_retain((nb_array *)x);
    b->y = y != NULL ? nb_array_retain((nb_array *)y) : NULL;
    b->k0 = k0;
    b->k1 = k1;
    b->n = n;
    b->batch_size = batch_size;
    b->drop_last = o.drop_last;
    b->n_batches = o.drop_last ? n / batch_size : (n + batch_size - 1) / batch_size;
    nbi_batcher_shuffle(b, 0);
    *out = b;
    return NB_OK;
}

void nb_batcher_destroy(nb_batcher *b) {
    if (b == NULL) {
        return;
    }
    if (!nbi_batcher_live(b)) {
        if (b->hdr.magic == NBI_MAGIC_DEAD) {
            nbi_obj_double_destroy(b, "nb_batcher_destroy");
        }
        return;
    }
    nb_array_destroy(b->x);
    nb_array_destroy(b->y);
    nb_array_destroy(b->perm);
    nb_array_destroy(b->scratch);
    nbi_obj_release(&b->hdr);
}

int64_t nb_batcher_num_batches(const nb_batcher *b) {
    return nbi_batcher_live(b) ? b->n_batches : -1;
}

nb_status nb_batcher_epoch(nb_batcher *b, int64_t e) {
    nb_status st = nbi_check_handle(b, NBI_MAGIC_BATCHER, "nb_batcher_epoch", "b");
    if (st != NB_OK) {
        return st;
    }
    if (e < 0 || e > (int64_t)UINT32_MAX) {
        return nbi_err(b->hdr.ctx, NB_ERR_INVALID,
                       "nb_batcher_epoch: epoch %lld; epochs are 0 .. 2^32 - 1 (the data of "
                       "nb_random_fold_in)",
                       (long long)e);
    }
    nbi_batcher_shuffle(b, e);
    return NB_OK;
}

/* dst must be src's dtype and shape with `rows` rows. */
static nb_status nbi_batch_check(const nb_batcher *b, const char *fn, const char *what,
                                 const nb_array *dst, const nb_array *src, int64_t rows) {
    nb_status st = nbi_check_handle_in(b->hdr.ctx, dst, NBI_MAGIC_ARRAY, fn, what);
    if (st != NB_OK) {
        return st;
    }
    bool same = dst->dtype == src->dtype && dst->rank == src->rank && dst->shape[0] == rows;
    for (int d = 1; same && d < src->rank; d++) {
        same = dst->shape[d] == src->shape[d];
    }
    if (same) {
        return NB_OK;
    }
    int64_t want[NB_MAX_RANK];
    memcpy(want, src->shape, sizeof want);
    want[0] = rows;
    char sd[NBI_SIG_CAP], sw[NBI_SIG_CAP], ss[NBI_SIG_CAP];
    return nbi_err(b->hdr.ctx, dst->dtype != src->dtype ? NB_ERR_DTYPE : NB_ERR_SHAPE,
                   "%s: %s is %s; a batch of %s %s needs %s (%lld rows): make it "
                   "once with nb_array_zeros and pass it to every call",
                   fn, what, nbi_sig(sd, sizeof sd, dst->dtype, dst->rank, dst->shape),
                   what[0] == 'x' ? "x" : "y",
                   nbi_sig(ss, sizeof ss, src->dtype, src->rank, src->shape),
                   nbi_sig(sw, sizeof sw, src->dtype, src->rank, want), (long long)rows);
}

/* The rows of the next batch (0 at the end of the epoch). */
static int64_t nbi_batch_rows(const nb_batcher *b) {
    if (b->next >= b->n_batches) {
        return 0;
    }
    int64_t left = b->n - b->next * b->batch_size;
    return left < b->batch_size ? left : b->batch_size;
}

/* nb_batcher_next and nb_batcher_next_rows: rows first .. first + count - 1 of the next
 * batch (count = batch_size, first = 0 for the whole batch). */
static nb_status nbi_batcher_next(const char *fn, nb_batcher *b, int64_t first, int64_t count,
                                  nb_array *xb, nb_array *yb, int64_t *rows) {
    if (rows != NULL) {
        *rows = 0;
    }
    nb_ctx *other = nbi_handle_ctx(xb) != NULL ? nbi_handle_ctx(xb) : nbi_handle_ctx(yb);
    nb_status cst = nbi_check_handle_in(other, b, NBI_MAGIC_BATCHER, fn, "b");
    if (cst != NB_OK) {
        return cst;
    }
    if (rows == NULL) {
        return nbi_err(b->hdr.ctx, NB_ERR_MISUSE,
                       "%s: rows is NULL (pass the address of an int64_t to receive the batch's "
                       "row count)",
                       fn);
    }
    if (yb != NULL && b->y == NULL) {
        return nbi_err(b->hdr.ctx, NB_ERR_MISUSE,
                       "%s: a yb was passed but the batcher has no labels (pass y to "
                       "nb_batcher_create, or NULL here)",
                       fn);
    }
    if (first < 0 || count < 1 || first > b->batch_size - count) {
        return nbi_err(b->hdr.ctx, NB_ERR_INVALID,
                       "%s: rows %lld .. %lld are not inside a batch of %lld rows (0 <= first, "
                       "1 <= count, first + count <= batch_size)",
                       fn, (long long)first, (long long)(first + count - 1),
                       (long long)b->batch_size);
    }
    nb_status st = nbi_batch_check(b, fn, "xb", xb, b->x, count);
    if (st == NB_OK && yb != NULL) {
        st = nbi_batch_check(b, fn, "yb", yb, b->y, count);
    }
    if (st != NB_OK) {
        return st;
    }
    int64_t m = nbi_batch_rows(b);
    bool any = m > 0;
    m = m <= first ? 0 : m - first < count ? m - first : count;
    const int64_t *idx = (const int64_t *)b->perm->data + b->next * b->batch_size + first;
    nbi_gather_rows(b->x, idx, m, xb);
    if (yb != NULL) {
        nbi_gather_rows(b->y, idx, m, yb);
    }
    b->next += any;
    *rows = m;
    return NB_OK;
}

nb_status nb_batcher_next(nb_batcher *b, nb_array *xb, nb_array *yb, int64_t *rows) {
    int64_t bs = nbi_batcher_live(b) ? b->batch_size : 1;
    return nbi_batcher_next("nb_batcher_next", b, 0, bs, xb, yb, rows);
}

nb_status nb_batcher_next_rows(nb_batcher *b, int64_t first, int64_t count, nb_array *xb,
                               nb_array *yb, int64_t *rows) {
    return nbi_batcher_next("nb_batcher_next_rows", b, first, count, xb, yb, rows);
}

nb_status nb_batcher_next_new(nb_batcher *b, nb_array **xb, nb_array **yb) {
    static const char fn[] = "nb_batcher_next_new";
    if (xb != NULL) {
        *xb = NULL;
    }
    if (yb != NULL) {
        *yb = NULL;
    }
    nb_status cst = nbi_check_handle(b, NBI_MAGIC_BATCHER, fn, "b");
    if (cst != NB_OK) {
        return cst;
    }
    if (xb == NULL) {
        return nbi_err(b->hdr.ctx, NB_ERR_MISUSE,
                       "%s: xb is NULL (pass the address of an nb_array * to receive the batch)",
                       fn);
    }
    int64_t m = nbi_batch_rows(b);
    if (m == 0) {
        return NB_OK;
    }
    const int64_t *idx = (const int64_t *)b->perm->data + b->next * b->batch_size;
    nb_status st = nbi_take_rows(fn, b->x, idx, m, xb);
    if (st == NB_OK && yb != NULL && b->y != NULL) {
        st = nbi_take_rows(fn, b->y, idx, m, yb);
        if (st != NB_OK) {
            nb_array_destroy(*xb);
            *xb = NULL;
        }
    }
    if (st == NB_OK) {
        b->next++;
    }
    return st;
}
