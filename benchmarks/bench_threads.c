/*
 * bench_threads.c -- the thread pool when it has more threads than free cores.
 *
 * A context's pool splits each kernel into tasks whose boundaries depend on the data only,
 * so any thread count gives the same bits; this measures what the count costs. Two
 * workloads, each a jitted function called from outside:
 *   big    tanh(x @ W + b), x f32[128,512], W f32[512,512]: one sample = 4 calls;
 *   chain  8 layers of tanh(h @ W_i + b_i), h f32[64,256], W_i f32[256,256]: many short
 *          parallel regions back to back (a train step's pattern); one sample = 1 call.
 * Rows: a context with 1, 2, 4 and 8 threads (this machine has the cores it has: more
 * threads than cores is oversubscription); then two contexts driven at once from two
 * threads of the program (a second job on the machine), with 1 and with 2 threads each.
 * Every row checks that its outputs are the 1-thread outputs bit for bit.
 *
 *   bench_threads [--samples N]     (default 15; the median is printed)
 */
#define BENCH_NAME "bench_threads"
#include "bench_common.h"

#include <pthread.h>
#include <unistd.h>

typedef struct work {
    nb_ctx *ctx;
    nb_fn *f;
    nb_tree *args;
    int calls; /* per sample */
} work;

static nb_status body_big(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "x"), *w = nb_get(tr, args, "w"), *b = nb_get(tr, args, "b");
    return nb_return(nb_tanh(nb_add(nb_matmul(x, w), b)), out);
}

enum { CHAIN = 8 };

static nb_status body_chain(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *h = nb_get(tr, args, "x");
    for (int i = 0; i < CHAIN; i++) {
        h = nb_tanh(nb_add(nb_matmul(h, nb_get(tr, args, "w[%d]", i)), nb_get(tr, args, "b")));
    }
    return nb_return(h, out);
}

static nb_tree *leaf_uniform(nb_ctx *ctx, nb_array *key, int rank, const int64_t *shape,
                             double scale) {
    nb_array *a = NULL;
    BENCH_CHECK(ctx, nb_random_uniform(key, NB_DTYPE_F32, rank, shape, -scale, scale, &a));
    nb_tree *t = NULL;
    BENCH_CHECK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

/* A context with n_threads, its function and arguments (the same data for every count). */
static void work_make(work *w, bool chain, int n_threads) {
    nb_ctx_opts o = nb_ctx_opts_default();
    o.n_threads = n_threads;
    BENCH_CHECK(NULL, nb_ctx_create(&o, &w->ctx));
    nb_ctx *ctx = w->ctx;
    nb_array *key = NULL;
    BENCH_CHECK(ctx, nb_random_key(ctx, 7, &key));
    int64_t m = chain ? 64 : 128, k = chain ? 256 : 512;
    nb_tree *x = leaf_uniform(ctx, key, 2, (int64_t[]){m, k}, 1.0);
    nb_tree *b = leaf_uniform(ctx, key, 1, (int64_t[]){k}, 0.1);
    nb_tree *ws[CHAIN] = {NULL};
    int nw = chain ? CHAIN : 1;
    for (int i = 0; i < nw; i++) {
        nb_array *sub = NULL;
        BENCH_CHECK(ctx, nb_random_fold_in(key, (uint32_t)i + 1, &sub));
        ws[i] = leaf_uniform(ctx, sub, 2, (int64_t[]){k, k}, 1.0 / sqrt((double)k));
        nb_array_destroy(sub);
    }
    nb_tree *wt = NULL;
    if (chain) {
        BENCH_CHECK(ctx, nb_tree_list(ctx, CHAIN, ws, &wt));
    } else {
        wt = nb_tree_retain(ws[0]);
    }
    BENCH_CHECK(ctx, nb_tree_dict(ctx, 3, (const char *[]){"x", "w", "b"}, (nb_tree *[]){x, wt, b},
                                  &w->args));
    nb_fn *f = NULL;
    BENCH_CHECK(
        ctx, nb_fn_create(ctx, chain ? "chain" : "big", chain ? body_chain : body_big, NULL, &f));
    BENCH_CHECK(ctx, nb_jit(f, NULL, &w->f));
    nb_fn_destroy(f);
    w->calls = chain ? 1 : 4;
    for (int i = 0; i < nw; i++) {
        nb_tree_destroy(ws[i]);
    }
    nb_tree_destroy(wt);
    nb_tree_destroy(b);
    nb_tree_destroy(x);
    nb_array_destroy(key);
}

static void work_free(work *w) {
    nb_tree_destroy(w->args);
    nb_fn_destroy(w->f);
    nb_ctx_destroy(w->ctx);
}

/* One sample: w->calls calls; the seconds. The last output is kept in *last (replaced). */
static double work_sample(work *w, nb_array **last) {
    double t0 = bench_now_s();
    for (int c = 0; c < w->calls; c++) {
        nb_tree *out = NULL;
        BENCH_CHECK(w->ctx, nb_fn_call(w->f, w->args, &out));
        if (c == w->calls - 1 && last != NULL) {
            nb_array_destroy(*last);
            *last = nb_array_retain(nb_tree_get_array(out));
        }
        nb_tree_destroy(out);
    }
    return bench_now_s() - t0;
}

/* The 1-thread row's output, kept as bytes (its context is gone by the later rows). */
static unsigned char *g_ref;
static size_t g_ref_bytes;

static bool same_bits(const nb_array *a) {
    size_t n = (size_t)nb_array_size(a) * nb_dtype_size(nb_array_dtype(a));
    return n == g_ref_bytes && memcmp(nb_array_data(a), g_ref, n) == 0;
}

typedef struct runner {
    work *w;
    int samples;
    double *t;
    nb_array *last;
} runner;

static void *run_samples(void *arg) {
    runner *r = arg;
    (void)work_sample(r->w, &r->last); /* warm: trace, compile, start the pool */
    for (int s = 0; s < r->samples; s++) {
        r->t[s] = work_sample(r->w, &r->last);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int samples = 15;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--samples") == 0 && i + 1 < argc) {
            samples = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_threads [--samples N]\n");
            return 2;
        }
    }
    if (samples < 1 || samples > 1000) {
        fprintf(stderr, "bench_threads: --samples wants 1..1000\n");
        return 2;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("bench_threads: %ld cores online, %d samples per row (median)\n\n", cores, samples);
    printf("| workload | threads | contexts at once | ms per sample | / 1 thread | same bits |\n");
    printf("|---|---:|---:|---:|---:|---|\n");
    double *t = calloc((size_t)samples * 2, sizeof *t);
    if (t == NULL) {
        return 1;
    }
    int bad = 0;
    for (int chain = 0; chain < 2; chain++) {
        const char *name = chain ? "chain 8 x [64,256]@[256,256]" : "big 4 x [128,512]@[512,512]";
        double base = 0;
        const int counts[4] = {1, 2, 4, 8};
        for (int c = 0; c < 4; c++) {
            work w;
            work_make(&w, chain != 0, counts[c]);
            runner r = {&w, samples, t, NULL};
            run_samples(&r);
            double med = bench_median(t, samples) * 1e3;
            if (c == 0) {
                base = med;
                free(g_ref);
                g_ref_bytes = (size_t)nb_array_size(r.last) * nb_dtype_size(nb_array_dtype(r.last));
                g_ref = malloc(g_ref_bytes);
                if (g_ref == NULL) {
                    return 1;
                }
                memcpy(g_ref, nb_array_data(r.last), g_ref_bytes);
            }
            bool same = same_bits(r.last);
            bad += !same;
            printf("| %s | %d | 1 | %.3f | %.2f | %s |\n", name, counts[c], med, med / base,
                   same ? "yes" : "NO");
            nb_array_destroy(r.last);
            work_free(&w);
        }
        /* two contexts at once, each driven by its own thread */
        for (int per = 1; per <= 2; per++) {
            work w[2];
            runner r[2];
            pthread_t th[2];
            for (int i = 0; i < 2; i++) {
                work_make(&w[i], chain != 0, per);
                r[i] = (runner){&w[i], samples, t + i * samples, NULL};
            }
            for (int i = 0; i < 2; i++) {
                if (pthread_create(&th[i], NULL, run_samples, &r[i]) != 0) {
                    fprintf(stderr, "bench_threads: pthread_create failed\n");
                    return 1;
                }
            }
            for (int i = 0; i < 2; i++) {
                pthread_join(th[i], NULL);
            }
            double med = bench_median(t, samples * 2) * 1e3;
            bool same = same_bits(r[0].last) && same_bits(r[1].last);
            bad += !same;
            printf("| %s | %d each | 2 | %.3f | %.2f | %s |\n", name, per, med, med / base,
                   same ? "yes" : "NO");
            for (int i = 0; i < 2; i++) {
                nb_array_destroy(r[i].last);
                work_free(&w[i]);
            }
        }
    }
    free(g_ref);
    free(t);
    printf("\n(oversubscribed rows: threads x contexts > %ld cores; results must stay the 1-thread "
           "bits)\n",
           cores);
    return bad ? 1 : 0;
}
