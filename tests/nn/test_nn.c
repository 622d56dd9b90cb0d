/*
 * test_nn.c -- the nn layers (nabla/nn.h): initial values and forward outputs against
 * Equinox's own (oracle data in tests/nn/oracle/equinox_nn.txt, made by the script beside
 * it), shapes for batched inputs, gradients of a scalar loss through every layer against
 * central finite differences in f64, Conv2d against a direct convolution loop for many
 * stride/padding/dilation/group settings, Dropout's mask against nb_random_bernoulli,
 * Sequential's key splitting, the utilities, and the error messages.
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

static nb_array *key_of(nb_ctx *ctx, uint64_t seed) {
    nb_array *k = NULL;
    NBT_OK(ctx, nb_random_key(ctx, seed, &k));
    return k;
}

/* Row i of split(key, n), as an i32[2] array. */
static nb_array *key_row(nb_ctx *ctx, const nb_array *key, int64_t n, int64_t i) {
    nb_array *keys = NULL, *k = NULL;
    NBT_OK(ctx, nb_random_split(key, n, &keys));
    const int32_t *w = nb_array_data(keys);
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, w + 2 * i, &k));
    nb_array_destroy(keys);
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

/* args = (layer, x[, key]) -> nb_nn_apply(layer, x, key) */
static nb_status body_apply(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *key = nb_tree_len(args) > 2 ? nb_get(tr, args, "[2]") : NULL;
    return nb_return(nb_nn_apply(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]"), key), out);
}

static nb_tree *make_args(nb_ctx *ctx, const nb_tree *layer, nb_array *x, nb_array *key) {
    nb_tree *lx = leaf_of(x), *lk = key != NULL ? leaf_of(key) : NULL, *args = NULL;
    NBT_OK(ctx,
           nb_tree_tuple(ctx, key != NULL ? 3 : 2, (nb_tree *[]){(nb_tree *)layer, lx, lk}, &args));
    nb_tree_destroy(lk);
    nb_tree_destroy(lx);
    return args;
}

/* The status of applying layer to x (and key); *y gets the output (or NULL). */
static nb_status try_apply(nb_ctx *ctx, const nb_tree *layer, nb_array *x, nb_array *key,
                           nb_array **y) {
    nb_tree *args = make_args(ctx, layer, x, key), *out = NULL;
    *y = NULL;
    nb_status st = nb_eval(ctx, body_apply, NULL, args, &out);
    if (st == NB_OK) {
        *y = nb_array_retain(nb_tree_get_array(out));
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    return st;
}

static nb_array *apply(nb_ctx *ctx, const nb_tree *layer, nb_array *x, nb_array *key) {
    nb_array *y = NULL;
    NBT_OK(ctx, try_apply(ctx, layer, x, key, &y));
    return y;
}

static void expect_shape(const nb_array *a, int rank, const int64_t *shape) {
    char got[128];
    NBT_OK(nb_array_ctx(a), nb_array_format_sig(a, got, sizeof got, NULL));
    bool ok = nb_array_rank(a) == rank;
    for (int i = 0; ok && i < rank; i++) {
        ok = nb_array_dim(a, i) == shape[i];
    }
    if (!ok) {
        fail_msg("shape of the output is %s", got);
    }
}

static double max_abs_diff(const nb_array *a, const nb_array *b) {
    NBT_EQ_I64(nb_array_size(a), nb_array_size(b));
    double m = 0;
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        double x = 0, y = 0;
        nb_array_get_flat(a, i, &x);
        nb_array_get_flat(b, i, &y);
        m = nbt_max(m, fabs(x - y));
    }
    return m;
}

/* ---- init rules (Equinox's, through nabla's jax.random twins) ----------------------- */

static void test_init_rules(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = key_of(ctx, 42);
    bool same = false;
    /* Linear: weight with split(key)[0], bias with split(key)[1], lim 1/sqrt(in). */
    nb_tree *lin = NULL;
    NBT_OK(ctx, nb_nn_linear_init(ctx, 5, 3, true, NB_DTYPE_F32, key, &lin));
    nb_array *k0 = key_row(ctx, key, 2, 0), *k1 = key_row(ctx, key, 2, 1), *w = NULL, *b = NULL;
    double lim = 1.0 / sqrt(5.0);
    NBT_OK(ctx, nb_random_uniform(k0, NB_DTYPE_F32, 2, (int64_t[]){3, 5}, -lim, lim, &w));
    NBT_OK(ctx, nb_random_uniform(k1, NB_DTYPE_F32, 1, (int64_t[]){3}, -lim, lim, &b));
    NBT_OK(ctx, nb_array_identical(get_arr(lin, "weight"), w, &same));
    NBT_TRUE(same);
    NBT_OK(ctx, nb_array_identical(get_arr(lin, "bias"), b, &same));
    NBT_TRUE(same);
    nb_array_destroy(w);
    nb_array_destroy(b);
    nb_array_destroy(k0);
    nb_array_destroy(k1);
    /* The static part. */
    char buf[512];
    nb_treedef *def = NULL;
    NBT_OK(ctx, nb_tree_treedef(lin, &def));
    NBT_OK(ctx, nb_treedef_format(def, buf, sizeof buf, NULL));
    NBT_STREQ(buf, "dict(kind=string \"linear\", weight=*, bias=*, in_features=int 5, "
                   "out_features=int 3, use_bias=bool true)");
    nb_treedef_destroy(def);
    nb_tree_destroy(lin);
    /* Without bias: a null slot. */
    NBT_OK(ctx, nb_nn_linear_init(ctx, 5, 3, false, NB_DTYPE_F64, key, &lin));
    const nb_tree *bl = NULL;
    NBT_OK(ctx, nb_tree_lookup(lin, "bias", &bl));
    NBT_EQ_I64(nb_tree_kind_of(bl), NB_TREE_KIND_NULL);
    NBT_EQ_I64(nb_array_dtype(get_arr(lin, "weight")), NB_DTYPE_F64);
    nb_tree_destroy(lin);
    /* MLP: layer i is Linear(..., key = split(key, depth + 1)[i]). */
    nb_tree *mlp = NULL;
    NBT_OK(ctx, nb_nn_mlp_init(ctx, 4, 2, 8, 2, NULL, NB_DTYPE_F32, key, &mlp));
    int64_t sizes[3][2] = {{4, 8}, {8, 8}, {8, 2}};
    for (int i = 0; i < 3; i++) {
        nb_array *ki = key_row(ctx, key, 3, i);
        NBT_OK(ctx, nb_nn_linear_init(ctx, sizes[i][0], sizes[i][1], true, NB_DTYPE_F32, ki, &lin));
        char path[64];
        snprintf(path, sizeof path, "layers[%d].weight", i);
        NBT_OK(ctx, nb_array_identical(get_arr(mlp, path), get_arr(lin, "weight"), &same));
        NBT_TRUE(same);
        snprintf(path, sizeof path, "layers[%d].bias", i);
        NBT_OK(ctx, nb_array_identical(get_arr(mlp, path), get_arr(lin, "bias"), &same));
        NBT_TRUE(same);
        nb_tree_destroy(lin);
        nb_array_destroy(ki);
    }
    const nb_tree *act = NULL;
    nb_fnptr fp = NULL;
    const char *name = NULL;
    NBT_OK(ctx, nb_tree_lookup(mlp, "activation", &act));
    NBT_OK(ctx, nb_tree_get_fnref(act, &fp, &name));
    NBT_TRUE(fp == (nb_fnptr)nb_relu);
    NBT_STREQ(name, "relu");
    NBT_OK(ctx, nb_tree_lookup(mlp, "final_activation", &act));
    NBT_OK(ctx, nb_tree_get_fnref(act, &fp, &name));
    NBT_STREQ(name, "identity");
    int64_t count = 0;
    NBT_OK(ctx, nb_nn_count_params(mlp, &count));
    NBT_EQ_I64(count, 4 * 8 + 8 + 8 * 8 + 8 + 8 * 2 + 2);
    nb_tree_destroy(mlp);
    /* depth 0: one in -> out Linear with keys[0] of split(key, 1). */
    nb_nn_mlp_opts mo = nb_nn_mlp_opts_default();
    mo.use_final_bias = false;
    NBT_OK(ctx, nb_nn_mlp_init(ctx, 4, 2, 8, 0, &mo, NB_DTYPE_F32, key, &mlp));
    nb_array *kk = key_row(ctx, key, 1, 0);
    NBT_OK(ctx, nb_nn_linear_init(ctx, 4, 2, false, NB_DTYPE_F32, kk, &lin));
    NBT_OK(ctx,
           nb_array_identical(get_arr(mlp, "layers[0].weight"), get_arr(lin, "weight"), &same));
    NBT_TRUE(same);
    NBT_OK(ctx, nb_nn_count_params(mlp, &count));
    NBT_EQ_I64(count, 8);
    nb_tree_destroy(lin);
    nb_array_destroy(kk);
    nb_tree_destroy(mlp);
    /* Embedding: normal(key). LayerNorm: ones and zeros. */
    nb_tree *emb = NULL, *ln = NULL;
    NBT_OK(ctx, nb_nn_embedding_init(ctx, 10, 4, NB_DTYPE_F32, key, &emb));
    NBT_OK(ctx, nb_random_normal(key, NB_DTYPE_F32, 2, (int64_t[]){10, 4}, &w));
    NBT_OK(ctx, nb_array_identical(get_arr(emb, "weight"), w, &same));
    NBT_TRUE(same);
    nb_array_destroy(w);
    nb_tree_destroy(emb);
    NBT_OK(ctx,
           nb_nn_layer_norm_init(ctx, 2, (int64_t[]){3, 4}, 1e-5, true, true, NB_DTYPE_F64, &ln));
    double v = 0;
    NBT_OK(ctx, nb_array_get_flat(get_arr(ln, "weight"), 11, &v));
    NBT_EQ_F64(v, 1.0);
    NBT_OK(ctx, nb_array_get_flat(get_arr(ln, "bias"), 11, &v));
    NBT_EQ_F64(v, 0.0);
    nb_tree_destroy(ln);
    /* Conv2d: weight [out, in/groups, kh, kw] and bias [out, 1, 1] with split(key, 2),
     * lim = 1/sqrt(in/groups * kh * kw). */
    nb_nn_conv2d_opts co = nb_nn_conv2d_opts_default();
    co.groups = 2;
    nb_tree *conv = NULL;
    NBT_OK(ctx, nb_nn_conv2d_init(ctx, 4, 6, 3, 2, &co, NB_DTYPE_F32, key, &conv));
    k0 = key_row(ctx, key, 2, 0);
    k1 = key_row(ctx, key, 2, 1);
    lim = 1.0 / sqrt(2.0 * 3 * 2);
    NBT_OK(ctx, nb_random_uniform(k0, NB_DTYPE_F32, 4, (int64_t[]){6, 2, 3, 2}, -lim, lim, &w));
    NBT_OK(ctx, nb_random_uniform(k1, NB_DTYPE_F32, 3, (int64_t[]){6, 1, 1}, -lim, lim, &b));
    NBT_OK(ctx, nb_array_identical(get_arr(conv, "weight"), w, &same));
    NBT_TRUE(same);
    NBT_OK(ctx, nb_array_identical(get_arr(conv, "bias"), b, &same));
    NBT_TRUE(same);
    nb_array_destroy(w);
    nb_array_destroy(b);
    nb_array_destroy(k0);
    nb_array_destroy(k1);
    nb_tree_destroy(conv);
    nb_array_destroy(key);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- the Equinox oracle ------------------------------------------------------------- */

/* tests/nn/oracle/equinox_nn.txt: "<name> <dtype> <shape> <values...>" per line, shape dims
 * joined by 'x', '#' comments (see its header and gen_equinox_nn.py). */
#define ORACLE_MAX 64

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

static bool oracle_load(oracle *o) {
    memset(o, 0, sizeof *o);
    FILE *f = fopen(NBT_ORACLE_DIR "/equinox_nn.txt", "rb");
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
            fail_msg("equinox_nn.txt: bad line '%.60s'", ln);
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
                fail_msg("equinox_nn.txt: %s has fewer than %lld values", e->name, (long long)e->n);
            }
            p = q;
        }
    }
    free(text);
    return true;
}

static void oracle_free(oracle *o) {
    for (int i = 0; i < o->n; i++) {
        free(o->e[i].v);
    }
}

static const oentry *oget(const oracle *o, const char *name) {
    for (int i = 0; i < o->n; i++) {
        if (strcmp(o->e[i].name, name) == 0) {
            return &o->e[i];
        }
    }
    fail_msg("equinox_nn.txt has no '%s'", name);
    return NULL;
}

/* An f32 array of the entry's values (exact: %.9g round-trips f32). */
static nb_array *oarray(nb_ctx *ctx, const oentry *e) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, e->rank, e->shape, &a));
    float *d = nb_array_data(a);
    for (int64_t i = 0; i < e->n; i++) {
        d[i] = (float)e->v[i];
    }
    return a;
}

/* a must hold the oracle's values: bit for bit when ulps is 0, else within ulps units in
 * the last place of f32 of the largest |value| (outputs are sums of products: a small one
 * that comes from cancellation is only as accurate as the terms it came from); with
 * ulps < 0, within -ulps units in the last place of each value itself. */
static void expect_oracle(const nb_array *a, const oentry *e, double ulps) {
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
        double ref = ulps < 0 ? fabs(want) : scale; /* ulps < 0: of each value itself */
        double u = (got - want) / (ldexp(1.0, -23) * fmax(ref, 1e-30));
        worst = nbt_max(worst, fabs(u));
        if (ulps == 0 ? got != want : !(fabs(u) <= fabs(ulps))) {
            fail_msg("%s[%lld]: nabla %.9g, Equinox %.9g (%.2f ulp)", e->name, (long long)i, got,
                     want, u);
        }
    }
    print_message("%-22s %s (worst %.2f ulp)\n", e->name, ulps == 0 ? "bit-identical" : "matches",
                  worst);
}

static void relu_inplace(nb_array *a) {
    float *d = nb_array_data(a);
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        d[i] = d[i] > 0 ? d[i] : 0;
    }
}

static void expect_key_words(nb_ctx *ctx, const nb_array *key, int64_t n, int64_t i,
                             const oentry *e) {
    nb_array *k = key_row(ctx, key, n, i);
    const int32_t *w = nb_array_data(k);
    NBT_EQ_I64((uint32_t)w[0], (uint32_t)e->v[0]);
    NBT_EQ_I64((uint32_t)w[1], (uint32_t)e->v[1]);
    nb_array_destroy(k);
}

static void test_equinox_oracle(void **state) {
    (void)state;
    static oracle o;
    if (!oracle_load(&o)) {
        print_message("no %s/equinox_nn.txt: skipped\n", NBT_ORACLE_DIR);
        skip();
    }
    nb_ctx *ctx = nbt_ctx();
    nb_tree *layer = NULL;
    nb_array *x = NULL, *y = NULL, *key = NULL;

    /* Linear(3, 4, key=PRNGKey(0)), with and without bias */
    key = key_of(ctx, 0);
    expect_key_words(ctx, key, 2, 0, oget(&o, "linear_wkey"));
    expect_key_words(ctx, key, 2, 1, oget(&o, "linear_bkey"));
    NBT_OK(ctx, nb_nn_linear_init(ctx, 3, 4, true, NB_DTYPE_F32, key, &layer));
    expect_oracle(get_arr(layer, "weight"), oget(&o, "linear_weight"), 0);
    expect_oracle(get_arr(layer, "bias"), oget(&o, "linear_bias"), 0);
    x = oarray(ctx, oget(&o, "linear_x"));
    y = apply(ctx, layer, x, NULL);
    expect_oracle(y, oget(&o, "linear_y"), 4);
    nb_array_destroy(y);
    nb_tree_destroy(layer);
    NBT_OK(ctx, nb_nn_linear_init(ctx, 3, 4, false, NB_DTYPE_F32, key, &layer));
    expect_oracle(get_arr(layer, "weight"), oget(&o, "linear_nobias_weight"), 0);
    y = apply(ctx, layer, x, NULL);
    expect_oracle(y, oget(&o, "linear_nobias_y"), 4);
    nb_array_destroy(y);
    nb_array_destroy(x);
    nb_tree_destroy(layer);
    nb_array_destroy(key);

    /* MLP(2, 1, width 4, depth 2, key=PRNGKey(1)) and its hidden activations */
    key = key_of(ctx, 1);
    const oentry *mk = oget(&o, "mlp_keys");
    for (int i = 0; i < 3; i++) {
        nb_array *k = key_row(ctx, key, 3, i);
        const int32_t *w = nb_array_data(k);
        NBT_EQ_I64((uint32_t)w[0], (uint32_t)mk->v[2 * i]);
        NBT_EQ_I64((uint32_t)w[1], (uint32_t)mk->v[2 * i + 1]);
        nb_array_destroy(k);
    }
    NBT_OK(ctx, nb_nn_mlp_init(ctx, 2, 1, 4, 2, NULL, NB_DTYPE_F32, key, &layer));
    for (int i = 0; i < 3; i++) {
        char path[64], name[64];
        snprintf(path, sizeof path, "layers[%d].weight", i);
        snprintf(name, sizeof name, "mlp_layer%d_weight", i);
        expect_oracle(get_arr(layer, path), oget(&o, name), 0);
        snprintf(path, sizeof path, "layers[%d].bias", i);
        snprintf(name, sizeof name, "mlp_layer%d_bias", i);
        expect_oracle(get_arr(layer, path), oget(&o, name), 0);
    }
    x = oarray(ctx, oget(&o, "mlp_x"));
    const nb_tree *l0 = NULL;
    NBT_OK(ctx, nb_tree_lookup(layer, "layers[0]", &l0));
    nb_array *h = apply(ctx, l0, x, NULL);
    relu_inplace(h);
    expect_oracle(h, oget(&o, "mlp_h0"), 4);
    nb_array_destroy(h);
    y = apply(ctx, layer, x, NULL);
    expect_oracle(y, oget(&o, "mlp_y"), 8);
    nb_array_destroy(y);
    nb_array_destroy(x);
    /* the batch (Equinox: jax.vmap(mlp)(xb)), hidden layers included */
    x = oarray(ctx, oget(&o, "mlp_xb"));
    h = x;
    for (int i = 0; i < 2; i++) {
        char path[32], name[32];
        snprintf(path, sizeof path, "layers[%d]", i);
        const nb_tree *li = NULL;
        NBT_OK(ctx, nb_tree_lookup(layer, path, &li));
        nb_array *hn = apply(ctx, li, h, NULL);
        relu_inplace(hn);
        snprintf(name, sizeof name, "mlp_hb%d", i);
        expect_oracle(hn, oget(&o, name), 4);
        if (h != x) {
            nb_array_destroy(h);
        }
        h = hn;
    }
    nb_array_destroy(h);
    y = apply(ctx, layer, x, NULL);
    expect_oracle(y, oget(&o, "mlp_yb"), 8);
    nb_array_destroy(y);
    nb_array_destroy(x);
    nb_tree_destroy(layer);
    nb_array_destroy(key);

    /* Embedding(10, 3, key=PRNGKey(2)): normal draws to a few ULP */
    key = key_of(ctx, 2);
    NBT_OK(ctx, nb_nn_embedding_init(ctx, 10, 3, NB_DTYPE_F32, key, &layer));
    expect_oracle(get_arr(layer, "weight"), oget(&o, "embedding_weight"), -4);
    const oentry *ie = oget(&o, "embedding_idx");
    nb_array *idx = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, ie->rank, ie->shape, &idx));
    for (int64_t i = 0; i < ie->n; i++) {
        ((int32_t *)nb_array_data(idx))[i] = (int32_t)ie->v[i];
    }
    y = apply(ctx, layer, idx, NULL);
    expect_oracle(y, oget(&o, "embedding_y"), -4);
    nb_array_destroy(y);
    nb_array_destroy(idx);
    nb_tree_destroy(layer);
    nb_array_destroy(key);

    /* Conv2d: a = (2 -> 3, 3x3), b = (2 -> 4, 3x2, stride (2, 1), padding 1) */
    for (int c = 0; c < 2; c++) {
        const char *nm = c == 0 ? "conv_a" : "conv_b";
        nb_nn_conv2d_opts co = nb_nn_conv2d_opts_default();
        if (c == 1) {
            co.stride[0] = 2;
            co.padding[0][0] = co.padding[0][1] = co.padding[1][0] = co.padding[1][1] = 1;
        }
        key = key_of(ctx, 3 + (uint64_t)c);
        char name[64];
        snprintf(name, sizeof name, "%s_wkey", nm);
        expect_key_words(ctx, key, 2, 0, oget(&o, name));
        snprintf(name, sizeof name, "%s_bkey", nm);
        expect_key_words(ctx, key, 2, 1, oget(&o, name));
        NBT_OK(ctx, nb_nn_conv2d_init(ctx, 2, c == 0 ? 3 : 4, 3, c == 0 ? 3 : 2, &co, NB_DTYPE_F32,
                                      key, &layer));
        snprintf(name, sizeof name, "%s_weight", nm);
        expect_oracle(get_arr(layer, "weight"), oget(&o, name), 0);
        snprintf(name, sizeof name, "%s_bias", nm);
        expect_oracle(get_arr(layer, "bias"), oget(&o, name), 0);
        snprintf(name, sizeof name, "%s_x", nm);
        x = oarray(ctx, oget(&o, name));
        y = apply(ctx, layer, x, NULL);
        snprintf(name, sizeof name, "%s_y", nm);
        const oentry *ye = oget(&o, name);
        expect_shape(y, ye->rank, ye->shape);
        expect_oracle(y, ye, 8);
        nb_array_destroy(y);
        nb_array_destroy(x);
        nb_tree_destroy(layer);
        nb_array_destroy(key);
    }

    /* LayerNorm(5) */
    NBT_OK(ctx,
           nb_nn_layer_norm_init(ctx, 1, (int64_t[]){5}, 1e-5, true, true, NB_DTYPE_F32, &layer));
    expect_oracle(get_arr(layer, "weight"), oget(&o, "layernorm_weight"), 0);
    expect_oracle(get_arr(layer, "bias"), oget(&o, "layernorm_bias"), 0);
    x = oarray(ctx, oget(&o, "layernorm_x"));
    y = apply(ctx, layer, x, NULL);
    expect_oracle(y, oget(&o, "layernorm_y"), 8);
    nb_array_destroy(y);
    nb_array_destroy(x);
    nb_tree_destroy(layer);

    oracle_free(&o);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- shapes with batch dims --------------------------------------------------------- */

static void test_batched_shapes(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = key_of(ctx, 7);
    nb_tree *lin = NULL, *mlp = NULL, *ln = NULL, *emb = NULL, *conv = NULL;
    NBT_OK(ctx, nb_nn_linear_init(ctx, 3, 5, true, NB_DTYPE_F32, key, &lin));
    nb_nn_mlp_opts mo = nb_nn_mlp_opts_default();
    mo.activation = nb_tanh;
    NBT_OK(ctx, nb_nn_mlp_init(ctx, 3, 2, 6, 2, &mo, NB_DTYPE_F32, key, &mlp));
    NBT_OK(ctx,
           nb_nn_layer_norm_init(ctx, 2, (int64_t[]){4, 3}, 1e-5, true, true, NB_DTYPE_F32, &ln));
    NBT_OK(ctx, nb_nn_embedding_init(ctx, 10, 4, NB_DTYPE_F32, key, &emb));
    NBT_OK(ctx, nb_nn_conv2d_init(ctx, 2, 3, 3, 3, NULL, NB_DTYPE_F32, key, &conv));

    /* Linear on [3], [7,3], [2,4,3]; each row equals the unbatched result. */
    nb_array *x3 = normal(ctx, 1, NB_DTYPE_F32, 3, (int64_t[]){2, 4, 3});
    nb_array *y3 = apply(ctx, lin, x3, NULL);
    expect_shape(y3, 3, (int64_t[]){2, 4, 5});
    nb_array *row = NULL, *yr = NULL;
    const float *xd = nb_array_data(x3);
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, xd + 3 * 5, &row));
    yr = apply(ctx, lin, row, NULL);
    expect_shape(yr, 1, (int64_t[]){5});
    for (int j = 0; j < 5; j++) {
        double a = 0, b = 0;
        nb_array_get_flat(yr, j, &a);
        nb_array_get_flat(y3, 5 * 5 + j, &b);
        NBT_NEAR(a, b, 1e-6);
    }
    nb_array_destroy(yr);
    nb_array_destroy(row);
    nb_array_destroy(y3);
    nb_array *x2 = normal(ctx, 2, NB_DTYPE_F32, 2, (int64_t[]){7, 3});
    nb_array *y = apply(ctx, lin, x2, NULL);
    expect_shape(y, 2, (int64_t[]){7, 5});
    nb_array_destroy(y);
    /* MLP on [7,3] and [2,4,3] */
    y = apply(ctx, mlp, x2, NULL);
    expect_shape(y, 2, (int64_t[]){7, 2});
    nb_array_destroy(y);
    y = apply(ctx, mlp, x3, NULL);
    expect_shape(y, 3, (int64_t[]){2, 4, 2});
    nb_array_destroy(y);
    /* LayerNorm over the trailing [4,3] of [2,4,3]: each sample has mean 0, variance
     * 1/(1 + eps/var). */
    y = apply(ctx, ln, x3, NULL);
    expect_shape(y, 3, (int64_t[]){2, 4, 3});
    for (int s = 0; s < 2; s++) {
        double m = 0, m2 = 0;
        for (int i = 0; i < 12; i++) {
            double v = 0;
            nb_array_get_flat(y, s * 12 + i, &v);
            m += v / 12;
            m2 += v * v / 12;
        }
        NBT_NEAR(m, 0.0, 1e-6);
        NBT_NEAR(m2, 1.0, 1e-4);
    }
    nb_array_destroy(y);
    /* Embedding: indices [2,3] -> [2,3,4], rows of the weight. */
    nb_array *idx = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 2, (int64_t[]){2, 3},
                                   (int32_t[]){0, 9, 3, 3, 1, 0}, &idx));
    y = apply(ctx, emb, idx, NULL);
    expect_shape(y, 3, (int64_t[]){2, 3, 4});
    const float *wd = nb_array_data(get_arr(emb, "weight")), *yd = nb_array_data(y);
    int32_t ids[6] = {0, 9, 3, 3, 1, 0};
    for (int i = 0; i < 6; i++) {
        for (int j = 0; j < 4; j++) {
            NBT_EQ_F64(yd[i * 4 + j], wd[ids[i] * 4 + j]);
        }
    }
    nb_array_destroy(y);
    nb_array_destroy(idx);
    /* Conv2d on [2,8,9] and [5,2,8,9] */
    nb_array *img = normal(ctx, 3, NB_DTYPE_F32, 3, (int64_t[]){2, 8, 9});
    y = apply(ctx, conv, img, NULL);
    expect_shape(y, 3, (int64_t[]){3, 6, 7});
    nb_array_destroy(y);
    nb_array *imgs = normal(ctx, 4, NB_DTYPE_F32, 4, (int64_t[]){5, 2, 8, 9});
    y = apply(ctx, conv, imgs, NULL);
    expect_shape(y, 4, (int64_t[]){5, 3, 6, 7});
    nb_array_destroy(y);

    nb_array *arrs[] = {x3, x2, img, imgs, key};
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) {
        nb_array_destroy(arrs[i]);
    }
    nb_tree *trees[] = {lin, mlp, ln, emb, conv};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- gradients vs central finite differences (f64) ---------------------------------- */

/* args = ((layer, x), r): loss = sum(apply(layer, x) * r) */
static nb_status body_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *lx = nb_tree_child(args, 0);
    nb_var *y = nb_nn_apply(tr, nb_tree_child(lx, 0), nb_get(tr, lx, "[1]"), NULL);
    nb_var *r = nb_get(tr, args, "[1]");
    return nb_return(nb_sum(nb_mul(y, r), NULL, 0, false), out);
}

static double eval_loss(nb_fn *f, const nb_tree *args) {
    nb_tree *out = NULL;
    NBT_OK(nb_tree_ctx(args), nb_fn_call(f, args, &out));
    double v = 0;
    nb_array_get_flat(nb_tree_get_array(out), 0, &v);
    nb_tree_destroy(out);
    return v;
}

/* Check d loss / d (every float leaf of (layer, x)) against central differences. Returns
 * the number of elements checked. */
static int64_t check_grad(nb_ctx *ctx, const char *what, const nb_tree *layer, nb_array *x) {
    nb_array *y = apply(ctx, layer, x, NULL);
    nb_array *r = normal(ctx, 99, NB_DTYPE_F64, nb_array_rank(y), nb_array_shape(y));
    nb_array_destroy(y);
    nb_tree *lx = leaf_of(x), *pair = NULL, *lr = leaf_of(r), *args = NULL, *g = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){(nb_tree *)layer, lx}, &pair));
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){pair, lr}, &args));
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
        NBT_OK(ctx, nb_tree_lookup(g, path, &gl));
        nb_array *p = nb_tree_get_array(pl);
        if (nb_array_dtype(p) != NB_DTYPE_F64) {
            NBT_EQ_I64(nb_tree_kind_of(gl), NB_TREE_KIND_NULL); /* integer indices */
            continue;
        }
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
            if (!(fabs(an - fd) <= 1e-7 * fmax(1.0, fabs(fd)))) {
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
    nb_tree_destroy(pair);
    nb_tree_destroy(lr);
    nb_tree_destroy(lx);
    nb_array_destroy(r);
    print_message("%s: %lld gradient entries match finite differences\n", what, (long long)checked);
    return checked;
}

static void test_grads_vs_finite_differences(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = key_of(ctx, 3);
    nb_tree *layer = NULL;
    nb_array *x = NULL;

    NBT_OK(ctx, nb_nn_linear_init(ctx, 3, 4, true, NB_DTYPE_F64, key, &layer));
    x = normal(ctx, 11, NB_DTYPE_F64, 3, (int64_t[]){2, 2, 3});
    NBT_TRUE(check_grad(ctx, "linear", layer, x) == 12 + 4 + 12);
    nb_tree_destroy(layer);

    nb_nn_mlp_opts mo = nb_nn_mlp_opts_default();
    mo.activation = nb_tanh;
    mo.final_activation = nb_sigmoid;
    mo.use_bias = false;
    NBT_OK(ctx, nb_nn_mlp_init(ctx, 3, 2, 5, 2, &mo, NB_DTYPE_F64, key, &layer));
    nb_array_destroy(x);
    x = normal(ctx, 12, NB_DTYPE_F64, 2, (int64_t[]){4, 3});
    NBT_TRUE(check_grad(ctx, "mlp", layer, x) == 15 + 25 + 10 + 2 + 12);
    nb_tree_destroy(layer);

    /* LayerNorm with non-trivial weight and bias (perturbed from ones/zeros). */
    NBT_OK(ctx,
           nb_nn_layer_norm_init(ctx, 1, (int64_t[]){5}, 1e-5, true, true, NB_DTYPE_F64, &layer));
    double *wd = nb_array_data(get_arr(layer, "weight")),
           *bd = nb_array_data(get_arr(layer, "bias"));
    for (int i = 0; i < 5; i++) {
        wd[i] = 1.0 + 0.1 * i;
        bd[i] = 0.05 * i - 0.1;
    }
    nb_array_destroy(x);
    x = normal(ctx, 13, NB_DTYPE_F64, 2, (int64_t[]){3, 5});
    NBT_TRUE(check_grad(ctx, "layer_norm", layer, x) == 5 + 5 + 15);
    nb_tree_destroy(layer);

    /* Embedding: the weight gets a gradient, the integer indices null. */
    NBT_OK(ctx, nb_nn_embedding_init(ctx, 6, 3, NB_DTYPE_F64, key, &layer));
    nb_array_destroy(x);
    NBT_OK(ctx,
           nb_array_from_data(ctx, NB_DTYPE_I64, 1, (int64_t[]){4}, (int64_t[]){5, 0, 5, 2}, &x));
    NBT_TRUE(check_grad(ctx, "embedding", layer, x) == 18);
    nb_tree_destroy(layer);

    /* Conv2d with stride, asymmetric padding, dilation and groups. */
    nb_nn_conv2d_opts co = nb_nn_conv2d_opts_default();
    co.stride[0] = 2;
    co.padding[0][0] = 1;
    co.padding[1][1] = 2;
    co.dilation[1] = 2;
    co.groups = 2;
    NBT_OK(ctx, nb_nn_conv2d_init(ctx, 4, 2, 2, 3, &co, NB_DTYPE_F64, key, &layer));
    nb_array_destroy(x);
    x = normal(ctx, 14, NB_DTYPE_F64, 4, (int64_t[]){2, 4, 5, 4});
    NBT_TRUE(check_grad(ctx, "conv2d", layer, x) == 2 * 2 * 2 * 3 + 2 + 2 * 4 * 5 * 4);
    nb_tree_destroy(layer);

    nb_array_destroy(x);
    nb_array_destroy(key);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- Conv2d vs a direct loop -------------------------------------------------------- */

static void conv_naive(const nb_array *x, const nb_array *w, const nb_array *b, int64_t groups,
                       const int64_t stride[2], int64_t pad[2][2], const int64_t dil[2],
                       double *out, int64_t ho, int64_t wo) {
    const int64_t *xs = nb_array_shape(x), *ws = nb_array_shape(w);
    int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3];
    int64_t o = ws[0], cg = ws[1], kh = ws[2], kw = ws[3], og = o / groups;
    (void)c;
    const double *xd = nb_array_data(x), *wv = nb_array_data(w);
    const double *bv = b != NULL ? nb_array_data(b) : NULL;
    for (int64_t ni = 0; ni < n; ni++) {
        for (int64_t oi = 0; oi < o; oi++) {
            int64_t g = oi / og;
            for (int64_t yi = 0; yi < ho; yi++) {
                for (int64_t xi = 0; xi < wo; xi++) {
                    double s = bv != NULL ? bv[oi] : 0.0;
                    for (int64_t ci = 0; ci < cg; ci++) {
                        for (int64_t i = 0; i < kh; i++) {
                            for (int64_t j = 0; j < kw; j++) {
                                int64_t r = yi * stride[0] + i * dil[0] - pad[0][0];
                                int64_t q = xi * stride[1] + j * dil[1] - pad[1][0];
                                if (r < 0 || r >= h || q < 0 || q >= wd) {
                                    continue;
                                }
                                int64_t cin = g * cg + ci;
                                s += wv[((oi * cg + ci) * kh + i) * kw + j] *
                                     xd[((ni * xs[1] + cin) * h + r) * wd + q];
                            }
                        }
                    }
                    out[((ni * o + oi) * ho + yi) * wo + xi] = s;
                }
            }
        }
    }
}

static void test_conv2d_vs_direct(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    struct {
        int64_t n, c, h, w, o, kh, kw, stride[2], pad[2][2], dil[2], groups;
        bool bias, unbatched;
    } cases[] = {
        {1, 1, 5, 5, 1, 3, 3, {1, 1}, {{0, 0}, {0, 0}}, {1, 1}, 1, true, true},
        {2, 3, 7, 6, 4, 3, 3, {1, 1}, {{1, 1}, {1, 1}}, {1, 1}, 1, true, false},
        {2, 3, 9, 8, 2, 3, 2, {2, 3}, {{0, 0}, {0, 0}}, {1, 1}, 1, false, false},
        {1, 2, 8, 8, 3, 3, 3, {1, 1}, {{2, 2}, {2, 2}}, {2, 2}, 1, true, false},
        {3, 2, 6, 7, 2, 2, 3, {2, 1}, {{1, 0}, {0, 2}}, {1, 2}, 1, true, false},
        {2, 4, 6, 6, 6, 3, 3, {1, 2}, {{1, 1}, {0, 1}}, {1, 1}, 2, true, false},
        {1, 4, 5, 5, 4, 1, 1, {1, 1}, {{0, 0}, {0, 0}}, {1, 1}, 4, true, true},
        {2, 3, 4, 4, 5, 1, 1, {2, 2}, {{0, 1}, {1, 0}}, {1, 1}, 1, true, false},
        {1, 1, 3, 3, 1, 3, 3, {1, 1}, {{0, 0}, {0, 0}}, {1, 1}, 1, false, true}, /* 1x1 out */
        {2, 6, 9, 7, 3, 3, 2, {3, 2}, {{2, 1}, {1, 3}}, {2, 3}, 3, true, false},
    };
    nb_array *key = key_of(ctx, 5);
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        nb_nn_conv2d_opts co = nb_nn_conv2d_opts_default();
        memcpy(co.stride, cases[t].stride, sizeof co.stride);
        memcpy(co.padding, cases[t].pad, sizeof co.padding);
        memcpy(co.dilation, cases[t].dil, sizeof co.dilation);
        co.groups = cases[t].groups;
        co.use_bias = cases[t].bias;
        nb_tree *conv = NULL;
        NBT_OK(ctx, nb_nn_conv2d_init(ctx, cases[t].c, cases[t].o, cases[t].kh, cases[t].kw, &co,
                                      NB_DTYPE_F64, key, &conv));
        int64_t n = cases[t].n, c = cases[t].c, h = cases[t].h, w = cases[t].w;
        nb_array *x = normal(ctx, 100 + t, NB_DTYPE_F64, 4, (int64_t[]){n, c, h, w});
        int64_t ho =
            (h + co.padding[0][0] + co.padding[0][1] - co.dilation[0] * (cases[t].kh - 1) - 1) /
                co.stride[0] +
            1;
        int64_t wo =
            (w + co.padding[1][0] + co.padding[1][1] - co.dilation[1] * (cases[t].kw - 1) - 1) /
                co.stride[1] +
            1;
        nb_array *want = NULL;
        NBT_OK(ctx,
               nb_array_zeros(ctx, NB_DTYPE_F64, 4, (int64_t[]){n, cases[t].o, ho, wo}, &want));
        const nb_tree *bl = NULL;
        NBT_OK(ctx, nb_tree_lookup(conv, "bias", &bl));
        conv_naive(x, get_arr(conv, "weight"), nb_tree_get_array(bl), co.groups, co.stride,
                   co.padding, co.dilation, nb_array_data(want), ho, wo);
        nb_array *xin = x;
        if (cases[t].unbatched) {
            NBT_OK(ctx, nb_array_reshape(x, 3, (int64_t[]){c, h, w}, &xin));
        }
        nb_array *got = apply(ctx, conv, xin, NULL);
        if (cases[t].unbatched) {
            expect_shape(got, 3, (int64_t[]){cases[t].o, ho, wo});
            nb_array_destroy(xin);
        } else {
            expect_shape(got, 4, (int64_t[]){n, cases[t].o, ho, wo});
        }
        double e = max_abs_diff(got, want);
        if (!(e < 1e-12)) {
            fail_msg("conv case %zu: max |nabla - direct| = %g", t, e);
        }
        nb_array_destroy(got);
        nb_array_destroy(want);
        nb_array_destroy(x);
        nb_tree_destroy(conv);
    }
    nb_array_destroy(key);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- Dropout ------------------------------------------------------------------------ */

static void test_dropout(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *drop = NULL, *inf = NULL, *zero = NULL;
    NBT_OK(ctx, nb_nn_dropout_init(ctx, 0.3, false, &drop));
    NBT_OK(ctx, nb_nn_dropout_init(ctx, 0.0, false, &zero));
    NBT_OK(ctx, nb_nn_inference_mode(drop, true, &inf));
    bool flag = false;
    const nb_tree *fl = NULL;
    NBT_OK(ctx, nb_tree_lookup(inf, "inference", &fl));
    NBT_OK(ctx, nb_tree_get_bool(fl, &flag));
    NBT_TRUE(flag);
    nb_array *key = key_of(ctx, 2024), *key2 = key_of(ctx, 2025);
    int64_t n = 200000;
    nb_array *x = normal(ctx, 8, NB_DTYPE_F32, 2, (int64_t[]){400, 500});
    /* The zero pattern is nb_random_bernoulli(key, 1 - p) exactly; kept values are x / q. */
    nb_array *y = apply(ctx, drop, x, key), *mask = NULL;
    NBT_OK(ctx, nb_random_bernoulli(key, 1 - 0.3, 2, (int64_t[]){400, 500}, &mask));
    const float *xd = nb_array_data(x), *yd = nb_array_data(y);
    const bool *md = nb_array_data(mask);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
        float want = md[i] ? xd[i] / (float)(1 - 0.3) : 0.0f;
        if (!(yd[i] == want)) {
            fail_msg("dropout[%lld] = %.9g, want %.9g (mask %d)", (long long)i, yd[i], want, md[i]);
        }
        kept += md[i];
    }
    /* about 70% kept */
    NBT_NEAR((double)kept / n, 0.7, 5 * sqrt(0.21 / n));
    nb_array_destroy(y);
    nb_array_destroy(mask);
    /* The mean is preserved: on ones, E[y] = 1 with sd sqrt(p/q)/sqrt(n). */
    nb_array *ones = NULL;
    NBT_OK(ctx, nb_array_ones(ctx, NB_DTYPE_F32, 1, (int64_t[]){n}, &ones));
    y = apply(ctx, drop, ones, key2);
    double mean = 0;
    for (int64_t i = 0; i < n; i++) {
        mean += ((const float *)nb_array_data(y))[i];
    }
    mean /= (double)n;
    NBT_NEAR(mean, 1.0, 5 * sqrt(0.3 / 0.7 / n));
    nb_array_destroy(y);
    /* Another key, another mask. */
    nb_array *y1 = apply(ctx, drop, ones, key), *y2 = apply(ctx, drop, ones, key2);
    bool same = true;
    NBT_OK(ctx, nb_array_identical(y1, y2, &same));
    NBT_TRUE(!same);
    nb_array_destroy(y1);
    nb_array_destroy(y2);
    /* Inference mode and p = 0: the identity (no key needed). */
    y = apply(ctx, inf, x, NULL);
    NBT_OK(ctx, nb_array_identical(y, x, &same));
    NBT_TRUE(same);
    nb_array_destroy(y);
    y = apply(ctx, zero, x, key);
    NBT_OK(ctx, nb_array_identical(y, x, &same));
    NBT_TRUE(same);
    nb_array_destroy(y);
    /* Training mode without a key is an error naming the fix. */
    NBT_STATUS(ctx, NB_ERR_INVALID, try_apply(ctx, drop, x, NULL, &y));
    NBT_ERRMSG_HAS(ctx, "nb_nn_dropout: the dropout layer is in training mode (p = 0.3) "
                        "but no key was given");
    nb_array_destroy(ones);
    nb_array_destroy(x);
    nb_array_destroy(key);
    nb_array_destroy(key2);
    nb_tree_destroy(drop);
    nb_tree_destroy(inf);
    nb_tree_destroy(zero);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- Sequential --------------------------------------------------------------------- */

/* args = (l0, drop, l3, x, key2): the chain Sequential([l0, tanh, drop, l3]) should run,
 * with the dropout's key passed in (row 2 of split(key, 4), computed eagerly). */
static nb_status body_manual_chain(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                   nb_tree **out) {
    (void)self;
    nb_var *h = nb_nn_linear(tr, nb_tree_child(args, 0), nb_get(tr, args, "[3]"));
    h = nb_nn_dropout(tr, nb_tree_child(args, 1), nb_tanh(h), nb_get(tr, args, "[4]"));
    return nb_return(nb_nn_linear(tr, nb_tree_child(args, 2), h), out);
}

static void test_sequential(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = key_of(ctx, 77);
    nb_array *k0 = key_row(ctx, key, 2, 0), *k1 = key_row(ctx, key, 2, 1);
    nb_tree *l0 = NULL, *l3 = NULL, *act = NULL, *drop = NULL, *seq = NULL;
    NBT_OK(ctx, nb_nn_linear_init(ctx, 3, 16, true, NB_DTYPE_F32, k0, &l0));
    NBT_OK(ctx, nb_nn_linear_init(ctx, 16, 2, true, NB_DTYPE_F32, k1, &l3));
    NBT_OK(ctx, nb_nn_activation_leaf(ctx, nb_tanh, NULL, &act));
    NBT_OK(ctx, nb_nn_dropout_init(ctx, 0.5, false, &drop));
    NBT_OK(ctx, nb_nn_sequential_init(ctx, 4, (nb_tree *[]){l0, act, drop, l3}, &seq));
    int64_t count = 0;
    NBT_OK(ctx, nb_nn_count_params(seq, &count));
    NBT_EQ_I64(count, 3 * 16 + 16 + 16 * 2 + 2);
    nb_array *x = normal(ctx, 9, NB_DTYPE_F32, 2, (int64_t[]){5, 3});
    nb_array *dkey = key_of(ctx, 1234);
    nb_array *y = apply(ctx, seq, x, dkey);
    nb_array *k2 = key_row(ctx, dkey, 4, 2);
    nb_tree *lx = leaf_of(x), *lk = leaf_of(k2), *args = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 5, (nb_tree *[]){l0, drop, l3, lx, lk}, &args));
    NBT_OK(ctx, nb_eval(ctx, body_manual_chain, NULL, args, &out));
    bool same = false;
    NBT_OK(ctx, nb_array_identical(y, nb_tree_get_array(out), &same));
    NBT_TRUE(same);
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nb_array_destroy(y);
    /* In inference mode the dropout is the identity and no key is needed. */
    nb_tree *seqi = NULL;
    NBT_OK(ctx, nb_nn_inference_mode(seq, true, &seqi));
    y = apply(ctx, seqi, x, NULL);
    expect_shape(y, 2, (int64_t[]){5, 2});
    nb_tree *drop_inf = NULL, *seq2 = NULL;
    NBT_OK(ctx, nb_nn_dropout_init(ctx, 0.5, true, &drop_inf));
    NBT_OK(ctx, nb_nn_sequential_init(ctx, 4, (nb_tree *[]){l0, act, drop_inf, l3}, &seq2));
    bool equal = false;
    NBT_OK(ctx, nb_tree_equal(seqi, seq2, &equal));
    NBT_TRUE(equal);
    nb_array_destroy(y);
    /* An empty Sequential is the identity. */
    nb_tree *empty = NULL;
    NBT_OK(ctx, nb_nn_sequential_init(ctx, 0, NULL, &empty));
    y = apply(ctx, empty, x, NULL);
    NBT_OK(ctx, nb_array_identical(y, x, &same));
    NBT_TRUE(same);
    nb_array_destroy(y);
    nb_tree *trees[] = {l0, l3, act, drop, seq, lx, lk, seqi, drop_inf, seq2, empty};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_array *arrs[] = {key, k0, k1, x, dkey, k2};
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) {
        nb_array_destroy(arrs[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- errors ------------------------------------------------------------------------- */

static nb_status body_linear_on_mlp(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                    nb_tree **out) {
    (void)self;
    return nb_return(nb_nn_linear(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]")), out);
}

static void test_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = key_of(ctx, 1), *y = NULL;
    nb_tree *lin = NULL, *mlp = NULL, *t = NULL;
    NBT_OK(ctx, nb_nn_linear_init(ctx, 4, 5, true, NB_DTYPE_F32, key, &lin));
    /* wrong input shape */
    nb_array *x = normal(ctx, 1, NB_DTYPE_F32, 2, (int64_t[]){8, 3});
    NBT_STATUS(ctx, NB_ERR_SHAPE, try_apply(ctx, lin, x, NULL, &y));
    print_message("%s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "nb_nn_linear: the input 'args[1]' of linear layer 'args[0]' is "
                        "f32[8,3]; its last dim must be in_features 4");
    /* wrong dtype of the input */
    nb_array *x64 = normal(ctx, 1, NB_DTYPE_F64, 2, (int64_t[]){8, 4});
    NBT_STATUS(ctx, NB_ERR_DTYPE, try_apply(ctx, lin, x64, NULL, &y));
    print_message("%s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "'args[0].weight' is f32[5,4] but the input is f64[8,4]");
    /* wrong kind: an MLP given to nb_nn_linear */
    NBT_OK(ctx, nb_nn_mlp_init(ctx, 3, 2, 4, 1, NULL, NB_DTYPE_F32, key, &mlp));
    nb_tree *args = make_args(ctx, mlp, x, NULL), *out = NULL;
    NBT_STATUS(ctx, NB_ERR_KIND, nb_eval(ctx, body_linear_on_mlp, NULL, args, &out));
    print_message("%s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "nb_nn_linear: layer 'args[0]' is a 'mlp' layer, not 'linear' (apply "
                        "it with nb_nn_mlp");
    nb_tree_destroy(args);
    /* a layer of the MLP with a missing key (the weight dropped) */
    const nb_tree *l0 = NULL;
    NBT_OK(ctx, nb_tree_lookup(mlp, "layers[0]", &l0));
    nb_tree *kind = NULL, *bias = NULL, *nin = NULL, *nout = NULL, *bad = NULL;
    NBT_OK(ctx, nb_tree_string(ctx, "linear", &kind));
    NBT_OK(ctx, nb_tree_int(ctx, 3, &nin));
    NBT_OK(ctx, nb_tree_int(ctx, 4, &nout));
    bias = leaf_of(get_arr(l0, "bias"));
    NBT_OK(ctx,
           nb_tree_dict(ctx, 4, (const char *[]){"kind", "bias", "in_features", "out_features"},
                        (nb_tree *[]){kind, bias, nin, nout}, &bad));
    nb_array *x3 = normal(ctx, 2, NB_DTYPE_F32, 2, (int64_t[]){8, 3});
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, try_apply(ctx, bad, x3, NULL, &y));
    print_message("%s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "linear layer 'args[0]' has no 'weight' leaf");
    /* not a layer at all */
    NBT_STATUS(ctx, NB_ERR_KIND, try_apply(ctx, kind, x3, NULL, &y));
    print_message("%s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "nb_nn_apply: the tree is string \"linear\", not a layer");
    nb_tree *trees[] = {kind, bias, nin, nout, bad};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    /* a parameter of the wrong shape, inside the MLP: the message has the leaf path */
    nb_array *w_bad = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){4, 2}, &w_bad));
    nb_tree *lw = leaf_of(w_bad), *lb = leaf_of(get_arr(l0, "bias"));
    NBT_OK(ctx, nb_tree_string(ctx, "linear", &kind));
    NBT_OK(ctx, nb_tree_int(ctx, 3, &nin));
    NBT_OK(ctx, nb_tree_int(ctx, 4, &nout));
    NBT_OK(ctx,
           nb_tree_dict(ctx, 5,
                        (const char *[]){"kind", "weight", "bias", "in_features", "out_features"},
                        (nb_tree *[]){kind, lw, lb, nin, nout}, &bad));
    NBT_STATUS(ctx, NB_ERR_SHAPE, try_apply(ctx, bad, x3, NULL, &y));
    print_message("%s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "linear layer 'args[0]': 'args[0].weight' is f32[4,2]; the layer's static "
                        "sizes say it is [4,3]");
    nb_tree *trees2[] = {kind, lw, lb, nin, nout, bad};
    for (size_t i = 0; i < sizeof trees2 / sizeof trees2[0]; i++) {
        nb_tree_destroy(trees2[i]);
    }
    nb_array_destroy(w_bad);
    /* conv: input too small, wrong channels */
    nb_tree *conv = NULL;
    nb_nn_conv2d_opts co = nb_nn_conv2d_opts_default();
    co.dilation[0] = 3;
    NBT_OK(ctx, nb_nn_conv2d_init(ctx, 2, 3, 3, 3, &co, NB_DTYPE_F32, key, &conv));
    nb_array *img = normal(ctx, 3, NB_DTYPE_F32, 3, (int64_t[]){2, 6, 6});
    NBT_STATUS(ctx, NB_ERR_SHAPE, try_apply(ctx, conv, img, NULL, &y));
    print_message("%s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "nb_nn_conv: the input 'args[1]' of conv2d layer 'args[0]' is "
                        "f32[2,6,6]: along spatial dim 0 it is 6 after padding (0, 0), smaller "
                        "than the dilated kernel 7");
    nb_array *img3 = normal(ctx, 3, NB_DTYPE_F32, 4, (int64_t[]){1, 3, 9, 9});
    NBT_STATUS(ctx, NB_ERR_SHAPE, try_apply(ctx, conv, img3, NULL, &y));
    print_message("%s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "is f32[1,3,9,9]; expected [C, H, W] or [N, C, H, W] with C = "
                        "in_channels 2");
    /* embedding with float indices */
    nb_tree *emb = NULL;
    NBT_OK(ctx, nb_nn_embedding_init(ctx, 10, 4, NB_DTYPE_F32, key, &emb));
    NBT_STATUS(ctx, NB_ERR_DTYPE, try_apply(ctx, emb, x3, NULL, &y));
    print_message("%s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "nb_nn_embedding: the indices 'args[1]' of embedding layer 'args[0]' are "
                        "f32[8,3]; they must be i32 or i64");
    /* layer norm: trailing dims */
    nb_tree *ln = NULL;
    NBT_OK(ctx, nb_nn_layer_norm_init(ctx, 1, (int64_t[]){4}, 1e-5, true, true, NB_DTYPE_F32, &ln));
    NBT_STATUS(ctx, NB_ERR_SHAPE, try_apply(ctx, ln, x3, NULL, &y));
    print_message("%s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "layer_norm layer 'args[0]' is f32[8,3]; its trailing dims must be the "
                        "normalised shape [4]");

    /* init arguments */
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_nn_linear_init(ctx, 0, 5, true, NB_DTYPE_F32, key, &t));
    NBT_ERRMSG_HAS(ctx, "nb_nn_linear_init: in (in_features) is 0; it must be at least 1");
    NBT_TRUE(t == NULL);
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_nn_linear_init(ctx, 3, 5, true, NB_DTYPE_I32, key, &t));
    NBT_ERRMSG_HAS(ctx, "dtype i32; layer parameters are NB_DTYPE_F32 or NB_DTYPE_F64");
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_nn_linear_init(ctx, 3, 5, true, NB_DTYPE_F32, NULL, &t));
    NBT_ERRMSG_HAS(ctx, "key is a NULL or destroyed array");
    nb_array *badkey = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){3}, &badkey));
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_nn_linear_init(ctx, 3, 5, true, NB_DTYPE_F32, badkey, &t));
    nb_array_destroy(badkey);
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_nn_linear_init(NULL, 3, 5, true, NB_DTYPE_F32, key, &t));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_nn_linear_init(ctx, 3, 5, true, NB_DTYPE_F32, key, NULL));
    co = nb_nn_conv2d_opts_default();
    co.groups = 2;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_nn_conv2d_init(ctx, 3, 4, 3, 3, &co, NB_DTYPE_F32, key, &t));
    NBT_ERRMSG_HAS(ctx, "opts.groups 2 must divide both in_channels 3 and out_channels 4");
    co = nb_nn_conv2d_opts_default();
    co.stride[1] = 0;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_nn_conv2d_init(ctx, 3, 4, 3, 3, &co, NB_DTYPE_F32, key, &t));
    NBT_ERRMSG_HAS(ctx, "opts.stride[1] (width) is 0; it must be at least 1");
    co = nb_nn_conv2d_opts_default();
    co.padding[0][1] = -1;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_nn_conv2d_init(ctx, 3, 4, 3, 3, &co, NB_DTYPE_F32, key, &t));
    NBT_ERRMSG_HAS(ctx, "opts.padding[0][1] (height, after) is -1; it must be at least 0");
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_nn_dropout_init(ctx, 1.0, false, &t));
    NBT_ERRMSG_HAS(ctx, "nb_nn_dropout_init: p is 1; the probability of dropping an element is in "
                        "[0, 1)");
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_nn_mlp_init(ctx, 3, 2, 0, 2, NULL, NB_DTYPE_F32, key, &t));
    NBT_ERRMSG_HAS(ctx, "width (width_size, with depth > 0) is 0");
    NBT_STATUS(ctx, NB_ERR_INVALID,
               nb_nn_layer_norm_init(ctx, 0, NULL, 1e-5, true, true, NB_DTYPE_F32, &t));
    NBT_STATUS(ctx, NB_ERR_INVALID,
               nb_nn_layer_norm_init(ctx, 1, (int64_t[]){4}, -1.0, true, true, NB_DTYPE_F32, &t));
    NBT_ERRMSG_HAS(ctx, "eps is -1; it must be finite and >= 0");
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_nn_embedding_init(ctx, 10, 0, NB_DTYPE_F32, key, &t));
    int64_t count = 0;
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_nn_count_params(NULL, &count));

    nb_tree *ts[] = {lin, mlp, conv, emb, ln};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        nb_tree_destroy(ts[i]);
    }
    nb_array *as[] = {key, x, x64, x3, img, img3};
    for (size_t i = 0; i < sizeof as / sizeof as[0]; i++) {
        nb_array_destroy(as[i]);
    }
    (void)out;
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A key (or a layer) made in another context is refused up front, naming the initialiser,
 * the argument and the fix -- not by the tree builder deep inside ("a child from another
 * context"). */
static void test_init_other_context(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx(), *other = nbt_ctx();
    nb_array *key = key_of(other, 1);
    nb_tree *t = NULL;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_nn_linear_init(ctx, 3, 2, true, NB_DTYPE_F32, key, &t));
    print_message("%s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "nb_nn_linear_init: key belongs to another context than ctx (each "
                        "context's arrays and trees stay in it) -- make the key with "
                        "nb_random_key(ctx, ...) or copy it");
    NBT_TRUE(t == NULL);
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_nn_mlp_init(ctx, 3, 2, 4, 1, NULL, NB_DTYPE_F32, key, &t));
    NBT_ERRMSG_HAS(ctx, "nb_nn_mlp_init: key belongs to another context than ctx");
    NBT_TRUE(t == NULL);
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_nn_embedding_init(ctx, 10, 4, NB_DTYPE_F32, key, &t));
    NBT_ERRMSG_HAS(ctx, "nb_nn_embedding_init: key belongs to another context than ctx");
    NBT_TRUE(t == NULL);
    NBT_STATUS(ctx, NB_ERR_INVALID,
               nb_nn_conv2d_init(ctx, 2, 3, 3, 3, NULL, NB_DTYPE_F32, key, &t));
    NBT_ERRMSG_HAS(ctx, "nb_nn_conv2d_init: key belongs to another context than ctx");
    NBT_TRUE(t == NULL);
    /* a layer of another context given to sequential */
    nb_tree *lin = NULL;
    NBT_OK(other, nb_nn_linear_init(other, 3, 2, true, NB_DTYPE_F32, key, &lin));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_nn_sequential_init(ctx, 1, (nb_tree *[]){lin}, &t));
    print_message("%s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "nb_nn_sequential_init: layers[0] belongs to another context than ctx");
    NBT_TRUE(t == NULL);
    /* nothing was recorded on the key's context, and both still work */
    NBT_TRUE(nb_ctx_errcode(other) == NB_OK);
    nb_tree_destroy(lin);
    nb_array_destroy(key);
    nbt_assert_no_live(ctx);
    nbt_assert_no_live(other);
    nb_ctx_destroy(other);
    nb_ctx_destroy(ctx);
}

/* ---- a training step: grad + jit through the layers --------------------------------- */

/* args = (model, batch): model = {conv, norm, head}, batch = {x [N,1,6,6], y [N]}. */
static nb_status body_cnn_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    const nb_tree *m = nb_tree_child(args, 0);
    nb_var *x = nb_get(tr, args, "[1].x");
    nb_var *h = nb_relu(nb_nn_conv2d(tr, nb_tree_get(m, "conv"), x)); /* [N,4,4,4] */
    h = nb_reshape(h, 2, (int64_t[]){nb_var_dim(h, 0), -1});          /* [N,64] */
    h = nb_nn_layer_norm(tr, nb_tree_get(m, "norm"), h);
    nb_var *logits = nb_nn_mlp(tr, nb_tree_get(m, "head"), h);
    nb_var *y = nb_expand_dims(nb_get(tr, args, "[1].y"), -1);
    nb_var *ll = nb_take_along_axis(nb_log_softmax(logits, -1), y, -1);
    return nb_return(nb_neg(nb_mean(ll, NULL, 0, false)), out);
}

static void test_training_step_decreases_loss(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = key_of(ctx, 0);
    nb_array *k0 = key_row(ctx, key, 2, 0), *k1 = key_row(ctx, key, 2, 1);
    nb_tree *conv = NULL, *norm = NULL, *head = NULL, *model = NULL;
    NBT_OK(ctx, nb_nn_conv2d_init(ctx, 1, 4, 3, 3, NULL, NB_DTYPE_F32, k0, &conv));
    NBT_OK(ctx,
           nb_nn_layer_norm_init(ctx, 1, (int64_t[]){64}, 1e-5, true, true, NB_DTYPE_F32, &norm));
    NBT_OK(ctx, nb_nn_mlp_init(ctx, 64, 3, 16, 1, NULL, NB_DTYPE_F32, k1, &head));
    NBT_OK(ctx, nb_tree_dict(ctx, 3, (const char *[]){"conv", "norm", "head"},
                             (nb_tree *[]){conv, norm, head}, &model));
    nb_array *x = normal(ctx, 5, NB_DTYPE_F32, 4, (int64_t[]){12, 1, 6, 6}), *y = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 1, (int64_t[]){12},
                                   (int32_t[]){0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2}, &y));
    nb_tree *lx = leaf_of(x), *ly = leaf_of(y), *batch = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"x", "y"}, (nb_tree *[]){lx, ly}, &batch));
    nb_fn *f = NULL, *vg = NULL, *jvg = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "cnn_loss", body_cnn_loss, NULL, &f));
    NBT_OK(ctx, nb_value_and_grad(f, NULL, &vg));
    NBT_OK(ctx, nb_jit(vg, NULL, &jvg));
    double first = 0, last = 0;
    nb_tree *params = nb_tree_retain(model);
    for (int step = 0; step < 30; step++) {
        nb_tree *args = NULL, *out = NULL;
        NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){params, batch}, &args));
        NBT_OK(ctx, nb_fn_call(jvg, args, &out));
        double loss = 0;
        nb_array_get_flat(nb_tree_get_array(nb_tree_child(out, 0)), 0, &loss);
        if (step == 0) {
            first = loss;
        }
        last = loss;
        /* SGD in place: p -= 0.1 g at every float leaf with a gradient */
        const nb_tree *g = nb_tree_child(out, 1);
        for (int64_t i = 0; i < nb_tree_num_leaves(params); i++) {
            char path[128];
            const nb_tree *pl = NULL, *gl = NULL;
            NBT_OK(ctx, nb_tree_leaf_path(params, i, path, sizeof path, NULL));
            NBT_OK(ctx, nb_tree_lookup(params, path, &pl));
            NBT_OK(ctx, nb_tree_lookup(g, path, &gl));
            float *pd = nb_array_data(nb_tree_get_array(pl));
            const float *gd = nb_array_data(nb_tree_get_array(gl));
            for (int64_t j = 0; j < nb_array_size(nb_tree_get_array(pl)); j++) {
                pd[j] -= 0.1f * gd[j];
            }
        }
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    print_message("cnn loss %.4f -> %.4f after 30 SGD steps\n", first, last);
    NBT_TRUE(last < 0.5 * first);
    nb_fn_stats stats;
    NBT_OK(ctx, nb_fn_stats_get(jvg, &stats));
    NBT_EQ_I64(stats.n_traces, 1);
    nb_tree_destroy(params);
    nb_fn_destroy(jvg);
    nb_fn_destroy(vg);
    nb_fn_destroy(f);
    nb_tree *trees[] = {conv, norm, head, model, lx, ly, batch};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_array *arrs[] = {key, k0, k1, x, y};
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) {
        nb_array_destroy(arrs[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- out of memory: every allocation of the init functions failing in turn ----------- */

static nb_status scenario_init(nb_ctx *ctx) {
    nb_array *key = NULL;
    nb_tree *mlp = NULL, *conv = NULL, *ln = NULL, *emb = NULL, *drop = NULL, *act = NULL;
    nb_tree *seq = NULL, *inf = NULL;
    nb_status st = nb_random_key(ctx, 3, &key);
    if (st == NB_OK) {
        st = nb_nn_mlp_init(ctx, 3, 2, 4, 2, NULL, NB_DTYPE_F32, key, &mlp);
    }
    if (st == NB_OK) {
        nb_nn_conv2d_opts co = nb_nn_conv2d_opts_default();
        co.padding[0][0] = 1;
        st = nb_nn_conv2d_init(ctx, 2, 4, 3, 3, &co, NB_DTYPE_F64, key, &conv);
    }
    if (st == NB_OK) {
        st = nb_nn_layer_norm_init(ctx, 2, (int64_t[]){2, 3}, 1e-5, true, true, NB_DTYPE_F32, &ln);
    }
    if (st == NB_OK) {
        st = nb_nn_embedding_init(ctx, 5, 2, NB_DTYPE_F32, key, &emb);
    }
    if (st == NB_OK) {
        st = nb_nn_dropout_init(ctx, 0.1, false, &drop);
    }
    if (st == NB_OK) {
        st = nb_nn_activation_leaf(ctx, nb_gelu, NULL, &act);
    }
    if (st == NB_OK) {
        st = nb_nn_sequential_init(ctx, 6, (nb_tree *[]){mlp, conv, ln, emb, drop, act}, &seq);
    }
    if (st == NB_OK) {
        st = nb_nn_inference_mode(seq, true, &inf);
    }
    nb_tree *ts[] = {mlp, conv, ln, emb, drop, act, seq, inf};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        nb_tree_destroy(ts[i]);
    }
    nb_array_destroy(key);
    return st;
}

static void test_init_out_of_memory(void **state) {
    (void)state;
    int points = nbt_oom_sweep("scenario_init", scenario_init, false, false);
    NBT_TRUE(points > 10);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_rules),
        cmocka_unit_test(test_equinox_oracle),
        cmocka_unit_test(test_batched_shapes),
        cmocka_unit_test(test_grads_vs_finite_differences),
        cmocka_unit_test(test_conv2d_vs_direct),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_sequential),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_init_other_context),
        cmocka_unit_test(test_training_step_decreases_loss),
        cmocka_unit_test(test_init_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
