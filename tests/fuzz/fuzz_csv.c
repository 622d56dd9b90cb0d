/*
 * fuzz_csv.c -- libFuzzer target for the CSV loader (nb_csv_load, nabla/data.h).
 *
 * Input: one flag byte, then the file's contents. The flag byte chooses the options and
 * the path through zlib:
 *   bits 0-1  delimiter: 0 ',', 1 ';', 2 '\t', 3 the next input byte (any byte, so the
 *             refused delimiters '\0', '\n' and '"' are reached too)
 *   bit 2     has_labels = false (default true)
 *   bit 3     features f64 (default f32)
 *   bit 4     labels i64 (default i32)
 *   bit 5     labels not wanted (labels out-parameter NULL)
 *   bit 6     also load a gzip-compressed copy: same status and bit-identical arrays
 *   bit 7     load only a gzip-compressed copy with its end cut off (a damaged stream)
 * The rules checked (a broken one aborts, which libFuzzer reports as a crash):
 *   1. The status is NB_OK, NB_ERR_FORMAT, NB_ERR_INVALID only for a refused delimiter,
 *      NB_ERR_IO only when zlib reads a damaged gzip stream; on failure the outputs are
 *      NULL and the status and a message are on the context.
 *   2. On success: features f[rows, cols] of the chosen dtype with rows, cols >= 1, every
 *      value finite (for f32 too: a field beyond FLT_MAX is not a finite f32); labels
 *      [rows] of the chosen dtype when has_labels and wanted, else NULL; and the file holds
 *      no NUL byte (a line with one is malformed).
 *   3. Allocation failure: the load is repeated with one allocation failing (or every one
 *      from some point; chosen from a hash of the input): NB_ERR_OOM (or the error of the
 *      load without the failure), nothing leaked.
 *   4. After each load nothing is left alive on the context.
 */
#define _POSIX_C_SOURCE 200809L

#include "fuzz_common.h"

#include <math.h>
#include <zlib.h>

static nbf_file g_file;
static uint8_t *g_gz; /* scratch for the compressed copy */
static size_t g_gz_cap;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    nbf_ctx_init();
    nbf_file_open(&g_file, "csv");
    return 0;
}

/* gzip (not zlib) format, as the gzip tool writes: windowBits 15 + 16. */
static size_t csv_gzip(const uint8_t *src, size_t n) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
        nbf_fail(NULL, "deflateInit2 failed");
    }
    size_t bound = deflateBound(&z, (uLong)n) + 64;
    if (bound > g_gz_cap) {
        uint8_t *q = realloc(g_gz, bound);
        if (q == NULL) {
            nbf_fail(NULL, "out of memory in the harness");
        }
        g_gz = q;
        g_gz_cap = bound;
    }
    z.next_in = (Bytef *)(uintptr_t)src;
    z.avail_in = (uInt)n;
    z.next_out = g_gz;
    z.avail_out = (uInt)g_gz_cap;
    if (deflate(&z, Z_FINISH) != Z_STREAM_END) {
        nbf_fail(NULL, "deflate did not finish");
    }
    size_t out = g_gz_cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

typedef struct csv_run {
    nb_csv_opts o;
    bool want_labels;
    bool delim_refused;
    nb_status st;
    nb_array *x, *y;
} csv_run;

static void csv_load(csv_run *r, const char *what, bool io_allowed, bool has_nul) {
    r->x = r->y = NULL;
    r->st = nb_csv_load(nbf_ctx, g_file.path, &r->o, &r->x, r->want_labels ? &r->y : NULL);
    nbf_log("%s: %s%s%s", what, nb_status_string(r->st), r->st != NB_OK ? ": " : "",
            r->st != NB_OK ? nb_ctx_errmsg(nbf_ctx) : "");
    if (r->st != NB_OK) {
        if (r->x != NULL || r->y != NULL) {
            nbf_fail(nbf_ctx, "%s: nb_csv_load returned %s but set an output", what,
                     nb_status_string(r->st));
        }
        bool ok = r->st == NB_ERR_FORMAT || (r->st == NB_ERR_IO && io_allowed) ||
                  (r->st == NB_ERR_INVALID && r->delim_refused);
        if (!ok || (r->delim_refused && r->st != NB_ERR_INVALID)) {
            nbf_fail(nbf_ctx, "%s: nb_csv_load returned %s (delimiter 0x%02x)", what,
                     nb_status_string(r->st), (unsigned)(unsigned char)r->o.delimiter);
        }
        nbf_check_error_recorded("nb_csv_load", r->st);
        nb_ctx_clear_error(nbf_ctx);
        return;
    }
    if (has_nul) {
        nbf_fail(nbf_ctx, "%s: NB_OK for a file holding a NUL byte (a malformed line)", what);
    }
    const nb_array *x = r->x;
    if (x == NULL || nb_array_rank(x) != 2 || nb_array_dtype(x) != r->o.feature_dtype ||
        nb_array_dim(x, 0) < 1 || nb_array_dim(x, 1) < 1) {
        nbf_fail(nbf_ctx, "%s: NB_OK with features that are not %s[rows >= 1, cols >= 1]", what,
                 nb_dtype_name(r->o.feature_dtype));
    }
    int64_t rows = nb_array_dim(x, 0), size = nb_array_size(x);
    for (int64_t i = 0; i < size; i++) {
        double v = r->o.feature_dtype == NB_DTYPE_F32 ? ((const float *)nb_array_data(x))[i]
                                                      : ((const double *)nb_array_data(x))[i];
        if (!isfinite(v)) { /* (an f32 feature too: a double beyond FLT_MAX is an error) */
            nbf_fail(nbf_ctx, "%s: feature %lld is not finite", what, (long long)i);
        }
    }
    if (r->want_labels && r->o.has_labels) {
        const nb_array *y = r->y;
        if (y == NULL || nb_array_rank(y) != 1 || nb_array_dtype(y) != r->o.label_dtype ||
            nb_array_dim(y, 0) != rows) {
            nbf_fail(nbf_ctx, "%s: NB_OK with labels that are not %s[%lld]", what,
                     nb_dtype_name(r->o.label_dtype), (long long)rows);
        }
    } else if (r->y != NULL) {
        nbf_fail(nbf_ctx, "%s: labels returned though has_labels is false", what);
    }
}

static void csv_release(csv_run *r) {
    nb_array_destroy(r->x);
    nb_array_destroy(r->y);
    r->x = r->y = NULL;
}

static void csv_require_same(const nb_array *a, const nb_array *b, const char *what) {
    bool same = false;
    if (a == NULL && b == NULL) {
        return;
    }
    if (a == NULL || b == NULL || nb_array_identical(a, b, &same) != NB_OK || !same) {
        nbf_fail(nbf_ctx, "plain and gzip loads differ in the %s", what);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) {
        return 0;
    }
    unsigned flags = data[0];
    const uint8_t *p = data + 1;
    size_t n = size - 1;

    csv_run r;
    memset(&r, 0, sizeof r);
    r.o = nb_csv_opts_default();
    static const char delims[3] = {',', ';', '\t'};
    if ((flags & 3) < 3) {
        r.o.delimiter = delims[flags & 3];
    } else if (n > 0) {
        r.o.delimiter = (char)p[0];
        p++;
        n--;
    }
    r.delim_refused = r.o.delimiter == '\0' || r.o.delimiter == '\n' || r.o.delimiter == '"';
    r.o.has_labels = !(flags & 4);
    r.o.feature_dtype = (flags & 8) ? NB_DTYPE_F64 : NB_DTYPE_F32;
    r.o.label_dtype = (flags & 16) ? NB_DTYPE_I64 : NB_DTYPE_I32;
    r.want_labels = !(flags & 32);
    /* zlib reads a plain file that starts with the gzip magic as gzip */
    bool looks_gz = n >= 2 && p[0] == 0x1f && p[1] == 0x8b;
    /* a NUL byte makes its line malformed (what zlib hands over for a gzip file is not
     * known here) */
    bool has_nul = !looks_gz && n > 0 && memchr(p, 0, n) != NULL;

    int64_t allocs = -1; /* allocator calls of the plain load */
    nb_status plain_st = NB_OK;
    nbf_alloc_arm(&nbf_allocator, -1, false);
    if (flags & 128) {
        size_t gz = csv_gzip(p, n);
        size_t cut = 1 + (size_t)(nbf_hash(data, size) % 16);
        gz = gz > cut ? gz - cut : 0;
        nbf_file_write(&g_file, g_gz, gz);
        csv_load(&r, "damaged gzip", true, false);
        csv_release(&r);
        nbf_check_nothing_live("after a damaged gzip load");
        nbf_file_write(&g_file, p, n); /* the fault pass below reads the plain file */
    } else {
        nbf_file_write(&g_file, p, n);
        csv_load(&r, "plain", looks_gz, has_nul);
        allocs = nbf_allocator.calls;
        plain_st = r.st;
        nb_array *x = r.x, *y = r.y;
        r.x = r.y = NULL;
        if (flags & 64) {
            nbf_alloc_arm(&nbf_allocator, -1, false);
            size_t gz = csv_gzip(p, n);
            nbf_file_write(&g_file, g_gz, gz);
            csv_load(&r, "gzip", looks_gz, has_nul);
            if (!looks_gz) {
                if (r.st != plain_st) {
                    nbf_fail(nbf_ctx, "the plain load returned %s, the gzip one %s",
                             nb_status_string(plain_st), nb_status_string(r.st));
                }
                csv_require_same(x, r.x, "features");
                csv_require_same(y, r.y, "labels");
            }
            csv_release(&r);
            nbf_file_write(&g_file, p, n);
        }
        nb_array_destroy(x);
        nb_array_destroy(y);
        nbf_check_nothing_live("after loading");
    }

    /* the plain load again with an allocation failing */
    if (allocs < 0) {
        nbf_alloc_arm(&nbf_allocator, -1, false);
        csv_load(&r, "plain (counting allocations)", looks_gz, has_nul);
        allocs = nbf_allocator.calls;
        plain_st = r.st;
        csv_release(&r);
        nbf_check_nothing_live("after loading");
    }
    if (allocs > 0) {
        uint64_t h = nbf_hash(data, size);
        int64_t at = (int64_t)(h % (uint64_t)allocs);
        nbf_alloc_arm(&nbf_allocator, at, (h >> 63) & 1);
        r.x = r.y = NULL;
        r.st = nb_csv_load(nbf_ctx, g_file.path, &r.o, &r.x, r.want_labels ? &r.y : NULL);
        int64_t failures = nbf_allocator.failures;
        nbf_alloc_arm(&nbf_allocator, -1, false);
        nbf_log("with allocation %lld of %lld failing: %s", (long long)at, (long long)allocs,
                nb_status_string(r.st));
        /* (an input that fails anyway may report its own error first) */
        if (failures > 0 && ((r.st != NB_ERR_OOM && (plain_st == NB_OK || r.st != plain_st)) ||
                             r.x != NULL || r.y != NULL)) {
            nbf_fail(nbf_ctx, "nb_csv_load with allocation %lld of %lld failing returned %s",
                     (long long)at, (long long)allocs, nb_status_string(r.st));
        }
        if (failures > 0) {
            nbf_check_error_recorded("nb_csv_load out of memory", r.st);
        }
        csv_release(&r);
        nb_ctx_clear_error(nbf_ctx);
        nbf_check_nothing_live("after a load out of memory");
    }
    return 0;
}
