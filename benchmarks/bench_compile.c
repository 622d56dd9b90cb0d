/*
 * bench_compile.c -- what the compiler buys: a fused elementwise chain against the SLEEF
 * kernel alone and memcpy, a tiny MLP's forward + backward (per-call overhead), and trace
 * + compile time of an MLP training step (value_and_grad); PyTorch beside the tiny MLP.
 */
#include "ad/ir.h"
#include "ad/vmath.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

#define CHECK(ctx, e)                                                                              \
    do {                                                                                           \
        nb_status s_ = (e);                                                                        \
        if (s_ != NB_OK) {                                                                         \
            fprintf(stderr, "bench_compile: %s: %s\n", #e, nb_ctx_errmsg(ctx));                    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static nb_status body_chain(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    nb_var *a = nb_get(tr, args, "[1]"), *b = nb_get(tr, args, "[2]"), *c = nb_get(tr, args, "[3]");
    return nb_return(nb_mul(nb_tanh(nb_add(nb_mul(x, a), b)), c), out);
}

static nb_status body_tiny(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *h = nb_get(tr, args, "[1].x");
    for (int i = 0; i < 3; i++) {
        h = nb_add(nb_matmul(h, nb_get(tr, args, "[0][%d].w", i)),
                   nb_get(tr, args, "[0][%d].b", i));
        if (i < 2) {
            h = nb_tanh(h);
        }
    }
    nb_var *d = nb_sub(h, nb_get(tr, args, "[1].y"));
    return nb_return(nb_mean(nb_square(d), NULL, 0, false), out);
}

static nb_tree *leaf(nb_ctx *ctx, int rank, const int64_t *shape, double v) {
    nb_array *a = NULL;
    nb_tree *t = NULL;
    CHECK(ctx, nb_array_full(ctx, NB_DTYPE_F32, rank, shape, v, &a));
    float *p = nb_array_data(a);
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        p[i] = (float)(v * sin((double)i * 0.37 + 1.0));
    }
    CHECK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

static nb_tree *mlp_args(nb_ctx *ctx, const int64_t *sz, int64_t batch) {
    nb_tree *layers[3], *params = NULL, *bt = NULL, *args = NULL;
    for (int i = 0; i < 3; i++) {
        nb_tree *w = leaf(ctx, 2, (int64_t[]){sz[i], sz[i + 1]}, 0.3);
        nb_tree *b = leaf(ctx, 1, &sz[i + 1], 0.1);
        CHECK(ctx,
              nb_tree_dict(ctx, 2, (const char *[]){"w", "b"}, (nb_tree *[]){w, b}, &layers[i]));
        nb_tree_destroy(w);
        nb_tree_destroy(b);
    }
    CHECK(ctx, nb_tree_list(ctx, 3, layers, &params));
    nb_tree *x = leaf(ctx, 2, (int64_t[]){batch, sz[0]}, 1.0);
    nb_tree *y = leaf(ctx, 2, (int64_t[]){batch, sz[3]}, 1.0);
    CHECK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"x", "y"}, (nb_tree *[]){x, y}, &bt));
    CHECK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){params, bt}, &args));
    nb_tree *all[] = {bt, y, x, params, layers[0], layers[1], layers[2]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        nb_tree_destroy(all[i]);
    }
    return args;
}

int main(void) {
    char info[256];
    nb_build_info(info, sizeof info, NULL);
    double tiny_torch = NAN;
    FILE *p = access("/usr/bin/python3", X_OK) == 0
                  ? popen("/usr/bin/python3 benchmarks/peers/torch_grad.py 2>/dev/null", "r")
                  : NULL;
    if (p != NULL) {
        char line[256];
        while (fgets(line, sizeof line, p) != NULL) {
            char k[64], v[64];
            if (sscanf(line, "%63s %63s", k, v) == 2 && strcmp(k, "tiny_us") == 0) {
                tiny_torch = atof(v);
            }
        }
        pclose(p);
    }
    printf("%s\n\n", info);

    /* 1. tanh(x*a + b) * c over 1e7 f32, fused, vs the SLEEF kernel alone and memcpy */
    int64_t n = 10000000;
    float *src = malloc((size_t)n * sizeof(float)), *dst = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        src[i] = (float)sin((double)i * 1e-3);
    }
    const nbi_vmath *vm = nbi_vmath_get();
    /* one context per thread count, all measured in the same rounds (SLEEF, memcpy,
     * fused 1 thread, fused 2 threads, ...) so the machine's drift hits each alike */
    enum { ROUNDS = 15 };
    nb_ctx *ctxs[2];
    nb_fn *fns[2];
    nb_tree *argss[2], *specs[2];
    nb_call_opts cos[2];
    for (int i = 0; i < 2; i++) {
        nb_ctx_opts o = nb_ctx_opts_default();
        o.n_threads = i + 1;
        nb_ctx *ctx = NULL;
        CHECK(ctx, nb_ctx_create(&o, &ctx));
        nb_array *xa = NULL;
        CHECK(ctx, nb_array_from_data(ctx, NB_DTYPE_F32, 1, &n, src, &xa));
        nb_tree *lx = NULL, *la = leaf(ctx, 0, NULL, 1.5), *lb = leaf(ctx, 0, NULL, 0.25);
        nb_tree *lc = leaf(ctx, 0, NULL, -2.0);
        CHECK(ctx, nb_tree_array(xa, &lx));
        nb_array_destroy(xa);
        CHECK(ctx, nb_tree_tuple(ctx, 4, (nb_tree *[]){lx, la, lb, lc}, &argss[i]));
        CHECK(ctx, nb_fn_create(ctx, "chain", body_chain, NULL, &fns[i]));
        /* donate x so the output reuses its buffer: the step streams memory once */
        nb_tree *yes = NULL, *nul = NULL;
        CHECK(ctx, nb_tree_bool(ctx, true, &yes));
        CHECK(ctx, nb_tree_null(ctx, &nul));
        CHECK(ctx, nb_tree_tuple(ctx, 4, (nb_tree *[]){yes, nul, nul, nul}, &specs[i]));
        cos[i] = nb_call_opts_default();
        cos[i].donate = specs[i];
        nb_tree *out = NULL;
        CHECK(ctx, nb_fn_call_ex(fns[i], argss[i], &cos[i], &out));
        nb_tree_destroy(out);
        nb_tree *all[] = {nul, yes, lc, lb, la, lx};
        for (size_t q = 0; q < sizeof all / sizeof all[0]; q++) {
            nb_tree_destroy(all[q]);
        }
        ctxs[i] = ctx;
    }
    double t_sleef[ROUNDS], t_copy[ROUNDS], t_fused[2][ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now_s();
        vm->f32[NBI_VM_TANH](dst, src, n);
        t_sleef[r] = now_s() - t0;
        t0 = now_s();
        memcpy(dst, src, (size_t)n * sizeof(float));
        t_copy[r] = now_s() - t0;
        for (int i = 0; i < 2; i++) {
            nb_tree *out = NULL;
            t0 = now_s();
            CHECK(ctxs[i], nb_fn_call_ex(fns[i], argss[i], &cos[i], &out));
            t_fused[i][r] = now_s() - t0;
            nb_tree_destroy(out);
        }
    }
    double sleef_ns = median(t_sleef, ROUNDS) / (double)n * 1e9;
    double copy_ns = median(t_copy, ROUNDS) / (double)n * 1e9;
    printf("| fused tanh(x*a + b)*c, 1e7 f32 | ns/elem | vs SLEEF tanhf alone |\n|---|---|---|\n");
    printf("| memcpy | %.3f | |\n| SLEEF tanhf u35 (%s), 1 thread, the kernel nb_tanh uses | %.3f "
           "| 1.00 |\n",
           copy_ns, vm->isa, sleef_ns);
    for (int i = 0; i < 2; i++) {
        double ns = median(t_fused[i], ROUNDS) / (double)n * 1e9;
        printf("| nabla fused, %d thread%s | %.3f | %.2f |\n", i + 1, i ? "s" : "", ns,
               ns / sleef_ns);
        nb_tree_destroy(specs[i]);
        nb_tree_destroy(argss[i]);
        nb_fn_destroy(fns[i]);
        nb_ctx_destroy(ctxs[i]);
    }
    free(dst);
    free(src);

    /* 2. tiny MLP 2-32-32-1, batch 16: forward + backward per call; 3. trace + compile */
    nb_ctx_opts o = nb_ctx_opts_default();
    o.n_threads = 1;
    nb_ctx *ctx = NULL;
    CHECK(ctx, nb_ctx_create(&o, &ctx));
    nb_tree *targs = mlp_args(ctx, (int64_t[]){2, 32, 32, 1}, 16), *out = NULL;
    nb_fn *tf = NULL, *tvg = NULL;
    CHECK(ctx, nb_fn_create(ctx, "tiny", body_tiny, NULL, &tf));
    CHECK(ctx, nb_value_and_grad(tf, NULL, &tvg));
    CHECK(ctx, nb_fn_call(tvg, targs, &out));
    nb_tree_destroy(out);
    double tt[15];
    for (int r = 0; r < 15; r++) {
        double t0 = now_s();
        for (int i = 0; i < 2000; i++) {
            CHECK(ctx, nb_fn_call(tvg, targs, &out));
            nb_tree_destroy(out);
        }
        tt[r] = (now_s() - t0) / 2000 * 1e6;
    }
    double tiny = median(tt, 15);
    printf("\n| tiny MLP 2-32-32-1, b=16, fwd+bwd, 1 thread | µs |\n|---|---|\n");
    printf("| nabla | %.2f |\n| PyTorch 1.13 | %.1f (%.0fx nabla) |\n", tiny, tiny_torch,
           tiny_torch / tiny);
    nb_tree *margs = mlp_args(ctx, (int64_t[]){784, 256, 256, 10}, 128);
    nb_fn *mf = NULL, *mvg = NULL;
    CHECK(ctx, nb_fn_create(ctx, "mlp", body_tiny, NULL, &mf));
    CHECK(ctx, nb_value_and_grad(mf, NULL, &mvg));
    double tc[11];
    for (int r = 0; r < 11; r++) {
        nb_ctx_clear_cache(ctx);
        double t0 = now_s();
        CHECK(ctx, nb_fn_format_ir(mvg, margs, NB_IR_OPTIMIZED, NULL, 0, NULL) == NB_ERR_TRUNCATED
                       ? NB_OK
                       : NB_ERR_INTERNAL);
        tc[r] = (now_s() - t0) * 1e3;
    }
    printf("\ntrace + optimize (fold, simplify, CSE, DCE, fuse) of the MLP 784-256-256-10 "
           "value_and_grad: %.3f ms\n",
           median(tc, 11));
    nb_tree_destroy(margs);
    nb_tree_destroy(targs);
    nb_fn_destroy(mvg);
    nb_fn_destroy(mf);
    nb_fn_destroy(tvg);
    nb_fn_destroy(tf);
    nb_ctx_destroy(ctx);
    return 0;
}
