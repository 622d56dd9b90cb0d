/*
 * nabla/data.h -- loading data sets.
 *
 * CSV files, plain or gzip-compressed (read through zlib, which reads both), with one
 * sample per line: numeric features, then an integer class label in the last column (the
 * layout scikit-learn ships its UCI data sets in, and the files under data/). A first line
 * that is not all numbers is a header; in scikit-learn's header form
 * "n_samples,n_features,class names..." the counts are checked against the rows read.
 * Every malformed line is an error naming the file and the line.
 */
#ifndef NABLA_DATA_H
#define NABLA_DATA_H

#include "array.h"
#include "core.h"

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

#ifdef __cplusplus
}
#endif
#endif /* NABLA_DATA_H */
