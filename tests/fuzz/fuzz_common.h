/*
 * fuzz_common.h -- what the libFuzzer targets share (tests/fuzz/README.md): one context per
 * process with an allocator that can fail on request, the leak check run after every
 * input, temporary files for loaders that read a path, and the report-then-abort used for
 * every broken rule (libFuzzer turns the abort into a crash with a saved reproducer).
 *
 * Everything here is static: each target is one translation unit.
 */
#ifndef NABLA_FUZZ_COMMON_H
#define NABLA_FUZZ_COMMON_H

#include <nabla/nabla.h>

#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* libFuzzer's entry points (it declares none in a header). */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- reporting ------------------------------------------------------------------------- */

static bool nbf_debug; /* NABLA_FUZZ_DEBUG=1: one line per input (statuses and messages) */

static void nbf_fail(nb_ctx *ctx, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 2, 3)));
static void nbf_fail(nb_ctx *ctx, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\n==nabla-fuzz== BROKEN RULE: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n==nabla-fuzz== last error on the context: %s\n",
            ctx != NULL ? nb_ctx_errmsg(ctx) : "(none)");
    va_end(ap);
    fflush(stderr);
    abort();
}

static void nbf_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void nbf_log(const char *fmt, ...) {
    if (!nbf_debug) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[nabla-fuzz] ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

/* ---- an allocator that fails on request ----------------------------------------------- */
/* fail_at < 0: never fail. Otherwise call number fail_at (counting from 0 since the last
 * nbf_alloc_arm) fails, and with sticky every later call too.
 *
 * It also keeps apart the blocks the context keeps for its whole life: the slabs its
 * arrays' and trees' headers are carved from (src/core/ctx.c) are allocated with 64-byte
 * alignment when the first ones fill up and freed only with the context, so bytes_in_use
 * may grow by a slab without anything leaking. The loaders make nothing else 64-aligned. */
#define NBF_MAX_KEPT 4096
typedef struct nbf_alloc {
    nb_allocator real;
    int64_t calls;
    int64_t fail_at;
    bool sticky;
    int64_t failures;
    void *kept[NBF_MAX_KEPT]; /* live 64-aligned blocks */
    size_t kept_size[NBF_MAX_KEPT];
    int n_kept;
    size_t kept_bytes;
} nbf_alloc;

static void *nbf_alloc_fn(void *ud, size_t size, size_t align) {
    nbf_alloc *a = ud;
    int64_t k = a->calls++;
    if (a->fail_at >= 0 && (k == a->fail_at || (a->sticky && k > a->fail_at))) {
        a->failures++;
        return NULL;
    }
    void *p = a->real.alloc(a->real.ud, size, align);
    if (p != NULL && align == 64 && a->n_kept < NBF_MAX_KEPT) {
        a->kept[a->n_kept] = p;
        a->kept_size[a->n_kept++] = size;
        a->kept_bytes += size;
    }
    return p;
}

static void nbf_free_fn(void *ud, void *ptr, size_t size) {
    nbf_alloc *a = ud;
    for (int i = 0; i < a->n_kept; i++) {
        if (a->kept[i] == ptr) {
            a->kept_bytes -= a->kept_size[i];
            a->kept[i] = a->kept[a->n_kept - 1];
            a->kept_size[i] = a->kept_size[a->n_kept - 1];
            a->n_kept--;
            break;
        }
    }
    a->real.free(a->real.ud, ptr, size);
}

static void nbf_alloc_arm(nbf_alloc *a, int64_t fail_at, bool sticky) {
    a->calls = 0;
    a->fail_at = fail_at;
    a->sticky = sticky;
    a->failures = 0;
}

/* FNV-1a: picks the failing allocation from the input, so a reproducer replays exactly. */
static uint64_t nbf_hash(const uint8_t *data, size_t size) {
    uint64_t h = 1469598103934665603u;
    for (size_t i = 0; i < size; i++) {
        h = (h ^ data[i]) * 1099511628211u;
    }
    return h;
}

/* ---- the context and the leak check --------------------------------------------------- */

static nb_ctx *nbf_ctx;
static nbf_alloc nbf_allocator;
static nb_ctx_stats nbf_base;
static size_t nbf_base_bytes; /* bytes in use at the start, slabs not counted */

static void nbf_ctx_init(void) {
    const char *dbg = getenv("NABLA_FUZZ_DEBUG");
    nbf_debug = dbg != NULL && dbg[0] != '\0' && dbg[0] != '0';
    nbf_allocator.real = nb_allocator_default();
    nbf_alloc_arm(&nbf_allocator, -1, false);
    nb_ctx_opts o = nb_ctx_opts_default();
    o.allocator.alloc = nbf_alloc_fn;
    o.allocator.free = nbf_free_fn;
    o.allocator.ud = &nbf_allocator;
    o.n_threads = 1;
    if (nb_ctx_create(&o, &nbf_ctx) != NB_OK) {
        nbf_fail(NULL, "nb_ctx_create failed");
    }
    nb_ctx_stats_get(nbf_ctx, &nbf_base);
    nbf_base_bytes = nbf_base.bytes_in_use - nbf_allocator.kept_bytes;
}

/* Everything made while handling an input must be gone afterwards. */
static void nbf_check_nothing_live(const char *when) {
    nb_ctx_stats s;
    if (nb_ctx_stats_get(nbf_ctx, &s) != NB_OK) {
        nbf_fail(nbf_ctx, "nb_ctx_stats_get failed");
    }
    size_t bytes = s.bytes_in_use - nbf_allocator.kept_bytes;
    if (s.live_arrays != nbf_base.live_arrays || s.live_trees != nbf_base.live_trees ||
        s.live_treedefs != nbf_base.live_treedefs || s.live_buffers != nbf_base.live_buffers ||
        s.live_fns != nbf_base.live_fns || bytes != nbf_base_bytes) {
        nbf_fail(nbf_ctx,
                 "leak %s: live arrays %lld (expected %lld), trees %lld (%lld), treedefs %lld "
                 "(%lld), buffers %lld (%lld), fns %lld (%lld), bytes in use %zu (%zu; slabs "
                 "not counted)",
                 when, (long long)s.live_arrays, (long long)nbf_base.live_arrays,
                 (long long)s.live_trees, (long long)nbf_base.live_trees,
                 (long long)s.live_treedefs, (long long)nbf_base.live_treedefs,
                 (long long)s.live_buffers, (long long)nbf_base.live_buffers, (long long)s.live_fns,
                 (long long)nbf_base.live_fns, bytes, nbf_base_bytes);
    }
}

/* A failure must leave its status and a message on the context. */
static void nbf_check_error_recorded(const char *call, nb_status st) {
    if (st == NB_OK) {
        return;
    }
    if (nb_ctx_errcode(nbf_ctx) != st) {
        nbf_fail(nbf_ctx, "%s returned %s but the context records %s", call, nb_status_string(st),
                 nb_status_string(nb_ctx_errcode(nbf_ctx)));
    }
    const char *msg = nb_ctx_errmsg(nbf_ctx);
    if (msg == NULL || msg[0] == '\0') {
        nbf_fail(nbf_ctx, "%s returned %s with no message", call, nb_status_string(st));
    }
}

/* ---- temporary files ------------------------------------------------------------------ */
/* One file per use, made once per process in $TMPDIR (else /tmp) and unlinked at once: the
 * loaders open it again through /proc/self/fd/<fd>, so nothing is left behind even when
 * the process dies on a crash. */
typedef struct nbf_file {
    int fd;
    char path[64];
} nbf_file;

static void nbf_file_open(nbf_file *f, const char *tag) {
    const char *dir = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/nabla-fuzz-%s-XXXXXX", dir != NULL && dir[0] ? dir : "/tmp",
             tag);
    f->fd = mkstemp(tmpl);
    if (f->fd < 0) {
        nbf_fail(NULL, "mkstemp(%s) failed", tmpl);
    }
    unlink(tmpl);
    snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
    int probe = open(f->path, O_RDONLY);
    if (probe < 0) {
        nbf_fail(NULL, "cannot reopen %s (is /proc mounted?)", f->path);
    }
    close(probe);
}

/* Replace the file's contents by n bytes. */
static void nbf_file_write(nbf_file *f, const void *data, size_t n) {
    if (ftruncate(f->fd, 0) != 0) {
        nbf_fail(NULL, "ftruncate failed");
    }
    const char *p = data;
    size_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(f->fd, p + done, n - done, (off_t)done);
        if (w <= 0) {
            nbf_fail(NULL, "pwrite failed");
        }
        done += (size_t)w;
    }
}

#endif /* NABLA_FUZZ_COMMON_H */
