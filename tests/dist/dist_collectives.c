/*
 * dist_collectives.c -- nabla/dist.h's collectives, run by run_dist.sh under
 * `mpirun -np N` for N = 1 .. 4 (every process runs every check; a failed check prints
 * "FAIL rank r: ..." and the process exits 1).
 *
 *   dist_collectives            the checks below; rank 0 prints "digest <hex>" of the
 *                               parts reduction, which must be the same for every N
 *   dist_collectives die        rank 1 kills itself (SIGKILL) before an all-reduce; the
 *                               others must fail with NB_ERR_COMM within the timeout
 *                               (NABLA_DIST_TIMEOUT) and print "rank r: NB_ERR_COMM: ..."
 *
 * The checks: misuse (NULL handles and out-parameters); all-reduce of a tree with a null
 * slot, a static leaf and three dtypes (exact sums; the same bits on every process);
 * nb_dist_parts' blocks; the reduction of 12 parts whose float sums depend on the order,
 * bit for bit the single-process sum in the fixed tree (computed here without MPI) for
 * every N; NB_DIST_MEAN; a mean of integers refused everywhere; trees that differ between
 * processes (the message names the leaf and both signatures); a local failure on one
 * process failing the call on all; broadcast in place; all-gather; too few parts.
 */
#include <nabla/dist.h>
#include <nabla/nabla.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_rank = -1, g_fail = 0;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL rank %d: %s:%d: %s: ", g_rank, __FILE__, __LINE__, #cond);                \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            fflush(stdout);                                                                        \
            g_fail++;                                                                              \
        }                                                                                          \
    } while (0)

#define OK(ctx, expr)                                                                              \
    do {                                                                                           \
        nb_status ok_st_ = (expr);                                                                 \
        CHECK(ok_st_ == NB_OK, "%s: %s", nb_status_name(ok_st_), nb_ctx_errmsg(ctx));              \
    } while (0)

static nb_tree *leaf(nb_array *a) {
    nb_tree *t = NULL;
    nb_tree_array(a, &t);
    nb_array_destroy(a);
    return t;
}

static nb_array *arr_f32(nb_ctx *ctx, int64_t n, const float *v) {
    nb_array *a = NULL;
    nb_array_from_data(ctx, NB_DTYPE_F32, 1, (int64_t[]){n}, v, &a);
    return a;
}

/* part j's values: magnitudes spread over 2^-20 .. 2^20 and both signs, so f32 sums depend on
 * the order of the additions */
static float part_value(int64_t j, int64_t i) {
    uint64_t h = (uint64_t)(j * 1000003 + i * 7919 + 17) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    int e = (int)(h % 41) - 20;
    float s = (h >> 8) & 1 ? -1.0f : 1.0f;
    return s * ldexpf(1.0f + (float)((h >> 12) % 1000) / 1000.0f, e);
}

enum { NP = 12, NV = 37 };

static nb_tree *part_tree(nb_ctx *ctx, int64_t j) {
    float v[NV];
    double w[3];
    for (int i = 0; i < NV; i++) {
        v[i] = part_value(j, i);
    }
    for (int i = 0; i < 3; i++) {
        w[i] = (double)part_value(j, 100 + i) * 1e-3;
    }
    nb_array *b = NULL;
    nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){3}, w, &b);
    nb_tree *items[2] = {leaf(arr_f32(ctx, NV, v)), leaf(b)}, *t = NULL;
    nb_tree_dict(ctx, 2, (const char *[]){"v", "w"}, items, &t);
    nb_tree_destroy(items[0]);
    nb_tree_destroy(items[1]);
    return t;
}

/* the fixed tree's sum of parts [lo, hi) of element i, in f32 / f64, without MPI */
static float ref_f32(int64_t lo, int64_t hi, int64_t i) {
    if (hi - lo == 1) {
        return part_value(lo, i);
    }
    int64_t mid = lo + (hi - lo) / 2;
    float a = ref_f32(lo, mid, i), b = ref_f32(mid, hi, i);
    return a + b;
}
static double ref_f64(int64_t lo, int64_t hi, int64_t i) {
    if (hi - lo == 1) {
        return (double)part_value(lo, 100 + i) * 1e-3;
    }
    int64_t mid = lo + (hi - lo) / 2;
    double a = ref_f64(lo, mid, i), b = ref_f64(mid, hi, i);
    return a + b;
}

static uint64_t digest(const nb_tree *t) {
    uint64_t h = 1469598103934665603ull;
    nb_tree *list = NULL;
    nb_tree_flatten(t, &list, NULL);
    for (int64_t k = 0; k < nb_tree_len(list); k++) {
        const nb_array *a = nb_tree_get_array(nb_tree_child(list, k));
        const unsigned char *p = nb_array_data(a);
        for (size_t i = 0; i < nb_array_nbytes(a); i++) {
            h = (h ^ p[i]) * 1099511628211ull;
        }
    }
    nb_tree_destroy(list);
    return h;
}

static void check_misuse(nb_ctx *ctx, nb_dist *d) {
    nb_tree *out = (nb_tree *)1;
    CHECK(nb_dist_rank(NULL) == -1 && nb_dist_size(NULL) == -1 && nb_dist_ctx(NULL) == NULL,
          "NULL accessors");
    CHECK(nb_dist_allreduce(NULL, NULL, NB_DIST_SUM, &out) == NB_ERR_MISUSE && out == NULL,
          "allreduce(NULL)");
    CHECK(nb_dist_allreduce(d, NULL, NB_DIST_SUM, NULL) == NB_ERR_MISUSE, "NULL out");
    CHECK(strstr(nb_ctx_errmsg(ctx), "nb_dist_allreduce: out is NULL") != NULL, "%s",
          nb_ctx_errmsg(ctx));
    CHECK(nb_dist_create(ctx, MPI_COMM_WORLD, NULL, NULL) == NB_ERR_MISUSE, "create NULL out");
    CHECK(nb_dist_create(NULL, MPI_COMM_WORLD, NULL, (nb_dist **)&out) == NB_ERR_MISUSE,
          "create NULL ctx");
    CHECK(nb_dist_broadcast(NULL, NULL, 0) == NB_ERR_MISUSE, "broadcast NULL");
    CHECK(nb_dist_broadcast(d, NULL, 0) == NB_ERR_MISUSE, "broadcast NULL tree");
    CHECK(nb_dist_broadcast(d, NULL, nb_dist_size(d)) == NB_ERR_INVALID, "root out of range");
    CHECK(nb_dist_allgather(NULL, NULL, NULL) == NB_ERR_MISUSE, "allgather NULL");
    CHECK(nb_dist_barrier(NULL) == NB_ERR_MISUSE, "barrier NULL");
    int64_t f = 0, c = 0;
    CHECK(nb_dist_parts(NULL, 4, &f, &c) == NB_ERR_MISUSE, "parts NULL");
    CHECK(nb_dist_parts(d, 4, NULL, &c) == NB_ERR_MISUSE, "parts NULL first");
    CHECK(nb_dist_reduce_parts(d, 4, NULL, NB_DIST_SUM, &out) == NB_ERR_MISUSE && out == NULL,
          "reduce_parts NULL local");
    CHECK(nb_dist_allreduce(d, NULL, (nb_dist_op)7, &out) == NB_ERR_INVALID, "bad op");
    CHECK(nb_dist_train_create(NULL, NULL, NULL, NULL, 4, NULL) == NB_ERR_MISUSE, "train NULL");
    CHECK(nb_dist_train_init(NULL, NULL, NULL) == NB_ERR_MISUSE, "train_init NULL");
    CHECK(nb_dist_train_run(NULL, NULL, NULL, NULL, NULL, NULL) == NB_ERR_MISUSE, "train_run NULL");
    nb_dist_destroy(NULL);
    nb_dist_train_destroy(NULL);
    CHECK(nb_dist_checkpoint_save(NULL, "x", NULL, NULL, NULL, 0) == NB_ERR_MISUSE, "ckpt NULL");
    nb_ctx_clear_error(ctx);
}

/* sum over ranks of a tree with a null, a static int and f32 / f64 / i32 leaves */
static void check_allreduce(nb_ctx *ctx, nb_dist *d) {
    int r = nb_dist_rank(d), n = nb_dist_size(d);
    float a[5];
    double b[6];
    int32_t c[4];
    for (int i = 0; i < 5; i++) {
        a[i] = (float)((r + 1) * (i + 1));
    }
    for (int i = 0; i < 6; i++) {
        b[i] = 0.5 * r + i;
    }
    for (int i = 0; i < 4; i++) {
        c[i] = r * 100 + i - 2;
    }
    nb_array *ba = NULL, *ca = NULL;
    nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){2, 3}, b, &ba);
    nb_array_from_data(ctx, NB_DTYPE_I32, 1, (int64_t[]){4}, c, &ca);
    nb_tree *items[4] = {leaf(arr_f32(ctx, 5, a)), NULL, NULL, NULL}, *pair = NULL, *t = NULL;
    nb_tree_null(ctx, &items[1]);
    nb_tree *bc[2] = {leaf(ba), leaf(ca)};
    nb_tree_tuple(ctx, 2, bc, &pair);
    items[2] = pair;
    nb_tree_int(ctx, 7, &items[3]);
    OK(ctx, nb_tree_dict(ctx, 4, (const char *[]){"a", "frozen", "bc", "s"}, items, &t));
    nb_tree *s = NULL;
    OK(ctx, nb_dist_allreduce(d, t, NB_DIST_SUM, &s));
    if (s != NULL) {
        const float *sa = nb_array_data(nb_tree_get_array(nb_tree_get(s, "a")));
        for (int i = 0; i < 5; i++) {
            CHECK(sa[i] == (float)((i + 1) * n * (n + 1) / 2), "a[%d] = %g", i, sa[i]);
        }
        const nb_tree *sbc = nb_tree_get(s, "bc");
        const double *sbd = nb_array_data(nb_tree_get_array(nb_tree_child(sbc, 0)));
        const int32_t *sci = nb_array_data(nb_tree_get_array(nb_tree_child(sbc, 1)));
        for (int i = 0; i < 6; i++) {
            CHECK(sbd[i] == 0.5 * n * (n - 1) / 2 + (double)n * i, "b[%d] = %g", i, sbd[i]);
        }
        for (int i = 0; i < 4; i++) {
            CHECK(sci[i] == 100 * n * (n - 1) / 2 + n * (i - 2), "c[%d] = %d", i, sci[i]);
        }
        CHECK(nb_tree_kind_of(nb_tree_get(s, "frozen")) == NB_TREE_KIND_NULL, "null kept");
        int64_t sv = 0;
        CHECK(nb_tree_get_int(nb_tree_get(s, "s"), &sv) == NB_OK && sv == 7, "static kept");
        CHECK(nb_ctx_stats_get(ctx, &(nb_ctx_stats){0}) == NB_OK, "stats");
    }
    nb_tree_destroy(s);
    /* the mean of an integer leaf: refused everywhere */
    s = NULL;
    nb_status st = nb_dist_allreduce(d, t, NB_DIST_MEAN, &s);
    CHECK(st == NB_ERR_DTYPE && s == NULL, "mean of i32: %s", nb_status_name(st));
    CHECK(strstr(nb_ctx_errmsg(ctx), "leaf 'bc[1]' is i32") != NULL, "%s", nb_ctx_errmsg(ctx));
    nb_tree_destroy(t);
    for (int i = 0; i < 4; i++) {
        nb_tree_destroy(items[i]);
    }
    nb_tree_destroy(bc[0]);
    nb_tree_destroy(bc[1]);
}

/* NP parts reduced over the processes = the fixed tree's single-process sum, bit for bit */
static uint64_t check_parts(nb_ctx *ctx, nb_dist *d) {
    int n = nb_dist_size(d);
    int64_t first = -1, count = -1;
    OK(ctx, nb_dist_parts(d, NP, &first, &count));
    CHECK(first == NP * nb_dist_rank(d) / n && count == NP * (nb_dist_rank(d) + 1) / n - first,
          "block %lld + %lld", (long long)first, (long long)count);
    nb_tree *local[NP];
    for (int64_t i = 0; i < count; i++) {
        local[i] = part_tree(ctx, first + i);
    }
    nb_tree *s = NULL, *m = NULL;
    OK(ctx, nb_dist_reduce_parts(d, NP, (const nb_tree *const *)local, NB_DIST_SUM, &s));
    OK(ctx, nb_dist_reduce_parts(d, NP, (const nb_tree *const *)local, NB_DIST_MEAN, &m));
    uint64_t h = 0;
    if (s != NULL && m != NULL) {
        const float *v = nb_array_data(nb_tree_get_array(nb_tree_get(s, "v")));
        const float *mv = nb_array_data(nb_tree_get_array(nb_tree_get(m, "v")));
        const double *w = nb_array_data(nb_tree_get_array(nb_tree_get(s, "w")));
        int differ = 0, seq_differs = 0;
        for (int i = 0; i < NV; i++) {
            float want = ref_f32(0, NP, i), seq = 0.0f;
            for (int j = 0; j < NP; j++) {
                seq += part_value(j, i);
            }
            seq_differs += seq != want;
            differ += memcmp(&v[i], &want, sizeof want) != 0;
            float mw = want / (float)NP;
            differ += memcmp(&mv[i], &mw, sizeof mw) != 0;
        }
        for (int i = 0; i < 3; i++) {
            double want = ref_f64(0, NP, i);
            differ += memcmp(&w[i], &want, sizeof want) != 0;
        }
        CHECK(differ == 0, "%d elements differ from the fixed tree's sum", differ);
        /* the test means something: a left-to-right sum differs from the tree's */
        CHECK(seq_differs > 0, "no element's sum depends on the order: the check is void");
        h = digest(s);
    }
    nb_tree_destroy(s);
    nb_tree_destroy(m);
    /* a local failure on the last process (its parts differ among themselves) fails the
     * call everywhere, with a message on each */
    if (n > 1 && count >= 2) {
        nb_tree *keep = local[1];
        if (nb_dist_rank(d) == n - 1) {
            float one = 1.0f;
            local[1] = leaf(arr_f32(ctx, 1, &one));
        }
        s = NULL;
        nb_status st = nb_dist_reduce_parts(d, NP, (const nb_tree *const *)local, NB_DIST_SUM, &s);
        if (nb_dist_rank(d) == n - 1) {
            CHECK(st == NB_ERR_STRUCTURE && strstr(nb_ctx_errmsg(ctx), "local[1] differs") != NULL,
                  "%s: %s", nb_status_name(st), nb_ctx_errmsg(ctx));
            nb_tree_destroy(local[1]);
            local[1] = keep;
        } else {
            char want[64];
            snprintf(want, sizeof want, "rank %d failed before this exchange", n - 1);
            CHECK(st == NB_ERR_COMM && strstr(nb_ctx_errmsg(ctx), want) != NULL, "%s: %s",
                  nb_status_name(st), nb_ctx_errmsg(ctx));
        }
        CHECK(s == NULL, "output on failure");
    }
    for (int64_t i = 0; i < count; i++) {
        nb_tree_destroy(local[i]);
    }
    /* fewer parts than processes */
    if (n > 1) {
        nb_tree *one = part_tree(ctx, 0);
        s = NULL;
        CHECK(nb_dist_reduce_parts(d, n - 1, (const nb_tree *const *)&one, NB_DIST_SUM, &s) ==
                      NB_ERR_INVALID &&
                  strstr(nb_ctx_errmsg(ctx), "every process needs at least one part") != NULL,
              "%s", nb_ctx_errmsg(ctx));
        nb_tree_destroy(one);
    }
    nb_ctx_clear_error(ctx);
    return h;
}

/* trees that differ between processes: the last process's 'v' is one element short */
static void check_mismatch(nb_ctx *ctx, nb_dist *d) {
    int r = nb_dist_rank(d), n = nb_dist_size(d);
    if (n < 2) {
        return;
    }
    float v[3] = {1, 2, 3};
    nb_tree *x = leaf(arr_f32(ctx, r == n - 1 ? 2 : 3, v)), *t = NULL, *s = NULL;
    nb_tree_dict(ctx, 1, (const char *[]){"v"}, (nb_tree *[]){x}, &t);
    nb_status st = nb_dist_allreduce(d, t, NB_DIST_SUM, &s);
    CHECK(st == NB_ERR_STRUCTURE && s == NULL, "%s", nb_status_name(st));
    if (r == n - 1) {
        CHECK(strstr(nb_ctx_errmsg(ctx), "'v f32[2]' here but 'v f32[3]' on rank 0") != NULL, "%s",
              nb_ctx_errmsg(ctx));
    } else {
        CHECK(strstr(nb_ctx_errmsg(ctx), "the trees or the call differ") != NULL, "%s",
              nb_ctx_errmsg(ctx));
    }
    /* broadcast checks the same */
    st = nb_dist_broadcast(d, t, 0);
    CHECK(st == NB_ERR_STRUCTURE, "broadcast: %s", nb_status_name(st));
    /* misuse on one process alone (rank 0 passes no tree): it gets NB_ERR_MISUSE, the
     * others an error naming it at once -- nobody waits for the timeout */
    double t0 = MPI_Wtime();
    st = nb_dist_allgather(d, r == 0 ? NULL : t, &s);
    if (r == 0) {
        CHECK(st == NB_ERR_MISUSE, "%s", nb_status_name(st));
    } else {
        CHECK(st == NB_ERR_COMM && strstr(nb_ctx_errmsg(ctx), "rank 0 failed before") != NULL,
              "%s: %s", nb_status_name(st), nb_ctx_errmsg(ctx));
    }
    CHECK(s == NULL && MPI_Wtime() - t0 < 30, "one-sided misuse took %.1f s", MPI_Wtime() - t0);
    /* the call's arguments must agree too: an op that differs on the last process */
    float w[3] = {1, 2, 3};
    nb_tree *same = leaf(arr_f32(ctx, 3, w));
    st = nb_dist_allreduce(d, same, r == n - 1 ? NB_DIST_MEAN : NB_DIST_SUM, &s);
    if (r == n - 1) {
        char want[128];
        snprintf(want, sizeof want, "the call differs between processes: 'call: %d parts, mean'",
                 n);
        CHECK(st == NB_ERR_INVALID && s == NULL && strstr(nb_ctx_errmsg(ctx), want) != NULL,
              "%s: %s", nb_status_name(st), nb_ctx_errmsg(ctx));
    } else {
        CHECK(st == NB_ERR_STRUCTURE && s == NULL &&
                  strstr(nb_ctx_errmsg(ctx), "the trees or the call differ") != NULL,
              "%s: %s", nb_status_name(st), nb_ctx_errmsg(ctx));
    }
    nb_tree_destroy(same);
    /* trees that differ only far into their structure (a static leaf past the first 600
     * characters of the treedef): found, not looped over */
    nb_tree *items[121];
    for (int i = 0; i < 120; i++) {
        nb_tree_int(ctx, i == 119 && r == n - 1 ? -1 : i, &items[i]);
    }
    items[120] = leaf(arr_f32(ctx, 3, w));
    nb_tree *big = NULL;
    nb_tree_tuple(ctx, 121, items, &big);
    st = nb_dist_allreduce(d, big, NB_DIST_SUM, &s);
    CHECK(st == NB_ERR_STRUCTURE && s == NULL, "%s: %s", nb_status_name(st), nb_ctx_errmsg(ctx));
    if (r == n - 1) {
        CHECK(strstr(nb_ctx_errmsg(ctx), "the tree's structure is") != NULL, "%s",
              nb_ctx_errmsg(ctx));
    }
    nb_tree_destroy(big);
    for (int i = 0; i < 121; i++) {
        nb_tree_destroy(items[i]);
    }
    nb_tree_destroy(x);
    nb_tree_destroy(t);
    nb_ctx_clear_error(ctx);
}

static void check_broadcast_gather(nb_ctx *ctx, nb_dist *d) {
    int r = nb_dist_rank(d), n = nb_dist_size(d);
    float v[4] = {(float)r, (float)r + 0.5f, -(float)r, 1e-30f * (float)r};
    int64_t iv = r;
    nb_array *ia = NULL;
    nb_array_from_data(ctx, NB_DTYPE_I64, 0, NULL, &iv, &ia);
    nb_tree *items[3] = {leaf(arr_f32(ctx, 4, v)), leaf(ia), NULL}, *t = NULL;
    nb_tree_null(ctx, &items[2]);
    nb_tree_tuple(ctx, 3, items, &t);
    int root = n - 1;
    OK(ctx, nb_dist_broadcast(d, t, root));
    const float *bv = nb_array_data(nb_tree_get_array(nb_tree_child(t, 0)));
    float want[4] = {(float)root, (float)root + 0.5f, -(float)root, 1e-30f * (float)root};
    CHECK(memcmp(bv, want, sizeof want) == 0, "broadcast values");
    CHECK(*(const int64_t *)nb_array_data(nb_tree_get_array(nb_tree_child(t, 1))) == root,
          "broadcast i64");
    /* all-gather of each process's own values */
    int64_t mine = 10 * r;
    nb_array *ma = NULL;
    nb_array_from_data(ctx, NB_DTYPE_I64, 0, NULL, &mine, &ma);
    nb_tree *ml = leaf(ma), *g = NULL;
    OK(ctx, nb_dist_allgather(d, ml, &g));
    if (g != NULL) {
        const nb_array *ga = nb_tree_get_array(g);
        CHECK(nb_array_rank(ga) == 1 && nb_array_shape(ga)[0] == n, "gathered shape");
        for (int k = 0; k < n; k++) {
            CHECK(((const int64_t *)nb_array_data(ga))[k] == 10 * k, "gathered row %d", k);
        }
    }
    /* the all-reduce result is the same bits on every process: gather it and compare */
    nb_tree *s = NULL, *gs = NULL;
    OK(ctx, nb_dist_allreduce(d, t, NB_DIST_SUM, &s));
    if (s != NULL) {
        OK(ctx, nb_dist_allgather(d, nb_tree_child(s, 0), &gs));
    }
    if (gs != NULL) {
        const float *rows = nb_array_data(nb_tree_get_array(gs));
        for (int k = 1; k < n; k++) {
            CHECK(memcmp(rows, rows + 4 * k, 4 * sizeof(float)) == 0, "rank %d's sum differs", k);
        }
    }
    nb_tree_destroy(gs);
    nb_tree_destroy(s);
    nb_tree_destroy(g);
    nb_tree_destroy(ml);
    nb_tree_destroy(t);
    for (int i = 0; i < 3; i++) {
        nb_tree_destroy(items[i]);
    }
}

/* Allocation failures (one process only, where no other process waits on this one): every
 * allocation of the collectives in turn fails; each call then returns NB_ERR_OOM with no
 * output, and nothing is left allocated. nabla_dist allocates through the context's
 * allocator (nb_ctx_alloc), so this reaches its own buffers too. */
typedef struct fail_alloc {
    long n, fail_at;
    size_t live;
} fail_alloc;

static void *fa_alloc(void *ud, size_t size, size_t align) {
    fail_alloc *f = ud;
    if (++f->n == f->fail_at) {
        return NULL;
    }
    void *p = aligned_alloc(align, (size + align - 1) / align * align);
    f->live += p != NULL ? size : 0;
    return p;
}

static void fa_free(void *ud, void *p, size_t size) {
    fail_alloc *f = ud;
    f->live -= size;
    free(p);
}

static int check_oom(void) {
    int points = 0;
    for (long k = 1;; k++) {
        fail_alloc f = {0, 0, 0};
        nb_ctx_opts co = nb_ctx_opts_default();
        co.allocator.alloc = fa_alloc;
        co.allocator.free = fa_free;
        co.allocator.ud = &f;
        co.n_threads = 1;
        nb_ctx *ctx = NULL;
        nb_dist *d = NULL;
        if (nb_ctx_create(&co, &ctx) != NB_OK || nb_dist_create(ctx, MPI_COMM_WORLD, NULL, &d)) {
            CHECK(0, "setup");
            return points;
        }
        nb_tree *parts[3] = {part_tree(ctx, 0), part_tree(ctx, 1), part_tree(ctx, 2)};
        nb_tree *o1 = NULL, *o2 = NULL, *o3 = NULL;
        f.fail_at = f.n + k;
        nb_status s1 = nb_dist_allreduce(d, parts[0], NB_DIST_MEAN, &o1);
        nb_status s2 = nb_dist_reduce_parts(d, 3, (const nb_tree *const *)parts, NB_DIST_SUM, &o2);
        nb_status s3 = nb_dist_allgather(d, parts[1], &o3);
        nb_status s4 = nb_dist_broadcast(d, parts[2], 0);
        bool hit = f.n >= f.fail_at;
        f.fail_at = 0;
        nb_status all[4] = {s1, s2, s3, s4};
        nb_tree *outs[3] = {o1, o2, o3};
        for (int i = 0; i < 4; i++) {
            CHECK(all[i] == NB_OK || all[i] == NB_ERR_OOM, "point %ld: call %d: %s: %s", k, i,
                  nb_status_name(all[i]), nb_ctx_errmsg(ctx));
            CHECK(i == 3 || (all[i] == NB_OK) == (outs[i] != NULL), "point %ld: output %d", k, i);
        }
        for (int i = 0; i < 3; i++) {
            nb_tree_destroy(outs[i]);
            nb_tree_destroy(parts[i]);
        }
        nb_dist_destroy(d);
        nb_ctx_destroy(ctx);
        CHECK(f.live == 0, "point %ld: %zu bytes left allocated", k, f.live);
        if (!hit) {
            break; /* every allocation has failed once */
        }
        points++;
    }
    return points;
}

/* rank 1 dies; the survivors' all-reduce must fail with NB_ERR_COMM within the timeout */
static int run_die(nb_ctx *ctx, nb_dist *d) {
    int r = nb_dist_rank(d);
    OK(ctx, nb_dist_barrier(d));
    if (r == 1) {
        raise(SIGKILL);
    }
    float v = 1.0f;
    nb_tree *t = leaf(arr_f32(ctx, 1, &v)), *s = NULL;
    nb_status st = nb_dist_allreduce(d, t, NB_DIST_SUM, &s);
    printf("rank %d: %s: %s\n", r, nb_status_name(st), nb_ctx_errmsg(ctx));
    fflush(stdout);
    CHECK(st == NB_ERR_COMM && s == NULL, "the survivor's status");
    /* unusable afterwards, and says so */
    nb_status st2 = nb_dist_barrier(d);
    CHECK(st2 == NB_ERR_COMM && strstr(nb_ctx_errmsg(ctx), "an earlier collective failed"), "%s",
          nb_ctx_errmsg(ctx));
    nb_tree_destroy(t);
    nb_dist_destroy(d);
    nb_ctx_destroy(ctx);
    /* MPI cannot be finalized with a dead peer: leave without it (mpirun reports it) */
    exit(g_fail == 0 && st == NB_ERR_COMM ? 3 : 1);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    nb_ctx_opts co = nb_ctx_opts_default();
    co.n_threads = 1;
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(&co, &ctx) != NB_OK) {
        return 1;
    }
    nb_dist *d = NULL;
    OK(ctx, nb_dist_create(ctx, MPI_COMM_WORLD, NULL, &d));
    if (d == NULL) {
        return 1;
    }
    g_rank = nb_dist_rank(d);
    if (argc > 1 && strcmp(argv[1], "die") == 0) {
        return run_die(ctx, d);
    }
    check_misuse(ctx, d);
    check_allreduce(ctx, d);
    uint64_t h = check_parts(ctx, d);
    check_mismatch(ctx, d);
    check_broadcast_gather(ctx, d);
    if (nb_dist_size(d) == 1) {
        int points = check_oom();
        CHECK(points > 50, "only %d allocation points", points);
        printf("allocation failures: %d points\n", points);
    }
    OK(ctx, nb_dist_barrier(d));
    if (g_rank == 0) {
        printf("digest %016llx\n", (unsigned long long)h);
    }
    int fails = g_fail;
    nb_dist_destroy(d);
    nb_ctx_destroy(ctx);
    MPI_Finalize();
    if (fails == 0) {
        printf("rank %d: ok\n", g_rank);
    }
    return fails == 0 ? 0 : 1;
}
