/*
 * src/nn/nn_internal.h -- what the nn layers share: building layer dicts eagerly, reading
 * them inside a trace with messages that name the layer, its leaf paths and the fix. Not
 * API.
 */
#ifndef NABLA_SRC_NN_INTERNAL_H
#define NABLA_SRC_NN_INTERNAL_H

#include "ad/ir.h"

#include <nabla/nn.h>
#include <nabla/random.h>

/* ---- building (eager) --------------------------------------------------------------- */
#define NBI_NN_MAX_KEYS 24

/* A dict under construction: each put takes a new reference (or records the first failed
 * status); nbi_nn_dict_finish builds the dict and releases every item. */
typedef struct nbi_nn_dict {
    nb_ctx *ctx;
    nb_status st;
    int n;
    const char *keys[NBI_NN_MAX_KEYS];
    nb_tree *items[NBI_NN_MAX_KEYS];
} nbi_nn_dict;

NBI_HIDDEN void nbi_nn_dict_begin(nbi_nn_dict *d, nb_ctx *ctx, const char *kind);
/* item: a new reference the dict takes over (NULL when st is not NB_OK). */
NBI_HIDDEN void nbi_nn_put(nbi_nn_dict *d, const char *key, nb_status st, nb_tree *item);
/* The array (a new reference, consumed; NULL with a failed st) as an array leaf. */
NBI_HIDDEN void nbi_nn_put_array(nbi_nn_dict *d, const char *key, nb_status st, nb_array *a);
NBI_HIDDEN void nbi_nn_put_null(nbi_nn_dict *d, const char *key);
NBI_HIDDEN void nbi_nn_put_int(nbi_nn_dict *d, const char *key, int64_t v);
NBI_HIDDEN void nbi_nn_put_float(nbi_nn_dict *d, const char *key, double v);
NBI_HIDDEN void nbi_nn_put_bool(nbi_nn_dict *d, const char *key, bool v);
/* A tuple of n ints. */
NBI_HIDDEN void nbi_nn_put_ints(nbi_nn_dict *d, const char *key, int n, const int64_t *v);
NBI_HIDDEN nb_status nbi_nn_dict_finish(nbi_nn_dict *d, nb_tree **out);
/* A normalisation layer's affine part: "weight" (ones) and "bias" (zeros) of the shape, each
 * a null leaf when not used. */
NBI_HIDDEN void nbi_nn_put_affine(nbi_nn_dict *d, nb_dtype dtype, int rank, const int64_t *shape,
                                  bool use_weight, bool use_bias);

/* The common prologue of an init function: *out = NULL; NB_ERR_MISUSE for a NULL ctx or
 * out. */
NBI_HIDDEN nb_status nbi_nn_args(nb_ctx *ctx, const char *fn, nb_tree **out);
/* key must be a live array (NB_ERR_MISUSE with a message otherwise; its shape is checked
 * by the samplers). */
NBI_HIDDEN nb_status nbi_nn_check_key(nb_ctx *ctx, const char *fn, const nb_array *key);
/* "relu", "tanh", ... for the known activations, "activation" for others. */
NBI_HIDDEN const char *nbi_nn_activation_name(nb_nn_activation fn);
/* The built-in activation named s (n bytes, not NUL-terminated), or NULL. */
NBI_HIDDEN nb_nn_activation nbi_nn_activation_named(const char *s, size_t n);
/* The largest size, stride, padding or dilation a layer takes (2^31). */
#define NBI_NN_SIZE_MAX ((int64_t)1 << 31)
/* Common argument checks of the init functions (message on ctx, NB_ERR_INVALID). */
NBI_HIDDEN nb_status nbi_nn_check_dtype(nb_ctx *ctx, const char *fn, nb_dtype dtype);
NBI_HIDDEN nb_status nbi_nn_check_size(nb_ctx *ctx, const char *fn, const char *what, int64_t v,
                                       int64_t min);
/* Key row i of an i32[n, 2] array of keys (from nb_random_split), as a new i32[2] array. */
NBI_HIDDEN nb_status nbi_nn_key_row(const nb_array *keys, int64_t i, nb_array **out);
/* U(-lim, lim) of the shape, as Equinox's default_init (jax.random.uniform). */
NBI_HIDDEN nb_status nbi_nn_uniform(const nb_array *key, nb_dtype dtype, int rank,
                                    const int64_t *shape, double lim, nb_array **out);

/* ---- reading a layer inside a trace ------------------------------------------------- */
/* What an apply function knows while it reads its layer: for messages. */
typedef struct nbi_nn_at {
    nb_trace *tr;
    const char *fn;   /* "nb_nn_linear" */
    const char *kind; /* "linear" */
    const nb_tree *layer;
    char path[NB_PATH_MAX]; /* the layer's path ("args[0].layers[1]") or "" if unknown */
} nbi_nn_at;

/* Check that layer is a dict of the given kind (a sticky error otherwise, with the fix)
 * and fill *at. Returns false after an error (or when the trace already failed). */
NBI_HIDDEN bool nbi_nn_begin(nbi_nn_at *at, nb_trace *tr, const char *fn, const char *kind,
                             const nb_tree *layer);
/* The "kind" string of a live layer dict, or NULL (anything else). */
NBI_HIDDEN const char *nbi_nn_kind_of(const nb_tree *layer);
/* "layer 'args[0].layers[1]'" or "the layer" (into buf). */
NBI_HIDDEN const char *nbi_nn_where(const nbi_nn_at *at, char *buf, size_t cap);
/* Record a sticky error "<fn>: <message>" and return the trace's poison. */
NBI_HIDDEN nb_var *nbi_nn_fail(const nbi_nn_at *at, nb_status st, const char *fmt, ...)
    NBI_PRINTF(3, 4);
/* Static leaves; false after a sticky error naming the key. */
NBI_HIDDEN bool nbi_nn_int(const nbi_nn_at *at, const char *key, int64_t *v);
NBI_HIDDEN bool nbi_nn_float(const nbi_nn_at *at, const char *key, double *v);
NBI_HIDDEN bool nbi_nn_bool(const nbi_nn_at *at, const char *key, bool *v);
/* A tuple of n ints under key. */
NBI_HIDDEN bool nbi_nn_ints(const nbi_nn_at *at, const char *key, int n, int64_t *v);
/* A function-reference leaf under key, as an activation. */
NBI_HIDDEN bool nbi_nn_fn(const nbi_nn_at *at, const char *key, nb_nn_activation *fn);
/* The array under key as a var (a concrete array becomes a constant). With allow_null a
 * null leaf gives *v = NULL. If rank >= 0, the var must have that rank and the shape
 * (entries < 0 are not checked) and x's dtype when x is not NULL; otherwise a sticky
 * error naming the leaf path, its shape and the expected one. */
NBI_HIDDEN bool nbi_nn_param(const nbi_nn_at *at, const char *key, bool allow_null, int rank,
                             const int64_t *shape, const nb_var *x, nb_var **v);
/* x must be a float var (rank >= min_rank): a sticky error naming x and the layer. */
NBI_HIDDEN bool nbi_nn_check_input(const nbi_nn_at *at, nb_var *x, int min_rank, int max_rank,
                                   const char *expect);

/* "f32[2,3]" of a var, or "poison". */
NBI_HIDDEN const char *nbi_nn_sig(char *buf, size_t cap, const nb_var *v);
/* "a list of 3 items", "an int 4", ... of a tree (for messages). */
NBI_HIDDEN const char *nbi_nn_describe(const nb_tree *t, char *buf, size_t cap);
/* "[2,3]" of a shape. */
NBI_HIDDEN const char *nbi_nn_shape_str(char *buf, size_t cap, int rank, const int64_t *shape);

#endif /* NABLA_SRC_NN_INTERNAL_H */
