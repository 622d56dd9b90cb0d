/*
 * test_save_load.c -- what nb_save accepts, nb_load gives back, and nb_save writes where
 * the path leads (nabla/io.h):
 *   - static floats bit for bit: NaN payloads, signalling and negative NaNs, -0.0, inf,
 *     subnormals, DBL_MAX; a jitted function does not retrace on the loaded tree; files in
 *     the earlier text form (C's %a, "nan" for every NaN) still load;
 *   - nn models and checkpoints of them, whose activations are function references: the
 *     built-in activations come back by name; a function of the user's is NB_ERR_UNSUPPORTED
 *     naming it, its path and nb_load_into -- never "corrupt";
 *   - where the path leads: a symlink (relative, into another directory, a chain of two,
 *     dangling) has its target replaced and stays a link; a FIFO, a character device, a
 *     socket or a directory is refused with NB_ERR_IO and left as it was;
 *   - trees the loader would refuse are refused by nb_save with NB_ERR_INVALID (a key, a
 *     string or a function name that is not UTF-8, a tensor named __metadata__, two leaves
 *     under one name, BOOL bytes other than 0 and 1), and the old file at the path stays.
 */
#define _XOPEN_SOURCE 700

#include "nbtest.h"

#include <nabla/nabla.h>

#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- scratch directories and files --------------------------------------------------- */

static char g_dir[256];

static void make_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nbt_sl_XXXXXX");
    assert_non_null(mkdtemp(g_dir));
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void remove_dir(void) {
    nftw(g_dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* g_dir/name */
static const char *in_dir(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", g_dir, name);
    return buf;
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    assert_non_null(b);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    NBT_EQ_I64((int64_t)*n, len);
    return b;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    NBT_EQ_I64((int64_t)fwrite(data, 1, n, f), (int64_t)n);
    NBT_EQ_I64(fclose(f), 0);
}

/* Entries of dir other than . and .. (a temporary file left behind shows up here). */
static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    }
    closedir(d);
    return n;
}

/* A safetensors file's bytes: the 8-byte length, header, data. */
static size_t put_file(unsigned char *buf, const char *header, const void *data, size_t ndata) {
    size_t h = strlen(header);
    for (int i = 0; i < 8; i++) {
        buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
    }
    memcpy(buf + 8, header, h);
    if (ndata > 0) {
        memcpy(buf + 8 + h, data, ndata);
    }
    return 8 + h + ndata;
}

/* ---- trees --------------------------------------------------------------------------- */

static nb_tree *f32_leaf(nb_ctx *ctx, int64_t n, float base) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){n}, &a));
    for (int64_t i = 0; i < n; i++) {
        ((float *)nb_array_data(a))[i] = base + (float)i * 0.25f;
    }
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

/* A dict of n (key, item) pairs; the items are consumed. */
static nb_tree *dict_take(nb_ctx *ctx, int n, const char *const *keys, nb_tree **items) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, n, keys, items, &t));
    for (int i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    return t;
}

static void assert_same_tree(nb_ctx *ctx, const nb_tree *a, const nb_tree *b) {
    bool differ = true;
    char msg[512];
    NBT_OK(ctx, nb_tree_diff(a, b, NB_TREE_DIFF_VALUES, &differ, msg, sizeof msg, NULL));
    if (differ) {
        fail_msg("trees differ: %s", msg);
    }
    bool eq = false;
    NBT_OK(ctx, nb_tree_structure_equal(a, b, &eq));
    NBT_TRUE(eq);
    nb_treedef *da = NULL, *db = NULL;
    NBT_OK(ctx, nb_tree_treedef(a, &da));
    NBT_OK(ctx, nb_tree_treedef(b, &db));
    NBT_TRUE(nb_treedef_equal(da, db));
    NBT_TRUE(nb_treedef_hash(da) == nb_treedef_hash(db));
    nb_treedef_destroy(da);
    nb_treedef_destroy(db);
}

/* A tree saved at a fresh path loads back identical. */
static void assert_round_trip(nb_ctx *ctx, const nb_tree *t, const char *name) {
    char path[512];
    in_dir(path, sizeof path, name);
    NBT_OK(ctx, nb_save(t, path));
    nb_tree *back = NULL;
    NBT_OK(ctx, nb_load(ctx, path, &back));
    assert_same_tree(ctx, t, back);
    nb_tree_destroy(back);
}

/* ---- static floats, bit for bit ------------------------------------------------------ */

static double from_bits(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static uint64_t to_bits(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static const uint64_t k_float_bits[] = {
    0x7ff8000000000123u, /* a quiet NaN with a payload */
    0x7ff0000000000001u, /* a signalling NaN */
    0x7ff4000000abcdefu, /* a signalling NaN, another payload */
    0xfff8000000000000u, /* -NaN */
    0xfffc00000000beefu, /* -NaN with a payload */
    0x8000000000000000u, /* -0.0 */
    0x0000000000000000u, /* 0.0 */
    0x7ff0000000000000u, /* inf */
    0xfff0000000000000u, /* -inf */
    0x0000000000000001u, /* the smallest subnormal */
    0x800fffffffffffffu, /* the largest subnormal, negative */
    0x7fefffffffffffffu, /* DBL_MAX */
    0x3fb999999999999au, /* 0.1 */
};
enum { N_FLOATS = sizeof k_float_bits / sizeof k_float_bits[0] };

/* dict(x=f32[3], f=[the floats...], frozen=frozen sNaN) */
static nb_tree *float_tree(nb_ctx *ctx) {
    nb_tree *items[N_FLOATS];
    for (int i = 0; i < N_FLOATS; i++) {
        NBT_OK(ctx, nb_tree_float(ctx, from_bits(k_float_bits[i]), &items[i]));
    }
    nb_tree *list = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, N_FLOATS, items, &list));
    for (int i = 0; i < N_FLOATS; i++) {
        nb_tree_destroy(items[i]);
    }
    nb_tree *f = NULL, *frozen = NULL;
    NBT_OK(ctx, nb_tree_float(ctx, from_bits(0x7ff0000000000002u), &f));
    NBT_OK(ctx, nb_tree_freeze(f, &frozen));
    nb_tree_destroy(f);
    return dict_take(ctx, 3, (const char *[]){"x", "f", "frozen"},
                     (nb_tree *[]){f32_leaf(ctx, 3, 1.0f), list, frozen});
}

static nb_status twice_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "x");
    return nb_return(nb_add(x, x), out);
}

/* A jitted function called on a and then b traces once. */
static void assert_no_retrace(nb_ctx *ctx, nb_fn_body body, const nb_tree *a, const nb_tree *b) {
    nb_fn *f = NULL, *j = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "no_retrace", body, NULL, &f));
    NBT_OK(ctx, nb_jit(f, NULL, &j));
    nb_tree *o1 = NULL, *o2 = NULL;
    nb_fn_stats s1, s2;
    NBT_OK(ctx, nb_fn_call(j, a, &o1));
    NBT_OK(ctx, nb_fn_stats_get(j, &s1));
    NBT_OK(ctx, nb_fn_call(j, b, &o2));
    NBT_OK(ctx, nb_fn_stats_get(j, &s2));
    if (s2.n_traces != s1.n_traces) {
        char why[512] = "";
        nb_fn_retrace_reason(j, s2.n_retraces - 1, why, sizeof why, NULL);
        fail_msg("the jitted function traced again on the loaded tree: %s", why);
    }
    bool eq = false;
    NBT_OK(ctx, nb_tree_equal(o1, o2, &eq));
    NBT_TRUE(eq);
    nb_tree_destroy(o1);
    nb_tree_destroy(o2);
    nb_fn_destroy(j);
    nb_fn_destroy(f);
}

static void test_static_float_bits(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    make_dir();
    char path[512];
    in_dir(path, sizeof path, "floats.safetensors");
    nb_tree *t = float_tree(ctx), *back = NULL;
    NBT_OK(ctx, nb_save(t, path));
    NBT_OK(ctx, nb_load(ctx, path, &back));
    const nb_tree *list = nb_tree_get(back, "f");
    NBT_EQ_I64(nb_tree_len(list), N_FLOATS);
    int same = 0;
    for (int i = 0; i < N_FLOATS; i++) {
        double v = 0;
        NBT_OK(ctx, nb_tree_get_float(nb_tree_child(list, i), &v));
        if (to_bits(v) != k_float_bits[i]) {
            print_message("f[%d]: saved %016llx, loaded %016llx\n", i,
                          (unsigned long long)k_float_bits[i], (unsigned long long)to_bits(v));
        } else {
            same++;
        }
    }
    double fz = 0;
    NBT_OK(ctx, nb_tree_get_float(nb_tree_get(back, "frozen"), &fz));
    NBT_TRUE(nb_tree_is_frozen(nb_tree_get(back, "frozen")));
    print_message("static floats: %d of %d bit-identical after nb_save + nb_load; frozen sNaN "
                  "%016llx\n",
                  same, N_FLOATS, (unsigned long long)to_bits(fz));
    NBT_EQ_I64(same, N_FLOATS);
    NBT_TRUE(to_bits(fz) == 0x7ff0000000000002u);
    assert_same_tree(ctx, t, back);
    assert_no_retrace(ctx, twice_body, t, back);
    /* and from memory, and saved again: the same bytes (a deterministic writer) */
    size_t n1 = 0, n2 = 0;
    unsigned char *b1 = read_bytes(path, &n1);
    nb_tree *mem = NULL;
    NBT_OK(ctx, nb_load_bytes(ctx, b1, n1, "floats", &mem));
    assert_same_tree(ctx, t, mem);
    char path2[512];
    NBT_OK(ctx, nb_save(back, in_dir(path2, sizeof path2, "again.safetensors")));
    unsigned char *b2 = read_bytes(path2, &n2);
    NBT_TRUE(n1 == n2 && memcmp(b1, b2, n1) == 0);
    free(b1);
    free(b2);
    nb_tree_destroy(mem);
    nb_tree_destroy(back);
    nb_tree_destroy(t);
    remove_dir();
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Headers as the writer before bit patterns wrote them (C's %a, "nan" for every NaN, the
 * function references of an nb_nn_mlp as R<n>:<name>), verbatim: such files stay readable. */
static const char k_old_floats[] =
    "{\"__metadata__\":{\"format\":\"nabla\",\"nabla.tree\":\"L11(Fnan;Fnan;F-nan;F-0x0p+0;"
    "Finf;F-inf;F0x0.0000000000001p-1022;F0x1.fffffffffffffp+1023;F-0x1.999999999999ap-4;"
    "F0x0.fffffffffffffp-1022;A)\"},\"10\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":"
    "[0,8]}}   ";
static const char k_old_mlp[] =
    "{\"__metadata__\":{\"format\":\"nabla\",\"nabla.tree\":\"D10(4:kindS3:mlp6:layersL2(D6("
    "4:kindS6:linear6:weightA4:biasA11:in_featuresI2;12:out_featuresI3;8:use_biasB1)D6(4:kind"
    "S6:linear6:weightA4:biasA11:in_featuresI3;12:out_featuresI1;8:use_biasB1))10:activation"
    "R4:relu16:final_activationR8:identity7:in_sizeI2;8:out_sizeI1;10:width_sizeI3;5:depthI1;"
    "8:use_biasB114:use_final_biasB1)\"},\"layers.0.weight\":{\"dtype\":\"F32\",\"shape\":[3,2]"
    ",\"data_offsets\":[0,24]},\"layers.0.bias\":{\"dtype\":\"F32\",\"shape\":[3],\"data_"
    "offsets\":[24,36]},\"layers.1.weight\":{\"dtype\":\"F32\",\"shape\":[1,3],\"data_offsets\""
    ":[36,48]},\"layers.1.bias\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[48,52]}}  "
    "   ";

static void test_old_form(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    make_dir();
    unsigned char buf[2048], zeros[64] = {0};
    size_t n = put_file(buf, k_old_floats, zeros, 8);
    NBT_EQ_I64((8 + strlen(k_old_floats)) % 8, 0);
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_load_bytes(ctx, buf, n, "old floats", &t));
    NBT_EQ_I64(nb_tree_len(t), 11);
    double v[10];
    for (int i = 0; i < 10; i++) {
        NBT_OK(ctx, nb_tree_get_float(nb_tree_child(t, i), &v[i]));
    }
    NBT_TRUE(isnan(v[0]) && !signbit(v[0]) && isnan(v[1]) && isnan(v[2]) && signbit(v[2]));
    NBT_TRUE(to_bits(v[3]) == 0x8000000000000000u);
    NBT_TRUE(to_bits(v[4]) == 0x7ff0000000000000u && to_bits(v[5]) == 0xfff0000000000000u);
    NBT_TRUE(to_bits(v[6]) == 1 && v[7] == DBL_MAX && v[8] == -0.1);
    NBT_TRUE(to_bits(v[9]) == 0x000fffffffffffffu);
    /* saved again in today's form, it loads back identical */
    assert_round_trip(ctx, t, "old_again.safetensors");
    nb_tree_destroy(t);
    /* %a as a writer in another locale printed it (a comma), and forms %a never prints */
    n = put_file(buf,
                 "{\"__metadata__\":{\"nabla.tree\":\"L4(F0x1,8p+1;F0x1.8P+1;F-0x1p-1074;"
                 "F0x10p-4;)\"}}",
                 NULL, 0);
    NBT_OK(ctx, nb_load_bytes(ctx, buf, n, "old floats, comma", &t));
    for (int i = 0; i < 4; i++) {
        NBT_OK(ctx, nb_tree_get_float(nb_tree_child(t, i), &v[i]));
    }
    NBT_TRUE(v[0] == 3.0 && v[1] == 3.0 && to_bits(v[2]) == 0x8000000000000001u && v[3] == 1.0);
    nb_tree_destroy(t);
    static const char *const bad[] = {"F1.5;",
                                      "F0x;",
                                      "F0x1p;",
                                      "F0x1.8;",
                                      "Fnan",
                                      "F0x1p+1",
                                      "F0x11111111111111111p+0;",
                                      "X7ff8;",
                                      "X7ff800000000000g;",
                                      "K0:",
                                      "R0:"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char hdr[256];
        snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"nabla.tree\":\"L1(%s)\"}}", bad[i]);
        n = put_file(buf, hdr, NULL, 0);
        t = NULL;
        NBT_STATUS(ctx, NB_ERR_FORMAT, nb_load_bytes(ctx, buf, n, bad[i], &t));
        NBT_ERRMSG_HAS(ctx, bad[i][0] == 'K' || bad[i][0] == 'R' ? "a bad string" : "a bad float");
        assert_null(t);
    }
    /* a built-in name this version does not have (a newer writer's) */
    n = put_file(buf, "{\"__metadata__\":{\"nabla.tree\":\"D1(3:actK5:swish)\"}}", NULL, 0);
    NBT_STATUS(ctx, NB_ERR_UNSUPPORTED, nb_load_bytes(ctx, buf, n, "newer", &t));
    NBT_ERRMSG_HAS(ctx, "the built-in activation 'swish' at act");
    /* the old mlp: nb_load says what it cannot restore and how to load it instead ... */
    n = put_file(buf, k_old_mlp, zeros, 52);
    NBT_EQ_I64((8 + strlen(k_old_mlp)) % 8, 0);
    NBT_STATUS(ctx, NB_ERR_UNSUPPORTED, nb_load_bytes(ctx, buf, n, "old mlp", &t));
    NBT_ERRMSG_HAS(ctx, "holds a function reference 'relu' at activation");
    NBT_ERRMSG_HAS(ctx, "nb_load_into");
    NBT_TRUE(strstr(nb_ctx_errmsg(ctx), "corrupt") == NULL);
    assert_null(t);
    /* ... and nb_load_into with a model of that structure reads it */
    char path[512];
    write_bytes(in_dir(path, sizeof path, "old_mlp.safetensors"), buf, n);
    nb_array *key = NULL;
    nb_tree *mlp = NULL, *into = NULL;
    NBT_OK(ctx, nb_random_key(ctx, 1, &key));
    NBT_OK(ctx, nb_nn_mlp_init(ctx, 2, 1, 3, 1, NULL, NB_DTYPE_F32, key, &mlp));
    NBT_OK(ctx, nb_load_into(mlp, path, &into));
    NBT_EQ_F64(((const float *)nb_array_data(nb_tree_get_array(
                   nb_tree_get(nb_tree_child(nb_tree_get(into, "layers"), 0), "weight"))))[0],
               0.0);
    nb_tree_destroy(into);
    nb_tree_destroy(mlp);
    nb_array_destroy(key);
    remove_dir();
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- nn models: activations by name -------------------------------------------------- */

static nb_status apply_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[1]");
    return nb_return(nb_nn_apply(tr, nb_tree_child(args, 0), x, NULL), out);
}

static nb_var *my_act(nb_var *x) {
    return nb_mul(x, x);
}

/* Save model, nb_load it: the same tree, the same functions, and no retrace when a jitted
 * apply meets the loaded model after the original. */
static void assert_model_round_trip(nb_ctx *ctx, const nb_tree *model, int64_t in,
                                    const char *name) {
    char path[512];
    in_dir(path, sizeof path, name);
    NBT_OK(ctx, nb_save(model, path));
    nb_tree *back = NULL;
    NBT_OK(ctx, nb_load(ctx, path, &back));
    assert_same_tree(ctx, model, back);
    nb_tree *x = f32_leaf(ctx, in, -0.5f), *a1 = NULL, *a2 = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){(nb_tree *)model, x}, &a1));
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){back, x}, &a2));
    nb_fn *f = NULL, *j = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "apply", apply_body, NULL, &f));
    NBT_OK(ctx, nb_jit(f, NULL, &j));
    nb_tree *o1 = NULL, *o2 = NULL;
    nb_fn_stats s1, s2; /* (the counters belong to the body: earlier models count too) */
    NBT_OK(ctx, nb_fn_call(j, a1, &o1));
    NBT_OK(ctx, nb_fn_stats_get(j, &s1));
    NBT_OK(ctx, nb_fn_call(j, a2, &o2));
    NBT_OK(ctx, nb_fn_stats_get(j, &s2));
    if (s2.n_traces != s1.n_traces) {
        char why[512] = "";
        nb_fn_retrace_reason(j, s2.n_retraces - 1, why, sizeof why, NULL);
        fail_msg("the jitted apply traced again on the loaded model: %s", why);
    }
    bool eq = false;
    NBT_OK(ctx, nb_tree_equal(o1, o2, &eq));
    NBT_TRUE(eq);
    nb_tree_destroy(o1);
    nb_tree_destroy(o2);
    nb_fn_destroy(j);
    nb_fn_destroy(f);
    nb_tree_destroy(a1);
    nb_tree_destroy(a2);
    nb_tree_destroy(x);
    nb_tree_destroy(back);
}

static void test_nn_models(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    make_dir();
    nb_array *key = NULL;
    NBT_OK(ctx, nb_random_key(ctx, 3, &key));
    /* the default MLP: relu, identity */
    nb_tree *mlp = NULL;
    NBT_OK(ctx, nb_nn_mlp_init(ctx, 4, 2, 8, 2, NULL, NB_DTYPE_F32, key, &mlp));
    assert_model_round_trip(ctx, mlp, 4, "mlp.safetensors");
    /* tanh and sigmoid, f64 */
    nb_nn_mlp_opts o = nb_nn_mlp_opts_default();
    o.activation = nb_tanh;
    o.final_activation = nb_sigmoid;
    nb_tree *mlp2 = NULL;
    NBT_OK(ctx, nb_nn_mlp_init(ctx, 3, 1, 5, 1, &o, NB_DTYPE_F64, key, &mlp2));
    nb_tree *back = NULL;
    char path[512];
    NBT_OK(ctx, nb_save(mlp2, in_dir(path, sizeof path, "mlp2.safetensors")));
    NBT_OK(ctx, nb_load(ctx, path, &back));
    nb_fnptr fp = NULL;
    const char *fname = NULL;
    NBT_OK(ctx, nb_tree_get_fnref(nb_tree_get(back, "activation"), &fp, &fname));
    NBT_TRUE(fp == (nb_fnptr)nb_tanh);
    NBT_STREQ(fname, "tanh");
    NBT_OK(ctx, nb_tree_get_fnref(nb_tree_get(back, "final_activation"), &fp, &fname));
    NBT_TRUE(fp == (nb_fnptr)nb_sigmoid);
    nb_tree_destroy(back);
    /* a sequential of every layer kind with a float static, and every built-in activation */
    nb_tree *parts[9];
    NBT_OK(ctx, nb_nn_linear_init(ctx, 3, 4, true, NB_DTYPE_F32, key, &parts[0]));
    NBT_OK(ctx, nb_nn_activation_leaf(ctx, nb_gelu, NULL, &parts[1]));
    NBT_OK(ctx, nb_nn_layer_norm_init(ctx, 1, (int64_t[]){4}, 1e-5, true, true, NB_DTYPE_F32,
                                      &parts[2]));
    NBT_OK(ctx, nb_nn_activation_leaf(ctx, nb_softplus, NULL, &parts[3]));
    NBT_OK(ctx, nb_nn_dropout_init(ctx, 0.25, true, &parts[4]));
    NBT_OK(ctx, nb_nn_activation_leaf(ctx, nb_relu, NULL, &parts[5]));
    NBT_OK(ctx, nb_nn_activation_leaf(ctx, nb_nn_identity, NULL, &parts[6]));
    NBT_OK(ctx, nb_nn_activation_leaf(ctx, nb_tanh, NULL, &parts[7]));
    NBT_OK(ctx, nb_nn_activation_leaf(ctx, nb_sigmoid, NULL, &parts[8]));
    nb_tree *seq = NULL;
    NBT_OK(ctx, nb_nn_sequential_init(ctx, 9, parts, &seq));
    for (int i = 0; i < 9; i++) {
        nb_tree_destroy(parts[i]);
    }
    assert_model_round_trip(ctx, seq, 3, "seq.safetensors");
    /* a checkpoint of a model: nb_load reads it whole (and nb_checkpoint_load as before) */
    nb_tree *adam = NULL, *tmpl = NULL, *st = NULL, *ck = NULL;
    NBT_OK(ctx, nb_optim_adam(ctx, 1e-3, NULL, &adam));
    NBT_OK(ctx, nb_grad_template(mlp, NULL, &tmpl));
    NBT_OK(ctx, nb_optim_init(adam, tmpl, &st));
    NBT_OK(ctx, nb_checkpoint_save(in_dir(path, sizeof path, "ckpt.safetensors"), mlp, st, key, 7));
    NBT_OK(ctx, nb_load(ctx, path, &ck));
    assert_same_tree(ctx, mlp, nb_tree_get(ck, "params"));
    assert_same_tree(ctx, st, nb_tree_get(ck, "opt_state"));
    NBT_EQ_I64(*(const int64_t *)nb_array_data(nb_tree_get_array(nb_tree_get(ck, "step"))), 7);
    nb_tree_destroy(ck);
    nb_tree *p2 = NULL, *s2 = NULL;
    int64_t step = 0;
    NBT_OK(ctx, nb_checkpoint_load(path, mlp, st, &p2, &s2, NULL, &step));
    NBT_EQ_I64(step, 7);
    assert_same_tree(ctx, mlp, p2);
    nb_tree_destroy(p2);
    nb_tree_destroy(s2);
    nb_tree_destroy(st);
    nb_tree_destroy(tmpl);
    nb_tree_destroy(adam);
    nb_tree_destroy(seq);
    nb_tree_destroy(mlp2);
    nb_tree_destroy(mlp);
    nb_array_destroy(key);
    remove_dir();
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A function of the user's cannot come back from a file: a clear status and message. */
static void test_user_fnref(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    make_dir();
    nb_array *key = NULL;
    NBT_OK(ctx, nb_random_key(ctx, 5, &key));
    nb_nn_mlp_opts o = nb_nn_mlp_opts_default();
    o.activation = my_act;
    o.activation_name = "my_act";
    nb_tree *mlp = NULL, *lin = NULL, *seq = NULL;
    NBT_OK(ctx, nb_nn_mlp_init(ctx, 2, 2, 3, 1, &o, NB_DTYPE_F32, key, &mlp));
    NBT_OK(ctx, nb_nn_linear_init(ctx, 2, 2, false, NB_DTYPE_F32, key, &lin));
    NBT_OK(ctx, nb_nn_sequential_init(ctx, 2, (nb_tree *[]){mlp, lin}, &seq));
    char path[512];
    NBT_OK(ctx, nb_save(seq, in_dir(path, sizeof path, "user.safetensors")));
    nb_tree *back = NULL;
    NBT_STATUS(ctx, NB_ERR_UNSUPPORTED, nb_load(ctx, path, &back));
    print_message("nb_load of a model with the user's activation: %s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, "holds a function reference 'my_act' at layers[0].activation, which a "
                        "file cannot restore");
    NBT_ERRMSG_HAS(ctx, "load it with nb_load_into and a template that has it");
    NBT_TRUE(strstr(nb_ctx_errmsg(ctx), "corrupt") == NULL);
    assert_null(back);
    /* the template way works */
    NBT_OK(ctx, nb_load_into(seq, path, &back));
    assert_same_tree(ctx, seq, back);
    nb_tree_destroy(back);
    back = NULL;
    /* a built-in's name on another function, and a built-in under another name, are the
     * user's functions too: never resolved to the wrong one */
    nb_tree *fake = NULL, *renamed = NULL, *d = NULL;
    NBT_OK(ctx, nb_nn_activation_leaf(ctx, my_act, "relu", &fake));
    NBT_OK(ctx, nb_nn_activation_leaf(ctx, nb_tanh, "my_tanh", &renamed));
    d = dict_take(ctx, 2, (const char *[]){"fake", "renamed"}, (nb_tree *[]){fake, renamed});
    NBT_OK(ctx, nb_save(d, path));
    NBT_STATUS(ctx, NB_ERR_UNSUPPORTED, nb_load(ctx, path, &back));
    NBT_ERRMSG_HAS(ctx, "function reference 'relu' at fake");
    nb_tree_destroy(d);
    nb_tree_destroy(seq);
    nb_tree_destroy(lin);
    nb_tree_destroy(mlp);
    nb_array_destroy(key);
    remove_dir();
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- where the path leads ------------------------------------------------------------ */

/* Two different trees: v1 and v2. */
static nb_tree *version_tree(nb_ctx *ctx, int v) {
    nb_tree *x = f32_leaf(ctx, 2 + v, (float)v);
    return dict_take(ctx, 1, (const char *[]){"w"}, &x);
}

static void assert_holds(nb_ctx *ctx, const char *path, int v) {
    nb_tree *want = version_tree(ctx, v), *got = NULL;
    NBT_OK(ctx, nb_load(ctx, path, &got));
    assert_same_tree(ctx, want, got);
    nb_tree_destroy(got);
    nb_tree_destroy(want);
}

static void assert_is_link_to(const char *link, const char *target) {
    struct stat sb;
    NBT_EQ_I64(lstat(link, &sb), 0);
    NBT_TRUE(S_ISLNK(sb.st_mode));
    char got[512];
    ssize_t n = readlink(link, got, sizeof got - 1);
    NBT_TRUE(n > 0);
    got[n] = '\0';
    NBT_STREQ(got, target);
}

static void test_symlinks(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    make_dir();
    nb_tree *v1 = version_tree(ctx, 1), *v2 = version_tree(ctx, 2), *v3 = version_tree(ctx, 3);
    char p[512], link[512], sub[512], other[512];
    /* latest.safetensors -> v1.safetensors (relative, same directory) */
    NBT_OK(ctx, nb_save(v1, in_dir(p, sizeof p, "v1.safetensors")));
    NBT_EQ_I64(symlink("v1.safetensors", in_dir(link, sizeof link, "latest.safetensors")), 0);
    NBT_OK(ctx, nb_save(v2, link));
    assert_is_link_to(link, "v1.safetensors");
    assert_holds(ctx, p, 2);
    assert_holds(ctx, link, 2);
    NBT_EQ_I64(count_entries(g_dir), 2); /* no temporary file left */
    /* through nb_checkpoint_save too */
    nb_tree *st = NULL;
    NBT_OK(ctx, nb_tree_null(ctx, &st));
    NBT_OK(ctx, nb_checkpoint_save(link, v3, st, NULL, 3));
    assert_is_link_to(link, "v1.safetensors");
    int64_t step = 0;
    NBT_OK(ctx, nb_checkpoint_load(p, v3, st, NULL, NULL, NULL, &step));
    NBT_EQ_I64(step, 3);
    nb_tree_destroy(st);
    /* a relative link into another directory: a/link -> ../b/target.safetensors */
    NBT_EQ_I64(mkdir(in_dir(sub, sizeof sub, "a"), 0755), 0);
    NBT_EQ_I64(mkdir(in_dir(other, sizeof other, "b"), 0755), 0);
    NBT_OK(ctx, nb_save(v1, in_dir(p, sizeof p, "b/target.safetensors")));
    NBT_EQ_I64(symlink("../b/target.safetensors", in_dir(link, sizeof link, "a/link")), 0);
    NBT_OK(ctx, nb_save(v2, link));
    assert_is_link_to(link, "../b/target.safetensors");
    assert_holds(ctx, p, 2);
    NBT_EQ_I64(count_entries(sub), 1);
    NBT_EQ_I64(count_entries(other), 1);
    /* a chain: a/first -> second (in a) -> ../b/target.safetensors */
    char first[512];
    NBT_EQ_I64(symlink("link", in_dir(first, sizeof first, "a/first")), 0);
    NBT_OK(ctx, nb_save(v3, first));
    assert_is_link_to(first, "link");
    assert_is_link_to(link, "../b/target.safetensors");
    assert_holds(ctx, p, 3);
    NBT_EQ_I64(count_entries(sub), 2);
    NBT_EQ_I64(count_entries(other), 1);
    /* an absolute link */
    char abs_link[512];
    NBT_EQ_I64(symlink(p, in_dir(abs_link, sizeof abs_link, "abs")), 0);
    NBT_OK(ctx, nb_save(v1, abs_link));
    assert_is_link_to(abs_link, p);
    assert_holds(ctx, p, 1);
    /* a dangling link: the target is created, the link stays */
    char dangling[512], made[512];
    NBT_EQ_I64(symlink("b/new.safetensors", in_dir(dangling, sizeof dangling, "dangling")), 0);
    NBT_OK(ctx, nb_save(v2, dangling));
    assert_is_link_to(dangling, "b/new.safetensors");
    assert_holds(ctx, in_dir(made, sizeof made, "b/new.safetensors"), 2);
    /* a loop is NB_ERR_IO, naming the path */
    char loop1[512], loop2[512];
    NBT_EQ_I64(symlink("loop2", in_dir(loop1, sizeof loop1, "loop1")), 0);
    NBT_EQ_I64(symlink("loop1", in_dir(loop2, sizeof loop2, "loop2")), 0);
    NBT_STATUS(ctx, NB_ERR_IO, nb_save(v1, loop1));
    NBT_ERRMSG_HAS(ctx, loop1);
    assert_is_link_to(loop1, "loop2");
    nb_tree_destroy(v1);
    nb_tree_destroy(v2);
    nb_tree_destroy(v3);
    remove_dir();
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* nb_save to path fails with NB_ERR_IO naming the path and what it is; path is left as it
 * was: of the file type `type` (S_IFIFO, ...), the same inode. */
static void assert_refused(nb_ctx *ctx, const nb_tree *t, const char *path, const char *what,
                           mode_t type) {
    struct stat before, after;
    NBT_EQ_I64(lstat(path, &before), 0);
    NBT_STATUS(ctx, NB_ERR_IO, nb_save(t, path));
    print_message("refused: %s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, path);
    NBT_ERRMSG_HAS(ctx, what);
    NBT_EQ_I64(lstat(path, &after), 0);
    NBT_TRUE((after.st_mode & S_IFMT) == type);
    NBT_TRUE(after.st_ino == before.st_ino);
}

static void test_special_files(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    make_dir();
    nb_tree *t = version_tree(ctx, 1);
    char p[512], link[512];
    /* a FIFO (nb_save must not open it: that would block) */
    NBT_EQ_I64(mkfifo(in_dir(p, sizeof p, "fifo"), 0644), 0);
    assert_refused(ctx, t, p, "is a FIFO", S_IFIFO);
    /* the same through a symlink */
    NBT_EQ_I64(symlink("fifo", in_dir(link, sizeof link, "to_fifo")), 0);
    assert_refused(ctx, t, link, "is a FIFO", S_IFLNK);
    int entries = 2;
    /* a directory, and a symlink to one */
    NBT_EQ_I64(mkdir(in_dir(p, sizeof p, "dir.safetensors"), 0755), 0);
    assert_refused(ctx, t, p, "is a directory", S_IFDIR);
    NBT_EQ_I64(count_entries(p), 0);
    NBT_EQ_I64(symlink("dir.safetensors", in_dir(link, sizeof link, "to_dir")), 0);
    assert_refused(ctx, t, link, "is a directory", S_IFLNK);
    entries += 2;
    /* a socket */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    NBT_TRUE(fd >= 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    NBT_TRUE(strlen(g_dir) + 6 <= sizeof sa.sun_path);
    memcpy(sa.sun_path, g_dir, strlen(g_dir));
    memcpy(sa.sun_path + strlen(g_dir), "/sock", 6);
    NBT_EQ_I64(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_refused(ctx, t, sa.sun_path, "is a socket", S_IFSOCK);
    close(fd);
    entries += 1;
    /* a character device like /dev/null (made here with mknod, so that no real device is
     * at stake): as root, the old rename replaced it with a regular file */
    in_dir(p, sizeof p, "null");
    if (mknod(p, S_IFCHR | 0666, makedev(1, 3)) != 0) {
        print_message("skipped the character-device case: mknod: %s (needs root)\n",
                      strerror(errno));
    } else {
        assert_refused(ctx, t, p, "is a character device", S_IFCHR);
        NBT_EQ_I64(symlink("null", in_dir(link, sizeof link, "to_null")), 0);
        assert_refused(ctx, t, link, "is a character device", S_IFLNK);
        struct stat sb;
        NBT_EQ_I64(lstat(p, &sb), 0);
        NBT_TRUE(S_ISCHR(sb.st_mode) && sb.st_rdev == makedev(1, 3));
        entries += 2;
    }
    /* nothing else appeared in the directory: no temporary files */
    NBT_EQ_I64(count_entries(g_dir), entries);
    nb_tree_destroy(t);
    remove_dir();
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- nb_save refuses what nb_load would refuse --------------------------------------- */

/* nb_save(t) to a path holding an old file: NB_ERR_INVALID with the message parts, and the
 * old file's bytes unchanged, no temporary file left. */
static void assert_save_refused(nb_ctx *ctx, const nb_tree *t, const char *msg1, const char *msg2) {
    char path[512];
    in_dir(path, sizeof path, "old.safetensors");
    nb_tree *old = version_tree(ctx, 1);
    NBT_OK(ctx, nb_save(old, path));
    nb_tree_destroy(old);
    size_t n0 = 0, n1 = 0;
    unsigned char *b0 = read_bytes(path, &n0);
    nb_status st = nb_save(t, path);
    if (st == NB_OK) {
        nb_tree *back = NULL;
        nb_status lst = nb_load(nb_tree_ctx(t), path, &back);
        nb_tree_destroy(back);
        fail_msg("nb_save accepted a tree (expected '%s'); nb_load of what it wrote: %s %s", msg1,
                 nb_status_name(lst), lst == NB_OK ? "" : nb_ctx_errmsg(ctx));
    }
    NBT_STATUS(ctx, NB_ERR_INVALID, st);
    print_message("refused: %s\n", nb_ctx_errmsg(ctx));
    NBT_ERRMSG_HAS(ctx, msg1);
    if (msg2 != NULL) {
        NBT_ERRMSG_HAS(ctx, msg2);
    }
    unsigned char *b1 = read_bytes(path, &n1);
    NBT_TRUE(n0 == n1 && memcmp(b0, b1, n0) == 0);
    NBT_EQ_I64(count_entries(g_dir), 1);
    free(b0);
    free(b1);
}

static void test_save_refuses(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    make_dir();
    /* a key that is not UTF-8, at the top and deeper, holding an array or only a null */
    nb_tree *x = f32_leaf(ctx, 2, 0.0f), *n = NULL, *t = NULL;
    t = dict_take(ctx, 1, (const char *[]){"\xff\xfe"}, (nb_tree *[]){nb_tree_retain(x)});
    assert_save_refused(ctx, t, "not valid UTF-8", "\\xff\\xfe");
    nb_tree_destroy(t);
    NBT_OK(ctx, nb_tree_null(ctx, &n));
    nb_tree *inner = dict_take(ctx, 1, (const char *[]){"caf\xe9"}, &n);
    nb_tree *lst = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, 1, &inner, &lst));
    nb_tree_destroy(inner);
    t = dict_take(ctx, 1, (const char *[]){"layers"}, &lst);
    assert_save_refused(ctx, t, "layers[0]", "not valid UTF-8");
    nb_tree_destroy(t);
    /* a string leaf and a function name that are not UTF-8 */
    nb_tree *s = NULL;
    NBT_OK(ctx, nb_tree_string(ctx, "ok \xc3\x28", &s));
    t = dict_take(ctx, 1, (const char *[]){"name"}, &s);
    assert_save_refused(ctx, t, "the string at name", "not valid UTF-8");
    nb_tree_destroy(t);
    nb_tree *fr = NULL;
    NBT_OK(ctx, nb_nn_activation_leaf(ctx, my_act, "act\xed\xa0\x80", &fr)); /* a surrogate */
    t = dict_take(ctx, 1, (const char *[]){"act"}, &fr);
    assert_save_refused(ctx, t, "act", "not valid UTF-8");
    nb_tree_destroy(t);
    /* a top-level "__metadata__" holding an array: the header's reserved name */
    t = dict_take(ctx, 1, (const char *[]){"__metadata__"}, (nb_tree *[]){nb_tree_retain(x)});
    assert_save_refused(ctx, t, "__metadata__", "rename the key");
    nb_tree_destroy(t);
    /* two leaves under one tensor name: a.b twice */
    nb_tree *ab = dict_take(ctx, 1, (const char *[]){"b"}, (nb_tree *[]){nb_tree_retain(x)});
    t = dict_take(ctx, 2, (const char *[]){"a", "a.b"}, (nb_tree *[]){ab, nb_tree_retain(x)});
    assert_save_refused(ctx, t, "'a.b'", "rename the key");
    nb_tree_destroy(t);
    /* a BOOL array holding a byte other than 0 and 1 */
    nb_array *b = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_BOOL, 1, (int64_t[]){4}, &b));
    ((unsigned char *)nb_array_data(b))[2] = 7;
    nb_tree *bl = NULL;
    NBT_OK(ctx, nb_tree_array(b, &bl));
    nb_array_destroy(b);
    t = dict_take(ctx, 1, (const char *[]){"mask"}, &bl);
    assert_save_refused(ctx, t, "mask", "element 2");
    nb_tree_destroy(t);
    nb_tree_destroy(x);
    /* what the loader accepts is still saved: the same names nested, an empty key, a root
     * array, valid UTF-8 everywhere, "__metadata__" deeper or holding a node */
    x = f32_leaf(ctx, 2, 1.0f);
    t = dict_take(ctx, 1, (const char *[]){"__metadata__"}, (nb_tree *[]){nb_tree_retain(x)});
    nb_tree *deeper =
        dict_take(ctx, 4, (const char *[]){"__metadata__", "", "caf\xc3\xa9 \xf0\x9f\x98\x80", "t"},
                  (nb_tree *[]){t, nb_tree_retain(x), nb_tree_retain(x), f32_leaf(ctx, 1, 2.0f)});
    assert_round_trip(ctx, deeper, "deeper.safetensors");
    nb_tree_destroy(deeper);
    assert_round_trip(ctx, x, "root.safetensors");
    nb_tree_destroy(x);
    remove_dir();
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A header past NB_SAFETENSORS_MAX_HEADER, which every reader refuses: a string leaf of
 * about 10^8 bytes (the encoding alone past the limit, and the encoding within it but the
 * header with the names and JSON around it past it). Takes ~0.5 GB for a moment. */
static void test_header_limit(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    make_dir();
    size_t lens[2] = {(size_t)NB_SAFETENSORS_MAX_HEADER + 1,
                      (size_t)NB_SAFETENSORS_MAX_HEADER - 64};
    for (int k = 0; k < 2; k++) {
        char *big = malloc(lens[k] + 1);
        assert_non_null(big);
        memset(big, 'a', lens[k]);
        big[lens[k]] = '\0';
        nb_tree *s = NULL;
        NBT_OK(ctx, nb_tree_string(ctx, big, &s));
        free(big);
        nb_tree *t = dict_take(ctx, 2, (const char *[]){"w", "text"},
                               (nb_tree *[]){f32_leaf(ctx, 2, 0.0f), s});
        assert_save_refused(ctx, t, "more than the 100000000 a reader accepts", NULL);
        nb_tree_destroy(t);
    }
    remove_dir();
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- allocation failures ------------------------------------------------------------- */

/* A tree with a NaN, a built-in activation and a frozen leaf, saved through a chain of two
 * symlinks and loaded back by nb_load; a refused save (a key not UTF-8) on the way. */
static nb_status scenario_links(nb_ctx *ctx) {
    char link[512], bad_path[512];
    in_dir(link, sizeof link, "first");
    in_dir(bad_path, sizeof bad_path, "bad.safetensors");
    nb_array *a = NULL;
    nb_tree *l[3] = {NULL, NULL, NULL}, *fz = NULL, *t = NULL, *back = NULL, *bad = NULL;
    nb_status st = nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, &a);
    if (st == NB_OK) {
        st = nb_tree_array(a, &l[0]);
    }
    if (st == NB_OK) {
        st = nb_tree_float(ctx, from_bits(0x7ff0000000000001u), &fz);
    }
    if (st == NB_OK) {
        st = nb_tree_freeze(fz, &l[1]);
    }
    if (st == NB_OK) {
        st = nb_tree_fnref(ctx, (nb_fnptr)nb_tanh, "tanh", &l[2]);
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 3, (const char *[]){"w", "eps", "act"}, l, &t);
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 1, (const char *[]){"\xff"}, l, &bad);
    }
    if (st == NB_OK) {
        st = nb_save(bad, bad_path);
        st = st == NB_ERR_INVALID ? NB_OK : st == NB_OK ? NB_ERR_INTERNAL : st;
    }
    if (st == NB_OK) {
        st = nb_save(t, link);
    }
    if (st == NB_OK) {
        st = nb_load(ctx, link, &back);
    }
    if (st == NB_OK) {
        bool eq = false;
        st = nb_tree_equal(t, back, &eq);
        st = st == NB_OK && !eq ? NB_ERR_INTERNAL : st;
    }
    nb_tree_destroy(back);
    nb_tree_destroy(bad);
    nb_tree_destroy(t);
    for (int i = 0; i < 3; i++) {
        nb_tree_destroy(l[i]);
    }
    nb_tree_destroy(fz);
    nb_array_destroy(a);
    return st;
}

static void test_out_of_memory(void **state) {
    (void)state;
    make_dir();
    char p[512];
    NBT_EQ_I64(symlink("second", in_dir(p, sizeof p, "first")), 0);
    NBT_EQ_I64(symlink("target.safetensors", in_dir(p, sizeof p, "second")), 0);
    int points = nbt_oom_sweep("scenario_links", scenario_links, false, true);
    print_message("allocation failures: %d points\n", points);
    assert_true(points > 20);
    struct stat sb;
    NBT_EQ_I64(lstat(in_dir(p, sizeof p, "first"), &sb), 0);
    NBT_TRUE(S_ISLNK(sb.st_mode));
    NBT_EQ_I64(count_entries(g_dir), 3); /* first, second, target: no temporary files */
    remove_dir();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_static_float_bits), cmocka_unit_test(test_old_form),
        cmocka_unit_test(test_nn_models),         cmocka_unit_test(test_user_fnref),
        cmocka_unit_test(test_symlinks),          cmocka_unit_test(test_special_files),
        cmocka_unit_test(test_save_refuses),      cmocka_unit_test(test_header_limit),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
