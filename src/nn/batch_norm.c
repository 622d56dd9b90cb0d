/*
 * batch_norm.c -- BatchNorm (Equinox's eqx.nn.BatchNorm), a stateful layer.
 *
 * Equinox keeps a BatchNorm's running statistics outside the model, in a State pytree
 * threaded through every call (eqx.nn.make_with_state); its BatchNorm runs under
 * jax.vmap(..., axis_name="batch") and averages over that axis with lax.pmean. Here the
 * batch is an explicit leading axis and the state a plain tree returned next to the
 * layer by nb_nn_batch_norm_init; the call returns the new state, to be returned from the
 * body next to the output. Its structure never changes (the same leaves, dtypes and
 * shapes before and after every call, in training and inference), so a jitted train step
 * traces once.
 *
 * Statistics, per channel c of x [N, C, *spatial], in Equinox's order: the mean over the
 * spatial dims of each example, then the mean of those over the batch (pmean); the
 * variance likewise from the squared deviations from that mean, clamped at 0 by max.
 * Normalisation: (x - mean) / sqrt(var + eps), then * weight + bias (channelwise_affine).
 *
 * Mode "batch" (Equinox's recommended mode; state {counter i32[], mean [C], var [C]}, 0,
 * zeros, ones): training normalises with the batch statistics and updates
 *     mean <- mean * momentum + batch_mean * (1 - momentum)   (likewise var), counter += 1;
 * inference normalises with mean / s and var / s, s = 1 - momentum^counter (1 while the
 * counter is 0): the running averages debiased as Adam's moments.
 * Mode "ema" (Equinox's default; state {first_time bool[], mean [C], var [C]}): training
 * normalises with m = (1 - momentum) batch_mean + momentum mean (the batch statistics
 * themselves on the first call) and stores m; inference uses the stored values.
 */
#include "nn/nn_internal.h"

#include <math.h>
#include <string.h>

nb_nn_batch_norm_opts nb_nn_batch_norm_opts_default(void) {
    nb_nn_batch_norm_opts o;
    memset(&o, 0, sizeof o);
    o.eps = 1e-5;
    o.channelwise_affine = true;
    o.momentum = 0.99;
    o.mode = NB_NN_BATCH_NORM_BATCH;
    o.inference = false;
    return o;
}

static nb_status nbi_bn_state(nb_ctx *ctx, int64_t c, nb_nn_batch_norm_mode mode, nb_dtype dtype,
                              nb_tree **state) {
    nbi_nn_dict d; /* no "kind" leaf: the call's new state has the same three leaves */
    memset(&d, 0, sizeof d);
    d.ctx = ctx;
    nb_array *a = NULL;
    nb_status st;
    if (mode == NB_NN_BATCH_NORM_BATCH) {
        st = nb_array_zeros(ctx, NB_DTYPE_I32, 0, NULL, &a);
        nbi_nn_put_array(&d, "counter", st, a);
    } else {
        st = nb_array_ones(ctx, NB_DTYPE_BOOL, 0, NULL, &a);
        nbi_nn_put_array(&d, "first_time", st, a);
    }
    a = NULL;
    st = nb_array_zeros(ctx, dtype, 1, &c, &a);
    nbi_nn_put_array(&d, "mean", st, a);
    a = NULL;
    st = mode == NB_NN_BATCH_NORM_BATCH ? nb_array_ones(ctx, dtype, 1, &c, &a)
                                        : nb_array_zeros(ctx, dtype, 1, &c, &a);
    nbi_nn_put_array(&d, "var", st, a);
    return nbi_nn_dict_finish(&d, state);
}

nb_status nb_nn_batch_norm_init(nb_ctx *ctx, int64_t channels, const nb_nn_batch_norm_opts *opts,
                                nb_dtype dtype, nb_tree **layer, nb_tree **state) {
    static const char fn[] = "nb_nn_batch_norm_init";
    if (state != NULL) {
        *state = NULL;
    }
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (st != NB_OK) {
        return st;
    }
    if (state == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: state is NULL; a BatchNorm comes with its state tree (the running "
                       "statistics), which every call takes and returns",
                       fn);
    }
    nb_nn_batch_norm_opts o = opts != NULL ? *opts : nb_nn_batch_norm_opts_default();
    st = nbi_nn_check_size(ctx, fn, "channels", channels, 1);
    if (st == NB_OK && !(o.eps >= 0 && isfinite(o.eps))) {
        st = nbi_err(ctx, NB_ERR_INVALID,
                     "%s: opts.eps is %g; it must be finite and >= 0 (default 1e-5)", fn, o.eps);
    }
    if (st == NB_OK && !(o.momentum >= 0 && o.momentum <= 1)) {
        st = nbi_err(ctx, NB_ERR_INVALID,
                     "%s: opts.momentum is %g; it must be in [0, 1] (default 0.99: the running "
                     "statistics keep 99%% of their value each step)",
                     fn, o.momentum);
    }
    if (st == NB_OK && o.mode != NB_NN_BATCH_NORM_BATCH && o.mode != NB_NN_BATCH_NORM_EMA) {
        st = nbi_err(ctx, NB_ERR_INVALID,
                     "%s: opts.mode is %d; use NB_NN_BATCH_NORM_BATCH or NB_NN_BATCH_NORM_EMA", fn,
                     (int)o.mode);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_dtype(ctx, fn, dtype);
    }
    if (st != NB_OK) {
        return st;
    }
    nbi_nn_dict d;
    nbi_nn_dict_begin(&d, ctx, "batch_norm");
    nbi_nn_put_affine(&d, dtype, 1, &channels, o.channelwise_affine, o.channelwise_affine);
    nbi_nn_put_int(&d, "input_size", channels);
    nbi_nn_put_float(&d, "eps", o.eps);
    nbi_nn_put_float(&d, "momentum", o.momentum);
    nb_tree *mode = NULL;
    st = nb_tree_string(ctx, o.mode == NB_NN_BATCH_NORM_BATCH ? "batch" : "ema", &mode);
    nbi_nn_put(&d, "mode", st, mode);
    nbi_nn_put_bool(&d, "channelwise_affine", o.channelwise_affine);
    nbi_nn_put_bool(&d, "inference", o.inference);
    st = nbi_nn_dict_finish(&d, layer);
    if (st == NB_OK) {
        st = nbi_bn_state(ctx, channels, o.mode, dtype, state);
        if (st != NB_OK) {
            nb_tree_destroy(*layer);
            *layer = NULL;
        }
    }
    return st;
}

/* The state leaf under key as a var of the dtype and shape (rank 0 or [C]); NULL after a
 * sticky error naming the state, the leaf and the fix. */
static nb_var *nbi_bn_leaf(const nbi_nn_at *at, const nb_tree *state, const char *key, nb_dtype dt,
                           int rank, int64_t c) {
    char w[NB_PATH_MAX + 64], d[128], got[96];
    const nb_tree *t = nb_tree_kind_of(state) == NB_TREE_KIND_DICT ? nb_tree_get(state, key) : NULL;
    nb_var *v = NULL;
    if (t != NULL && nb_tree_kind_of(t) == NB_TREE_KIND_VAR) {
        v = nb_var_of(at->tr, t);
    } else if (t != NULL && nb_tree_kind_of(t) == NB_TREE_KIND_ARRAY) {
        v = nb_constant(at->tr, nb_tree_get_array(t));
    }
    if (v == NULL) {
        nbi_nn_fail(at, NB_ERR_STRUCTURE,
                    "the state of %s has no array '%s' (it is %s); pass the state tree made by "
                    "nb_nn_batch_norm_init for this layer's mode, or the one the last call "
                    "returned",
                    nbi_nn_where(at, w, sizeof w), key, nbi_nn_describe(state, d, sizeof d));
        return NULL;
    }
    if (nb_var_is_poison(v)) {
        return NULL;
    }
    if (nb_var_dtype(v) != dt || nb_var_rank(v) != rank || (rank == 1 && nb_var_dim(v, 0) != c)) {
        char want[64];
        snprintf(want, sizeof want, rank == 0 ? "%s[]" : "%s[%lld]", nb_dtype_name(dt),
                 (long long)c);
        nbi_nn_fail(at, NB_ERR_SHAPE,
                    "the state of %s: '%s' is %s, expected %s (the state of another layer, or "
                    "edited?)",
                    nbi_nn_where(at, w, sizeof w), v->path ? v->path : key,
                    nbi_nn_sig(got, sizeof got, v), want);
        return NULL;
    }
    return v;
}

nb_var *nb_nn_batch_norm(nb_trace *tr, const nb_tree *layer, nb_var *x, const nb_tree *state,
                         const nb_tree **new_state) {
    if (new_state != NULL) {
        *new_state = state;
    }
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_batch_norm", "batch_norm", layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    char w[NB_PATH_MAX + 64], xs[96];
    if (new_state == NULL) {
        return nbi_nn_fail(&at, NB_ERR_MISUSE,
                           "new_state is NULL for %s; the call returns the updated running "
                           "statistics there (return them from the body next to the output)",
                           nbi_nn_where(&at, w, sizeof w));
    }
    int64_t c = 0;
    double eps = 0, momentum = 0;
    bool inference = false;
    const nb_tree *mt = nb_tree_get(layer, "mode");
    const char *mode = NULL;
    if (!nbi_nn_int(&at, "input_size", &c) || !nbi_nn_float(&at, "eps", &eps) ||
        !nbi_nn_float(&at, "momentum", &momentum) || !nbi_nn_bool(&at, "inference", &inference)) {
        return tr->poison;
    }
    if (mt == NULL || nb_tree_get_string(mt, &mode) != NB_OK ||
        (strcmp(mode, "batch") != 0 && strcmp(mode, "ema") != 0)) {
        return nbi_nn_fail(&at, NB_ERR_STRUCTURE,
                           "%s: 'mode' must be the string \"batch\" or \"ema\" (layer trees are "
                           "made by nb_nn_batch_norm_init)",
                           nbi_nn_where(&at, w, sizeof w));
    }
    bool ema = strcmp(mode, "ema") == 0;
    if (c < 1 || c > NBI_NN_SIZE_MAX || !(eps >= 0) || !(momentum >= 0 && momentum <= 1)) {
        return nbi_nn_fail(&at, NB_ERR_INVALID,
                           "%s has invalid static values (input_size %lld, eps %g, momentum "
                           "%g); make it with nb_nn_batch_norm_init",
                           nbi_nn_where(&at, w, sizeof w), (long long)c, eps, momentum);
    }
    char expect[96];
    snprintf(expect, sizeof expect, "[N, C, ...] with C = input_size %lld (a batch)", (long long)c);
    if (!nbi_nn_check_input(&at, x, 2, NB_MAX_RANK, expect)) {
        return tr->poison;
    }
    if (nb_var_dim(x, 1) != c) {
        return nbi_nn_fail(&at, NB_ERR_SHAPE, "the input%s%s%s of %s is %s; expected %s",
                           x->path ? " '" : "", x->path ? x->path : "", x->path ? "'" : "",
                           nbi_nn_where(&at, w, sizeof w), nbi_nn_sig(xs, sizeof xs, x), expect);
    }
    nb_var *wv = NULL, *bv = NULL;
    if (!nbi_nn_param(&at, "weight", true, 1, &c, x, &wv) ||
        !nbi_nn_param(&at, "bias", true, 1, &c, x, &bv)) {
        return tr->poison;
    }
    if (!nbi_obj_live(state, NBI_MAGIC_TREE)) {
        return nbi_nn_fail(&at, NB_ERR_MISUSE,
                           "the state of %s is a NULL or destroyed tree (pass the state made by "
                           "nb_nn_batch_norm_init, as an argument of the body)",
                           nbi_nn_where(&at, w, sizeof w));
    }
    nb_dtype dt = nb_var_dtype(x);
    const char *flag = ema ? "first_time" : "counter";
    nb_var *fv = nbi_bn_leaf(&at, state, flag, ema ? NB_DTYPE_BOOL : NB_DTYPE_I32, 0, c);
    nb_var *rm = fv ? nbi_bn_leaf(&at, state, "mean", dt, 1, c) : NULL;
    nb_var *rv = rm ? nbi_bn_leaf(&at, state, "var", dt, 1, c) : NULL;
    if (rv == NULL) {
        return tr->poison;
    }
    int r = nb_var_rank(x);
    int64_t cshape[NB_MAX_RANK]; /* [C, 1, ...]: broadcasts along the channel axis */
    for (int a = 1; a < r; a++) {
        cshape[a - 1] = a == 1 ? c : 1;
    }
    nb_var *mean, *var, *fv2 = fv, *rm2 = rm, *rv2 = rv;
    nb_var *one_m = nb_scalar(tr, 1.0 - momentum), *mom = nb_scalar(tr, momentum);
    if (inference) {
        mean = rm;
        var = rv;
        if (!ema) {
            /* scale = where(counter == 0, 1, 1 - momentum ** counter) */
            nb_var *cf = nb_cast(fv, dt);
            nb_var *scale = nb_sub(nb_scalar(tr, 1.0), nb_pow(mom, cf));
            scale = nb_select(nb_eq(fv, nb_scalar_typed(tr, NB_DTYPE_I32, 0)),
                              nb_scalar_typed(tr, dt, 1.0), scale);
            mean = nb_div(mean, scale);
            var = nb_div(var, scale);
        }
    } else {
        int sp[NB_MAX_RANK], ns = 0, zero = 0;
        for (int a = 2; a < r; a++) {
            sp[ns++] = a;
        }
        nb_var *m = ns ? nb_mean(x, sp, ns, true) : x; /* per example: [N, C, 1...] */
        m = nb_mean(m, &zero, 1, true);                /* over the batch: [1, C, 1...] */
        nb_var *dev = nb_square(nb_sub(x, m));
        nb_var *v = ns ? nb_mean(dev, sp, ns, true) : dev;
        v = nb_maximum(nb_scalar(tr, 0.0), nb_mean(v, &zero, 1, true));
        nb_var *bm = nb_reshape(m, 1, &c), *bvv = nb_reshape(v, 1, &c);
        if (ema) {
            mean = nb_add(nb_mul(one_m, bm), nb_mul(mom, rm));
            var = nb_add(nb_mul(one_m, bvv), nb_mul(mom, rv));
            mean = nb_select(fv, bm, mean);
            var = nb_select(fv, bvv, var);
            rm2 = mean;
            rv2 = var;
            fv2 = nb_full(tr, NB_DTYPE_BOOL, 0, NULL, 0.0);
        } else {
            mean = bm;
            var = bvv;
            rm2 = nb_add(nb_mul(rm, mom), nb_mul(bm, one_m));
            rv2 = nb_add(nb_mul(rv, mom), nb_mul(bvv, one_m));
            fv2 = nb_add(fv, nb_scalar_typed(tr, NB_DTYPE_I32, 1));
        }
    }
    nb_var *out = nb_div(nb_sub(x, nb_reshape(mean, r - 1, cshape)),
                         nb_sqrt(nb_add(nb_reshape(var, r - 1, cshape), nb_scalar(tr, eps))));
    if (wv != NULL) {
        out = nb_mul(out, nb_reshape(wv, r - 1, cshape));
    }
    if (bv != NULL) {
        out = nb_add(out, nb_reshape(bv, r - 1, cshape));
    }
    if (nb_var_is_poison(out)) {
        return out;
    }
    nb_tree *ns = NULL;
    const char *keys[3] = {flag, "mean", "var"};
    nb_status st = nb_tree_dict(nb_trace_ctx(tr), 3, keys,
                                (nb_tree *[]){nb_leaf(fv2), nb_leaf(rm2), nb_leaf(rv2)}, &ns);
    if (st == NB_OK) {
        st = nbi_trace_own(tr, ns);
    }
    if (st != NB_OK) {
        return nbi_nn_fail(&at, st, "out of memory for the new state of %s",
                           nbi_nn_where(&at, w, sizeof w));
    }
    *new_state = ns;
    return out;
}
