/*
 * optim_internal.h -- helpers shared by the optimizer sources (src/optim).
 */
#ifndef NABLA_OPTIM_INTERNAL_H
#define NABLA_OPTIM_INTERNAL_H

#include "ad/ir.h"
#include "core/internal.h"
#include "nabla/optim.h"

/* The entry checks of a constructor: *out set to NULL, then NB_ERR_MISUSE for a NULL ctx
 * (nothing recorded: there is nowhere to) or a NULL out (recorded on ctx, naming fn and what
 * out receives, e.g. "schedule"). */
NBI_HIDDEN nb_status nbo_out_args(nb_ctx *ctx, const char *fn, nb_tree **out, const char *what);

/* A dict under construction: up to 24 (key, tree) pairs; the first failure sticks and every
 * later put releases its tree. */
#define NBO_BUILDER_MAX 24

typedef struct nbo_builder {
    nb_ctx *ctx;
    nb_status st;
    int n;
    const char *keys[NBO_BUILDER_MAX];
    nb_tree *items[NBO_BUILDER_MAX];
} nbo_builder;

NBI_HIDDEN nbo_builder nbo_builder_make(nb_ctx *ctx);
/* Take t (a new reference, may be NULL after a failed build: then st must be set). */
NBI_HIDDEN void nbo_put_take(nbo_builder *b, const char *key, nb_tree *t);
/* Retain a borrowed tree. */
NBI_HIDDEN void nbo_put_tree(nbo_builder *b, const char *key, const nb_tree *t);
NBI_HIDDEN void nbo_put_string(nbo_builder *b, const char *key, const char *value);
NBI_HIDDEN void nbo_put_float(nbo_builder *b, const char *key, double value);
NBI_HIDDEN void nbo_put_int(nbo_builder *b, const char *key, int64_t value);
NBI_HIDDEN void nbo_put_bool(nbo_builder *b, const char *key, bool value);
NBI_HIDDEN void nbo_put_null(nbo_builder *b, const char *key);
/* An f64 0-d array leaf. */
NBI_HIDDEN void nbo_put_f64(nbo_builder *b, const char *key, double value);
/* Build the dict (a new reference) and release the items; returns the sticky status. */
NBI_HIDDEN nb_status nbo_builder_dict(nbo_builder *b, nb_tree **out);

#endif /* NABLA_OPTIM_INTERNAL_H */
