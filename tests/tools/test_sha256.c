/*
 * test_sha256.c -- tools/sha256.c against the FIPS 180-4 example vectors (NIST CAVP's
 * "SHA256ShortMsg"-style examples: "", "abc", the 448- and 896-bit messages, one million
 * 'a'), digests of 'a' * n around the padding boundaries (from Python's hashlib.sha256, see
 * each table), split invariance for every length 0..300, and, when /usr/bin/sha256sum
 * exists, random files against its output.
 */
#include "nbtest.h"

#include "sha256.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

/* A small deterministic generator (splitmix64) for messages and piece sizes. */
static uint64_t t_rand_next(uint64_t *s) {
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static void t_digest_hex(const void *msg, size_t n, char hex[65]) {
    sha256_ctx c;
    uint8_t d[32];
    sha256_init(&c);
    sha256_update(&c, msg, n);
    sha256_final(&c, d);
    sha256_hex(d, hex);
}

/* The digest of msg fed in pieces of random sizes in [0, max_piece] (zero-length pieces
 * included on purpose). */
static void t_digest_pieces(const uint8_t *msg, size_t n, size_t max_piece, uint64_t *rng,
                            char hex[65]) {
    sha256_ctx c;
    uint8_t d[32];
    sha256_init(&c);
    size_t at = 0;
    while (at < n) {
        size_t k = (size_t)(t_rand_next(rng) % (max_piece + 1));
        if (k > n - at) {
            k = n - at;
        }
        sha256_update(&c, msg + at, k);
        at += k;
    }
    sha256_update(&c, msg + at, 0);
    sha256_final(&c, d);
    sha256_hex(d, hex);
}

/* ---- FIPS 180-4 example vectors ------------------------------------------------------ */

static void test_fips_vectors(void **state) {
    (void)state;
    static const struct {
        const char *msg, *want;
    } cases[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqr"
         "lmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char hex[65];
        t_digest_hex(cases[i].msg, strlen(cases[i].msg), hex);
        NBT_STREQ(hex, cases[i].want);
    }
}

static void test_million_a(void **state) {
    (void)state;
    static const char *const want =
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
    size_t n = 1000000;
    char *msg = malloc(n);
    assert_non_null(msg);
    memset(msg, 'a', n);
    char hex[65];
    t_digest_hex(msg, n, hex);
    NBT_STREQ(hex, want);
    /* the same million in odd-sized pieces, and one byte at a time */
    uint64_t rng = 7;
    t_digest_pieces((const uint8_t *)msg, n, 1000, &rng, hex);
    NBT_STREQ(hex, want);
    sha256_ctx c;
    uint8_t d[32];
    sha256_init(&c);
    for (size_t i = 0; i < n; i++) {
        sha256_update(&c, "a", 1);
    }
    sha256_final(&c, d);
    sha256_hex(d, hex);
    NBT_STREQ(hex, want);
    free(msg);
}

/* ---- padding boundaries ------------------------------------------------------------ */

/* sha256('a' * n) from Python 3: hashlib.sha256(b'a' * n).hexdigest(). 55 bytes is the
 * longest message padded within one block, 56..63 need a second block for the length,
 * 64 fills a block exactly; the same again one block later. */
static void test_padding_boundaries(void **state) {
    (void)state;
    static const struct {
        size_t n;
        const char *want;
    } cases[] = {
        {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {57, "f13b2d724659eb3bf47f2dd6af1accc87b81f09f59f2b75e5c0bed6589dfe8c6"},
        {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
        {111, "6374f73208854473827f6f6a3f43b1f53eaa3b82c21c1a6d69a2110b2a79baad"},
        {112, "f54353008a2553262ecdc4a34749563ba0950e8b0fc8652780b0a614b99683c1"},
        {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
        {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
        {127, "c57e9278af78fa3cab38667bef4ce29d783787a2f731d4e12200270f0c32320a"},
        {128, "6836cf13bac400e9105071cd6af47084dfacad4e5e302c94bfed24e013afb73e"},
    };
    char msg[128];
    memset(msg, 'a', sizeof msg);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char hex[65];
        t_digest_hex(msg, cases[i].n, hex);
        if (strcmp(hex, cases[i].want) != 0) {
            fail_msg("sha256('a' * %zu):\n  got:  %s\n  want: %s", cases[i].n, hex, cases[i].want);
        }
        /* and split at the boundary that matters: the first 55/56/64 bytes, then the rest */
        static const size_t cuts[] = {1, 55, 56, 63, 64};
        for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
            if (cuts[k] > cases[i].n) {
                continue;
            }
            sha256_ctx c;
            uint8_t d[32];
            sha256_init(&c);
            sha256_update(&c, msg, cuts[k]);
            sha256_update(&c, msg + cuts[k], cases[i].n - cuts[k]);
            sha256_final(&c, d);
            sha256_hex(d, hex);
            if (strcmp(hex, cases[i].want) != 0) {
                fail_msg("sha256('a' * %zu) split at %zu: got %s", cases[i].n, cuts[k], hex);
            }
        }
    }
}

/* ---- split invariance ------------------------------------------------------------- */

/* Every length 0..300 of random bytes: whole, one byte at a time, and in random pieces of
 * up to 1, 7, 64 and 130 bytes all give one digest. Lengths of the same message also give
 * pairwise different digests (a cheap check that no byte is ignored). */
static void test_split_invariance(void **state) {
    (void)state;
    enum { MAX_LEN = 300 };
    uint64_t rng = 42;
    uint8_t msg[MAX_LEN];
    for (size_t i = 0; i < MAX_LEN; i++) {
        msg[i] = (uint8_t)t_rand_next(&rng);
    }
    static char whole[MAX_LEN + 1][65];
    for (size_t n = 0; n <= MAX_LEN; n++) {
        t_digest_hex(msg, n, whole[n]);
        char hex[65];
        static const size_t max_pieces[] = {1, 7, 64, 130};
        for (size_t k = 0; k < sizeof max_pieces / sizeof max_pieces[0]; k++) {
            t_digest_pieces(msg, n, max_pieces[k], &rng, hex);
            if (strcmp(hex, whole[n]) != 0) {
                fail_msg("length %zu in pieces of <= %zu bytes:\n  got:   %s\n  whole: %s", n,
                         max_pieces[k], hex, whole[n]);
            }
        }
        sha256_ctx c;
        uint8_t d[32];
        sha256_init(&c);
        for (size_t i = 0; i < n; i++) {
            sha256_update(&c, msg + i, 1);
        }
        sha256_final(&c, d);
        sha256_hex(d, hex);
        if (strcmp(hex, whole[n]) != 0) {
            fail_msg("length %zu byte by byte:\n  got:   %s\n  whole: %s", n, hex, whole[n]);
        }
        for (size_t m = 0; m < n; m++) {
            if (strcmp(whole[m], whole[n]) == 0) {
                fail_msg("lengths %zu and %zu of one message have the same digest", m, n);
            }
        }
    }
}

static void test_hex(void **state) {
    (void)state;
    uint8_t d[32];
    for (int i = 0; i < 32; i++) {
        d[i] = (uint8_t)(i * 8 + 7);
    }
    d[0] = 0x00;
    d[31] = 0xff;
    char hex[65];
    memset(hex, 'x', sizeof hex);
    sha256_hex(d, hex);
    NBT_STREQ(hex, "000f171f272f373f474f575f676f777f878f979fa7afb7bfc7cfd7dfe7eff7ff");
}

/* ---- files ------------------------------------------------------------------------ */

static void test_file_missing(void **state) {
    (void)state;
    char hex[65] = "unchanged";
    errno = 0;
    NBT_EQ_I64(sha256_file("/nonexistent/nabla-test-sha256/none", hex), -1);
    NBT_EQ_I64(errno, ENOENT);
    NBT_STREQ(hex, "");
    /* a directory opens but cannot be read */
    errno = 0;
    NBT_EQ_I64(sha256_file("/", hex), -1);
    NBT_TRUE(errno != 0);
}

/* Writes n random bytes to a new temporary file; its name goes to path (>= 64 bytes). */
static void t_write_random_file(char *path, size_t n, uint64_t *rng) {
    strcpy(path, "/tmp/nabla-test-sha256-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "wb");
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) {
        fputc((int)(t_rand_next(rng) & 0xff), f);
    }
    assert_int_equal(fclose(f), 0);
}

/* sha256_file against the digest of the same bytes in memory, and against sha256sum. */
static void test_file_vs_sha256sum(void **state) {
    (void)state;
    static const size_t sizes[] = {0, 1, 55, 56, 64, 16383, 16384, 16385, 100000, 1234567};
    bool have_tool = access("/usr/bin/sha256sum", X_OK) == 0;
    uint64_t rng = 2024;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char path[64];
        t_write_random_file(path, sizes[i], &rng);
        char hex[65];
        int rc = sha256_file(path, hex);
        /* the same bytes in memory */
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        uint8_t *buf = malloc(sizes[i] + 1);
        assert_non_null(buf);
        size_t got = fread(buf, 1, sizes[i] + 1, f);
        fclose(f);
        char mem[65];
        t_digest_hex(buf, got, mem);
        free(buf);
        char tool[65] = "";
        if (have_tool) {
            char cmd[128];
            snprintf(cmd, sizeof cmd, "/usr/bin/sha256sum '%s'", path);
            FILE *p = popen(cmd, "r");
            assert_non_null(p);
            if (fscanf(p, "%64s", tool) != 1) {
                tool[0] = '\0';
            }
            int st = pclose(p);
            NBT_EQ_I64(st, 0);
        }
        remove(path);
        NBT_EQ_I64(rc, 0);
        NBT_EQ_I64(got, sizes[i]);
        if (strcmp(hex, mem) != 0) {
            fail_msg("file of %zu bytes: sha256_file %s, in memory %s", sizes[i], hex, mem);
        }
        if (have_tool && strcmp(hex, tool) != 0) {
            fail_msg("file of %zu bytes: sha256_file %s, sha256sum %s", sizes[i], hex, tool);
        }
    }
    if (!have_tool) {
        print_message("/usr/bin/sha256sum not found: compared with in-memory digests only\n");
        skip();
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fips_vectors),
        cmocka_unit_test(test_million_a),
        cmocka_unit_test(test_padding_boundaries),
        cmocka_unit_test(test_split_invariance),
        cmocka_unit_test(test_hex),
        cmocka_unit_test(test_file_missing),
        cmocka_unit_test(test_file_vs_sha256sum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
