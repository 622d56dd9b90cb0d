/*
 * dist.c -- collectives on pytrees over MPI and deterministic data-parallel training
 * (nabla/dist.h). Built on nabla's public API only (this is a separate library).
 *
 * The fixed-tree reduction. Parts 0 .. M-1 are the leaves of one binary tree: node [lo, hi)
 * splits at mid = lo + (hi - lo) / 2 and its value is value[lo, mid) + value[mid, hi),
 * element by element in the leaf's dtype. A process owning the block [a, b) computes the
 * maximal nodes inside it (its "canonical nodes", found by descending from the root). Every
 * node that is not inside one block is an ancestor of canonical nodes, so the root is
 * completed from the canonical nodes alone, in the same tree whatever the blocks are. The
 * packed vector of each dtype is cut into size slices; slice s's canonical nodes go to
 * process s (MPI_Alltoallv), which completes the root for its slice and the slices are
 * joined everywhere (MPI_Allgatherv).
 */
#include <nabla/dist.h>
#include <nabla/nabla.h>

#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBD_MAGIC 0x6e626469u /* "nbdi" */
#define NBD_TRAIN_MAGIC 0x6e626474u
/* the signature of a process that failed before an exchange (no tree has it) */
#define NBD_MARK "\001(this process failed before the exchange)"

/* scratch buffers kept between calls (fresh multi-megabyte buffers per call cost more in
 * page faults than the reduction itself): a buffer per dtype for the results, then the
 * reduction's own */
enum {
    NBD_S_RES = 0,
    NBD_S_MINE = NBD_S_RES + NB_DTYPE_COUNT,
    NBD_S_SEND,
    NBD_S_RECV,
    NBD_S_TMP,
    NBD_S_SLICE,
    NBD_S_N
};

struct nb_dist {
    uint32_t magic;
    void *scr[NBD_S_N];
    size_t scr_cap[NBD_S_N];
    nb_ctx *ctx;
    MPI_Comm comm;
    int rank, size;
    double timeout_s;
    nb_dist_stats stats;
    bool owns_mpi; /* nb_dist_create initialized MPI */
    bool broken;   /* a collective failed: MPI state unknown */
};

/* ---- errors ------------------------------------------------------------------------- */

static nb_status nbd_fail(nb_dist *d, nb_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static nb_status nbd_fail(nb_dist *d, nb_status st, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return nb_tree_map_fail(d->ctx, st, "%s", msg);
}

static bool nbd_live(const nb_dist *d) {
    return d != NULL && d->magic == NBD_MAGIC;
}

/* Memory through the context's allocator (core.h: every allocation nabla makes), with
 * the block's size kept in front of it for nbd_free. */
static void *nbd_alloc(nb_ctx *ctx, size_t n) {
    size_t total = n + 64;
    char *p = nb_ctx_alloc(ctx, total, 64);
    if (p == NULL) {
        return NULL;
    }
    memcpy(p, &total, sizeof total);
    return p + 64;
}

static void *nbd_calloc(nb_ctx *ctx, size_t n) {
    void *p = nbd_alloc(ctx, n);
    if (p != NULL) {
        memset(p, 0, n);
    }
    return p;
}

static void nbd_free(nb_ctx *ctx, void *q) {
    if (q == NULL) {
        return;
    }
    char *p = (char *)q - 64;
    size_t total = 0;
    memcpy(&total, p, sizeof total);
    nb_ctx_free(ctx, p, total);
}

static nb_status nbd_mpi_fail(nb_dist *d, const char *fn, const char *what, int code) {
    char es[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(code, es, &len);
    d->broken = true;
    return nbd_fail(d, NB_ERR_COMM,
                    "%s: rank %d of %d: %s failed: %s (the nb_dist is unusable now: destroy it "
                    "and exit)",
                    fn, d->rank, d->size, what, es);
}

/* scratch slot `slot` with room for bytes (its old contents dropped), or NULL */
static void *nbd_scratch(nb_dist *d, int slot, size_t bytes) {
    if (bytes > d->scr_cap[slot] || d->scr[slot] == NULL) {
        nbd_free(d->ctx, d->scr[slot]);
        d->scr_cap[slot] = 0;
        d->scr[slot] = nbd_alloc(d->ctx, bytes + 64);
        if (d->scr[slot] != NULL) {
            d->scr_cap[slot] = bytes + 64;
        }
    }
    return d->scr[slot];
}

static double nbd_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Wait for a non-blocking collective with the handle's timeout. MPI makes progress on a
 * non-blocking collective only inside MPI calls (Open MPI has no progress thread), and a
 * large message takes several round trips, each needing both sides to call: so the wait
 * polls MPI_Test without sleeping (yielding the core, for oversubscribed runs) for its
 * first 20 ms, and only then in naps growing to 1 ms. */
static nb_status nbd_wait(nb_dist *d, MPI_Request *req, const char *fn, const char *what) {
    double t0 = nbd_now();
    long nap = 0;
    d->stats.calls++;
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            d->stats.wait_s += nbd_now() - t0;
            return nbd_mpi_fail(d, fn, what, rc);
        }
        if (done) {
            d->stats.wait_s += nbd_now() - t0;
            return NB_OK;
        }
        double waited = nbd_now() - t0;
        if (waited < 0.02) {
            sched_yield();
            continue;
        }
        if (d->timeout_s > 0 && waited > d->timeout_s) {
            d->broken = true;
            return nbd_fail(d, NB_ERR_COMM,
                            "%s: rank %d of %d: %s did not complete in %.3g s: another process "
                            "has died or stopped calling collectives (see mpirun's messages); "
                            "the nb_dist is unusable now: destroy it and exit (the limit is "
                            "nb_dist_opts.timeout_s or NABLA_DIST_TIMEOUT)",
                            fn, d->rank, d->size, what, waited);
        }
        nap = nap == 0 ? 2000 : nap < 1000000 ? nap * 2 : 1000000;
        struct timespec ts = {0, nap};
        nanosleep(&ts, NULL);
    }
}

static nb_status nbd_enter(nb_dist *d, const char *fn) {
    if (!nbd_live(d)) {
        fprintf(stderr, "nabla: %s: d is NULL or destroyed\n", fn);
        return NB_ERR_MISUSE;
    }
    if (d->broken) {
        return nbd_fail(d, NB_ERR_COMM,
                        "%s: rank %d of %d: an earlier collective failed; the nb_dist is "
                        "unusable (destroy it and exit)",
                        fn, d->rank, d->size);
    }
    return NB_OK;
}

/* ---- create / destroy --------------------------------------------------------------- */

nb_dist_opts nb_dist_opts_default(void) {
    nb_dist_opts o;
    memset(&o, 0, sizeof o);
    o.timeout_s = 600.0;
    const char *e = getenv("NABLA_DIST_TIMEOUT");
    if (e != NULL && *e != '\0') {
        char *end = NULL;
        double v = strtod(e, &end);
        if (end != e && *end == '\0' && v > 0) {
            o.timeout_s = v;
        }
    }
    return o;
}

nb_status nb_dist_create(nb_ctx *ctx, MPI_Comm comm, const nb_dist_opts *opts, nb_dist **out) {
    static const char fn[] = "nb_dist_create";
    if (out != NULL) {
        *out = NULL;
    }
    if (ctx == NULL || out == NULL) {
        if (ctx != NULL) {
            return nb_tree_map_fail(ctx, NB_ERR_MISUSE,
                                    "%s: out is NULL (pass the address of an nb_dist *)", fn);
        }
        fprintf(stderr, "nabla: %s: ctx is NULL\n", fn);
        return NB_ERR_MISUSE;
    }
    nb_dist tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.magic = NBD_MAGIC;
    tmp.ctx = ctx;
    tmp.comm = MPI_COMM_NULL;
    tmp.timeout_s = (opts != NULL ? *opts : nb_dist_opts_default()).timeout_s;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            return nbd_mpi_fail(&tmp, fn, "MPI_Init_thread", rc);
        }
        tmp.owns_mpi = true;
    }
    if (comm == MPI_COMM_NULL) {
        comm = MPI_COMM_WORLD;
    }
    /* errors of the dup come back as codes, and the caller's handler is put back after */
    MPI_Errhandler saved = MPI_ERRHANDLER_NULL;
    int have_saved = MPI_Comm_get_errhandler(comm, &saved) == MPI_SUCCESS;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    const char *what = "MPI_Comm_dup";
    int rc = MPI_Comm_dup(comm, &tmp.comm);
    if (have_saved) {
        MPI_Comm_set_errhandler(comm, saved);
        MPI_Errhandler_free(&saved);
    }
    if (rc == MPI_SUCCESS) {
        what = "MPI_Comm_set_errhandler";
        rc = MPI_Comm_set_errhandler(tmp.comm, MPI_ERRORS_RETURN);
    }
    if (rc == MPI_SUCCESS) {
        what = "MPI_Comm_rank";
        rc = MPI_Comm_rank(tmp.comm, &tmp.rank);
    }
    if (rc == MPI_SUCCESS) {
        what = "MPI_Comm_size";
        rc = MPI_Comm_size(tmp.comm, &tmp.size);
    }
    if (rc != MPI_SUCCESS) {
        if (tmp.comm != MPI_COMM_NULL) {
            MPI_Comm_free(&tmp.comm);
        }
        return nbd_mpi_fail(&tmp, fn, what, rc);
    }
    nb_dist *d = nbd_alloc(ctx, sizeof *d);
    if (d == NULL) {
        MPI_Comm_free(&tmp.comm);
        return nb_tree_map_fail(ctx, NB_ERR_OOM, "%s: out of memory (%zu bytes)", fn, sizeof *d);
    }
    *d = tmp;
    *out = d;
    return NB_OK;
}

void nb_dist_destroy(nb_dist *d) {
    if (!nbd_live(d)) {
        return;
    }
    bool finalize = d->owns_mpi && !d->broken;
    for (int i = 0; i < NBD_S_N; i++) {
        nbd_free(d->ctx, d->scr[i]);
    }
    if (!d->broken && d->comm != MPI_COMM_NULL) {
        MPI_Comm_free(&d->comm);
    }
    d->magic = 0;
    nbd_free(d->ctx, d);
    if (finalize) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) {
            MPI_Finalize();
        }
    }
}

nb_status nb_dist_stats_get(const nb_dist *d, nb_dist_stats *out) {
    if (!nbd_live(d) || out == NULL) {
        if (nbd_live(d)) {
            return nb_tree_map_fail(d->ctx, NB_ERR_MISUSE, "nb_dist_stats_get: out is NULL");
        }
        fprintf(stderr, "nabla: nb_dist_stats_get: d is NULL or destroyed\n");
        return NB_ERR_MISUSE;
    }
    *out = d->stats;
    return NB_OK;
}

int nb_dist_rank(const nb_dist *d) {
    return nbd_live(d) ? d->rank : -1;
}

int nb_dist_size(const nb_dist *d) {
    return nbd_live(d) ? d->size : -1;
}

nb_ctx *nb_dist_ctx(const nb_dist *d) {
    return nbd_live(d) ? d->ctx : NULL;
}

nb_status nb_dist_barrier(nb_dist *d) {
    static const char fn[] = "nb_dist_barrier";
    nb_status st = nbd_enter(d, fn);
    if (st != NB_OK) {
        return st;
    }
    MPI_Request req;
    int rc = MPI_Ibarrier(d->comm, &req);
    if (rc != MPI_SUCCESS) {
        return nbd_mpi_fail(d, fn, "MPI_Ibarrier", rc);
    }
    return nbd_wait(d, &req, fn, "the barrier");
}

/* ---- trees: leaves, signatures ------------------------------------------------------ */

typedef struct nbd_leaves {
    nb_ctx *ctx; /* of sig */
    int64_t n;
    nb_tree *list;   /* nb_tree_flatten's list of dynamic leaves */
    nb_treedef *def; /* its treedef */
    char *sig;       /* "treedef\npath dtype[shape]\n...[\ncall: ...]" */
    size_t sig_len, sig_cap;
} nbd_leaves;

static void nbd_leaves_free(nbd_leaves *l) {
    nb_tree_destroy(l->list);
    nb_treedef_destroy(l->def);
    nbd_free(l->ctx, l->sig);
    memset(l, 0, sizeof *l);
}

static nb_status nbd_appendf(nb_dist *d, char **buf, size_t *len, size_t *cap, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

static nb_status nbd_appendf(nb_dist *d, char **buf, size_t *len, size_t *cap, const char *fmt,
                             ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k =
            vsnprintf(*buf != NULL ? *buf + *len : NULL, *buf != NULL ? *cap - *len : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            return nbd_fail(d, NB_ERR_INTERNAL, "nabla dist: formatting failed");
        }
        if (*buf != NULL && *len + (size_t)k < *cap) {
            *len += (size_t)k;
            return NB_OK;
        }
        size_t ncap = (*cap + (size_t)k + 1) * 2;
        char *nb = nbd_alloc(d->ctx, ncap);
        if (nb == NULL) {
            return nbd_fail(d, NB_ERR_OOM, "nabla dist: out of memory (%zu bytes)", ncap);
        }
        if (*buf != NULL) {
            memcpy(nb, *buf, *len);
            nbd_free(d->ctx, *buf);
        }
        *buf = nb;
        *cap = ncap;
    }
}

/* t's dynamic leaves (all must be arrays) and its signature. */
static nb_status nbd_leaves_of(nb_dist *d, const char *fn, const nb_tree *t, nbd_leaves *l) {
    memset(l, 0, sizeof *l);
    l->ctx = d->ctx;
    if (nb_tree_check(t) != NB_OK) {
        return nbd_fail(d, NB_ERR_MISUSE, "%s: a tree is NULL or destroyed", fn);
    }
    nb_status st = nb_tree_flatten(t, &l->list, &l->def);
    if (st != NB_OK) {
        return st;
    }
    l->n = nb_tree_len(l->list);
    size_t need = 0;
    nb_treedef_format(l->def, NULL, 0, &need);
    size_t cap = need + 256, len = 0;
    l->sig = nbd_alloc(d->ctx, cap);
    if (l->sig == NULL) {
        nbd_leaves_free(l);
        return nbd_fail(d, NB_ERR_OOM, "%s: out of memory (%zu bytes)", fn, cap);
    }
    nb_treedef_format(l->def, l->sig, cap, &need);
    len = strlen(l->sig);
    for (int64_t i = 0; i < l->n && st == NB_OK; i++) {
        const nb_array *a = nb_tree_get_array(nb_tree_child(l->list, i));
        char path[512] = "";
        nb_tree_leaf_path(t, i, path, sizeof path, NULL);
        if (a == NULL) {
            st = nbd_fail(d, NB_ERR_KIND,
                          "%s: leaf '%s' is a traced var; the collectives work on arrays (call "
                          "them outside a traced function, on the arrays a jitted call returned)",
                          fn, path);
            break;
        }
        char sig[256] = "";
        nb_array_format_sig(a, sig, sizeof sig, NULL);
        st = nbd_appendf(d, &l->sig, &len, &cap, "\n%s %s", path, sig);
    }
    if (st != NB_OK) {
        nbd_leaves_free(l);
        return st;
    }
    l->sig_len = len;
    l->sig_cap = cap;
    return NB_OK;
}

static uint64_t nbd_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    }
    return h;
}

/* The line of sig after `line` newlines (without its newline), into out. */
/* The line of sig after `line` newlines: *p its start (NULL past the end), *n its length. */
static void nbd_sig_line(const char *sig, int64_t line, const char **p, size_t *n) {
    const char *q = sig;
    for (int64_t k = 0; k < line && q != NULL; k++) {
        q = strchr(q, '\n');
        q = q != NULL ? q + 1 : NULL;
    }
    *p = q;
    *n = 0;
    if (q != NULL) {
        const char *e = strchr(q, '\n');
        *n = e != NULL ? (size_t)(e - q) : strlen(q);
    }
}

/* a line for a message: at most 500 characters of it, "(nothing)" past the end */
static void nbd_sig_show(const char *p, size_t n, char *out, size_t cap) {
    if (p == NULL) {
        snprintf(out, cap, "(nothing)");
        return;
    }
    snprintf(out, cap, "%.*s%s", (int)(n < 500 ? n : 500), p, n > 500 ? "..." : "");
}

/* Every process's signature must be rank 0's: one all-gather of hashes; on a difference,
 * rank 0's signature is broadcast and every process names the first differing line. */
static nb_status nbd_check_same(nb_dist *d, const char *fn, const nbd_leaves *l) {
    uint64_t h = nbd_hash(l->sig, l->sig_len);
    uint64_t *all = nbd_alloc(d->ctx, sizeof(uint64_t) * (size_t)d->size);
    if (all == NULL) {
        return nbd_fail(d, NB_ERR_OOM, "%s: out of memory", fn);
    }
    MPI_Request req;
    int rc = MPI_Iallgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, d->comm, &req);
    nb_status st = rc != MPI_SUCCESS ? nbd_mpi_fail(d, fn, "MPI_Iallgather", rc)
                                     : nbd_wait(d, &req, fn, "the trees' signature exchange");
    if (st != NB_OK) {
        nbd_free(d->ctx, all);
        return st;
    }
    int bad = -1, failed = -1;
    uint64_t mark = nbd_hash(NBD_MARK, sizeof NBD_MARK - 1);
    for (int r = 0; r < d->size; r++) {
        if (bad < 0 && all[r] != all[0]) {
            bad = r;
        }
        if (failed < 0 && all[r] == mark) {
            failed = r;
        }
    }
    nbd_free(d->ctx, all);
    if (bad < 0 && failed < 0) {
        return NB_OK;
    }
    if (failed >= 0) { /* every process returns here, the failed one too */
        return nbd_fail(d, NB_ERR_COMM,
                        "%s: rank %d of %d: rank %d failed before this exchange (its own "
                        "message says why); the call fails on every process",
                        fn, d->rank, d->size, failed);
    }
    /* rank 0's signature to everybody, then each names what differs */
    long long len0 = (long long)l->sig_len;
    rc = MPI_Ibcast(&len0, 1, MPI_LONG_LONG, 0, d->comm, &req);
    st = rc != MPI_SUCCESS ? nbd_mpi_fail(d, fn, "MPI_Ibcast", rc)
                           : nbd_wait(d, &req, fn, "the signature broadcast");
    if (st != NB_OK) {
        return st;
    }
    if (len0 < 0 || len0 >= INT_MAX) {
        return nbd_fail(d, NB_ERR_STRUCTURE, "%s: the trees differ between processes", fn);
    }
    char *s0 = nbd_alloc(d->ctx, (size_t)len0 + 1);
    if (s0 == NULL) {
        d->broken = true;
        return nbd_fail(d, NB_ERR_OOM, "%s: out of memory", fn);
    }
    if (d->rank == 0) {
        memcpy(s0, l->sig, (size_t)len0);
    }
    rc = MPI_Ibcast(s0, (int)len0, MPI_CHAR, 0, d->comm, &req);
    st = rc != MPI_SUCCESS ? nbd_mpi_fail(d, fn, "MPI_Ibcast", rc)
                           : nbd_wait(d, &req, fn, "the signature broadcast");
    if (st != NB_OK) {
        nbd_free(d->ctx, s0);
        return st;
    }
    s0[len0] = '\0';
    if (nbd_hash(s0, (size_t)len0) == nbd_hash(l->sig, l->sig_len)) {
        nbd_free(d->ctx, s0);
        return nbd_fail(d, NB_ERR_STRUCTURE,
                        "%s: rank %d of %d: the trees or the call differ between processes: rank "
                        "%d's are not rank 0's (its message names the leaf or argument); every "
                        "process must make the same call on trees of the same structure, dtypes "
                        "and shapes",
                        fn, d->rank, d->size, bad);
    }
    for (int64_t line = 0;; line++) {
        const char *pa = NULL, *pb = NULL;
        size_t na = 0, nb = 0;
        nbd_sig_line(l->sig, line, &pa, &na);
        nbd_sig_line(s0, line, &pb, &nb);
        if (pa == NULL && pb == NULL) { /* no line differs: the hashes collided */
            nbd_free(d->ctx, s0);
            return nbd_fail(d, NB_ERR_STRUCTURE,
                            "%s: rank %d of %d: the trees differ between processes (every "
                            "process must pass trees of the same structure, dtypes and shapes)",
                            fn, d->rank, d->size);
        }
        if ((pa == NULL) != (pb == NULL) || na != nb || memcmp(pa, pb, na) != 0) {
            char a[600], b[600];
            nbd_sig_show(pa, na, a, sizeof a);
            nbd_sig_show(pb, nb, b, sizeof b);
            nbd_free(d->ctx, s0);
            if (line == 0) {
                return nbd_fail(d, NB_ERR_STRUCTURE,
                                "%s: rank %d of %d: the tree's structure is %s here but %s on "
                                "rank 0; every process must pass trees of the same structure, "
                                "dtypes and shapes",
                                fn, d->rank, d->size, a, b);
            }
            if (strncmp(a, "call:", 5) == 0 || strncmp(b, "call:", 5) == 0) {
                return nbd_fail(d, NB_ERR_INVALID,
                                "%s: rank %d of %d: the call differs between processes: '%s' "
                                "here but '%s' on rank 0; every process must make the same call",
                                fn, d->rank, d->size, a, b);
            }
            return nbd_fail(d, NB_ERR_STRUCTURE,
                            "%s: rank %d of %d: leaf %lld differs between processes: '%s' here "
                            "but '%s' on rank 0; every process must pass trees of the same "
                            "structure, dtypes and shapes",
                            fn, d->rank, d->size, (long long)line - 1, a, b);
        }
    }
}

/* A process that failed before a collective every process makes (a bad local tree, an
 * error in its loss) still takes part in its first exchange, the signature check, with a
 * signature no tree has: so every other process fails there too (NB_ERR_COMM naming this
 * rank) instead of waiting for it. This process keeps its own error and message. */
static nb_status nbd_fail_everywhere(nb_dist *d, const char *fn, nb_status st) {
    if (d->broken) {
        return st;
    }
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", nb_ctx_errmsg(d->ctx));
    nbd_leaves l;
    memset(&l, 0, sizeof l);
    l.sig = (char *)NBD_MARK;
    l.sig_len = sizeof NBD_MARK - 1;
    (void)nbd_check_same(d, fn, &l);
    return nbd_fail(d, st, "%s", msg);
}

/* ---- parts and the fixed tree ------------------------------------------------------- */

nb_status nb_dist_parts(const nb_dist *d, int64_t n_parts, int64_t *first, int64_t *count) {
    static const char fn[] = "nb_dist_parts";
    if (!nbd_live(d) || first == NULL || count == NULL) {
        if (nbd_live(d)) {
            return nb_tree_map_fail(d->ctx, NB_ERR_MISUSE, "%s: first or count is NULL", fn);
        }
        fprintf(stderr, "nabla: %s: d is NULL or destroyed\n", fn);
        return NB_ERR_MISUSE;
    }
    if (n_parts < d->size || n_parts > (INT64_C(1) << 40)) {
        *first = *count = 0;
        return nb_tree_map_fail(d->ctx, NB_ERR_INVALID,
                                n_parts < d->size
                                    ? "%s: %lld parts for %d processes: every process needs at "
                                      "least one part (use at least as many micro-batches as "
                                      "processes)"
                                    : "%s: %lld parts for %d processes: at most 2^40 parts",
                                fn, (long long)n_parts, d->size);
    }
    int64_t a = n_parts * d->rank / d->size, b = n_parts * (d->rank + 1) / d->size;
    *first = a;
    *count = b - a;
    return NB_OK;
}

static void nbd_block(int64_t m, int size, int r, int64_t *a, int64_t *b) {
    *a = m * r / size;
    *b = m * (r + 1) / size;
}

/* The canonical nodes of block [a, b) in the tree over [lo, hi): appended to nodes (pairs). */
static int64_t nbd_canon(int64_t lo, int64_t hi, int64_t a, int64_t b, int64_t *nodes, int64_t k) {
    if (b <= lo || hi <= a) {
        return k;
    }
    if (a <= lo && hi <= b) {
        nodes[2 * k] = lo;
        nodes[2 * k + 1] = hi;
        return k + 1;
    }
    int64_t mid = lo + (hi - lo) / 2;
    k = nbd_canon(lo, mid, a, b, nodes, k);
    return nbd_canon(mid, hi, a, b, nodes, k);
}

/* dst[i] += src[i] in dtype dt (integers as unsigned: wrapping, exact); dst and src never
 * overlap (restrict: the loops vectorise without a run-time check; element-wise adds, so
 * the bits are those of the scalar loop) */
static void nbd_add(nb_dtype dt, void *restrict dst, const void *restrict src, int64_t n) {
    switch (dt) {
    case NB_DTYPE_F32: {
        float *restrict x = dst;
        const float *restrict y = src;
        for (int64_t i = 0; i < n; i++) {
            x[i] = x[i] + y[i];
        }
        break;
    }
    case NB_DTYPE_F64: {
        double *restrict x = dst;
        const double *restrict y = src;
        for (int64_t i = 0; i < n; i++) {
            x[i] = x[i] + y[i];
        }
        break;
    }
    case NB_DTYPE_I32: {
        uint32_t *restrict x = dst;
        const uint32_t *restrict y = src;
        for (int64_t i = 0; i < n; i++) {
            x[i] = x[i] + y[i];
        }
        break;
    }
    default: {
        uint64_t *restrict x = dst;
        const uint64_t *restrict y = src;
        for (int64_t i = 0; i < n; i++) {
            x[i] = x[i] + y[i];
        }
        break;
    }
    }
}

/* One dtype's slice of the reduction: the elements [s0, s0 + sn) of the packed vector. */
typedef struct nbd_group {
    nb_dtype dt;
    size_t esz;
    int64_t n; /* elements of this dtype over all leaves */
} nbd_group;

/* The local parts: part a + i's dynamic leaves are lists[i] (each n_leaves arrays). */
typedef struct nbd_src {
    nb_tree *const *lists;
    int64_t n_leaves;
} nbd_src;

/* part p's leaves of dtype g->dt, packed in leaf order into dst */
static void nbd_pack_part(const nbd_group *g, const nbd_src *src, int64_t p, char *dst) {
    size_t o = 0;
    for (int64_t i = 0; i < src->n_leaves; i++) {
        const nb_array *x = nb_tree_get_array(nb_tree_child(src->lists[p], i));
        if (nb_array_dtype(x) == g->dt) {
            memcpy(dst + o, nb_array_data(x), nb_array_nbytes(x));
            o += nb_array_nbytes(x);
        }
    }
}

/* value of node [lo, hi) of the local parts (part a + i from src) into dst; tmp has room for
 * depth * n elements */
static void nbd_local_node(const nbd_group *g, const nbd_src *src, int64_t a, int64_t lo,
                           int64_t hi, char *dst, char *tmp) {
    size_t row = (size_t)g->n * g->esz;
    if (hi - lo == 1) {
        nbd_pack_part(g, src, lo - a, dst);
        return;
    }
    int64_t mid = lo + (hi - lo) / 2;
    nbd_local_node(g, src, a, lo, mid, dst, tmp);
    nbd_local_node(g, src, a, mid, hi, tmp, tmp + row);
    nbd_add(g->dt, dst, tmp, g->n);
}

/* The root's value over a slice of sn elements, from the received canonical nodes (nodes:
 * pairs, total k; vals[j] the slice of node j): same descent as nbd_canon. */
static void nbd_root_node(const nbd_group *g, int64_t lo, int64_t hi, const int64_t *nodes,
                          int64_t k, char *const *vals, int64_t sn, char *dst, char *tmp) {
    size_t row = (size_t)sn * g->esz;
    for (int64_t j = 0; j < k; j++) {
        if (nodes[2 * j] == lo && nodes[2 * j + 1] == hi) {
            memcpy(dst, vals[j], row);
            return;
        }
    }
    int64_t mid = lo + (hi - lo) / 2;
    nbd_root_node(g, lo, mid, nodes, k, vals, sn, dst, tmp);
    nbd_root_node(g, mid, hi, nodes, k, vals, sn, tmp, tmp + row);
    nbd_add(g->dt, dst, tmp, sn);
}

static int nbd_depth(int64_t m) {
    int dep = 1;
    while ((INT64_C(1) << (dep - 1)) < m) {
        dep++;
    }
    return dep + 1;
}

/* Reduce one dtype group: local parts packed in parts (count rows of g->n), result (g->n
 * elements) into res. */
static nb_status nbd_reduce_group(nb_dist *d, const char *fn, const nbd_group *g, int64_t m,
                                  const nbd_src *src, char *res) {
    int N = d->size;
    int64_t a, b;
    nbd_block(m, N, d->rank, &a, &b);
    int depth = nbd_depth(m);
    /* every process's canonical nodes (computable everywhere, no message needed) */
    int64_t max_nodes = 2 * (int64_t)depth + 2;
    int64_t *nodes = nbd_alloc(d->ctx, sizeof(int64_t) * 2 * (size_t)max_nodes * (size_t)N);
    int64_t *kn = nbd_alloc(d->ctx, sizeof(int64_t) * (size_t)N);
    int *scount = nbd_alloc(d->ctx, sizeof(int) * 4 * (size_t)N);
    size_t esz = g->esz, row = (size_t)g->n * esz;
    char *mine = NULL, *send = NULL, *recv = NULL, *tmp = NULL, *slice = NULL;
    char **vals = NULL;
    nb_status st = NB_OK;
    if (nodes == NULL || kn == NULL || scount == NULL) {
        st = nbd_fail(d, NB_ERR_OOM, "%s: out of memory", fn);
        goto done;
    }
    for (int r = 0; r < N; r++) {
        int64_t ra, rb;
        nbd_block(m, N, r, &ra, &rb);
        kn[r] = nbd_canon(0, m, ra, rb, nodes + 2 * max_nodes * r, 0);
    }
    int64_t k = kn[d->rank];
    /* my canonical nodes' values */
    mine = nbd_scratch(d, NBD_S_MINE, row * (size_t)(k > 0 ? k : 1));
    tmp = nbd_scratch(d, NBD_S_TMP, row * (size_t)(depth + 1) + 1);
    if (mine == NULL || tmp == NULL) {
        st = nbd_fail(d, NB_ERR_OOM, "%s: out of memory (%zu bytes)", fn,
                      row * (size_t)(k > 0 ? k : 1) + row * (size_t)(depth + 1));
        goto done;
    }
    for (int64_t j = 0; j < k; j++) {
        const int64_t *nd = nodes + 2 * max_nodes * d->rank + 2 * j;
        nbd_local_node(g, src, a, nd[0], nd[1], mine + (size_t)j * row, tmp);
    }
    /* slices: process s completes elements [n s / N, n (s + 1) / N) */
    int *sdisp = scount + N, *rcount = scount + 2 * N, *rdisp = scount + 3 * N;
    int64_t total_send = 0, total_recv = 0;
    int64_t s0 = g->n * d->rank / N, sn = g->n * (d->rank + 1) / N - s0;
    for (int s = 0; s < N; s++) {
        int64_t len = g->n * (s + 1) / N - g->n * s / N;
        int64_t sb = k * len * (int64_t)esz, rbytes = kn[s] * sn * (int64_t)esz;
        if (sb > INT_MAX || rbytes > INT_MAX || total_send + sb > INT_MAX ||
            total_recv + rbytes > INT_MAX) {
            st = nbd_fail(d, NB_ERR_OVERFLOW,
                          "%s: %lld %s elements are too many for one exchange (MPI counts are "
                          "int); split the tree",
                          fn, (long long)g->n, nb_dtype_name(g->dt));
            goto done;
        }
        scount[s] = (int)sb;
        sdisp[s] = (int)total_send;
        rcount[s] = (int)rbytes;
        rdisp[s] = (int)total_recv;
        total_send += sb;
        total_recv += rbytes;
    }
    send = nbd_scratch(d, NBD_S_SEND, (size_t)total_send + 1);
    recv = nbd_scratch(d, NBD_S_RECV, (size_t)total_recv + 1);
    vals = nbd_alloc(d->ctx, sizeof(char *) * (size_t)(max_nodes * N));
    slice = nbd_scratch(d, NBD_S_SLICE, (size_t)(sn > 0 ? sn : 1) * esz * (size_t)(depth + 1) + 1);
    if (send == NULL || recv == NULL || vals == NULL || slice == NULL) {
        st = nbd_fail(d, NB_ERR_OOM, "%s: out of memory (%lld bytes)", fn,
                      (long long)(total_send + total_recv));
        goto done;
    }
    for (int s = 0; s < N; s++) {
        int64_t first = g->n * s / N, len = g->n * (s + 1) / N - first;
        for (int64_t j = 0; j < k; j++) {
            memcpy(send + sdisp[s] + (size_t)(j * len) * esz,
                   mine + (size_t)j * row + (size_t)first * esz, (size_t)len * esz);
        }
    }
    MPI_Request req;
    d->stats.bytes_sent += total_send - scount[d->rank]; /* what stays here is not sent */
    d->stats.bytes_received += total_recv - rcount[d->rank];
    int rc =
        MPI_Ialltoallv(send, scount, sdisp, MPI_BYTE, recv, rcount, rdisp, MPI_BYTE, d->comm, &req);
    st = rc != MPI_SUCCESS ? nbd_mpi_fail(d, fn, "MPI_Ialltoallv", rc)
                           : nbd_wait(d, &req, fn, "the exchange of partial sums");
    if (st != NB_OK) {
        goto done;
    }
    /* complete the root over my slice */
    int64_t *all_nodes = nbd_alloc(d->ctx, sizeof(int64_t) * 2 * (size_t)(max_nodes * N));
    if (all_nodes == NULL) {
        st = nbd_fail(d, NB_ERR_OOM, "%s: out of memory", fn);
        goto done;
    }
    int64_t kt = 0;
    for (int s = 0; s < N; s++) {
        for (int64_t j = 0; j < kn[s]; j++) {
            all_nodes[2 * kt] = nodes[2 * max_nodes * s + 2 * j];
            all_nodes[2 * kt + 1] = nodes[2 * max_nodes * s + 2 * j + 1];
            vals[kt] = recv + rdisp[s] + (size_t)(j * sn) * esz;
            kt++;
        }
    }
    if (sn > 0) {
        nbd_root_node(g, 0, m, all_nodes, kt, vals, sn, slice, slice + (size_t)sn * esz);
    }
    nbd_free(d->ctx, all_nodes);
    /* join the slices everywhere */
    for (int s = 0; s < N; s++) {
        int64_t first = g->n * s / N, len = g->n * (s + 1) / N - first;
        rcount[s] = (int)(len * (int64_t)esz);
        rdisp[s] = (int)(first * (int64_t)esz);
    }
    if ((int64_t)row > INT_MAX) {
        st = nbd_fail(d, NB_ERR_OVERFLOW, "%s: %zu bytes are too many for one exchange", fn, row);
        goto done;
    }
    d->stats.bytes_sent += sn * (int64_t)esz * (N - 1);
    d->stats.bytes_received += (int64_t)row - sn * (int64_t)esz;
    rc = MPI_Iallgatherv(slice, (int)(sn * (int64_t)esz), MPI_BYTE, res, rcount, rdisp, MPI_BYTE,
                         d->comm, &req);
    st = rc != MPI_SUCCESS ? nbd_mpi_fail(d, fn, "MPI_Iallgatherv", rc)
                           : nbd_wait(d, &req, fn, "the gathering of the sums");
done:
    nbd_free(d->ctx, nodes);
    nbd_free(d->ctx, kn);
    nbd_free(d->ctx, scount);
    nbd_free(d->ctx, vals);
    return st;
}

/* ---- reduce_parts ------------------------------------------------------------------- */

/* a's elements divided by m, in a's dtype, when a is f32 or f64 (others are left) */
static void nbd_div(nb_array *a, int64_t m) {
    int64_t cnt = nb_array_size(a);
    if (nb_array_dtype(a) == NB_DTYPE_F32) {
        float *x = nb_array_data(a), mf = (float)m;
        for (int64_t i = 0; i < cnt; i++) {
            x[i] = x[i] / mf;
        }
    } else if (nb_array_dtype(a) == NB_DTYPE_F64) {
        double *x = nb_array_data(a), md = (double)m;
        for (int64_t i = 0; i < cnt; i++) {
            x[i] = x[i] / md;
        }
    }
}

typedef struct nbd_fill {
    const char *const *res; /* per dtype: the reduced vector */
    int64_t *off;           /* per dtype: the next element */
    nb_dist_op op;
    int64_t m;
    nb_ctx *ctx;
} nbd_fill;

static nb_status nbd_fill_leaf(void *ud, const char *path, int n, const nb_tree *const *leaves,
                               nb_tree **out) {
    (void)path;
    (void)n;
    nbd_fill *f = ud;
    const nb_array *a = nb_tree_get_array(leaves[0]);
    nb_dtype dt = nb_array_dtype(a);
    size_t esz = nb_dtype_size(dt);
    nb_array *c = NULL; /* the sums, copied once into a new array of a's shape */
    nb_status st = nb_array_from_data(nb_array_ctx(a), dt, nb_array_rank(a), nb_array_shape(a),
                                      f->res[dt] + (size_t)f->off[dt] * esz, &c);
    if (st != NB_OK) {
        return st;
    }
    f->off[dt] += nb_array_size(c);
    if (f->op == NB_DIST_MEAN) {
        nbd_div(c, f->m);
    }
    st = nb_tree_array(c, out);
    nb_array_destroy(c);
    return st;
}

/* Every process's buffers for the reduction, reserved before the exchange begins (so that a
 * process that cannot have them fails the call everywhere), and the MPI counts checked for
 * every process alike (each process knows every process's nodes and slices). */
static nb_status nbd_reserve(nb_dist *d, const char *fn, const nbd_group *groups, int64_t m) {
    int N = d->size, depth = nbd_depth(m);
    size_t need[NBD_S_N] = {0};
    for (int t = 0; t < NB_DTYPE_COUNT; t++) {
        const nbd_group *g = &groups[t];
        if (g->n == 0) {
            continue;
        }
        size_t esz = g->esz, row = (size_t)g->n * esz;
        int64_t nodes[2 * 130], ktot = 0, kmax = 0, kme = 0;
        for (int r = 0; r < N; r++) {
            int64_t ra, rb;
            nbd_block(m, N, r, &ra, &rb);
            int64_t k = nbd_canon(0, m, ra, rb, nodes, 0);
            ktot += k;
            kmax = k > kmax ? k : kmax;
            kme = r == d->rank ? k : kme;
        }
        int64_t slice_max = g->n / N + 1, sn = g->n * (d->rank + 1) / N - g->n * d->rank / N;
        /* the largest send (kmax rows) and receive (every node's slice) of any process */
        if ((double)kmax * (double)row > (double)INT_MAX ||
            (double)ktot * (double)slice_max * (double)esz > (double)INT_MAX ||
            (double)row > (double)INT_MAX) {
            return nbd_fail(d, NB_ERR_OVERFLOW,
                            "%s: %lld %s elements x %lld partial sums are too many bytes for one "
                            "exchange (MPI counts are int): reduce a smaller tree, or fewer parts",
                            fn, (long long)g->n, nb_dtype_name(g->dt), (long long)kmax);
        }
        size_t want[NBD_S_N] = {0};
        want[NBD_S_MINE] = row * (size_t)(kme > 0 ? kme : 1);
        want[NBD_S_TMP] = row * (size_t)(depth + 1) + 1;
        want[NBD_S_SEND] = row * (size_t)(kme > 0 ? kme : 1) + 1;
        want[NBD_S_RECV] = (size_t)ktot * (size_t)(sn > 0 ? sn : 1) * esz + 1;
        want[NBD_S_SLICE] = (size_t)(sn > 0 ? sn : 1) * esz * (size_t)(depth + 1) + 1;
        for (int i = NBD_S_MINE; i < NBD_S_N; i++) {
            need[i] = want[i] > need[i] ? want[i] : need[i];
        }
    }
    for (int i = NBD_S_MINE; i < NBD_S_N; i++) {
        if (need[i] > 0 && nbd_scratch(d, i, need[i]) == NULL) {
            return nbd_fail(d, NB_ERR_OOM, "%s: out of memory (%zu bytes)", fn, need[i]);
        }
    }
    return NB_OK;
}

static nb_status nbd_reduce(nb_dist *d, const char *fn, int64_t m, const nb_tree *const *local,
                            int64_t count, nb_dist_op op, const char *call, nb_tree **out) {
    nbd_leaves l0;
    nb_status st = nbd_leaves_of(d, fn, local[0], &l0);
    if (st != NB_OK) {
        return nbd_fail_everywhere(d, fn, st);
    }
    /* the call is part of what every process must agree on */
    st = nbd_appendf(d, &l0.sig, &l0.sig_len, &l0.sig_cap, "\ncall: %lld parts, %s%s%s",
                     (long long)m, op == NB_DIST_SUM ? "sum" : "mean", call != NULL ? ", " : "",
                     call != NULL ? call : "");
    /* the local trees all alike */
    for (int64_t i = 1; i < count && st == NB_OK; i++) {
        nbd_leaves li;
        st = nbd_leaves_of(d, fn, local[i], &li);
        if (st == NB_OK && (li.sig_len > l0.sig_len || memcmp(li.sig, l0.sig, li.sig_len) != 0 ||
                            l0.sig[li.sig_len] != '\n')) {
            st = nbd_fail(d, NB_ERR_STRUCTURE,
                          "%s: local[%lld] differs from local[0] (every part's tree must have "
                          "the same structure, dtypes and shapes)",
                          fn, (long long)i);
        }
        if (li.list != NULL) {
            nbd_leaves_free(&li);
        }
    }
    /* dtypes: sums of bool are refused, means of integers too */
    for (int64_t i = 0; i < l0.n && st == NB_OK; i++) {
        nb_dtype dt = nb_array_dtype(nb_tree_get_array(nb_tree_child(l0.list, i)));
        if (dt == NB_DTYPE_BOOL || (op == NB_DIST_MEAN && !nb_dtype_is_float(dt))) {
            char path[512] = "";
            nb_tree_leaf_path(local[0], i, path, sizeof path, NULL);
            st = nbd_fail(d, NB_ERR_DTYPE,
                          "%s: leaf '%s' is %s: %s (cast it, or leave it out of the tree)", fn,
                          path, nb_dtype_name(dt),
                          dt == NB_DTYPE_BOOL ? "bool leaves have no sum"
                                              : "a mean of integers is not an integer");
        }
    }
    /* agree on the tree everywhere (a local failure above still takes part, so that no
     * process waits alone: its signature is marked) */
    if (st != NB_OK) {
        nbd_leaves_free(&l0);
        return nbd_fail_everywhere(d, fn, st);
    }
    nbd_group groups[NB_DTYPE_COUNT];
    char *res[NB_DTYPE_COUNT] = {NULL};
    int64_t off[NB_DTYPE_COUNT] = {0};
    for (int t = 0; t < NB_DTYPE_COUNT; t++) {
        groups[t].dt = (nb_dtype)t;
        groups[t].esz = nb_dtype_size((nb_dtype)t);
        groups[t].n = 0;
    }
    for (int64_t i = 0; i < l0.n && st == NB_OK; i++) {
        const nb_array *a = nb_tree_get_array(nb_tree_child(l0.list, i));
        groups[nb_array_dtype(a)].n += nb_array_size(a);
    }
    /* the parts' leaves, and a result buffer per dtype */
    nb_tree **lists = nbd_calloc(d->ctx, (size_t)count * sizeof *lists);
    if (lists == NULL) {
        st = nbd_fail(d, NB_ERR_OOM, "%s: out of memory", fn);
    }
    for (int64_t p = 0; p < count && st == NB_OK; p++) {
        st = nb_tree_flatten(local[p], &lists[p], NULL);
    }
    for (int t = 0; t < NB_DTYPE_COUNT && st == NB_OK; t++) {
        if (groups[t].n > 0) {
            size_t row = (size_t)groups[t].n * groups[t].esz;
            res[t] = nbd_scratch(d, NBD_S_RES + t, row + 1);
            if (res[t] == NULL) {
                st = nbd_fail(d, NB_ERR_OOM, "%s: out of memory (%zu bytes)", fn, row);
            }
        }
    }
    if (st == NB_OK) {
        st = nbd_reserve(d, fn, groups, m);
    }
    /* the buffers are there (a process without them fails the exchange everywhere): agree
     * on the trees, then every process runs the same sequence of collectives, one group
     * after another (the groups are the same everywhere: the signatures matched). The few
     * small buffers inside the exchange can still fail on one process alone: the others
     * then wait for the timeout. */
    st = st == NB_OK ? nbd_check_same(d, fn, &l0) : nbd_fail_everywhere(d, fn, st);
    nbd_src src = {lists, l0.n};
    for (int t = 0; t < NB_DTYPE_COUNT && st == NB_OK; t++) {
        if (groups[t].n > 0) {
            st = nbd_reduce_group(d, fn, &groups[t], m, &src, res[t]);
        }
    }
    if (st == NB_OK) {
        nbd_fill f = {(const char *const *)res, off, op, m, d->ctx};
        st = nb_tree_map(local[0], nbd_fill_leaf, &f, 0, out);
    }
    for (int64_t p = 0; lists != NULL && p < count; p++) {
        nb_tree_destroy(lists[p]);
    }
    nbd_free(d->ctx, lists);
    nbd_leaves_free(&l0);
    return st;
}

static nb_status nbd_reduce_args(nb_dist *d, const char *fn, nb_dist_op op, nb_tree **out) {
    if (out == NULL) {
        return nbd_fail(d, NB_ERR_MISUSE, "%s: out is NULL (pass the address of an nb_tree *)", fn);
    }
    if (op != NB_DIST_SUM && op != NB_DIST_MEAN) {
        return nbd_fail(d, NB_ERR_INVALID, "%s: op %d is not NB_DIST_SUM or NB_DIST_MEAN", fn,
                        (int)op);
    }
    return NB_OK;
}

nb_status nb_dist_reduce_parts(nb_dist *d, int64_t n_parts, const nb_tree *const *local,
                               nb_dist_op op, nb_tree **out) {
    static const char fn[] = "nb_dist_reduce_parts";
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbd_enter(d, fn);
    if (st != NB_OK) {
        return st;
    }
    /* from here on a failure on one process must fail the call on all (nbd_fail_everywhere):
     * the others are about to wait for it */
    st = nbd_reduce_args(d, fn, op, out);
    if (st == NB_OK && local == NULL) {
        st = nbd_fail(d, NB_ERR_MISUSE, "%s: local is NULL (pass this process's part trees)", fn);
    }
    int64_t first = 0, count = 0;
    if (st == NB_OK) {
        st = nb_dist_parts(d, n_parts, &first, &count);
    }
    if (st != NB_OK) {
        return nbd_fail_everywhere(d, fn, st);
    }
    return nbd_reduce(d, fn, n_parts, local, count, op, NULL, out);
}

nb_status nb_dist_allreduce(nb_dist *d, const nb_tree *t, nb_dist_op op, nb_tree **out) {
    static const char fn[] = "nb_dist_allreduce";
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbd_enter(d, fn);
    if (st != NB_OK) {
        return st;
    }
    st = nbd_reduce_args(d, fn, op, out);
    if (st != NB_OK) {
        return nbd_fail_everywhere(d, fn, st);
    }
    return nbd_reduce(d, fn, d->size, &t, 1, op, NULL, out);
}

/* ---- broadcast, allgather ----------------------------------------------------------- */

static nb_status nbd_pack_bytes(nb_dist *d, const char *fn, const nbd_leaves *l, char **buf,
                                size_t *len) {
    size_t n = 0;
    for (int64_t i = 0; i < l->n; i++) {
        n += nb_array_nbytes(nb_tree_get_array(nb_tree_child(l->list, i)));
    }
    if (n > (size_t)INT_MAX) {
        return nbd_fail(d, NB_ERR_OVERFLOW,
                        "%s: %zu bytes are too many for one exchange (MPI counts are int); "
                        "split the tree",
                        fn, n);
    }
    *buf = nbd_alloc(d->ctx, n + 1);
    if (*buf == NULL) {
        return nbd_fail(d, NB_ERR_OOM, "%s: out of memory (%zu bytes)", fn, n);
    }
    *len = n;
    return NB_OK;
}

nb_status nb_dist_broadcast(nb_dist *d, nb_tree *t, int root) {
    static const char fn[] = "nb_dist_broadcast";
    nb_status st = nbd_enter(d, fn);
    if (st != NB_OK) {
        return st;
    }
    if (root < 0 || root >= d->size) {
        return nbd_fail_everywhere(d, fn,
                                   nbd_fail(d, NB_ERR_INVALID,
                                            "%s: root %d is not a rank (0 .. %d)", fn, root,
                                            d->size - 1));
    }
    nbd_leaves l;
    st = nbd_leaves_of(d, fn, t, &l);
    if (st != NB_OK) {
        return nbd_fail_everywhere(d, fn, st);
    }
    char *buf = NULL;
    size_t len = 0;
    st = nbd_appendf(d, &l.sig, &l.sig_len, &l.sig_cap, "\ncall: root %d", root);
    if (st == NB_OK) {
        st = nbd_pack_bytes(d, fn, &l, &buf, &len);
    }
    if (st != NB_OK) {
        nbd_leaves_free(&l);
        return nbd_fail_everywhere(d, fn, st);
    }
    st = nbd_check_same(d, fn, &l);
    if (st == NB_OK) {
        size_t o = 0;
        for (int64_t i = 0; i < l.n && d->rank == root; i++) {
            const nb_array *a = nb_tree_get_array(nb_tree_child(l.list, i));
            memcpy(buf + o, nb_array_data(a), nb_array_nbytes(a));
            o += nb_array_nbytes(a);
        }
        MPI_Request req;
        if (d->rank == root) {
            d->stats.bytes_sent += (int64_t)len * (d->size - 1);
        } else {
            d->stats.bytes_received += (int64_t)len;
        }
        int rc = MPI_Ibcast(buf, (int)len, MPI_BYTE, root, d->comm, &req);
        st = rc != MPI_SUCCESS ? nbd_mpi_fail(d, fn, "MPI_Ibcast", rc)
                               : nbd_wait(d, &req, fn, "the broadcast");
        o = 0;
        for (int64_t i = 0; i < l.n && st == NB_OK && d->rank != root; i++) {
            const nb_array *a = nb_tree_get_array(nb_tree_child(l.list, i));
            memcpy(nb_array_data(a), buf + o, nb_array_nbytes(a));
            o += nb_array_nbytes(a);
        }
    }
    nbd_free(d->ctx, buf);
    nbd_leaves_free(&l);
    return st;
}

typedef struct nbd_gather {
    const char *buf;
    size_t per, off;
    int size;
} nbd_gather;

static nb_status nbd_gather_leaf(void *ud, const char *path, int n, const nb_tree *const *leaves,
                                 nb_tree **out) {
    (void)path;
    (void)n;
    nbd_gather *g = ud;
    const nb_array *a = nb_tree_get_array(leaves[0]);
    int rank = nb_array_rank(a);
    if (rank >= NB_MAX_RANK) {
        return nb_tree_map_fail(nb_array_ctx(a), NB_ERR_SHAPE,
                                "nb_dist_allgather: leaf '%s' has rank %d: stacking it over the "
                                "processes would exceed rank %d",
                                path, rank, NB_MAX_RANK);
    }
    int64_t shape[NB_MAX_RANK];
    shape[0] = g->size;
    memcpy(shape + 1, nb_array_shape(a), sizeof(int64_t) * (size_t)rank);
    nb_array *s = NULL;
    nb_status st = nb_array_zeros(nb_array_ctx(a), nb_array_dtype(a), rank + 1, shape, &s);
    if (st != NB_OK) {
        return st;
    }
    size_t nb = nb_array_nbytes(a);
    for (int r = 0; r < g->size; r++) {
        memcpy((char *)nb_array_data(s) + (size_t)r * nb, g->buf + (size_t)r * g->per + g->off, nb);
    }
    g->off += nb;
    st = nb_tree_array(s, out);
    nb_array_destroy(s);
    return st;
}

nb_status nb_dist_allgather(nb_dist *d, const nb_tree *t, nb_tree **out) {
    static const char fn[] = "nb_dist_allgather";
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbd_enter(d, fn);
    if (st != NB_OK) {
        return st;
    }
    if (out == NULL) {
        return nbd_fail_everywhere(
            d, fn,
            nbd_fail(d, NB_ERR_MISUSE, "%s: out is NULL (pass the address of an nb_tree *)", fn));
    }
    nbd_leaves l;
    st = nbd_leaves_of(d, fn, t, &l);
    if (st != NB_OK) {
        return nbd_fail_everywhere(d, fn, st);
    }
    /* buffers first: a process that cannot have them fails the exchange everywhere */
    char *mine = NULL, *all = NULL;
    size_t len = 0;
    st = nbd_pack_bytes(d, fn, &l, &mine, &len);
    if (st == NB_OK && len * (size_t)d->size > (size_t)INT_MAX) {
        st = nbd_fail(d, NB_ERR_OVERFLOW, "%s: %zu bytes x %d processes are too many", fn, len,
                      d->size);
    }
    if (st == NB_OK) {
        all = nbd_alloc(d->ctx, len * (size_t)d->size + 1);
        if (all == NULL) {
            st = nbd_fail(d, NB_ERR_OOM, "%s: out of memory", fn);
        }
    }
    if (st != NB_OK) {
        nbd_free(d->ctx, mine);
        nbd_leaves_free(&l);
        return nbd_fail_everywhere(d, fn, st);
    }
    st = nbd_check_same(d, fn, &l);
    if (st == NB_OK) {
        size_t o = 0;
        for (int64_t i = 0; i < l.n; i++) {
            const nb_array *a = nb_tree_get_array(nb_tree_child(l.list, i));
            memcpy(mine + o, nb_array_data(a), nb_array_nbytes(a));
            o += nb_array_nbytes(a);
        }
        MPI_Request req;
        d->stats.bytes_sent += (int64_t)len * (d->size - 1);
        d->stats.bytes_received += (int64_t)len * (d->size - 1);
        int rc = MPI_Iallgather(mine, (int)len, MPI_BYTE, all, (int)len, MPI_BYTE, d->comm, &req);
        st = rc != MPI_SUCCESS ? nbd_mpi_fail(d, fn, "MPI_Iallgather", rc)
                               : nbd_wait(d, &req, fn, "the all-gather");
    }
    if (st == NB_OK) {
        nbd_gather g = {all, len, 0, d->size};
        st = nb_tree_map(t, nbd_gather_leaf, &g, 0, out);
    }
    nbd_free(d->ctx, mine);
    nbd_free(d->ctx, all);
    nbd_leaves_free(&l);
    return st;
}

/* ---- checkpoints --------------------------------------------------------------------- */

nb_status nb_dist_checkpoint_save(nb_dist *d, const char *path, const nb_tree *params,
                                  const nb_tree *opt_state, const nb_array *key, int64_t step) {
    static const char fn[] = "nb_dist_checkpoint_save";
    nb_status st = nbd_enter(d, fn);
    if (st != NB_OK) {
        return st;
    }
    struct {
        int code;
        char msg[1020];
    } r;
    memset(&r, 0, sizeof r);
    if (d->rank == 0) {
        r.code = (int)nb_checkpoint_save(path, params, opt_state, key, step);
        if (r.code != NB_OK) {
            snprintf(r.msg, sizeof r.msg, "%s", nb_ctx_errmsg(d->ctx));
        }
    }
    MPI_Request req;
    int rc = MPI_Ibcast(&r, (int)sizeof r, MPI_BYTE, 0, d->comm, &req);
    st = rc != MPI_SUCCESS ? nbd_mpi_fail(d, fn, "MPI_Ibcast", rc)
                           : nbd_wait(d, &req, fn, "waiting for rank 0's checkpoint write");
    if (st != NB_OK) {
        return st;
    }
    if (r.code != NB_OK) {
        return nbd_fail(d, (nb_status)r.code, "%s: rank %d of %d: rank 0 could not write %s: %s",
                        fn, d->rank, d->size, path != NULL ? path : "(NULL)", r.msg);
    }
    return NB_OK;
}

/* ---- data-parallel training --------------------------------------------------------- */

struct nb_dist_train {
    uint32_t magic;
    nb_dist *d;
    nb_ctx *ctx; /* d's: the step may outlive d */
    int64_t m;   /* parts per step */
    bool has_aux, donate;
    nb_tree *opt, *filter;
    nb_fn *grad;   /* jit(value_and_grad(loss)) */
    nb_fn *update; /* jit((params, state, grads) -> (params', state')) */
};

static nb_status nbd_update_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    const nb_tree *params = nb_tree_child(args, 0), *state = nb_tree_child(args, 1);
    const nb_tree *grads = nb_tree_child(args, 2), *updates = NULL, *new_state = NULL;
    nb_status st = nb_optim_update(tr, self, grads, state, params, &updates, &new_state);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *new_params = nb_apply_updates(tr, params, updates);
    if (new_params == NULL) {
        return nb_trace_status(tr);
    }
    st = nb_tree_tuple(nb_trace_ctx(tr), 2, (const nb_tree *[]){new_params, new_state}, out);
    return st != NB_OK ? st : nb_trace_status(tr);
}

nb_status nb_dist_train_create(nb_dist *d, nb_fn *loss, const nb_tree *opt,
                               const nb_train_opts *opts, int64_t n_parts, nb_dist_train **out) {
    static const char fn[] = "nb_dist_train_create";
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbd_enter(d, fn);
    if (st != NB_OK) {
        return st;
    }
    if (loss == NULL || opt == NULL || out == NULL) {
        return nbd_fail(d, NB_ERR_MISUSE, "%s: %s is NULL", fn,
                        loss == NULL  ? "loss"
                        : opt == NULL ? "opt"
                                      : "out");
    }
    int64_t first = 0, count = 0;
    st = nb_dist_parts(d, n_parts, &first, &count);
    if (st != NB_OK) {
        return st;
    }
    nb_train_opts o = opts != NULL ? *opts : nb_train_opts_default();
    nb_dist_train *t = nbd_calloc(d->ctx, sizeof *t);
    if (t == NULL) {
        return nbd_fail(d, NB_ERR_OOM, "%s: out of memory", fn);
    }
    t->magic = NBD_TRAIN_MAGIC;
    t->d = d;
    t->ctx = d->ctx;
    t->m = n_parts;
    t->has_aux = o.has_aux;
    t->donate = o.donate;
    t->opt = nb_tree_retain((nb_tree *)opt);
    t->filter = o.filter_spec != NULL ? nb_tree_retain((nb_tree *)o.filter_spec) : NULL;
    nb_grad_opts go = nb_grad_opts_default();
    go.has_aux = o.has_aux;
    go.filter_spec = o.filter_spec;
    nb_fn *vg = NULL, *up = NULL;
    st = nb_value_and_grad(loss, &go, &vg);
    if (st == NB_OK) {
        st = nb_jit(vg, &o.jit, &t->grad);
    }
    if (st == NB_OK) {
        st = nb_fn_create(d->ctx, "nb_dist_update", nbd_update_body, opt, &up);
    }
    if (st == NB_OK) {
        st = nb_jit(up, &o.jit, &t->update);
    }
    nb_fn_destroy(vg);
    nb_fn_destroy(up);
    if (st != NB_OK) {
        nb_dist_train_destroy(t);
        return st;
    }
    *out = t;
    return NB_OK;
}

nb_status nb_dist_train_stats(const nb_dist_train *t, nb_fn_stats *grad, nb_fn_stats *update) {
    if (t == NULL || t->magic != NBD_TRAIN_MAGIC) {
        fprintf(stderr, "nabla: nb_dist_train_stats: t is NULL or destroyed\n");
        return NB_ERR_MISUSE;
    }
    nb_status st = grad != NULL ? nb_fn_stats_get(t->grad, grad) : NB_OK;
    if (st == NB_OK && update != NULL) {
        st = nb_fn_stats_get(t->update, update);
    }
    return st;
}

void nb_dist_train_destroy(nb_dist_train *t) {
    if (t == NULL || t->magic != NBD_TRAIN_MAGIC) {
        return;
    }
    nb_fn_destroy(t->grad);
    nb_fn_destroy(t->update);
    nb_tree_destroy(t->opt);
    nb_tree_destroy(t->filter);
    t->magic = 0;
    nbd_free(t->ctx, t);
}

static nb_status nbd_train_check(nb_dist_train *t, const char *fn) {
    if (t == NULL || t->magic != NBD_TRAIN_MAGIC) {
        fprintf(stderr, "nabla: %s: t is NULL or destroyed\n", fn);
        return NB_ERR_MISUSE;
    }
    return nbd_enter(t->d, fn);
}

nb_status nb_dist_train_init(nb_dist_train *t, nb_tree **params, nb_tree **state) {
    static const char fn[] = "nb_dist_train_init";
    nb_status st = nbd_train_check(t, fn);
    if (st != NB_OK) {
        return st;
    }
    if (params == NULL || *params == NULL || state == NULL) {
        return nbd_fail_everywhere(
            t->d, fn,
            nbd_fail(t->d, NB_ERR_MISUSE, "%s: %s is NULL", fn,
                     params == NULL || *params == NULL ? "params" : "state"));
    }
    *state = NULL;
    st = nb_dist_broadcast(t->d, *params, 0);
    nb_tree *tmpl = NULL;
    if (st == NB_OK) {
        st = nb_grad_template(*params, t->filter, &tmpl);
    }
    if (st == NB_OK) {
        st = nb_optim_init(t->opt, tmpl, state);
    }
    nb_tree_destroy(tmpl);
    return st;
}

typedef struct nbd_slice {
    int64_t i, rows;
} nbd_slice;

static nb_status nbd_slice_leaf(void *ud, const char *path, int n, const nb_tree *const *leaves,
                                nb_tree **out) {
    (void)path;
    (void)n;
    const nbd_slice *s = ud;
    nb_array *v = NULL;
    nb_status st =
        nb_array_rows(nb_tree_get_array(leaves[0]), s->i * s->rows, (s->i + 1) * s->rows, &v);
    if (st != NB_OK) {
        return st;
    }
    st = nb_tree_array(v, out);
    nb_array_destroy(v);
    return st;
}

/* (params, *batch) as nb_train_run spreads a batch */
static nb_status nbd_loss_args(nb_ctx *ctx, const nb_tree *params, const nb_tree *batch,
                               nb_tree **out) {
    nb_tree_kind k = nb_tree_kind_of(batch);
    bool spread = k == NB_TREE_KIND_TUPLE || k == NB_TREE_KIND_LIST;
    int64_t n = spread ? nb_tree_len(batch) : 1;
    const nb_tree *items[64];
    if (n + 1 > 64) {
        return nb_tree_map_fail(ctx, NB_ERR_INVALID,
                                "nb_dist_train_run: a batch of %lld items (at most 63)",
                                (long long)n);
    }
    items[0] = params;
    for (int64_t i = 0; i < n; i++) {
        items[1 + i] = spread ? nb_tree_child(batch, i) : batch;
    }
    return nb_tree_tuple(ctx, n + 1, items, out);
}

nb_status nb_dist_train_run(nb_dist_train *t, nb_tree **params, nb_tree **state,
                            const nb_tree *local_batch, double *loss, nb_tree **aux) {
    static const char fn[] = "nb_dist_train_run";
    if (loss != NULL) {
        *loss = 0.0;
    }
    if (aux != NULL) {
        *aux = NULL;
    }
    nb_status st = nbd_train_check(t, fn);
    if (st != NB_OK) {
        return st;
    }
    nb_dist *d = t->d;
    nb_ctx *ctx = d->ctx;
    if (params == NULL || *params == NULL || state == NULL || *state == NULL ||
        local_batch == NULL) {
        return nbd_fail_everywhere(d, fn,
                                   nbd_fail(d, NB_ERR_MISUSE, "%s: %s is NULL", fn,
                                            params == NULL || *params == NULL ? "params"
                                            : state == NULL || *state == NULL ? "state"
                                                                              : "local_batch"));
    }
    if (aux != NULL && !t->has_aux) {
        return nbd_fail_everywhere(
            d, fn,
            nbd_fail(d, NB_ERR_MISUSE, "%s: aux is not NULL but the step was built without has_aux",
                     fn));
    }
    int64_t first = 0, count = 0;
    st = nb_dist_parts(d, t->m, &first, &count);
    if (st != NB_OK) {
        return st;
    }
    /* rows: every array leaf of the local batch has count * rows rows */
    nb_tree *blist = NULL;
    st = nb_tree_flatten(local_batch, &blist, NULL);
    int64_t total = -1;
    for (int64_t i = 0; st == NB_OK && i < nb_tree_len(blist); i++) {
        const nb_array *a = nb_tree_get_array(nb_tree_child(blist, i));
        int64_t r = a != NULL && nb_array_rank(a) > 0 ? nb_array_shape(a)[0] : -1;
        if (r < 0 || (total >= 0 && r != total) || r % count != 0) {
            char path[512] = "";
            nb_tree_leaf_path(local_batch, i, path, sizeof path, NULL);
            st = nbd_fail(d, NB_ERR_SHAPE,
                          "%s: rank %d: local_batch leaf '%s' has %lld rows; every leaf must "
                          "have this process's %lld micro-batches of equal size (parts %lld .. "
                          "%lld of %lld: count * m rows)",
                          fn, d->rank, path, (long long)r, (long long)count, (long long)first,
                          (long long)(first + count - 1), (long long)t->m);
        }
        total = r;
    }
    nb_tree_destroy(blist);
    if (st == NB_OK && total <= 0) {
        st = nbd_fail(d, NB_ERR_SHAPE, "%s: local_batch has no array leaf", fn);
    }
    /* per micro-batch: (value, grads) -> the tuple (loss, aux or null, grads) */
    nb_tree **parts = nbd_calloc(ctx, (size_t)count * sizeof *parts);
    if (st == NB_OK && parts == NULL) {
        st = nbd_fail(d, NB_ERR_OOM, "%s: out of memory", fn);
    }
    for (int64_t i = 0; i < count && st == NB_OK; i++) {
        nbd_slice s = {i, total / count};
        nb_tree *mb = NULL, *args = NULL, *vg = NULL;
        st = nb_tree_map(local_batch, nbd_slice_leaf, &s, 0, &mb);
        if (st == NB_OK) {
            st = nbd_loss_args(ctx, *params, mb, &args);
        }
        if (st == NB_OK) {
            st = nb_fn_call(t->grad, args, &vg);
        }
        if (st == NB_OK) {
            const nb_tree *value = nb_tree_child(vg, 0);
            nb_tree *null = NULL;
            st = nb_tree_null(ctx, &null);
            if (st == NB_OK) {
                st = nb_tree_tuple(ctx, 3,
                                   (const nb_tree *[]){t->has_aux ? nb_tree_child(value, 0) : value,
                                                       t->has_aux ? nb_tree_child(value, 1) : null,
                                                       nb_tree_child(vg, 1)},
                                   &parts[i]);
            }
            nb_tree_destroy(null);
        }
        nb_tree_destroy(vg);
        nb_tree_destroy(args);
        nb_tree_destroy(mb);
    }
    /* A local failure must not leave the others waiting: a failed process still joins the
     * reduction's signature exchange (with a mark no one else has), which fails everywhere. */
    nb_tree *sum = NULL;
    if (st == NB_OK) {
        char call[64]; /* every process's micro-batches must be of one size */
        snprintf(call, sizeof call, "micro-batches of %lld rows", (long long)(total / count));
        st = nbd_reduce(d, fn, t->m, (const nb_tree *const *)parts, count, NB_DIST_SUM, call, &sum);
    } else {
        st = nbd_fail_everywhere(d, fn, st);
    }
    for (int64_t i = 0; i < count && parts != NULL; i++) {
        nb_tree_destroy(parts[i]);
    }
    nbd_free(ctx, parts);
    if (st != NB_OK) {
        nb_tree_destroy(sum);
        return st;
    }
    /* loss and grads: the mean over the parts (float leaves / m); aux stays the sum */
    nb_tree *lg = NULL, *mean = NULL;
    st = nb_tree_tuple(ctx, 2, (const nb_tree *[]){nb_tree_child(sum, 0), nb_tree_child(sum, 2)},
                       &lg);
    nb_tree *leaves = NULL; /* the sum's new arrays: divided in place */
    if (st == NB_OK) {
        st = nb_tree_flatten(lg, &leaves, NULL);
    }
    for (int64_t i = 0; st == NB_OK && i < nb_tree_len(leaves); i++) {
        nbd_div(nb_tree_get_array(nb_tree_child(leaves, i)), t->m);
    }
    nb_tree_destroy(leaves);
    if (st == NB_OK) {
        mean = lg;
        lg = NULL;
    }
    /* the update, the same on every process */
    nb_tree *uargs = NULL, *res = NULL;
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 3, (const nb_tree *[]){*params, *state, nb_tree_child(mean, 1)},
                           &uargs);
    }
    if (st == NB_OK) {
        nb_call_opts co = nb_call_opts_default();
        nb_tree *yes = NULL, *no = NULL, *dspec = NULL;
        if (t->donate) {
            st = nb_tree_bool(ctx, true, &yes);
            if (st == NB_OK) {
                st = nb_tree_bool(ctx, false, &no);
            }
            if (st == NB_OK) {
                st = nb_tree_tuple(ctx, 3, (const nb_tree *[]){yes, yes, no}, &dspec);
            }
            co.donate = dspec;
        }
        if (st == NB_OK) {
            st = nb_fn_call_ex(t->update, uargs, &co, &res);
        }
        nb_tree_destroy(yes);
        nb_tree_destroy(no);
        nb_tree_destroy(dspec);
    }
    if (st == NB_OK) {
        nb_tree_destroy(*params);
        nb_tree_destroy(*state);
        *params = nb_tree_retain((nb_tree *)nb_tree_child(res, 0));
        *state = nb_tree_retain((nb_tree *)nb_tree_child(res, 1));
        if (loss != NULL) {
            double v = 0.0;
            const nb_array *la = nb_tree_get_array(nb_tree_child(mean, 0));
            *loss = la != NULL && nb_array_get_flat(la, 0, &v) == NB_OK ? v : 0.0;
        }
        if (aux != NULL) {
            *aux = nb_tree_retain((nb_tree *)nb_tree_child(sum, 1));
        }
    }
    nb_tree_destroy(res);
    nb_tree_destroy(uargs);
    nb_tree_destroy(mean);
    nb_tree_destroy(lg);
    nb_tree_destroy(sum);
    return st;
}
