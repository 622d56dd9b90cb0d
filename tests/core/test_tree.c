/*
 * test_tree.c -- nabla/tree.h: building, accessors, paths, lookup, flatten/unflatten,
 * treedefs, map/map_n, filter/partition/combine, equality, diff and printing.
 */
#include "nbtest.h"

#include <stdlib.h>

/* ---- helpers ------------------------------------------------------------------------ */

/* Two distinct functions for function-reference leaves. */
static double fn_relu(double x) {
    return x > 0 ? x : 0;
}
static double fn_tanh(double x) {
    return tanh(x);
}
#define FN_RELU ((nb_fnptr)fn_relu)
#define FN_TANH ((nb_fnptr)fn_tanh)

static nb_tree *const k_sentinel_tree = (nb_tree *)(uintptr_t)0x10;

static void *typed_buf(nb_dtype dt, int64_t n, const double *vals) {
    size_t es = nb_dtype_size(dt);
    void *p = calloc((size_t)(n > 0 ? n : 1), es ? es : 1);
    assert_non_null(p);
    for (int64_t i = 0; vals != NULL && i < n; i++) {
        switch (dt) {
        case NB_DTYPE_F32:
            ((float *)p)[i] = (float)vals[i];
            break;
        case NB_DTYPE_F64:
            ((double *)p)[i] = vals[i];
            break;
        case NB_DTYPE_I32:
            ((int32_t *)p)[i] = (int32_t)vals[i];
            break;
        case NB_DTYPE_I64:
            ((int64_t *)p)[i] = (int64_t)vals[i];
            break;
        case NB_DTYPE_BOOL:
            ((uint8_t *)p)[i] = vals[i] != 0.0;
            break;
        }
    }
    return p;
}

/* A new array of dt/shape from doubles (vals NULL: zeros). */
static nb_array *mkarr(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape,
                       const double *vals) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        n *= shape[i];
    }
    void *buf = typed_buf(dt, n, vals);
    nb_array *a = NULL;
    nb_status s = nb_array_from_data(ctx, dt, rank, shape, buf, &a);
    free(buf);
    NBT_OK(ctx, s);
    return a;
}

/* An array leaf; *keep (if not NULL) receives the array, borrowed from the leaf. */
static nb_tree *aleaf(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape, const double *vals,
                      nb_array **keep) {
    nb_array *a = mkarr(ctx, dt, rank, shape, vals);
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a); /* the leaf keeps its own reference */
    if (keep != NULL) {
        *keep = nb_tree_get_array(t);
        assert_ptr_equal(*keep, a);
    }
    return t;
}

static nb_tree *tnull(nb_ctx *ctx) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_null(ctx, &t));
    return t;
}
static nb_tree *tint(nb_ctx *ctx, int64_t v) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_int(ctx, v, &t));
    return t;
}
static nb_tree *tfloat(nb_ctx *ctx, double v) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_float(ctx, v, &t));
    return t;
}
static nb_tree *tbool(nb_ctx *ctx, bool v) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, v, &t));
    return t;
}
static nb_tree *tstr(nb_ctx *ctx, const char *v) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_string(ctx, v, &t));
    return t;
}
static nb_tree *tfn(nb_ctx *ctx, nb_fnptr fn, const char *name) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_fnref(ctx, fn, name, &t));
    return t;
}

/* Node builders that consume the caller's references to the items. */
static nb_tree *olist(nb_ctx *ctx, int64_t n, nb_tree *const *items) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, n, items, &t));
    for (int64_t i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    return t;
}
static nb_tree *otuple(nb_ctx *ctx, int64_t n, nb_tree *const *items) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, n, items, &t));
    for (int64_t i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    return t;
}
static nb_tree *odict(nb_ctx *ctx, int64_t n, const char *const *keys, nb_tree *const *items) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, n, keys, items, &t));
    for (int64_t i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    return t;
}
/* A one-entry dict. */
static nb_tree *odict1(nb_ctx *ctx, const char *key, nb_tree *item) {
    return odict(ctx, 1, (const char *[]){key}, (nb_tree *[]){item});
}

/* The node at path, which must exist. */
static const nb_tree *at(nb_ctx *ctx, const nb_tree *t, const char *path) {
    const nb_tree *out = NULL;
    nb_status s = nb_tree_lookup(t, path, &out);
    if (s != NB_OK || out == NULL) {
        fail_msg("lookup \"%s\": %s\n  errmsg: %s", path, nb_status_name(s), nb_ctx_errmsg(ctx));
    }
    return out;
}

static bool teq(nb_ctx *ctx, const nb_tree *a, const nb_tree *b) {
    bool out = false, out2 = true;
    NBT_OK(ctx, nb_tree_equal(a, b, &out));
    NBT_OK(ctx, nb_tree_equal(a, b, &out2));
    NBT_EQ_I64(out, out2);
    return out;
}

static bool tseq(nb_ctx *ctx, const nb_tree *a, const nb_tree *b) {
    bool out = false, out2 = true;
    NBT_OK(ctx, nb_tree_structure_equal(a, b, &out));
    NBT_OK(ctx, nb_tree_structure_equal(a, b, &out2));
    NBT_EQ_I64(out, out2);
    return out;
}

static char g_buf[1 << 15];

static const char *leaf_path(nb_ctx *ctx, const nb_tree *t, int64_t i) {
    size_t need = 0;
    memset(g_buf, 'X', sizeof g_buf);
    NBT_OK(ctx, nb_tree_leaf_path(t, i, g_buf, sizeof g_buf, &need));
    NBT_EQ_I64(need, strlen(g_buf));
    return g_buf;
}

static double flat(nb_ctx *ctx, const nb_array *a, int64_t i) {
    double v = 0;
    NBT_OK(ctx, nb_array_get_flat(a, i, &v));
    return v;
}

static void expect_kind(const nb_tree *t, nb_tree_kind k) {
    if (t == NULL) {
        fail_msg("expected a %s node, got NULL", nb_tree_kind_name(k));
    }
    if (nb_tree_kind_of(t) != k) {
        fail_msg("expected kind %s, got %s", nb_tree_kind_name(k),
                 nb_tree_kind_name(nb_tree_kind_of(t)));
    }
}

/* Read a whole FILE written with fprint. */
static const char *slurp(FILE *f) {
    rewind(f);
    size_t n = fread(g_buf, 1, sizeof g_buf - 1, f);
    g_buf[n] = 0;
    fclose(f);
    return g_buf;
}

/* ---- kinds and leaves --------------------------------------------------------------- */

static void test_kind_names(void **state) {
    (void)state;
    NBT_STREQ(nb_tree_kind_name(NB_TREE_KIND_NULL), "null");
    NBT_STREQ(nb_tree_kind_name(NB_TREE_KIND_ARRAY), "array");
    NBT_STREQ(nb_tree_kind_name(NB_TREE_KIND_VAR), "var");
    NBT_STREQ(nb_tree_kind_name(NB_TREE_KIND_INT), "int");
    NBT_STREQ(nb_tree_kind_name(NB_TREE_KIND_FLOAT), "float");
    NBT_STREQ(nb_tree_kind_name(NB_TREE_KIND_BOOL), "bool");
    NBT_STREQ(nb_tree_kind_name(NB_TREE_KIND_STRING), "string");
    NBT_STREQ(nb_tree_kind_name(NB_TREE_KIND_FNREF), "fn");
    NBT_STREQ(nb_tree_kind_name(NB_TREE_KIND_LIST), "list");
    NBT_STREQ(nb_tree_kind_name(NB_TREE_KIND_TUPLE), "tuple");
    NBT_STREQ(nb_tree_kind_name(NB_TREE_KIND_DICT), "dict");
}

static void check_leaf_flags(const nb_tree *t, bool is_static, bool is_dynamic) {
    NBT_TRUE(nb_tree_is_leaf(t));
    NBT_EQ_I64(nb_tree_is_static(t), is_static);
    NBT_EQ_I64(nb_tree_is_dynamic(t), is_dynamic);
    NBT_EQ_I64(nb_tree_len(t), 0);
    assert_null(nb_tree_child(t, 0));
    assert_null(nb_tree_key(t, 0));
    assert_null(nb_tree_get(t, "x"));
}

static void test_build_leaves(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();

    nb_tree *n = tnull(ctx);
    expect_kind(n, NB_TREE_KIND_NULL);
    NBT_OK(ctx, nb_tree_check(n));
    assert_ptr_equal(nb_tree_ctx(n), ctx);
    check_leaf_flags(n, false, false);
    assert_null(nb_tree_get_array(n));
    NBT_EQ_I64(nb_tree_num_leaves(n), 0);

    nb_array *arr = NULL;
    nb_tree *a = aleaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, NULL, &arr);
    expect_kind(a, NB_TREE_KIND_ARRAY);
    assert_ptr_equal(nb_tree_ctx(a), ctx);
    check_leaf_flags(a, false, true);
    NBT_EQ_I64(nb_tree_num_leaves(a), 1);
    /* no copy: later writes to the array are seen through the tree */
    NBT_OK(ctx, nb_array_set(arr, (int64_t[]){1, 2}, 9.5));
    NBT_EQ_F64(flat(ctx, nb_tree_get_array(a), 5), 9.5);

    nb_tree *i = tint(ctx, INT64_MIN);
    expect_kind(i, NB_TREE_KIND_INT);
    check_leaf_flags(i, true, false);
    int64_t iv = 0;
    NBT_OK(ctx, nb_tree_get_int(i, &iv));
    NBT_EQ_I64(iv, INT64_MIN);
    nb_tree *i2 = tint(ctx, ((int64_t)1 << 62) + 1);
    NBT_OK(ctx, nb_tree_get_int(i2, &iv));
    NBT_EQ_I64(iv, ((int64_t)1 << 62) + 1);
    NBT_EQ_I64(nb_tree_num_leaves(i2), 0);

    nb_tree *f = tfloat(ctx, -0.0);
    expect_kind(f, NB_TREE_KIND_FLOAT);
    check_leaf_flags(f, true, false);
    double fv = 1;
    NBT_OK(ctx, nb_tree_get_float(f, &fv));
    NBT_TRUE(fv == 0.0 && signbit(fv));

    nb_tree *b = tbool(ctx, true);
    expect_kind(b, NB_TREE_KIND_BOOL);
    check_leaf_flags(b, true, false);
    bool bv = false;
    NBT_OK(ctx, nb_tree_get_bool(b, &bv));
    NBT_TRUE(bv);

    /* strings are copied */
    char src[16] = "hello";
    nb_tree *s = tstr(ctx, src);
    strcpy(src, "HELLO");
    expect_kind(s, NB_TREE_KIND_STRING);
    check_leaf_flags(s, true, false);
    const char *sv = NULL;
    NBT_OK(ctx, nb_tree_get_string(s, &sv));
    NBT_STREQ(sv, "hello");
    assert_ptr_not_equal(sv, src);
    nb_tree *se = tstr(ctx, "");
    NBT_OK(ctx, nb_tree_get_string(se, &sv));
    NBT_STREQ(sv, "");

    /* function references, name copied */
    char name[16] = "relu";
    nb_tree *fr = tfn(ctx, FN_RELU, name);
    strcpy(name, "gelu");
    expect_kind(fr, NB_TREE_KIND_FNREF);
    check_leaf_flags(fr, true, false);
    nb_fnptr fp = NULL;
    const char *fname = NULL;
    NBT_OK(ctx, nb_tree_get_fnref(fr, &fp, &fname));
    NBT_TRUE(fp == FN_RELU);
    NBT_STREQ(fname, "relu");
    NBT_EQ_F64(((double (*)(double))fp)(-3.0), 0.0);

    nb_tree *all[] = {n, a, i, i2, f, b, s, se, fr};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        nb_tree_destroy(all[k]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_build_nodes(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *x = tint(ctx, 1), *y = tfloat(ctx, 2.5), *z = tnull(ctx);

    nb_tree *l = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, 3, (nb_tree *[]){x, y, z}, &l));
    expect_kind(l, NB_TREE_KIND_LIST);
    NBT_TRUE(!nb_tree_is_leaf(l));
    NBT_TRUE(!nb_tree_is_static(l));
    NBT_TRUE(!nb_tree_is_dynamic(l));
    NBT_EQ_I64(nb_tree_len(l), 3);
    assert_ptr_equal(nb_tree_child(l, 0), x);
    assert_ptr_equal(nb_tree_child(l, 1), y);
    assert_ptr_equal(nb_tree_child(l, 2), z);
    assert_null(nb_tree_child(l, 3));
    assert_null(nb_tree_child(l, -1));
    assert_null(nb_tree_key(l, 0));
    assert_null(nb_tree_get(l, "0"));

    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){y, x}, &t));
    expect_kind(t, NB_TREE_KIND_TUPLE);
    NBT_EQ_I64(nb_tree_len(t), 2);
    assert_ptr_equal(nb_tree_child(t, 0), y);
    assert_ptr_equal(nb_tree_child(t, 1), x);

    /* dict: insertion order kept, not sorted; keys copied */
    char k0[8] = "zeta", k1[8] = "alpha", k2[8] = "mid";
    nb_tree *d = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 3, (const char *[]){k0, k1, k2}, (nb_tree *[]){x, l, t}, &d));
    strcpy(k0, "XXXX");
    expect_kind(d, NB_TREE_KIND_DICT);
    NBT_EQ_I64(nb_tree_len(d), 3);
    NBT_STREQ(nb_tree_key(d, 0), "zeta");
    NBT_STREQ(nb_tree_key(d, 1), "alpha");
    NBT_STREQ(nb_tree_key(d, 2), "mid");
    assert_null(nb_tree_key(d, 3));
    assert_null(nb_tree_key(d, -1));
    assert_ptr_equal(nb_tree_child(d, 0), x);
    assert_ptr_equal(nb_tree_child(d, 1), l);
    assert_ptr_equal(nb_tree_get(d, "zeta"), x);
    assert_ptr_equal(nb_tree_get(d, "alpha"), l);
    assert_ptr_equal(nb_tree_get(d, "mid"), t);
    assert_null(nb_tree_get(d, "XXXX"));
    assert_null(nb_tree_get(d, "Alpha"));
    assert_null(nb_tree_get(d, ""));

    /* empty nodes, items NULL with n == 0 */
    nb_tree *el = NULL, *et = NULL, *ed = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, 0, NULL, &el));
    NBT_OK(ctx, nb_tree_tuple(ctx, 0, NULL, &et));
    NBT_OK(ctx, nb_tree_dict(ctx, 0, NULL, NULL, &ed));
    expect_kind(el, NB_TREE_KIND_LIST);
    expect_kind(et, NB_TREE_KIND_TUPLE);
    expect_kind(ed, NB_TREE_KIND_DICT);
    NBT_EQ_I64(nb_tree_len(el), 0);
    NBT_EQ_I64(nb_tree_len(et), 0);
    NBT_EQ_I64(nb_tree_len(ed), 0);
    NBT_TRUE(!nb_tree_is_leaf(el));
    NBT_TRUE(!nb_tree_is_leaf(ed));
    assert_null(nb_tree_child(el, 0));
    assert_null(nb_tree_get(ed, "a"));

    /* a child may appear twice */
    nb_tree *twice = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, 2, (nb_tree *[]){x, x}, &twice));
    assert_ptr_equal(nb_tree_child(twice, 1), x);

    nb_tree *all[] = {x, y, z, l, t, d, el, et, ed, twice};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        nb_tree_destroy(all[k]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_static_getter_kind_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *f = tfloat(ctx, 1.0), *i = tint(ctx, 1), *n = tnull(ctx);
    nb_tree *a = aleaf(ctx, NB_DTYPE_F32, 0, NULL, NULL, NULL);
    nb_tree *d = odict1(ctx, "k", tint(ctx, 2));
    int64_t iv;
    double fv;
    bool bv;
    const char *sv;
    nb_fnptr fp;
    const char *name;

    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_KIND, nb_tree_get_int(f, &iv));
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_ERR_KIND);
    NBT_ERRMSG_HAS(ctx, "float");
    NBT_ERRMSG_HAS(ctx, "nb_tree_get_int");

    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_KIND, nb_tree_get_float(i, &fv));
    NBT_ERRMSG_HAS(ctx, "int");
    NBT_ERRMSG_HAS(ctx, "nb_tree_get_float");

    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_KIND, nb_tree_get_bool(n, &bv));
    NBT_ERRMSG_HAS(ctx, "null");

    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_KIND, nb_tree_get_string(a, &sv));
    NBT_ERRMSG_HAS(ctx, "array");

    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_KIND, nb_tree_get_fnref(d, &fp, &name));
    NBT_ERRMSG_HAS(ctx, "dict");

    /* an int leaf is not a float even if the value would convert, and vice versa */
    NBT_STATUS(ctx, NB_ERR_KIND, nb_tree_get_float(i, &fv));
    NBT_STATUS(ctx, NB_ERR_KIND, nb_tree_get_bool(i, &bv));

    /* get_array / get on the wrong kinds */
    assert_null(nb_tree_get_array(i));
    assert_null(nb_tree_get_array(d));
    assert_null(nb_tree_get(i, "k"));

    nb_tree_destroy(f);
    nb_tree_destroy(i);
    nb_tree_destroy(n);
    nb_tree_destroy(a);
    nb_tree_destroy(d);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_dict_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *x = tint(ctx, 1), *y = tint(ctx, 2);
    nb_tree *d = k_sentinel_tree;

    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_INVALID,
               nb_tree_dict(ctx, 2, (const char *[]){"w", "w"}, (nb_tree *[]){x, y}, &d));
    assert_null(d);
    NBT_ERRMSG_HAS(ctx, "nb_tree_dict");
    NBT_ERRMSG_HAS(ctx, "w");

    /* duplicates found beyond neighbours, and with equal content in different buffers */
    char k1[4] = "ab", k2[4] = "ab";
    d = k_sentinel_tree;
    NBT_STATUS(ctx, NB_ERR_INVALID,
               nb_tree_dict(ctx, 3, (const char *[]){k1, "c", k2}, (nb_tree *[]){x, y, x}, &d));
    assert_null(d);

    d = k_sentinel_tree;
    NBT_STATUS(ctx, NB_ERR_INVALID,
               nb_tree_dict(ctx, 2, (const char *[]){"a", NULL}, (nb_tree *[]){x, y}, &d));
    assert_null(d);

    d = k_sentinel_tree;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_tree_dict(ctx, -1, NULL, NULL, &d));
    assert_null(d);
    d = k_sentinel_tree;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_tree_list(ctx, -2, NULL, &d));
    assert_null(d);
    d = k_sentinel_tree;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_tree_tuple(ctx, -1, NULL, &d));
    assert_null(d);

    /* failures did not take references: only x and y are alive */
    nb_ctx_stats st;
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &st));
    NBT_EQ_I64(st.live_trees, 2);
    nb_tree_destroy(x);
    nb_tree_destroy(y);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_refcounts(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = mkarr(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
    nb_tree *la = NULL;
    NBT_OK(ctx, nb_tree_array(a, &la));
    nb_array_destroy(a); /* the caller's reference */
    nb_array *held = nb_tree_get_array(la);
    assert_ptr_equal(held, a);
    NBT_OK(ctx, nb_array_check(held));
    NBT_EQ_F64(flat(ctx, held, 2), 3);

    nb_ctx_stats st;
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &st));
    NBT_EQ_I64(st.live_arrays, 1);
    NBT_EQ_I64(st.live_trees, 1);

    /* two leaves over one array, and one leaf in two parents */
    nb_tree *lb = NULL;
    NBT_OK(ctx, nb_tree_array(held, &lb));
    nb_tree *p1 = olist(ctx, 2, (nb_tree *[]){nb_tree_retain(la), lb});
    nb_tree *p2 = odict(ctx, 1, (const char *[]){"a"}, (nb_tree *[]){la});
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &st));
    NBT_EQ_I64(st.live_arrays, 1);
    NBT_EQ_I64(st.live_trees, 4);

    nb_tree_destroy(p1);
    NBT_OK(ctx, nb_tree_check(nb_tree_get(p2, "a")));
    NBT_OK(ctx, nb_array_check(held));
    NBT_EQ_F64(flat(ctx, nb_tree_get_array(nb_tree_get(p2, "a")), 0), 1);
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &st));
    NBT_EQ_I64(st.live_trees, 2);
    NBT_EQ_I64(st.live_arrays, 1);

    /* retain/destroy on a tree */
    assert_ptr_equal(nb_tree_retain(p2), p2);
    nb_tree_destroy(p2);
    NBT_OK(ctx, nb_tree_check(p2));
    nb_tree_destroy(p2);
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_OK);
    nb_tree_destroy(NULL);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- paths and lookup --------------------------------------------------------------- */

typedef struct path_tree {
    nb_tree *root;
    nb_array *arr[10];
} path_tree;

/*  dict{ layers: [ {weight, bias}, {weight, bias} ], "w-1": arr, t: (arr, null, 3, arr),
 *        mu: { "w-1": arr, "1st": arr, _x: arr }, s: "hi" }                              */
static path_tree build_path_tree(nb_ctx *ctx) {
    path_tree p;
    nb_tree *l0 =
        odict(ctx, 2, (const char *[]){"weight", "bias"},
              (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 2}, NULL, &p.arr[0]),
                            aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, NULL, &p.arr[1])});
    nb_tree *l1 =
        odict(ctx, 2, (const char *[]){"weight", "bias"},
              (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){3, 2}, NULL, &p.arr[2]),
                            aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, NULL, &p.arr[3])});
    nb_tree *layers = olist(ctx, 2, (nb_tree *[]){l0, l1});
    nb_tree *w1 = aleaf(ctx, NB_DTYPE_F64, 0, NULL, NULL, &p.arr[4]);
    nb_tree *t = otuple(
        ctx, 4,
        (nb_tree *[]){aleaf(ctx, NB_DTYPE_I32, 1, (int64_t[]){1}, NULL, &p.arr[5]), tnull(ctx),
                      tint(ctx, 3), aleaf(ctx, NB_DTYPE_BOOL, 1, (int64_t[]){2}, NULL, &p.arr[6])});
    nb_tree *mu =
        odict(ctx, 3, (const char *[]){"w-1", "1st", "_x"},
              (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){1}, NULL, &p.arr[7]),
                            aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){1}, NULL, &p.arr[8]),
                            aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){1}, NULL, &p.arr[9])});
    p.root = odict(ctx, 5, (const char *[]){"layers", "w-1", "t", "mu", "s"},
                   (nb_tree *[]){layers, w1, t, mu, tstr(ctx, "hi")});
    return p;
}

static const char *const k_paths[10] = {
    "layers[0].weight",
    "layers[0].bias",
    "layers[1].weight",
    "layers[1].bias",
    "[\"w-1\"]",
    "t[0]",
    "t[3]",
    "mu[\"w-1\"]",
    "mu[\"1st\"]",
    "mu._x",
};

static void test_leaf_paths(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    path_tree p = build_path_tree(ctx);
    NBT_EQ_I64(nb_tree_num_leaves(p.root), 10);
    for (int i = 0; i < 10; i++) {
        NBT_STREQ(leaf_path(ctx, p.root, i), k_paths[i]);
    }
    /* subtrees have their own root */
    NBT_EQ_I64(nb_tree_num_leaves(nb_tree_get(p.root, "layers")), 4);
    NBT_STREQ(leaf_path(ctx, nb_tree_get(p.root, "layers"), 3), "[1].bias");
    NBT_STREQ(leaf_path(ctx, nb_tree_get(p.root, "t"), 1), "[3]");
    NBT_EQ_I64(nb_tree_num_leaves(nb_tree_get(p.root, "s")), 0);
    NBT_EQ_I64(nb_tree_num_leaves(nb_tree_child(nb_tree_get(p.root, "t"), 1)), 0);

    /* a root leaf's path is "" */
    nb_tree *r = aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, NULL, NULL);
    size_t need = 99;
    char buf[8];
    memset(buf, 'X', sizeof buf);
    NBT_OK(ctx, nb_tree_leaf_path(r, 0, buf, sizeof buf, &need));
    NBT_STREQ(buf, "");
    NBT_EQ_I64(need, 0);
    nb_tree_destroy(r);

    /* nested lists */
    nb_tree *nl =
        olist(ctx, 2,
              (nb_tree *[]){
                  aleaf(ctx, NB_DTYPE_F32, 0, NULL, NULL, NULL),
                  olist(ctx, 2,
                        (nb_tree *[]){tnull(ctx), aleaf(ctx, NB_DTYPE_F32, 0, NULL, NULL, NULL)})});
    NBT_EQ_I64(nb_tree_num_leaves(nl), 2);
    NBT_STREQ(leaf_path(ctx, nl, 0), "[0]");
    NBT_STREQ(leaf_path(ctx, nl, 1), "[1][1]");
    nb_tree_destroy(nl);

    nb_tree_destroy(p.root);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_leaf_path_errors_and_snprintf(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    path_tree p = build_path_tree(ctx);
    char buf[64];
    size_t need = 0;
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_tree_leaf_path(p.root, 10, buf, sizeof buf, &need));
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_tree_leaf_path(p.root, -1, buf, sizeof buf, &need));
    NBT_ERRMSG_HAS(ctx, "nb_tree_leaf_path");

    /* "layers[1].weight" is 16 chars */
    need = 0;
    NBT_STATUS(ctx, NB_ERR_TRUNCATED, nb_tree_leaf_path(p.root, 2, NULL, 0, &need));
    NBT_EQ_I64(need, 16);
    memset(buf, 'X', sizeof buf);
    NBT_STATUS(ctx, NB_ERR_TRUNCATED, nb_tree_leaf_path(p.root, 2, buf, 7, &need));
    NBT_STREQ(buf, "layers");
    NBT_EQ_I64(buf[7], 'X');
    NBT_EQ_I64(need, 16);
    NBT_OK(ctx, nb_tree_leaf_path(p.root, 2, buf, 17, NULL));
    NBT_STREQ(buf, "layers[1].weight");
    nb_tree_destroy(p.root);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_lookup(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    path_tree p = build_path_tree(ctx);
    for (int i = 0; i < 10; i++) {
        const nb_tree *n = at(ctx, p.root, k_paths[i]);
        expect_kind(n, NB_TREE_KIND_ARRAY);
        assert_ptr_equal(nb_tree_get_array(n), p.arr[i]);
    }
    assert_ptr_equal(at(ctx, p.root, ""), p.root);
    assert_ptr_equal(at(ctx, p.root, "layers"), nb_tree_get(p.root, "layers"));
    expect_kind(at(ctx, p.root, "layers[1]"), NB_TREE_KIND_DICT);
    expect_kind(at(ctx, p.root, "t[1]"), NB_TREE_KIND_NULL);
    int64_t iv = 0;
    NBT_OK(ctx, nb_tree_get_int(at(ctx, p.root, "t[2]"), &iv));
    NBT_EQ_I64(iv, 3);
    expect_kind(at(ctx, p.root, "s"), NB_TREE_KIND_STRING);
    expect_kind(at(ctx, p.root, "mu"), NB_TREE_KIND_DICT);

    /* not found */
    const char *missing[] = {"layers[2]", "layers[0].nope", "nope",          "t[4]",
                             "t[0].x",    "mu[\"w-2\"]",    "layers.weight", "[0]"};
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        const nb_tree *out = (const nb_tree *)k_sentinel_tree;
        nb_status s = nb_tree_lookup(p.root, missing[i], &out);
        if (s != NB_ERR_NOT_FOUND) {
            fail_msg("lookup \"%s\" returned %s, wanted ERR_NOT_FOUND\n  errmsg: %s", missing[i],
                     nb_status_name(s), nb_ctx_errmsg(ctx));
        }
        assert_null(out);
    }
    /* the message names the longest existing prefix and what it holds */
    const nb_tree *out = NULL;
    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_NOT_FOUND, nb_tree_lookup(p.root, "layers[0].nope", &out));
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_ERR_NOT_FOUND);
    NBT_ERRMSG_HAS(ctx, "layers[0]");
    NBT_ERRMSG_HAS(ctx, "dict");
    NBT_ERRMSG_HAS(ctx, "nope");
    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_NOT_FOUND, nb_tree_lookup(p.root, "layers[5].weight", &out));
    NBT_ERRMSG_HAS(ctx, "layers");
    NBT_ERRMSG_HAS(ctx, "list");

    /* malformed */
    const char *bad[] = {"layers[",    "layers[1", "layers[x]", "layers[1]..weight",
                         "layers[1].", "[\"w-1",   "layers[]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        out = (const nb_tree *)k_sentinel_tree;
        nb_status s = nb_tree_lookup(p.root, bad[i], &out);
        if (s != NB_ERR_INVALID) {
            fail_msg("lookup \"%s\" returned %s, wanted ERR_INVALID\n  errmsg: %s", bad[i],
                     nb_status_name(s), nb_ctx_errmsg(ctx));
        }
        assert_null(out);
    }
    NBT_ERRMSG_HAS(ctx, "nb_tree_lookup");
    nb_tree_destroy(p.root);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A stray ']' cannot be part of a ".key" step (keys that are not identifiers must be
 * written ["key"]), so the path is malformed rather than naming a missing key. */
static void test_lookup_stray_bracket_is_malformed(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    path_tree p = build_path_tree(ctx);
    const nb_tree *out = (const nb_tree *)k_sentinel_tree;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_tree_lookup(p.root, "layers]", &out));
    assert_null(out);
    out = (const nb_tree *)k_sentinel_tree;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_tree_lookup(p.root, "layers[0]]", &out));
    assert_null(out);
    nb_tree_destroy(p.root);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- flatten / unflatten ------------------------------------------------------------ */

typedef struct full_tree {
    nb_tree *root;
    nb_array *arr[7];
} full_tree;

/* A tree with every leaf kind (null, array of each dtype, int, float, bool, string, fnref)
 * and every node kind including empty ones. 7 dynamic leaves. */
static full_tree build_full_tree(nb_ctx *ctx) {
    full_tree f;
    nb_tree *nodes =
        olist(ctx, 4,
              (nb_tree *[]){olist(ctx, 0, NULL), odict(ctx, 0, NULL, NULL),
                            otuple(ctx, 2,
                                   (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){1},
                                                       (double[]){4}, &f.arr[5]),
                                                 tnull(ctx)}),
                            otuple(ctx, 0, NULL)});
    nb_tree *nested = otuple(
        ctx, 1,
        (nb_tree *[]){odict1(
            ctx, "deep",
            olist(ctx, 1,
                  (nb_tree *[]){aleaf(ctx, NB_DTYPE_F64, 1, (int64_t[]){0}, NULL, &f.arr[6])}))});
    f.root = odict(
        ctx, 13,
        (const char *[]){"n", "f32", "f64", "i32", "i64", "b8", "i", "f", "b", "s", "fn", "nodes",
                         "nested"},
        (nb_tree *[]){
            tnull(ctx),
            aleaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, (double[]){1, 2, 3, 4, 5, 6}, &f.arr[0]),
            aleaf(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){0.5, -1}, &f.arr[1]),
            aleaf(ctx, NB_DTYPE_I32, 1, (int64_t[]){3}, (double[]){7, 8, 9}, &f.arr[2]),
            aleaf(ctx, NB_DTYPE_I64, 0, NULL, (double[]){-5}, &f.arr[3]),
            aleaf(ctx, NB_DTYPE_BOOL, 1, (int64_t[]){2}, (double[]){1, 0}, &f.arr[4]),
            tint(ctx, -7), tfloat(ctx, 0.5), tbool(ctx, true), tstr(ctx, "hello"),
            tfn(ctx, FN_RELU, "relu"), nodes, nested});
    return f;
}

static const char *const k_full_paths[7] = {
    "f32", "f64", "i32", "i64", "b8", "nodes[2][0]", "nested[0].deep[0]"};

static void check_full_statics(nb_ctx *ctx, const nb_tree *t) {
    int64_t iv = 0;
    double fv = 0;
    bool bv = false;
    const char *sv = NULL, *name = NULL;
    nb_fnptr fp = NULL;
    expect_kind(at(ctx, t, "n"), NB_TREE_KIND_NULL);
    NBT_OK(ctx, nb_tree_get_int(at(ctx, t, "i"), &iv));
    NBT_EQ_I64(iv, -7);
    NBT_OK(ctx, nb_tree_get_float(at(ctx, t, "f"), &fv));
    NBT_EQ_F64(fv, 0.5);
    NBT_OK(ctx, nb_tree_get_bool(at(ctx, t, "b"), &bv));
    NBT_TRUE(bv);
    NBT_OK(ctx, nb_tree_get_string(at(ctx, t, "s"), &sv));
    NBT_STREQ(sv, "hello");
    NBT_OK(ctx, nb_tree_get_fnref(at(ctx, t, "fn"), &fp, &name));
    NBT_TRUE(fp == FN_RELU);
    NBT_STREQ(name, "relu");
    expect_kind(at(ctx, t, "nodes[0]"), NB_TREE_KIND_LIST);
    NBT_EQ_I64(nb_tree_len(at(ctx, t, "nodes[0]")), 0);
    expect_kind(at(ctx, t, "nodes[1]"), NB_TREE_KIND_DICT);
    NBT_EQ_I64(nb_tree_len(at(ctx, t, "nodes[1]")), 0);
    expect_kind(at(ctx, t, "nodes[2]"), NB_TREE_KIND_TUPLE);
    expect_kind(at(ctx, t, "nodes[2][1]"), NB_TREE_KIND_NULL);
    expect_kind(at(ctx, t, "nodes[3]"), NB_TREE_KIND_TUPLE);
    NBT_EQ_I64(nb_tree_len(at(ctx, t, "nodes[3]")), 0);
    expect_kind(at(ctx, t, "nested"), NB_TREE_KIND_TUPLE);
    expect_kind(at(ctx, t, "nested[0].deep"), NB_TREE_KIND_LIST);
}

static void test_flatten_unflatten_round_trip(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    full_tree f = build_full_tree(ctx);
    NBT_EQ_I64(nb_tree_num_leaves(f.root), 7);
    for (int i = 0; i < 7; i++) {
        NBT_STREQ(leaf_path(ctx, f.root, i), k_full_paths[i]);
    }

    nb_tree *leaves = NULL;
    nb_treedef *def = NULL;
    NBT_OK(ctx, nb_tree_flatten(f.root, &leaves, &def));
    expect_kind(leaves, NB_TREE_KIND_LIST);
    NBT_EQ_I64(nb_tree_len(leaves), 7);
    for (int i = 0; i < 7; i++) {
        const nb_tree *c = nb_tree_child(leaves, i);
        expect_kind(c, NB_TREE_KIND_ARRAY);
        assert_ptr_equal(nb_tree_get_array(c), f.arr[i]);
    }
    NBT_EQ_I64(nb_treedef_num_leaves(def), 7);

    /* nb_tree_treedef gives the same treedef */
    nb_treedef *def2 = NULL;
    NBT_OK(ctx, nb_tree_treedef(f.root, &def2));
    NBT_TRUE(nb_treedef_equal(def, def2));
    NBT_EQ_I64(nb_treedef_hash(def), nb_treedef_hash(def2));
    NBT_TRUE(nb_treedef_hash(def) != 0);

    nb_tree *back = NULL;
    NBT_OK(ctx, nb_tree_unflatten(def, leaves, &back));
    assert_ptr_not_equal(back, f.root);
    NBT_TRUE(teq(ctx, back, f.root));
    NBT_TRUE(tseq(ctx, back, f.root));
    NBT_EQ_I64(nb_tree_num_leaves(back), 7);
    for (int i = 0; i < 7; i++) {
        assert_ptr_equal(nb_tree_get_array(at(ctx, back, k_full_paths[i])), f.arr[i]);
        NBT_STREQ(leaf_path(ctx, back, i), k_full_paths[i]);
    }
    check_full_statics(ctx, back);
    /* the rebuilt tree's dict keeps key order */
    NBT_STREQ(nb_tree_key(back, 0), "n");
    NBT_STREQ(nb_tree_key(back, 12), "nested");

    /* a tuple of leaves works too */
    nb_tree *as_tuple = NULL;
    nb_tree *kids[7];
    for (int i = 0; i < 7; i++) {
        kids[i] = (nb_tree *)nb_tree_child(leaves, i);
    }
    NBT_OK(ctx, nb_tree_tuple(ctx, 7, kids, &as_tuple));
    nb_tree *back2 = NULL;
    NBT_OK(ctx, nb_tree_unflatten(def, as_tuple, &back2));
    NBT_TRUE(teq(ctx, back2, f.root));

    /* the rebuilt trees survive everything else */
    nb_tree_destroy(as_tuple);
    nb_tree_destroy(leaves);
    nb_treedef_destroy(def);
    nb_treedef_destroy(def2);
    nb_tree_destroy(f.root);
    check_full_statics(ctx, back);
    NBT_EQ_F64(flat(ctx, nb_tree_get_array(at(ctx, back, "f32")), 5), 6);
    NBT_TRUE(teq(ctx, back, back2));
    nb_tree_destroy(back);
    nb_tree_destroy(back2);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_flatten_edge_cases(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    /* either out-parameter may be NULL */
    full_tree f = build_full_tree(ctx);
    nb_tree *leaves = NULL;
    nb_treedef *def = NULL;
    NBT_OK(ctx, nb_tree_flatten(f.root, &leaves, NULL));
    NBT_EQ_I64(nb_tree_len(leaves), 7);
    NBT_OK(ctx, nb_tree_flatten(f.root, NULL, &def));
    NBT_EQ_I64(nb_treedef_num_leaves(def), 7);
    nb_tree_destroy(leaves);
    nb_treedef_destroy(def);
    nb_tree_destroy(f.root);
    nbt_assert_no_live(ctx);

    /* a root array leaf */
    nb_array *a = NULL;
    nb_tree *r = aleaf(ctx, NB_DTYPE_I64, 1, (int64_t[]){2}, (double[]){1, 2}, &a);
    NBT_OK(ctx, nb_tree_flatten(r, &leaves, &def));
    NBT_EQ_I64(nb_tree_len(leaves), 1);
    assert_ptr_equal(nb_tree_get_array(nb_tree_child(leaves, 0)), a);
    NBT_EQ_I64(nb_treedef_num_leaves(def), 1);
    nb_tree *back = NULL;
    NBT_OK(ctx, nb_tree_unflatten(def, leaves, &back));
    expect_kind(back, NB_TREE_KIND_ARRAY);
    assert_ptr_equal(nb_tree_get_array(back), a);
    nb_tree_destroy(back);
    nb_tree_destroy(leaves);
    nb_treedef_destroy(def);
    nb_tree_destroy(r);

    /* a root null and a root static: no leaves */
    r = tnull(ctx);
    NBT_OK(ctx, nb_tree_flatten(r, &leaves, &def));
    expect_kind(leaves, NB_TREE_KIND_LIST);
    NBT_EQ_I64(nb_tree_len(leaves), 0);
    NBT_EQ_I64(nb_treedef_num_leaves(def), 0);
    NBT_OK(ctx, nb_tree_unflatten(def, leaves, &back));
    expect_kind(back, NB_TREE_KIND_NULL);
    nb_tree_destroy(back);
    nb_tree_destroy(leaves);
    nb_treedef_destroy(def);
    nb_tree_destroy(r);

    r = tstr(ctx, "only");
    NBT_OK(ctx, nb_tree_flatten(r, &leaves, &def));
    NBT_EQ_I64(nb_tree_len(leaves), 0);
    NBT_OK(ctx, nb_tree_unflatten(def, leaves, &back));
    const char *sv = NULL;
    NBT_OK(ctx, nb_tree_get_string(back, &sv));
    NBT_STREQ(sv, "only");
    nb_tree_destroy(back);
    nb_tree_destroy(leaves);
    nb_treedef_destroy(def);
    nb_tree_destroy(r);

    /* treedef retain/destroy */
    r = tint(ctx, 1);
    NBT_OK(ctx, nb_tree_treedef(r, &def));
    assert_ptr_equal(nb_treedef_retain(def), def);
    nb_treedef_destroy(def);
    NBT_EQ_I64(nb_treedef_num_leaves(def), 0);
    nb_treedef_destroy(def);
    nb_treedef_destroy(NULL);
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_OK);
    nb_tree_destroy(r);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_unflatten_wrong_count(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    full_tree f = build_full_tree(ctx);
    nb_tree *leaves = NULL;
    nb_treedef *def = NULL;
    NBT_OK(ctx, nb_tree_flatten(f.root, &leaves, &def));
    nb_tree *kids[8];
    for (int i = 0; i < 7; i++) {
        kids[i] = (nb_tree *)nb_tree_child(leaves, i);
    }
    kids[7] = kids[0];
    nb_tree *six = NULL, *eight = NULL, *zero = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, 6, kids, &six));
    NBT_OK(ctx, nb_tree_list(ctx, 8, kids, &eight));
    NBT_OK(ctx, nb_tree_list(ctx, 0, NULL, &zero));

    nb_tree *out = k_sentinel_tree;
    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_tree_unflatten(def, six, &out));
    assert_null(out);
    NBT_ERRMSG_HAS(ctx, "nb_tree_unflatten");
    NBT_ERRMSG_HAS(ctx, "6");
    NBT_ERRMSG_HAS(ctx, "7");
    out = k_sentinel_tree;
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_tree_unflatten(def, eight, &out));
    assert_null(out);
    out = k_sentinel_tree;
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_tree_unflatten(def, zero, &out));
    assert_null(out);

    /* leaves that are not a list or tuple */
    out = k_sentinel_tree;
    NBT_TRUE(nb_tree_unflatten(def, f.root, &out) != NB_OK);
    assert_null(out);

    nb_tree_destroy(six);
    nb_tree_destroy(eight);
    nb_tree_destroy(zero);
    nb_tree_destroy(leaves);
    nb_treedef_destroy(def);
    nb_tree_destroy(f.root);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_unflatten_any_leaves(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *t = odict(ctx, 3, (const char *[]){"a", "k", "b"},
                       (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 0, NULL, NULL, NULL), tint(ctx, 5),
                                     aleaf(ctx, NB_DTYPE_F32, 0, NULL, NULL, NULL)});
    nb_treedef *def = NULL;
    NBT_OK(ctx, nb_tree_flatten(t, NULL, &def));
    nb_tree *repl =
        olist(ctx, 2, (nb_tree *[]){tint(ctx, 1), olist(ctx, 1, (nb_tree *[]){tfloat(ctx, 2)})});
    nb_tree *out = NULL;
    NBT_OK(ctx, nb_tree_unflatten(def, repl, &out));
    int64_t iv = 0;
    double fv = 0;
    NBT_OK(ctx, nb_tree_get_int(at(ctx, out, "a"), &iv));
    NBT_EQ_I64(iv, 1);
    NBT_OK(ctx, nb_tree_get_int(at(ctx, out, "k"), &iv));
    NBT_EQ_I64(iv, 5);
    NBT_OK(ctx, nb_tree_get_float(at(ctx, out, "b[0]"), &fv));
    NBT_EQ_F64(fv, 2);
    NBT_EQ_I64(nb_tree_num_leaves(out), 0);
    nb_tree_destroy(out);
    nb_tree_destroy(repl);
    nb_treedef_destroy(def);
    nb_tree_destroy(t);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- treedef value semantics -------------------------------------------------------- */

enum {
    V_BASE,
    V_INT4,
    V_KEY_ORDER,
    V_ARRAY_NOT_NULL,
    V_FN_NAME,
    V_FN_PTR,
    V_LR,
    V_TAG,
    V_LIST_NOT_TUPLE,
    V_BOOL,
    V_FLOAT_NOT_INT,
    V_EXTRA,
    V_KEY_NAME,
    V_COUNT
};

/* dict{ w: array, act: fn relu, lr: float, tag: string, n: int 3, b: null,
 *       cfg: tuple(bool true, list[]) }, with one change per variant. */
static nb_tree *build_model(nb_ctx *ctx, int variant, int64_t wlen, double lr) {
    char fname[16], tag[16], kw[4], kact[4];
    strcpy(fname, variant == V_FN_NAME ? "relu2" : "relu");
    strcpy(tag, variant == V_TAG ? "adamw" : "adam");
    strcpy(kw, "w");
    strcpy(kact, "act");
    nb_tree *w =
        aleaf(ctx, wlen % 2 ? NB_DTYPE_F64 : NB_DTYPE_F32, 1, (int64_t[]){wlen}, NULL, NULL);
    nb_tree *act = tfn(ctx, variant == V_FN_PTR ? FN_TANH : FN_RELU, fname);
    nb_tree *lrt = tfloat(ctx, variant == V_LR ? 0.2 : lr);
    nb_tree *tagt = tstr(ctx, tag);
    nb_tree *n =
        variant == V_FLOAT_NOT_INT ? tfloat(ctx, 3.0) : tint(ctx, variant == V_INT4 ? 4 : 3);
    nb_tree *b =
        variant == V_ARRAY_NOT_NULL ? aleaf(ctx, NB_DTYPE_F32, 0, NULL, NULL, NULL) : tnull(ctx);
    nb_tree *cfg_items[2] = {tbool(ctx, variant != V_BOOL), olist(ctx, 0, NULL)};
    nb_tree *cfg =
        variant == V_LIST_NOT_TUPLE ? olist(ctx, 2, cfg_items) : otuple(ctx, 2, cfg_items);
    if (variant == V_EXTRA) {
        cfg = olist(ctx, 2, (nb_tree *[]){cfg, tnull(ctx)});
    }
    const char *keys[7] = {kw, kact, "lr", "tag", "n", variant == V_KEY_NAME ? "bb" : "b", "cfg"};
    nb_tree *items[7] = {w, act, lrt, tagt, n, b, cfg};
    if (variant == V_KEY_ORDER) {
        keys[0] = kact;
        keys[1] = kw;
        items[0] = act;
        items[1] = w;
    }
    return odict(ctx, 7, keys, items);
}

static nb_treedef *def_of(nb_ctx *ctx, const nb_tree *t) {
    nb_treedef *d = NULL;
    NBT_OK(ctx, nb_tree_treedef(t, &d));
    return d;
}

static void test_treedef_equal_by_value(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    double lr1 = 0.1, ten = 10.0;
    double lr2 = 1.0 / ten; /* computed, same bits */
    /* different array dtypes and shapes: not part of the treedef */
    nb_tree *a = build_model(ctx, V_BASE, 4, lr1);
    nb_tree *b = build_model(ctx, V_BASE, 7, lr2);
    nb_treedef *da = def_of(ctx, a), *db = def_of(ctx, b);
    assert_ptr_not_equal(da, db);
    NBT_TRUE(nb_treedef_equal(da, db));
    NBT_TRUE(nb_treedef_equal(db, da));
    NBT_TRUE(nb_treedef_equal(da, da));
    NBT_EQ_I64(nb_treedef_hash(da), nb_treedef_hash(db));
    NBT_EQ_I64(nb_treedef_num_leaves(da), 1);
    NBT_TRUE(tseq(ctx, a, b));
    NBT_TRUE(!teq(ctx, a, b)); /* arrays differ in dtype and shape */

    /* NaN floats with equal bits are equal */
    nb_tree *n1 = odict1(ctx, "x", tfloat(ctx, NAN));
    nb_tree *n2 = odict1(ctx, "x", tfloat(ctx, NAN));
    nb_treedef *dn1 = def_of(ctx, n1), *dn2 = def_of(ctx, n2);
    NBT_TRUE(nb_treedef_equal(dn1, dn2));
    NBT_EQ_I64(nb_treedef_hash(dn1), nb_treedef_hash(dn2));
    NBT_TRUE(teq(ctx, n1, n2)); /* no arrays: same treedef is equal */

    nb_tree *ts[] = {a, b, n1, n2};
    for (int i = 0; i < 4; i++) {
        nb_tree_destroy(ts[i]);
    }
    /* treedefs outlive their trees */
    NBT_TRUE(nb_treedef_equal(da, db));
    nb_treedef *ds[] = {da, db, dn1, dn2};
    for (int i = 0; i < 4; i++) {
        nb_treedef_destroy(ds[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_treedef_not_equal(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *base = build_model(ctx, V_BASE, 4, 0.1);
    nb_treedef *dbase = def_of(ctx, base);
    for (int v = 1; v < V_COUNT; v++) {
        nb_tree *t = build_model(ctx, v, 4, 0.1);
        nb_treedef *d = def_of(ctx, t);
        if (nb_treedef_equal(dbase, d) || nb_treedef_equal(d, dbase)) {
            fail_msg("variant %d has a treedef equal to the base", v);
        }
        bool se = true;
        NBT_OK(ctx, nb_tree_structure_equal(base, t, &se));
        if (se) {
            fail_msg("variant %d is structure_equal to the base", v);
        }
        nb_treedef_destroy(d);
        nb_tree_destroy(t);
    }
    /* 0.0 vs -0.0 compare by bits */
    nb_tree *z1 = tfloat(ctx, 0.0), *z2 = tfloat(ctx, -0.0);
    nb_treedef *dz1 = def_of(ctx, z1), *dz2 = def_of(ctx, z2);
    NBT_TRUE(!nb_treedef_equal(dz1, dz2));
    /* int vs bool, string vs fn name */
    nb_tree *i1 = tint(ctx, 1), *b1 = tbool(ctx, true);
    nb_treedef *di1 = def_of(ctx, i1), *db1 = def_of(ctx, b1);
    NBT_TRUE(!nb_treedef_equal(di1, db1));
    nb_tree *s1 = tstr(ctx, "relu"), *f1 = tfn(ctx, FN_RELU, "relu");
    nb_treedef *ds1 = def_of(ctx, s1), *df1 = def_of(ctx, f1);
    NBT_TRUE(!nb_treedef_equal(ds1, df1));
    /* empty list vs empty tuple vs empty dict */
    nb_tree *el = olist(ctx, 0, NULL), *et = otuple(ctx, 0, NULL), *ed = odict(ctx, 0, NULL, NULL);
    nb_treedef *del = def_of(ctx, el), *det = def_of(ctx, et), *ded = def_of(ctx, ed);
    NBT_TRUE(!nb_treedef_equal(del, det));
    NBT_TRUE(!nb_treedef_equal(del, ded));
    NBT_TRUE(!nb_treedef_equal(det, ded));

    nb_treedef *ds[] = {dbase, dz1, dz2, di1, db1, ds1, df1, del, det, ded};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
        nb_treedef_destroy(ds[i]);
    }
    nb_tree *ts[] = {base, z1, z2, i1, b1, s1, f1, el, et, ed};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        nb_tree_destroy(ts[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_treedef_format(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *t = odict(ctx, 4, (const char *[]){"w", "act", "n", "b"},
                       (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){3, 3}, NULL, NULL),
                                     tfn(ctx, FN_RELU, "relu"), tint(ctx, 3), tnull(ctx)});
    nb_treedef *d = def_of(ctx, t);
    const char *want = "dict(w=*, act=fn relu, n=int 3, b=null)";
    char buf[256];
    size_t need = 0;
    NBT_OK(ctx, nb_treedef_format(d, buf, sizeof buf, &need));
    NBT_STREQ(buf, want);
    NBT_EQ_I64(need, strlen(want));
    /* snprintf contract */
    NBT_STATUS(ctx, NB_ERR_TRUNCATED, nb_treedef_format(d, NULL, 0, &need));
    NBT_EQ_I64(need, strlen(want));
    memset(buf, 'X', sizeof buf);
    NBT_STATUS(ctx, NB_ERR_TRUNCATED, nb_treedef_format(d, buf, 5, &need));
    NBT_STREQ(buf, "dict");
    NBT_EQ_I64(buf[5], 'X');
    nb_treedef_destroy(d);
    nb_tree_destroy(t);

    /* lists, tuples and the other statics show up */
    t = olist(ctx, 3,
              (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 0, NULL, NULL, NULL),
                            otuple(ctx, 2, (nb_tree *[]){tstr(ctx, "adam"), tfloat(ctx, 0.5)}),
                            tbool(ctx, true)});
    d = def_of(ctx, t);
    NBT_OK(ctx, nb_treedef_format(d, buf, sizeof buf, NULL));
    NBT_TRUE(strstr(buf, "list") != NULL);
    NBT_TRUE(strstr(buf, "tuple") != NULL);
    NBT_TRUE(strstr(buf, "*") != NULL);
    NBT_TRUE(strstr(buf, "adam") != NULL);
    NBT_TRUE(strstr(buf, "0.5") != NULL);
    NBT_TRUE(strchr(buf, '\n') == NULL);
    nb_treedef_destroy(d);
    nb_tree_destroy(t);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- map ---------------------------------------------------------------------------- */

#define MAX_CALLS 32

typedef struct map_rec {
    int calls;
    char paths[MAX_CALLS][64];
    int n[MAX_CALLS];
    nb_tree_kind kinds[MAX_CALLS][4];
    int fail_at;        /* 1-based call that fails; 0 never */
    bool fail_with_msg; /* use nb_tree_map_fail */
} map_rec;

static void rec_call(map_rec *r, const char *path, int n, const nb_tree *const *leaves) {
    if (r->calls >= MAX_CALLS) {
        fail_msg("too many calls");
    }
    snprintf(r->paths[r->calls], sizeof r->paths[0], "%s", path);
    r->n[r->calls] = n;
    for (int i = 0; i < n && i < 4; i++) {
        r->kinds[r->calls][i] = nb_tree_kind_of(leaves[i]);
    }
    r->calls++;
}

/* A copy of array a with every element multiplied by k (through the data pointer). */
static nb_status scaled_copy(const nb_array *a, double k, nb_array **out) {
    nb_status s = nb_array_copy(a, out);
    if (s != NB_OK) {
        return s;
    }
    void *d = nb_array_data(*out);
    for (int64_t i = 0; i < nb_array_size(*out); i++) {
        switch (nb_array_dtype(*out)) {
        case NB_DTYPE_F32:
            ((float *)d)[i] *= (float)k;
            break;
        case NB_DTYPE_F64:
            ((double *)d)[i] *= k;
            break;
        case NB_DTYPE_I32:
            ((int32_t *)d)[i] *= (int32_t)k;
            break;
        case NB_DTYPE_I64:
            ((int64_t *)d)[i] *= (int64_t)k;
            break;
        case NB_DTYPE_BOOL:
            break;
        }
    }
    return NB_OK;
}

/* arrays doubled; nulls become int -1; statics become string "visited". */
static nb_status cb_double(void *ud, const char *path, int n, const nb_tree *const *leaves,
                           nb_tree **out) {
    map_rec *r = ud;
    rec_call(r, path, n, leaves);
    nb_ctx *ctx = nb_tree_ctx(leaves[0]);
    if (r->fail_at == r->calls) {
        if (r->fail_with_msg) {
            return nb_tree_map_fail(ctx, NB_ERR_SHAPE, "custom failure at %s", path);
        }
        return NB_ERR_INVALID;
    }
    switch (nb_tree_kind_of(leaves[0])) {
    case NB_TREE_KIND_ARRAY: {
        nb_array *b = NULL;
        nb_status s = scaled_copy(nb_tree_get_array(leaves[0]), 2.0, &b);
        if (s != NB_OK) {
            return s;
        }
        s = nb_tree_array(b, out);
        nb_array_destroy(b);
        return s;
    }
    case NB_TREE_KIND_NULL:
        return nb_tree_int(ctx, -1, out);
    default:
        return nb_tree_string(ctx, "visited", out);
    }
}

/* a tuple (leaf, leaf) */
static nb_status cb_pair(void *ud, const char *path, int n, const nb_tree *const *leaves,
                         nb_tree **out) {
    rec_call(ud, path, n, leaves);
    nb_tree *l = (nb_tree *)leaves[0];
    return nb_tree_tuple(nb_tree_ctx(l), 2, (nb_tree *[]){l, l}, out);
}

/* the leaf itself */
static nb_status cb_identity(void *ud, const char *path, int n, const nb_tree *const *leaves,
                             nb_tree **out) {
    rec_call(ud, path, n, leaves);
    *out = nb_tree_retain((nb_tree *)leaves[0]);
    return *out ? NB_OK : NB_ERR_INTERNAL;
}

/* Element-wise sum of every f32 array leaf among leaves[0..n-1] (others skipped); a new
 * f32 array shaped like the first array found. */
static nb_status cb_sum(void *ud, const char *path, int n, const nb_tree *const *leaves,
                        nb_tree **out) {
    rec_call(ud, path, n, leaves);
    nb_array *acc = NULL;
    nb_status s = NB_OK;
    for (int i = 0; i < n && s == NB_OK; i++) {
        nb_array *a = nb_tree_get_array(leaves[i]);
        if (a == NULL) {
            continue;
        }
        if (acc == NULL) {
            s = nb_array_copy(a, &acc);
            continue;
        }
        float *dst = nb_array_data(acc);
        const float *src = nb_array_data(a);
        for (int64_t k = 0; k < nb_array_size(acc); k++) {
            dst[k] += src[k];
        }
    }
    if (s != NB_OK) {
        return s;
    }
    if (acc == NULL) {
        return nb_tree_null(nb_tree_ctx(leaves[0]), out);
    }
    s = nb_tree_array(acc, out);
    nb_array_destroy(acc);
    return s;
}

/* dict{ a: f32[2], b: [ i32[2], null, f64[1] ], c: int 1, d: null, e: (f32[]) } */
static nb_tree *build_map_tree(nb_ctx *ctx) {
    return odict(
        ctx, 5, (const char *[]){"a", "b", "c", "d", "e"},
        (nb_tree *[]){
            aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, (double[]){1, 2}, NULL),
            olist(ctx, 3,
                  (nb_tree *[]){aleaf(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, (double[]){3, 4}, NULL),
                                tnull(ctx),
                                aleaf(ctx, NB_DTYPE_F64, 1, (int64_t[]){1}, (double[]){5}, NULL)}),
            tint(ctx, 1), tnull(ctx),
            otuple(ctx, 1, (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 0, NULL, (double[]){6}, NULL)})});
}

static void expect_paths(const map_rec *r, int n, const char *const *want) {
    if (r->calls != n) {
        fail_msg("fn called %d times, want %d", r->calls, n);
    }
    for (int i = 0; i < n; i++) {
        NBT_STREQ(r->paths[i], want[i]);
    }
}

static void test_map_defaults(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *t = build_map_tree(ctx);
    map_rec r = {0};
    nb_tree *out = NULL;
    NBT_OK(ctx, nb_tree_map(t, cb_double, &r, 0, &out));
    expect_paths(&r, 4, (const char *[]){"a", "b[0]", "b[2]", "e[0]"});
    for (int i = 0; i < r.calls; i++) {
        NBT_EQ_I64(r.n[i], 1);
        NBT_EQ_I64(r.kinds[i][0], NB_TREE_KIND_ARRAY);
    }
    /* same structure, values doubled, nulls null, statics kept */
    NBT_TRUE(tseq(ctx, t, out));
    NBT_TRUE(!teq(ctx, t, out));
    const nb_array *a = nb_tree_get_array(at(ctx, out, "a"));
    NBT_EQ_I64(nb_array_dtype(a), NB_DTYPE_F32);
    NBT_EQ_F64(flat(ctx, a, 0), 2);
    NBT_EQ_F64(flat(ctx, a, 1), 4);
    const nb_array *b0 = nb_tree_get_array(at(ctx, out, "b[0]"));
    NBT_EQ_I64(nb_array_dtype(b0), NB_DTYPE_I32);
    NBT_EQ_F64(flat(ctx, b0, 1), 8);
    NBT_EQ_F64(flat(ctx, nb_tree_get_array(at(ctx, out, "b[2]")), 0), 10);
    NBT_EQ_F64(flat(ctx, nb_tree_get_array(at(ctx, out, "e[0]")), 0), 12);
    expect_kind(at(ctx, out, "b[1]"), NB_TREE_KIND_NULL);
    expect_kind(at(ctx, out, "d"), NB_TREE_KIND_NULL);
    int64_t iv = 0;
    NBT_OK(ctx, nb_tree_get_int(at(ctx, out, "c"), &iv));
    NBT_EQ_I64(iv, 1);
    /* the input is unchanged */
    NBT_EQ_F64(flat(ctx, nb_tree_get_array(at(ctx, t, "a")), 1), 2);

    /* the identity map gives an equal tree sharing the arrays */
    nb_tree *same = NULL;
    map_rec r2 = {0};
    NBT_OK(ctx, nb_tree_map(t, cb_identity, &r2, 0, &same));
    NBT_TRUE(teq(ctx, t, same));
    assert_ptr_equal(nb_tree_get_array(at(ctx, same, "b[2]")),
                     nb_tree_get_array(at(ctx, t, "b[2]")));

    nb_tree_destroy(same);
    nb_tree_destroy(out);
    nb_tree_destroy(t);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_map_flags(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *t = build_map_tree(ctx);
    nb_tree *out = NULL;
    int64_t iv = 0;
    const char *sv = NULL;

    map_rec r = {0};
    NBT_OK(ctx, nb_tree_map(t, cb_double, &r, NB_TREE_MAP_NULLS, &out));
    expect_paths(&r, 6, (const char *[]){"a", "b[0]", "b[1]", "b[2]", "d", "e[0]"});
    NBT_EQ_I64(r.kinds[2][0], NB_TREE_KIND_NULL);
    NBT_EQ_I64(r.kinds[4][0], NB_TREE_KIND_NULL);
    NBT_OK(ctx, nb_tree_get_int(at(ctx, out, "b[1]"), &iv));
    NBT_EQ_I64(iv, -1);
    NBT_OK(ctx, nb_tree_get_int(at(ctx, out, "d"), &iv));
    NBT_EQ_I64(iv, -1);
    NBT_OK(ctx, nb_tree_get_int(at(ctx, out, "c"), &iv)); /* static kept */
    NBT_EQ_I64(iv, 1);
    nb_tree_destroy(out);

    map_rec r2 = {0};
    NBT_OK(ctx, nb_tree_map(t, cb_double, &r2, NB_TREE_MAP_STATIC, &out));
    expect_paths(&r2, 5, (const char *[]){"a", "b[0]", "b[2]", "c", "e[0]"});
    NBT_EQ_I64(r2.kinds[3][0], NB_TREE_KIND_INT);
    NBT_OK(ctx, nb_tree_get_string(at(ctx, out, "c"), &sv));
    NBT_STREQ(sv, "visited");
    expect_kind(at(ctx, out, "d"), NB_TREE_KIND_NULL);
    nb_tree_destroy(out);

    map_rec r3 = {0};
    NBT_OK(ctx, nb_tree_map(t, cb_double, &r3, NB_TREE_MAP_NULLS | NB_TREE_MAP_STATIC, &out));
    expect_paths(&r3, 7, (const char *[]){"a", "b[0]", "b[1]", "b[2]", "c", "d", "e[0]"});
    nb_tree_destroy(out);

    nb_tree_destroy(t);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_map_subtree_and_root(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *t = build_map_tree(ctx);
    nb_tree *out = NULL;
    map_rec r = {0};
    NBT_OK(ctx, nb_tree_map(t, cb_pair, &r, 0, &out));
    NBT_EQ_I64(nb_tree_num_leaves(out), 8);
    expect_kind(at(ctx, out, "a"), NB_TREE_KIND_TUPLE);
    assert_ptr_equal(nb_tree_get_array(at(ctx, out, "a[0]")), nb_tree_get_array(at(ctx, t, "a")));
    assert_ptr_equal(nb_tree_get_array(at(ctx, out, "a[1]")), nb_tree_get_array(at(ctx, t, "a")));
    expect_kind(at(ctx, out, "b[2][1]"), NB_TREE_KIND_ARRAY);
    size_t need = 0;
    char buf[64];
    NBT_OK(ctx, nb_tree_leaf_path(out, 7, buf, sizeof buf, &need));
    NBT_STREQ(buf, "e[0][1]");
    nb_tree_destroy(out);
    nb_tree_destroy(t);

    /* a root leaf: path "" */
    t = aleaf(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){1.5, -1}, NULL);
    map_rec r2 = {0};
    NBT_OK(ctx, nb_tree_map(t, cb_double, &r2, 0, &out));
    expect_paths(&r2, 1, (const char *[]){""});
    NBT_EQ_F64(flat(ctx, nb_tree_get_array(out), 0), 3);
    nb_tree_destroy(out);
    nb_tree_destroy(t);

    /* no dynamic leaves: fn never called, structure kept */
    t = odict1(ctx, "k", olist(ctx, 2, (nb_tree *[]){tint(ctx, 1), tnull(ctx)}));
    map_rec r3 = {0};
    NBT_OK(ctx, nb_tree_map(t, cb_double, &r3, 0, &out));
    NBT_EQ_I64(r3.calls, 0);
    NBT_TRUE(teq(ctx, t, out));
    nb_tree_destroy(out);
    nb_tree_destroy(t);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_map_error_propagates(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *t = build_map_tree(ctx);

    /* with a message from nb_tree_map_fail, on the 3rd call (after two outputs exist) */
    map_rec r = {.fail_at = 3, .fail_with_msg = true};
    nb_tree *out = k_sentinel_tree;
    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_tree_map(t, cb_double, &r, 0, &out));
    assert_null(out);
    NBT_EQ_I64(r.calls, 3); /* stopped */
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_ERR_SHAPE);
    NBT_ERRMSG_HAS(ctx, "custom failure at b[2]");
    /* only t is alive: the partial outputs were released */
    nb_ctx_stats st;
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &st));
    NBT_EQ_I64(st.live_arrays, 4);

    /* without a message: nabla writes one naming the path */
    map_rec r2 = {.fail_at = 2, .fail_with_msg = false};
    out = k_sentinel_tree;
    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_tree_map(t, cb_double, &r2, 0, &out));
    assert_null(out);
    NBT_EQ_I64(r2.calls, 2);
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_ERR_INVALID);
    NBT_ERRMSG_HAS(ctx, "b[0]");

    /* map_n too */
    map_rec r3 = {.fail_at = 1, .fail_with_msg = true};
    out = k_sentinel_tree;
    NBT_STATUS(ctx, NB_ERR_SHAPE,
               nb_tree_map_n(2, (const nb_tree *const[]){t, t}, cb_double, &r3, 0, &out));
    assert_null(out);
    NBT_ERRMSG_HAS(ctx, "custom failure at a");

    nb_tree_destroy(t);
    nbt_assert_no_live(ctx);
    /* the context still works */
    t = build_map_tree(ctx);
    map_rec r4 = {0};
    NBT_OK(ctx, nb_tree_map(t, cb_double, &r4, 0, &out));
    nb_tree_destroy(out);
    nb_tree_destroy(t);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static nb_tree *f32v(nb_ctx *ctx, int64_t n, const double *vals) {
    return aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){n}, vals, NULL);
}

static void test_map_n(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const char *keys[5] = {"w", "b", "n", "z", "l"};
    nb_tree *p = odict(ctx, 5, keys,
                       (nb_tree *[]){f32v(ctx, 2, (double[]){1, 2}), f32v(ctx, 2, (double[]){3, 4}),
                                     tint(ctx, 3), tnull(ctx),
                                     olist(ctx, 1, (nb_tree *[]){f32v(ctx, 1, (double[]){5})})});
    nb_tree *g = odict(ctx, 5, keys,
                       (nb_tree *[]){f32v(ctx, 2, (double[]){10, 20}), tnull(ctx), tint(ctx, 3),
                                     f32v(ctx, 1, (double[]){7}),
                                     olist(ctx, 1, (nb_tree *[]){f32v(ctx, 1, (double[]){50})})});
    nb_tree *h = odict(ctx, 5, keys,
                       (nb_tree *[]){f32v(ctx, 2, (double[]){100, 200}),
                                     f32v(ctx, 2, (double[]){300, 400}), tstr(ctx, "x"), tnull(ctx),
                                     olist(ctx, 1, (nb_tree *[]){tint(ctx, 9)})});
    const nb_tree *const trees[3] = {p, g, h};

    map_rec r = {0};
    nb_tree *out = NULL;
    NBT_OK(ctx, nb_tree_map_n(3, trees, cb_sum, &r, 0, &out));
    expect_paths(&r, 3, (const char *[]){"w", "b", "l[0]"});
    NBT_EQ_I64(r.n[0], 3);
    NBT_EQ_I64(r.kinds[1][0], NB_TREE_KIND_ARRAY);
    NBT_EQ_I64(r.kinds[1][1], NB_TREE_KIND_NULL); /* the null in the second tree */
    NBT_EQ_I64(r.kinds[1][2], NB_TREE_KIND_ARRAY);
    NBT_EQ_I64(r.kinds[2][2], NB_TREE_KIND_INT);
    const nb_array *w = nb_tree_get_array(at(ctx, out, "w"));
    NBT_EQ_F64(flat(ctx, w, 0), 111);
    NBT_EQ_F64(flat(ctx, w, 1), 222);
    const nb_array *b = nb_tree_get_array(at(ctx, out, "b"));
    NBT_EQ_F64(flat(ctx, b, 0), 303);
    NBT_EQ_F64(flat(ctx, b, 1), 404);
    NBT_EQ_F64(flat(ctx, nb_tree_get_array(at(ctx, out, "l[0]")), 0), 55);
    int64_t iv = 0;
    NBT_OK(ctx, nb_tree_get_int(at(ctx, out, "n"), &iv)); /* statics from the first tree */
    NBT_EQ_I64(iv, 3);
    expect_kind(at(ctx, out, "z"), NB_TREE_KIND_NULL);
    NBT_TRUE(tseq(ctx, out, p));
    nb_tree_destroy(out);

    /* with NB_TREE_MAP_NULLS the null in the first tree is visited */
    map_rec r2 = {0};
    NBT_OK(ctx, nb_tree_map_n(2, trees, cb_sum, &r2, NB_TREE_MAP_NULLS, &out));
    expect_paths(&r2, 4, (const char *[]){"w", "b", "z", "l[0]"});
    NBT_EQ_I64(r2.n[2], 2);
    NBT_EQ_I64(r2.kinds[2][0], NB_TREE_KIND_NULL);
    NBT_EQ_I64(r2.kinds[2][1], NB_TREE_KIND_ARRAY);
    NBT_EQ_F64(flat(ctx, nb_tree_get_array(at(ctx, out, "z")), 0), 7);
    NBT_EQ_F64(flat(ctx, nb_tree_get_array(at(ctx, out, "b")), 1), 4);
    nb_tree_destroy(out);

    /* n == 1 is map */
    map_rec r3 = {0};
    NBT_OK(ctx, nb_tree_map_n(1, trees, cb_sum, &r3, 0, &out));
    NBT_EQ_I64(r3.calls, 3);
    NBT_TRUE(teq(ctx, out, p));
    nb_tree_destroy(out);

    nb_tree_destroy(p);
    nb_tree_destroy(g);
    nb_tree_destroy(h);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static nb_tree *layers_tree(nb_ctx *ctx, int variant) {
    /* base: dict{ layers: [ {w}, {w} ] } */
    nb_tree *l0 = variant == 4 ? odict1(ctx, "w", olist(ctx, 1, (nb_tree *[]){f32v(ctx, 1, NULL)}))
                               : odict1(ctx, "w", f32v(ctx, 1, NULL));
    nb_tree *l1;
    switch (variant) {
    case 1:
        l1 = odict1(ctx, "v", f32v(ctx, 1, NULL));
        break;
    case 3:
        l1 = tnull(ctx);
        break;
    default:
        l1 = odict1(ctx, "w", f32v(ctx, 1, NULL));
        break;
    }
    nb_tree *layers;
    if (variant == 2) {
        nb_tree_destroy(l1);
        layers = olist(ctx, 1, (nb_tree *[]){l0});
    } else if (variant == 5) {
        layers = otuple(ctx, 2, (nb_tree *[]){l0, l1});
    } else {
        layers = olist(ctx, 2, (nb_tree *[]){l0, l1});
    }
    return odict1(ctx, "layers", layers);
}

static void test_map_n_structure_mismatch(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *base = layers_tree(ctx, 0);
    /* variant -> a substring the message must contain */
    const char *where[6] = {NULL, "layers[1]", "layers", "layers[1]", "layers[0].w", "layers"};
    for (int v = 1; v <= 5; v++) {
        nb_tree *other = layers_tree(ctx, v);
        map_rec r = {0};
        nb_tree *out = k_sentinel_tree;
        nb_ctx_clear_error(ctx);
        nb_status s = nb_tree_map_n(2, (const nb_tree *const[]){base, other}, cb_sum, &r, 0, &out);
        if (s != NB_ERR_STRUCTURE) {
            fail_msg("variant %d: %s, wanted ERR_STRUCTURE\n  errmsg: %s", v, nb_status_name(s),
                     nb_ctx_errmsg(ctx));
        }
        assert_null(out);
        NBT_ERRMSG_HAS(ctx, where[v]);
        /* the other way round too: the second tree lacks the first's node structure */
        out = k_sentinel_tree;
        NBT_STATUS(ctx, NB_ERR_STRUCTURE,
                   nb_tree_map_n(2, (const nb_tree *const[]){other, base}, cb_sum, &r, 0, &out));
        assert_null(out);
        nb_tree_destroy(other);
    }
    /* a second tree that is a plain leaf at the root is a mismatch */
    nb_tree *leaf = tnull(ctx);
    nb_tree *out = k_sentinel_tree;
    map_rec r = {0};
    NBT_STATUS(ctx, NB_ERR_STRUCTURE,
               nb_tree_map_n(2, (const nb_tree *const[]){base, leaf}, cb_sum, &r, 0, &out));
    assert_null(out);
    nb_tree_destroy(leaf);
    nb_tree_destroy(base);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- filter / partition / combine --------------------------------------------------- */

/* dict{ a: f32[2], b: i32[2], c: int 5, d: null, e: f64[], f: "s", g: [], h: (f32[1], true) } */
static nb_tree *build_filter_tree(nb_ctx *ctx) {
    return odict(
        ctx, 8, (const char *[]){"a", "b", "c", "d", "e", "f", "g", "h"},
        (nb_tree *[]){
            aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, (double[]){1, 2}, NULL),
            aleaf(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, (double[]){3, 4}, NULL), tint(ctx, 5),
            tnull(ctx), aleaf(ctx, NB_DTYPE_F64, 0, NULL, (double[]){6}, NULL), tstr(ctx, "s"),
            olist(ctx, 0, NULL),
            otuple(ctx, 2,
                   (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){1}, (double[]){7}, NULL),
                                 tbool(ctx, true)})});
}

typedef struct pred_rec {
    int calls;
    int nulls;
} pred_rec;

static bool pred_is_int_leaf(void *ud, const nb_tree *leaf) {
    pred_rec *r = ud;
    r->calls++;
    if (nb_tree_kind_of(leaf) == NB_TREE_KIND_NULL || !nb_tree_is_leaf(leaf)) {
        r->nulls++;
    }
    return nb_tree_kind_of(leaf) == NB_TREE_KIND_INT;
}

static void test_filter(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *t = build_filter_tree(ctx);

    /* built-in predicates directly */
    NBT_TRUE(nb_tree_pred_is_array(NULL, at(ctx, t, "b")));
    NBT_TRUE(!nb_tree_pred_is_array(NULL, at(ctx, t, "c")));
    NBT_TRUE(nb_tree_pred_is_inexact_array(NULL, at(ctx, t, "a")));
    NBT_TRUE(nb_tree_pred_is_inexact_array(NULL, at(ctx, t, "e")));
    NBT_TRUE(!nb_tree_pred_is_inexact_array(NULL, at(ctx, t, "b")));
    NBT_TRUE(!nb_tree_pred_is_inexact_array(NULL, at(ctx, t, "f")));

    nb_tree *fa = NULL;
    NBT_OK(ctx, nb_tree_filter(t, nb_tree_pred_is_array, NULL, &fa));
    assert_ptr_equal(nb_tree_get_array(at(ctx, fa, "a")), nb_tree_get_array(at(ctx, t, "a")));
    assert_ptr_equal(nb_tree_get_array(at(ctx, fa, "b")), nb_tree_get_array(at(ctx, t, "b")));
    assert_ptr_equal(nb_tree_get_array(at(ctx, fa, "e")), nb_tree_get_array(at(ctx, t, "e")));
    assert_ptr_equal(nb_tree_get_array(at(ctx, fa, "h[0]")), nb_tree_get_array(at(ctx, t, "h[0]")));
    expect_kind(at(ctx, fa, "c"), NB_TREE_KIND_NULL);
    expect_kind(at(ctx, fa, "d"), NB_TREE_KIND_NULL);
    expect_kind(at(ctx, fa, "f"), NB_TREE_KIND_NULL);
    expect_kind(at(ctx, fa, "h[1]"), NB_TREE_KIND_NULL);
    expect_kind(at(ctx, fa, "g"), NB_TREE_KIND_LIST);
    NBT_EQ_I64(nb_tree_len(at(ctx, fa, "g")), 0);
    NBT_STREQ(nb_tree_key(fa, 7), "h");
    NBT_EQ_I64(nb_tree_num_leaves(fa), 4);

    nb_tree *fi = NULL;
    NBT_OK(ctx, nb_tree_filter(t, nb_tree_pred_is_inexact_array, NULL, &fi));
    expect_kind(at(ctx, fi, "a"), NB_TREE_KIND_ARRAY);
    expect_kind(at(ctx, fi, "b"), NB_TREE_KIND_NULL);
    expect_kind(at(ctx, fi, "c"), NB_TREE_KIND_NULL);
    expect_kind(at(ctx, fi, "e"), NB_TREE_KIND_ARRAY);
    expect_kind(at(ctx, fi, "h[0]"), NB_TREE_KIND_ARRAY);
    NBT_EQ_I64(nb_tree_num_leaves(fi), 3);

    /* a user predicate with ud: called on every non-null leaf, never on nulls or nodes */
    pred_rec pr = {0};
    nb_tree *fs = NULL;
    NBT_OK(ctx, nb_tree_filter(t, pred_is_int_leaf, &pr, &fs));
    NBT_EQ_I64(pr.calls, 7); /* a b c e f h[0] h[1] */
    NBT_EQ_I64(pr.nulls, 0);
    int64_t iv = 0;
    NBT_OK(ctx, nb_tree_get_int(at(ctx, fs, "c"), &iv));
    NBT_EQ_I64(iv, 5);
    NBT_EQ_I64(nb_tree_num_leaves(fs), 0);
    expect_kind(at(ctx, fs, "a"), NB_TREE_KIND_NULL);

    nb_tree_destroy(fa);
    nb_tree_destroy(fi);
    nb_tree_destroy(fs);
    nb_tree_destroy(t);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Arrays of trees are taken as nb_tree * or const nb_tree * (tree.h, nb_tree_items): the
 * accessors' const results go into a builder with no cast, and arrays of nb_tree * still
 * go in as before -- warning-free under -Wall -Wextra -Wpedantic -Werror (this file's
 * flags with NABLA_WERROR). Before, the const arrays were -Wincompatible-pointer-types. */
static int64_t n_leaf_cb_calls;
static nb_status keep_first_cb(void *ud, const char *path, int n, const nb_tree *const *leaves,
                               nb_tree **out) {
    (void)ud;
    (void)path;
    (void)n;
    n_leaf_cb_calls++;
    *out = nb_tree_retain((nb_tree *)leaves[0]);
    return NB_OK;
}

static void test_builders_take_const_items(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *a = tint(ctx, 1), *b = tstr(ctx, "b"), *pair = NULL;
    /* nb_tree *: a compound literal, an array, and nb_tree ** / nb_tree *const * pointers */
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){a, b}, &pair));
    nb_tree *arr[2] = {b, a};
    nb_tree **pm = arr;
    nb_tree *const *pmc = arr;
    nb_tree *l1 = NULL, *l2 = NULL, *l3 = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, 2, arr, &l1));
    NBT_OK(ctx, nb_tree_list(ctx, 2, pm, &l2));
    NBT_OK(ctx, nb_tree_list(ctx, 2, pmc, &l3));
    NBT_TRUE(teq(ctx, l1, l2) && teq(ctx, l2, l3));

    /* const nb_tree *: what the accessors return, straight into the builders */
    const nb_tree *x = nb_tree_child(pair, 0), *y = nb_tree_child(pair, 1);
    nb_tree *swapped = NULL, *dict = NULL, *list = NULL, *nested = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (const nb_tree *[]){y, x}, &swapped));
    NBT_EQ_I64(nb_tree_len(swapped), 2);
    assert_ptr_equal(nb_tree_child(swapped, 0), b); /* retained, not copied */
    assert_ptr_equal(nb_tree_child(swapped, 1), a);
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"x", "y"},
                             (const nb_tree *[]){nb_tree_child(pair, 0), y}, &dict));
    assert_ptr_equal(nb_tree_get(dict, "x"), a);
    assert_ptr_equal(nb_tree_get(dict, "y"), b);
    const nb_tree *carr[3] = {x, y, nb_tree_get(dict, "x")};
    const nb_tree **pc = carr;
    const nb_tree *const *pcc = carr;
    NBT_OK(ctx, nb_tree_list(ctx, 3, pc, &list));
    nb_tree_destroy(list);
    NBT_OK(ctx, nb_tree_list(ctx, 3, pcc, &list));
    NBT_EQ_I64(nb_tree_len(list), 3);
    /* mixed: a new tree beside a borrowed one */
    NBT_OK(ctx,
           nb_tree_tuple(ctx, 2, (const nb_tree *[]){swapped, nb_tree_get(dict, "y")}, &nested));
    const nb_tree *found = NULL;
    NBT_OK(ctx, nb_tree_lookup(nested, "[0][1]", &found));
    assert_ptr_equal(found, a);
    /* n 0 with NULL items, either spelling of NULL */
    nb_tree *empty = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 0, NULL, &empty));
    NBT_EQ_I64(nb_tree_len(empty), 0);
    nb_tree_destroy(empty);
    NBT_OK(ctx, nb_tree_list(ctx, 0, 0, &empty));
    nb_tree_destroy(empty);

    /* map_n and combine took const arrays already; arrays of nb_tree * now go in too */
    nb_tree *m = NULL, *c = NULL;
    n_leaf_cb_calls = 0;
    NBT_OK(ctx,
           nb_tree_map_n(2, (nb_tree *[]){l1, l2}, keep_first_cb, NULL, NB_TREE_MAP_STATIC, &m));
    NBT_EQ_I64(n_leaf_cb_calls, 2);
    NBT_TRUE(teq(ctx, m, l1));
    NBT_OK(ctx, nb_tree_combine(2, pm, &c)); /* nb_tree **: {b, a}, the first non-null */
    NBT_TRUE(teq(ctx, c, b));
    nb_tree_destroy(c);
    NBT_OK(ctx, nb_tree_combine(2, (const nb_tree *[]){x, y}, &c));
    NBT_TRUE(teq(ctx, c, a));
    nb_tree_destroy(c);

    /* the result outlives the tree its children were borrowed from */
    nb_tree_destroy(pair);
    NBT_EQ_I64(nb_tree_len(swapped), 2);
    nb_tree *ts[] = {a, b, l1, l2, l3, swapped, dict, list, nested, m};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        nb_tree_destroy(ts[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_partition_combine(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *t = build_filter_tree(ctx);
    nb_tree *m = NULL, *r = NULL;
    NBT_OK(ctx, nb_tree_partition(t, nb_tree_pred_is_inexact_array, NULL, &m, &r));
    expect_kind(at(ctx, m, "a"), NB_TREE_KIND_ARRAY);
    expect_kind(at(ctx, m, "b"), NB_TREE_KIND_NULL);
    expect_kind(at(ctx, m, "c"), NB_TREE_KIND_NULL);
    expect_kind(at(ctx, r, "a"), NB_TREE_KIND_NULL);
    expect_kind(at(ctx, r, "b"), NB_TREE_KIND_ARRAY);
    expect_kind(at(ctx, r, "c"), NB_TREE_KIND_INT);
    expect_kind(at(ctx, r, "f"), NB_TREE_KIND_STRING);
    expect_kind(at(ctx, r, "h[1]"), NB_TREE_KIND_BOOL);
    expect_kind(at(ctx, m, "d"), NB_TREE_KIND_NULL);
    expect_kind(at(ctx, r, "d"), NB_TREE_KIND_NULL);
    NBT_EQ_I64(nb_tree_num_leaves(m), 3);
    NBT_EQ_I64(nb_tree_num_leaves(r), 1);

    /* partition equals two filters */
    nb_tree *fm = NULL;
    NBT_OK(ctx, nb_tree_filter(t, nb_tree_pred_is_inexact_array, NULL, &fm));
    NBT_TRUE(teq(ctx, m, fm));
    nb_tree_destroy(fm);

    /* combine puts it back, in either order */
    nb_tree *c = NULL;
    NBT_OK(ctx, nb_tree_combine(2, (const nb_tree *const[]){m, r}, &c));
    NBT_TRUE(teq(ctx, c, t));
    NBT_TRUE(tseq(ctx, c, t));
    assert_ptr_equal(nb_tree_get_array(at(ctx, c, "a")), nb_tree_get_array(at(ctx, t, "a")));
    assert_ptr_equal(nb_tree_get_array(at(ctx, c, "b")), nb_tree_get_array(at(ctx, t, "b")));
    nb_tree_destroy(c);
    NBT_OK(ctx, nb_tree_combine(2, (const nb_tree *const[]){r, m}, &c));
    NBT_TRUE(teq(ctx, c, t));
    nb_tree_destroy(c);
    /* the first non-null wins */
    NBT_OK(ctx, nb_tree_combine(1, (const nb_tree *const[]){m}, &c));
    NBT_TRUE(teq(ctx, c, m));
    nb_tree_destroy(c);
    NBT_OK(ctx, nb_tree_combine(3, (const nb_tree *const[]){m, t, r}, &c));
    NBT_TRUE(teq(ctx, c, t));
    nb_tree_destroy(c);

    /* structure mismatch names the path */
    nb_tree *other = odict1(ctx, "a", tnull(ctx));
    c = k_sentinel_tree;
    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_tree_combine(2, (const nb_tree *const[]){m, other}, &c));
    assert_null(c);
    nb_tree_destroy(other);
    nb_tree *l0 = layers_tree(ctx, 0), *l1 = layers_tree(ctx, 1);
    c = k_sentinel_tree;
    nb_ctx_clear_error(ctx);
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_tree_combine(2, (const nb_tree *const[]){l0, l1}, &c));
    assert_null(c);
    NBT_ERRMSG_HAS(ctx, "layers[1]");
    nb_tree_destroy(l0);
    nb_tree_destroy(l1);

    nb_tree_destroy(m);
    nb_tree_destroy(r);
    nb_tree_destroy(t);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- equality and diff -------------------------------------------------------------- */

static void test_structure_equal_vs_equal(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const char *k[2] = {"x", "n"};
    nb_tree *a = odict(ctx, 2, k, (nb_tree *[]){f32v(ctx, 2, (double[]){1, 2}), tint(ctx, 1)});
    nb_tree *a2 = odict(ctx, 2, k, (nb_tree *[]){f32v(ctx, 2, (double[]){1, 2}), tint(ctx, 1)});
    nb_tree *bv = odict(ctx, 2, k, (nb_tree *[]){f32v(ctx, 2, (double[]){1, 3}), tint(ctx, 1)});
    nb_tree *bd =
        odict(ctx, 2, k,
              (nb_tree *[]){aleaf(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){1, 2}, NULL),
                            tint(ctx, 1)});
    nb_tree *bs =
        odict(ctx, 2, k,
              (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){1, 2}, (double[]){1, 2}, NULL),
                            tint(ctx, 1)});
    nb_tree *bn = odict(ctx, 2, k, (nb_tree *[]){f32v(ctx, 2, (double[]){1, 2}), tint(ctx, 2)});
    nb_tree *nan = odict(ctx, 2, k, (nb_tree *[]){f32v(ctx, 2, (double[]){NAN, 2}), tint(ctx, 1)});

    NBT_TRUE(tseq(ctx, a, a2));
    NBT_TRUE(teq(ctx, a, a2));
    NBT_TRUE(teq(ctx, a, a));
    NBT_TRUE(tseq(ctx, a, bv));
    NBT_TRUE(!teq(ctx, a, bv));
    NBT_TRUE(tseq(ctx, a, bd));
    NBT_TRUE(!teq(ctx, a, bd));
    NBT_TRUE(tseq(ctx, a, bs));
    NBT_TRUE(!teq(ctx, a, bs));
    NBT_TRUE(!tseq(ctx, a, bn));
    NBT_TRUE(!teq(ctx, a, bn));
    /* arrays are compared with nb_array_equal: NaN is not equal to itself */
    NBT_TRUE(tseq(ctx, nan, nan));
    NBT_TRUE(!teq(ctx, nan, nan));

    nb_tree *ts[] = {a, a2, bv, bd, bs, bn, nan};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        nb_tree_destroy(ts[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static char g_diff[1024];

/* Diff at level; returns the message ("" when no difference). */
static const char *diff(nb_ctx *ctx, const nb_tree *a, const nb_tree *b, nb_tree_diff_level lv,
                        bool want_differ) {
    bool differ = !want_differ;
    size_t need = 12345;
    memset(g_diff, 'X', sizeof g_diff);
    g_diff[sizeof g_diff - 1] = 0;
    NBT_OK(ctx, nb_tree_diff(a, b, lv, &differ, g_diff, sizeof g_diff, &need));
    if (differ != want_differ) {
        fail_msg("diff at level %d: differ = %d, want %d (buf \"%s\")", (int)lv, differ,
                 want_differ, g_diff);
    }
    NBT_EQ_I64(need, strlen(g_diff));
    return g_diff;
}

static void expect_diff_has(nb_ctx *ctx, const nb_tree *a, const nb_tree *b, nb_tree_diff_level lv,
                            const char *sub) {
    const char *m = diff(ctx, a, b, lv, true);
    if (strstr(m, sub) == NULL) {
        fail_msg("diff at level %d: \"%s\" does not contain \"%s\"", (int)lv, m, sub);
    }
}

static nb_tree *opt_state(nb_ctx *ctx, bool with_array) {
    nb_tree *w1 =
        with_array ? aleaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){256, 784}, NULL, NULL) : tnull(ctx);
    return odict1(ctx, "opt_state", odict1(ctx, "mu", odict1(ctx, "w1", w1)));
}

static nb_tree *int_list(nb_ctx *ctx, int n) {
    nb_tree *items[8];
    for (int i = 0; i < n; i++) {
        items[i] = tint(ctx, i);
    }
    return olist(ctx, n, items);
}

static void test_diff_pinned_messages(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    /* null vs array, at every level */
    nb_tree *a = opt_state(ctx, false), *b = opt_state(ctx, true);
    for (int lv = 0; lv <= 2; lv++) {
        NBT_STREQ(diff(ctx, a, b, (nb_tree_diff_level)lv, true),
                  "opt_state.mu.w1: null vs f32[256,784]");
    }
    NBT_STREQ(diff(ctx, b, a, NB_TREE_DIFF_STRUCTURE, true),
              "opt_state.mu.w1: f32[256,784] vs null");
    nb_tree_destroy(a);
    nb_tree_destroy(b);

    /* list lengths */
    a = odict1(ctx, "layers", int_list(ctx, 3));
    b = odict1(ctx, "layers", int_list(ctx, 4));
    NBT_STREQ(diff(ctx, a, b, NB_TREE_DIFF_STRUCTURE, true), "layers: list of 3 vs list of 4");
    NBT_STREQ(diff(ctx, a, b, NB_TREE_DIFF_VALUES, true), "layers: list of 3 vs list of 4");
    nb_tree_destroy(a);
    nb_tree_destroy(b);
    /* at the root */
    a = int_list(ctx, 3);
    b = int_list(ctx, 4);
    NBT_STREQ(diff(ctx, a, b, NB_TREE_DIFF_STRUCTURE, true), "<root>: list of 3 vs list of 4");
    nb_tree_destroy(a);
    nb_tree_destroy(b);

    /* function references */
    a = odict1(ctx, "act", tfn(ctx, FN_RELU, "relu"));
    b = odict1(ctx, "act", tfn(ctx, FN_TANH, "tanh"));
    NBT_STREQ(diff(ctx, a, b, NB_TREE_DIFF_STRUCTURE, true), "act: fn 'relu' vs fn 'tanh'");
    nb_tree_destroy(a);
    nb_tree_destroy(b);

    /* values */
    double va[6] = {0, 0, 0, 0, 0, 0.5}, vb[6] = {0, 0, 0, 0, 0, 0.25};
    a = odict1(ctx, "x", aleaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, va, NULL));
    b = odict1(ctx, "x", aleaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, vb, NULL));
    NBT_STREQ(diff(ctx, a, b, NB_TREE_DIFF_VALUES, true), "x: values differ at [1,2]: 0.5 vs 0.25");
    /* values are not looked at below the values level */
    NBT_STREQ(diff(ctx, a, b, NB_TREE_DIFF_SIGNATURE, false), "");
    NBT_STREQ(diff(ctx, a, b, NB_TREE_DIFF_STRUCTURE, false), "");
    nb_tree_destroy(a);
    nb_tree_destroy(b);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_diff_other_differences(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    /* dtype */
    nb_tree *a = odict1(ctx, "x", aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, NULL, NULL));
    nb_tree *b = odict1(ctx, "x", aleaf(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, NULL, NULL));
    NBT_STREQ(diff(ctx, a, b, NB_TREE_DIFF_STRUCTURE, false), "");
    expect_diff_has(ctx, a, b, NB_TREE_DIFF_SIGNATURE, "f32[2] vs f64[2]");
    expect_diff_has(ctx, a, b, NB_TREE_DIFF_SIGNATURE, "x");
    expect_diff_has(ctx, a, b, NB_TREE_DIFF_VALUES, "f32[2] vs f64[2]");
    nb_tree_destroy(a);
    nb_tree_destroy(b);

    /* shape */
    a = odict1(
        ctx, "y",
        olist(ctx, 1, (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, NULL, NULL)}));
    b = odict1(
        ctx, "y",
        olist(ctx, 1, (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){3, 2}, NULL, NULL)}));
    NBT_STREQ(diff(ctx, a, b, NB_TREE_DIFF_STRUCTURE, false), "");
    expect_diff_has(ctx, a, b, NB_TREE_DIFF_SIGNATURE, "f32[2,3] vs f32[3,2]");
    expect_diff_has(ctx, a, b, NB_TREE_DIFF_SIGNATURE, "y[0]");
    nb_tree_destroy(a);
    nb_tree_destroy(b);

    /* static int */
    a = odict1(ctx, "n", tint(ctx, 3));
    b = odict1(ctx, "n", tint(ctx, 4));
    const char *m = diff(ctx, a, b, NB_TREE_DIFF_STRUCTURE, true);
    NBT_TRUE(strncmp(m, "n: ", 3) == 0);
    NBT_TRUE(strchr(m, '3') != NULL && strchr(m, '4') != NULL);
    NBT_TRUE(strchr(m, '3') < strchr(m, '4'));
    nb_tree_destroy(a);
    nb_tree_destroy(b);

    /* dict keys */
    a = odict1(ctx, "alpha", tnull(ctx));
    b = odict1(ctx, "beta", tnull(ctx));
    m = diff(ctx, a, b, NB_TREE_DIFF_STRUCTURE, true);
    NBT_TRUE(strstr(m, "alpha") != NULL && strstr(m, "beta") != NULL);
    nb_tree_destroy(a);
    nb_tree_destroy(b);

    /* the first difference depth-first is reported */
    a = olist(ctx, 2,
              (nb_tree *[]){odict1(ctx, "p", tint(ctx, 1)), odict1(ctx, "q", tint(ctx, 1))});
    b = olist(ctx, 2,
              (nb_tree *[]){odict1(ctx, "p", tint(ctx, 2)), odict1(ctx, "q", tint(ctx, 2))});
    m = diff(ctx, a, b, NB_TREE_DIFF_STRUCTURE, true);
    NBT_TRUE(strncmp(m, "[0].p: ", 7) == 0);
    nb_tree_destroy(a);
    nb_tree_destroy(b);

    /* no difference: differ false, "" */
    full_tree f1 = build_full_tree(ctx), f2 = build_full_tree(ctx);
    for (int lv = 0; lv <= 2; lv++) {
        NBT_STREQ(diff(ctx, f1.root, f2.root, (nb_tree_diff_level)lv, false), "");
        NBT_STREQ(diff(ctx, f1.root, f1.root, (nb_tree_diff_level)lv, false), "");
    }
    nb_tree_destroy(f1.root);
    nb_tree_destroy(f2.root);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_diff_snprintf(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *a = odict1(ctx, "act", tfn(ctx, FN_RELU, "relu"));
    nb_tree *b = odict1(ctx, "act", tfn(ctx, FN_TANH, "tanh"));
    const char *full = "act: fn 'relu' vs fn 'tanh'";
    bool differ = false;
    size_t need = 0;
    char buf[64];
    memset(buf, 'X', sizeof buf);
    NBT_STATUS(ctx, NB_ERR_TRUNCATED,
               nb_tree_diff(a, b, NB_TREE_DIFF_STRUCTURE, &differ, buf, 4, &need));
    NBT_TRUE(differ);
    NBT_STREQ(buf, "act");
    NBT_EQ_I64(buf[4], 'X');
    NBT_EQ_I64(need, strlen(full));
    differ = false;
    NBT_STATUS(ctx, NB_ERR_TRUNCATED,
               nb_tree_diff(a, b, NB_TREE_DIFF_STRUCTURE, &differ, NULL, 0, &need));
    NBT_TRUE(differ);
    NBT_EQ_I64(need, strlen(full));
    NBT_OK(ctx, nb_tree_diff(a, b, NB_TREE_DIFF_STRUCTURE, &differ, buf, sizeof buf, NULL));
    NBT_STREQ(buf, full);
    nb_tree_destroy(a);
    nb_tree_destroy(b);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- printing ----------------------------------------------------------------------- */

static nb_tree *build_print_tree(nb_ctx *ctx) {
    nb_tree *layer =
        odict(ctx, 2, (const char *[]){"weight", "bias"},
              (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){32, 2}, NULL, NULL),
                            aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){32}, NULL, NULL)});
    nb_tree *layer2 = odict(
        ctx, 2, (const char *[]){"weight", "bias"},
        (nb_tree *[]){aleaf(ctx, NB_DTYPE_F64, 2, (int64_t[]){1, 32}, NULL, NULL), tnull(ctx)});
    return odict(ctx, 4, (const char *[]){"layers", "act", "n", "w-1"},
                 (nb_tree *[]){olist(ctx, 2, (nb_tree *[]){layer, layer2}),
                               tfn(ctx, FN_RELU, "relu"), tint(ctx, 3),
                               aleaf(ctx, NB_DTYPE_I32, 0, NULL, NULL, NULL)});
}

static void test_format_and_fprint(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *t = build_print_tree(ctx);
    static char buf[8192];
    size_t need = 0;
    NBT_OK(ctx, nb_tree_format(t, buf, sizeof buf, &need));
    NBT_EQ_I64(need, strlen(buf));
    const char *subs[] = {"dict", "list",    "layers",    "weight", "f32[32,2]",
                          "bias", "f32[32]", "f64[1,32]", "null",   "relu",
                          "act",  "i32[]",   "w-1",       "[0]",    "[1]"};
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        if (strstr(buf, subs[i]) == NULL) {
            fail_msg("nb_tree_format output lacks \"%s\":\n%s", subs[i], buf);
        }
    }
    /* values are not shown */
    NBT_TRUE(strstr(buf, "array(") == NULL);
    NBT_TRUE(strchr(buf, '\n') != NULL);

    /* snprintf contract */
    size_t need0 = 0;
    NBT_STATUS(ctx, NB_ERR_TRUNCATED, nb_tree_format(t, NULL, 0, &need0));
    NBT_EQ_I64(need0, need);
    char small[8];
    memset(small, 'X', sizeof small);
    NBT_STATUS(ctx, NB_ERR_TRUNCATED, nb_tree_format(t, small, 5, NULL));
    NBT_EQ_I64(small[4], 0);
    NBT_TRUE(strncmp(small, buf, 4) == 0);

    /* fprint writes the same text */
    FILE *f = tmpfile();
    assert_non_null(f);
    NBT_OK(ctx, nb_tree_fprint(t, f));
    const char *got = slurp(f);
    NBT_TRUE(strncmp(got, buf, strlen(buf)) == 0);
    NBT_TRUE(strcmp(got + strlen(buf), "") == 0 || strcmp(got + strlen(buf), "\n") == 0);

    nb_tree_destroy(t);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_fprint_leaves(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *t = build_print_tree(ctx);
    FILE *f = tmpfile();
    assert_non_null(f);
    NBT_OK(ctx, nb_tree_fprint_leaves(t, f));
    NBT_STREQ(slurp(f), "layers[0].weight: f32[32,2]\n"
                        "layers[0].bias: f32[32]\n"
                        "layers[1].weight: f64[1,32]\n"
                        "[\"w-1\"]: i32[]\n");
    nb_tree_destroy(t);

    /* the README example */
    t = odict(ctx, 3, (const char *[]){"weight", "bias", "act"},
              (nb_tree *[]){aleaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){32, 2}, NULL, NULL),
                            aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){32}, NULL, NULL),
                            tfn(ctx, FN_TANH, "tanh")});
    f = tmpfile();
    assert_non_null(f);
    NBT_OK(ctx, nb_tree_fprint_leaves(t, f));
    NBT_STREQ(slurp(f), "weight: f32[32,2]\nbias: f32[32]\n");
    nb_tree_destroy(t);

    /* a root leaf prints as <root> */
    t = aleaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, NULL, NULL);
    f = tmpfile();
    assert_non_null(f);
    NBT_OK(ctx, nb_tree_fprint_leaves(t, f));
    NBT_STREQ(slurp(f), "<root>: f32[2]\n");
    nb_tree_destroy(t);

    /* no leaves: nothing */
    t = odict1(ctx, "n", tint(ctx, 1));
    f = tmpfile();
    assert_non_null(f);
    NBT_OK(ctx, nb_tree_fprint_leaves(t, f));
    NBT_STREQ(slurp(f), "");
    nb_tree_destroy(t);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kind_names),
        cmocka_unit_test(test_build_leaves),
        cmocka_unit_test(test_build_nodes),
        cmocka_unit_test(test_static_getter_kind_errors),
        cmocka_unit_test(test_dict_errors),
        cmocka_unit_test(test_refcounts),
        cmocka_unit_test(test_leaf_paths),
        cmocka_unit_test(test_leaf_path_errors_and_snprintf),
        cmocka_unit_test(test_lookup),
        cmocka_unit_test(test_lookup_stray_bracket_is_malformed),
        cmocka_unit_test(test_flatten_unflatten_round_trip),
        cmocka_unit_test(test_flatten_edge_cases),
        cmocka_unit_test(test_unflatten_wrong_count),
        cmocka_unit_test(test_unflatten_any_leaves),
        cmocka_unit_test(test_treedef_equal_by_value),
        cmocka_unit_test(test_treedef_not_equal),
        cmocka_unit_test(test_treedef_format),
        cmocka_unit_test(test_map_defaults),
        cmocka_unit_test(test_map_flags),
        cmocka_unit_test(test_map_subtree_and_root),
        cmocka_unit_test(test_map_error_propagates),
        cmocka_unit_test(test_map_n),
        cmocka_unit_test(test_map_n_structure_mismatch),
        cmocka_unit_test(test_filter),
        cmocka_unit_test(test_builders_take_const_items),
        cmocka_unit_test(test_partition_combine),
        cmocka_unit_test(test_structure_equal_vs_equal),
        cmocka_unit_test(test_diff_pinned_messages),
        cmocka_unit_test(test_diff_other_differences),
        cmocka_unit_test(test_diff_snprintf),
        cmocka_unit_test(test_format_and_fprint),
        cmocka_unit_test(test_fprint_leaves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
