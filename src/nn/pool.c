/*
 * pool.c -- pooling (Equinox's eqx.nn.MaxPool1d/2d/3d, AvgPool1d/2d/3d and
 * AdaptiveAvgPool / AdaptiveMaxPool 1d/2d/3d).
 *
 * Max and average pooling are Equinox's lax.reduce_window over the trailing nd dims: the
 * input padded (with -inf for max, 0 for average; use_ceil adds the stride to the trailing
 * padding of a dim whose windows do not tile it exactly) and cut into its windows by the
 * convolutions' im2col (every window a column of K = prod(kernel) elements, the padding a
 * bounds test; src/ad/op_conv.c), then reduced:
 *   - max: the element at the first maximum of the window (a NaN counting as the maximum,
 *     as reduce_window's max propagates NaN); the gradient goes to that element alone --
 *     XLA's select_and_scatter_add with a >= selector, which JAX's max pool VJP is. Found
 *     in place by the pool_take op, whose VJP pool_scatter adds each window's gradient at
 *     its maximum (src/ad/op_conv.c), rather than through the columns;
 *   - average: the column's sum divided by prod(kernel) (padding counts, as Equinox).
 * Adaptive pooling is Equinox's _adaptive_pool1d applied along each spatial dim in turn:
 * a dim of size D pooled to t outputs is cut into D % t leading chunks of D / t + 1
 * elements and then chunks of D / t elements (not PyTorch's overlapping windows), each
 * reduced by the mean (jnp.mean: the sum divided by the count) or the max (jnp.max).
 */
#include "nn/nn_internal.h"

#include <math.h>
#include <string.h>

#define NBI_POOL_MAX_ND 3

nb_nn_pool_opts nb_nn_pool_opts_default(void) {
    nb_nn_pool_opts o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < NBI_POOL_MAX_ND; i++) {
        o.stride[i] = 1;
    }
    return o;
}

static nb_status nbi_pool_make(nb_ctx *ctx, const char *fn, const char *kind, int nd,
                               const int64_t *kernel, const nb_nn_pool_opts *opts,
                               nb_tree **layer) {
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (st != NB_OK) {
        return st;
    }
    nb_nn_pool_opts o = opts != NULL ? *opts : nb_nn_pool_opts_default();
    if (nd < 1 || nd > NBI_POOL_MAX_ND) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: nd (the number of spatial dims) is %d; it must be 1, 2 or 3", fn, nd);
    }
    if (kernel == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE, "%s: kernel is NULL; pass nd = %d window sizes", fn, nd);
    }
    int64_t k = 1;
    for (int d = 0; d < nd && st == NB_OK; d++) {
        char what[64];
        snprintf(what, sizeof what, "kernel[%d]", d);
        st = nbi_nn_check_size(ctx, fn, what, kernel[d], 1);
        if (st == NB_OK) {
            snprintf(what, sizeof what, "opts.stride[%d]", d);
            st = nbi_nn_check_size(ctx, fn, what, o.stride[d], 1);
        }
        for (int s = 0; s < 2 && st == NB_OK; s++) {
            snprintf(what, sizeof what, "opts.padding[%d][%d] (%s)", d, s, s ? "after" : "before");
            st = nbi_nn_check_size(ctx, fn, what, o.padding[d][s], 0);
            if (st == NB_OK && o.padding[d][s] > kernel[d]) {
                st = nbi_err(ctx, NB_ERR_INVALID,
                             "%s: opts.padding[%d][%d] is %lld, more than the window size "
                             "kernel[%d] = %lld (a window would hold padding only; Equinox "
                             "refuses it too)",
                             fn, d, s, (long long)o.padding[d][s], d, (long long)kernel[d]);
            }
        }
        k *= st == NB_OK ? kernel[d] : 1;
        if (st == NB_OK && k > NBI_NN_SIZE_MAX) {
            st = nbi_err(ctx, NB_ERR_INVALID, "%s: the window has more than 2^31 elements", fn);
        }
    }
    if (st != NB_OK) {
        return st;
    }
    int64_t pad[NBI_POOL_MAX_ND * 2];
    for (int d = 0; d < nd; d++) {
        pad[2 * d] = o.padding[d][0];
        pad[2 * d + 1] = o.padding[d][1];
    }
    nbi_nn_dict dd;
    nbi_nn_dict_begin(&dd, ctx, kind);
    nbi_nn_put_int(&dd, "num_spatial_dims", nd);
    nbi_nn_put_ints(&dd, "kernel_size", nd, kernel);
    nbi_nn_put_ints(&dd, "stride", nd, o.stride);
    nbi_nn_put_ints(&dd, "padding", 2 * nd, pad);
    nbi_nn_put_bool(&dd, "use_ceil", o.use_ceil);
    return nbi_nn_dict_finish(&dd, layer);
}

nb_status nb_nn_max_pool_init(nb_ctx *ctx, int nd, const int64_t *kernel,
                              const nb_nn_pool_opts *opts, nb_tree **layer) {
    return nbi_pool_make(ctx, "nb_nn_max_pool_init", "max_pool", nd, kernel, opts, layer);
}

nb_status nb_nn_avg_pool_init(nb_ctx *ctx, int nd, const int64_t *kernel,
                              const nb_nn_pool_opts *opts, nb_tree **layer) {
    return nbi_pool_make(ctx, "nb_nn_avg_pool_init", "avg_pool", nd, kernel, opts, layer);
}

static nb_status nbi_adaptive_make(nb_ctx *ctx, const char *fn, const char *kind, int nd,
                                   const int64_t *target, nb_tree **layer) {
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (st != NB_OK) {
        return st;
    }
    if (nd < 1 || nd > NBI_POOL_MAX_ND) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: nd (the number of spatial dims) is %d; it must be 1, 2 or 3", fn, nd);
    }
    if (target == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE, "%s: target is NULL; pass nd = %d output sizes", fn, nd);
    }
    for (int d = 0; d < nd && st == NB_OK; d++) {
        char what[64];
        snprintf(what, sizeof what, "target[%d]", d);
        st = nbi_nn_check_size(ctx, fn, what, target[d], 1);
    }
    if (st != NB_OK) {
        return st;
    }
    nbi_nn_dict dd;
    nbi_nn_dict_begin(&dd, ctx, kind);
    nbi_nn_put_int(&dd, "num_spatial_dims", nd);
    nbi_nn_put_ints(&dd, "target_shape", nd, target);
    return nbi_nn_dict_finish(&dd, layer);
}

nb_status nb_nn_adaptive_avg_pool_init(nb_ctx *ctx, int nd, const int64_t *target,
                                       nb_tree **layer) {
    return nbi_adaptive_make(ctx, "nb_nn_adaptive_avg_pool_init", "adaptive_avg_pool", nd, target,
                             layer);
}

nb_status nb_nn_adaptive_max_pool_init(nb_ctx *ctx, int nd, const int64_t *target,
                                       nb_tree **layer) {
    return nbi_adaptive_make(ctx, "nb_nn_adaptive_max_pool_init", "adaptive_max_pool", nd, target,
                             layer);
}

/* ---- apply -------------------------------------------------------------------------- */

static const char *const nbi_pool_kinds[4] = {"max_pool", "avg_pool", "adaptive_avg_pool",
                                              "adaptive_max_pool"};

static bool nbi_pool_nd(const nbi_nn_at *at, int64_t *nd) {
    if (!nbi_nn_int(at, "num_spatial_dims", nd)) {
        return false;
    }
    if (*nd < 1 || *nd > NBI_POOL_MAX_ND) {
        char w[NB_PATH_MAX + 64];
        nbi_nn_fail(at, NB_ERR_INVALID, "%s has num_spatial_dims %lld; it must be 1, 2 or 3",
                    nbi_nn_where(at, w, sizeof w), (long long)*nd);
        return false;
    }
    return true;
}

static bool nbi_pool_input(const nbi_nn_at *at, nb_var *x, int nd) {
    char expect[96];
    snprintf(expect, sizeof expect, "[..., C, %s] (the trailing %d dims are pooled)",
             nd == 1   ? "L"
             : nd == 2 ? "H, W"
                       : "D, H, W",
             nd);
    return nbi_nn_check_input(at, x, nd + 1, NB_MAX_RANK - 1, expect);
}

static nb_var *nbi_pool_window(const nbi_nn_at *at, nb_var *x, bool is_max) {
    nb_trace *tr = at->tr;
    int64_t nd = 0, ks[NBI_POOL_MAX_ND], stride[NBI_POOL_MAX_ND], pad[2 * NBI_POOL_MAX_ND];
    bool use_ceil = false;
    if (!nbi_pool_nd(at, &nd) || !nbi_nn_ints(at, "kernel_size", (int)nd, ks) ||
        !nbi_nn_ints(at, "stride", (int)nd, stride) ||
        !nbi_nn_ints(at, "padding", 2 * (int)nd, pad) || !nbi_nn_bool(at, "use_ceil", &use_ceil) ||
        !nbi_pool_input(at, x, (int)nd)) {
        return tr->poison;
    }
    char w[NB_PATH_MAX + 64], xs[96];
    const char *xq = x->path ? " '" : "", *xp = x->path ? x->path : "", *xe = x->path ? "'" : "";
    int r = nb_var_rank(x);
    int64_t lo[NB_MAX_RANK] = {0}, hi[NB_MAX_RANK] = {0}, so[NBI_POOL_MAX_ND];
    int64_t k = 1;
    for (int d = 0; d < nd; d++) {
        int ax = r - (int)nd + d;
        int64_t sp = nb_var_dim(x, ax);
        bool sane = ks[d] >= 1 && ks[d] <= NBI_NN_SIZE_MAX && stride[d] >= 1 &&
                    stride[d] <= NBI_NN_SIZE_MAX && pad[2 * d] >= 0 && pad[2 * d + 1] >= 0 &&
                    pad[2 * d] <= ks[d] && pad[2 * d + 1] <= ks[d];
        if (!sane) {
            return nbi_nn_fail(at, NB_ERR_INVALID,
                               "%s has invalid static sizes along spatial dim %d (window %lld, "
                               "stride %lld, padding (%lld, %lld)); make it with nb_nn_%s_init",
                               nbi_nn_where(at, w, sizeof w), d, (long long)ks[d],
                               (long long)stride[d], (long long)pad[2 * d],
                               (long long)pad[2 * d + 1], at->kind);
        }
        lo[ax] = pad[2 * d];
        hi[ax] = pad[2 * d + 1];
        if (sp + lo[ax] + hi[ax] < ks[d]) {
            return nbi_nn_fail(at, NB_ERR_SHAPE,
                               "the input%s%s%s of %s is %s: along spatial dim %d it is %lld "
                               "after padding, smaller than the window %lld",
                               xq, xp, xe, nbi_nn_where(at, w, sizeof w),
                               nbi_nn_sig(xs, sizeof xs, x), d, (long long)(sp + lo[ax] + hi[ax]),
                               (long long)ks[d]);
        }
        if (use_ceil && (sp + lo[ax] + hi[ax] - ks[d]) % stride[d] != 0) {
            hi[ax] += stride[d];
            if (hi[ax] > ks[d]) {
                return nbi_nn_fail(at, NB_ERR_SHAPE,
                                   "the input%s%s%s of %s is %s: use_ceil pads spatial dim %d "
                                   "by (%lld, %lld), more than the window %lld (Equinox "
                                   "refuses this too); use a smaller stride or no use_ceil",
                                   xq, xp, xe, nbi_nn_where(at, w, sizeof w),
                                   nbi_nn_sig(xs, sizeof xs, x), d, (long long)lo[ax],
                                   (long long)hi[ax], (long long)ks[d]);
            }
        }
        so[d] = (sp + lo[ax] + hi[ax] - ks[d]) / stride[d] + 1;
        k *= ks[d];
    }
    /* [M, 1, S...] (M: every dim before the pooled ones) -> columns [M, 1, K, So...]: the
     * batch-first layout, M examples of one channel (the same memory as M channels of one
     * example, but the kernels' per-channel work -- a tap's bounds, its offsets -- is done
     * once, not M times) */
    int64_t m = 1, xs3[2 + NBI_POOL_MAX_ND], ks3[NBI_POOL_MAX_ND], plo[NBI_POOL_MAX_ND],
            phi[NBI_POOL_MAX_ND], l = 1;
    static const int64_t ones[NBI_POOL_MAX_ND] = {1, 1, 1};
    for (int a = 0; a < r - nd; a++) {
        m *= nb_var_dim(x, a);
    }
    xs3[0] = m;
    xs3[1] = 1;
    for (int d = 0; d < nd; d++) {
        int ax = r - (int)nd + d;
        xs3[2 + d] = nb_var_dim(x, ax);
        ks3[d] = ks[d];
        plo[d] = lo[ax];
        phi[d] = hi[ax];
        l *= so[d];
    }
    nb_var *x3 = nb_reshape(x, (int)nd + 2, xs3), *y;
    if (is_max) {
        /* the first maximum of each window (a NaN counts as the maximum): its element is the
         * value, and the gradient goes to it alone -- found in place (pool_take, whose VJP
         * is pool_scatter), the same values as the columns' argmax and take */
        y = nbi_pool_op(NBI_OP_POOL_TAKE, x3, x3, (int)nd, ks3, stride, ones, plo, phi, -INFINITY);
    } else {
        nb_var *cols =
            nbi_im2col(x3, (int)nd + NBI_CONV_BATCH_FIRST, ks3, stride, ones, plo, phi, 0.0);
        cols = nb_reshape(cols, 3, (const int64_t[]){m, k, l});
        y = nb_div(nb_sum(cols, (const int[]){1}, 1, false), nb_scalar(tr, (double)k));
    }
    int64_t oshape[NB_MAX_RANK];
    memcpy(oshape, nb_var_shape(x), (size_t)(r - nd) * sizeof(int64_t));
    memcpy(oshape + r - nd, so, (size_t)nd * sizeof(int64_t));
    return nb_reshape(y, r, oshape);
}

static nb_var *nbi_pool_adaptive(const nbi_nn_at *at, nb_var *x, bool is_max) {
    nb_trace *tr = at->tr;
    int64_t nd = 0, target[NBI_POOL_MAX_ND];
    if (!nbi_pool_nd(at, &nd) || !nbi_nn_ints(at, "target_shape", (int)nd, target) ||
        !nbi_pool_input(at, x, (int)nd)) {
        return tr->poison;
    }
    nb_var *xin = x;
    int r = nb_var_rank(x);
    for (int d = 0; d < nd; d++) {
        int ax = r - (int)nd + d;
        int64_t len = nb_var_dim(x, ax), t = target[d];
        if (t < 1 || len < t) {
            char w[NB_PATH_MAX + 64], xs[96];
            return nbi_nn_fail(at, NB_ERR_SHAPE,
                               "the input%s%s%s of %s is %s: spatial dim %d has %lld elements, "
                               "fewer than the %lld outputs wanted (target_shape[%d]); each "
                               "output pools at least one element",
                               xin->path ? " '" : "", xin->path ? xin->path : "",
                               xin->path ? "'" : "", nbi_nn_where(at, w, sizeof w),
                               nbi_nn_sig(xs, sizeof xs, xin), d, (long long)len, (long long)t, d);
        }
        int64_t f = len / t, nhead = len % t;
        nb_var *parts[2];
        int np = 0;
        int64_t pos = 0;
        for (int part = 0; part < 2; part++) {
            int64_t chunks = part == 0 ? nhead : t - nhead, size = part == 0 ? f + 1 : f;
            if (chunks == 0) {
                continue;
            }
            int64_t start[NB_MAX_RANK] = {0}, stop[NB_MAX_RANK], shape[NB_MAX_RANK + 1];
            for (int a = 0, b = 0; a < r; a++) {
                stop[a] = nb_var_dim(x, a);
                if (a == ax) {
                    shape[b++] = chunks;
                    shape[b++] = size;
                } else {
                    shape[b++] = nb_var_dim(x, a);
                }
            }
            start[ax] = pos;
            stop[ax] = pos + chunks * size;
            pos = stop[ax];
            nb_var *c = nb_reshape(nb_slice(x, start, stop, NULL), r + 1, shape);
            int axis = ax + 1;
            parts[np++] = is_max ? nb_max(c, &axis, 1, false) : nb_mean(c, &axis, 1, false);
        }
        x = np == 1 ? parts[0] : nb_concatenate(2, parts, ax);
    }
    return x;
}

nb_var *nb_nn_pool(nb_trace *tr, const nb_tree *layer, nb_var *x) {
    const char *kind = "max_pool";
    const char *have = nbi_nn_kind_of(layer);
    int which = 0;
    for (int i = 0; have != NULL && i < 4; i++) {
        if (strcmp(have, nbi_pool_kinds[i]) == 0) {
            kind = nbi_pool_kinds[i];
            which = i;
        }
    }
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_pool", kind, layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    return which < 2 ? nbi_pool_window(&at, x, which == 0) : nbi_pool_adaptive(&at, x, which == 3);
}
