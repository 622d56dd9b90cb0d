#include "nbtest.h"

#include <stdlib.h>

typedef struct nbt_hdr {
    size_t size;
    size_t pad;
} nbt_hdr;

static void *nbt_alloc_fn(void *ud, size_t size, size_t align) {
    nbt_alloc *st = ud;
    st->n_calls++;
    if (st->fail_at > 0 &&
        (st->n_calls == st->fail_at || (st->fail_all_after && st->n_calls > st->fail_at))) {
        st->n_failed++;
        return NULL;
    }
    size_t rounded = (size + align - 1) / align * align;
    void *p = aligned_alloc(align, rounded);
    if (p == NULL) {
        return NULL;
    }
    st->n_live++;
    st->live_bytes += size;
    return p;
}

static void nbt_free_fn(void *ud, void *ptr, size_t size) {
    nbt_alloc *st = ud;
    st->n_live--;
    st->live_bytes -= size;
    free(ptr);
}

nb_allocator nbt_alloc_make(nbt_alloc *state) {
    nb_allocator a = {.alloc = nbt_alloc_fn, .free = nbt_free_fn, .ud = state};
    return a;
}

/* A handle destroyed twice is an error the library logs and survives (nabla/core.h); in a
 * test it is a bug (a reference released that was not owned): counted here, and
 * nbt_assert_no_live fails on it. */
static int nbt_double_destroys;

static void nbt_log(void *ud, nb_log_level level, const char *msg) {
    (void)ud;
    if (level == NB_LOG_LEVEL_ERROR &&
        strstr(msg, "was already destroyed (each reference") != NULL) {
        nbt_double_destroys++;
        fprintf(stderr, "nbtest: %s\n", msg);
    }
}

void nbt_expect_double_destroys(int n) {
    int got = nbt_double_destroys;
    nbt_double_destroys = 0;
    if (got != n) {
        fail_msg("%d handles destroyed twice, expected %d", got, n);
    }
}

nb_ctx *nbt_ctx_with(nbt_alloc *state) {
    nb_ctx_opts o = nb_ctx_opts_default();
    o.allocator = nbt_alloc_make(state);
    o.log = nbt_log;
    o.log_level = NB_LOG_LEVEL_ERROR;
    nb_ctx *ctx = NULL;
    nb_status s = nb_ctx_create(&o, &ctx);
    if (s != NB_OK) {
        fail_msg("nb_ctx_create failed: %s", nb_status_name(s));
    }
    return ctx;
}

nb_ctx *nbt_ctx(void) {
    nb_ctx *ctx = NULL;
    nb_ctx_opts o = nb_ctx_opts_default();
    o.log = nbt_log;
    o.log_level = NB_LOG_LEVEL_ERROR;
    nb_status s = nb_ctx_create(&o, &ctx);
    if (s != NB_OK) {
        fail_msg("nb_ctx_create failed: %s", nb_status_name(s));
    }
    return ctx;
}

nb_tree *nbt_tuple_take(nb_ctx *ctx, int n, nb_tree **items) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, n, items, &t));
    for (int i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    return t;
}

void nbt_assert_no_live(nb_ctx *ctx) {
    /* The compile cache holds treedefs and constant arrays of its own: drop it first. */
    nb_ctx_clear_cache(ctx);
    nb_ctx_stats s;
    NBT_OK(ctx, nb_ctx_stats_get(ctx, &s));
    if (nbt_double_destroys != 0) {
        int n = nbt_double_destroys;
        nbt_double_destroys = 0;
        fail_msg("%d handles destroyed twice (messages above)", n);
    }
    if (s.live_arrays || s.live_trees || s.live_treedefs || s.live_buffers || s.live_fns) {
        fail_msg("leak: %lld arrays, %lld trees, %lld treedefs, %lld buffers, %lld fns still "
                 "alive",
                 (long long)s.live_arrays, (long long)s.live_trees, (long long)s.live_treedefs,
                 (long long)s.live_buffers, (long long)s.live_fns);
    }
}

nb_array *nbt_arr_f32(nb_ctx *ctx, int rank, const int64_t *shape, const float *data) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F32, rank, shape, data, &a));
    return a;
}

nb_array *nbt_arr_f64(nb_ctx *ctx, int rank, const int64_t *shape, const double *data) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, rank, shape, data, &a));
    return a;
}

nb_tree *nbt_leaf(nb_ctx *ctx, nb_dtype dtype, int rank, const int64_t *shape) {
    nb_array *a = NULL;
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, dtype, rank, shape, &a));
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

int nbt_oom_sweep(const char *name, nb_status (*scenario)(nb_ctx *ctx), bool check_msg,
                  bool rerun) {
    int points = 0;
    for (int64_t k = 1;; k++) {
        nbt_alloc al;
        memset(&al, 0, sizeof al);
        nb_ctx *ctx = nbt_ctx_with(&al);
        al.fail_at = al.n_calls + k;
        nb_status s = scenario(ctx);
        bool injected = al.n_failed > 0;
        al.fail_at = 0;
        if (injected) {
            points++;
            if (s != NB_ERR_OOM ||
                (check_msg && strstr(nb_ctx_errmsg(ctx), "out of memory") == NULL)) {
                fail_msg("%s: allocation %lld failed but the scenario returned %s: %s", name,
                         (long long)k, nb_status_name(s), nb_ctx_errmsg(ctx));
            }
        } else {
            NBT_OK(ctx, s);
        }
        if (getenv("NBT_OOM_TRACE") != NULL) { /* which point a failure below is at */
            fprintf(stderr, "%s: allocation %lld failed (%s)\n", name, (long long)k,
                    nb_status_name(s));
        }
        nbt_assert_no_live(ctx);
        if (rerun && injected) {
            nb_ctx_clear_error(ctx);
            NBT_OK(ctx, scenario(ctx)); /* the context still works */
        }
        nb_ctx_destroy(ctx);
        NBT_EQ_I64(al.n_live, 0);
        if (!injected) {
            break;
        }
    }
    print_message("%s: %d allocation failure points, each NB_ERR_OOM without leaks\n", name,
                  points);
    return points;
}
