/*
 * attention.c -- MultiheadAttention (Equinox's eqx.nn.MultiheadAttention).
 *
 * Layout and initialisation are Equinox's: keys = split(key, 4); four Linears
 *     query_proj: query_size -> heads * qk_size   (bias: use_query_bias, default none)
 *     key_proj:   key_size   -> heads * qk_size
 *     value_proj: value_size -> heads * vo_size
 *     output_proj: heads * vo_size -> output_size
 * made with keys 0..3, and a Dropout(dropout_p, inference). The call, per head h:
 *     q_h = query_proj(query)[.., h] / sqrt(qk_size);  logits = q_h k_h^T  [Sq, Skv]
 *     logits = where(mask, logits, finfo.min);  w = softmax(logits) (max-subtracted)
 *     w = dropout(w, keys_h)  (keys = split(key, heads), training mode only)
 *     attn_h = w v_h;  output_proj(concat over heads)
 * with every head in one batched matrix product ([.., H, Sq, qk] x [.., H, qk, Skv]).
 * Leading batch dims of query, key and value are carried through (Equinox would vmap);
 * with them a head's dropout mask covers the whole batch (one draw of shape
 * [.., Sq, Skv] per head key), so only an unbatched call reproduces Equinox's masks.
 * The causal flag (a nabla addition) masks key positions j > i, as a tril mask would.
 */
#include "nn/nn_internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

nb_nn_mha_opts nb_nn_mha_opts_default(void) {
    nb_nn_mha_opts o;
    memset(&o, 0, sizeof o);
    return o;
}

nb_status nb_nn_multihead_attention_init(nb_ctx *ctx, int64_t num_heads, int64_t query_size,
                                         const nb_nn_mha_opts *opts, nb_dtype dtype,
                                         const nb_array *key, nb_tree **layer) {
    static const char fn[] = "nb_nn_multihead_attention_init";
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (ctx == NULL) {
        st = nbi_err_null_ctx(key, fn);
    }
    if (st != NB_OK) {
        return st;
    }
    nb_nn_mha_opts o = opts != NULL ? *opts : nb_nn_mha_opts_default();
    st = nbi_nn_check_size(ctx, fn, "num_heads", num_heads, 1);
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "query_size", query_size, 1);
    }
    if (st != NB_OK) {
        return st; /* (num_heads divides below) */
    }
    int64_t ks = o.key_size ? o.key_size : query_size;
    int64_t vs = o.value_size ? o.value_size : query_size;
    int64_t os = o.output_size ? o.output_size : query_size;
    int64_t qk = o.qk_size ? o.qk_size : query_size / num_heads;
    int64_t vo = o.vo_size ? o.vo_size : query_size / num_heads;
    const char *names[5] = {"opts.key_size", "opts.value_size", "opts.output_size", "opts.qk_size",
                            "opts.vo_size"};
    const int64_t vals[5] = {ks, vs, os, qk, vo};
    for (int i = 0; i < 5 && st == NB_OK; i++) {
        if (i >= 3 && vals[i] == 0 && st == NB_OK) {
            st = nbi_err(ctx, NB_ERR_INVALID,
                         "%s: %s defaults to query_size / num_heads = %lld / %lld = 0; pass "
                         "it (>= 1) or use fewer heads",
                         fn, names[i], (long long)query_size, (long long)num_heads);
        }
        if (st == NB_OK) {
            st = nbi_nn_check_size(ctx, fn, names[i], vals[i], 1);
        }
    }
    if (st == NB_OK && (num_heads * qk > NBI_NN_SIZE_MAX || num_heads * vo > NBI_NN_SIZE_MAX)) {
        st = nbi_err(ctx, NB_ERR_INVALID, "%s: num_heads * qk_size or * vo_size exceeds 2^31", fn);
    }
    if (st == NB_OK && !(o.dropout_p >= 0 && o.dropout_p < 1)) {
        st = nbi_err(ctx, NB_ERR_INVALID, "%s: opts.dropout_p is %g; it must be in [0, 1)", fn,
                     o.dropout_p);
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
    nb_array *keys = NULL;
    nb_tree *proj[4] = {NULL, NULL, NULL, NULL}, *drop = NULL;
    st = nb_random_split(key, 4, &keys);
    const int64_t pin[4] = {query_size, ks, vs, num_heads * vo};
    const int64_t pout[4] = {num_heads * qk, num_heads * qk, num_heads * vo, os};
    const bool pbias[4] = {o.use_query_bias, o.use_key_bias, o.use_value_bias, o.use_output_bias};
    for (int i = 0; i < 4 && st == NB_OK; i++) {
        nb_array *k = NULL;
        st = nbi_nn_key_row(keys, i, &k);
        if (st == NB_OK) {
            st = nb_nn_linear_init(ctx, pin[i], pout[i], pbias[i], dtype, k, &proj[i]);
        }
        nb_array_destroy(k);
    }
    nb_array_destroy(keys);
    if (st == NB_OK) {
        st = nb_nn_dropout_init(ctx, o.dropout_p, o.inference, &drop);
    }
    nbi_nn_dict d;
    nbi_nn_dict_begin(&d, ctx, "multihead_attention");
    static const char *const pk[4] = {"query_proj", "key_proj", "value_proj", "output_proj"};
    for (int i = 0; i < 4; i++) {
        nbi_nn_put(&d, pk[i], st, proj[i]);
    }
    nbi_nn_put(&d, "dropout", st, drop);
    nbi_nn_put_int(&d, "num_heads", num_heads);
    nbi_nn_put_int(&d, "query_size", query_size);
    nbi_nn_put_int(&d, "key_size", ks);
    nbi_nn_put_int(&d, "value_size", vs);
    nbi_nn_put_int(&d, "output_size", os);
    nbi_nn_put_int(&d, "qk_size", qk);
    nbi_nn_put_int(&d, "vo_size", vo);
    nbi_nn_put_bool(&d, "causal", o.causal);
    return nbi_nn_dict_finish(&d, layer);
}

/* The layer's projection of x [.., S, in] into [.., H, S, size] (heads before the
 * sequence). */
static nb_var *nbi_mha_heads(const nbi_nn_at *at, const char *proj, nb_var *x, int64_t h,
                             int64_t size) {
    const nb_tree *p = nb_tree_get(at->layer, proj);
    nb_var *y = nb_nn_linear(at->tr, p, x);
    if (nb_var_is_poison(y)) {
        return y;
    }
    int r = nb_var_rank(y);
    int64_t shape[NB_MAX_RANK + 1];
    memcpy(shape, nb_var_shape(y), (size_t)(r - 1) * sizeof(int64_t));
    shape[r - 1] = h;
    shape[r] = size;
    y = nb_reshape(y, r + 1, shape); /* [.., S, H, size] */
    int perm[NB_MAX_RANK + 1];
    for (int i = 0; i <= r; i++) {
        perm[i] = i;
    }
    perm[r - 2] = r - 1;
    perm[r - 1] = r - 2;
    return nb_transpose(y, perm); /* [.., H, S, size] */
}

nb_var *nb_nn_multihead_attention(nb_trace *tr, const nb_tree *layer, nb_var *query, nb_var *key_,
                                  nb_var *value, nb_var *mask, nb_var *key) {
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_multihead_attention", "multihead_attention", layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    int64_t h = 0, qs = 0, ks = 0, vs = 0, os = 0, qk = 0, vo = 0;
    bool causal = false;
    if (!nbi_nn_int(&at, "num_heads", &h) || !nbi_nn_int(&at, "query_size", &qs) ||
        !nbi_nn_int(&at, "key_size", &ks) || !nbi_nn_int(&at, "value_size", &vs) ||
        !nbi_nn_int(&at, "output_size", &os) || !nbi_nn_int(&at, "qk_size", &qk) ||
        !nbi_nn_int(&at, "vo_size", &vo) || !nbi_nn_bool(&at, "causal", &causal)) {
        return tr->poison;
    }
    char w[NB_PATH_MAX + 64], s1[96], s2[96], s3[96];
    if (h < 1 || qk < 1 || vo < 1 || h > NBI_NN_SIZE_MAX || qk > NBI_NN_SIZE_MAX ||
        vo > NBI_NN_SIZE_MAX) {
        return nbi_nn_fail(&at, NB_ERR_INVALID,
                           "%s has invalid static sizes (num_heads %lld, qk_size %lld, vo_size "
                           "%lld); make it with nb_nn_multihead_attention_init",
                           nbi_nn_where(&at, w, sizeof w), (long long)h, (long long)qk,
                           (long long)vo);
    }
    char eq[64], ek[64], ev[64];
    snprintf(eq, sizeof eq, "[..., Sq, %lld] (query_size)", (long long)qs);
    snprintf(ek, sizeof ek, "[..., Skv, %lld] (key_size)", (long long)ks);
    snprintf(ev, sizeof ev, "[..., Skv, %lld] (value_size)", (long long)vs);
    if (!nbi_nn_check_input(&at, query, 2, NB_MAX_RANK - 1, eq) ||
        !nbi_nn_check_input(&at, key_, 2, NB_MAX_RANK - 1, ek) ||
        !nbi_nn_check_input(&at, value, 2, NB_MAX_RANK - 1, ev)) {
        return tr->poison;
    }
    int r = nb_var_rank(query);
    bool ok = nb_var_rank(key_) == r && nb_var_rank(value) == r && nb_var_dim(query, -1) == qs &&
              nb_var_dim(key_, -1) == ks && nb_var_dim(value, -1) == vs &&
              nb_var_dim(key_, -2) == nb_var_dim(value, -2);
    for (int a = 0; ok && a < r - 2; a++) {
        ok = nb_var_dim(query, a) == nb_var_dim(key_, a) &&
             nb_var_dim(query, a) == nb_var_dim(value, a);
    }
    if (!ok) {
        return nbi_nn_fail(&at, NB_ERR_SHAPE,
                           "%s got query %s, key %s, value %s; expected query %s, key %s and "
                           "value %s with the same leading (batch) dims and key and value "
                           "of one length Skv",
                           nbi_nn_where(&at, w, sizeof w), nbi_nn_sig(s1, sizeof s1, query),
                           nbi_nn_sig(s2, sizeof s2, key_), nbi_nn_sig(s3, sizeof s3, value), eq,
                           ek, ev);
    }
    int64_t sq = nb_var_dim(query, -2), skv = nb_var_dim(key_, -2);
    if (mask != NULL) {
        if (nb_var_is_poison(mask)) {
            return mask;
        }
        /* by rank: 2 [Sq, Skv] (everywhere); r, the query's, [.., Sq, Skv] (per example,
         * every head; r = 2 is the first case); r + 1 [.., H, Sq, Skv] (per head) */
        int mr = nb_var_rank(mask);
        bool heads = mr == r + 1;
        if (nb_var_dtype(mask) != NB_DTYPE_BOOL || (mr != 2 && mr != r && !heads) ||
            nb_var_dim(mask, -1) != skv || nb_var_dim(mask, -2) != sq ||
            (heads && nb_var_dim(mask, -3) != h && nb_var_dim(mask, -3) != 1)) {
            return nbi_nn_fail(&at, NB_ERR_SHAPE,
                               "the mask of %s is %s; expected a bool [Sq, Skv] = [%lld, %lld] "
                               "(everywhere), [num_heads, Sq, Skv] = [%lld, %lld, %lld] (per "
                               "head), or with the query's leading batch dims in front of "
                               "either (per example) (true: attend)",
                               nbi_nn_where(&at, w, sizeof w), nbi_nn_sig(s1, sizeof s1, mask),
                               (long long)sq, (long long)skv, (long long)h, (long long)sq,
                               (long long)skv);
        }
        if (!heads) {
            mask = nb_expand_dims(mask, -3); /* [.., 1, Sq, Skv]: the same for every head */
        }
    }
    nb_var *qh = nbi_mha_heads(&at, "query_proj", query, h, qk);
    nb_var *kh = nbi_mha_heads(&at, "key_proj", key_, h, qk);
    nb_var *vh = nbi_mha_heads(&at, "value_proj", value, h, vo);
    if (nb_var_is_poison(qh) || nb_var_is_poison(kh) || nb_var_is_poison(vh)) {
        return tr->poison;
    }
    nb_dtype dt = nb_var_dtype(qh);
    int hr = r + 1; /* [.., H, S, size] */
    int perm[NB_MAX_RANK];
    for (int i = 0; i < hr; i++) {
        perm[i] = i;
    }
    perm[hr - 2] = hr - 1;
    perm[hr - 1] = hr - 2;
    nb_var *q = nb_div(qh, nb_sqrt(nb_scalar_typed(tr, dt, (double)qk)));
    nb_var *logits = nb_matmul(q, nb_transpose(kh, perm)); /* [.., H, Sq, Skv] */
    if (causal) {
        nb_var *i = nb_iota(tr, NB_DTYPE_I64, 2, (const int64_t[]){sq, skv}, 0);
        nb_var *j = nb_iota(tr, NB_DTYPE_I64, 2, (const int64_t[]){sq, skv}, 1);
        nb_var *tril = nb_le(j, i);
        mask = mask != NULL ? nb_logical_and(mask, tril) : tril;
    }
    if (mask != NULL) {
        double lowest = dt == NB_DTYPE_F32 ? -(double)FLT_MAX : -DBL_MAX;
        logits = nb_select(mask, logits, nb_scalar_typed(tr, dt, lowest));
    }
    nb_var *wts = nb_softmax(logits, -1);
    const nb_tree *drop = nb_tree_get(layer, "dropout");
    double p = 0;
    bool inference = true;
    if (drop == NULL || nb_tree_kind_of(drop) != NB_TREE_KIND_DICT ||
        nb_tree_get_float(nb_tree_get(drop, "p"), &p) != NB_OK ||
        nb_tree_get_bool(nb_tree_get(drop, "inference"), &inference) != NB_OK) {
        return nbi_nn_fail(&at, NB_ERR_STRUCTURE,
                           "%s: 'dropout' must be a dropout layer (layer trees are made by "
                           "nb_nn_multihead_attention_init)",
                           nbi_nn_where(&at, w, sizeof w));
    }
    if (!inference && p > 0) {
        if (key == NULL) {
            return nbi_nn_fail(&at, NB_ERR_INVALID,
                               "%s drops attention weights (dropout p = %g, training mode) but "
                               "no key was given; pass an i32[2] PRNG key var, or switch the "
                               "layer to inference with nb_nn_inference_mode",
                               nbi_nn_where(&at, w, sizeof w), p);
        }
        nb_var *keys = nb_rng_split(key, h);
        nb_var **heads = nbi_arena_alloc(&tr->arena, (size_t)h * sizeof(nb_var *));
        if (heads == NULL) {
            return nbi_nn_fail(&at, NB_ERR_OOM, "out of memory for %lld heads", (long long)h);
        }
        int64_t start[NB_MAX_RANK] = {0}, stop[NB_MAX_RANK];
        memcpy(stop, nb_var_shape(wts), (size_t)hr * sizeof(int64_t));
        for (int64_t i = 0; i < h; i++) {
            start[hr - 3] = i;
            stop[hr - 3] = i + 1;
            nb_var *wh = nb_squeeze(nb_slice(wts, start, stop, NULL), (const int[]){hr - 3}, 1);
            nb_var *ki = nb_take(keys, nb_scalar_typed(tr, NB_DTYPE_I64, (double)i), 0);
            heads[i] = nb_nn_dropout(tr, drop, wh, ki);
        }
        wts = nb_stack((int)h, heads, hr - 3);
    }
    nb_var *attn = nb_matmul(wts, vh); /* [.., H, Sq, vo] */
    /* -> [.., Sq, H, vo] -> [.., Sq, H * vo] */
    int perm2[NB_MAX_RANK];
    for (int i = 0; i < hr; i++) {
        perm2[i] = i;
    }
    perm2[hr - 3] = hr - 2;
    perm2[hr - 2] = hr - 3;
    attn = nb_transpose(attn, perm2);
    int64_t oshape[NB_MAX_RANK];
    memcpy(oshape, nb_var_shape(query), (size_t)r * sizeof(int64_t));
    oshape[r - 1] = h * vo;
    attn = nb_reshape(attn, r, oshape);
    return nb_nn_linear(tr, nb_tree_get(layer, "output_proj"), attn);
}
