/*
 * test_random.c -- Threefry-2x32 keys against Random123's published known-answer vectors
 * and against JAX 0.10's own outputs (tests/core/oracle/jax_random.txt, made by
 * gen_jax_random.py beside it), plus misuse.
 */
#include "nbtest.h"

#include "core/internal.h"

#include <math.h>
#include <nabla/random.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef NBT_ORACLE_DIR
#define NBT_ORACLE_DIR "tests/core/oracle"
#endif

/* The words of the oracle line `name` (up to cap of them); their count. */
static int oracle_words(const char *name, uint32_t *w, int cap) {
    FILE *f = fopen(NBT_ORACLE_DIR "/jax_random.txt", "r");
    if (f == NULL) {
        fail_msg("cannot open %s/jax_random.txt", NBT_ORACLE_DIR);
    }
    char line[1024];
    int n = -1;
    size_t len = strlen(name);
    while (n < 0 && fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, name, len) != 0 || line[len] != ' ') {
            continue;
        }
        n = 0;
        char *p = line + len, *end = NULL;
        for (unsigned long v = strtoul(p, &end, 16); end != p && n < cap;
             p = end, v = strtoul(p, &end, 16)) {
            w[n++] = (uint32_t)v;
        }
    }
    fclose(f);
    if (n <= 0) {
        fail_msg("no oracle line %s", name);
    }
    return n;
}

static void assert_words(const nb_array *a, const char *name) {
    uint32_t want[64];
    int n = oracle_words(name, want, 64);
    NBT_EQ_I64((int64_t)nb_array_nbytes(a), (int64_t)n * 4);
    const uint32_t *got = nb_array_data(a);
    for (int i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            fail_msg("%s: word %d is %08x, JAX gives %08x", name, i, got[i], want[i]);
        }
    }
}

/* Random123's kat_vectors for threefry2x32 with 20 rounds: (counter, key) -> block. */
static void test_threefry_known_answers(void **state) {
    (void)state;
    const struct {
        uint32_t ctr[2], key[2], out[2];
    } kat[] = {
        {{0, 0}, {0, 0}, {0x6b200159u, 0x99ba4efeu}},
        {{0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}, {0x1cb996fcu, 0xbb002be7u}},
        {{0x243f6a88u, 0x85a308d3u}, {0x13198a2eu, 0x03707344u}, {0xc4923a9cu, 0x483df7a0u}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t y0 = 0, y1 = 0;
        nbi_threefry2x32(kat[i].key[0], kat[i].key[1], kat[i].ctr[0], kat[i].ctr[1], &y0, &y1);
        if (y0 != kat[i].out[0] || y1 != kat[i].out[1]) {
            fail_msg("vector %d: %08x %08x, Random123 gives %08x %08x", (int)i, y0, y1,
                     kat[i].out[0], kat[i].out[1]);
        }
    }
}

/* JAX's PRNGKey, split, fold_in, bits and uniform (f32, f64), word for word. */
static void test_jax_oracle(void **state) {
    (void)state;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(NULL, &ctx));
    nb_array *k0 = NULL, *k42 = NULL, *a = NULL;
    const uint64_t seeds[] = {0, 1, 42, 4294967303ull};
    const char *names[] = {"key_0", "key_1", "key_42", "key_4294967303"};
    for (int i = 0; i < 4; i++) {
        NBT_OK(ctx, nb_random_key(ctx, seeds[i], &a));
        assert_words(a, names[i]);
        nb_array_destroy(a);
    }
    NBT_OK(ctx, nb_random_key(ctx, 0, &k0));
    NBT_OK(ctx, nb_random_key(ctx, 42, &k42));
    NBT_OK(ctx, nb_random_split(k0, 2, &a));
    assert_words(a, "split_0_2");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_split(k0, 5, &a));
    assert_words(a, "split_0_5");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_split(k42, 3, &a));
    assert_words(a, "split_42_3");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_fold_in(k0, 7, &a));
    assert_words(a, "fold_in_0_7");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_fold_in(k42, 123456, &a));
    assert_words(a, "fold_in_42_123456");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_bits(k0, 1, (int64_t[]){10}, &a));
    assert_words(a, "bits32_0_10");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_bits(k42, 2, (int64_t[]){2, 3}, &a));
    assert_words(a, "bits32_42_2x3");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_uniform(k42, NB_DTYPE_F32, 1, (int64_t[]){7}, 0, 1, &a));
    assert_words(a, "uniform_f32_42_7");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_uniform(k0, NB_DTYPE_F32, 1, (int64_t[]){5}, -2, 3, &a));
    assert_words(a, "uniform_f32_0_5_m2_3");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_uniform(k42, NB_DTYPE_F64, 1, (int64_t[]){4}, 0, 1, &a));
    assert_words(a, "uniform_f64_42_4");
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_bernoulli(k42, 0.3, 1, (int64_t[]){16}, &a));
    uint32_t want[16];
    NBT_EQ_I64(oracle_words("bernoulli_42_p03_16", want, 16), 16);
    for (int i = 0; i < 16; i++) {
        NBT_EQ_I64(((const uint8_t *)nb_array_data(a))[i], want[i]);
    }
    nb_array_destroy(a);
    /* normal: JAX's erfinv is XLA's own polynomial; ours is refined to double accuracy,
     * so the f32 values agree to a few ULP and the f64 ones to 1e-13 */
    NBT_OK(ctx, nb_random_normal(k42, NB_DTYPE_F32, 1, (int64_t[]){8}, &a));
    NBT_EQ_I64(oracle_words("normal_f32_42_8", want, 16), 8);
    for (int i = 0; i < 8; i++) {
        float w;
        memcpy(&w, &want[i], sizeof w);
        double got = ((const float *)nb_array_data(a))[i];
        NBT_NEAR(got, w, 4e-7 * fabs(w) + 1e-9);
    }
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_normal(k0, NB_DTYPE_F64, 1, (int64_t[]){4}, &a));
    NBT_EQ_I64(oracle_words("normal_f64_0_4", want, 16), 8);
    for (int i = 0; i < 4; i++) {
        uint64_t bits = ((uint64_t)want[2 * i + 1] << 32) | want[2 * i];
        double w;
        memcpy(&w, &bits, sizeof w);
        NBT_NEAR(((const double *)nb_array_data(a))[i], w, 1e-13 * fabs(w));
    }
    nb_array_destroy(a);
    NBT_OK(ctx, nb_random_truncated_normal(k42, NB_DTYPE_F64, -2, 1, 1, (int64_t[]){6}, &a));
    NBT_EQ_I64(oracle_words("truncated_normal_f64_42_m2_1_6", want, 16), 12);
    for (int i = 0; i < 6; i++) {
        uint64_t bits = ((uint64_t)want[2 * i + 1] << 32) | want[2 * i];
        double w, got = ((const double *)nb_array_data(a))[i];
        memcpy(&w, &bits, sizeof w);
        NBT_NEAR(got, w, 1e-12 * fabs(w) + 1e-15);
        NBT_TRUE(got > -2 && got < 1);
    }
    nb_array_destroy(a);
    const struct {
        nb_array *key;
        int64_t n;
        const char *name;
    } perms[] = {{k42, 10, "permutation_42_10"}, {k0, 37, "permutation_0_37"}};
    for (int c = 0; c < 2; c++) {
        NBT_OK(ctx, nb_random_permutation(perms[c].key, perms[c].n, &a));
        uint32_t pw[64];
        NBT_EQ_I64(oracle_words(perms[c].name, pw, 64), perms[c].n);
        for (int64_t i = 0; i < perms[c].n; i++) {
            NBT_EQ_I64(((const int64_t *)nb_array_data(a))[i], (int64_t)pw[i]);
        }
        nb_array_destroy(a);
    }
    nb_array_destroy(k42);
    nb_array_destroy(k0);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Bad keys, counts, dtypes and bounds: an error status, a message naming the call and the
 * fix, *out NULL, and nothing leaked. */
static void test_random_misuse(void **state) {
    (void)state;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(NULL, &ctx));
    nb_array *bad = NULL, *k = NULL, *out = (nb_array *)&out;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, &bad));
    NBT_OK(ctx, nb_random_key(ctx, 3, &k));
    NBT_EQ_I64(nb_random_split(bad, 2, &out), NB_ERR_SHAPE);
    NBT_TRUE(out == NULL);
    NBT_TRUE(strstr(nb_ctx_errmsg(ctx), "nb_random_split: a key is an i32[2] array, got "
                                        "f32[2]") != NULL);
    NBT_EQ_I64(nb_random_split(k, 0, &out), NB_ERR_INVALID);
    NBT_EQ_I64(nb_random_uniform(k, NB_DTYPE_I32, 0, NULL, 0, 1, &out), NB_ERR_INVALID);
    NBT_EQ_I64(nb_random_uniform(k, NB_DTYPE_F32, 0, NULL, 1, 1, &out), NB_ERR_INVALID);
    NBT_TRUE(strstr(nb_ctx_errmsg(ctx), "lo < hi") != NULL);
    NBT_EQ_I64(nb_random_bits(k, 1, (int64_t[]){-1}, &out), NB_ERR_SHAPE);
    NBT_TRUE(out == NULL);
    NBT_EQ_I64(nb_random_fold_in(NULL, 1, &out), NB_ERR_MISUSE);
    NBT_EQ_I64(nb_random_fold_in(k, 1, NULL), NB_ERR_MISUSE);
    NBT_EQ_I64(nb_random_key(NULL, 1, &out), NB_ERR_MISUSE);
    NBT_EQ_I64(nb_random_bernoulli(k, 1.5, 0, NULL, &out), NB_ERR_INVALID);
    NBT_TRUE(strstr(nb_ctx_errmsg(ctx), "a probability is in [0, 1]") != NULL);
    NBT_EQ_I64(nb_random_normal(k, NB_DTYPE_I64, 0, NULL, &out), NB_ERR_INVALID);
    NBT_EQ_I64(nb_random_permutation(k, -1, &out), NB_ERR_INVALID);
    NBT_EQ_I64(nb_random_truncated_normal(k, NB_DTYPE_F32, 1, 1, 0, NULL, &out), NB_ERR_INVALID);
    NBT_TRUE(out == NULL);
    nb_array_destroy(k);
    nb_array_destroy(bad);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threefry_known_answers),
        cmocka_unit_test(test_jax_oracle),
        cmocka_unit_test(test_random_misuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
