/*
 * norm.c -- LayerNorm and Embedding (Equinox's eqx.nn.LayerNorm and eqx.nn.Embedding).
 */
#include "nn/nn_internal.h"

#include <math.h>
#include <string.h>

/* ---- LayerNorm ---------------------------------------------------------------------- */

nb_status nb_nn_layer_norm_init(nb_ctx *ctx, int rank, const int64_t *shape, double eps,
                                bool use_weight, bool use_bias, nb_dtype dtype, nb_tree **layer) {
    static const char fn[] = "nb_nn_layer_norm_init";
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (st != NB_OK) {
        return st;
    }
    if (rank < 1 || rank > NB_MAX_RANK || shape == NULL) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: rank %d%s; the normalised shape has 1 to %d dims (the trailing dims "
                       "of the input)",
                       fn, rank, shape == NULL ? " with a NULL shape" : "", NB_MAX_RANK);
    }
    for (int i = 0; i < rank && st == NB_OK; i++) {
        char what[32];
        snprintf(what, sizeof what, "shape[%d]", i);
        st = nbi_nn_check_size(ctx, fn, what, shape[i], 1);
    }
    if (st == NB_OK && !(eps >= 0 && isfinite(eps))) {
        st = nbi_err(ctx, NB_ERR_INVALID,
                     "%s: eps is %g; it must be finite and >= 0 (default 1e-5)", fn, eps);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_dtype(ctx, fn, dtype);
    }
    if (st != NB_OK) {
        return st;
    }
    nbi_nn_dict d;
    nbi_nn_dict_begin(&d, ctx, "layer_norm");
    nb_array *a = NULL;
    if (use_weight) {
        st = nb_array_ones(ctx, dtype, rank, shape, &a);
        nbi_nn_put_array(&d, "weight", st, a);
    } else {
        nbi_nn_put_null(&d, "weight");
    }
    a = NULL;
    if (use_bias) {
        st = nb_array_zeros(ctx, dtype, rank, shape, &a);
        nbi_nn_put_array(&d, "bias", st, a);
    } else {
        nbi_nn_put_null(&d, "bias");
    }
    nbi_nn_put_ints(&d, "shape", rank, shape);
    nbi_nn_put_float(&d, "eps", eps);
    nbi_nn_put_bool(&d, "use_weight", use_weight);
    nbi_nn_put_bool(&d, "use_bias", use_bias);
    return nbi_nn_dict_finish(&d, layer);
}

nb_var *nb_nn_layer_norm(nb_trace *tr, const nb_tree *layer, nb_var *x) {
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_layer_norm", "layer_norm", layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    const nb_tree *st = nb_tree_get(layer, "shape");
    int r = (int)nb_tree_len(st);
    if (st == NULL || nb_tree_kind_of(st) != NB_TREE_KIND_TUPLE || r < 1 || r > NB_MAX_RANK) {
        char w[NB_PATH_MAX + 64];
        return nbi_nn_fail(&at, NB_ERR_STRUCTURE,
                           "%s: 'shape' must be a tuple of 1 to %d static ints (layer trees are "
                           "made by nb_nn_layer_norm_init)",
                           nbi_nn_where(&at, w, sizeof w), NB_MAX_RANK);
    }
    int64_t shape[NB_MAX_RANK];
    double eps = 0;
    if (!nbi_nn_ints(&at, "shape", r, shape) || !nbi_nn_float(&at, "eps", &eps)) {
        return tr->poison;
    }
    char ss[96], expect[256];
    nbi_nn_shape_str(ss, sizeof ss, r, shape);
    snprintf(expect, sizeof expect, "[..., %s] (normalised over the trailing shape %s)", ss + 1,
             ss);
    if (!nbi_nn_check_input(&at, x, r, NB_MAX_RANK, expect)) {
        return tr->poison;
    }
    int xr = nb_var_rank(x);
    for (int i = 0; i < r; i++) {
        if (nb_var_dim(x, xr - r + i) != shape[i]) {
            char w[NB_PATH_MAX + 64], xs[96];
            return nbi_nn_fail(&at, NB_ERR_SHAPE,
                               "the input%s%s%s of %s is %s; its trailing dims must be the "
                               "normalised shape %s",
                               x->path ? " '" : "", x->path ? x->path : "", x->path ? "'" : "",
                               nbi_nn_where(&at, w, sizeof w), nbi_nn_sig(xs, sizeof xs, x), ss);
        }
    }
    nb_var *wv = NULL, *bv = NULL;
    if (!nbi_nn_param(&at, "weight", true, r, shape, x, &wv) ||
        !nbi_nn_param(&at, "bias", true, r, shape, x, &bv)) {
        return tr->poison;
    }
    /* Equinox: mean = jnp.mean(x), variance = jnp.var(x) (biased: the mean of the squared
     * deviations), inv = rsqrt(max(variance, 0) + eps), out = (x - mean) * inv, then
     * weight * out and bias + out. */
    int axes[NB_MAX_RANK];
    for (int i = 0; i < r; i++) {
        axes[i] = xr - r + i;
    }
    nb_var *mean = nb_mean(x, axes, r, true);
    nb_var *xc = nb_sub(x, mean);
    nb_var *var = nb_mean(nb_square(xc), axes, r, true);
    nb_var *inv = nb_rsqrt(nb_add(var, nb_scalar(tr, eps)));
    nb_var *out = nb_mul(xc, inv);
    if (wv != NULL) {
        out = nb_mul(wv, out);
    }
    if (bv != NULL) {
        out = nb_add(bv, out);
    }
    return out;
}

/* ---- Embedding ---------------------------------------------------------------------- */

nb_status nb_nn_embedding_init(nb_ctx *ctx, int64_t num, int64_t dim, nb_dtype dtype,
                               const nb_array *key, nb_tree **layer) {
    static const char fn[] = "nb_nn_embedding_init";
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (ctx == NULL) {
        st = nbi_err_null_ctx(key, fn); /* the key knows the context */
    }
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "num (num_embeddings)", num, 1);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "dim (embedding_size)", dim, 1);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_dtype(ctx, fn, dtype);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_key(ctx, fn, key);
    }
    if (st != NB_OK) {
        return st;
    }
    /* Equinox: weight = jax.random.normal(key, (num_embeddings, embedding_size)). */
    nb_array *w = NULL;
    st = nb_random_normal(key, dtype, 2, (const int64_t[]){num, dim}, &w);
    nbi_nn_dict d;
    nbi_nn_dict_begin(&d, ctx, "embedding");
    nbi_nn_put_array(&d, "weight", st, w);
    nbi_nn_put_int(&d, "num_embeddings", num);
    nbi_nn_put_int(&d, "embedding_size", dim);
    return nbi_nn_dict_finish(&d, layer);
}

nb_var *nb_nn_embedding(nb_trace *tr, const nb_tree *layer, nb_var *indices) {
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_embedding", "embedding", layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    int64_t num = 0, dim = 0;
    if (!nbi_nn_int(&at, "num_embeddings", &num) || !nbi_nn_int(&at, "embedding_size", &dim)) {
        return tr->poison;
    }
    char w[NB_PATH_MAX + 64];
    if (indices == NULL) {
        return nbi_nn_fail(&at, NB_ERR_MISUSE, "the indices of %s are a NULL var",
                           nbi_nn_where(&at, w, sizeof w));
    }
    if (nb_var_is_poison(indices)) {
        return indices;
    }
    nb_dtype dt = nb_var_dtype(indices);
    if (dt != NB_DTYPE_I32 && dt != NB_DTYPE_I64) {
        char xs[96];
        return nbi_nn_fail(&at, NB_ERR_DTYPE,
                           "the indices%s%s%s of %s are %s; they must be i32 or i64 (row numbers "
                           "in [0, %lld); nb_cast them)",
                           indices->path ? " '" : "", indices->path ? indices->path : "",
                           indices->path ? "'" : "", nbi_nn_where(&at, w, sizeof w),
                           nbi_nn_sig(xs, sizeof xs, indices), (long long)num);
    }
    if (nb_var_rank(indices) > NB_MAX_RANK - 1) {
        char xs[96];
        return nbi_nn_fail(&at, NB_ERR_SHAPE,
                           "the indices of %s are %s; the result adds a dim, so at most rank %d",
                           nbi_nn_where(&at, w, sizeof w), nbi_nn_sig(xs, sizeof xs, indices),
                           NB_MAX_RANK - 1);
    }
    nb_var *wv = NULL;
    if (!nbi_nn_param(&at, "weight", false, 2, (const int64_t[]){num, dim}, NULL, &wv)) {
        return tr->poison;
    }
    return nb_take(wv, indices, 0);
}
