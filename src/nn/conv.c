/*
 * conv.c -- convolutions (Equinox's eqx.nn.Conv1d/2d/3d and ConvTranspose1d/2d/3d) by
 * im2col and one matrix product.
 *
 * Why im2col. A convolution is a matrix product once every receptive field is laid out as
 * a column: tap t = (t1, ..., tn) of the kernel sees input element o * s + t * d - lo at
 * output position o, so the columns [C, K, N, So...] = [C*K, N*prod(So)] (K = prod(kernel),
 * taps in the row-major order of the weight's trailing dims) times the weight reshaped to
 * [O, C*K] is the output [O, N*prod(So)] (per group: [g, O/g, C/g*K] times [g, C/g*K, L]).
 * BLIS does the product at full speed; the price is the K-fold copy of the input
 * (K. Chellapilla, S. Puri, P. Simard, "High performance convolutional neural networks for
 * document processing", 2006). The columns are one op, im2col (src/ad/op_conv.c: one pass,
 * the padding a bounds test), whose transpose col2im gives the input's gradient; the
 * weight's gradient is the transposed product. Layout moves (the batch axis behind the
 * channels, and back) are transposes.
 *
 * A transposed convolution is Equinox's: the same weight layout [O, C/g, k...] and
 * lax.conv_general_dilated with lhs_dilation = stride (s - 1 zeros between input elements,
 * made by stacking the input with zeros and reshaping), window stride 1 and the padding
 *     lo' = d (k - 1) - lo,   hi' = d (k - 1) - hi + output_padding
 * where a negative lo' or hi' crops. "SAME"/"SAME_LOWER" padding follows
 * lax.padtype_to_pads for a convolution and Equinox's _padding_transpose for a transposed
 * one (which replaces output_padding by max(0, s - d (k - 1) - 1 - output_padding)).
 */
#include "nn/nn_internal.h"

#include <math.h>
#include <string.h>

#define NBI_CONV_MAX_ND 3

static const char *const nbi_conv_kinds[2][NBI_CONV_MAX_ND] = {
    {"conv1d", "conv2d", "conv3d"},
    {"conv_transpose1d", "conv_transpose2d", "conv_transpose3d"},
};

static const char *const nbi_pad_names[] = {"explicit", "VALID", "SAME", "SAME_LOWER"};

nb_nn_conv_opts nb_nn_conv_opts_default(void) {
    nb_nn_conv_opts o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < NBI_CONV_MAX_ND; i++) {
        o.stride[i] = 1;
        o.dilation[i] = 1;
    }
    o.padding_kind = NB_NN_PAD_EXPLICIT;
    o.groups = 1;
    o.use_bias = true;
    return o;
}

nb_nn_conv2d_opts nb_nn_conv2d_opts_default(void) {
    nb_nn_conv2d_opts o;
    memset(&o, 0, sizeof o);
    o.stride[0] = o.stride[1] = 1;
    o.dilation[0] = o.dilation[1] = 1;
    o.groups = 1;
    o.use_bias = true;
    return o;
}

/* A tuple of nd (lo, hi) tuples. */
static nb_status nbi_conv_pad_tree(nb_ctx *ctx, int nd, const int64_t (*pad)[2], nb_tree **out) {
    nb_tree *pads[NBI_CONV_MAX_ND] = {NULL};
    nb_status st = NB_OK;
    for (int i = 0; i < nd && st == NB_OK; i++) {
        nb_tree *lo = NULL, *hi = NULL;
        st = nb_tree_int(ctx, pad[i][0], &lo);
        if (st == NB_OK) {
            st = nb_tree_int(ctx, pad[i][1], &hi);
        }
        if (st == NB_OK) {
            st = nb_tree_tuple(ctx, 2, (nb_tree *[]){lo, hi}, &pads[i]);
        }
        nb_tree_destroy(lo);
        nb_tree_destroy(hi);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, nd, pads, out);
    }
    for (int i = 0; i < nd; i++) {
        nb_tree_destroy(pads[i]);
    }
    return st;
}

static nb_status nbi_conv_make(nb_ctx *ctx, const char *fn, bool transpose, int nd, int64_t in,
                               int64_t out, const int64_t *kernel, const nb_nn_conv_opts *opts,
                               nb_dtype dtype, const nb_array *key, nb_tree **layer) {
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (ctx == NULL) {
        st = nbi_err_null_ctx(key, fn); /* the key knows the context */
    }
    if (st != NB_OK) {
        return st;
    }
    nb_nn_conv_opts o = opts != NULL ? *opts : nb_nn_conv_opts_default();
    if (nd < 1 || nd > NBI_CONV_MAX_ND) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: nd (the number of spatial dims) is %d; it must be 1, 2 or 3", fn, nd);
    }
    if (kernel == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE, "%s: kernel is NULL; pass nd = %d kernel sizes", fn, nd);
    }
    st = nbi_nn_check_size(ctx, fn, "in (in_channels)", in, 1);
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "out (out_channels)", out, 1);
    }
    static const char *const dims[NBI_CONV_MAX_ND][NBI_CONV_MAX_ND] = {
        {"length"}, {"height", "width"}, {"depth", "height", "width"}};
    for (int d = 0; d < nd && st == NB_OK; d++) {
        char what[64];
        const char *dn = dims[nd - 1][d];
        snprintf(what, sizeof what, "kernel[%d] (%s)", d, dn);
        st = nbi_nn_check_size(ctx, fn, what, kernel[d], 1);
        if (st == NB_OK) {
            snprintf(what, sizeof what, "opts.stride[%d] (%s)", d, dn);
            st = nbi_nn_check_size(ctx, fn, what, o.stride[d], 1);
        }
        if (st == NB_OK) {
            snprintf(what, sizeof what, "opts.dilation[%d] (%s)", d, dn);
            st = nbi_nn_check_size(ctx, fn, what, o.dilation[d], 1);
        }
        for (int s = 0; s < 2 && st == NB_OK && o.padding_kind == NB_NN_PAD_EXPLICIT; s++) {
            snprintf(what, sizeof what, "opts.padding[%d][%d] (%s, %s)", d, s, dn,
                     s ? "after" : "before");
            st = nbi_nn_check_size(ctx, fn, what, o.padding[d][s], 0);
        }
        if (st == NB_OK && transpose) {
            snprintf(what, sizeof what, "opts.output_padding[%d]", d);
            st = nbi_nn_check_size(ctx, fn, what, o.output_padding[d], 0);
            if (st == NB_OK && o.output_padding[d] >= o.stride[d]) {
                st = nbi_err(ctx, NB_ERR_INVALID,
                             "%s: opts.output_padding[%d] is %lld; it must be less than the "
                             "stride %lld (as Equinox and PyTorch)",
                             fn, d, (long long)o.output_padding[d], (long long)o.stride[d]);
            }
        }
        if (st == NB_OK && !transpose && o.output_padding[d] != 0) {
            st = nbi_err(ctx, NB_ERR_INVALID,
                         "%s: opts.output_padding[%d] is %lld; only a transposed convolution "
                         "has an output padding (leave it 0)",
                         fn, d, (long long)o.output_padding[d]);
        }
    }
    if (st == NB_OK && ((unsigned)o.padding_kind > (unsigned)NB_NN_PAD_SAME_LOWER)) {
        st = nbi_err(ctx, NB_ERR_INVALID,
                     "%s: opts.padding_kind is %d; use NB_NN_PAD_EXPLICIT, NB_NN_PAD_VALID, "
                     "NB_NN_PAD_SAME or NB_NN_PAD_SAME_LOWER",
                     fn, (int)o.padding_kind);
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
    int64_t kprod = 1;
    for (int d = 0; d < nd && st == NB_OK; d++) {
        kprod *= kernel[d];
        if (kprod > NBI_NN_SIZE_MAX) {
            st = nbi_err(ctx, NB_ERR_INVALID, "%s: the kernel has more than 2^31 taps", fn);
        }
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
    /* Equinox: wkey, bkey = split(key, 2); lim = 1 / sqrt(in/groups * prod(kernel));
     * weight [out, in/groups, *kernel] for both directions; bias [out, 1, ...]. */
    st = nb_random_split(key, 2, &keys);
    if (st == NB_OK) {
        st = nbi_nn_key_row(keys, 0, &wk);
    }
    if (st == NB_OK) {
        st = nbi_nn_key_row(keys, 1, &bk);
    }
    double lim = 1.0 / sqrt((double)cg * (double)kprod);
    int64_t wshape[2 + NBI_CONV_MAX_ND], bshape[1 + NBI_CONV_MAX_ND];
    wshape[0] = out;
    wshape[1] = cg;
    bshape[0] = out;
    for (int d = 0; d < nd; d++) {
        wshape[2 + d] = kernel[d];
        bshape[1 + d] = 1;
    }
    if (st == NB_OK) {
        st = nbi_nn_uniform(wk, dtype, nd + 2, wshape, lim, &w);
    }
    if (st == NB_OK && o.use_bias) {
        st = nbi_nn_uniform(bk, dtype, nd + 1, bshape, lim, &b);
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
    nbi_nn_dict_begin(&d, ctx, nbi_conv_kinds[transpose][nd - 1]);
    nbi_nn_put_array(&d, "weight", NB_OK, w);
    if (o.use_bias) {
        nbi_nn_put_array(&d, "bias", NB_OK, b);
    } else {
        nbi_nn_put_null(&d, "bias");
    }
    nbi_nn_put_int(&d, "num_spatial_dims", nd);
    nbi_nn_put_int(&d, "in_channels", in);
    nbi_nn_put_int(&d, "out_channels", out);
    nbi_nn_put_ints(&d, "kernel_size", nd, kernel);
    nbi_nn_put_ints(&d, "stride", nd, o.stride);
    nb_tree *padding = NULL;
    if (o.padding_kind == NB_NN_PAD_EXPLICIT) {
        st = nbi_conv_pad_tree(ctx, nd, (const int64_t(*)[2])o.padding, &padding);
    } else {
        st = nb_tree_string(ctx, nbi_pad_names[o.padding_kind], &padding);
    }
    nbi_nn_put(&d, "padding", st, padding);
    if (transpose) {
        nbi_nn_put_ints(&d, "output_padding", nd, o.output_padding);
    }
    nbi_nn_put_ints(&d, "dilation", nd, o.dilation);
    nbi_nn_put_int(&d, "groups", o.groups);
    nbi_nn_put_bool(&d, "use_bias", o.use_bias);
    return nbi_nn_dict_finish(&d, layer);
}

nb_status nb_nn_conv_init(nb_ctx *ctx, int nd, int64_t in, int64_t out, const int64_t *kernel,
                          const nb_nn_conv_opts *opts, nb_dtype dtype, const nb_array *key,
                          nb_tree **layer) {
    return nbi_conv_make(ctx, "nb_nn_conv_init", false, nd, in, out, kernel, opts, dtype, key,
                         layer);
}

nb_status nb_nn_conv_transpose_init(nb_ctx *ctx, int nd, int64_t in, int64_t out,
                                    const int64_t *kernel, const nb_nn_conv_opts *opts,
                                    nb_dtype dtype, const nb_array *key, nb_tree **layer) {
    return nbi_conv_make(ctx, "nb_nn_conv_transpose_init", true, nd, in, out, kernel, opts, dtype,
                         key, layer);
}

nb_status nb_nn_conv2d_init(nb_ctx *ctx, int64_t in, int64_t out, int64_t kh, int64_t kw,
                            const nb_nn_conv2d_opts *opts, nb_dtype dtype, const nb_array *key,
                            nb_tree **layer) {
    nb_nn_conv_opts o = nb_nn_conv_opts_default();
    if (opts != NULL) {
        for (int d = 0; d < 2; d++) {
            o.stride[d] = opts->stride[d];
            o.dilation[d] = opts->dilation[d];
            o.padding[d][0] = opts->padding[d][0];
            o.padding[d][1] = opts->padding[d][1];
        }
        o.groups = opts->groups;
        o.use_bias = opts->use_bias;
    }
    return nbi_conv_make(ctx, "nb_nn_conv2d_init", false, 2, in, out, (const int64_t[]){kh, kw}, &o,
                         dtype, key, layer);
}

/* ---- apply -------------------------------------------------------------------------- */

/* padding: a tuple of nd (lo, hi) tuples of static ints >= 0, or one of the strings. */
static bool nbi_conv_padding(const nbi_nn_at *at, int nd, int64_t pad[][2], int *kind) {
    const nb_tree *t = nb_tree_get(at->layer, "padding");
    const char *s = NULL;
    *kind = NB_NN_PAD_EXPLICIT;
    if (t != NULL && nb_tree_kind_of(t) == NB_TREE_KIND_STRING &&
        nb_tree_get_string(t, &s) == NB_OK) {
        for (int k = NB_NN_PAD_VALID; k <= NB_NN_PAD_SAME_LOWER; k++) {
            if (strcmp(s, nbi_pad_names[k]) == 0) {
                *kind = k;
                return true;
            }
        }
    }
    bool ok =
        s == NULL && t != NULL && nb_tree_kind_of(t) == NB_TREE_KIND_TUPLE && nb_tree_len(t) == nd;
    for (int i = 0; ok && i < nd; i++) {
        const nb_tree *p = nb_tree_child(t, i);
        ok = nb_tree_kind_of(p) == NB_TREE_KIND_TUPLE && nb_tree_len(p) == 2 &&
             nb_tree_get_int(nb_tree_child(p, 0), &pad[i][0]) == NB_OK &&
             nb_tree_get_int(nb_tree_child(p, 1), &pad[i][1]) == NB_OK && pad[i][0] >= 0 &&
             pad[i][1] >= 0 && pad[i][0] <= NBI_NN_SIZE_MAX && pad[i][1] <= NBI_NN_SIZE_MAX;
    }
    if (!ok) {
        char w[NB_PATH_MAX + 64];
        nbi_nn_fail(at, NB_ERR_STRUCTURE,
                    "%s: 'padding' must be a tuple of %d (lo, hi) tuples of static ints >= 0, or "
                    "the string \"VALID\", \"SAME\" or \"SAME_LOWER\" (layer trees are made by "
                    "nb_nn_conv_init)",
                    nbi_nn_where(at, w, sizeof w), nd);
    }
    return ok;
}

/* x [N, C, S...] (nd spatial dims) with lo/hi padding per spatial dim (a negative amount
 * crops), cut into the K taps of the dilated kernel with the stride (batch-first columns
 * [N, C*K, L]) and multiplied by w [O, C/g, k...] example by example: [N, O, L] (L =
 * prod(So)); so[] receives the output's spatial sizes. Returns NULL (after a sticky error naming
 * the input) when the padded input is smaller than the dilated kernel. */
static nb_var *nbi_conv_core(const nbi_nn_at *at, nb_var *x, nb_var *xin, nb_var *wv, int nd,
                             const int64_t *ks, const int64_t *stride, const int64_t *dil,
                             const int64_t *lo, const int64_t *hi, int64_t groups, int64_t *so) {
    int64_t n = nb_var_dim(x, 0), cin = nb_var_dim(x, 1), cout = nb_var_dim(wv, 0);
    int64_t sp[NBI_CONV_MAX_ND], ek[NBI_CONV_MAX_ND];
    bool crop = false;
    for (int d = 0; d < nd; d++) {
        sp[d] = nb_var_dim(x, 2 + d);
        ek[d] = dil[d] * (ks[d] - 1) + 1;
        crop = crop || lo[d] < 0 || hi[d] < 0;
    }
    for (int d = 0; d < nd; d++) {
        int64_t padded = sp[d] + lo[d] + hi[d];
        if (padded < ek[d]) {
            char w[NB_PATH_MAX + 64], xs[96];
            nbi_nn_fail(at, NB_ERR_SHAPE,
                        "the input%s%s%s of %s is %s: along spatial dim %d it is %lld after "
                        "padding (%lld, %lld), smaller than the dilated kernel %lld (kernel "
                        "%lld, dilation %lld); pad more or use a larger input",
                        xin->path ? " '" : "", xin->path ? xin->path : "", xin->path ? "'" : "",
                        nbi_nn_where(at, w, sizeof w), nbi_nn_sig(xs, sizeof xs, xin), d,
                        (long long)padded, (long long)lo[d], (long long)hi[d], (long long)ek[d],
                        (long long)ks[d], (long long)dil[d]);
            return NULL;
        }
        so[d] = (padded - ek[d]) / stride[d] + 1;
    }
    for (int d = 0; d < nd; d++) {
        int64_t c0 = lo[d] < 0 ? -lo[d] : 0, c1 = hi[d] < 0 ? -hi[d] : 0;
        if (c0 + c1 > sp[d]) { /* (a transposed convolution's padding beyond its input) */
            char w[NB_PATH_MAX + 64], xs[96];
            nbi_nn_fail(at, NB_ERR_SHAPE,
                        "the input%s%s%s of %s is %s: its padding crops %lld elements from "
                        "spatial dim %d, which has %lld; use less padding (at most the dilated "
                        "kernel's span less one, %lld, on each side)",
                        xin->path ? " '" : "", xin->path ? xin->path : "", xin->path ? "'" : "",
                        nbi_nn_where(at, w, sizeof w), nbi_nn_sig(xs, sizeof xs, xin),
                        (long long)(c0 + c1), d, (long long)sp[d], (long long)(ek[d] - 1));
            return NULL;
        }
    }
    if (crop) {
        int64_t start[2 + NBI_CONV_MAX_ND] = {0, 0}, stop[2 + NBI_CONV_MAX_ND] = {n, cin};
        for (int d = 0; d < nd; d++) {
            start[2 + d] = lo[d] < 0 ? -lo[d] : 0;
            stop[2 + d] = hi[d] < 0 ? sp[d] + hi[d] : sp[d];
        }
        x = nb_slice(x, start, stop, NULL);
    }
    int64_t plo[NBI_CONV_MAX_ND], phi[NBI_CONV_MAX_ND];
    for (int d = 0; d < nd; d++) {
        plo[d] = lo[d] > 0 ? lo[d] : 0;
        phi[d] = hi[d] > 0 ? hi[d] : 0;
    }
    int64_t nk = 1, l = 1;
    for (int d = 0; d < nd; d++) {
        nk *= ks[d];
        l *= so[d];
    }
    bool pointwise = nk == 1; /* a 1x1 kernel, stride 1, no padding: x is its own columns */
    for (int d = 0; d < nd; d++) {
        pointwise = pointwise && stride[d] == 1 && plo[d] == 0 && phi[d] == 0;
    }
    nb_var *cols = pointwise ? x
                             : nbi_im2col(x, nd + NBI_CONV_BATCH_FIRST, ks, stride, dil, plo, phi,
                                          0.0); /* [N, C, K, So...] */
    int64_t cg = cin / groups, og = cout / groups;
    nb_var *y;
    if (groups == 1) {
        nb_var *c3 = nb_reshape(cols, 3, (const int64_t[]){n, cin * nk, l});
        nb_var *w2 = nb_reshape(wv, 2, (const int64_t[]){cout, cg * nk});
        y = nb_matmul(w2, c3); /* [N, O, L] */
    } else {
        nb_var *c4 = nb_reshape(cols, 4, (const int64_t[]){n, groups, cg * nk, l});
        nb_var *w3 = nb_reshape(wv, 3, (const int64_t[]){groups, og, cg * nk});
        y = nb_matmul(w3, c4); /* [N, g, O/g, L] */
    }
    return y;
}

/* lax.padtype_to_pads for one dim: out = ceil(in / s), total = max((out - 1) s + ek - in,
 * 0), SAME puts the odd element after, SAME_LOWER before. */
static void nbi_conv_same(int kind, int64_t in, int64_t s, int64_t ek, int64_t *lo, int64_t *hi) {
    int64_t out = (in + s - 1) / s;
    int64_t total = (out - 1) * s + ek - in;
    if (total < 0) {
        total = 0;
    }
    if (kind == NB_NN_PAD_SAME) {
        *lo = total / 2;
        *hi = total - total / 2;
    } else {
        *lo = total - total / 2;
        *hi = total / 2;
    }
}

/* x [C, N, S...]: s - 1 zeros between neighbours along each spatial dim (lhs dilation):
 * x with a new axis after the dim, joined with s - 1 zero slices along it, merged into the
 * dim and cut after the last element. */
static nb_var *nbi_conv_dilate(nb_trace *tr, nb_var *x, int nd, const int64_t *s) {
    for (int d = 0; d < nd; d++) {
        if (s[d] == 1) {
            continue;
        }
        int ax = 2 + d, r = nb_var_rank(x);
        int64_t len = nb_var_dim(x, ax), zshape[NB_MAX_RANK], shape[NB_MAX_RANK];
        for (int i = 0, j = 0; i <= r; i++) {
            zshape[i] = i == ax + 1 ? s[d] - 1 : nb_var_shape(x)[j++];
        }
        memcpy(shape, nb_var_shape(x), (size_t)r * sizeof(int64_t));
        shape[ax] = len * s[d];
        nb_var *parts[2] = {nb_expand_dims(x, ax + 1),
                            nb_full(tr, nb_var_dtype(x), r + 1, zshape, 0.0)};
        nb_var *y = nb_reshape(nb_concatenate(2, parts, ax + 1), r, shape);
        int64_t start[NB_MAX_RANK] = {0};
        shape[ax] = (len - 1) * s[d] + 1;
        x = nb_slice(y, start, shape, NULL);
    }
    return x;
}

static nb_var *nbi_conv_apply(nb_trace *tr, const nb_tree *layer, nb_var *x, bool transpose,
                              const char *fn) {
    /* The kind picks the spatial rank: conv1d / conv2d / conv3d (or conv_transpose*). */
    const char *kind = nbi_conv_kinds[transpose][1];
    const char *have = nbi_nn_kind_of(layer);
    for (int d = 0; have != NULL && d < NBI_CONV_MAX_ND; d++) {
        if (strcmp(have, nbi_conv_kinds[transpose][d]) == 0) {
            kind = nbi_conv_kinds[transpose][d];
        }
    }
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, fn, kind, layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    int nd = kind[strlen(kind) - 2] - '0';
    int64_t cin = 0, cout = 0, groups = 0, ks[NBI_CONV_MAX_ND], stride[NBI_CONV_MAX_ND],
            dil[NBI_CONV_MAX_ND], pad[NBI_CONV_MAX_ND][2], opad[NBI_CONV_MAX_ND] = {0, 0, 0};
    int pkind = 0;
    if (!nbi_nn_int(&at, "in_channels", &cin) || !nbi_nn_int(&at, "out_channels", &cout) ||
        !nbi_nn_int(&at, "groups", &groups) || !nbi_nn_ints(&at, "kernel_size", nd, ks) ||
        !nbi_nn_ints(&at, "stride", nd, stride) || !nbi_nn_ints(&at, "dilation", nd, dil) ||
        !nbi_conv_padding(&at, nd, pad, &pkind) ||
        (transpose && !nbi_nn_ints(&at, "output_padding", nd, opad))) {
        return tr->poison;
    }
    char w[NB_PATH_MAX + 64];
    bool sane = groups >= 1 && cin >= 1 && cout >= 1 && cin % groups == 0 && cout % groups == 0 &&
                cin <= NBI_NN_SIZE_MAX && cout <= NBI_NN_SIZE_MAX;
    int64_t kprod = 1;
    for (int d = 0; d < nd; d++) {
        sane = sane && ks[d] >= 1 && stride[d] >= 1 && dil[d] >= 1 && ks[d] <= NBI_NN_SIZE_MAX &&
               stride[d] <= NBI_NN_SIZE_MAX && dil[d] <= NBI_NN_SIZE_MAX && opad[d] >= 0 &&
               opad[d] < (transpose ? stride[d] : 1);
        kprod = sane ? kprod * ks[d] : 1;
        sane = sane && kprod <= NBI_NN_SIZE_MAX;
    }
    if (!sane) {
        return nbi_nn_fail(&at, NB_ERR_INVALID,
                           "%s has invalid static sizes (groups %lld for %lld -> %lld channels, "
                           "kernel %lld, stride %lld, dilation %lld along dim 0); make it with "
                           "nb_nn_%s_init",
                           nbi_nn_where(&at, w, sizeof w), (long long)groups, (long long)cin,
                           (long long)cout, (long long)ks[0], (long long)stride[0],
                           (long long)dil[0], transpose ? "conv_transpose" : "conv");
    }
    static const char *const shapes[NBI_CONV_MAX_ND][2] = {{"[C, L]", "[N, C, L]"},
                                                           {"[C, H, W]", "[N, C, H, W]"},
                                                           {"[C, D, H, W]", "[N, C, D, H, W]"}};
    char expect[128];
    snprintf(expect, sizeof expect, "%s or %s with C = in_channels %lld", shapes[nd - 1][0],
             shapes[nd - 1][1], (long long)cin);
    if (!nbi_nn_check_input(&at, x, nd + 1, nd + 2, expect)) {
        return tr->poison;
    }
    int r = nb_var_rank(x);
    if (nb_var_dim(x, r - nd - 1) != cin) {
        char xs[96];
        return nbi_nn_fail(&at, NB_ERR_SHAPE, "the input%s%s%s of %s is %s; expected %s",
                           x->path ? " '" : "", x->path ? x->path : "", x->path ? "'" : "",
                           nbi_nn_where(&at, w, sizeof w), nbi_nn_sig(xs, sizeof xs, x), expect);
    }
    int64_t cg = cin / groups;
    int64_t wshape[2 + NBI_CONV_MAX_ND] = {cout, cg}, bshape[1 + NBI_CONV_MAX_ND] = {cout};
    for (int d = 0; d < nd; d++) {
        wshape[2 + d] = ks[d];
        bshape[1 + d] = 1;
    }
    nb_var *wv = NULL, *bv = NULL;
    if (!nbi_nn_param(&at, "weight", false, nd + 2, wshape, x, &wv) ||
        !nbi_nn_param(&at, "bias", true, nd + 1, bshape, x, &bv)) {
        return tr->poison;
    }
    int64_t n = r == nd + 2 ? nb_var_dim(x, 0) : 1;
    int64_t sp[NBI_CONV_MAX_ND], lo[NBI_CONV_MAX_ND], hi[NBI_CONV_MAX_ND], so[NBI_CONV_MAX_ND];
    for (int d = 0; d < nd; d++) {
        sp[d] = nb_var_dim(x, r - nd + d);
    }
    /* [N, C, S...] (one example: N = 1) */
    int64_t cshape[2 + NBI_CONV_MAX_ND] = {n, cin};
    memcpy(cshape + 2, sp, (size_t)nd * sizeof(int64_t));
    nb_var *xt = r == nd + 1 ? nb_reshape(x, nd + 2, cshape) : x;
    const int64_t *cstride = stride;
    static const int64_t ones[NBI_CONV_MAX_ND] = {1, 1, 1};
    for (int d = 0; d < nd; d++) {
        int64_t ek = dil[d] * (ks[d] - 1) + 1;
        if (!transpose) {
            if (pkind == NB_NN_PAD_EXPLICIT) {
                lo[d] = pad[d][0];
                hi[d] = pad[d][1];
            } else if (pkind == NB_NN_PAD_VALID) {
                lo[d] = hi[d] = 0;
            } else {
                nbi_conv_same(pkind, sp[d], stride[d], ek, &lo[d], &hi[d]);
            }
        } else {
            /* Equinox's _padding_transpose. */
            int64_t p0, p1, a = opad[d];
            if (pkind == NB_NN_PAD_EXPLICIT) {
                p0 = pad[d][0];
                p1 = pad[d][1];
            } else if (pkind == NB_NN_PAD_VALID) {
                p0 = p1 = 0;
            } else {
                int64_t psum = ek - 1 - stride[d] + a + 1;
                a = psum < 0 ? -psum : 0;
                psum = psum < 0 ? 0 : psum;
                p0 = (psum + (pkind == NB_NN_PAD_SAME_LOWER)) / 2;
                p1 = psum - p0;
            }
            lo[d] = ek - 1 - p0;
            hi[d] = ek - 1 - p1 + a;
        }
    }
    if (transpose) {
        xt = nbi_conv_dilate(tr, xt, nd, stride);
        cstride = ones;
    }
    nb_var *y = nbi_conv_core(&at, xt, x, wv, nd, ks, cstride, dil, lo, hi, groups, so);
    if (y == NULL) {
        return tr->poison;
    }
    int64_t oshape[2 + NBI_CONV_MAX_ND]; /* [N, O, So...] or [O, So...] */
    int o = 0;
    if (r == nd + 2) {
        oshape[o++] = n;
    }
    oshape[o++] = cout;
    memcpy(oshape + o, so, (size_t)nd * sizeof(int64_t));
    y = nb_reshape(y, r, oshape);
    if (bv != NULL) {
        y = nb_add(y, bv);
    }
    return y;
}

nb_var *nb_nn_conv(nb_trace *tr, const nb_tree *layer, nb_var *x) {
    return nbi_conv_apply(tr, layer, x, false, "nb_nn_conv");
}

nb_var *nb_nn_conv_transpose(nb_trace *tr, const nb_tree *layer, nb_var *x) {
    return nbi_conv_apply(tr, layer, x, true, "nb_nn_conv_transpose");
}

nb_var *nb_nn_conv2d(nb_trace *tr, const nb_tree *layer, nb_var *x) {
    return nbi_conv_apply(tr, layer, x, false, "nb_nn_conv2d");
}
