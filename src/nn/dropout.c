/*
 * dropout.c -- Dropout (Equinox's eqx.nn.Dropout): in training mode
 *     q = 1 - p;  mask = jax.random.bernoulli(key, q, x.shape);  where(mask, x / q, 0)
 * and the identity in inference mode or when p == 0. The mask is drawn by nb_rng_bernoulli,
 * the traced twin of nb_random_bernoulli (the same bits for the same key).
 */
#include "nn/nn_internal.h"

#include <math.h>
#include <string.h>

nb_status nb_nn_dropout_init(nb_ctx *ctx, double p, bool inference, nb_tree **layer) {
    static const char fn[] = "nb_nn_dropout_init";
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (st != NB_OK) {
        return st;
    }
    if (!(p >= 0 && p < 1)) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: p is %g; the probability of dropping an element is in [0, 1) "
                       "(default 0.5; p = 1 would divide by zero)",
                       fn, p);
    }
    nbi_nn_dict d;
    nbi_nn_dict_begin(&d, ctx, "dropout");
    nbi_nn_put_float(&d, "p", p);
    nbi_nn_put_bool(&d, "inference", inference);
    return nbi_nn_dict_finish(&d, layer);
}

nb_var *nb_nn_dropout(nb_trace *tr, const nb_tree *layer, nb_var *x, nb_var *key) {
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_dropout", "dropout", layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    double p = 0;
    bool inference = false;
    if (!nbi_nn_float(&at, "p", &p) || !nbi_nn_bool(&at, "inference", &inference)) {
        return tr->poison;
    }
    char w[NB_PATH_MAX + 64];
    if (!(p >= 0 && p < 1)) {
        return nbi_nn_fail(&at, NB_ERR_INVALID, "%s has p = %g; it must be in [0, 1)",
                           nbi_nn_where(&at, w, sizeof w), p);
    }
    if (!nbi_nn_check_input(&at, x, 0, NB_MAX_RANK, "a float array")) {
        return tr->poison;
    }
    if (inference || p == 0) {
        return x;
    }
    if (key == NULL) {
        return nbi_nn_fail(&at, NB_ERR_INVALID,
                           "%s is in training mode (p = %g) but no key was given; pass an i32[2] "
                           "PRNG key var (a fresh one each step), or switch the layer to "
                           "inference with nb_nn_inference_mode",
                           nbi_nn_where(&at, w, sizeof w), p);
    }
    if (nb_var_is_poison(key)) {
        return key;
    }
    double q = 1.0 - p;
    nb_var *mask = nb_rng_bernoulli(key, q, nb_var_rank(x), nb_var_shape(x));
    nb_var *kept = nb_div(x, nb_scalar(tr, q));
    return nb_select(mask, kept, nb_scalar_typed(tr, nb_var_dtype(x), 0.0));
}
