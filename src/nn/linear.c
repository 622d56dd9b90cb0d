/*
 * linear.c -- Linear and MLP layers (Equinox's eqx.nn.Linear and eqx.nn.MLP; see
 * nabla/nn.h for the initialisation rules).
 */
#include "nn/nn_internal.h"

#include <math.h>
#include <string.h>

/* ---- init --------------------------------------------------------------------------- */

/* A Linear layer; arguments already checked. */
static nb_status nbi_nn_linear_make(nb_ctx *ctx, int64_t in, int64_t out, bool use_bias,
                                    nb_dtype dtype, const nb_array *key, nb_tree **layer) {
    nb_array *keys = NULL, *wk = NULL, *bk = NULL, *w = NULL, *b = NULL;
    nb_status st = nb_random_split(key, 2, &keys);
    if (st == NB_OK) {
        st = nbi_nn_key_row(keys, 0, &wk);
    }
    if (st == NB_OK) {
        st = nbi_nn_key_row(keys, 1, &bk);
    }
    /* Equinox: lim = 1 / math.sqrt(in_features), for the weight and the bias. */
    double lim = 1.0 / sqrt((double)in);
    if (st == NB_OK) {
        st = nbi_nn_uniform(wk, dtype, 2, (const int64_t[]){out, in}, lim, &w);
    }
    if (st == NB_OK && use_bias) {
        st = nbi_nn_uniform(bk, dtype, 1, (const int64_t[]){out}, lim, &b);
    }
    nb_array_destroy(bk);
    nb_array_destroy(wk);
    nb_array_destroy(keys);
    if (st != NB_OK) {
        nb_array_destroy(w);
        nb_array_destroy(b);
        return st;
    }
    nbi_nn_dict d;
    nbi_nn_dict_begin(&d, ctx, "linear");
    nbi_nn_put_array(&d, "weight", NB_OK, w);
    if (use_bias) {
        nbi_nn_put_array(&d, "bias", NB_OK, b);
    } else {
        nbi_nn_put_null(&d, "bias");
    }
    nbi_nn_put_int(&d, "in_features", in);
    nbi_nn_put_int(&d, "out_features", out);
    nbi_nn_put_bool(&d, "use_bias", use_bias);
    return nbi_nn_dict_finish(&d, layer);
}

nb_status nb_nn_linear_init(nb_ctx *ctx, int64_t in, int64_t out, bool use_bias, nb_dtype dtype,
                            const nb_array *key, nb_tree **layer) {
    static const char fn[] = "nb_nn_linear_init";
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (ctx == NULL) {
        st = nbi_err_null_ctx(key, fn); /* the key knows the context */
    }
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "in (in_features)", in, 1);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "out (out_features)", out, 1);
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
    return nbi_nn_linear_make(ctx, in, out, use_bias, dtype, key, layer);
}

nb_nn_mlp_opts nb_nn_mlp_opts_default(void) {
    nb_nn_mlp_opts o;
    memset(&o, 0, sizeof o);
    o.activation = nb_relu;
    o.final_activation = nb_nn_identity;
    o.use_bias = true;
    o.use_final_bias = true;
    return o;
}

nb_status nb_nn_mlp_init(nb_ctx *ctx, int64_t in, int64_t out, int64_t width, int64_t depth,
                         const nb_nn_mlp_opts *opts, nb_dtype dtype, const nb_array *key,
                         nb_tree **layer) {
    static const char fn[] = "nb_nn_mlp_init";
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (ctx == NULL) {
        st = nbi_err_null_ctx(key, fn); /* the key knows the context */
    }
    nb_nn_mlp_opts o = opts != NULL ? *opts : nb_nn_mlp_opts_default();
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "in (in_size)", in, 1);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "out (out_size)", out, 1);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "depth", depth, 0);
    }
    if (st == NB_OK && depth > 4096) {
        st = nbi_err(ctx, NB_ERR_INVALID, "%s: depth is %lld; at most 4096 layers", fn,
                     (long long)depth);
    }
    if (st == NB_OK && depth > 0) {
        st = nbi_nn_check_size(ctx, fn, "width (width_size, with depth > 0)", width, 1);
    }
    if (st == NB_OK && (o.activation == NULL || o.final_activation == NULL)) {
        st = nbi_err(ctx, NB_ERR_INVALID,
                     "%s: opts.%s is NULL; use nb_nn_identity for no activation", fn,
                     o.activation == NULL ? "activation" : "final_activation");
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
    int64_t n = depth + 1;
    nb_tree **layers = nbi_alloc(ctx, (size_t)n * sizeof *layers, 8);
    if (layers == NULL) {
        return nbi_oom(ctx, fn, (size_t)n * sizeof *layers);
    }
    memset(layers, 0, (size_t)n * sizeof *layers);
    nb_array *keys = NULL;
    /* Equinox: keys = jrandom.split(key, depth + 1); layer i gets keys[i]. */
    st = nb_random_split(key, n, &keys);
    for (int64_t i = 0; i < n && st == NB_OK; i++) {
        nb_array *ki = NULL;
        st = nbi_nn_key_row(keys, i, &ki);
        int64_t li = i == 0 ? in : width, lo = i == n - 1 ? out : width;
        bool bias = i == n - 1 ? o.use_final_bias : o.use_bias;
        if (st == NB_OK) {
            st = nbi_nn_linear_make(ctx, li, lo, bias, dtype, ki, &layers[i]);
        }
        nb_array_destroy(ki);
    }
    nb_array_destroy(keys);
    nb_tree *list = NULL, *act = NULL, *fact = NULL;
    if (st == NB_OK) {
        st = nb_tree_list(ctx, n, layers, &list);
    }
    for (int64_t i = 0; i < n; i++) {
        nb_tree_destroy(layers[i]);
    }
    nbi_free(ctx, layers, (size_t)n * sizeof *layers);
    if (st == NB_OK) {
        st = nb_nn_activation_leaf(ctx, o.activation, o.activation_name, &act);
    }
    if (st == NB_OK) {
        st = nb_nn_activation_leaf(ctx, o.final_activation, o.final_activation_name, &fact);
    }
    if (st != NB_OK) {
        nb_tree_destroy(list);
        nb_tree_destroy(act);
        nb_tree_destroy(fact);
        return st;
    }
    nbi_nn_dict d;
    nbi_nn_dict_begin(&d, ctx, "mlp");
    nbi_nn_put(&d, "layers", NB_OK, list);
    nbi_nn_put(&d, "activation", NB_OK, act);
    nbi_nn_put(&d, "final_activation", NB_OK, fact);
    nbi_nn_put_int(&d, "in_size", in);
    nbi_nn_put_int(&d, "out_size", out);
    nbi_nn_put_int(&d, "width_size", width);
    nbi_nn_put_int(&d, "depth", depth);
    nbi_nn_put_bool(&d, "use_bias", o.use_bias);
    nbi_nn_put_bool(&d, "use_final_bias", o.use_final_bias);
    return nbi_nn_dict_finish(&d, layer);
}

/* ---- apply -------------------------------------------------------------------------- */

nb_var *nb_nn_linear(nb_trace *tr, const nb_tree *layer, nb_var *x) {
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_linear", "linear", layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    int64_t in = 0, out = 0;
    if (!nbi_nn_int(&at, "in_features", &in) || !nbi_nn_int(&at, "out_features", &out)) {
        return tr->poison;
    }
    char expect[64];
    snprintf(expect, sizeof expect, "[..., %lld] (in_features %lld)", (long long)in, (long long)in);
    if (!nbi_nn_check_input(&at, x, 1, NB_MAX_RANK, expect)) {
        return tr->poison;
    }
    if (nb_var_dim(x, -1) != in) {
        char w[NB_PATH_MAX + 64], xs[96];
        return nbi_nn_fail(&at, NB_ERR_SHAPE,
                           "the input%s%s%s of %s is %s; its last dim must be in_features %lld "
                           "(x is [..., in] and the weight [out, in] = [%lld, %lld])",
                           x->path ? " '" : "", x->path ? x->path : "", x->path ? "'" : "",
                           nbi_nn_where(&at, w, sizeof w), nbi_nn_sig(xs, sizeof xs, x),
                           (long long)in, (long long)out, (long long)in);
    }
    nb_var *wv = NULL, *bv = NULL;
    if (!nbi_nn_param(&at, "weight", false, 2, (const int64_t[]){out, in}, x, &wv) ||
        !nbi_nn_param(&at, "bias", true, 1, (const int64_t[]){out}, x, &bv)) {
        return tr->poison;
    }
    /* y = x W^T (+ b): leading dims folded into the rows of one matrix product. */
    int r = nb_var_rank(x);
    nb_var *y;
    if (r <= 2) {
        y = nb_matmul(x, nb_transpose(wv, NULL));
    } else {
        int64_t shape[NB_MAX_RANK];
        memcpy(shape, nb_var_shape(x), (size_t)r * sizeof *shape);
        nb_var *x2 = nb_reshape(x, 2, (const int64_t[]){-1, in});
        y = nb_matmul(x2, nb_transpose(wv, NULL));
        shape[r - 1] = out;
        y = nb_reshape(y, r, shape);
    }
    if (bv != NULL) {
        y = nb_add(y, bv);
    }
    return y;
}

nb_var *nb_nn_mlp(nb_trace *tr, const nb_tree *layer, nb_var *x) {
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_mlp", "mlp", layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    if (x == NULL) {
        return nbi_nn_fail(&at, NB_ERR_MISUSE, "x is a NULL var (pass the MLP's input)");
    }
    int64_t depth = 0;
    nb_nn_activation act = NULL, fact = NULL;
    if (!nbi_nn_int(&at, "depth", &depth) || !nbi_nn_fn(&at, "activation", &act) ||
        !nbi_nn_fn(&at, "final_activation", &fact)) {
        return tr->poison;
    }
    const nb_tree *layers = nb_tree_get(layer, "layers");
    nb_tree_kind k = nb_tree_kind_of(layers);
    if (layers == NULL || (k != NB_TREE_KIND_LIST && k != NB_TREE_KIND_TUPLE) ||
        nb_tree_len(layers) != depth + 1) {
        char w[NB_PATH_MAX + 64];
        return nbi_nn_fail(&at, NB_ERR_STRUCTURE,
                           "%s: 'layers' must be a list of depth + 1 = %lld Linear layers; it is "
                           "%s of %lld (layer trees are made by nb_nn_mlp_init)",
                           nbi_nn_where(&at, w, sizeof w), (long long)(depth + 1),
                           layers == NULL ? "missing" : nb_tree_kind_name(k),
                           (long long)(layers == NULL ? 0 : nb_tree_len(layers)));
    }
    for (int64_t i = 0; i <= depth; i++) {
        x = nb_nn_linear(tr, nb_tree_child(layers, i), x);
        if (nb_var_is_poison(x)) {
            return x;
        }
        x = i < depth ? act(x) : fact(x);
    }
    return x;
}
