/*
 * bench_matmul.c -- the matmul kernel against BLIS called directly on the same buffers.
 *
 * For each shape and dtype the matmul node is built on a trace and its kernel run through
 * the registry (as the executor does), interleaved with bli_sgemm / bli_dgemm on the same
 * inputs into a second output. A sample is the mean time of a burst of calls sized to take
 * about 200 us; the table shows the median of many samples of each, taken alternately, and
 * whether nabla's output has the bits it promises: BLIS's for products that go to BLIS, and
 * for small ones (at most 32768 multiply-adds, which nabla computes itself: op_linalg.c,
 * "small float products") those of the plain loop acc = acc + a[i,p] b[p,j] over p in
 * order, each multiply and add rounded (computed here); BLIS's FMA kernels may differ in
 * the last bit there. Both sides run on one thread: the kernel pins
 * it on a local BLIS runtime, and the direct calls get it from bli_thread_set_num_threads(1)
 * so that BLIS_NUM_THREADS / OMP_NUM_THREADS in the environment do not skew the ratio.
 *
 * Uses the internal API (src/ad/ir.h): it links nabla_static with src/ on the include path.
 * Usage: bench_matmul [samples]   (default 201)
 */
#define BENCH_NAME "bench_matmul"
#include "bench_common.h"

#include "ad/ir.h"

#include <blis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bm_shape {
    int64_t m, k, n;
} bm_shape;

static void *bm_alloc(size_t bytes) {
    size_t n = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, n ? n : 64);
}

static void bm_fill(nb_dtype dt, void *buf, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double v = (double)(seed >> 40) / (double)(1ull << 24) * 2.0 - 1.0;
        if (dt == NB_DTYPE_F32) {
            ((float *)buf)[i] = (float)v;
        } else {
            ((double *)buf)[i] = v;
        }
    }
}

typedef struct bm_case {
    const nb_var *node;
    const nbi_op_info *info;
    nb_dtype dt;
    bm_shape s;
    const void *a, *b;
    void *c_nabla, *c_blis;
} bm_case;

static void bm_run_nabla(const bm_case *c) {
    nbi_kargs k = {.node = c->node, .out = c->c_nabla, .in = (const void *const[]){c->a, c->b}};
    c->info->kernel(&k);
}

static void bm_run_blis(const bm_case *c) {
    dim_t m = c->s.m, n = c->s.n, k = c->s.k;
    if (c->dt == NB_DTYPE_F32) {
        float one = 1.0f, zero = 0.0f;
        bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one, (float *)c->a, k, 1,
                  (float *)c->b, n, 1, &zero, c->c_blis, n, 1);
    } else {
        double one = 1.0, zero = 0.0;
        bli_dgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one, (double *)c->a, k, 1,
                  (double *)c->b, n, 1, &zero, c->c_blis, n, 1);
    }
}

/* Mean seconds per call over a burst of reps calls. */
static double bm_burst(void (*run)(const bm_case *), const bm_case *c, int reps) {
    double t0 = bench_now_s();
    for (int r = 0; r < reps; r++) {
        run(c);
    }
    return (bench_now_s() - t0) / reps;
}

/* nabla's output against the plain loop, each product and sum rounded in order (what
 * nabla promises for small products; no FMA: this file is not built with -mfma). */
static bool bm_same_as_loop(const bm_case *c) {
    int64_t m = c->s.m, k = c->s.k, n = c->s.n;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            if (c->dt == NB_DTYPE_F32) {
                const float *a = c->a, *b = c->b;
                float acc = 0.0f;
                for (int64_t p = 0; p < k; p++) {
                    float prod = a[i * k + p] * b[p * n + j];
                    acc = acc + prod;
                }
                if (memcmp(&acc, (const float *)c->c_nabla + i * n + j, sizeof acc) != 0) {
                    return false;
                }
            } else {
                const double *a = c->a, *b = c->b;
                double acc = 0.0;
                for (int64_t p = 0; p < k; p++) {
                    double prod = a[i * k + p] * b[p * n + j];
                    acc = acc + prod;
                }
                if (memcmp(&acc, (const double *)c->c_nabla + i * n + j, sizeof acc) != 0) {
                    return false;
                }
            }
        }
    }
    return true;
}

static int bm_one(nb_ctx *ctx, nb_dtype dt, bm_shape s, int samples) {
    nb_trace tr;
    if (nbi_trace_init(&tr, ctx, "bench") != NB_OK) {
        return 1;
    }
    nb_var *a = nbi_emit_param(&tr, 0, dt, 2, (int64_t[]){s.m, s.k}, NULL);
    nb_var *b = nbi_emit_param(&tr, 1, dt, 2, (int64_t[]){s.k, s.n}, NULL);
    nb_var *v = nb_matmul(a, b);
    if (nb_trace_status(&tr) != NB_OK) {
        fprintf(stderr, "bench_matmul: %s\n", nb_ctx_errmsg(ctx));
        nbi_trace_release(&tr);
        return 1;
    }
    size_t es = nb_dtype_size(dt);
    bm_case c = {.node = v, .info = nbi_op_get((nbi_op)v->op), .dt = dt, .s = s};
    void *abuf = bm_alloc((size_t)(s.m * s.k) * es), *bbuf = bm_alloc((size_t)(s.k * s.n) * es);
    c.c_nabla = bm_alloc((size_t)(s.m * s.n) * es);
    c.c_blis = bm_alloc((size_t)(s.m * s.n) * es);
    double *tn = malloc((size_t)samples * sizeof(double));
    double *tb = malloc((size_t)samples * sizeof(double));
    if (!abuf || !bbuf || !c.c_nabla || !c.c_blis || !tn || !tb) {
        fprintf(stderr, "bench_matmul: out of memory\n");
        free(abuf);
        free(bbuf);
        free(c.c_nabla);
        free(c.c_blis);
        free(tn);
        free(tb);
        nbi_trace_release(&tr);
        return 1;
    }
    bm_fill(dt, abuf, s.m * s.k, 1);
    bm_fill(dt, bbuf, s.k * s.n, 2);
    c.a = abuf;
    c.b = bbuf;

    /* Warm up (BLIS's memory pools, caches), then size a burst to about 200 us. */
    bm_burst(bm_run_nabla, &c, 3);
    bm_burst(bm_run_blis, &c, 3);
    double per = bm_burst(bm_run_blis, &c, 5);
    int reps = per > 0 ? (int)(200e-6 / per) : 1000;
    reps = reps < 1 ? 1 : reps > 100000 ? 100000 : reps;
    for (int i = 0; i < samples; i++) {
        /* alternate which side goes first, so neither always runs on a warmer cache */
        if (i % 2 == 0) {
            tn[i] = bm_burst(bm_run_nabla, &c, reps);
            tb[i] = bm_burst(bm_run_blis, &c, reps);
        } else {
            tb[i] = bm_burst(bm_run_blis, &c, reps);
            tn[i] = bm_burst(bm_run_nabla, &c, reps);
        }
    }
    bool small = s.m * s.n * s.k <= 32768;
    bool same =
        small ? bm_same_as_loop(&c) : memcmp(c.c_nabla, c.c_blis, (size_t)(s.m * s.n) * es) == 0;
    double mn = bench_median(tn, samples) * 1e6, mb = bench_median(tb, samples) * 1e6;
    char shape[64];
    snprintf(shape, sizeof shape, "%lldx%lld @ %lldx%lld", (long long)s.m, (long long)s.k,
             (long long)s.k, (long long)s.n);
    printf("| %-19s | %-5s | %10.2f | %10.2f | %5.3f | %-9s |\n", shape, nb_dtype_name(dt), mn, mb,
           mn / mb, same ? (small ? "yes, loop" : "yes, BLIS") : "NO");
    free(abuf);
    free(bbuf);
    free(c.c_nabla);
    free(c.c_blis);
    free(tn);
    free(tb);
    nbi_trace_release(&tr);
    return same ? 0 : 1;
}

int main(int argc, char **argv) {
    int samples = argc > 1 ? atoi(argv[1]) : 201;
    if (samples < 1) {
        fprintf(stderr, "usage: %s [samples]\n", argv[0]);
        return 2;
    }
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(NULL, &ctx) != NB_OK) {
        fprintf(stderr, "bench_matmul: cannot create a context\n");
        return 1;
    }
    bli_thread_set_num_threads(1);
    const bm_shape shapes[] = {{128, 784, 256}, {128, 256, 10}, {512, 512, 512}, {16, 2, 32}};
    const nb_dtype dtypes[] = {NB_DTYPE_F32, NB_DTYPE_F64};
    printf("BLIS %s (%s), one thread, median of %d samples\n\n", bli_info_get_version_str(),
           bli_arch_string(bli_arch_query_id()), samples);
    printf("| %-19s | %-5s | %10s | %10s | %5s | %-9s |\n", "shape", "dtype", "nabla us", "BLIS us",
           "ratio", "same bits");
    printf("|---------------------|-------|------------|------------|-------|-----------|\n");
    int bad = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
            bad |= bm_one(ctx, dtypes[d], shapes[i], samples);
        }
    }
    nb_ctx_destroy(ctx);
    return bad;
}
