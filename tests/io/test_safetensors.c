/*
 * test_safetensors.c -- pytrees on disk (nabla/io.h): bit-identical round trips of nested
 * trees with every dtype, rank 0, empty arrays, nulls, static and frozen leaves; loading
 * into a template (and the errors that name the path); files from an independent writer
 * (bytes built here by hand); hostile files rejected with NB_ERR_FORMAT, never a crash;
 * writes that fail part-way (a write hook returning ENOSPC) leave the old file intact and
 * no temporary file behind; allocation failures.
 */
#define _POSIX_C_SOURCE 200809L

#include "nbtest.h"

#include "core/internal.h"

#include <nabla/nabla.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef NBT_ORACLE_DIR
#define NBT_ORACLE_DIR "tests/io/oracle"
#endif

static char g_dir[256];

static void make_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nbt_st_XXXXXX");
    assert_non_null(mkdtemp(g_dir));
}

static void remove_dir(void) {
    DIR *d = opendir(g_dir);
    if (d != NULL) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
                unlink(p);
            }
        }
        closedir(d);
    }
    rmdir(g_dir);
}

static int count_files(void) {
    DIR *d = opendir(g_dir);
    int n = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        n += e->d_name[0] != '.';
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

static nb_tree *arr_leaf(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape, int seed) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, dt, rank, shape, &a));
    int64_t n = nb_array_size(a);
    for (int64_t i = 0; i < n; i++) {
        double v = (double)((i * 7 + seed * 13) % 23) - 11.5;
        switch (dt) {
        case NB_DTYPE_F32:
            ((float *)nb_array_data(a))[i] = (float)v / 3.0f;
            break;
        case NB_DTYPE_F64:
            ((double *)nb_array_data(a))[i] = v / 3.0;
            break;
        case NB_DTYPE_I32:
            ((int32_t *)nb_array_data(a))[i] = (int32_t)(v * 1000);
            break;
        case NB_DTYPE_I64:
            ((int64_t *)nb_array_data(a))[i] = (int64_t)(v * 1e12);
            break;
        default:
            ((unsigned char *)nb_array_data(a))[i] = (unsigned char)(i % 3 == 0);
            break;
        }
    }
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

static nb_tree *take_dict(nb_ctx *ctx, int n, const char *const *keys, nb_tree **items) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, n, keys, items, &t));
    for (int i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    return t;
}

/* dict(layers=[dict(weight, bias), dict(weight, bias, frozen)], scale=f64[], steps=i64[],
 *      mask=bool[2,3], ids=i32[0,3], cube=f32[2,2,2], meta=(int, float, bool, string, null),
 *      "odd key \"q\"\n"=f32[1]) */
static nb_tree *sample_tree(nb_ctx *ctx) {
    nb_tree *l0 = take_dict(ctx, 2, (const char *[]){"weight", "bias"},
                            (nb_tree *[]){arr_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){3, 2}, 1),
                                          arr_leaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, 2)});
    nb_tree *w1 = arr_leaf(ctx, NB_DTYPE_F64, 2, (int64_t[]){2, 3}, 3), *fw1 = NULL;
    NBT_OK(ctx, nb_tree_freeze(w1, &fw1));
    nb_tree_destroy(w1);
    nb_tree *n1 = NULL;
    NBT_OK(ctx, nb_tree_null(ctx, &n1));
    nb_tree *l1 = take_dict(ctx, 2, (const char *[]){"weight", "bias"}, (nb_tree *[]){fw1, n1});
    nb_tree *layers = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, 2, (nb_tree *[]){l0, l1}, &layers));
    nb_tree_destroy(l0);
    nb_tree_destroy(l1);
    nb_tree *m[5];
    NBT_OK(ctx, nb_tree_int(ctx, -123456789012345LL, &m[0]));
    NBT_OK(ctx, nb_tree_float(ctx, -0.1, &m[1]));
    NBT_OK(ctx, nb_tree_bool(ctx, true, &m[2]));
    NBT_OK(ctx, nb_tree_string(ctx, "relu \"x\" \\ \xc3\xa9 (5:) N", &m[3]));
    NBT_OK(ctx, nb_tree_null(ctx, &m[4]));
    nb_tree *meta = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 5, m, &meta));
    for (int i = 0; i < 5; i++) {
        nb_tree_destroy(m[i]);
    }
    return take_dict(ctx, 8,
                     (const char *[]){"layers", "scale", "steps", "mask", "ids", "cube", "meta",
                                      "odd key \"q\"\n"},
                     (nb_tree *[]){layers, arr_leaf(ctx, NB_DTYPE_F64, 0, NULL, 4),
                                   arr_leaf(ctx, NB_DTYPE_I64, 0, NULL, 5),
                                   arr_leaf(ctx, NB_DTYPE_BOOL, 2, (int64_t[]){2, 3}, 6),
                                   arr_leaf(ctx, NB_DTYPE_I32, 2, (int64_t[]){0, 3}, 7),
                                   arr_leaf(ctx, NB_DTYPE_F32, 3, (int64_t[]){2, 2, 2}, 8), meta,
                                   arr_leaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){1}, 9)});
}

static void assert_same_tree(nb_ctx *ctx, const nb_tree *a, const nb_tree *b) {
    bool differ = true;
    char msg[512];
    NBT_OK(ctx, nb_tree_diff(a, b, NB_TREE_DIFF_VALUES, &differ, msg, sizeof msg, NULL));
    if (differ) {
        fail_msg("trees differ: %s", msg);
    }
    /* frozen marks are part of the structure */
    nb_treedef *da = NULL, *db = NULL;
    NBT_OK(ctx, nb_tree_treedef(a, &da));
    NBT_OK(ctx, nb_tree_treedef(b, &db));
    NBT_TRUE(nb_treedef_equal(da, db));
    nb_treedef_destroy(da);
    nb_treedef_destroy(db);
}

static void test_round_trip(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    make_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", g_dir);
    nb_tree *t = sample_tree(ctx), *back = NULL;
    NBT_OK(ctx, nb_save(t, path));
    NBT_OK(ctx, nb_load(ctx, path, &back));
    assert_same_tree(ctx, t, back);
    const nb_tree *fz = NULL;
    NBT_OK(ctx, nb_tree_lookup(back, "layers[1].weight", &fz));
    NBT_TRUE(nb_tree_is_frozen(fz));
    /* the same bytes again: a deterministic writer */
    char path2[512];
    snprintf(path2, sizeof path2, "%s/again.safetensors", g_dir);
    NBT_OK(ctx, nb_save(back, path2));
    FILE *f1 = fopen(path, "rb"), *f2 = fopen(path2, "rb");
    int c1, c2;
    do {
        c1 = fgetc(f1);
        c2 = fgetc(f2);
        NBT_EQ_I64(c1, c2);
    } while (c1 != EOF);
    fclose(f1);
    fclose(f2);
    NBT_EQ_I64(count_files(), 2); /* no temporary files left */
    /* into a template: the template's structure with the file's arrays */
    nb_tree *into = NULL;
    NBT_OK(ctx, nb_load_into(t, path, &into));
    assert_same_tree(ctx, t, into);
    nb_tree_destroy(into);
    nb_tree_destroy(back);
    nb_tree_destroy(t);
    remove_dir();
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_template_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    make_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/m.safetensors", g_dir);
    nb_tree *t = sample_tree(ctx), *out = NULL;
    NBT_OK(ctx, nb_save(t, path));
    /* another shape at layers.0.bias */
    nb_tree *l0 = take_dict(ctx, 2, (const char *[]){"weight", "bias"},
                            (nb_tree *[]){arr_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){3, 2}, 1),
                                          arr_leaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){4}, 2)});
    nb_tree *lst = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, 1, &l0, &lst));
    nb_tree_destroy(l0);
    nb_tree *tmpl = take_dict(ctx, 1, (const char *[]){"layers"}, &lst);
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_load_into(tmpl, path, &out));
    NBT_ERRMSG_HAS(ctx, "tensor 'layers.0.bias' is f32[3] where the template has f32[4]");
    assert_null(out);
    nb_tree_destroy(tmpl);
    /* a tensor the file does not hold */
    nb_tree *x = arr_leaf(ctx, NB_DTYPE_F64, 0, NULL, 1);
    tmpl = take_dict(ctx, 1, (const char *[]){"momentum"}, &x);
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_load_into(tmpl, path, &out));
    NBT_ERRMSG_HAS(ctx, "holds no tensor 'momentum' for the template's f64[] at that path");
    nb_tree_destroy(tmpl);
    /* a missing file */
    NBT_STATUS(ctx, NB_ERR_IO, nb_load(ctx, "/nonexistent/dir/x.safetensors", &out));
    NBT_ERRMSG_HAS(ctx, "cannot open /nonexistent/dir/x.safetensors: No such file");
    /* an unwritable place: NB_ERR_IO, nothing written */
    NBT_STATUS(ctx, NB_ERR_IO, nb_save(t, "/nonexistent/dir/x.safetensors"));
    NBT_ERRMSG_HAS(ctx, "cannot create a temporary file beside /nonexistent/dir/x.safetensors");
    nb_tree_destroy(t);
    remove_dir();
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- an independent writer: the format's bytes built by hand ----------------------------- */

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

static void test_foreign_file(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    unsigned char buf[1024];
    /* b: i64[2] first in the data, a: f32[2,2] after it, keys out of order, metadata */
    unsigned char data[16 + 16];
    int64_t bv[2] = {-5, 1LL << 40};
    float av[4] = {1.5f, -2.25f, 0.0f, 3e-38f};
    memcpy(data, bv, 16);
    memcpy(data + 16, av, 16);
    size_t n = put_file(buf,
                        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,32]},"
                        "\"__metadata__\":{\"format\":\"pt\"},"
                        " \"b\" : {\"shape\":[2],\"dtype\":\"I64\",\"data_offsets\":[0,16]}}  ",
                        data, sizeof data);
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_load_bytes(ctx, buf, n, "foreign", &t));
    NBT_EQ_I64(nb_tree_len(t), 2);
    NBT_STREQ(nb_tree_key(t, 0), "a");
    NBT_STREQ(nb_tree_key(t, 1), "b");
    nb_array *a = nb_tree_get_array(nb_tree_get(t, "a")),
             *b = nb_tree_get_array(nb_tree_get(t, "b"));
    NBT_EQ_I64(nb_array_dtype(a), NB_DTYPE_F32);
    NBT_EQ_I64(nb_array_shape(a)[1], 2);
    NBT_TRUE(memcmp(nb_array_data(a), av, 16) == 0);
    NBT_TRUE(memcmp(nb_array_data(b), bv, 16) == 0);
    nb_tree_destroy(t);
    /* no tensors at all */
    n = put_file(buf, "{}", NULL, 0);
    NBT_OK(ctx, nb_load_bytes(ctx, buf, n, "empty", &t));
    NBT_EQ_I64(nb_tree_len(t), 0);
    nb_tree_destroy(t);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- hostile input ------------------------------------------------------------------------ */

static void test_hostile(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const struct {
        const char *header;
        size_t ndata;
        const char *msg;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, "expected '}'"},
        {"[]", 0, "expected '{'"},
        {"{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "dtype 'F16'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
         "expected a non-negative integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
         "overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8,
         "lie outside the 8 bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "lie outside"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "need 12"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "tensors overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
         12, "a gap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
         "cover 4 of the 8 bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "two tensors named 'a'"},
        {"{\"__metadata__\":{\"x\":1}}", 0, "not a string"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
         "more than 8 dims"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":[]}}", 4,
         "unknown or repeated key 'x'"},
        {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "unknown or repeated key 'dtype'"},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "lacks dtype"},
        {"{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "invalid UTF-8"},
        {"{\"a\\u0000\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "a NUL character"},
        {"{\"a\":{\"dtype\":\"BOOL\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
         "is BOOL but byte 1 is 2"},
        {"{\"__metadata__\":{\"nabla.tree\":\"D1(1:aA\"},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
         4, "a node not closed"},
        {"{\"__metadata__\":{\"nabla.tree\":\"D1(1:bA)\"},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
         4, "the tree names tensor 'b', which the file does not hold"},
        {"{\"__metadata__\":{\"nabla.tree\":\"L99999999999(\"}}", 0, "a bad node"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4,
         "bytes after the header"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4,
         "expected a non-negative integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "not a fraction"},
        /* found by fuzz_safetensors: these were NB_ERR_INVALID and NB_ERR_KIND */
        {"{\"__metadata__\":{\"nabla.tree\":\"D2(1:aN1:aN)\"}}", 0, "a dict holding a key twice"},
        {"{\"__metadata__\":{\"nabla.tree\":\"!L1(N)\"}}", 0, "only leaves freeze"},
    };
    unsigned char buf[2048], data[64];
    memset(data, 0, sizeof data);
    data[1] = 2; /* the BOOL case */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = put_file(buf, cases[c].header, data, cases[c].ndata);
        nb_tree *t = NULL;
        nb_status st = nb_load_bytes(ctx, buf, n, "hostile", &t);
        if (st != NB_ERR_FORMAT || strstr(nb_ctx_errmsg(ctx), cases[c].msg) == NULL) {
            fail_msg("case %zu (%s): status %s, message '%s', expected '%s'", c, cases[c].header,
                     nb_status_name(st), nb_ctx_errmsg(ctx), cases[c].msg);
        }
        assert_null(t);
    }
    /* lengths: too short, header longer than the file, header over the limit */
    nb_tree *t = NULL;
    NBT_STATUS(ctx, NB_ERR_FORMAT, nb_load_bytes(ctx, buf, 7, "short", &t));
    unsigned char big[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
    NBT_STATUS(ctx, NB_ERR_FORMAT, nb_load_bytes(ctx, big, sizeof big, "big", &t));
    NBT_ERRMSG_HAS(ctx, "more than the 100000000 allowed");
    unsigned char lie[16] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    NBT_STATUS(ctx, NB_ERR_FORMAT, nb_load_bytes(ctx, lie, 10, "lie", &t));
    NBT_ERRMSG_HAS(ctx, "the header claims 100 bytes but the file has 2");
    /* every truncation of a valid file is rejected cleanly */
    make_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/v.safetensors", g_dir);
    nb_tree *s = sample_tree(ctx);
    NBT_OK(ctx, nb_save(s, path));
    nb_tree_destroy(s);
    FILE *f = fopen(path, "rb");
    static unsigned char whole[1 << 16];
    size_t len = fread(whole, 1, sizeof whole, f);
    fclose(f);
    NBT_TRUE(len > 100 && len < sizeof whole);
    for (size_t k = 0; k < len; k++) {
        nb_status st = nb_load_bytes(ctx, whole, k, "truncated", &t);
        NBT_TRUE(st == NB_ERR_FORMAT);
        assert_null(t);
    }
    /* and every single flipped byte of the header either loads or fails cleanly */
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--) {
        h = (h << 8) | whole[i];
    }
    for (size_t k = 0; k < 8 + h; k++) {
        unsigned char keep = whole[k];
        whole[k] ^= 0x5a;
        nb_status st = nb_load_bytes(ctx, whole, len, "flipped", &t);
        NBT_TRUE(st == NB_OK || st == NB_ERR_FORMAT);
        nb_tree_destroy(t);
        t = NULL;
        whole[k] = keep;
    }
    remove_dir();
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- many keys -------------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A dict of 80000 null leaves (found by fuzz_safetensors: the duplicate-key check was
 * pairwise and took 14 s); loads in well under a second now, and a key repeated at the end
 * is found and named with both positions. */
static void test_many_keys(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    enum { N = 80000 };
    size_t cap = 64 + (size_t)N * 12;
    char *hdr = malloc(cap);
    char *enc = malloc(cap);
    unsigned char *buf = malloc(cap + 16);
    NBT_TRUE(hdr != NULL && enc != NULL && buf != NULL);
    for (int dup = 0; dup < 2; dup++) {
        size_t m = (size_t)snprintf(enc, cap, "D%d(", N);
        for (int i = 0; i < N; i++) {
            char k[16];
            int kl = snprintf(k, sizeof k, "%x", dup && i == N - 1 ? 7 : i);
            m += (size_t)snprintf(enc + m, cap - m, "%d:%sN", kl, k);
        }
        snprintf(enc + m, cap - m, ")");
        snprintf(hdr, cap, "{\"__metadata__\":{\"nabla.tree\":\"%s\"}}", enc);
        size_t n = put_file(buf, hdr, NULL, 0);
        nb_tree *t = NULL;
        double t0 = now_s();
        nb_status st = nb_load_bytes(ctx, buf, n, "many", &t);
        double secs = now_s() - t0;
        print_message("%d keys%s: %s in %.3f s\n", N, dup ? " (one twice)" : "", nb_status_name(st),
                      secs);
        if (dup) {
            NBT_STATUS(ctx, NB_ERR_FORMAT, st);
            NBT_ERRMSG_HAS(ctx, "a dict holding a key twice");
            assert_null(t);
        } else {
            NBT_OK(ctx, st);
            NBT_TRUE(nb_tree_kind_of(t) == NB_TREE_KIND_DICT && nb_tree_len(t) == N);
            nb_tree_destroy(t);
        }
        NBT_TRUE(secs < 5.0); /* pairwise: 14 s in a release build */
    }
    /* nb_tree_dict itself names both positions of a key twice among many */
    nb_tree *leaf = NULL;
    NBT_OK(ctx, nb_tree_null(ctx, &leaf));
    enum { M = 100 };
    nb_tree *items[M];
    char names[M][8];
    const char *keys[M];
    for (int i = 0; i < M; i++) {
        snprintf(names[i], sizeof names[i], "k%d", i);
        keys[i] = names[i];
        items[i] = leaf;
    }
    keys[90] = "k40";
    keys[95] = "k3";
    nb_tree *d = NULL;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_tree_dict(ctx, M, keys, items, &d));
    NBT_ERRMSG_HAS(ctx, "key \"k40\" appears twice (positions 40 and 90)");
    keys[90] = "k90";
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_tree_dict(ctx, M, keys, items, &d));
    NBT_ERRMSG_HAS(ctx, "key \"k3\" appears twice (positions 3 and 95)");
    keys[95] = "k95";
    NBT_OK(ctx, nb_tree_dict(ctx, M, keys, items, &d));
    nb_tree_destroy(d);
    nb_tree_destroy(leaf);
    free(hdr);
    free(enc);
    free(buf);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- the oracle corpus: the official writer's fixture, 75 hostile and valid files -------- */

static unsigned char *read_all(const char *path, size_t *n) {
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

/* official_mixed.safetensors (safetensors 0.8.0's writer) against its value lines */
static void test_official_fixture(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_load(ctx, NBT_ORACLE_DIR "/official_mixed.safetensors", &t));
    FILE *f = fopen(NBT_ORACLE_DIR "/official_mixed.txt", "r");
    assert_non_null(f);
    char line[512], name[128], val[128];
    long long idx = 0;
    int values = 0, tensors = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "value %127s %lld %127s", name, &idx, val) == 3) {
            nb_array *a = nb_tree_get_array(nb_tree_get(t, name));
            assert_non_null(a);
            double want = strtod(val, NULL), got = nbi_array_load(a, (int64_t)idx);
            bool same = isnan(want) ? isnan(got)
                        : nb_array_dtype(a) == NB_DTYPE_I64
                            ? ((const int64_t *)nb_array_data(a))[idx] == strtoll(val, NULL, 10)
                            : got == want && signbit(got) == signbit(want);
            if (!same) {
                fail_msg("%s[%lld]: %.17g, the fixture says %s", name, idx, got, val);
            }
            values++;
        } else if (line[0] != '#' && line[0] != '\n' && strncmp(line, "metadata", 8) != 0) {
            char dt[16], shape[64];
            if (sscanf(line, "%127s %15s %63s", name, dt, shape) == 3) {
                nb_array *a = nb_tree_get_array(nb_tree_get(t, name));
                assert_non_null(a);
                NBT_STREQ(nb_dtype_name(nb_array_dtype(a)), strcmp(dt, "BOOL") == 0  ? "bool"
                                                            : strcmp(dt, "F32") == 0 ? "f32"
                                                            : strcmp(dt, "F64") == 0 ? "f64"
                                                            : strcmp(dt, "I32") == 0 ? "i32"
                                                                                     : "i64");
                tensors++;
            }
        }
    }
    fclose(f);
    print_message("the official writer's fixture: %d tensors, %d values equal\n", tensors, values);
    NBT_EQ_I64(tensors, nb_tree_len(t));
    NBT_TRUE(values >= 90);
    nb_tree_destroy(t);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* every hostile file rejected cleanly (NB_ERR_FORMAT), every valid_* file loaded */
static void test_hostile_corpus(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    DIR *d = opendir(NBT_ORACLE_DIR "/hostile");
    assert_non_null(d);
    struct dirent *e;
    int rejected = 0, accepted = 0;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 12 || strcmp(e->d_name + l - 12, ".safetensors") != 0) {
            continue;
        }
        char path[512];
        snprintf(path, sizeof path, "%s/hostile/%s", NBT_ORACLE_DIR, e->d_name);
        size_t n = 0;
        unsigned char *b = read_all(path, &n);
        nb_tree *t = NULL, *t2 = NULL;
        nb_status st = nb_load_bytes(ctx, b, n, e->d_name, &t);
        nb_status st2 = nb_load(ctx, path, &t2); /* the file reader: the same verdict */
        bool valid = strncmp(e->d_name, "valid_", 6) == 0;
        if (valid ? st != NB_OK : st != NB_ERR_FORMAT) {
            fail_msg("%s: %s (%s)", e->d_name, nb_status_name(st), nb_ctx_errmsg(ctx));
        }
        NBT_EQ_I64(st2, st);
        if (valid) {
            bool eq = false;
            NBT_OK(ctx, nb_tree_equal(t, t2, &eq));
            NBT_TRUE(eq);
        }
        accepted += st == NB_OK;
        rejected += st != NB_OK;
        nb_tree_destroy(t);
        nb_tree_destroy(t2);
        free(b);
    }
    closedir(d);
    print_message("hostile corpus: %d files rejected with NB_ERR_FORMAT, %d valid files loaded\n",
                  rejected, accepted);
    NBT_TRUE(rejected >= 60 && accepted >= 10);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- writes that fail part-way: the old file survives ------------------------------------ */

typedef struct fail_after {
    long budget; /* bytes that may still be written */
    int calls;
} fail_after;

static long failing_write(void *ud, int fd, const void *buf, size_t n) {
    fail_after *f = ud;
    f->calls++;
    if (f->budget <= 0) {
        errno = ENOSPC;
        return -1;
    }
    size_t k = n < (size_t)f->budget ? n : (size_t)f->budget;
    long w = (long)write(fd, buf, k);
    if (w > 0) {
        f->budget -= w;
    }
    return w;
}

static void test_failed_writes(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    make_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", g_dir);
    nb_tree *old = sample_tree(ctx), *neu = NULL;
    NBT_OK(ctx, nb_save(old, path));
    /* a different tree to overwrite it with */
    nb_tree *x = arr_leaf(ctx, NB_DTYPE_F64, 1, (int64_t[]){300}, 42);
    neu = take_dict(ctx, 1, (const char *[]){"other"}, &x);
    long total = 0;
    {
        char p2[512];
        snprintf(p2, sizeof p2, "%s/size.safetensors", g_dir);
        NBT_OK(ctx, nb_save(neu, p2));
        FILE *f = fopen(p2, "rb");
        fseek(f, 0, SEEK_END);
        total = ftell(f);
        fclose(f);
        unlink(p2);
    }
    int points = 0;
    for (long budget = 0; budget < total; budget += budget < 64 ? 1 : 97) {
        fail_after fa = {budget, 0};
        NBT_OK(ctx, nb_ctx_set_write_hook(ctx, failing_write, &fa));
        NBT_STATUS(ctx, NB_ERR_IO, nb_save(neu, path));
        NBT_ERRMSG_HAS(ctx, "No space left on device (the old file is untouched)");
        NBT_OK(ctx, nb_ctx_set_write_hook(ctx, NULL, NULL));
        nb_tree *back = NULL;
        NBT_OK(ctx, nb_load(ctx, path, &back));
        assert_same_tree(ctx, old, back);
        nb_tree_destroy(back);
        NBT_EQ_I64(count_files(), 1); /* the temporary file is gone */
        points++;
    }
    print_message(
        "failed writes: %d failure points of a %ld-byte file, old file intact each time\n", points,
        total);
    /* and with room, the new file replaces the old */
    NBT_OK(ctx, nb_save(neu, path));
    nb_tree *back = NULL;
    NBT_OK(ctx, nb_load(ctx, path, &back));
    assert_same_tree(ctx, neu, back);
    nb_tree_destroy(back);
    nb_tree_destroy(neu);
    nb_tree_destroy(old);
    remove_dir();
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- an independent reader: Python's standard library ----------------------------------- */

/* tests/io/oracle/st_read.py validates the file strictly and prints one line per tensor,
 * "<name> <dtype> <shape: comma list, or 'scalar'> <sha256>" (spaces, backslashes and
 * control characters in names as \xHH), then "metadata <k> <v>" lines.
 * Skipped (with a message) where /usr/bin/python3 is missing. */
static void test_python_reader(void **state) {
    (void)state;
    if (access("/usr/bin/python3", X_OK) != 0 || access(NBT_ORACLE_DIR "/st_read.py", R_OK) != 0) {
        print_message("skipped: no /usr/bin/python3 or st_read.py\n");
        return;
    }
    nb_ctx *ctx = nbt_ctx();
    make_dir();
    char path[512], cmd[1024];
    snprintf(path, sizeof path, "%s/py.safetensors", g_dir);
    nb_tree *t = sample_tree(ctx);
    NBT_OK(ctx, nb_save(t, path));
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/st_read.py %s", NBT_ORACLE_DIR, path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    /* the expected tensors: every array leaf under its dotted path */
    static const struct {
        const char *name, *dtype, *shape;
    } want[] = {
        {"cube", "F32", "2,2,2"},
        {"ids", "I32", "0,3"},
        {"layers.0.bias", "F32", "3"},
        {"layers.0.weight", "F32", "3,2"},
        {"layers.1.weight", "F64", "2,3"},
        {"mask", "BOOL", "2,3"},
        {"odd\\x20key\\x20\"q\"\\x0a", "F32", "1"},
        {"scale", "F64", "scalar"},
        {"steps", "I64", "scalar"},
    };
    char line[4096];
    int n = 0, meta = 0;
    while (fgets(line, sizeof line, p) != NULL) {
        if (strncmp(line, "metadata ", 9) == 0) {
            meta += strncmp(line, "metadata format nabla", 21) == 0;
            continue;
        }
        bool found = false;
        for (size_t i = 0; i < sizeof want / sizeof want[0] && !found; i++) {
            char expect[256];
            snprintf(expect, sizeof expect, "%s %s %s ", want[i].name, want[i].dtype,
                     want[i].shape);
            found = strncmp(line, expect, strlen(expect)) == 0;
        }
        n += found;
        if (!found) {
            print_message("st_read.py: %s", line);
        }
    }
    int rc = pclose(p);
    print_message("Python's standard-library reader accepted nabla's file: %d of %zu tensors "
                  "matched by name, dtype and shape\n",
                  n, sizeof want / sizeof want[0]);
    NBT_EQ_I64(rc, 0);
    NBT_EQ_I64(meta, 1);
    NBT_EQ_I64(n, (int64_t)(sizeof want / sizeof want[0]));
    nb_tree_destroy(t);
    remove_dir();
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- allocation failures ------------------------------------------------------------------ */

static nb_status scenario_io(nb_ctx *ctx) {
    char path[512];
    snprintf(path, sizeof path, "%s/oom.safetensors", g_dir);
    nb_array *a = NULL;
    nb_tree *l = NULL, *t = NULL, *back = NULL, *into = NULL;
    nb_status st = nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, &a);
    if (st == NB_OK) {
        st = nb_tree_array(a, &l);
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 1, (const char *[]){"w"}, &l, &t);
    }
    if (st == NB_OK) {
        st = nb_save(t, path);
    }
    if (st == NB_OK) {
        st = nb_load(ctx, path, &back);
    }
    if (st == NB_OK) {
        st = nb_load_into(t, path, &into);
    }
    nb_tree_destroy(into);
    nb_tree_destroy(back);
    nb_tree_destroy(t);
    nb_tree_destroy(l);
    nb_array_destroy(a);
    return st;
}

static void test_out_of_memory(void **state) {
    (void)state;
    make_dir();
    int points = nbt_oom_sweep("scenario_io", scenario_io, false, false);
    print_message("allocation failures: %d points\n", points);
    assert_true(points > 20);
    remove_dir();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),     cmocka_unit_test(test_template_errors),
        cmocka_unit_test(test_foreign_file),   cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_many_keys),      cmocka_unit_test(test_official_fixture),
        cmocka_unit_test(test_hostile_corpus), cmocka_unit_test(test_failed_writes),
        cmocka_unit_test(test_python_reader),  cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
