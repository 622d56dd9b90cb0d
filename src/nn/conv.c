/*
 * conv.c -- Conv2d (Equinox's eqx.nn.Conv2d) by im2col and one matrix product.
 *
 * Why im2col. A convolution is a matrix product once every receptive field is laid out as
 * a column: for kernel offset (i, j) the strided slice
 *     xp[c, n, i*dh : i*dh + (Ho-1)*sh + 1 : sh, j*dw : ... : sw]     ([C, N, Ho, Wo])
 * holds the input pixel that tap (i, j) sees at every output position; stacking the kh*kw
 * slices gives [C, kh*kw, N, Ho, Wo] = [C*kh*kw, N*Ho*Wo] (row c*kh*kw + i*kw + j, the
 * row-major order of the weight's trailing dims), and the weight reshaped to
 * [O, C*kh*kw] times that matrix is the output [O, N*Ho*Wo] (per group: [g, O/g, C/g*K]
 * times [g, C/g*K, N*Ho*Wo]). BLIS does the product at full speed; the price is the
 * kh*kw-fold copy of the input (K. Chellapilla, S. Puri, P. Simard, "High performance
 * convolutional neural networks for document processing", 2006). Everything is a traced
 * primitive (pad, slice, stack, reshape, transpose, matmul), so the gradient is the
 * transposed computation (col2im through the slices' VJPs) with no rule of its own.
 */
#include "nn/nn_internal.h"

#include <math.h>
#include <string.h>

nb_nn_conv2d_opts nb_nn_conv2d_opts_default(void) {
    nb_nn_conv2d_opts o;
    memset(&o, 0, sizeof o);
    o.stride[0] = o.stride[1] = 1;
    o.dilation[0] = o.dilation[1] = 1;
    o.groups = 1;
    o.use_bias = true;
    return o;
}

nb_status nb_nn_conv2d_init(nb_ctx *ctx, int64_t in, int64_t out, int64_t kh, int64_t kw,
                            const nb_nn_conv2d_opts *opts, nb_dtype dtype, const nb_array *key,
                            nb_tree **layer) {
    static const char fn[] = "nb_nn_conv2d_init";
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (ctx == NULL) {
        st = nbi_err_null_ctx(key, fn); /* the key knows the context */
    }
    nb_nn_conv2d_opts o = opts != NULL ? *opts : nb_nn_conv2d_opts_default();
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "in (in_channels)", in, 1);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "out (out_channels)", out, 1);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "kh (kernel height)", kh, 1);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "kw (kernel width)", kw, 1);
    }
    static const char *const dims[2] = {"height", "width"};
    for (int d = 0; d < 2 && st == NB_OK; d++) {
        char what[64];
        snprintf(what, sizeof what, "opts.stride[%d] (%s)", d, dims[d]);
        st = nbi_nn_check_size(ctx, fn, what, o.stride[d], 1);
        if (st == NB_OK) {
            snprintf(what, sizeof what, "opts.dilation[%d] (%s)", d, dims[d]);
            st = nbi_nn_check_size(ctx, fn, what, o.dilation[d], 1);
        }
        for (int s = 0; s < 2 && st == NB_OK; s++) {
            snprintf(what, sizeof what, "opts.padding[%d][%d] (%s, %s)", d, s, dims[d],
                     s ? "after" : "before");
            st = nbi_nn_check_size(ctx, fn, what, o.padding[d][s], 0);
        }
    }
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "opts.groups", o.groups, 1);
    }
    if (st == NB_OK && (in % o.groups != 0 || out % o.groups != 0)) {
        st = nbi_err(ctx, NB_ERR_INVALID,
                     "%s: opts.groups %lld must divide both in_channels %lld and out_channels "
                     "%lld",
                     fn, (long long)o.groups, (long long)in, (long long)out);
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
    int64_t cg = in / o.groups;
    nb_array *keys = NULL, *wk = NULL, *bk = NULL, *w = NULL, *b = NULL;
    /* Equinox: wkey, bkey = split(key, 2); lim = 1 / sqrt(in/groups * prod(kernel)). */
    st = nb_random_split(key, 2, &keys);
    if (st == NB_OK) {
        st = nbi_nn_key_row(keys, 0, &wk);
    }
    if (st == NB_OK) {
        st = nbi_nn_key_row(keys, 1, &bk);
    }
    double lim = 1.0 / sqrt((double)cg * (double)kh * (double)kw);
    if (st == NB_OK) {
        st = nbi_nn_uniform(wk, dtype, 4, (const int64_t[]){out, cg, kh, kw}, lim, &w);
    }
    if (st == NB_OK && o.use_bias) {
        st = nbi_nn_uniform(bk, dtype, 3, (const int64_t[]){out, 1, 1}, lim, &b);
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
    nbi_nn_dict_begin(&d, ctx, "conv2d");
    nbi_nn_put_array(&d, "weight", NB_OK, w);
    if (o.use_bias) {
        nbi_nn_put_array(&d, "bias", NB_OK, b);
    } else {
        nbi_nn_put_null(&d, "bias");
    }
    nbi_nn_put_int(&d, "in_channels", in);
    nbi_nn_put_int(&d, "out_channels", out);
    nbi_nn_put_ints(&d, "kernel_size", 2, (const int64_t[]){kh, kw});
    nbi_nn_put_ints(&d, "stride", 2, o.stride);
    nb_tree *pads[2] = {NULL, NULL}, *padding = NULL;
    st = NB_OK;
    for (int i = 0; i < 2 && st == NB_OK; i++) {
        nb_tree *lo = NULL, *hi = NULL;
        st = nb_tree_int(ctx, o.padding[i][0], &lo);
        if (st == NB_OK) {
            st = nb_tree_int(ctx, o.padding[i][1], &hi);
        }
        if (st == NB_OK) {
            st = nb_tree_tuple(ctx, 2, (nb_tree *[]){lo, hi}, &pads[i]);
        }
        nb_tree_destroy(lo);
        nb_tree_destroy(hi);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, pads, &padding);
    }
    nb_tree_destroy(pads[0]);
    nb_tree_destroy(pads[1]);
    nbi_nn_put(&d, "padding", st, padding);
    nbi_nn_put_ints(&d, "dilation", 2, o.dilation);
    nbi_nn_put_int(&d, "groups", o.groups);
    nbi_nn_put_bool(&d, "use_bias", o.use_bias);
    return nbi_nn_dict_finish(&d, layer);
}

/* padding: a tuple of two (lo, hi) tuples of ints. */
static bool nbi_nn_conv_padding(const nbi_nn_at *at, int64_t pad[2][2]) {
    const nb_tree *t = nb_tree_get(at->layer, "padding");
    bool ok = t != NULL && nb_tree_kind_of(t) == NB_TREE_KIND_TUPLE && nb_tree_len(t) == 2;
    for (int i = 0; ok && i < 2; i++) {
        const nb_tree *p = nb_tree_child(t, i);
        ok = nb_tree_kind_of(p) == NB_TREE_KIND_TUPLE && nb_tree_len(p) == 2 &&
             nb_tree_get_int(nb_tree_child(p, 0), &pad[i][0]) == NB_OK &&
             nb_tree_get_int(nb_tree_child(p, 1), &pad[i][1]) == NB_OK && pad[i][0] >= 0 &&
             pad[i][1] >= 0;
    }
    if (!ok) {
        char w[NB_PATH_MAX + 64];
        nbi_nn_fail(at, NB_ERR_STRUCTURE,
                    "%s: 'padding' must be a tuple ((top, bottom), (left, right)) of static ints "
                    ">= 0 (layer trees are made by nb_nn_conv2d_init)",
                    nbi_nn_where(at, w, sizeof w));
    }
    return ok;
}

nb_var *nb_nn_conv2d(nb_trace *tr, const nb_tree *layer, nb_var *x) {
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_conv2d", "conv2d", layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    int64_t cin = 0, cout = 0, groups = 0, ks[2], stride[2], dil[2], pad[2][2];
    if (!nbi_nn_int(&at, "in_channels", &cin) || !nbi_nn_int(&at, "out_channels", &cout) ||
        !nbi_nn_int(&at, "groups", &groups) || !nbi_nn_ints(&at, "kernel_size", 2, ks) ||
        !nbi_nn_ints(&at, "stride", 2, stride) || !nbi_nn_ints(&at, "dilation", 2, dil) ||
        !nbi_nn_conv_padding(&at, pad)) {
        return tr->poison;
    }
    char w[NB_PATH_MAX + 64];
    bool sane = groups >= 1 && cin >= 1 && cout >= 1 && cin % groups == 0 && cout % groups == 0;
    for (int d = 0; d < 2; d++) {
        sane = sane && ks[d] >= 1 && stride[d] >= 1 && dil[d] >= 1 && ks[d] <= NBI_NN_SIZE_MAX &&
               stride[d] <= NBI_NN_SIZE_MAX && dil[d] <= NBI_NN_SIZE_MAX &&
               pad[d][0] <= NBI_NN_SIZE_MAX && pad[d][1] <= NBI_NN_SIZE_MAX;
    }
    if (!sane) {
        return nbi_nn_fail(&at, NB_ERR_INVALID,
                           "%s has invalid static sizes (groups %lld for %lld -> %lld channels, "
                           "kernel %lldx%lld, stride %lldx%lld, dilation %lldx%lld); make it with "
                           "nb_nn_conv2d_init",
                           nbi_nn_where(&at, w, sizeof w), (long long)groups, (long long)cin,
                           (long long)cout, (long long)ks[0], (long long)ks[1],
                           (long long)stride[0], (long long)stride[1], (long long)dil[0],
                           (long long)dil[1]);
    }
    char expect[96];
    snprintf(expect, sizeof expect, "[C, H, W] or [N, C, H, W] with C = in_channels %lld",
             (long long)cin);
    if (!nbi_nn_check_input(&at, x, 3, 4, expect)) {
        return tr->poison;
    }
    int r = nb_var_rank(x);
    char xs[96];
    const char *xq = x->path ? " '" : "", *xp = x->path ? x->path : "", *xe = x->path ? "'" : "";
    if (nb_var_dim(x, r - 3) != cin) {
        return nbi_nn_fail(&at, NB_ERR_SHAPE, "the input%s%s%s of %s is %s; expected %s", xq, xp,
                           xe, nbi_nn_where(&at, w, sizeof w), nbi_nn_sig(xs, sizeof xs, x),
                           expect);
    }
    int64_t cg = cin / groups, og = cout / groups, kh = ks[0], kw = ks[1];
    nb_var *wv = NULL, *bv = NULL;
    if (!nbi_nn_param(&at, "weight", false, 4, (const int64_t[]){cout, cg, kh, kw}, x, &wv) ||
        !nbi_nn_param(&at, "bias", true, 3, (const int64_t[]){cout, 1, 1}, x, &bv)) {
        return tr->poison;
    }
    int64_t nk = kh * kw; /* a dim product of the weight: no overflow */
    int64_t n = r == 4 ? nb_var_dim(x, 0) : 1, h = nb_var_dim(x, -2), wd = nb_var_dim(x, -1);
    int64_t hp = h + pad[0][0] + pad[0][1], wp = wd + pad[1][0] + pad[1][1];
    int64_t ekh = dil[0] * (kh - 1) + 1, ekw = dil[1] * (kw - 1) + 1;
    if (hp < ekh || wp < ekw) {
        return nbi_nn_fail(&at, NB_ERR_SHAPE,
                           "the input%s%s%s of %s is %s: padded to %lldx%lld it is smaller than "
                           "the dilated kernel %lldx%lld (kernel %lldx%lld, dilation %lldx%lld); "
                           "pad more or use a larger input",
                           xq, xp, xe, nbi_nn_where(&at, w, sizeof w), nbi_nn_sig(xs, sizeof xs, x),
                           (long long)hp, (long long)wp, (long long)ekh, (long long)ekw,
                           (long long)kh, (long long)kw, (long long)dil[0], (long long)dil[1]);
    }
    int64_t ho = (hp - ekh) / stride[0] + 1, wo = (wp - ekw) / stride[1] + 1;
    /* [C, N, H, W]: channels first, so that the columns come out as [C*K, N*Ho*Wo]. */
    nb_var *xt;
    if (r == 3) {
        xt = nb_reshape(x, 4, (const int64_t[]){cin, 1, h, wd});
    } else if (n == 1) {
        xt = nb_reshape(x, 4, (const int64_t[]){cin, 1, h, wd});
    } else {
        xt = nb_transpose(x, (const int[]){1, 0, 2, 3});
    }
    if (pad[0][0] || pad[0][1] || pad[1][0] || pad[1][1]) {
        xt = nb_pad(xt, (const int64_t[]){0, 0, pad[0][0], pad[1][0]},
                    (const int64_t[]){0, 0, pad[0][1], pad[1][1]}, 0.0);
    }
    nb_var *cols;
    if (nk == 1) {
        cols =
            nb_slice(xt, (const int64_t[]){0, 0, 0, 0},
                     (const int64_t[]){cin, n, (ho - 1) * stride[0] + 1, (wo - 1) * stride[1] + 1},
                     (const int64_t[]){1, 1, stride[0], stride[1]});
    } else {
        size_t bytes = (size_t)nk * sizeof(nb_var *);
        nb_var **taps = nbi_arena_alloc(&tr->arena, bytes);
        if (taps == NULL) {
            return nbi_nn_fail(&at, NB_ERR_OOM, "out of memory (%zu bytes) for %lld kernel taps",
                               bytes, (long long)nk);
        }
        for (int64_t i = 0; i < kh; i++) {
            for (int64_t j = 0; j < kw; j++) {
                int64_t r0 = i * dil[0], c0 = j * dil[1];
                taps[i * kw + j] = nb_slice(xt, (const int64_t[]){0, 0, r0, c0},
                                            (const int64_t[]){cin, n, r0 + (ho - 1) * stride[0] + 1,
                                                              c0 + (wo - 1) * stride[1] + 1},
                                            (const int64_t[]){1, 1, stride[0], stride[1]});
            }
        }
        cols = nb_stack((int)nk, taps, 1); /* [C, K, N, Ho, Wo] */
    }
    int64_t l = n * ho * wo;
    nb_var *y;
    if (groups == 1) {
        nb_var *c2 = nb_reshape(cols, 2, (const int64_t[]){cin * nk, l});
        nb_var *w2 = nb_reshape(wv, 2, (const int64_t[]){cout, cg * nk});
        y = nb_matmul(w2, c2); /* [O, N*Ho*Wo] */
    } else {
        nb_var *c3 = nb_reshape(cols, 3, (const int64_t[]){groups, cg * nk, l});
        nb_var *w3 = nb_reshape(wv, 3, (const int64_t[]){groups, og, cg * nk});
        y = nb_matmul(w3, c3); /* [g, O/g, N*Ho*Wo] */
    }
    if (r == 3 || n == 1) {
        y = nb_reshape(
            y, r, r == 3 ? (const int64_t[]){cout, ho, wo} : (const int64_t[]){1, cout, ho, wo});
    } else {
        y = nb_transpose(nb_reshape(y, 4, (const int64_t[]){cout, n, ho, wo}),
                         (const int[]){1, 0, 2, 3});
    }
    if (bv != NULL) {
        y = nb_add(y, bv);
    }
    return y;
}
