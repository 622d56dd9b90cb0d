/*
 * bench_speed.c -- the speed table: nabla against a peer measured in the same run, at 1 and
 * 2 threads, with the goal of each row and whether it is met.
 *
 *   MLP 784-256-256-10 value_and_grad        vs PyTorch, and vs its 8 GEMMs in BLIS alone
 *   tiny MLP 2-32-32-1 value_and_grad        vs PyTorch (per-call overhead)
 *   Rosenbrock f64, v&g / forward, n = 1e6   vs PyTorch (the cost of reverse mode)
 *   fused tanh(x*a + b)*c over 1e7 f32       vs the SLEEF kernel nb_tanh uses, alone
 *   jit cache-hit call of x + 1              vs jax.jit
 *   trace + compile of an MLP train step     vs jax.jit(step).lower(...).compile()
 *
 * Below the table: memcpy's ns/elem, the MLP's peak workspace, the share of trace +
 * optimize in the compile time, and Rosenbrock's ratio at n = 2, 1e3, 1e6. The peers run
 * first (the scripts in benchmarks/peers/, through popen, from the repository root); then
 * every in-process measurement is taken in interleaved rounds (nabla at 1 and 2 threads and
 * the in-process peers, BLIS and SLEEF, one sample each per round, in rotating order) so
 * that the machine's drift hits each alike. Every number is a median. See
 * benchmarks/README.md.
 */
#include "exec/vmath.h"

#define BENCH_NAME "bench_speed"
#include "bench_common.h"
#include "bench_gemm.h"

#include <nabla/nabla.h>

#include <blis.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- peers run as programs -------------------------------------------------------------- */

enum {
    TK_MLP_T1,
    TK_MLP_T2,
    TK_TINY_T1,
    TK_TINY_T2,
    TK_RF_2,
    TK_RG_2,
    TK_RF_1K,
    TK_RG_1K,
    TK_RF_1M,
    TK_RG_1M,
    TK_RF_1M_T2,
    TK_RG_1M_T2,
    TK_COUNT
};
/* keys printed by benchmarks/peers/torch_grad.py (µs) */
static const char *const torch_keys[TK_COUNT] = {
    [TK_MLP_T1] = "mlp_us_t1",
    [TK_MLP_T2] = "mlp_us_t2",
    [TK_TINY_T1] = "tiny_us",
    [TK_TINY_T2] = "tiny_us_t2",
    [TK_RF_2] = "rosen_fwd_us_2",
    [TK_RG_2] = "rosen_vg_us_2",
    [TK_RF_1K] = "rosen_fwd_us_1000",
    [TK_RG_1K] = "rosen_vg_us_1000",
    [TK_RF_1M] = "rosen_fwd_us_1000000",
    [TK_RG_1M] = "rosen_vg_us_1000000",
    [TK_RF_1M_T2] = "rosen_fwd_us_1000000_t2",
    [TK_RG_1M_T2] = "rosen_vg_us_1000000_t2",
};

enum { JK_HIT, JK_STEP, JK_COUNT };
/* keys printed by benchmarks/peers/jax_jit.py */
static const char *const jax_keys[JK_COUNT] = {
    [JK_HIT] = "jit_hit_us", [JK_STEP] = "step_compile_ms"};

/* ---- interleaved measurement ------------------------------------------------------------ */

/* a call of f on args, inner times: µs per call */
typedef struct call_ud {
    nb_ctx *ctx;
    nb_fn *f;
    const nb_tree *args;
    const nb_call_opts *opts; /* may be NULL */
    int inner;
} call_ud;

static double sample_call(void *ud) {
    call_ud *c = ud;
    double t0 = bench_now_s();
    for (int i = 0; i < c->inner; i++) {
        nb_tree *out = NULL;
        BENCH_CHECK(c->ctx, nb_fn_call_ex(c->f, c->args, c->opts, &out));
        nb_tree_destroy(out);
    }
    return (bench_now_s() - t0) / c->inner * 1e6;
}

/* the first call after clearing the cache (trace, optimize, compile, one run): µs */
static double sample_first_call(void *ud) {
    call_ud *c = ud;
    nb_ctx_clear_cache(c->ctx);
    return sample_call(ud);
}

/* trace + optimize alone (nb_fn_format_ir of the optimized IR, no compile, no run): µs */
static double sample_trace_optimize(void *ud) {
    call_ud *c = ud;
    double t0 = bench_now_s();
    BENCH_CHECK(c->ctx,
                nb_fn_format_ir(c->f, c->args, NB_IR_OPTIMIZED, NULL, 0, NULL) == NB_ERR_TRUNCATED
                    ? NB_OK
                    : NB_ERR_INTERNAL);
    return (bench_now_s() - t0) * 1e6;
}

/* ---- the functions measured --------------------------------------------------------------- */

/* args = (params [{w, b} x 3], batch {x, y}): mean cross-entropy of a tanh MLP */
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

/* nb_tree_map_n callback over (params, grads): p - 0.01 g (p itself where g is null) */
static nb_status sgd_leaf(void *ud, const char *path, int n, const nb_tree *const *leaves,
                          nb_tree **out) {
    nb_trace *tr = ud;
    (void)path;
    (void)n;
    if (nb_tree_kind_of(leaves[1]) == NB_TREE_KIND_NULL) {
        *out = nb_tree_retain((nb_tree *)leaves[0]);
        return NB_OK;
    }
    nb_var *p = nb_var_of(tr, leaves[0]), *g = nb_var_of(tr, leaves[1]);
    *out = nb_tree_retain(nb_leaf(nb_sub(p, nb_mul(nb_scalar(tr, 0.01), g))));
    return *out == NULL ? NB_ERR_OOM : nb_trace_status(tr);
}

/* The train step, args = (params, batch) -> (loss, params - 0.01 * grads): value_and_grad
 * of body_mlp called inside this trace, and the SGD update over the gradient tree. */
static nb_status body_step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_fn *loss = NULL, *vg = NULL;
    nb_tree *params = NULL;
    nb_status st = nb_fn_create(ctx, "mlp_loss", body_mlp, NULL, &loss);
    if (st == NB_OK) {
        st = nb_value_and_grad(loss, NULL, &vg);
    }
    const nb_tree *r = st == NB_OK ? nb_apply(tr, vg, args) : NULL; /* (loss, grads) */
    if (st == NB_OK && r != NULL) {
        const nb_tree *pg[2] = {nb_tree_child(args, 0), nb_tree_child(r, 1)};
        st = nb_tree_map_n(2, pg, sgd_leaf, tr, 0, &params);
    }
    if (st == NB_OK && r != NULL) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(nb_get(tr, r, "[0]")), params}, out);
    }
    nb_tree_destroy(params);
    nb_fn_destroy(vg);
    nb_fn_destroy(loss);
    return st != NB_OK ? st : nb_trace_status(tr);
}

/* args = (params, batch {x, y}) of the tiny MLP: mean squared error */
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

static nb_status body_chain(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    nb_var *a = nb_get(tr, args, "[1]"), *b = nb_get(tr, args, "[2]"), *c = nb_get(tr, args, "[3]");
    return nb_return(nb_mul(nb_tanh(nb_add(nb_mul(x, a), b)), c), out);
}

static nb_status body_plus1(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_add(nb_get(tr, args, "[0]"), nb_scalar(tr, 1.0)), out);
}

/* ---- arguments ---------------------------------------------------------------------------- */

/* an array leaf of pseudo-random values in [-scale/2, scale/2) (labels 0..9 for i32) */
static nb_tree *leaf_fill(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape, double scale,
                          unsigned seed) {
    nb_array *a = NULL;
    BENCH_CHECK(ctx, nb_array_zeros(ctx, dt, rank, shape, &a));
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
    BENCH_CHECK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

/* (params [{w, b} x 3], batch {x, y}) for an MLP of layer sizes sz; y is i32 class labels
 * when labels, else f32 targets of shape [batch, sz[3]]. A new reference. */
static nb_tree *mlp_args(nb_ctx *ctx, const int64_t *sz, int64_t batch, bool labels) {
    nb_tree *layers[3], *params = NULL, *bt = NULL, *args = NULL;
    for (int i = 0; i < 3; i++) {
        nb_tree *w =
            leaf_fill(ctx, NB_DTYPE_F32, 2, (int64_t[]){sz[i], sz[i + 1]}, 0.1, 7u + (unsigned)i);
        nb_tree *b = leaf_fill(ctx, NB_DTYPE_F32, 1, &sz[i + 1], 0.1, 9u);
        BENCH_CHECK(
            ctx, nb_tree_dict(ctx, 2, (const char *[]){"w", "b"}, (nb_tree *[]){w, b}, &layers[i]));
        nb_tree_destroy(w);
        nb_tree_destroy(b);
    }
    BENCH_CHECK(ctx, nb_tree_list(ctx, 3, layers, &params));
    nb_tree *x = leaf_fill(ctx, NB_DTYPE_F32, 2, (int64_t[]){batch, sz[0]}, 2.0, 3u);
    nb_tree *y = labels ? leaf_fill(ctx, NB_DTYPE_I32, 1, &batch, 0, 5u)
                        : leaf_fill(ctx, NB_DTYPE_F32, 2, (int64_t[]){batch, sz[3]}, 2.0, 5u);
    BENCH_CHECK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"x", "y"}, (nb_tree *[]){x, y}, &bt));
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){params, bt}, &args));
    nb_tree *all[] = {bt, y, x, params, layers[0], layers[1], layers[2]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        nb_tree_destroy(all[i]);
    }
    return args;
}

/* a rank-0 f32 array leaf */
static nb_tree *scalar_f32(nb_ctx *ctx, double v) {
    nb_array *a = NULL;
    nb_tree *t = NULL;
    BENCH_CHECK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 0, NULL, v, &a));
    BENCH_CHECK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

/* (x,) for x an array leaf (borrowed) */
static nb_tree *tuple1(nb_ctx *ctx, nb_tree *x) {
    nb_tree *t = NULL;
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 1, &x, &t));
    return t;
}

/* ---- in-process peers --------------------------------------------------------------------- */

/* The MLP's 8 GEMMs in BLIS alone, on 1 or 2 threads (sample_gemms, gemm_ud): bench_gemm.h */

/* SLEEF's tanhf (the kernel nb_tanh uses) over n floats on 1 or 2 threads, or memcpy */
typedef struct stream_ud {
    const nbi_vmath *vm;
    float *dst;
    const float *src;
    int64_t n;
    int threads;
    bool copy; /* memcpy instead of tanh */
} stream_ud;

typedef struct half_job {
    const nbi_vmath *vm;
    float *dst;
    const float *src;
    int64_t n;
} half_job;

static void *tanh_half(void *arg) {
    half_job *j = arg;
    j->vm->f32[NBI_VM_TANH](j->dst, j->src, j->n);
    return NULL;
}

/* ns per element */
static double sample_stream(void *ud) {
    stream_ud *s = ud;
    double t0 = bench_now_s();
    if (s->copy) {
        memcpy(s->dst, s->src, (size_t)s->n * sizeof(float));
    } else if (s->threads == 1) {
        s->vm->f32[NBI_VM_TANH](s->dst, s->src, s->n);
    } else { /* two halves on two threads */
        int64_t h = s->n / 2 / 64 * 64;
        half_job jobs[2] = {{s->vm, s->dst, s->src, h}, {s->vm, s->dst + h, s->src + h, s->n - h}};
        bench_two_halves(tanh_half, &jobs[0], &jobs[1]);
    }
    return (bench_now_s() - t0) / (double)s->n * 1e9;
}

/* ---- the table ---------------------------------------------------------------------------- */

typedef enum goal_kind {
    GOAL_NABLA_AT_MOST,            /* nabla's number <= limit */
    GOAL_PEER_OVER_NABLA_AT_LEAST, /* peer / nabla >= limit */
    GOAL_NABLA_OVER_PEER_AT_MOST   /* nabla / peer <= limit */
} goal_kind;

typedef struct table_row {
    const char *workload;
    const char *unit; /* appended to each number ("" for a plain ratio) */
    int prec;
    double nb[2], peer[2]; /* at 1 and 2 threads */
    bool nabla_over_peer;  /* the ratio column: nabla / peer, else peer / nabla */
    const char *ratio_name;
    goal_kind goal;
    double limit;
    const char *goal_text;
} table_row;

static void cell(char *buf, size_t cap, double v, const char *unit, int prec) {
    if (isnan(v)) {
        snprintf(buf, cap, "not run");
    } else {
        snprintf(buf, cap, "%.*f%s%s", prec, v, unit[0] ? " " : "", unit);
    }
}

/* the goal at thread count t: 1 met, 0 not, -1 unknown (no peer) */
static int goal_met(const table_row *r, int t) {
    double q = r->goal == GOAL_NABLA_AT_MOST              ? r->nb[t]
               : r->goal == GOAL_PEER_OVER_NABLA_AT_LEAST ? r->peer[t] / r->nb[t]
                                                          : r->nb[t] / r->peer[t];
    if (isnan(q)) {
        return -1;
    }
    return r->goal == GOAL_PEER_OVER_NABLA_AT_LEAST ? q >= r->limit : q <= r->limit;
}

static void print_row(const table_row *r) {
    char c[4][48], ratio[64];
    for (int t = 0; t < 2; t++) {
        cell(c[t], sizeof c[t], r->nb[t], r->unit, r->prec);
        cell(c[2 + t], sizeof c[2 + t], r->peer[t], r->unit, r->prec);
    }
    double q = r->nabla_over_peer ? r->nb[0] / r->peer[0] : r->peer[0] / r->nb[0];
    if (isnan(q)) {
        snprintf(ratio, sizeof ratio, "n/a");
    } else {
        snprintf(ratio, sizeof ratio, "%.2f (%s)", q, r->ratio_name);
    }
    int m1 = goal_met(r, 0), m2 = goal_met(r, 1);
    const char *met = m1 < 0 || m2 < 0 ? "n/a (no peer)"
                      : m1 && m2       ? "yes"
                      : m1             ? "no (yes at 1 thread)"
                      : m2             ? "no (yes at 2 threads)"
                                       : "no";
    printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", r->workload, c[0], c[1], c[2], c[3],
           ratio, r->goal_text, met);
}

int main(void) {
    char info[256], load[32];
    nb_build_info(info, sizeof info, NULL);
    bench_load_average(load, sizeof load);

    /* ---- 1. the peers' programs, first ---- */
    double torch[TK_COUNT], jax[2][JK_COUNT];
    for (int i = 0; i < TK_COUNT; i++) {
        torch[i] = NAN;
    }
    for (int i = 0; i < 2 * JK_COUNT; i++) {
        jax[i / JK_COUNT][i % JK_COUNT] = NAN;
    }
    char torch_version[64] = "", jax_version[64] = "";
    if (access("/usr/bin/python3", X_OK) == 0) {
        bench_peer_read("/usr/bin/python3 benchmarks/peers/torch_grad.py 2>/dev/null", TK_COUNT,
                        torch_keys, torch, "torch_version", torch_version, sizeof torch_version);
    }
    if (access("build/peers/bin/python", X_OK) == 0) {
        for (int t = 0; t < 2; t++) {
            char cmd[256];
            snprintf(cmd, sizeof cmd,
                     "NB_BENCH_THREADS=%d build/peers/bin/python benchmarks/peers/jax_jit.py "
                     "jit_hit_us step_compile_ms 2>/dev/null",
                     t + 1);
            bench_peer_read(cmd, JK_COUNT, jax_keys, jax[t], "jax_version", jax_version,
                            sizeof jax_version);
        }
    }

    nb_ctx *ctx[2] = {NULL, NULL};
    for (int t = 0; t < 2; t++) {
        nb_ctx_opts o = nb_ctx_opts_default();
        o.n_threads = t + 1;
        if (nb_ctx_create(&o, &ctx[t]) != NB_OK) {
            fprintf(stderr, "bench_speed: nb_ctx_create failed\n");
            return 1;
        }
    }

    /* ---- 2. MLP value_and_grad at 1 and 2 threads, and its 8 GEMMs in BLIS ---- */
    double mlp[2], gemm[2];
    size_t ws = 0;
    {
        nb_tree *margs[2];
        nb_fn *mf[2], *mvg[2];
        call_ud cu[2];
        gemm_ud gu[2];
        size_t nf = 2 * 1024 * 1024;
        float *A = malloc(nf * sizeof(float)), *B = malloc(nf * sizeof(float)),
              *C = malloc(nf * sizeof(float));
        if (A == NULL || B == NULL || C == NULL) {
            fprintf(stderr, "bench_speed: out of memory\n");
            return 1;
        }
        for (size_t i = 0; i < nf; i++) { /* real values, as in the model */
            A[i] = (float)((int)(i % 13) - 6) * 0.05f;
            B[i] = (float)((int)(i % 11) - 5) * 0.05f;
        }
        bench_item items[4];
        for (int t = 0; t < 2; t++) {
            margs[t] = mlp_args(ctx[t], (int64_t[]){784, 256, 256, 10}, 128, true);
            BENCH_CHECK(ctx[t], nb_fn_create(ctx[t], "mlp", body_mlp, NULL, &mf[t]));
            BENCH_CHECK(ctx[t], nb_value_and_grad(mf[t], NULL, &mvg[t]));
            cu[t] = (call_ud){ctx[t], mvg[t], margs[t], NULL, 10};
            gu[t] = (gemm_ud){A, B, C, t + 1, 10};
            items[t] = (bench_item){.sample = sample_call, .ud = &cu[t]};
            items[2 + t] = (bench_item){.sample = sample_gemms, .ud = &gu[t]};
        }
        bench_rounds(items, 4, 15);
        for (int t = 0; t < 2; t++) {
            mlp[t] = bench_median(items[t].s, 15);
            gemm[t] = bench_median(items[2 + t].s, 15);
        }
        nb_fn_stats st;
        BENCH_CHECK(ctx[0], nb_fn_stats_get(mvg[0], &st));
        ws = st.workspace_bytes;
        for (int t = 0; t < 2; t++) {
            nb_fn_destroy(mvg[t]);
            nb_fn_destroy(mf[t]);
            nb_tree_destroy(margs[t]);
            nb_ctx_clear_cache(ctx[t]);
        }
        free(A);
        free(B);
        free(C);
    }

    /* ---- 3. tiny MLP value_and_grad: per-call overhead ---- */
    double tiny[2];
    {
        nb_tree *targs[2];
        nb_fn *tf[2], *tvg[2];
        call_ud cu[2];
        bench_item items[2];
        for (int t = 0; t < 2; t++) {
            targs[t] = mlp_args(ctx[t], (int64_t[]){2, 32, 32, 1}, 16, false);
            BENCH_CHECK(ctx[t], nb_fn_create(ctx[t], "tiny", body_tiny, NULL, &tf[t]));
            BENCH_CHECK(ctx[t], nb_value_and_grad(tf[t], NULL, &tvg[t]));
            cu[t] = (call_ud){ctx[t], tvg[t], targs[t], NULL, 1000};
            items[t] = (bench_item){.sample = sample_call, .ud = &cu[t]};
        }
        bench_rounds(items, 2, 15);
        for (int t = 0; t < 2; t++) {
            tiny[t] = bench_median(items[t].s, 15);
            nb_fn_destroy(tvg[t]);
            nb_fn_destroy(tf[t]);
            nb_tree_destroy(targs[t]);
            nb_ctx_clear_cache(ctx[t]);
        }
    }

    /* ---- 4. Rosenbrock: value_and_grad / forward; n = 2, 1e3 at 1 thread, 1e6 at both ---- */
    double rf[3][2], rg[3][2]; /* [n][thread] µs */
    {
        const int64_t ns[3] = {2, 1000, 1000000};
        nb_fn *rosen[2], *vg[2];
        for (int t = 0; t < 2; t++) {
            BENCH_CHECK(ctx[t], nb_fn_create(ctx[t], "rosen", body_rosen, NULL, &rosen[t]));
            BENCH_CHECK(ctx[t], nb_value_and_grad(rosen[t], NULL, &vg[t]));
        }
        for (int k = 0; k < 3; k++) {
            int nt = k < 2 ? 1 : 2, inner = ns[k] < 10000 ? 2000 : 5;
            nb_tree *args[2] = {NULL, NULL};
            call_ud cu[4];
            bench_item items[4];
            for (int t = 0; t < nt; t++) {
                nb_array *x = NULL;
                nb_tree *lx = NULL;
                BENCH_CHECK(ctx[t], nb_array_linspace(ctx[t], NB_DTYPE_F64, -1, 2, ns[k], &x));
                BENCH_CHECK(ctx[t], nb_tree_array(x, &lx));
                args[t] = tuple1(ctx[t], lx);
                nb_tree_destroy(lx);
                nb_array_destroy(x);
                cu[2 * t] = (call_ud){ctx[t], rosen[t], args[t], NULL, inner};
                cu[2 * t + 1] = (call_ud){ctx[t], vg[t], args[t], NULL, inner};
                items[2 * t] = (bench_item){.sample = sample_call, .ud = &cu[2 * t]};
                items[2 * t + 1] = (bench_item){.sample = sample_call, .ud = &cu[2 * t + 1]};
            }
            bench_rounds(items, 2 * nt, 9);
            for (int t = 0; t < 2; t++) {
                rf[k][t] = t < nt ? bench_median(items[2 * t].s, 9) : NAN;
                rg[k][t] = t < nt ? bench_median(items[2 * t + 1].s, 9) : NAN;
                nb_tree_destroy(args[t]);
            }
        }
        for (int t = 0; t < 2; t++) {
            nb_fn_destroy(vg[t]);
            nb_fn_destroy(rosen[t]);
            nb_ctx_clear_cache(ctx[t]);
        }
    }

    /* ---- 5. tanh(x*a + b)*c over 1e7 f32, x donated; SLEEF alone on 1 and 2 threads ---- */
    double fused[2], sleef[2], copy_ns;
    const nbi_vmath *vm = nbi_vmath_get();
    {
        int64_t n = 10000000;
        float *src = malloc((size_t)n * sizeof(float)), *dst = malloc((size_t)n * sizeof(float));
        if (src == NULL || dst == NULL) {
            fprintf(stderr, "bench_speed: out of memory\n");
            return 1;
        }
        for (int64_t i = 0; i < n; i++) {
            src[i] = (float)sin((double)i * 1e-3);
        }
        nb_fn *fns[2];
        nb_tree *args[2], *specs[2];
        nb_call_opts cos[2];
        call_ud cu[2];
        stream_ud su[3] = {
            {vm, dst, src, n, 1, false}, {vm, dst, src, n, 2, false}, {vm, dst, src, n, 1, true}};
        bench_item items[5];
        for (int t = 0; t < 2; t++) {
            nb_ctx *c = ctx[t];
            nb_array *xa = NULL;
            nb_tree *lx = NULL, *yes = NULL, *nul = NULL;
            BENCH_CHECK(c, nb_array_from_data(c, NB_DTYPE_F32, 1, &n, src, &xa));
            BENCH_CHECK(c, nb_tree_array(xa, &lx));
            nb_array_destroy(xa);
            nb_tree *la = scalar_f32(c, 1.5), *lb = scalar_f32(c, 0.25), *lc = scalar_f32(c, -2.0);
            BENCH_CHECK(c, nb_tree_tuple(c, 4, (nb_tree *[]){lx, la, lb, lc}, &args[t]));
            BENCH_CHECK(c, nb_fn_create(c, "chain", body_chain, NULL, &fns[t]));
            /* donate x so the output reuses its buffer: the step streams memory once */
            BENCH_CHECK(c, nb_tree_bool(c, true, &yes));
            BENCH_CHECK(c, nb_tree_null(c, &nul));
            BENCH_CHECK(c, nb_tree_tuple(c, 4, (nb_tree *[]){yes, nul, nul, nul}, &specs[t]));
            cos[t] = nb_call_opts_default();
            cos[t].donate = specs[t];
            cu[t] = (call_ud){c, fns[t], args[t], &cos[t], 1};
            items[t] = (bench_item){.sample = sample_call, .ud = &cu[t]};
            nb_tree *all[] = {nul, yes, lc, lb, la, lx};
            for (size_t q = 0; q < sizeof all / sizeof all[0]; q++) {
                nb_tree_destroy(all[q]);
            }
        }
        for (int i = 0; i < 3; i++) {
            items[2 + i] = (bench_item){.sample = sample_stream, .ud = &su[i]};
        }
        bench_rounds(items, 5, 15);
        for (int t = 0; t < 2; t++) {
            fused[t] = bench_median(items[t].s, 15) * 1e3 / (double)n; /* µs per call -> ns/elem */
            sleef[t] = bench_median(items[2 + t].s, 15);
            nb_tree_destroy(specs[t]);
            nb_tree_destroy(args[t]);
            nb_fn_destroy(fns[t]);
            nb_ctx_clear_cache(ctx[t]);
        }
        copy_ns = bench_median(items[4].s, 15);
        free(dst);
        free(src);
    }

    /* ---- 6. jit cache hit: the whole nb_fn_call of x + 1 on f32[4], output destroyed ---- */
    double hit[2];
    {
        nb_fn *f[2], *jf[2];
        nb_tree *args[2];
        call_ud cu[2];
        bench_item items[2];
        for (int t = 0; t < 2; t++) {
            nb_tree *x = leaf_fill(ctx[t], NB_DTYPE_F32, 1, (int64_t[]){4}, 1.0, 19u);
            args[t] = tuple1(ctx[t], x);
            nb_tree_destroy(x);
            BENCH_CHECK(ctx[t], nb_fn_create(ctx[t], "plus1", body_plus1, NULL, &f[t]));
            BENCH_CHECK(ctx[t], nb_jit(f[t], NULL, &jf[t]));
            cu[t] = (call_ud){ctx[t], jf[t], args[t], NULL, 20000};
            items[t] = (bench_item){.sample = sample_call, .ud = &cu[t]};
        }
        bench_rounds(items, 2, 15);
        for (int t = 0; t < 2; t++) {
            hit[t] = bench_median(items[t].s, 15);
            nb_tree_destroy(args[t]);
            nb_fn_destroy(jf[t]);
            nb_fn_destroy(f[t]);
            nb_ctx_clear_cache(ctx[t]);
        }
    }

    /* ---- 7. trace + compile of the train step: first call after clearing the cache less a
     *         steady-state call (medians of 11); trace + optimize alone beside it ---- */
    double compile_ms[2], trace_opt_ms;
    {
        nb_fn *step[2], *jstep[2];
        nb_tree *args[2];
        call_ud cu[2], steady[2], topt;
        bench_item items[5];
        for (int t = 0; t < 2; t++) {
            args[t] = mlp_args(ctx[t], (int64_t[]){784, 256, 256, 10}, 128, true);
            BENCH_CHECK(ctx[t], nb_fn_create(ctx[t], "train_step", body_step, NULL, &step[t]));
            BENCH_CHECK(ctx[t], nb_jit(step[t], NULL, &jstep[t]));
            cu[t] = (call_ud){ctx[t], jstep[t], args[t], NULL, 1};
            steady[t] = (call_ud){ctx[t], jstep[t], args[t], NULL, 3};
            items[2 * t] = (bench_item){.sample = sample_first_call, .ud = &cu[t]};
            items[2 * t + 1] = (bench_item){.sample = sample_call, .ud = &steady[t]};
        }
        topt = (call_ud){ctx[0], jstep[0], args[0], NULL, 1};
        items[4] = (bench_item){.sample = sample_trace_optimize, .ud = &topt};
        bench_rounds(items, 5, 11);
        for (int t = 0; t < 2; t++) {
            compile_ms[t] =
                (bench_median(items[2 * t].s, 11) - bench_median(items[2 * t + 1].s, 11)) * 1e-3;
        }
        trace_opt_ms = bench_median(items[4].s, 11) * 1e-3;
        /* the step's result, checked once: a finite loss and updated parameters */
        nb_tree *out = NULL;
        BENCH_CHECK(ctx[0], nb_fn_call(jstep[0], args[0], &out));
        double loss = NAN;
        BENCH_CHECK(ctx[0], nb_array_get_flat(nb_tree_get_array(nb_tree_child(out, 0)), 0, &loss));
        if (!isfinite(loss) || nb_tree_num_leaves(out) != 7) {
            fprintf(stderr, "bench_speed: the train step returned loss %g, %lld leaves\n", loss,
                    (long long)nb_tree_num_leaves(out));
            return 1;
        }
        nb_tree_destroy(out);
        for (int t = 0; t < 2; t++) {
            nb_tree_destroy(args[t]);
            nb_fn_destroy(jstep[t]);
            nb_fn_destroy(step[t]);
        }
    }

    /* ---- the table ---- */
    char pt[96], jx[96], fused_name[160];
    if (torch_version[0]) {
        snprintf(pt, sizeof pt, "PyTorch %s (/usr/bin/python3)", torch_version);
    } else {
        snprintf(pt, sizeof pt, "PyTorch not run (needs /usr/bin/python3 with python3-torch)");
    }
    if (jax_version[0]) {
        snprintf(jx, sizeof jx, "JAX %s (build/peers)", jax_version);
    } else {
        snprintf(jx, sizeof jx, "JAX not run (needs build/peers: see benchmarks/README.md)");
    }
    snprintf(fused_name, sizeof fused_name,
             "fused tanh(x*a + b)*c, 1e7 f32, x donated, vs SLEEF tanhf u35 (%s) alone", vm->isa);
    const table_row rows[] = {
        {"MLP 784-256-256-10, b=128, f32, fwd+bwd (value_and_grad of mean cross-entropy), vs "
         "PyTorch",
         "µs",
         1,
         {mlp[0], mlp[1]},
         {torch[TK_MLP_T1], torch[TK_MLP_T2]},
         false,
         "PyTorch/nabla",
         GOAL_PEER_OVER_NABLA_AT_LEAST,
         1.5,
         ">= 1.5x faster than PyTorch"},
        {"same, vs its 8 GEMMs in BLIS alone",
         "µs",
         1,
         {mlp[0], mlp[1]},
         {gemm[0], gemm[1]},
         true,
         "nabla/GEMMs",
         GOAL_NABLA_OVER_PEER_AT_MOST,
         1.15,
         "<= 1.15x the GEMMs"},
        {"tiny MLP 2-32-32-1, b=16, f32, fwd+bwd (value_and_grad of MSE), vs PyTorch",
         "µs",
         2,
         {tiny[0], tiny[1]},
         {torch[TK_TINY_T1], torch[TK_TINY_T2]},
         false,
         "PyTorch/nabla",
         GOAL_NABLA_AT_MOST,
         5.0,
         "<= 5 µs"},
        {"Rosenbrock f64, n=1e6: time(value_and_grad) / time(forward), vs PyTorch",
         "",
         2,
         {rg[2][0] / rf[2][0], rg[2][1] / rf[2][1]},
         {torch[TK_RG_1M] / torch[TK_RF_1M], torch[TK_RG_1M_T2] / torch[TK_RF_1M_T2]},
         false,
         "PyTorch/nabla",
         GOAL_NABLA_AT_MOST,
         2.5,
         "<= 2.5"},
        {fused_name,
         "ns/elem",
         3,
         {fused[0], fused[1]},
         {sleef[0], sleef[1]},
         true,
         "nabla/SLEEF",
         GOAL_NABLA_OVER_PEER_AT_MOST,
         1.3,
         "<= 1.3x the SLEEF kernel alone"},
        {"jit cache-hit call, x + 1 on f32[4], vs jax.jit",
         "µs",
         2,
         {hit[0], hit[1]},
         {jax[0][JK_HIT], jax[1][JK_HIT]},
         false,
         "JAX/nabla",
         GOAL_NABLA_AT_MOST,
         2.0,
         "<= 2 µs"},
        {"trace + compile, MLP 784-256-256-10 train step (value_and_grad + SGD update), vs "
         "jax.jit(step).lower().compile()",
         "ms",
         2,
         {compile_ms[0], compile_ms[1]},
         {jax[0][JK_STEP], jax[1][JK_STEP]},
         false,
         "JAX/nabla",
         GOAL_NABLA_AT_MOST,
         10.0,
         "<= 10 ms"},
    };

    printf("%s\npeers: %s; %s; BLIS and SLEEF in process\n", info, pt, jx);
    printf("machine: %ld CPUs, load average %s at start; medians of 9 to 15 interleaved "
           "samples\n\n",
           sysconf(_SC_NPROCESSORS_ONLN), load);
    printf("| workload | nabla 1 thread | nabla 2 threads | peer 1 thread | peer 2 threads | ratio "
           "(1 thread) | goal | met |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        print_row(&rows[i]);
    }
    printf(
        "\nmet: the goal holds at 1 and at 2 threads. ratio: peer / nabla against PyTorch and "
        "JAX (> 1: nabla is faster), nabla / peer against BLIS and SLEEF (1.00: no overhead).\n");
    printf("memcpy of 1e7 f32, 1 thread: %.3f ns/elem\n", copy_ns);
    printf("MLP value_and_grad: peak workspace %.2f MiB (parameters %.2f MiB)\n",
           (double)ws / (1 << 20),
           (double)(784 * 256 + 256 * 256 + 256 * 10 + 522) * 4 / (1 << 20));
    printf("train step: trace + optimize alone (fold, simplify, CSE, DCE, fuse; no compile, no "
           "run) %.3f ms of the %.3f ms\n",
           trace_opt_ms, compile_ms[0]);

    printf("\n| Rosenbrock f64, n, 1 thread | nabla fwd µs | nabla v&g µs | nabla ratio | PyTorch "
           "ratio |\n|---|---|---|---|---|\n");
    const char *nname[3] = {"2", "1e3", "1e6"};
    for (int k = 0; k < 3; k++) {
        printf("| %s | %.2f | %.2f | %.2f | %.2f |\n", nname[k], rf[k][0], rg[k][0],
               rg[k][0] / rf[k][0], torch[TK_RG_2 + 2 * k] / torch[TK_RF_2 + 2 * k]);
    }

    nb_ctx_destroy(ctx[1]);
    nb_ctx_destroy(ctx[0]);
    return 0;
}
