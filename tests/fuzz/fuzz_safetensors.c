/*
 * fuzz_safetensors.c -- libFuzzer target for the safetensors loader (nabla/io.h).
 *
 * Every input is a file's bytes. The rules checked (a broken one aborts, which libFuzzer
 * reports as a crash and saves the input):
 *   1. nb_load_bytes returns NB_OK with a live tree, or NB_ERR_FORMAT (or NB_ERR_UNSUPPORTED:
 *      a function reference nb_load cannot restore) with *out NULL and the status and a
 *      message recorded on the context (io.h documents nothing else for bytes in memory that
 *      the allocator can serve).
 *   2. nb_load of the same bytes written to a file agrees: the same status, and on success
 *      a bit-identical tree (the file reader and the memory reader share the parser but not
 *      the data path).
 *   3. A loaded tree is its own template: nb_load_into(tree, file) succeeds and gives the
 *      same tree back.
 *   4. A loaded tree round-trips: nb_save then nb_load gives a bit-identical tree (nb_save
 *      may refuse a tree whose leaf paths collide, with NB_ERR_INVALID).
 *   5. Allocation failure: the load is repeated with one allocation failing (or every one
 *      from some point), chosen from a hash of the input so that a reproducer replays it;
 *      it must return NB_ERR_OOM with a message (or, for an input that failed anyway, the
 *      same error as without the failure), never success, a crash or a leak.
 *   6. After each step nothing is left alive on the context (arrays, trees, treedefs,
 *      buffers, bytes in use).
 * ASan and UBSan check everything else.
 *
 * A custom mutator keeps the 8-byte header length consistent most of the time: it mutates
 * the header JSON or the data buffer alone and rewrites the length, so that the fuzzer
 * spends its time past the first length check. Inputs stay plain safetensors files.
 */
#define _POSIX_C_SOURCE 200809L

#include "fuzz_common.h"

#include <dirent.h>

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

static nbf_file g_file;   /* the input, for nb_load and nb_load_into */
static char g_dir[4096];  /* a directory for nb_save (it renames a temporary file) */
static char g_save[4200]; /* g_dir/rt.safetensors */

/* A fresh directory for one nb_save, removed again by st_save_dir_remove (so that a
 * crash leaves at most one, and an empty one unless it struck inside the round trip). */
static void st_save_dir_make(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/nabla-fuzz-save-XXXXXX",
             tmp != NULL && tmp[0] ? tmp : "/tmp");
    if (mkdtemp(g_dir) == NULL) {
        nbf_fail(NULL, "mkdtemp(%s) failed", g_dir);
    }
    snprintf(g_save, sizeof g_save, "%s/rt.safetensors", g_dir);
}

static void st_save_dir_remove(void) {
    /* the file, and what a save that failed half-way may leave: rt.safetensors.tmpXXXXXX */
    DIR *d = opendir(g_dir);
    if (d != NULL) {
        struct dirent *e;
        char p[4400];
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] != '.') {
                snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
                unlink(p);
            }
        }
        closedir(d);
    }
    rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    nbf_ctx_init();
    nbf_file_open(&g_file, "st");
    return 0;
}

/* ---- comparing trees bit for bit ------------------------------------------------------- */

static void st_require_same(const nb_tree *a, const nb_tree *b, const char *what) {
    bool eq = false;
    if (nb_tree_structure_equal(a, b, &eq) != NB_OK) {
        nbf_fail(nbf_ctx, "%s: nb_tree_structure_equal failed", what);
    }
    if (!eq) {
        char diff[512] = "";
        bool differ = false;
        nb_tree_diff(a, b, NB_TREE_DIFF_STRUCTURE, &differ, diff, sizeof diff, NULL);
        nbf_fail(nbf_ctx, "%s: the trees differ in structure: %s", what, diff);
    }
    nb_tree *la = NULL, *lb = NULL;
    if (nb_tree_flatten(a, &la, NULL) != NB_OK || nb_tree_flatten(b, &lb, NULL) != NB_OK) {
        nbf_fail(nbf_ctx, "%s: nb_tree_flatten failed", what);
    }
    int64_t n = nb_tree_len(la);
    if (n != nb_tree_len(lb)) {
        nbf_fail(nbf_ctx, "%s: %lld leaves vs %lld", what, (long long)n,
                 (long long)nb_tree_len(lb));
    }
    for (int64_t i = 0; i < n; i++) {
        bool same = false;
        const nb_array *x = nb_tree_get_array(nb_tree_child(la, i));
        const nb_array *y = nb_tree_get_array(nb_tree_child(lb, i));
        if (x == NULL || y == NULL || nb_array_identical(x, y, &same) != NB_OK || !same) {
            char path[256] = "?";
            nb_tree_leaf_path(a, i, path, sizeof path, NULL);
            nbf_fail(nbf_ctx, "%s: the array at '%s' differs", what, path);
        }
    }
    nb_tree_destroy(la);
    nb_tree_destroy(lb);
}

/* Rule 1 for one call: the status is documented, *out matches it, the error is recorded. */
static void st_check_result(const char *call, nb_status st, const nb_tree *t) {
    if (st == NB_OK) {
        if (t == NULL || nb_tree_check(t) != NB_OK) {
            nbf_fail(nbf_ctx, "%s returned NB_OK without a live tree", call);
        }
        return;
    }
    if (t != NULL) {
        nbf_fail(nbf_ctx, "%s returned %s but set *out", call, nb_status_string(st));
    }
    if (st != NB_ERR_FORMAT && st != NB_ERR_UNSUPPORTED) {
        nbf_fail(nbf_ctx, "%s returned %s, which io.h does not document for this input", call,
                 nb_status_string(st));
    }
    nbf_check_error_recorded(call, st);
}

/* ---- the target ------------------------------------------------------------------------ */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_ctx *ctx = nbf_ctx;

    /* 1: from memory */
    nbf_alloc_arm(&nbf_allocator, -1, false);
    nb_tree *t = NULL;
    nb_status st = nb_load_bytes(ctx, data, size, "fuzz-input", &t);
    int64_t allocs = nbf_allocator.calls;
    nbf_log("nb_load_bytes: %s (%lld allocations)%s%s", nb_status_string(st), (long long)allocs,
            st != NB_OK ? ": " : "", st != NB_OK ? nb_ctx_errmsg(ctx) : "");
    st_check_result("nb_load_bytes", st, t);
    nb_ctx_clear_error(ctx);

    /* 2: from a file */
    nbf_file_write(&g_file, data, size);
    nb_tree *t2 = NULL;
    nb_status st2 = nb_load(ctx, g_file.path, &t2);
    st_check_result("nb_load", st2, t2);
    if (st2 != st) {
        nbf_fail(ctx, "nb_load_bytes returned %s but nb_load of the same bytes %s",
                 nb_status_string(st), nb_status_string(st2));
    }
    nb_ctx_clear_error(ctx);

    if (st == NB_OK) {
        st_require_same(t, t2, "nb_load vs nb_load_bytes");

        /* 3: the tree as its own template */
        nb_tree *t3 = NULL;
        nb_status st3 = nb_load_into(t, g_file.path, &t3);
        if (st3 != NB_OK) {
            nbf_fail(ctx, "nb_load_into(the loaded tree, the same file) returned %s",
                     nb_status_string(st3));
        }
        st_require_same(t, t3, "nb_load_into vs nb_load_bytes");
        nb_tree_destroy(t3);

        /* 4: save and load again */
        st_save_dir_make();
        nb_status st4 = nb_save(t, g_save);
        nbf_log("nb_save: %s", nb_status_string(st4));
        if (st4 == NB_OK) {
            nb_tree *t4 = NULL;
            nb_status st5 = nb_load(ctx, g_save, &t4);
            if (st5 != NB_OK) {
                nbf_fail(ctx, "nb_load of what nb_save wrote returned %s", nb_status_string(st5));
            }
            st_require_same(t, t4, "nb_save + nb_load vs nb_load_bytes");
            nb_tree_destroy(t4);
        } else if (st4 != NB_ERR_INVALID) {
            nbf_fail(ctx, "nb_save of a loaded tree returned %s", nb_status_string(st4));
        } else {
            nbf_check_error_recorded("nb_save", st4);
        }
        st_save_dir_remove();
        nb_ctx_clear_error(ctx);
    }
    nb_tree_destroy(t);
    nb_tree_destroy(t2);
    nbf_check_nothing_live("after loading");

    /* 5: the same load with an allocation failing */
    if (allocs > 0) {
        uint64_t h = nbf_hash(data, size);
        bool from_file = (h >> 62) & 1;
        nbf_alloc_arm(&nbf_allocator, (int64_t)(h % (uint64_t)allocs), (h >> 63) & 1);
        nb_tree *t5 = NULL;
        nb_status st5 = from_file ? nb_load(ctx, g_file.path, &t5)
                                  : nb_load_bytes(ctx, data, size, "fuzz-input", &t5);
        int64_t failures = nbf_allocator.failures;
        nbf_alloc_arm(&nbf_allocator, -1, false);
        nbf_log("with allocation %lld failing (%s): %s", (long long)(h % (uint64_t)allocs),
                from_file ? "nb_load" : "nb_load_bytes", nb_status_string(st5));
        /* the failure may come after the parser has already met the malformation that
         * failed the first load: that error may then be the one reported */
        if (failures > 0 && st5 != NB_ERR_OOM && (st == NB_OK || st5 != st)) {
            nbf_fail(ctx, "%s with allocation %lld of %lld failing returned %s, not NB_ERR_OOM",
                     from_file ? "nb_load" : "nb_load_bytes", (long long)(h % (uint64_t)allocs),
                     (long long)allocs, nb_status_string(st5));
        }
        if (failures > 0) {
            if (t5 != NULL) {
                nbf_fail(ctx, "an out-of-memory load set *out");
            }
            nbf_check_error_recorded("a load out of memory", st5);
        }
        nb_tree_destroy(t5);
        nb_ctx_clear_error(ctx);
        nbf_check_nothing_live("after a load out of memory");
    }
    return 0;
}

/* ---- the mutator ----------------------------------------------------------------------- */

static uint64_t st_get_len(const uint8_t *p) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) {
        n = (n << 8) | p[i];
    }
    return n;
}

static void st_put_len(uint8_t *p, uint64_t n) {
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(n >> (8 * i));
    }
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    static uint8_t *tail_copy;
    static size_t tail_cap;
    unsigned how = seed % 8;
    if (size < 10 || how < 3) {
        return LLVMFuzzerMutate(data, size, max_size); /* anything, length field included */
    }
    uint64_t hlen = st_get_len(data);
    if (hlen > size - 8) {
        hlen = size - 8; /* a broken length: treat the rest as the header */
    }
    size_t tail = size - 8 - (size_t)hlen;
    if (how == 7 && tail > 0) { /* the data buffer alone: the header stays valid */
        size_t n = LLVMFuzzerMutate(data + 8 + hlen, tail, max_size - 8 - (size_t)hlen);
        return 8 + (size_t)hlen + n;
    }
    if (hlen == 0 || 8 + tail >= max_size) {
        return LLVMFuzzerMutate(data, size, max_size);
    }
    /* the header alone, then the length rewritten to match */
    if (tail > tail_cap) {
        uint8_t *q = realloc(tail_copy, tail);
        if (q == NULL) {
            return LLVMFuzzerMutate(data, size, max_size);
        }
        tail_copy = q;
        tail_cap = tail;
    }
    if (tail > 0) {
        memcpy(tail_copy, data + 8 + hlen, tail);
    }
    size_t n = LLVMFuzzerMutate(data + 8, (size_t)hlen, max_size - 8 - tail);
    if (tail > 0) {
        memcpy(data + 8 + n, tail_copy, tail);
    }
    st_put_len(data, n);
    return 8 + n + tail;
}
