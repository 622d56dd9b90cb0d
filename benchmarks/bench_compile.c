/*
 * bench_compile.c -- trace + compile time against the number of leaves.
 *
 * Real models have 10^3 - 10^5 parameter leaves; every pass of the compiler must be
 * near-linear in them. For n leaves (each f32[4]; params a list of n arrays), the first
 * call of a jitted function -- trace, optimise, compile, run once -- timed for:
 *   sum     loss = sum of every leaf's sum (one reduction per leaf, a chain of adds);
 *   adam    a donated Adam step: updates, new state = adam(grads, state); params +
 *           updates (the optimizer's work for n leaves, as a train step does it), params
 *           and state donated (updated in place, as a train step is called);
 *   grad    value_and_grad of sum(p_i^2) (the backward graph of n leaves).
 * Goal: 10^5 leaves in under 1 s for each. Also the cache-hit call (run only).
 *
 *   bench_compile [--min N] [--max N] [--only sum|adam|grad]
 *       (n = min, 10 min, ... <= max; default 1000, 100000; --only: one function, the
 *       others' columns empty)
 */
#define BENCH_NAME "bench_compile"
#include "bench_common.h"

static nb_status body_sum(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *p = nb_tree_child(args, 0);
    int64_t n = nb_tree_len(p);
    nb_var *acc = NULL;
    for (int64_t i = 0; i < n; i++) {
        nb_var *s = nb_sum(nb_var_of(tr, nb_tree_child(p, i)), NULL, 0, false);
        acc = acc == NULL ? s : nb_add(acc, s);
    }
    return nb_return(acc, out);
}

static nb_status body_sumsq(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *p = nb_tree_child(args, 0);
    int64_t n = nb_tree_len(p);
    nb_var *acc = NULL;
    for (int64_t i = 0; i < n; i++) {
        nb_var *x = nb_var_of(tr, nb_tree_child(p, i));
        nb_var *s = nb_sum(nb_mul(x, x), NULL, 0, false);
        acc = acc == NULL ? s : nb_add(acc, s);
    }
    return nb_return(acc, out);
}

/* args = (params, grads, state, opt): (params + updates, new state) */
static nb_status body_adam(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *params = nb_tree_child(args, 0), *grads = nb_tree_child(args, 1);
    const nb_tree *state = nb_tree_child(args, 2), *opt = nb_tree_child(args, 3);
    const nb_tree *updates = NULL, *new_state = NULL;
    nb_status st = nb_optim_update(tr, opt, grads, state, params, &updates, &new_state);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *np = nb_apply_updates(tr, params, updates);
    if (np == NULL) {
        return nb_trace_status(tr);
    }
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){(nb_tree *)np, (nb_tree *)new_state},
                         out);
}

static nb_tree *leaves(nb_ctx *ctx, int64_t n, double v) {
    nb_tree **items = calloc((size_t)n, sizeof *items);
    if (items == NULL) {
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) {
        nb_array *a = NULL;
        BENCH_CHECK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 1, (int64_t[]){4}, v, &a));
        BENCH_CHECK(ctx, nb_tree_array(a, &items[i]));
        nb_array_destroy(a);
    }
    nb_tree *t = NULL;
    BENCH_CHECK(ctx, nb_tree_list(ctx, n, items, &t));
    for (int64_t i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    free(items);
    return t;
}

/* First call (trace + compile + run) and a cache-hit call, in seconds; donate: NULL, or the
 * donate spec of both calls (the train step's params and state updated in place). */
static void time_fn(nb_ctx *ctx, nb_fn *f, const nb_tree *args, const nb_tree *donate,
                    double *first, double *hit) {
    nb_ctx_clear_cache(ctx);
    nb_call_opts o = nb_call_opts_default();
    o.donate = donate;
    nb_tree *out = NULL;
    double t0 = bench_now_s();
    BENCH_CHECK(ctx, nb_fn_call_ex(f, args, &o, &out));
    *first = bench_now_s() - t0;
    nb_tree_destroy(out);
    t0 = bench_now_s();
    BENCH_CHECK(ctx, nb_fn_call_ex(f, args, &o, &out));
    *hit = bench_now_s() - t0;
    nb_tree_destroy(out);
}

int main(int argc, char **argv) {
    int64_t min_n = 1000, max_n = 100000;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--max") == 0 && i + 1 < argc) {
            max_n = atoll(argv[++i]);
        } else if (strcmp(argv[i], "--min") == 0 && i + 1 < argc) {
            min_n = atoll(argv[++i]);
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr, "usage: bench_compile [--min N] [--max N] [--only sum|adam|grad]\n");
            return 2;
        }
    }
    if (min_n < 1 || max_n < min_n) {
        fprintf(stderr, "bench_compile: wants 1 <= --min <= --max\n");
        return 2;
    }
    nb_ctx_opts o = nb_ctx_opts_default();
    o.n_threads = 1;
    nb_ctx *ctx = NULL;
    BENCH_CHECK(NULL, nb_ctx_create(&o, &ctx));
    printf("bench_compile: trace + compile + first run, and a cache-hit call, by leaves "
           "(f32[4] each), 1 thread\n\n");
    printf("| leaves | sum: first call s | hit ms | adam step: first call s | hit ms | "
           "value_and_grad: first call s | hit ms |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    int bad = 0;
    for (int64_t n = min_n; n <= max_n; n *= 10) {
        nb_tree *p = leaves(ctx, n, 1.0), *g = leaves(ctx, n, 0.5);
        nb_tree *opt = NULL, *state = NULL, *a1 = NULL, *a4 = NULL;
        BENCH_CHECK(ctx, nb_optim_adam(ctx, 1e-3, NULL, &opt));
        BENCH_CHECK(ctx, nb_optim_init(opt, p, &state));
        BENCH_CHECK(ctx, nb_tree_tuple(ctx, 1, &p, &a1));
        BENCH_CHECK(ctx, nb_tree_tuple(ctx, 4, (nb_tree *[]){p, g, state, opt}, &a4));
        nb_tree *yes = NULL, *no = NULL, *donate = NULL;
        BENCH_CHECK(ctx, nb_tree_bool(ctx, true, &yes));
        BENCH_CHECK(ctx, nb_tree_bool(ctx, false, &no));
        BENCH_CHECK(ctx, nb_tree_tuple(ctx, 4, (nb_tree *[]){yes, no, yes, no}, &donate));
        nb_fn *fs = NULL, *fa = NULL, *fq = NULL, *vg = NULL, *js = NULL, *ja = NULL, *jv = NULL;
        BENCH_CHECK(ctx, nb_fn_create(ctx, "sum", body_sum, NULL, &fs));
        BENCH_CHECK(ctx, nb_fn_create(ctx, "adam", body_adam, NULL, &fa));
        BENCH_CHECK(ctx, nb_fn_create(ctx, "sumsq", body_sumsq, NULL, &fq));
        BENCH_CHECK(ctx, nb_value_and_grad(fq, NULL, &vg));
        BENCH_CHECK(ctx, nb_jit(fs, NULL, &js));
        BENCH_CHECK(ctx, nb_jit(fa, NULL, &ja));
        BENCH_CHECK(ctx, nb_jit(vg, NULL, &jv));
        double t[3][2] = {{NAN, NAN}, {NAN, NAN}, {NAN, NAN}};
        if (only == NULL || strcmp(only, "sum") == 0) {
            time_fn(ctx, js, a1, NULL, &t[0][0], &t[0][1]);
        }
        if (only == NULL || strcmp(only, "adam") == 0) {
            time_fn(ctx, ja, a4, donate, &t[1][0], &t[1][1]);
        }
        if (only == NULL || strcmp(only, "grad") == 0) {
            time_fn(ctx, jv, a1, NULL, &t[2][0], &t[2][1]);
        }
        printf("| %lld | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", (long long)n, t[0][0],
               t[0][1] * 1e3, t[1][0], t[1][1] * 1e3, t[2][0], t[2][1] * 1e3);
        fflush(stdout);
        if (n == 100000 && (t[0][0] > 1.0 || t[1][0] > 1.0 || t[2][0] > 1.0)) {
            bad = 1;
        }
        nb_fn *all[] = {jv, ja, js, vg, fq, fa, fs};
        for (int i = 0; i < 7; i++) {
            nb_fn_destroy(all[i]);
        }
        nb_tree *trees[] = {donate, no, yes, a4, a1, state, opt, g, p};
        for (int i = 0; i < 9; i++) {
            nb_tree_destroy(trees[i]);
        }
    }
    printf("\ngoal: 10^5 leaves traced and compiled in under 1 s each: %s\n",
           max_n < 100000 ? "n/a (--max below 10^5)"
           : bad          ? "no"
                          : "yes");
    nb_ctx_destroy(ctx);
    return 0;
}
