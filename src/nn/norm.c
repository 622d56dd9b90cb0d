/*
 * norm.c -- LayerNorm, RMSNorm, GroupNorm and Embedding (Equinox's eqx.nn.LayerNorm,
 * RMSNorm, GroupNorm and Embedding).
 */
#include "nn/nn_internal.h"

#include <math.h>
#include <string.h>

/* ---- LayerNorm and RMSNorm: normalised over a trailing shape ------------------------- */

static nb_status nbi_nn_check_eps(nb_ctx *ctx, const char *fn, double eps) {
    if (!(eps >= 0 && isfinite(eps))) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: eps is %g; it must be finite and >= 0 (default 1e-5)", fn, eps);
    }
    return NB_OK;
}

/* The layer dict of a LayerNorm or RMSNorm (kind): weight (ones) and bias (zeros) of the
 * shape, or nulls, and the static shape, eps and flags. */
static nb_status nbi_trailing_norm_make(nb_ctx *ctx, const char *fn, const char *kind, int rank,
                                        const int64_t *shape, double eps, bool use_weight,
                                        bool use_bias, nb_dtype dtype, nb_tree **layer) {
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
    if (st == NB_OK) {
        st = nbi_nn_check_eps(ctx, fn, eps);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_dtype(ctx, fn, dtype);
    }
    if (st != NB_OK) {
        return st;
    }
    nbi_nn_dict d;
    nbi_nn_dict_begin(&d, ctx, kind);
    nbi_nn_put_affine(&d, dtype, rank, shape, use_weight, use_bias);
    nbi_nn_put_ints(&d, "shape", rank, shape);
    nbi_nn_put_float(&d, "eps", eps);
    nbi_nn_put_bool(&d, "use_weight", use_weight);
    nbi_nn_put_bool(&d, "use_bias", use_bias);
    return nbi_nn_dict_finish(&d, layer);
}

/* Read a LayerNorm's or RMSNorm's static shape and eps, check that x ends with the shape,
 * get weight and bias (or NULLs) and the trailing axes (r of them); false after a sticky
 * error. */
static bool nbi_trailing_norm_read(const nbi_nn_at *at, nb_var *x, int *r, int *axes, double *eps,
                                   nb_var **wv, nb_var **bv) {
    const nb_tree *st = nb_tree_get(at->layer, "shape");
    int n = (int)nb_tree_len(st);
    char w[NB_PATH_MAX + 64];
    if (st == NULL || nb_tree_kind_of(st) != NB_TREE_KIND_TUPLE || n < 1 || n > NB_MAX_RANK) {
        nbi_nn_fail(at, NB_ERR_STRUCTURE,
                    "%s: 'shape' must be a tuple of 1 to %d static ints (layer trees are made by "
                    "nb_nn_%s_init)",
                    nbi_nn_where(at, w, sizeof w), NB_MAX_RANK, at->kind);
        return false;
    }
    int64_t shape[NB_MAX_RANK];
    if (!nbi_nn_ints(at, "shape", n, shape) || !nbi_nn_float(at, "eps", eps)) {
        return false;
    }
    char ss[96], expect[256];
    nbi_nn_shape_str(ss, sizeof ss, n, shape);
    snprintf(expect, sizeof expect, "[..., %s] (normalised over the trailing shape %s)", ss + 1,
             ss);
    if (!nbi_nn_check_input(at, x, n, NB_MAX_RANK, expect)) {
        return false;
    }
    int xr = nb_var_rank(x);
    for (int i = 0; i < n; i++) {
        if (nb_var_dim(x, xr - n + i) != shape[i]) {
            char xs[96];
            nbi_nn_fail(at, NB_ERR_SHAPE,
                        "the input%s%s%s of %s is %s; its trailing dims must be the normalised "
                        "shape %s",
                        x->path ? " '" : "", x->path ? x->path : "", x->path ? "'" : "",
                        nbi_nn_where(at, w, sizeof w), nbi_nn_sig(xs, sizeof xs, x), ss);
            return false;
        }
        axes[i] = xr - n + i;
    }
    *r = n;
    return nbi_nn_param(at, "weight", true, n, shape, x, wv) &&
           nbi_nn_param(at, "bias", true, n, shape, x, bv);
}

nb_status nb_nn_layer_norm_init(nb_ctx *ctx, int rank, const int64_t *shape, double eps,
                                bool use_weight, bool use_bias, nb_dtype dtype, nb_tree **layer) {
    return nbi_trailing_norm_make(ctx, "nb_nn_layer_norm_init", "layer_norm", rank, shape, eps,
                                  use_weight, use_bias, dtype, layer);
}

nb_var *nb_nn_layer_norm(nb_trace *tr, const nb_tree *layer, nb_var *x) {
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_layer_norm", "layer_norm", layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    int r = 0, axes[NB_MAX_RANK];
    double eps = 0;
    nb_var *wv = NULL, *bv = NULL;
    if (!nbi_trailing_norm_read(&at, x, &r, axes, &eps, &wv, &bv)) {
        return tr->poison;
    }
    /* Equinox: mean = jnp.mean(x), variance = jnp.var(x) (biased: the mean of the squared
     * deviations), inv = rsqrt(max(variance, 0) + eps), out = (x - mean) * inv, then
     * weight * out and bias + out. */
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

/* ---- GroupNorm ---------------------------------------------------------------------- */

nb_nn_group_norm_opts nb_nn_group_norm_opts_default(void) {
    nb_nn_group_norm_opts o;
    memset(&o, 0, sizeof o);
    o.eps = 1e-5;
    o.channelwise_affine = true;
    o.channel_axis = 0;
    return o;
}

nb_status nb_nn_group_norm_init(nb_ctx *ctx, int64_t groups, int64_t channels,
                                const nb_nn_group_norm_opts *opts, nb_dtype dtype,
                                nb_tree **layer) {
    static const char fn[] = "nb_nn_group_norm_init";
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (st != NB_OK) {
        return st;
    }
    nb_nn_group_norm_opts o = opts != NULL ? *opts : nb_nn_group_norm_opts_default();
    st = nbi_nn_check_size(ctx, fn, "groups", groups, 1);
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "channels", channels, 1);
    }
    if (st == NB_OK && channels % groups != 0) {
        st = nbi_err(ctx, NB_ERR_INVALID, "%s: groups %lld must divide the number of channels %lld",
                     fn, (long long)groups, (long long)channels);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_eps(ctx, fn, o.eps);
    }
    if (st == NB_OK && (o.channel_axis < -NB_MAX_RANK || o.channel_axis >= NB_MAX_RANK)) {
        st = nbi_err(ctx, NB_ERR_INVALID,
                     "%s: opts.channel_axis is %d; it must be in [-%d, %d) (0: x is [C, ...] "
                     "as in Equinox; 1: a batch [N, C, ...])",
                     fn, o.channel_axis, NB_MAX_RANK, NB_MAX_RANK);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_dtype(ctx, fn, dtype);
    }
    if (st != NB_OK) {
        return st;
    }
    nbi_nn_dict d;
    nbi_nn_dict_begin(&d, ctx, "group_norm");
    nbi_nn_put_affine(&d, dtype, 1, &channels, o.channelwise_affine, o.channelwise_affine);
    nbi_nn_put_int(&d, "groups", groups);
    nbi_nn_put_int(&d, "channels", channels);
    nbi_nn_put_float(&d, "eps", o.eps);
    nbi_nn_put_bool(&d, "channelwise_affine", o.channelwise_affine);
    nbi_nn_put_int(&d, "channel_axis", o.channel_axis);
    return nbi_nn_dict_finish(&d, layer);
}

nb_var *nb_nn_group_norm(nb_trace *tr, const nb_tree *layer, nb_var *x) {
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_group_norm", "group_norm", layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    int64_t groups = 0, channels = 0, cax = 0;
    double eps = 0;
    char w[NB_PATH_MAX + 64], xs[96];
    if (!nbi_nn_int(&at, "groups", &groups) || !nbi_nn_int(&at, "channels", &channels) ||
        !nbi_nn_float(&at, "eps", &eps) || !nbi_nn_int(&at, "channel_axis", &cax)) {
        return tr->poison;
    }
    if (groups < 1 || channels < 1 || channels % groups != 0 || !(eps >= 0)) {
        return nbi_nn_fail(&at, NB_ERR_INVALID,
                           "%s has invalid static sizes (groups %lld, channels %lld, eps %g); "
                           "make it with nb_nn_group_norm_init",
                           nbi_nn_where(&at, w, sizeof w), (long long)groups, (long long)channels,
                           eps);
    }
    char expect[128];
    snprintf(expect, sizeof expect, "an array whose axis %lld is the %lld channels", (long long)cax,
             (long long)channels);
    if (!nbi_nn_check_input(&at, x, 1, NB_MAX_RANK - 1, expect)) {
        return tr->poison;
    }
    int r = nb_var_rank(x);
    int ax = (int)(cax < 0 ? cax + r : cax);
    if (ax < 0 || ax >= r || nb_var_dim(x, ax) != channels) {
        return nbi_nn_fail(&at, NB_ERR_SHAPE, "the input%s%s%s of %s is %s; expected %s",
                           x->path ? " '" : "", x->path ? x->path : "", x->path ? "'" : "",
                           nbi_nn_where(&at, w, sizeof w), nbi_nn_sig(xs, sizeof xs, x), expect);
    }
    nb_var *wv = NULL, *bv = NULL;
    if (!nbi_nn_param(&at, "weight", true, 1, &channels, x, &wv) ||
        !nbi_nn_param(&at, "bias", true, 1, &channels, x, &bv)) {
        return tr->poison;
    }
    /* Equinox: y = x.reshape(groups, C / groups, *rest); per group mean and biased
     * variance (jnp.mean, jnp.var), out = (y - mean) * rsqrt(max(var, 0) + eps), then
     * weight * out + bias with weight broadcast along the channel axis. */
    int64_t gshape[NB_MAX_RANK + 1];
    int gr = 0;
    for (int a = 0; a < r; a++) {
        if (a == ax) {
            gshape[gr++] = groups;
            gshape[gr++] = channels / groups;
        } else {
            gshape[gr++] = nb_var_dim(x, a);
        }
    }
    nb_var *y = nb_reshape(x, gr, gshape);
    int axes[NB_MAX_RANK + 1], na = 0;
    for (int a = ax + 1; a < gr; a++) {
        axes[na++] = a;
    }
    nb_var *mean = nb_mean(y, axes, na, true);
    nb_var *yc = nb_sub(y, mean);
    nb_var *var = nb_mean(nb_square(yc), axes, na, true); /* >= 0: max(var, 0) is moot */
    nb_var *out = nb_mul(yc, nb_rsqrt(nb_add(var, nb_scalar(tr, eps))));
    out = nb_reshape(out, r, nb_var_shape(x));
    if (wv != NULL || bv != NULL) {
        int64_t bshape[NB_MAX_RANK];
        for (int a = 0; a < r - ax; a++) {
            bshape[a] = a == 0 ? channels : 1;
        }
        if (wv != NULL) {
            out = nb_mul(nb_reshape(wv, r - ax, bshape), out);
        }
        if (bv != NULL) {
            out = nb_add(out, nb_reshape(bv, r - ax, bshape));
        }
    }
    return out;
}

/* ---- RMSNorm ------------------------------------------------------------------------ */

nb_status nb_nn_rms_norm_init(nb_ctx *ctx, int rank, const int64_t *shape, double eps,
                              bool use_weight, bool use_bias, nb_dtype dtype, nb_tree **layer) {
    return nbi_trailing_norm_make(ctx, "nb_nn_rms_norm_init", "rms_norm", rank, shape, eps,
                                  use_weight, use_bias, dtype, layer);
}

nb_var *nb_nn_rms_norm(nb_trace *tr, const nb_tree *layer, nb_var *x) {
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_rms_norm", "rms_norm", layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    int r = 0, axes[NB_MAX_RANK];
    double eps = 0;
    nb_var *wv = NULL, *bv = NULL;
    if (!nbi_trailing_norm_read(&at, x, &r, axes, &eps, &wv, &bv)) {
        return tr->poison;
    }
    /* Equinox: inv_rms = rsqrt(mean(x**2) + eps), out = inv_rms * x, then weight * out
     * and out + bias. */
    nb_var *inv = nb_rsqrt(nb_add(nb_mean(nb_square(x), axes, r, true), nb_scalar(tr, eps)));
    nb_var *out = nb_mul(inv, x);
    if (wv != NULL) {
        out = nb_mul(wv, out);
    }
    if (bv != NULL) {
        out = nb_add(out, bv);
    }
    return out;
}
