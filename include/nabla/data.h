/*
 * nabla/data.h -- loading data sets, splitting them, and feeding them in minibatches.
 *
 * CSV files, plain or gzip-compressed (read through zlib, which reads both), with one
 * sample per line: numeric features, then an integer class label in the last column (the
 * layout scikit-learn ships its UCI data sets in, and the files under data/). A first line
 * that is not all numbers is a header; in scikit-learn's header form
 * "n_samples,n_features,class names..." the counts are checked against the rows read.
 * Every malformed line is an error naming the file and the line.
 *
 * Samples are the rows of an array: its axis 0 (features x of shape [n, ...], any dtype;
 * labels y of shape [n] or [n, ...]). Shuffles come from a PRNG key (random.h), so a run is
 * reproducible from its seed: nb_data_split draws one permutation, and a batcher draws one
 * per epoch, from nb_random_fold_in(key, epoch). A training loop takes its batches into
 * arrays it allocated once (nb_batcher_next), so it runs with no allocation per step, and
 * with drop_last (the default) every batch has the same shape, so a jitted step is traced
 * once.
 *
 *     nb_data_split(x, y, key, 0.2, &xtr, &ytr, &xte, &yte);
 *     nb_data_standardize(xtr, xte, NULL, NULL);     (statistics of the training rows)
 *     nb_batcher_create(xtr, ytr, key2, 128, NULL, &b);
 *     (xb, yb: arrays of shape [128, features] and [128], made once)
 *     for (int64_t e = 0; e < epochs; e++) {
 *         nb_batcher_epoch(b, e);
 *         for (int64_t rows; nb_batcher_next(b, xb, yb, &rows) == NB_OK && rows > 0;)
 *             train_step(xb, yb);
 *     }
 */
#ifndef NABLA_DATA_H
#define NABLA_DATA_H

#include "array.h"
#include "core.h"
#include "random.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_csv_opts {
    nb_dtype feature_dtype; /* NB_DTYPE_F32 (default) or NB_DTYPE_F64 */
    nb_dtype label_dtype;   /* NB_DTYPE_I32 (default) or NB_DTYPE_I64 */
    bool has_labels;        /* true (default): the last column is the label */
    char delimiter;         /* ',' (default) */
} nb_csv_opts;

NB_API nb_csv_opts nb_csv_opts_default(void);

/* Load path into *features (n_samples x n_features) and *labels (n_samples), both new
 * references (labels may be NULL when not wanted, and is set to NULL when has_labels is
 * false). Returns NB_OK; NB_ERR_MISUSE; NB_ERR_IO when the file cannot be opened or read
 * (the message has the system's reason); NB_ERR_FORMAT for a malformed line ("<file>:<line>:
 * expected 65 fields, found 64", a field that is not a number, a label that is not an
 * integer, a header whose counts disagree with the data, an empty file); NB_ERR_OOM.
 * Allocates. */
NB_API nb_status nb_csv_load(nb_ctx *ctx, const char *path, const nb_csv_opts *opts,
                             nb_array **features, nb_array **labels);

/* Load a text file (plain, or gzip-compressed: read through zlib either way) as character
 * codes for a character-level model: *codes is a new i32[n] array holding, for each of the
 * file's n bytes, its index in the file's alphabet -- the distinct byte values in
 * increasing order. vocab (NULL, or room for 256 chars) receives that alphabet, so
 * vocab[codes[i]] is byte i; *n_vocab (may be NULL) its size. Returns NB_OK; NB_ERR_MISUSE
 * (NULL ctx, path or codes); NB_ERR_IO (cannot open or read, with the system's reason);
 * NB_ERR_FORMAT (an empty file); NB_ERR_OOM. On failure *codes is NULL. Allocates. */
NB_API nb_status nb_text_load(nb_ctx *ctx, const char *path, nb_array **codes, char *vocab,
                              int *n_vocab);

/* ---- train/test split and standardisation (src/io/batch.c) ------------------------- */

/* Shuffle the rows of x (and of y, if not NULL: the same permutation, so every row stays
 * paired with its label) and split off a test set, as scikit-learn's train_test_split
 * with shuffling: p = nb_random_permutation(key, n); the test rows are x[p[0]], ...,
 * x[p[n_test - 1]], the training rows x[p[n_test]], ..., x[p[n - 1]], in that order.
 * n_test = round(test_fraction * n), to nearest, halves up (0.2 of 1797 rows: 359), with
 * 0 <= test_fraction < 1 and at least one training row left. x: any dtype, rank >= 1; y:
 * any dtype, rank >= 1, as many rows as x. The four results are new arrays (of n - n_test
 * and n_test rows; y_train and y_test are set to NULL when y is NULL, and may then be
 * NULL themselves). Returns NB_OK; NB_ERR_MISUSE for a NULL or destroyed handle or a NULL
 * out-parameter; NB_ERR_SHAPE when key is not an i32[2] array, x or y has rank 0, or their
 * row counts differ; NB_ERR_INVALID for a test_fraction out of range or one that leaves no
 * training row; NB_ERR_OOM. On failure every out-parameter is NULL. Allocates. */
NB_API nb_status nb_data_split(const nb_array *x, const nb_array *y, const nb_array *key,
                               double test_fraction, nb_array **x_train, nb_array **y_train,
                               nb_array **x_test, nb_array **y_test);

/* Standardise features with the statistics of the training rows, as scikit-learn's
 * StandardScaler: for every feature (every element position after axis 0), mean and
 * standard deviation (population, ddof 0) over train's rows, computed in double; then
 * train and test (may be NULL) are replaced in place by (x - mean) / std, rounded once to
 * their dtype. A feature constant over the training rows (std 0, e.g. an always-blank
 * pixel) is only centred: x - mean, never a division by zero. train and test are f32 or f64
 * (nb_array_cast others first) of the same dtype and feature shape; train needs >= 1 row.
 * *mean and *std (each may be NULL when not wanted) receive the statistics as new arrays
 * of the feature shape (train's shape without axis 0) and dtype, for nb_data_standardize_
 * apply on later data. In place: views sharing the data (nb_array_reshape) see the change.
 * Returns NB_OK; NB_ERR_MISUSE; NB_ERR_DTYPE; NB_ERR_SHAPE; NB_ERR_OOM (nothing changed
 * then). Allocates only the statistics. */
NB_API nb_status nb_data_standardize(nb_array *train, nb_array *test, nb_array **mean,
                                     nb_array **std);
/* Replace x in place by (x - mean) / std per feature (x - mean where std is 0), with mean
 * and std as nb_data_standardize returns them (x's dtype, x's shape without axis 0).
 * Returns NB_OK, NB_ERR_MISUSE, NB_ERR_DTYPE or NB_ERR_SHAPE. Never allocates. */
NB_API nb_status nb_data_standardize_apply(nb_array *x, const nb_array *mean, const nb_array *std);

/* ---- minibatches (src/io/batch.c) -------------------------------------------------- */
/* A batcher hands out the rows of x (and y) in shuffled batches of batch_size rows. Epoch e
 * visits every row exactly once, in the order p_e = nb_random_permutation(
 * nb_random_fold_in(key, e), n) (so each epoch is a fresh shuffle, reproducible from key and
 * e alone, in any order of epochs): batch i holds rows p_e[i * batch_size], ...,
 * p_e[(i + 1) * batch_size - 1]. With drop_last (the default) the n % batch_size rows left
 * at the end of an epoch are skipped (different ones each epoch), so every batch has
 * batch_size rows; without it the epoch ends with one smaller batch. Creating the batcher
 * allocates its permutation and scratch (24 bytes per row); epochs and batches then
 * allocate nothing (nb_batcher_next_new excepted). The batcher holds references to x and y:
 * later writes to their data are seen. One thread at a time, like its context. */
typedef struct nb_batcher nb_batcher;

typedef struct nb_batcher_opts {
    bool drop_last; /* true (default): only full batches */
} nb_batcher_opts;

NB_API nb_batcher_opts nb_batcher_opts_default(void);

/* A batcher over the rows of x (any dtype, rank >= 1) and y (NULL, or as many rows as x),
 * with 1 <= batch_size <= rows, positioned at the start of epoch 0. opts may be NULL for
 * the defaults. x, y and key are borrowed (x and y retained). Returns NB_OK; NB_ERR_MISUSE;
 * NB_ERR_SHAPE (a key that is not i32[2], rank 0, row counts that differ); NB_ERR_INVALID
 * (batch_size out of range); NB_ERR_OOM. *out is NULL on failure. Allocates. */
NB_API nb_status nb_batcher_create(const nb_array *x, const nb_array *y, const nb_array *key,
                                   int64_t batch_size, const nb_batcher_opts *opts,
                                   nb_batcher **out);
/* Release the batcher (and its references to x and y). NULL is a no-op; a destroyed handle
 * is reported as NB_ERR_MISUSE on its context. */
NB_API void nb_batcher_destroy(nb_batcher *b);
/* Batches per epoch: n / batch_size with drop_last, else rounded up. -1 for NULL. */
NB_API int64_t nb_batcher_num_batches(const nb_batcher *b);
/* Start epoch e (0 <= e < 2^32, as fold_in's data): draw its permutation and rewind to its
 * first batch. Calling it again with the same e replays the same batches. Returns NB_OK,
 * NB_ERR_MISUSE, or NB_ERR_INVALID for e out of range. Never allocates. */
NB_API nb_status nb_batcher_epoch(nb_batcher *b, int64_t e);
/* Copy the next batch of the current epoch into xb (and yb, unless it is NULL: labels are
 * then skipped), arrays the caller made once with x's dtype and shape except batch_size
 * rows (y's likewise), and set *rows to the rows written: batch_size, fewer for the last
 * batch without drop_last (the rows after them are left as they were), or 0 when the epoch
 * has no batch left (nothing written: call nb_batcher_epoch for the next one). Returns
 * NB_OK; NB_ERR_MISUSE (NULL handle or rows, a yb when the batcher has no labels);
 * NB_ERR_DTYPE or NB_ERR_SHAPE for an xb or yb of the wrong dtype or shape (the message
 * gives the one expected). Never allocates. */
NB_API nb_status nb_batcher_next(nb_batcher *b, nb_array *xb, nb_array *yb, int64_t *rows);
/* Part of the next batch: rows first .. first + count - 1 of it (0 <= first, 1 <= count,
 * first + count <= batch_size) into xb and yb, which have count rows; *rows is the rows
 * written (count; fewer, or 0, where a last batch without drop_last is shorter); the
 * batcher then moves to the next batch, as nb_batcher_next. With nabla/dist.h each process
 * reads only its micro-batches' rows of the global batch: every process's batcher has the
 * same key and batch size, so every epoch is the same set of global batches for any
 * number of processes. Errors as nb_batcher_next, and NB_ERR_INVALID for rows outside the
 * batch. Never allocates. */
NB_API nb_status nb_batcher_next_rows(nb_batcher *b, int64_t first, int64_t count, nb_array *xb,
                                      nb_array *yb, int64_t *rows);
/* The same, into new arrays of exactly the batch's rows: *xb and *yb (yb may be NULL; *yb
 * is NULL when the batcher has no labels) are yours to destroy, and both are NULL when
 * the epoch has no batch left. Allocates two arrays per batch. */
NB_API nb_status nb_batcher_next_new(nb_batcher *b, nb_array **xb, nb_array **yb);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_DATA_H */
