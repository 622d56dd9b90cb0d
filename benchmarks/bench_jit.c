/*
 * bench_jit.c -- the cost of jit itself: a cache-hit call of a tiny function, and trace +
 * compile of a 3-layer MLP forward; JAX measured in the same run when its virtualenv
 * exists (benchmarks/peers/jax_jit.py). Prints a table; medians of repeated runs.
 */
#define BENCH_NAME "bench_jit"
#include "bench_common.h"

#include <nabla/nabla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static nb_status body_tiny(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_add(nb_get(tr, args, "[0]"), nb_scalar(tr, 1.0)), out);
}

static nb_status body_mlp(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *h = nb_get(tr, args, "[0]");
    for (int i = 0; i < 3; i++) {
        h = nb_add(nb_matmul(h, nb_get(tr, self, "[%d].w", i)), nb_get(tr, self, "[%d].b", i));
        if (i < 2) {
            h = nb_tanh(h);
        }
    }
    return nb_return(h, out);
}

static nb_tree *leaf(nb_ctx *ctx, int rank, const int64_t *shape) {
    nb_array *a = NULL;
    nb_tree *t = NULL;
    BENCH_CHECK(ctx, nb_array_full(ctx, NB_DTYPE_F32, rank, shape, 0.01, &a));
    BENCH_CHECK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

/* Run the JAX peer if its virtualenv exists; fill the two numbers (NAN when absent). */
static void run_peer(double *hit_us, double *compile_ms, char *version, size_t vcap) {
    *hit_us = NAN;
    *compile_ms = NAN;
    snprintf(version, vcap, "not run");
    const char *py = "build/peers/bin/python";
    if (access(py, X_OK) != 0) {
        snprintf(version, vcap, "not installed (see benchmarks/README.md)");
        return;
    }
    static const char *const keys[2] = {"jit_hit_us", "mlp_compile_ms"};
    double vals[2] = {NAN, NAN};
    char jax[64] = "";
    bench_peer_read(
        "build/peers/bin/python benchmarks/peers/jax_jit.py jit_hit_us mlp_compile_ms 2>/dev/null",
        2, keys, vals, "jax_version", jax, sizeof jax);
    *hit_us = vals[0];
    *compile_ms = vals[1];
    if (jax[0] != '\0') {
        snprintf(version, vcap, "JAX %s", jax);
    }
}

int main(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(NULL, &ctx) != NB_OK) {
        return 1;
    }
    char info[256];
    nb_build_info(info, sizeof info, NULL);

    /* 1. Cache-hit overhead of a tiny function: the whole nb_fn_call (key, run, output
     *    array and tree), plus destroying the output. */
    nb_fn *tiny = NULL, *jtiny = NULL;
    BENCH_CHECK(ctx, nb_fn_create(ctx, "tiny", body_tiny, NULL, &tiny));
    BENCH_CHECK(ctx, nb_jit(tiny, NULL, &jtiny));
    nb_tree *x = leaf(ctx, 1, (int64_t[]){4}), *args = NULL, *out = NULL;
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 1, &x, &args));
    BENCH_CHECK(ctx, nb_fn_call(jtiny, args, &out));
    nb_tree_destroy(out);
    double hit[15];
    for (int r = 0; r < 15; r++) {
        int n = 20000;
        double t0 = bench_now_s();
        for (int i = 0; i < n; i++) {
            nb_fn_call(jtiny, args, &out);
            nb_tree_destroy(out);
        }
        hit[r] = (bench_now_s() - t0) / n * 1e6;
    }
    double hit_us = bench_median(hit, 15);

    /* 2. Trace + compile of a 784-256-256-10 MLP forward (batch 128): the first call after
     *    clearing the cache, less a cached call's time. */
    int64_t sizes[4] = {784, 256, 256, 10};
    nb_tree *layers[3], *params = NULL;
    for (int i = 0; i < 3; i++) {
        nb_tree *w = leaf(ctx, 2, (int64_t[]){sizes[i], sizes[i + 1]});
        nb_tree *b = leaf(ctx, 1, &sizes[i + 1]);
        BENCH_CHECK(
            ctx, nb_tree_dict(ctx, 2, (const char *[]){"w", "b"}, (nb_tree *[]){w, b}, &layers[i]));
        nb_tree_destroy(w);
        nb_tree_destroy(b);
    }
    BENCH_CHECK(ctx, nb_tree_list(ctx, 3, layers, &params));
    nb_fn *mlp = NULL;
    BENCH_CHECK(ctx, nb_fn_create(ctx, "mlp", body_mlp, params, &mlp));
    nb_tree *xb = leaf(ctx, 2, (int64_t[]){128, 784}), *margs = NULL;
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 1, &xb, &margs));
    double first[21], run[21];
    for (int r = 0; r < 21; r++) {
        nb_ctx_clear_cache(ctx);
        double t0 = bench_now_s();
        BENCH_CHECK(ctx, nb_fn_call(mlp, margs, &out));
        first[r] = bench_now_s() - t0;
        nb_tree_destroy(out);
        t0 = bench_now_s();
        BENCH_CHECK(ctx, nb_fn_call(mlp, margs, &out));
        run[r] = bench_now_s() - t0;
        nb_tree_destroy(out);
    }
    double compile_ms = (bench_median(first, 21) - bench_median(run, 21)) * 1e3;

    double jax_hit = NAN, jax_compile = NAN;
    char jax_version[128];
    run_peer(&jax_hit, &jax_compile, jax_version, sizeof jax_version);

    printf("%s\npeer: %s (1 thread, CPU)\n\n", info, jax_version);
    printf("| workload | nabla | JAX | JAX / nabla |\n|---|---|---|---|\n");
    printf("| jit cache-hit call, x + 1 on f32[4] | %.2f µs | %.2f µs | %.1fx |\n", hit_us, jax_hit,
           jax_hit / hit_us);
    printf("| trace + compile, MLP 784-256-256-10 forward | %.3f ms | %.1f ms | %.0fx |\n",
           compile_ms, jax_compile, jax_compile / compile_ms);

    nb_tree_destroy(margs);
    nb_tree_destroy(xb);
    nb_fn_destroy(mlp);
    nb_tree_destroy(params);
    for (int i = 0; i < 3; i++) {
        nb_tree_destroy(layers[i]);
    }
    nb_tree_destroy(args);
    nb_tree_destroy(x);
    nb_fn_destroy(jtiny);
    nb_fn_destroy(tiny);
    nb_ctx_destroy(ctx);
    return 0;
}
