/*
 * bench_grad.c -- the cost of reverse mode: time(value_and_grad) / time(forward) for
 * Rosenbrock in f64 at n = 2, 1e3, 1e6, and an MLP 784-256-256-10 (batch 128, f32) forward
 * + backward with its peak workspace, next to PyTorch in the same run (1 and 2 threads;
 * nabla runs one thread until the thread pool lands) and to its 8 GEMMs in BLIS alone.
 */
#include "ad/ir.h"

#include <blis.h>
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

#define CHECK(ctx, e)                                                                              \
    do {                                                                                           \
        nb_status s_ = (e);                                                                        \
        if (s_ != NB_OK) {                                                                         \
            fprintf(stderr, "bench_grad: %s: %s\n", #e, nb_ctx_errmsg(ctx));                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* median µs of reps runs of inner calls of f on args */
static double time_call(nb_ctx *ctx, nb_fn *f, const nb_tree *args, int reps, int inner) {
    nb_tree *out = NULL;
    CHECK(ctx, nb_fn_call(f, args, &out));
    nb_tree_destroy(out);
    double s[31];
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        for (int i = 0; i < inner; i++) {
            CHECK(ctx, nb_fn_call(f, args, &out));
            nb_tree_destroy(out);
        }
        s[r] = (now_s() - t0) / inner * 1e6;
    }
    qsort(s, (size_t)reps, sizeof s[0], cmp_d);
    return s[reps / 2];
}

static nb_status body_rosen(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    int64_t n = nb_var_dim(x, 0);
    nb_var *hi = nb_slice(x, (int64_t[]){1}, (int64_t[]){n}, NULL);
    nb_var *lo = nb_slice(x, (int64_t[]){0}, (int64_t[]){n - 1}, NULL);
    nb_var *a = nb_sub(hi, nb_square(lo)), *b = nb_sub(nb_scalar(tr, 1.0), lo);
    nb_var *t = nb_add(nb_mul(nb_scalar(tr, 100.0), nb_square(a)), nb_square(b));
    return nb_return(nb_sum(t, NULL, 0, false), out);
}

static nb_status body_mlp(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *h = nb_get(tr, args, "[1].x");
    for (int i = 0; i < 3; i++) {
        h = nb_add(nb_matmul(h, nb_get(tr, args, "[0][%d].w", i)),
                   nb_get(tr, args, "[0][%d].b", i));
        if (i < 2) {
            h = nb_tanh(h);
        }
    }
    nb_var *picked = nb_take_along_axis(nb_log_softmax(h, -1),
                                        nb_expand_dims(nb_get(tr, args, "[1].y"), -1), -1);
    return nb_return(nb_neg(nb_mean(picked, NULL, 0, false)), out);
}

static nb_tree *leaf_fill(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape, double scale,
                          unsigned seed) {
    nb_array *a = NULL;
    CHECK(ctx, nb_array_zeros(ctx, dt, rank, shape, &a));
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        seed = seed * 1103515245u + 12345u;
        double v = ((double)(seed >> 8) / 16777216.0 - 0.5) * scale;
        if (dt == NB_DTYPE_F32) {
            ((float *)nb_array_data(a))[i] = (float)v;
        } else if (dt == NB_DTYPE_F64) {
            ((double *)nb_array_data(a))[i] = v;
        } else {
            ((int32_t *)nb_array_data(a))[i] = (int32_t)((seed >> 8) % 10);
        }
    }
    nb_tree *t = NULL;
    CHECK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

/* args = (params [{w, b} x 3], batch {x, y}) for the MLP (a new reference) */
static nb_tree *mlp_args(nb_ctx *ctx) {
    int64_t sz[4] = {784, 256, 256, 10};
    nb_tree *layers[3], *params = NULL;
    for (int i = 0; i < 3; i++) {
        nb_tree *w = leaf_fill(ctx, NB_DTYPE_F32, 2, (int64_t[]){sz[i], sz[i + 1]}, 0.1, 7u + i);
        nb_tree *b = leaf_fill(ctx, NB_DTYPE_F32, 1, &sz[i + 1], 0.0, 9u);
        CHECK(ctx,
              nb_tree_dict(ctx, 2, (const char *[]){"w", "b"}, (nb_tree *[]){w, b}, &layers[i]));
        nb_tree_destroy(w);
        nb_tree_destroy(b);
    }
    CHECK(ctx, nb_tree_list(ctx, 3, layers, &params));
    nb_tree *x = leaf_fill(ctx, NB_DTYPE_F32, 2, (int64_t[]){128, 784}, 2.0, 3u);
    nb_tree *y = leaf_fill(ctx, NB_DTYPE_I32, 1, (int64_t[]){128}, 0, 5u), *batch = NULL,
            *margs = NULL;
    CHECK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"x", "y"}, (nb_tree *[]){x, y}, &batch));
    CHECK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){params, batch}, &margs));
    nb_tree *trees[] = {batch, y, x, params, layers[0], layers[1], layers[2]};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    return margs;
}

/* The MLP's 8 GEMMs (3 forward, 3 weight gradients, 2 input gradients) in BLIS alone, on
 * buffers of the same shapes, with transposes as strides. */
static double gemm_only_us(void) {
    int64_t b = 128, sz[4] = {784, 256, 256, 10};
    size_t nf = 2 * 1024 * 1024;
    float *A = malloc(nf * sizeof(float)), *B = malloc(nf * sizeof(float)),
          *C = malloc(nf * sizeof(float));
    for (size_t i = 0; i < nf; i++) { /* real values, as in the model */
        A[i] = (float)((int)(i % 13) - 6) * 0.05f;
        B[i] = (float)((int)(i % 11) - 5) * 0.05f;
    }
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm);
    float one = 1, zero = 0;
    double s[41];
    for (int r = 0; r < 41; r++) { /* the first 5 warm up */
        double t0 = now_s();
        for (int i = 0; i < 3; i++) { /* forward: [b,in] @ [in,out] */
            bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, b, sz[i + 1], sz[i], &one, A, sz[i],
                         1, B, sz[i + 1], 1, &zero, C, sz[i + 1], 1, NULL, &rntm);
        }
        for (int i = 0; i < 3; i++) { /* dW = h^T [in,b] @ g [b,out] */
            bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, sz[i], sz[i + 1], b, &one, A, 1,
                         sz[i], B, sz[i + 1], 1, &zero, C, sz[i + 1], 1, NULL, &rntm);
        }
        for (int i = 1; i < 3; i++) { /* dh = g [b,out] @ W^T [out,in] */
            bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, b, sz[i], sz[i + 1], &one, A,
                         sz[i + 1], 1, B, 1, sz[i + 1], &zero, C, sz[i], 1, NULL, &rntm);
        }
        s[r] = (now_s() - t0) * 1e6;
    }
    free(A);
    free(B);
    free(C);
    qsort(s + 5, 36, sizeof s[0], cmp_d);
    return s[5 + 18];
}

int main(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(NULL, &ctx) != NB_OK) {
        return 1;
    }
    char info[256];
    nb_build_info(info, sizeof info, NULL);

    /* peer first, so both measure on a quiet machine as far as possible */
    double peer[16];
    for (int i = 0; i < 16; i++) {
        peer[i] = NAN;
    }
    char version[128] = "not run (needs /usr/bin/python3 with python3-torch)";
    FILE *p = access("/usr/bin/python3", X_OK) == 0
                  ? popen("/usr/bin/python3 benchmarks/peers/torch_grad.py 2>/dev/null", "r")
                  : NULL;
    const char *keys[] = {
        "rosen_fwd_us_2",       "rosen_vg_us_2",       "rosen_fwd_us_1000", "rosen_vg_us_1000",
        "rosen_fwd_us_1000000", "rosen_vg_us_1000000", "mlp_us_t1",         "mlp_us_t2"};
    if (p != NULL) {
        char line[256];
        while (fgets(line, sizeof line, p) != NULL) {
            char k[64], v[64];
            if (sscanf(line, "%63s %63s", k, v) != 2) {
                continue;
            }
            if (strcmp(k, "torch_version") == 0) {
                snprintf(version, sizeof version, "PyTorch %s", v);
            }
            for (int i = 0; i < 8; i++) {
                if (strcmp(k, keys[i]) == 0) {
                    peer[i] = atof(v);
                }
            }
        }
        pclose(p);
    }

    printf("%s\npeer: %s\n\n", info, version);
    printf("| Rosenbrock f64, n | nabla fwd µs | nabla v&g µs | nabla ratio | PyTorch ratio |\n");
    printf("|---|---|---|---|---|\n");
    nb_fn *rosen = NULL, *vg = NULL;
    CHECK(ctx, nb_fn_create(ctx, "rosen", body_rosen, NULL, &rosen));
    CHECK(ctx, nb_value_and_grad(rosen, NULL, &vg));
    int64_t ns[3] = {2, 1000, 1000000};
    for (int k = 0; k < 3; k++) {
        nb_array *x = NULL;
        CHECK(ctx, nb_array_linspace(ctx, NB_DTYPE_F64, -1, 2, ns[k], &x));
        nb_tree *lx = NULL, *args = NULL;
        CHECK(ctx, nb_tree_array(x, &lx));
        CHECK(ctx, nb_tree_tuple(ctx, 1, &lx, &args));
        int inner = ns[k] < 10000 ? 2000 : 5;
        double f = time_call(ctx, rosen, args, 9, inner), g = time_call(ctx, vg, args, 9, inner);
        printf("| %lld | %.2f | %.2f | %.2f | %.2f |\n", (long long)ns[k], f, g, g / f,
               peer[2 * k + 1] / peer[2 * k]);
        nb_tree_destroy(args);
        nb_tree_destroy(lx);
        nb_array_destroy(x);
    }

    double t_mlp[2];
    size_t ws = 0;
    for (int t = 0; t < 2; t++) { /* the same step in a 1-thread and a 2-thread context */
        nb_ctx_opts o = nb_ctx_opts_default();
        o.n_threads = t + 1;
        nb_ctx *c2 = NULL;
        CHECK(ctx, nb_ctx_create(&o, &c2));
        nb_tree *margs = mlp_args(c2);
        nb_fn *mlp = NULL, *mvg = NULL;
        CHECK(c2, nb_fn_create(c2, "mlp", body_mlp, NULL, &mlp));
        CHECK(c2, nb_value_and_grad(mlp, NULL, &mvg));
        t_mlp[t] = time_call(c2, mvg, margs, 15, 20);
        nb_fn_stats st;
        CHECK(c2, nb_fn_stats_get(mvg, &st));
        ws = st.workspace_bytes;
        nb_fn_destroy(mvg);
        nb_fn_destroy(mlp);
        nb_tree_destroy(margs);
        nb_ctx_destroy(c2);
    }
    double t_gemm = gemm_only_us();
    printf("\n| MLP 784-256-256-10, b=128, f32, fwd+bwd | µs | PyTorch / nabla |\n");
    printf("|---|---|---|\n");
    printf("| nabla, 1 thread | %.1f | %.2f |\n", t_mlp[0], peer[6] / t_mlp[0]);
    printf("| nabla, 2 threads | %.1f | %.2f |\n", t_mlp[1], peer[7] / t_mlp[1]);
    printf("| PyTorch, 1 thread | %.1f | |\n", peer[6]);
    printf("| PyTorch, 2 threads | %.1f | |\n", peer[7]);
    printf("| its 8 GEMMs in BLIS alone, 1 thread | %.1f | nabla 1 thread = %.2fx the GEMMs |\n",
           t_gemm, t_mlp[0] / t_gemm);
    printf("\nMLP value_and_grad: peak workspace %.2f MiB (parameters %.2f MiB)\n",
           (double)ws / (1 << 20),
           (double)(784 * 256 + 256 * 256 + 256 * 10 + 522) * 4 / (1 << 20));

    nb_fn_destroy(vg);
    nb_fn_destroy(rosen);
    nb_ctx_destroy(ctx);
    return 0;
}
