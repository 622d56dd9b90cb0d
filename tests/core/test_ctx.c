/*
 * test_ctx.c -- the context: creation options, allocator accounting, errors, logging,
 * status strings, cleanup of leaked objects.
 */
#include "nbtest.h"

static void test_version(void **state) {
    (void)state;
    NBT_STREQ(nb_version(), NB_VERSION_STRING);
    NBT_EQ_I64(nb_version_number(), NB_VERSION_NUMBER);
    char expect[32];
    snprintf(expect, sizeof expect, "%d.%d.%d", NB_VERSION_MAJOR, NB_VERSION_MINOR,
             NB_VERSION_PATCH);
    NBT_STREQ(nb_version(), expect);
}

static void test_build_info(void **state) {
    (void)state;
    size_t need = 0;
    NBT_STATUS(NULL, NB_ERR_TRUNCATED, nb_build_info(NULL, 0, &need));
    NBT_TRUE(need > 20);
    char buf[512];
    NBT_OK(NULL, nb_build_info(buf, sizeof buf, NULL));
    NBT_EQ_I64(strlen(buf), need);
    NBT_TRUE(strncmp(buf, "nabla " NB_VERSION_STRING ";", strlen("nabla " NB_VERSION_STRING ";")) ==
             0);
    NBT_TRUE(strstr(buf, "BLIS ") != NULL);
    NBT_TRUE(strstr(buf, ", single-threaded)") != NULL || strstr(buf, ", OpenMP)") != NULL ||
             strstr(buf, ", pthreads)") != NULL);
    NBT_TRUE(strstr(buf, "SLEEF 3.") != NULL);
    NBT_TRUE(strstr(buf, "self-check: ok") != NULL);
    char small[8];
    NBT_STATUS(NULL, NB_ERR_TRUNCATED, nb_build_info(small, sizeof small, NULL));
    NBT_STREQ(small, "nabla 0");
    NBT_STATUS(NULL, NB_ERR_MISUSE, nb_build_info(NULL, 4, NULL));
}

static void test_status_strings(void **state) {
    (void)state;
    /* Every listed status has a distinct name and a description; unknown values say so. */
    const nb_status all[] = {
#define NBT_ST_(name, value, desc) NB_##name,
        NB_STATUS_LIST(NBT_ST_)
#undef NBT_ST_
    };
    size_t n = sizeof all / sizeof all[0];
    NBT_TRUE(n >= 13);
    for (size_t i = 0; i < n; i++) {
        NBT_TRUE(strcmp(nb_status_name(all[i]), "UNKNOWN") != 0);
        NBT_TRUE(strcmp(nb_status_string(all[i]), "unknown status") != 0);
        for (size_t j = 0; j < i; j++) {
            NBT_TRUE(all[i] != all[j]);
            NBT_TRUE(strcmp(nb_status_name(all[i]), nb_status_name(all[j])) != 0);
        }
    }
    NBT_STREQ(nb_status_name(NB_ERR_OOM), "ERR_OOM");
    NBT_STREQ(nb_status_string(NB_ERR_OOM), "out of memory");
    NBT_STREQ(nb_status_name(NB_OK), "OK");
    NBT_STREQ(nb_status_name((nb_status)12345), "UNKNOWN");
    NBT_STREQ(nb_status_string((nb_status)-999), "unknown status");
    NBT_EQ_I64(NB_OK, 0);
    NBT_TRUE(NB_ERR_MISUSE < 0 && NB_ERR_OOM < 0);
}

static void test_opts_and_threads(void **state) {
    (void)state;
    nb_ctx_opts o = nb_ctx_opts_default();
    NBT_TRUE(o.allocator.alloc != NULL && o.allocator.free != NULL);
    NBT_TRUE(o.log == NULL);
    NBT_EQ_I64(o.n_threads, 0);
    NBT_EQ_I64(o.log_level, NB_LOG_LEVEL_WARN);

    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(&o, &ctx));
    NBT_TRUE(nb_ctx_n_threads(ctx) >= 1);
    nb_ctx_destroy(ctx);

    o.n_threads = 3;
    NBT_OK(NULL, nb_ctx_create(&o, &ctx));
    NBT_EQ_I64(nb_ctx_n_threads(ctx), 3);
    nb_ctx_destroy(ctx);

    o.n_threads = -1;
    ctx = (nb_ctx *)&o; /* must be reset to NULL on failure */
    NBT_STATUS(NULL, NB_ERR_INVALID, nb_ctx_create(&o, &ctx));
    NBT_TRUE(ctx == NULL);
    o.n_threads = 0;
    o.log_level = (nb_log_level)9;
    NBT_STATUS(NULL, NB_ERR_INVALID, nb_ctx_create(&o, &ctx));
    NBT_STATUS(NULL, NB_ERR_MISUSE, nb_ctx_create(NULL, NULL));
    NBT_EQ_I64(nb_ctx_n_threads(NULL), 0);
    nb_ctx_destroy(NULL); /* no-op */
}

static void test_allocator_accounting(void **state) {
    (void)state;
    nbt_alloc st = {0};
    nb_ctx *ctx = nbt_ctx_with(&st);
    NBT_TRUE(st.n_live >= 1); /* the context itself */
    nb_ctx_stats s0;
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &s0));
    NBT_EQ_I64(s0.bytes_in_use, st.live_bytes);

    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){100, 100}, &a));
    nb_ctx_stats s1;
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &s1));
    NBT_TRUE(s1.bytes_in_use >= s0.bytes_in_use + 80000);
    NBT_EQ_I64(s1.bytes_in_use, st.live_bytes);
    NBT_EQ_I64(s1.live_arrays, 1);
    NBT_EQ_I64(s1.live_buffers, 1);
    NBT_TRUE(s1.n_allocs > s0.n_allocs);
    nb_array_destroy(a);
    nb_ctx_stats s2;
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &s2));
    NBT_EQ_I64(s2.live_arrays, 0);
    NBT_EQ_I64(s2.live_buffers, 0);
    NBT_TRUE(s2.bytes_peak >= s1.bytes_in_use);
    NBT_EQ_I64(s2.bytes_in_use, st.live_bytes);
    nb_ctx_destroy(ctx);
    NBT_EQ_I64(st.n_live, 0);
    NBT_EQ_I64(st.live_bytes, 0);
}

/* The default allocator keeps a freed block of 1 MiB or more and gives it to the next
 * allocation of its size (not to a much smaller one): a large array made again in a loop
 * lands where the last one was, and its bytes are still counted as freed. */
static void test_default_allocator_reuses_large_blocks(void **state) {
    (void)state;
    nb_ctx *ctx = NULL;
    NBT_TRUE(nb_ctx_create(NULL, &ctx) == NB_OK);
    nb_array *a = NULL, *b = NULL, *c = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){1 << 20}, &a));
    const void *pa = nb_array_data(a);
    for (int i = 0; i < 1 << 20; i++) {
        ((float *)nb_array_data(a))[i] = 1.0f; /* not zeros: the reuse must clear it */
    }
    nb_ctx_stats s0, s1;
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &s0));
    nb_array_destroy(a);
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &s1));
    NBT_TRUE(s1.bytes_in_use + ((size_t)4 << 20) <= s0.bytes_in_use);
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){1 << 20}, &b));
    NBT_TRUE(nb_array_data(b) == pa); /* the kept block */
    for (int i = 0; i < 1 << 20; i += 4099) {
        NBT_TRUE(((const float *)nb_array_data(b))[i] == 0.0f);
    }
    nb_array_destroy(b);
    /* a quarter of the size: not that block (it would hold 3 MiB unused) */
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){1 << 18}, &c));
    NBT_TRUE(nb_array_data(c) != pa);
    nb_array_destroy(c);
    nb_ctx_destroy(ctx);
}

/* The context frees what the user forgot: arrays (with shared buffers), trees, treedefs. */
static void test_destroy_frees_leaked_objects(void **state) {
    (void)state;
    nbt_alloc st = {0};
    nb_ctx *ctx = nbt_ctx_with(&st);
    nb_array *a = NULL, *view = NULL;
    nb_tree *leaf = NULL, *s = NULL, *d = NULL, *leaves = NULL;
    nb_treedef *def = NULL;
    NBT_OK(ctx, nb_array_ones(ctx, NB_DTYPE_F32, 1, (int64_t[]){6}, &a));
    NBT_OK(ctx, nb_array_reshape(a, 2, (int64_t[]){2, 3}, &view));
    NBT_OK(ctx, nb_tree_array(view, &leaf));
    NBT_OK(ctx, nb_tree_string(ctx, "a static string", &s));
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"w", "name"}, (nb_tree *[]){leaf, s}, &d));
    NBT_OK(ctx, nb_tree_flatten(d, &leaves, &def));
    for (int i = 0; i < 200; i++) { /* more than one slab of objects */
        nb_tree *x = NULL;
        NBT_OK(ctx, nb_tree_int(ctx, i, &x));
    }
    nb_ctx_destroy(ctx);
    NBT_EQ_I64(st.n_live, 0);
    NBT_EQ_I64(st.live_bytes, 0);
}

static void test_errors_and_clear(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    NBT_STREQ(nb_ctx_errmsg(ctx), "");
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_OK);
    nb_array *a = NULL;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){3, -2}, &a));
    NBT_TRUE(a == NULL);
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_ERR_SHAPE);
    NBT_ERRMSG_HAS(ctx, "nb_array_zeros");
    NBT_ERRMSG_HAS(ctx, "-2");
    nb_ctx_clear_error(ctx);
    NBT_STREQ(nb_ctx_errmsg(ctx), "");
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_OK);
    nb_ctx_clear_error(NULL);
    NBT_EQ_I64(nb_ctx_errcode(NULL), NB_ERR_MISUSE);
    NBT_TRUE(strstr(nb_ctx_errmsg(NULL), "NULL context") != NULL);

    /* A very long message is cut to the fixed buffer and marked, not overflowed. */
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 0, NULL, NULL, &t));
    char path[3000];
    memset(path, 'k', sizeof path - 1);
    path[sizeof path - 1] = '\0';
    path[0] = 'a';
    path[1500] = '.';
    const nb_tree *found = NULL;
    NBT_STATUS(ctx, NB_ERR_NOT_FOUND, nb_tree_lookup(t, path, &found));
    size_t len = strlen(nb_ctx_errmsg(ctx));
    NBT_TRUE(len < 1024);
    NBT_TRUE(len > 1000);
    NBT_STREQ(nb_ctx_errmsg(ctx) + len - 3, "...");
    nb_tree_destroy(t);

    /* Two contexts are independent. */
    nb_ctx *other = nbt_ctx();
    NBT_EQ_I64(nb_ctx_errcode(other), NB_OK);
    NBT_STREQ(nb_ctx_errmsg(other), "");
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(other);
    nb_ctx_destroy(ctx);
}

typedef struct log_rec {
    int n;
    nb_log_level last_level;
    char last[1024];
} log_rec;

static void log_cb(void *ud, nb_log_level level, const char *msg) {
    log_rec *r = ud;
    r->n++;
    r->last_level = level;
    snprintf(r->last, sizeof r->last, "%s", msg);
}

static void test_log_callback(void **state) {
    (void)state;
    log_rec rec = {0};
    nb_ctx_opts o = nb_ctx_opts_default();
    o.log = log_cb;
    o.log_ud = &rec;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(&o, &ctx));
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){4}, &a));
    NBT_EQ_I64(rec.n, 0); /* success logs nothing at WARN */
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_set(a, (int64_t[]){4}, 1.0));
    NBT_EQ_I64(rec.n, 1);
    NBT_EQ_I64(rec.last_level, NB_LOG_LEVEL_ERROR);
    NBT_STREQ(rec.last, nb_ctx_errmsg(ctx));
    NBT_TRUE(strstr(rec.last, "nb_array_set") != NULL);
    nb_array_destroy(a);
    nb_ctx_destroy(ctx);
}

/* nb_ctx_alloc / nb_ctx_free: the context's allocator for libraries built on nabla --
 * counted in the stats, aligned as asked, misuse refused with a message. */
static void test_ctx_alloc(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_ctx_stats s0, s1;
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &s0));
    char *p = nb_ctx_alloc(ctx, 1000, 256);
    NBT_TRUE(p != NULL && ((uintptr_t)p & 255) == 0);
    memset(p, 7, 1000);
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &s1));
    NBT_EQ_I64((int64_t)(s1.bytes_in_use - s0.bytes_in_use), 1000);
    NBT_EQ_I64(s1.n_allocs - s0.n_allocs, 1);
    nb_ctx_free(ctx, p, 1000);
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &s1));
    NBT_EQ_I64((int64_t)s1.bytes_in_use, (int64_t)s0.bytes_in_use);
    NBT_TRUE(nb_ctx_alloc(ctx, 0, 8) == NULL);
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_ERR_MISUSE);
    NBT_ERRMSG_HAS(ctx, "nb_ctx_alloc: size 0, align 8");
    NBT_TRUE(nb_ctx_alloc(ctx, 16, 24) == NULL);
    NBT_ERRMSG_HAS(ctx, "align a power of two at most 4096");
    NBT_TRUE(nb_ctx_alloc(ctx, 16, 8192) == NULL);
    nb_ctx_free(ctx, NULL, 16); /* a no-op */
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_ctx_alloc),
        cmocka_unit_test(test_build_info),
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_opts_and_threads),
        cmocka_unit_test(test_allocator_accounting),
        cmocka_unit_test(test_default_allocator_reuses_large_blocks),
        cmocka_unit_test(test_destroy_frees_leaked_objects),
        cmocka_unit_test(test_errors_and_clear),
        cmocka_unit_test(test_log_callback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
