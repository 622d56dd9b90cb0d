/*
 * test_layers.c -- the standard layers of nabla/nn.h beyond the first set: Conv1d/2d/3d,
 * ConvTranspose, MaxPool/AvgPool/Adaptive pooling, GroupNorm, RMSNorm, BatchNorm (both
 * modes, its state under jit), MultiheadAttention, GRUCell and LSTMCell.
 *
 * Against Equinox (tests/nn/oracle/equinox_layers.txt, made by gen_equinox_layers.py
 * beside it): every parameter bit for bit from the same key, every output within a few
 * f32 ulps of the largest value (the products' summation orders differ: BLIS vs XLA),
 * max pooling's gradient with ties (the first maximum of a window takes it) bit for bit,
 * BatchNorm's running statistics after four steps. Then gradients of every layer in f64
 * against central finite differences, misuse errors (the message names the layer, the
 * leaf or input, the shapes and the fix), and allocation failures during init.
 */
#include "nbtest.h"

#include <stdlib.h>

#ifndef NBT_ORACLE_DIR
#define NBT_ORACLE_DIR "tests/nn/oracle"
#endif

/* ---- helpers ------------------------------------------------------------------------ */

static nb_tree *leaf_of(nb_array *a) {
    nb_tree *t = NULL;
    NBT_OK(nb_array_ctx(a), nb_tree_array(a, &t));
    return t;
}

static double get_f64(const nb_array *a, int64_t i) {
    double v = 0;
    NBT_OK(nb_array_ctx(a), nb_array_get_flat(a, i, &v));
    return v;
}

/* Element i of a (row-major) set to v. */
static void set_flat(nb_array *a, int64_t i, double v) {
    int64_t idx[NB_MAX_RANK];
    for (int d = nb_array_rank(a) - 1; d >= 0; d--) {
        idx[d] = i % nb_array_dim(a, d);
        i /= nb_array_dim(a, d);
    }
    NBT_OK(nb_array_ctx(a), nb_array_set(a, idx, v));
}

static nb_array *key_of(nb_ctx *ctx, uint64_t seed) {
    nb_array *k = NULL;
    NBT_OK(ctx, nb_random_key(ctx, seed, &k));
    return k;
}

static nb_array *normal(nb_ctx *ctx, uint64_t seed, nb_dtype dt, int rank, const int64_t *shape) {
    nb_array *k = key_of(ctx, seed), *a = NULL;
    NBT_OK(ctx, nb_random_normal(k, dt, rank, shape, &a));
    nb_array_destroy(k);
    return a;
}

static nb_array *get_arr(const nb_tree *t, const char *path) {
    const nb_tree *l = NULL;
    NBT_OK(nb_tree_ctx(t), nb_tree_lookup(t, path, &l));
    nb_array *a = nb_tree_get_array(l);
    if (a == NULL) {
        fail_msg("'%s' is not an array leaf", path);
    }
    return a;
}

static const char *kind_of(const nb_tree *layer) {
    const char *k = NULL;
    NBT_OK(nb_tree_ctx(layer), nb_tree_get_string(nb_tree_get(layer, "kind"), &k));
    return k;
}

/* args = (layer, inputs...): the layer applied as its kind says; output one var, or a
 * tuple (h', c') for an LSTM cell and (y, new_state) for a BatchNorm. For attention the
 * inputs are (query, key, value, mask or null, PRNG key or null). */
static nb_status body_layer(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *layer = nb_tree_child(args, 0);
    const char *kind = kind_of(layer);
    nb_ctx *ctx = nb_trace_ctx(tr);
    if (strcmp(kind, "lstm_cell") == 0) {
        nb_var *c2 = NULL;
        nb_var *h2 = nb_nn_lstm_cell(tr, layer, nb_get(tr, args, "[1]"), nb_get(tr, args, "[2]"),
                                     nb_get(tr, args, "[3]"), &c2);
        if (nb_trace_status(tr) != NB_OK) {
            return nb_trace_status(tr);
        }
        return nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(h2), nb_leaf(c2)}, out);
    }
    if (strcmp(kind, "batch_norm") == 0) {
        const nb_tree *ns = NULL;
        nb_var *y =
            nb_nn_batch_norm(tr, layer, nb_get(tr, args, "[1]"), nb_tree_child(args, 2), &ns);
        if (nb_trace_status(tr) != NB_OK) {
            return nb_trace_status(tr);
        }
        return nb_tree_tuple(ctx, 2, (const nb_tree *[]){nb_leaf(y), ns}, out);
    }
    nb_var *y;
    if (strcmp(kind, "gru_cell") == 0 && nb_tree_len(args) == 4) { /* (layer, xs, h0, null) */
        y = nb_nn_gru(tr, layer, nb_get(tr, args, "[1]"), nb_get(tr, args, "[2]"), NULL);
    } else if (strcmp(kind, "gru_cell") == 0) {
        y = nb_nn_gru_cell(tr, layer, nb_get(tr, args, "[1]"), nb_get(tr, args, "[2]"));
    } else if (strcmp(kind, "multihead_attention") == 0) {
        const nb_tree *m = nb_tree_child(args, 4), *k = nb_tree_child(args, 5);
        y = nb_nn_multihead_attention(
            tr, layer, nb_get(tr, args, "[1]"), nb_get(tr, args, "[2]"), nb_get(tr, args, "[3]"),
            nb_tree_kind_of(m) == NB_TREE_KIND_NULL ? NULL : nb_var_of(tr, m),
            nb_tree_kind_of(k) == NB_TREE_KIND_NULL ? NULL : nb_var_of(tr, k));
    } else {
        y = nb_nn_apply(tr, layer, nb_get(tr, args, "[1]"), NULL);
    }
    return nb_return(y, out);
}

/* (layer, a[0], ..., a[n-1]); a NULL array becomes a null leaf. */
static nb_tree *make_args(nb_ctx *ctx, const nb_tree *layer, int n, nb_array *const *a) {
    nb_tree *items[8] = {(nb_tree *)layer};
    for (int i = 0; i < n; i++) {
        if (a[i] != NULL) {
            items[i + 1] = leaf_of(a[i]);
        } else {
            NBT_OK(ctx, nb_tree_null(ctx, &items[i + 1]));
        }
    }
    nb_tree *args = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, n + 1, items, &args));
    for (int i = 0; i < n; i++) {
        nb_tree_destroy(items[i + 1]);
    }
    return args;
}

static nb_status try_run(nb_ctx *ctx, const nb_tree *layer, int n, nb_array *const *a,
                         nb_tree **out) {
    nb_tree *args = make_args(ctx, layer, n, a);
    *out = NULL;
    nb_status st = nb_eval(ctx, body_layer, NULL, args, out);
    nb_tree_destroy(args);
    return st;
}

static nb_array *run1(nb_ctx *ctx, const nb_tree *layer, int n, nb_array *const *a) {
    nb_tree *out = NULL;
    NBT_OK(ctx, try_run(ctx, layer, n, a, &out));
    nb_array *y = nb_array_retain(nb_tree_get_array(out));
    NBT_TRUE(y != NULL);
    nb_tree_destroy(out);
    return y;
}

/* ---- the Equinox oracle ------------------------------------------------------------- */

#define ORACLE_MAX 256

typedef struct oentry {
    char name[48];
    char dtype[16];
    int rank;
    int64_t shape[NB_MAX_RANK];
    int64_t n;
    double *v;
} oentry;

typedef struct oracle {
    int n;
    oentry e[ORACLE_MAX];
} oracle;

static oracle O;

static bool oracle_load(oracle *o) {
    memset(o, 0, sizeof *o);
    FILE *f = fopen(NBT_ORACLE_DIR "/equinox_layers.txt", "rb");
    if (f == NULL) {
        return false;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    NBT_TRUE(text != NULL && fread(text, 1, (size_t)size, f) == (size_t)size);
    text[size] = '\0';
    fclose(f);
    char *save = NULL;
    for (char *ln = strtok_r(text, "\n", &save); ln != NULL; ln = strtok_r(NULL, "\n", &save)) {
        if (ln[0] == '#' || ln[0] == '\0') {
            continue;
        }
        NBT_TRUE(o->n < ORACLE_MAX);
        oentry *e = &o->e[o->n++];
        char shape[64];
        int off = 0;
        if (sscanf(ln, "%47s %15s %63s%n", e->name, e->dtype, shape, &off) != 3) {
            fail_msg("equinox_layers.txt: bad line '%.60s'", ln);
        }
        e->n = 1;
        char *p = shape;
        while (*p != '\0') {
            NBT_TRUE(e->rank < NB_MAX_RANK);
            e->shape[e->rank] = strtoll(p, &p, 10);
            e->n *= e->shape[e->rank++];
            if (*p == 'x') {
                p++;
            }
        }
        e->v = malloc((size_t)e->n * sizeof(double));
        NBT_TRUE(e->v != NULL);
        p = ln + off;
        for (int64_t i = 0; i < e->n; i++) {
            char *q = p;
            e->v[i] = strtod(p, &q);
            if (q == p) {
                fail_msg("equinox_layers.txt: %s has fewer than %lld values", e->name,
                         (long long)e->n);
            }
            p = q;
        }
    }
    free(text);
    return true;
}

static const oentry *oget(const char *name) {
    for (int i = 0; i < O.n; i++) {
        if (strcmp(O.e[i].name, name) == 0) {
            return &O.e[i];
        }
    }
    fail_msg("equinox_layers.txt has no '%s'", name);
    return NULL;
}

static const oentry *ogetf(const char *fmt, const char *a) {
    char name[64];
    snprintf(name, sizeof name, fmt, a);
    return oget(name);
}

/* An array of the entry's values: f32 (exact: %.9g round-trips f32) or bool. */
static nb_array *oarray(nb_ctx *ctx, const oentry *e) {
    nb_array *a = NULL;
    bool is_bool = strcmp(e->dtype, "bool") == 0;
    NBT_OK(ctx, nb_array_zeros(ctx, is_bool ? NB_DTYPE_BOOL : NB_DTYPE_F32, e->rank, e->shape, &a));
    for (int64_t i = 0; i < e->n; i++) {
        set_flat(a, i, e->v[i]);
    }
    return a;
}

/* a must hold the oracle's values: bit for bit when ulps is 0, else within ulps f32 units
 * in the last place of the largest |value|. Returns the worst difference in those ulps. */
static double expect_oracle(const nb_array *a, const oentry *e, double ulps) {
    if (nb_array_size(a) != e->n) {
        fail_msg("%s: %lld values, the oracle has %lld", e->name, (long long)nb_array_size(a),
                 (long long)e->n);
    }
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < e->n; i++) {
        scale = fmax(scale, fabs(e->v[i]));
    }
    for (int64_t i = 0; i < e->n; i++) {
        double got = 0;
        nb_array_get_flat(a, i, &got);
        double want = (double)(float)e->v[i];
        double u = (got - want) / (ldexp(1.0, -23) * fmax(scale, 1e-30));
        worst = nbt_max(worst, fabs(u));
        if (ulps == 0 ? got != want : !(fabs(u) <= ulps)) {
            fail_msg("%s[%lld]: nabla %.9g, Equinox %.9g (%.2f ulp)", e->name, (long long)i, got,
                     want, u);
        }
    }
    print_message("%-28s %s (worst %.2f ulp)\n", e->name, ulps == 0 ? "bit-identical" : "matches",
                  worst);
    return worst;
}

/* Parameters of a layer against "<name>_<leaf>" entries, bit for bit. */
static void expect_params(const nb_tree *layer, const char *name, int n,
                          const char *const *leaves) {
    for (int i = 0; i < n; i++) {
        char en[64], path[64];
        snprintf(en, sizeof en, "%s_%s", name, leaves[i]);
        snprintf(path, sizeof path, "%s", leaves[i]);
        expect_oracle(get_arr(layer, path), oget(en), 0);
    }
}

/* A layer applied to the oracle's input <name>_x, compared with <name>_y. */
static void expect_forward(nb_ctx *ctx, const nb_tree *layer, const char *name, double ulps) {
    nb_array *x = oarray(ctx, ogetf("%s_x", name));
    nb_array *y = run1(ctx, layer, 1, &x);
    expect_oracle(y, ogetf("%s_y", name), ulps);
    nb_array_destroy(y);
    nb_array_destroy(x);
}

static const char *const WB[2] = {"weight", "bias"};

static void test_conv_oracle(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *l = NULL;
    nb_array *k = NULL;
    nb_nn_conv_opts o;

    /* Conv1d(3, 4, kernel_size=3, stride=2, padding=1) */
    k = key_of(ctx, 10);
    o = nb_nn_conv_opts_default();
    o.stride[0] = 2;
    o.padding[0][0] = o.padding[0][1] = 1;
    NBT_OK(ctx, nb_nn_conv_init(ctx, 1, 3, 4, (int64_t[]){3}, &o, NB_DTYPE_F32, k, &l));
    NBT_STREQ(kind_of(l), "conv1d");
    expect_params(l, "conv1d", 2, WB);
    expect_forward(ctx, l, "conv1d", 4);
    nb_tree_destroy(l);
    nb_array_destroy(k);

    /* Conv1d(2, 3, kernel_size=4, padding="SAME", dilation=2) */
    k = key_of(ctx, 11);
    o = nb_nn_conv_opts_default();
    o.padding_kind = NB_NN_PAD_SAME;
    o.dilation[0] = 2;
    NBT_OK(ctx, nb_nn_conv_init(ctx, 1, 2, 3, (int64_t[]){4}, &o, NB_DTYPE_F32, k, &l));
    expect_params(l, "conv1d_same", 2, WB);
    expect_forward(ctx, l, "conv1d_same", 4);
    nb_tree_destroy(l);
    nb_array_destroy(k);

    /* Conv2d(4, 6, (2, 3), stride (1, 2), padding ((1, 0), (2, 1)), groups 2) */
    k = key_of(ctx, 12);
    o = nb_nn_conv_opts_default();
    o.stride[1] = 2;
    o.padding[0][0] = 1;
    o.padding[1][0] = 2;
    o.padding[1][1] = 1;
    o.groups = 2;
    NBT_OK(ctx, nb_nn_conv_init(ctx, 2, 4, 6, (int64_t[]){2, 3}, &o, NB_DTYPE_F32, k, &l));
    expect_params(l, "conv2d_g", 2, WB);
    expect_forward(ctx, l, "conv2d_g", 4);
    nb_tree_destroy(l);
    nb_array_destroy(k);

    /* Conv2d(2, 3, 3, stride 2, padding "VALID", no bias) */
    k = key_of(ctx, 17);
    o = nb_nn_conv_opts_default();
    o.stride[0] = o.stride[1] = 2;
    o.padding_kind = NB_NN_PAD_VALID;
    o.use_bias = false;
    NBT_OK(ctx, nb_nn_conv_init(ctx, 2, 2, 3, (int64_t[]){3, 3}, &o, NB_DTYPE_F32, k, &l));
    expect_params(l, "conv2d_valid", 1, WB);
    NBT_EQ_I64(nb_tree_kind_of(nb_tree_get(l, "bias")), NB_TREE_KIND_NULL);
    expect_forward(ctx, l, "conv2d_valid", 4);
    nb_tree_destroy(l);
    nb_array_destroy(k);

    /* Conv3d(2, 3, 2, padding 1) */
    k = key_of(ctx, 13);
    o = nb_nn_conv_opts_default();
    for (int d = 0; d < 3; d++) {
        o.padding[d][0] = o.padding[d][1] = 1;
    }
    NBT_OK(ctx, nb_nn_conv_init(ctx, 3, 2, 3, (int64_t[]){2, 2, 2}, &o, NB_DTYPE_F32, k, &l));
    NBT_STREQ(kind_of(l), "conv3d");
    expect_params(l, "conv3d", 2, WB);
    expect_forward(ctx, l, "conv3d", 4);
    nb_tree_destroy(l);
    nb_array_destroy(k);
    nb_ctx_destroy(ctx);
}

static void test_conv_transpose_oracle(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *l = NULL;
    nb_array *k = NULL;
    nb_nn_conv_opts o;

    /* ConvTranspose1d(3, 2, 3, stride 2, padding 1, output_padding 1) */
    k = key_of(ctx, 14);
    o = nb_nn_conv_opts_default();
    o.stride[0] = 2;
    o.padding[0][0] = o.padding[0][1] = 1;
    o.output_padding[0] = 1;
    NBT_OK(ctx, nb_nn_conv_transpose_init(ctx, 1, 3, 2, (int64_t[]){3}, &o, NB_DTYPE_F32, k, &l));
    NBT_STREQ(kind_of(l), "conv_transpose1d");
    expect_params(l, "convt1d", 2, WB);
    expect_forward(ctx, l, "convt1d", 4);
    nb_tree_destroy(l);
    nb_array_destroy(k);

    /* ConvTranspose2d(2, 4, (3, 2), stride (2, 3), dilation (1, 2)) */
    k = key_of(ctx, 15);
    o = nb_nn_conv_opts_default();
    o.stride[0] = 2;
    o.stride[1] = 3;
    o.dilation[1] = 2;
    NBT_OK(ctx,
           nb_nn_conv_transpose_init(ctx, 2, 2, 4, (int64_t[]){3, 2}, &o, NB_DTYPE_F32, k, &l));
    expect_params(l, "convt2d", 2, WB);
    expect_forward(ctx, l, "convt2d", 4);
    nb_tree_destroy(l);
    nb_array_destroy(k);

    /* ConvTranspose2d(4, 2, 3, stride 2, padding "SAME", groups 2) */
    k = key_of(ctx, 16);
    o = nb_nn_conv_opts_default();
    o.stride[0] = o.stride[1] = 2;
    o.padding_kind = NB_NN_PAD_SAME;
    o.groups = 2;
    NBT_OK(ctx,
           nb_nn_conv_transpose_init(ctx, 2, 4, 2, (int64_t[]){3, 3}, &o, NB_DTYPE_F32, k, &l));
    expect_params(l, "convt2d_same", 2, WB);
    expect_forward(ctx, l, "convt2d_same", 4);
    nb_tree_destroy(l);
    nb_array_destroy(k);

    /* ConvTranspose2d(2, 2, 2, padding 2): the transposed padding is negative (a crop) */
    k = key_of(ctx, 18);
    o = nb_nn_conv_opts_default();
    o.padding[0][0] = o.padding[0][1] = o.padding[1][0] = o.padding[1][1] = 2;
    NBT_OK(ctx,
           nb_nn_conv_transpose_init(ctx, 2, 2, 2, (int64_t[]){2, 2}, &o, NB_DTYPE_F32, k, &l));
    expect_params(l, "convt2d_bigpad", 2, WB);
    expect_forward(ctx, l, "convt2d_bigpad", 4);
    nb_tree_destroy(l);
    nb_array_destroy(k);
    nb_ctx_destroy(ctx);
}

/* args = (x, layer, w): d sum(pool(x) * w) / dx by nabla's reverse mode. */
static nb_status body_pool_grad_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                     nb_tree **out) {
    (void)self;
    nb_var *y = nb_nn_pool(tr, nb_tree_child(args, 1), nb_get(tr, args, "[0]"));
    return nb_return(nb_sum(nb_mul(y, nb_get(tr, args, "[2]")), NULL, 0, false), out);
}

static void expect_pool_grad(nb_ctx *ctx, const nb_tree *layer, const char *name) {
    nb_array *x = oarray(ctx, ogetf("%s_x", name)), *w = oarray(ctx, ogetf("%s_w", name));
    nb_tree *lx = leaf_of(x), *lw = leaf_of(w), *args = NULL, *g = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){lx, (nb_tree *)layer, lw}, &args));
    nb_tree_destroy(lx);
    nb_tree_destroy(lw);
    nb_fn *f = NULL, *gf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "pool_loss", body_pool_grad_loss, NULL, &f));
    NBT_OK(ctx, nb_grad(f, NULL, &gf));
    NBT_OK(ctx, nb_fn_call(gf, args, &g));
    expect_oracle(nb_tree_get_array(g), ogetf("%s_grad", name), 0);
    nb_tree_destroy(g);
    nb_fn_destroy(gf);
    nb_fn_destroy(f);
    nb_tree_destroy(args);
    nb_array_destroy(w);
    nb_array_destroy(x);
}

static void test_pool_oracle(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *l = NULL;
    nb_nn_pool_opts o = nb_nn_pool_opts_default();

    /* MaxPool2d(3, stride 2, padding 1): values, the gradient, and with ties */
    o.stride[0] = o.stride[1] = 2;
    o.padding[0][0] = o.padding[0][1] = o.padding[1][0] = o.padding[1][1] = 1;
    NBT_OK(ctx, nb_nn_max_pool_init(ctx, 2, (int64_t[]){3, 3}, &o, &l));
    expect_forward(ctx, l, "maxpool2d", 0);
    expect_pool_grad(ctx, l, "maxpool2d");
    expect_forward(ctx, l, "maxpool2d_ties", 0);
    expect_pool_grad(ctx, l, "maxpool2d_ties");
    nb_tree_destroy(l);

    /* MaxPool1d(2, stride 2, use_ceil) */
    o = nb_nn_pool_opts_default();
    o.stride[0] = 2;
    o.use_ceil = true;
    NBT_OK(ctx, nb_nn_max_pool_init(ctx, 1, (int64_t[]){2}, &o, &l));
    expect_forward(ctx, l, "maxpool1d_ceil", 0);
    nb_tree_destroy(l);

    /* AvgPool2d((2, 3), stride (2, 1), padding ((1, 1), (0, 1))) */
    o = nb_nn_pool_opts_default();
    o.stride[0] = 2;
    o.padding[0][0] = o.padding[0][1] = 1;
    o.padding[1][1] = 1;
    NBT_OK(ctx, nb_nn_avg_pool_init(ctx, 2, (int64_t[]){2, 3}, &o, &l));
    expect_forward(ctx, l, "avgpool2d", 1);
    nb_tree_destroy(l);

    /* AvgPool1d(3, stride 2, padding 1, use_ceil) */
    o = nb_nn_pool_opts_default();
    o.stride[0] = 2;
    o.padding[0][0] = o.padding[0][1] = 1;
    o.use_ceil = true;
    NBT_OK(ctx, nb_nn_avg_pool_init(ctx, 1, (int64_t[]){3}, &o, &l));
    expect_forward(ctx, l, "avgpool1d_ceil", 1);
    nb_tree_destroy(l);

    /* MaxPool3d(2, stride 1) */
    NBT_OK(ctx, nb_nn_max_pool_init(ctx, 3, (int64_t[]){2, 2, 2}, NULL, &l));
    expect_forward(ctx, l, "maxpool3d", 0);
    nb_tree_destroy(l);

    /* Adaptive pooling */
    NBT_OK(ctx, nb_nn_adaptive_avg_pool_init(ctx, 1, (int64_t[]){4}, &l));
    expect_forward(ctx, l, "adaptive_avg1d", 1);
    nb_tree_destroy(l);
    NBT_OK(ctx, nb_nn_adaptive_avg_pool_init(ctx, 2, (int64_t[]){3, 2}, &l));
    expect_forward(ctx, l, "adaptive_avg2d", 1);
    nb_tree_destroy(l);
    NBT_OK(ctx, nb_nn_adaptive_max_pool_init(ctx, 2, (int64_t[]){2, 3}, &l));
    expect_forward(ctx, l, "adaptive_max2d", 0);
    nb_tree_destroy(l);
    nb_ctx_destroy(ctx);
}

/* A copy of layer with the weight and bias replaced by the oracle's <name>_weight/_bias. */
static nb_tree *with_affine(nb_ctx *ctx, const nb_tree *layer, const char *name) {
    nb_array *w = oarray(ctx, ogetf("%s_weight", name)), *b = oarray(ctx, ogetf("%s_bias", name));
    int64_t n = nb_tree_len(layer);
    const char *keys[32];
    nb_tree *items[32];
    nb_tree *lw = leaf_of(w), *lb = leaf_of(b);
    for (int64_t i = 0; i < n; i++) {
        keys[i] = nb_tree_key(layer, i);
        items[i] = strcmp(keys[i], "weight") == 0 ? lw
                   : strcmp(keys[i], "bias") == 0 ? lb
                                                  : (nb_tree *)nb_tree_child(layer, i);
    }
    nb_tree *out = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, n, keys, items, &out));
    nb_tree_destroy(lw);
    nb_tree_destroy(lb);
    nb_array_destroy(w);
    nb_array_destroy(b);
    return out;
}

static void test_norm_oracle(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *l = NULL, *l2 = NULL;

    NBT_OK(ctx, nb_nn_group_norm_init(ctx, 2, 6, NULL, NB_DTYPE_F32, &l));
    NBT_EQ_F64(get_f64(get_arr(l, "weight"), 0), 1.0);
    l2 = with_affine(ctx, l, "groupnorm");
    expect_forward(ctx, l2, "groupnorm", 4);
    nb_tree_destroy(l2);
    nb_tree_destroy(l);

    nb_nn_group_norm_opts go = nb_nn_group_norm_opts_default();
    go.channelwise_affine = false;
    NBT_OK(ctx, nb_nn_group_norm_init(ctx, 3, 6, &go, NB_DTYPE_F32, &l));
    expect_forward(ctx, l, "groupnorm_plain", 4);
    nb_tree_destroy(l);

    NBT_OK(ctx, nb_nn_rms_norm_init(ctx, 1, (int64_t[]){5}, 1e-5, true, true, NB_DTYPE_F32, &l));
    expect_params(l, "rmsnorm", 2, WB);
    expect_forward(ctx, l, "rmsnorm", 4);
    nb_tree_destroy(l);

    NBT_OK(ctx, nb_nn_rms_norm_init(ctx, 2, (int64_t[]){2, 3}, 1e-5, true, true, NB_DTYPE_F32, &l));
    l2 = with_affine(ctx, l, "rmsnorm2");
    expect_forward(ctx, l2, "rmsnorm2", 4);
    nb_tree_destroy(l2);
    nb_tree_destroy(l);
    nb_ctx_destroy(ctx);
}

/* Four training steps of a BatchNorm through one jitted function, then inference:
 * outputs and state against Equinox's; the function traces once. */
static void check_batch_norm(nb_ctx *ctx, nb_nn_batch_norm_mode mode, const char *name) {
    nb_nn_batch_norm_opts o = nb_nn_batch_norm_opts_default();
    o.mode = mode;
    o.momentum = 0.9;
    nb_tree *layer = NULL, *st = NULL;
    NBT_OK(ctx, nb_nn_batch_norm_init(ctx, 3, &o, NB_DTYPE_F32, &layer, &st));
    const char *flag = mode == NB_NN_BATCH_NORM_BATCH ? "counter" : "first_time";
    char en[64];
    snprintf(en, sizeof en, "%s_init_%s", name, flag);
    expect_oracle(get_arr(st, flag), oget(en), 0);
    snprintf(en, sizeof en, "%s_init_mean", name);
    expect_oracle(get_arr(st, "mean"), oget(en), 0);
    snprintf(en, sizeof en, "%s_init_var", name);
    expect_oracle(get_arr(st, "var"), oget(en), 0);
    nb_fn *f = NULL, *jf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "bn_step", body_layer, NULL, &f));
    NBT_OK(ctx, nb_jit(f, NULL, &jf));
    nb_fn_stats s0, s;
    NBT_OK(ctx, nb_fn_stats_get(jf, &s0)); /* equal functions share counters: a delta */
    for (int i = 0; i < 4; i++) {
        snprintf(en, sizeof en, "%s_x%d", name, i);
        nb_array *x = oarray(ctx, oget(en));
        nb_tree *lx = leaf_of(x), *args = NULL, *out = NULL;
        NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){layer, lx, st}, &args));
        NBT_OK(ctx, nb_fn_call(jf, args, &out));
        snprintf(en, sizeof en, "%s_y%d", name, i);
        expect_oracle(nb_tree_get_array(nb_tree_child(out, 0)), oget(en), 8);
        const nb_tree *ns = nb_tree_child(out, 1);
        const char *leaves[3] = {flag, "mean", "var"};
        for (int j = 0; j < 3; j++) {
            snprintf(en, sizeof en, "%s_%s%d", name, leaves[j], i);
            expect_oracle(get_arr(ns, leaves[j]), oget(en), j == 0 ? 0 : 8);
        }
        nb_tree_destroy(st);
        st = nb_tree_retain((nb_tree *)ns);
        nb_tree_destroy(out);
        nb_tree_destroy(args);
        nb_tree_destroy(lx);
        nb_array_destroy(x);
    }
    NBT_OK(ctx, nb_fn_stats_get(jf, &s));
    /* one trace for four steps: the state's structure is the same after every step */
    NBT_EQ_I64(s.n_traces - s0.n_traces, 1);
    NBT_EQ_I64(s.n_hits - s0.n_hits, 3);
    /* inference on x3 with the state after four steps */
    nb_tree *inf = NULL;
    NBT_OK(ctx, nb_nn_inference_mode(layer, true, &inf));
    snprintf(en, sizeof en, "%s_x3", name);
    nb_array *x = oarray(ctx, oget(en));
    nb_tree *lx = leaf_of(x), *args = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){inf, lx, st}, &args));
    NBT_OK(ctx, nb_fn_call(jf, args, &out));
    snprintf(en, sizeof en, "%s_yinf", name);
    expect_oracle(nb_tree_get_array(nb_tree_child(out, 0)), oget(en), 8);
    /* inference passes the state through */
    NBT_EQ_F64(get_f64(get_arr(nb_tree_child(out, 1), "mean"), 1), get_f64(get_arr(st, "mean"), 1));
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nb_tree_destroy(lx);
    nb_array_destroy(x);
    nb_tree_destroy(inf);
    nb_fn_destroy(jf);
    nb_fn_destroy(f);
    nb_tree_destroy(st);
    nb_tree_destroy(layer);
}

static void test_batch_norm_oracle(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    check_batch_norm(ctx, NB_NN_BATCH_NORM_BATCH, "batchnorm_batch");
    check_batch_norm(ctx, NB_NN_BATCH_NORM_EMA, "batchnorm_ema");
    nb_ctx_destroy(ctx);
}

static void test_attention_oracle(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *l = NULL;
    static const char *const projs[4][2] = {{"query_proj.weight", "q_weight"},
                                            {"key_proj.weight", "k_weight"},
                                            {"value_proj.weight", "v_weight"},
                                            {"output_proj.weight", "o_weight"}};
    nb_nn_mha_opts o = nb_nn_mha_opts_default();
    o.key_size = 5;
    o.value_size = 4;
    o.output_size = 3;
    o.qk_size = 4;
    o.vo_size = 2;
    o.use_query_bias = o.use_output_bias = true;
    for (int drop = 0; drop < 2; drop++) {
        const char *name = drop ? "mha_drop" : "mha";
        o.dropout_p = drop ? 0.3 : 0.0;
        nb_array *k = key_of(ctx, 20);
        NBT_OK(ctx, nb_nn_multihead_attention_init(ctx, 2, 6, &o, NB_DTYPE_F32, k, &l));
        nb_array_destroy(k);
        char en[64];
        for (int i = 0; i < 4; i++) {
            snprintf(en, sizeof en, "%s_%s", name, projs[i][1]);
            expect_oracle(get_arr(l, projs[i][0]), oget(en), 0);
        }
        expect_oracle(get_arr(l, "query_proj.bias"), ogetf("%s_q_bias", name), 0);
        expect_oracle(get_arr(l, "output_proj.bias"), ogetf("%s_o_bias", name), 0);
        NBT_EQ_I64(nb_tree_kind_of(nb_tree_get(nb_tree_get(l, "key_proj"), "bias")),
                   NB_TREE_KIND_NULL);
        nb_array *q = oarray(ctx, ogetf("%s_xq", name)), *kk = oarray(ctx, ogetf("%s_xk", name)),
                 *v = oarray(ctx, ogetf("%s_xv", name));
        nb_array *dk = drop ? key_of(ctx, 21) : NULL;
        nb_array *y = run1(ctx, l, 5, (nb_array *[]){q, kk, v, NULL, dk});
        expect_oracle(y, ogetf("%s_y", name), 8);
        nb_array_destroy(y);
        if (!drop) {
            nb_array *m = oarray(ctx, oget("mha_mask")), *m3 = oarray(ctx, oget("mha_mask3"));
            y = run1(ctx, l, 5, (nb_array *[]){q, kk, v, m, NULL});
            expect_oracle(y, oget("mha_y_mask"), 8);
            nb_array_destroy(y);
            y = run1(ctx, l, 5, (nb_array *[]){q, kk, v, m3, NULL});
            expect_oracle(y, oget("mha_y_mask3"), 8);
            nb_array_destroy(y);
            nb_array_destroy(m);
            nb_array_destroy(m3);
        }
        nb_array_destroy(dk);
        nb_array_destroy(q);
        nb_array_destroy(kk);
        nb_array_destroy(v);
        nb_tree_destroy(l);
    }
    /* self-attention with Equinox's defaults, plain and causal (the flag and a tril mask) */
    nb_array *k = key_of(ctx, 22);
    NBT_OK(ctx, nb_nn_multihead_attention_init(ctx, 4, 8, NULL, NB_DTYPE_F32, k, &l));
    nb_tree *lc = NULL;
    o = nb_nn_mha_opts_default();
    o.causal = true;
    NBT_OK(ctx, nb_nn_multihead_attention_init(ctx, 4, 8, &o, NB_DTYPE_F32, k, &lc));
    nb_array_destroy(k);
    expect_oracle(get_arr(l, "query_proj.weight"), oget("mha_self_q_weight"), 0);
    nb_array *x = oarray(ctx, oget("mha_self_x")), *m = oarray(ctx, oget("mha_self_mask"));
    nb_array *y = run1(ctx, l, 5, (nb_array *[]){x, x, x, NULL, NULL});
    expect_oracle(y, oget("mha_self_y"), 8);
    nb_array_destroy(y);
    y = run1(ctx, l, 5, (nb_array *[]){x, x, x, m, NULL});
    expect_oracle(y, oget("mha_self_y_causal"), 8);
    nb_array_destroy(y);
    y = run1(ctx, lc, 5, (nb_array *[]){x, x, x, NULL, NULL});
    expect_oracle(y, oget("mha_self_y_causal"), 8);
    nb_array_destroy(y);
    nb_array_destroy(m);
    nb_array_destroy(x);
    nb_tree_destroy(lc);
    nb_tree_destroy(l);
    nb_ctx_destroy(ctx);
}

static void test_rnn_oracle(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *l = NULL;
    nb_array *k = key_of(ctx, 30);
    static const char *const gl[4] = {"weight_ih", "weight_hh", "bias", "bias_n"};
    NBT_OK(ctx, nb_nn_gru_cell_init(ctx, 3, 4, true, NB_DTYPE_F32, k, &l));
    expect_params(l, "gru", 4, gl);
    nb_array *x = oarray(ctx, oget("gru_x")), *h = oarray(ctx, oget("gru_h"));
    nb_array *y = run1(ctx, l, 2, (nb_array *[]){x, h});
    expect_oracle(y, oget("gru_h1"), 4);
    nb_array_destroy(y);
    /* the scan's states, step by step from zeros */
    const oentry *xs = oget("gru_xs"), *hs = oget("gru_hs");
    nb_array *hc = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){4}, &hc));
    double worst = 0;
    for (int t = 0; t < xs->shape[0]; t++) {
        nb_array *xt = NULL;
        NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, &xt));
        for (int i = 0; i < 3; i++) {
            set_flat(xt, i, xs->v[t * 3 + i]);
        }
        nb_array *hn = run1(ctx, l, 2, (nb_array *[]){xt, hc});
        for (int i = 0; i < 4; i++) {
            double got = get_f64(hn, i), want = (double)(float)hs->v[t * 4 + i];
            worst = nbt_max(worst, fabs(got - want) / ldexp(1.0, -23));
        }
        nb_array_destroy(hc);
        nb_array_destroy(xt);
        hc = hn;
    }
    print_message("gru scan over %lld steps: worst %.2f ulp of 1\n", (long long)xs->shape[0],
                  worst);
    NBT_TRUE(worst <= 16);
    nb_array_destroy(hc);
    nb_tree_destroy(l);
    NBT_OK(ctx, nb_nn_gru_cell_init(ctx, 3, 4, false, NB_DTYPE_F32, k, &l));
    expect_params(l, "gru_nobias", 2, gl);
    y = run1(ctx, l, 2, (nb_array *[]){x, h});
    expect_oracle(y, oget("gru_nobias_h1"), 4);
    nb_array_destroy(y);
    nb_tree_destroy(l);
    nb_array_destroy(x);
    nb_array_destroy(h);
    nb_array_destroy(k);

    k = key_of(ctx, 31);
    NBT_OK(ctx, nb_nn_lstm_cell_init(ctx, 3, 4, true, NB_DTYPE_F32, k, &l));
    expect_params(l, "lstm", 3, gl);
    x = oarray(ctx, oget("lstm_x"));
    h = oarray(ctx, oget("lstm_h"));
    nb_array *c = oarray(ctx, oget("lstm_c"));
    nb_tree *out = NULL;
    NBT_OK(ctx, try_run(ctx, l, 3, (nb_array *[]){x, h, c}, &out));
    expect_oracle(nb_tree_get_array(nb_tree_child(out, 0)), oget("lstm_h1"), 4);
    expect_oracle(nb_tree_get_array(nb_tree_child(out, 1)), oget("lstm_c1"), 4);
    nb_tree_destroy(out);
    nb_array_destroy(c);
    nb_array_destroy(x);
    nb_array_destroy(h);
    nb_tree_destroy(l);
    nb_array_destroy(k);
    nb_ctx_destroy(ctx);
}

/* ---- gradients vs finite differences (f64) ------------------------------------------ */

/* args = ((layer, inputs...), r[, r2]) -> sum(out * r) (+ sum(out2 * r2)) */
static nb_status body_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_tree *o = NULL;
    nb_status st = body_layer(tr, self, nb_tree_child(args, 0), &o);
    if (st != NB_OK) {
        return st;
    }
    nb_var *loss;
    if (nb_tree_kind_of(o) == NB_TREE_KIND_TUPLE) {
        loss = nb_sum(nb_mul(nb_var_of(tr, nb_tree_child(o, 0)), nb_get(tr, args, "[1]")), NULL, 0,
                      false);
        if (nb_tree_kind_of(nb_tree_child(o, 1)) == NB_TREE_KIND_VAR) { /* LSTM's c' */
            loss = nb_add(
                loss, nb_sum(nb_mul(nb_var_of(tr, nb_tree_child(o, 1)), nb_get(tr, args, "[2]")),
                             NULL, 0, false));
        }
    } else {
        loss = nb_sum(nb_mul(nb_var_of(tr, o), nb_get(tr, args, "[1]")), NULL, 0, false);
    }
    nb_tree_destroy(o);
    return nb_return(loss, out);
}

static double eval_loss(nb_fn *f, const nb_tree *args) {
    nb_tree *out = NULL;
    NBT_OK(nb_tree_ctx(args), nb_fn_call(f, args, &out));
    double v = 0;
    nb_array_get_flat(nb_tree_get_array(out), 0, &v);
    nb_tree_destroy(out);
    return v;
}

/* d loss / d every f64 leaf of (layer, inputs) against central differences (a BatchNorm's
 * state is an input too: its gradient is checked as well). Returns the entries checked. */
static int64_t check_grad_pair(nb_ctx *ctx, const char *what, const nb_tree *pair) {
    nb_tree *o = NULL;
    NBT_OK(ctx, nb_eval(ctx, body_layer, NULL, pair, &o));
    const nb_tree *y0 = nb_tree_kind_of(o) == NB_TREE_KIND_TUPLE ? nb_tree_child(o, 0) : o;
    const nb_tree *y1 = nb_tree_kind_of(o) == NB_TREE_KIND_TUPLE ? nb_tree_child(o, 1) : y0;
    nb_array *a0 = nb_tree_get_array(y0);
    nb_array *a1 = nb_tree_get_array(y1) != NULL ? nb_tree_get_array(y1) : a0;
    nb_array *r = normal(ctx, 99, NB_DTYPE_F64, nb_array_rank(a0), nb_array_shape(a0));
    nb_array *r2 = normal(ctx, 98, NB_DTYPE_F64, nb_array_rank(a1), nb_array_shape(a1));
    nb_tree_destroy(o);
    nb_tree *lr = leaf_of(r), *lr2 = leaf_of(r2), *args = NULL, *g = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){(nb_tree *)pair, lr, lr2}, &args));
    nb_fn *f = NULL, *gf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, what, body_loss, NULL, &f));
    NBT_OK(ctx, nb_grad(f, NULL, &gf));
    NBT_OK(ctx, nb_fn_call(gf, args, &g));
    int64_t checked = 0;
    for (int64_t li = 0; li < nb_tree_num_leaves(pair); li++) {
        char path[256];
        NBT_OK(ctx, nb_tree_leaf_path(pair, li, path, sizeof path, NULL));
        const nb_tree *pl = NULL, *gl = NULL;
        NBT_OK(ctx, nb_tree_lookup(pair, path, &pl));
        nb_array *p = nb_tree_get_array(pl);
        if (p == NULL || nb_array_dtype(p) != NB_DTYPE_F64) {
            continue;
        }
        NBT_OK(ctx, nb_tree_lookup(g, path, &gl));
        nb_array *ga = nb_tree_get_array(gl);
        if (ga == NULL) {
            fail_msg("%s: no gradient at %s", what, path);
        }
        double *pd = nb_array_data(p);
        for (int64_t i = 0; i < nb_array_size(p); i++) {
            double h = 1e-5 * fmax(1.0, fabs(pd[i])), save = pd[i];
            pd[i] = save + h;
            double fp = eval_loss(f, args);
            pd[i] = save - h;
            double fm = eval_loss(f, args);
            pd[i] = save;
            double fd = (fp - fm) / (2 * h), an = 0;
            nb_array_get_flat(ga, i, &an);
            if (!(fabs(an - fd) <= 2e-7 * fmax(1.0, fabs(fd)))) {
                fail_msg("%s: d loss / d %s[%lld]: grad %.12g, finite difference %.12g", what, path,
                         (long long)i, an, fd);
            }
            checked++;
        }
    }
    nb_tree_destroy(g);
    nb_fn_destroy(gf);
    nb_fn_destroy(f);
    nb_tree_destroy(args);
    nb_tree_destroy(lr);
    nb_tree_destroy(lr2);
    nb_array_destroy(r);
    nb_array_destroy(r2);
    print_message("%-24s %5lld gradient entries match finite differences\n", what,
                  (long long)checked);
    NBT_TRUE(checked > 0);
    return checked;
}

static int64_t check_grad(nb_ctx *ctx, const char *what, const nb_tree *layer, int n,
                          nb_array *const *in) {
    nb_tree *pair = make_args(ctx, layer, n, in);
    int64_t checked = check_grad_pair(ctx, what, pair);
    nb_tree_destroy(pair);
    return checked;
}

static nb_array *x64(nb_ctx *ctx, uint64_t seed, int rank, const int64_t *shape) {
    return normal(ctx, seed, NB_DTYPE_F64, rank, shape);
}

static void test_grads(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = key_of(ctx, 5), *x = NULL, *h = NULL, *c = NULL;
    nb_tree *l = NULL;
    nb_nn_conv_opts co = nb_nn_conv_opts_default();
    int64_t total = 0;

    co.stride[0] = 2;
    co.padding_kind = NB_NN_PAD_SAME;
    co.dilation[0] = 2;
    NBT_OK(ctx, nb_nn_conv_init(ctx, 1, 2, 3, (int64_t[]){3}, &co, NB_DTYPE_F64, key, &l));
    x = x64(ctx, 1, 3, (int64_t[]){2, 2, 9});
    total += check_grad(ctx, "conv1d batch SAME", l, 1, &x);
    nb_array_destroy(x);
    nb_tree_destroy(l);

    co = nb_nn_conv_opts_default();
    co.padding[0][0] = co.padding[2][1] = 1;
    co.groups = 2;
    NBT_OK(ctx, nb_nn_conv_init(ctx, 3, 4, 2, (int64_t[]){2, 1, 2}, &co, NB_DTYPE_F64, key, &l));
    x = x64(ctx, 2, 4, (int64_t[]){4, 3, 2, 3});
    total += check_grad(ctx, "conv3d groups", l, 1, &x);
    nb_array_destroy(x);
    nb_tree_destroy(l);

    co = nb_nn_conv_opts_default();
    co.stride[0] = 2;
    co.stride[1] = 3;
    co.dilation[1] = 2;
    co.padding[0][0] = 3; /* more than d (k - 1): cropped */
    co.output_padding[1] = 1;
    NBT_OK(ctx,
           nb_nn_conv_transpose_init(ctx, 2, 2, 2, (int64_t[]){2, 2}, &co, NB_DTYPE_F64, key, &l));
    x = x64(ctx, 3, 4, (int64_t[]){2, 2, 4, 3});
    total += check_grad(ctx, "conv_transpose2d", l, 1, &x);
    nb_array_destroy(x);
    nb_tree_destroy(l);

    nb_nn_pool_opts po = nb_nn_pool_opts_default();
    po.stride[0] = po.stride[1] = 2;
    po.padding[0][0] = 1;
    po.use_ceil = true;
    NBT_OK(ctx, nb_nn_max_pool_init(ctx, 2, (int64_t[]){3, 2}, &po, &l));
    x = x64(ctx, 4, 4, (int64_t[]){2, 3, 6, 5}); /* random: no ties */
    total += check_grad(ctx, "max_pool2d ceil", l, 1, &x);
    nb_tree_destroy(l);
    NBT_OK(ctx, nb_nn_avg_pool_init(ctx, 2, (int64_t[]){3, 2}, &po, &l));
    total += check_grad(ctx, "avg_pool2d ceil", l, 1, &x);
    nb_tree_destroy(l);
    NBT_OK(ctx, nb_nn_adaptive_avg_pool_init(ctx, 2, (int64_t[]){4, 2}, &l));
    total += check_grad(ctx, "adaptive_avg_pool2d", l, 1, &x);
    nb_tree_destroy(l);
    NBT_OK(ctx, nb_nn_adaptive_max_pool_init(ctx, 2, (int64_t[]){1, 3}, &l));
    total += check_grad(ctx, "adaptive_max_pool2d", l, 1, &x);
    nb_tree_destroy(l);

    nb_nn_group_norm_opts go = nb_nn_group_norm_opts_default();
    go.channel_axis = 1;
    NBT_OK(ctx, nb_nn_group_norm_init(ctx, 3, 3, &go, NB_DTYPE_F64, &l));
    total += check_grad(ctx, "group_norm batched", l, 1, &x);
    nb_tree_destroy(l);
    NBT_OK(ctx, nb_nn_rms_norm_init(ctx, 1, (int64_t[]){5}, 1e-5, true, true, NB_DTYPE_F64, &l));
    total += check_grad(ctx, "rms_norm", l, 1, &x);
    nb_tree_destroy(l);

    for (int mode = 0; mode < 2; mode++) {
        nb_nn_batch_norm_opts bo = nb_nn_batch_norm_opts_default();
        bo.mode = mode ? NB_NN_BATCH_NORM_EMA : NB_NN_BATCH_NORM_BATCH;
        bo.momentum = 0.8;
        /* (ema inference: its zero initial variance + eps is too close to 0 for a finite
         * difference step of 1e-5; batch inference covers the same expression) */
        for (int inference = 0; inference < 2 - mode; inference++) {
            bo.inference = inference;
            nb_tree *st = NULL, *lx = leaf_of(x), *pair = NULL;
            NBT_OK(ctx, nb_nn_batch_norm_init(ctx, 3, &bo, NB_DTYPE_F64, &l, &st));
            NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){l, lx, st}, &pair));
            char what[64];
            snprintf(what, sizeof what, "batch_norm %s %s", mode ? "ema" : "batch",
                     inference ? "inference" : "training");
            total += check_grad_pair(ctx, what, pair);
            nb_tree_destroy(pair);
            nb_tree_destroy(lx);
            nb_tree_destroy(st);
            nb_tree_destroy(l);
        }
    }

    nb_nn_mha_opts mo = nb_nn_mha_opts_default();
    mo.use_query_bias = mo.use_value_bias = mo.use_output_bias = true;
    mo.causal = true;
    NBT_OK(ctx, nb_nn_multihead_attention_init(ctx, 2, 4, &mo, NB_DTYPE_F64, key, &l));
    nb_array *q = x64(ctx, 5, 3, (int64_t[]){2, 3, 4}), *kk = x64(ctx, 6, 3, (int64_t[]){2, 5, 4}),
             *v = x64(ctx, 10, 3, (int64_t[]){2, 5, 4});
    total += check_grad(ctx, "multihead_attention", l, 5, (nb_array *[]){q, kk, v, NULL, NULL});
    nb_array_destroy(q);
    nb_array_destroy(kk);
    nb_array_destroy(v);
    nb_tree_destroy(l);

    NBT_OK(ctx, nb_nn_gru_cell_init(ctx, 3, 4, true, NB_DTYPE_F64, key, &l));
    nb_array_destroy(x);
    x = x64(ctx, 7, 2, (int64_t[]){2, 3});
    h = x64(ctx, 8, 2, (int64_t[]){2, 4});
    total += check_grad(ctx, "gru_cell", l, 2, (nb_array *[]){x, h});
    nb_tree_destroy(l);
    NBT_OK(ctx, nb_nn_lstm_cell_init(ctx, 3, 4, true, NB_DTYPE_F64, key, &l));
    c = x64(ctx, 9, 2, (int64_t[]){2, 4});
    total += check_grad(ctx, "lstm_cell", l, 3, (nb_array *[]){x, h, c});
    nb_tree_destroy(l);
    print_message("%lld gradient entries in all\n", (long long)total);
    nb_array_destroy(c);
    nb_array_destroy(h);
    nb_array_destroy(x);
    nb_array_destroy(key);
    nb_ctx_destroy(ctx);
}

/* A batched call with a per-example mask [B, Sq, Skv] is each example's own call with its
 * mask (the mask's rank says per example, not per head, even when B == num_heads). */
static void test_attention_batched_mask(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = key_of(ctx, 4);
    nb_tree *l = NULL;
    NBT_OK(ctx, nb_nn_multihead_attention_init(ctx, 2, 4, NULL, NB_DTYPE_F64, key, &l));
    nb_array *q = normal(ctx, 1, NB_DTYPE_F64, 3, (int64_t[]){2, 3, 4});
    nb_array *kv = normal(ctx, 2, NB_DTYPE_F64, 3, (int64_t[]){2, 5, 4}), *m = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_BOOL, 3, (int64_t[]){2, 3, 5}, &m));
    for (int64_t i = 0; i < 30; i++) {
        set_flat(m, i, (i * 7 + i / 5) % 3 != 0);
    }
    for (int b = 0; b < 2; b++) { /* every query attends to something */
        for (int r = 0; r < 3; r++) {
            set_flat(m, b * 15 + r * 5, 1);
        }
    }
    nb_array *y = run1(ctx, l, 5, (nb_array *[]){q, kv, kv, m, NULL});
    double worst = 0;
    for (int64_t b = 0; b < 2; b++) {
        nb_array *qb = NULL, *kb = NULL, *mb = NULL;
        NBT_OK(ctx, nb_array_index(q, b, &qb));
        NBT_OK(ctx, nb_array_index(kv, b, &kb));
        NBT_OK(ctx, nb_array_index(m, b, &mb));
        nb_array *yb = run1(ctx, l, 5, (nb_array *[]){qb, kb, kb, mb, NULL});
        for (int64_t i = 0; i < 12; i++) {
            worst = fmax(worst, fabs(get_f64(yb, i) - get_f64(y, b * 12 + i)));
        }
        nb_array_destroy(yb);
        nb_array_destroy(qb);
        nb_array_destroy(kb);
        nb_array_destroy(mb);
    }
    print_message("batched attention with per-example masks vs one call per example: %.3g\n",
                  worst);
    NBT_TRUE(worst < 1e-12);
    nb_array_destroy(y);
    nb_array_destroy(m);
    nb_array_destroy(kv);
    nb_array_destroy(q);
    nb_tree_destroy(l);
    nb_array_destroy(key);
    nb_ctx_destroy(ctx);
}

/* ---- a GRU over a sequence: nb_scan storing every step and checkpointed ----------------- */

static nb_status body_gru_step(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    nb_var *h = nb_nn_gru_cell(tr, self, nb_get(tr, args, "[1]"), nb_get(tr, args, "[0]"));
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(h), nb_leaf(h)}, out);
}

/* args = (cell, xs [T, B, in]) -> sum of the hidden states; self: a bool leaf, true for a
 * checkpointed scan (every 3 steps) */
static nb_status body_gru_seq(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    bool ck = false;
    nb_tree_get_bool(self, &ck);
    nb_var *xs = nb_get(tr, args, "[1]");
    nb_fn *f = NULL;
    nb_status st =
        nb_fn_create(nb_trace_ctx(tr), "gru_step", body_gru_step, nb_tree_child(args, 0), &f);
    if (st != NB_OK) {
        return st;
    }
    nb_var *h0 = nb_full(tr, nb_var_dtype(xs), 2, (int64_t[]){nb_var_dim(xs, 1), 4}, 0.0);
    nb_loop_opts lo = nb_loop_opts_default();
    lo.kind = ck ? NB_LOOP_CHECKPOINTED : NB_LOOP_BOUNDED;
    lo.checkpoints = 3;
    const nb_tree *r = nb_scan(tr, f, nb_leaf(h0), nb_leaf(xs), nb_var_dim(xs, 0), &lo);
    nb_fn_destroy(f);
    return nb_return(nb_sum(nb_square(nb_get(tr, r, "[1]")), NULL, 0, false), out);
}

/* The gradient of a GRU run over 17 steps is the same, bit for bit, stored and
 * checkpointed, and matches finite differences (f64). */
static void test_gru_scan(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = key_of(ctx, 8);
    nb_tree *cell = NULL, *g[2] = {NULL, NULL};
    NBT_OK(ctx, nb_nn_gru_cell_init(ctx, 3, 4, true, NB_DTYPE_F64, key, &cell));
    nb_array *xs = normal(ctx, 9, NB_DTYPE_F64, 3, (int64_t[]){17, 2, 3});
    nb_tree *lx = leaf_of(xs), *args = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){cell, lx}, &args));
    for (int ck = 0; ck < 2; ck++) {
        nb_tree *self = NULL;
        nb_fn *f = NULL, *gf = NULL;
        NBT_OK(ctx, nb_tree_bool(ctx, ck, &self));
        NBT_OK(ctx, nb_fn_create(ctx, "gru_seq", body_gru_seq, self, &f));
        NBT_OK(ctx, nb_grad(f, NULL, &gf));
        NBT_OK(ctx, nb_fn_call(gf, args, &g[ck]));
        nb_fn_destroy(gf);
        nb_fn_destroy(f);
        nb_tree_destroy(self);
    }
    static const char *const leaves[4] = {"weight_ih", "weight_hh", "bias", "bias_n"};
    for (int i = 0; i < 4; i++) {
        nb_array *a = get_arr(g[0], leaves[i]), *b = get_arr(g[1], leaves[i]);
        NBT_EQ_I64(nb_array_size(a), nb_array_size(b));
        NBT_TRUE(memcmp(nb_array_data(a), nb_array_data(b),
                        (size_t)nb_array_size(a) * sizeof(double)) == 0);
    }
    print_message("GRU over 17 steps: stored and checkpointed gradients bit-identical\n");
    nb_tree_destroy(g[0]);
    nb_tree_destroy(g[1]);
    nb_tree_destroy(args);
    nb_tree_destroy(lx);
    nb_array_destroy(xs);
    nb_tree_destroy(cell);
    nb_array_destroy(key);
    nb_ctx_destroy(ctx);
}

/* args = (cell, xs [T, B, in]) -> sum of the squared hidden states by nb_nn_gru; self: a
 * bool leaf, true for a checkpointed scan (every 3 steps) */
static nb_status body_gru_layer(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    bool ck = false;
    nb_tree_get_bool(self, &ck);
    nb_var *xs = nb_get(tr, args, "[1]");
    nb_var *h0 = nb_full(tr, nb_var_dtype(xs), 2, (int64_t[]){nb_var_dim(xs, 1), 4}, 0.0);
    nb_loop_opts lo = nb_loop_opts_default();
    lo.kind = NB_LOOP_CHECKPOINTED;
    lo.checkpoints = 3;
    nb_var *hs = nb_nn_gru(tr, nb_tree_child(args, 0), xs, h0, ck ? &lo : NULL);
    return nb_return(nb_sum(nb_square(hs), NULL, 0, false), out);
}

/* nb_nn_gru (the input side made for all steps before the scan) against a scan of
 * nb_nn_gru_cell over 17 steps (f64): the loss and every gradient leaf the same to
 * rounding; stored and checkpointed bit-identical; fewer products inside the loop. */
static void test_gru_layer(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = key_of(ctx, 8);
    nb_tree *cell = NULL, *vg[3] = {NULL, NULL, NULL};
    const nb_tree *g[3], *v[3];
    NBT_OK(ctx, nb_nn_gru_cell_init(ctx, 3, 4, true, NB_DTYPE_F64, key, &cell));
    nb_array *xs = normal(ctx, 9, NB_DTYPE_F64, 3, (int64_t[]){17, 2, 3});
    nb_tree *lx = leaf_of(xs), *args = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){cell, lx}, &args));
    for (int m = 0; m < 3; m++) { /* cells; nb_nn_gru stored; nb_nn_gru checkpointed */
        nb_tree *self = NULL;
        nb_fn *f = NULL, *gf = NULL;
        NBT_OK(ctx, nb_tree_bool(ctx, m == 2, &self));
        NBT_OK(ctx, nb_fn_create(ctx, "gru", m == 0 ? body_gru_seq : body_gru_layer, self, &f));
        NBT_OK(ctx, nb_value_and_grad(f, NULL, &gf));
        NBT_OK(ctx, nb_fn_call(gf, args, &vg[m]));
        v[m] = nb_tree_child(vg[m], 0);
        g[m] = nb_tree_child(vg[m], 1);
        nb_fn_destroy(gf);
        nb_fn_destroy(f);
        nb_tree_destroy(self);
    }
    double l0 = ((const double *)nb_array_data(nb_tree_get_array(v[0])))[0];
    double l1 = ((const double *)nb_array_data(nb_tree_get_array(v[1])))[0];
    NBT_TRUE(fabs(l0 - l1) <= 1e-13 * fabs(l0));
    static const char *const leaves[4] = {"weight_ih", "weight_hh", "bias", "bias_n"};
    double worst = 0;
    for (int i = 0; i < 4; i++) {
        nb_array *a = get_arr(g[0], leaves[i]), *b = get_arr(g[1], leaves[i]);
        nb_array *c = get_arr(g[2], leaves[i]);
        NBT_EQ_I64(nb_array_size(a), nb_array_size(b));
        const double *pa = nb_array_data(a), *pb = nb_array_data(b);
        double scale = 0;
        for (int64_t q = 0; q < nb_array_size(a); q++) {
            scale = fmax(scale, fabs(pa[q]));
        }
        for (int64_t q = 0; q < nb_array_size(a); q++) {
            worst = fmax(worst, fabs(pa[q] - pb[q]) / scale);
        }
        NBT_TRUE(memcmp(nb_array_data(b), nb_array_data(c),
                        (size_t)nb_array_size(b) * sizeof(double)) == 0);
    }
    print_message("nb_nn_gru vs a scan of cells over 17 steps: loss %.17g vs %.17g, gradients "
                  "within %.2e of their largest element\n",
                  l1, l0, worst);
    NBT_TRUE(worst <= 1e-12);
    for (int m = 0; m < 3; m++) {
        nb_tree_destroy(vg[m]);
    }
    nb_tree_destroy(args);
    nb_tree_destroy(lx);
    nb_array_destroy(xs);
    nb_tree_destroy(cell);
    nb_array_destroy(key);
    nb_ctx_destroy(ctx);
}

/* ---- misuse -------------------------------------------------------------------------- */

/* args = (layer, x) -> nb_nn_apply(layer, x) */
static nb_status body_apply(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_nn_apply(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]"), NULL), out);
}

static void expect_err(nb_ctx *ctx, nb_status want, nb_status got, const char *sub) {
    if (got != want) {
        fail_msg("status %s, wanted %s (message: %s)", nb_status_string(got),
                 nb_status_string(want), nb_ctx_errmsg(ctx));
    }
    print_message("%s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, sub);
}

static void test_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = key_of(ctx, 1);
    nb_tree *l = NULL, *out = NULL;
    nb_nn_conv_opts co = nb_nn_conv_opts_default();

    /* init arguments */
    co.stride[0] = 2;
    co.output_padding[0] = 2;
    expect_err(ctx, NB_ERR_INVALID,
               nb_nn_conv_transpose_init(ctx, 1, 2, 2, (int64_t[]){3}, &co, NB_DTYPE_F32, key, &l),
               "nb_nn_conv_transpose_init: opts.output_padding[0] is 2; it must be less than the "
               "stride 2");
    NBT_TRUE(l == NULL);
    co = nb_nn_conv_opts_default();
    co.output_padding[0] = 1;
    expect_err(ctx, NB_ERR_INVALID,
               nb_nn_conv_init(ctx, 1, 2, 2, (int64_t[]){3}, &co, NB_DTYPE_F32, key, &l),
               "only a transposed convolution has an output padding");
    expect_err(ctx, NB_ERR_INVALID,
               nb_nn_conv_init(ctx, 4, 2, 2, (int64_t[]){3}, NULL, NB_DTYPE_F32, key, &l),
               "nd (the number of spatial dims) is 4; it must be 1, 2 or 3");
    nb_nn_pool_opts po = nb_nn_pool_opts_default();
    po.padding[0][1] = 3;
    expect_err(ctx, NB_ERR_INVALID, nb_nn_max_pool_init(ctx, 1, (int64_t[]){2}, &po, &l),
               "opts.padding[0][1] is 3, more than the window size kernel[0] = 2");
    expect_err(ctx, NB_ERR_INVALID, nb_nn_group_norm_init(ctx, 4, 6, NULL, NB_DTYPE_F32, &l),
               "groups 4 must divide the number of channels 6");
    nb_tree *bst = NULL;
    nb_nn_batch_norm_opts bo = nb_nn_batch_norm_opts_default();
    bo.momentum = 1.5;
    expect_err(ctx, NB_ERR_INVALID, nb_nn_batch_norm_init(ctx, 3, &bo, NB_DTYPE_F32, &l, &bst),
               "opts.momentum is 1.5; it must be in [0, 1]");
    NBT_TRUE(l == NULL && bst == NULL);
    expect_err(ctx, NB_ERR_INVALID,
               nb_nn_multihead_attention_init(ctx, 8, 4, NULL, NB_DTYPE_F32, key, &l),
               "opts.qk_size defaults to query_size / num_heads = 4 / 8 = 0");
    expect_err(ctx, NB_ERR_INVALID,
               nb_nn_multihead_attention_init(ctx, 0, 4, NULL, NB_DTYPE_F32, key, &l),
               "num_heads is 0; it must be at least 1");

    /* inputs */
    NBT_OK(ctx, nb_nn_conv_init(ctx, 1, 2, 3, (int64_t[]){3}, NULL, NB_DTYPE_F32, key, &l));
    nb_array *x = normal(ctx, 1, NB_DTYPE_F32, 2, (int64_t[]){3, 9});
    expect_err(ctx, NB_ERR_SHAPE, try_run(ctx, l, 1, &x, &out),
               "nb_nn_conv: the input 'args[1]' of conv1d layer 'args[0]' is f32[3,9]; expected "
               "[C, L] or [N, C, L] with C = in_channels 2");
    nb_array *x2 = normal(ctx, 1, NB_DTYPE_F32, 2, (int64_t[]){2, 2});
    expect_err(ctx, NB_ERR_SHAPE, try_run(ctx, l, 1, &x2, &out),
               "along spatial dim 0 it is 2 after padding (0, 0), smaller than the dilated "
               "kernel 3");
    nb_tree_destroy(l);

    po = nb_nn_pool_opts_default();
    po.stride[0] = 3;
    po.use_ceil = true;
    NBT_OK(ctx, nb_nn_max_pool_init(ctx, 1, (int64_t[]){2}, &po, &l));
    expect_err(ctx, NB_ERR_SHAPE, try_run(ctx, l, 1, &x, &out),
               "use_ceil pads spatial dim 0 by (0, 3), more than the window 2");
    nb_tree_destroy(l);
    NBT_OK(ctx, nb_nn_adaptive_avg_pool_init(ctx, 1, (int64_t[]){10}, &l));
    expect_err(ctx, NB_ERR_SHAPE, try_run(ctx, l, 1, &x, &out),
               "spatial dim 0 has 9 elements, fewer than the 10 outputs wanted");
    nb_tree_destroy(l);
    NBT_OK(ctx, nb_nn_group_norm_init(ctx, 2, 4, NULL, NB_DTYPE_F32, &l));
    expect_err(ctx, NB_ERR_SHAPE, try_run(ctx, l, 1, &x, &out),
               "the input 'args[1]' of group_norm layer 'args[0]' is f32[3,9]; expected an array "
               "whose axis 0 is the 4 channels");
    nb_tree_destroy(l);

    /* BatchNorm: another layer's state, no batch axis, nb_nn_apply */
    NBT_OK(ctx, nb_nn_batch_norm_init(ctx, 3, NULL, NB_DTYPE_F32, &l, &bst));
    nb_tree *l4 = NULL, *st4 = NULL;
    NBT_OK(ctx, nb_nn_batch_norm_init(ctx, 4, NULL, NB_DTYPE_F32, &l4, &st4));
    nb_array *xb = normal(ctx, 2, NB_DTYPE_F32, 3, (int64_t[]){5, 3, 2});
    nb_tree *lx = leaf_of(xb), *args = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){l, lx, st4}, &args));
    expect_err(ctx, NB_ERR_SHAPE, nb_eval(ctx, body_layer, NULL, args, &out),
               "nb_nn_batch_norm: the state of batch_norm layer 'args[0]': 'args[2].mean' is "
               "f32[4], expected f32[3]");
    nb_tree_destroy(args);
    nb_tree *lx1 = leaf_of(x);
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){l, lx1, bst}, &args));
    expect_err(ctx, NB_ERR_SHAPE, nb_eval(ctx, body_layer, NULL, args, &out),
               "is f32[3,9]; expected [N, C, ...] with C = input_size 3 (a batch)");
    nb_tree_destroy(args);
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){l, lx}, &args));
    expect_err(ctx, NB_ERR_KIND, nb_eval(ctx, body_apply, NULL, args, &out),
               "is a 'batch_norm' layer, which takes more than one input; call nb_nn_batch_norm");
    nb_tree_destroy(args);
    nb_tree_destroy(lx1);
    nb_tree_destroy(lx);
    nb_tree_destroy(st4);
    nb_tree_destroy(l4);
    nb_tree_destroy(bst);
    nb_tree_destroy(l);

    /* attention: key and value of different lengths, a mask of the wrong shape, dropout
     * without a key */
    nb_nn_mha_opts mo = nb_nn_mha_opts_default();
    mo.dropout_p = 0.1;
    NBT_OK(ctx, nb_nn_multihead_attention_init(ctx, 2, 4, &mo, NB_DTYPE_F32, key, &l));
    nb_array *q = normal(ctx, 3, NB_DTYPE_F32, 2, (int64_t[]){3, 4});
    nb_array *k5 = normal(ctx, 4, NB_DTYPE_F32, 2, (int64_t[]){5, 4});
    nb_array *v6 = normal(ctx, 5, NB_DTYPE_F32, 2, (int64_t[]){6, 4});
    expect_err(ctx, NB_ERR_SHAPE, try_run(ctx, l, 5, (nb_array *[]){q, k5, v6, NULL, NULL}, &out),
               "got query f32[3,4], key f32[5,4], value f32[6,4]");
    nb_array *m = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_BOOL, 2, (int64_t[]){5, 3}, &m));
    expect_err(ctx, NB_ERR_SHAPE, try_run(ctx, l, 5, (nb_array *[]){q, k5, k5, m, NULL}, &out),
               "the mask of multihead_attention layer 'args[0]' is bool[5,3]; expected a bool "
               "[Sq, Skv] = [3, 5]");
    expect_err(ctx, NB_ERR_INVALID, try_run(ctx, l, 5, (nb_array *[]){q, k5, k5, NULL, NULL}, &out),
               "drops attention weights (dropout p = 0.1, training mode) but no key was given");
    /* a transposed convolution whose padding crops more than the input has */
    nb_nn_conv_opts tco = nb_nn_conv_opts_default();
    tco.stride[0] = 3;
    tco.padding[0][0] = 2;
    tco.output_padding[0] = 2;
    nb_tree *ct = NULL;
    NBT_OK(ctx,
           nb_nn_conv_transpose_init(ctx, 1, 1, 1, (int64_t[]){1}, &tco, NB_DTYPE_F32, key, &ct));
    nb_array *x11 = normal(ctx, 7, NB_DTYPE_F32, 2, (int64_t[]){1, 1});
    expect_err(ctx, NB_ERR_SHAPE, try_run(ctx, ct, 1, &x11, &out),
               "nb_nn_conv_transpose: the input 'args[1]' of conv_transpose1d layer 'args[0]' is "
               "f32[1,1]: its padding crops 2 elements from spatial dim 0, which has 1");
    nb_array_destroy(x11);
    nb_tree_destroy(ct);
    nb_array_destroy(m);
    nb_array_destroy(q);
    nb_array_destroy(k5);
    nb_array_destroy(v6);
    nb_tree_destroy(l);

    /* a GRU cell given a state of the wrong size */
    NBT_OK(ctx, nb_nn_gru_cell_init(ctx, 9, 4, true, NB_DTYPE_F32, key, &l));
    nb_array *h = normal(ctx, 6, NB_DTYPE_F32, 2, (int64_t[]){3, 5});
    expect_err(ctx, NB_ERR_SHAPE, try_run(ctx, l, 2, (nb_array *[]){x, h}, &out),
               "nb_nn_gru_cell: gru_cell layer 'args[0]' got x f32[3,9] and state h f32[3,5]; "
               "expected x [..., 9] (input_size) and the state [..., 4] (hidden_size)");
    /* the layer over a sequence: h0 must have xs's dims after T */
    expect_err(ctx, NB_ERR_SHAPE, try_run(ctx, l, 3, (nb_array *[]){x, h, NULL}, &out),
               "nb_nn_gru: gru_cell layer 'args[0]' got xs f32[3,9] and h0 f32[3,5]; expected "
               "xs [T, ..., input_size] (the sequence along axis 0) and h0 [..., hidden_size] "
               "with xs's dims after T as its leading (batch) dims");
    nb_array_destroy(h);
    nb_tree_destroy(l);
    nb_array_destroy(x2);
    nb_array_destroy(xb);
    nb_array_destroy(x);
    nb_array_destroy(key);
    nb_ctx_destroy(ctx);
}

/* ---- allocation failures over init and call ----------------------------------------- */

static nb_status scenario_layers(nb_ctx *ctx) {
    nb_array *key = NULL, *x = NULL, *h = NULL;
    nb_tree *ls[10] = {NULL}, *bst = NULL, *out = NULL, *args = NULL, *lx = NULL;
    nb_status st = nb_random_key(ctx, 3, &key);
    nb_nn_conv_opts co = nb_nn_conv_opts_default();
    co.padding_kind = NB_NN_PAD_SAME;
    co.stride[0] = 2;
    if (st == NB_OK) {
        st = nb_nn_conv_init(ctx, 2, 2, 4, (int64_t[]){3, 3}, &co, NB_DTYPE_F32, key, &ls[0]);
    }
    if (st == NB_OK) {
        st = nb_nn_conv_transpose_init(ctx, 2, 4, 2, (int64_t[]){2, 2}, &co, NB_DTYPE_F32, key,
                                       &ls[1]);
    }
    if (st == NB_OK) {
        st = nb_nn_max_pool_init(ctx, 2, (int64_t[]){2, 2}, NULL, &ls[2]);
    }
    if (st == NB_OK) {
        st = nb_nn_adaptive_avg_pool_init(ctx, 2, (int64_t[]){1, 1}, &ls[3]);
    }
    if (st == NB_OK) {
        st = nb_nn_group_norm_init(ctx, 2, 4, NULL, NB_DTYPE_F32, &ls[4]);
    }
    if (st == NB_OK) {
        st = nb_nn_rms_norm_init(ctx, 1, (int64_t[]){3}, 1e-5, true, true, NB_DTYPE_F32, &ls[5]);
    }
    if (st == NB_OK) {
        st = nb_nn_batch_norm_init(ctx, 2, NULL, NB_DTYPE_F32, &ls[6], &bst);
    }
    if (st == NB_OK) {
        st = nb_nn_multihead_attention_init(ctx, 2, 4, NULL, NB_DTYPE_F32, key, &ls[7]);
    }
    if (st == NB_OK) {
        st = nb_nn_gru_cell_init(ctx, 3, 4, true, NB_DTYPE_F32, key, &ls[8]);
    }
    if (st == NB_OK) {
        st = nb_nn_lstm_cell_init(ctx, 3, 4, true, NB_DTYPE_F32, key, &ls[9]);
    }
    /* calls: a convolution, a BatchNorm with its state, attention */
    if (st == NB_OK) {
        st = nb_random_normal(key, NB_DTYPE_F32, 4, (int64_t[]){2, 2, 5, 5}, &x);
    }
    if (st == NB_OK) {
        st = nb_tree_array(x, &lx);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){ls[0], lx}, &args);
    }
    if (st == NB_OK) {
        st = nb_eval(ctx, body_layer, NULL, args, &out);
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    out = args = NULL;
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 3, (nb_tree *[]){ls[6], lx, bst}, &args);
    }
    if (st == NB_OK) {
        st = nb_eval(ctx, body_layer, NULL, args, &out);
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    out = args = NULL;
    nb_tree *lh = NULL, *ln = NULL;
    if (st == NB_OK) {
        st = nb_random_normal(key, NB_DTYPE_F32, 2, (int64_t[]){3, 4}, &h);
    }
    if (st == NB_OK) {
        st = nb_tree_array(h, &lh);
    }
    if (st == NB_OK) {
        st = nb_tree_null(ctx, &ln);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 6, (nb_tree *[]){ls[7], lh, lh, lh, ln, ln}, &args);
    }
    if (st == NB_OK) {
        st = nb_eval(ctx, body_layer, NULL, args, &out);
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    out = args = NULL;
    /* a GRU layer over a sequence of 2 (its scan's step made inside the call) */
    nb_array *xs3 = NULL;
    nb_tree *lxs = NULL;
    if (st == NB_OK) {
        st = nb_random_normal(key, NB_DTYPE_F32, 3, (int64_t[]){2, 3, 3}, &xs3);
    }
    if (st == NB_OK) {
        st = nb_tree_array(xs3, &lxs);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 4, (nb_tree *[]){ls[8], lxs, lh, ln}, &args);
    }
    if (st == NB_OK) {
        st = nb_eval(ctx, body_layer, NULL, args, &out);
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nb_tree_destroy(lxs);
    nb_array_destroy(xs3);
    nb_tree_destroy(ln);
    nb_tree_destroy(lh);
    nb_tree_destroy(lx);
    nb_tree_destroy(bst);
    for (int i = 0; i < 10; i++) {
        nb_tree_destroy(ls[i]);
    }
    nb_array_destroy(h);
    nb_array_destroy(x);
    nb_array_destroy(key);
    return st;
}

static void test_out_of_memory(void **state) {
    (void)state;
    int points = nbt_oom_sweep("layers", scenario_layers, false, false);
    print_message("%d allocation-failure points over init and calls\n", points);
    NBT_TRUE(points > 50);
}

int main(void) {
    if (!oracle_load(&O)) {
        fprintf(stderr, "no %s/equinox_layers.txt\n", NBT_ORACLE_DIR);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_oracle),
        cmocka_unit_test(test_conv_transpose_oracle),
        cmocka_unit_test(test_pool_oracle),
        cmocka_unit_test(test_norm_oracle),
        cmocka_unit_test(test_batch_norm_oracle),
        cmocka_unit_test(test_attention_oracle),
        cmocka_unit_test(test_rnn_oracle),
        cmocka_unit_test(test_grads),
        cmocka_unit_test(test_attention_batched_mask),
        cmocka_unit_test(test_gru_scan),
        cmocka_unit_test(test_gru_layer),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_out_of_memory),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int i = 0; i < O.n; i++) {
        free(O.e[i].v);
    }
    return rc;
}
