/*
 * bench_vmap.c -- nb_vmap's rows (issue 21), next to JAX, PyTorch and Diffrax measured in
 * the same run, and a plain-C limit.
 *
 * Table 1: per-example gradients of an MLP 784-256-256-10 (tanh hidden layers, each
 * example's own cross-entropy), f32, batch 128: nabla jit(vmap(grad(loss))) (in_axes: the
 * parameters null, x and the label 0); a C loop of 128 calls of nabla's jit(grad(loss)) on
 * one example each; the hand-written limit (benchmarks/limits/lim_pex.c: the batch's
 * forward and deltas in BLIS, each example's outer products in loops); JAX
 * jit(vmap(grad)) and PyTorch vmap(grad) (benchmarks/peers/jax_vmap.py, torch_vmap.py).
 * The output alone is 128 x 268,800 floats (138 MB): the work is bound by writing it.
 *
 * Table 2: 1,000 Lotka-Volterra solves over a parameter grid (lane i: a = 1.2 + 0.6 (i mod
 * 40) / 39, b = 1, c = 2.5 + (i div 40) / 24, d = 1, x0 = y0 = 1), tsit5, rtol = atol = 1e-8,
 * dt0 = 0.01, t in [0, 10], SaveAt t1, and every lane's gradient of G = x(10) + y(10) with
 * respect to its (a, b, c, d, x0, y0) (recursive checkpoint adjoint): nabla jit(vmap(f)); a C
 * loop of 1,000 calls of nabla's jit(f); the plain-C limit (limits/lim_lv.c: nabla's steps
 * and discrete adjoint written out, one lane after another); Diffrax jit(vmap(f)).
 * The batched results are checked against the loop's (bit for bit) and the limit's steps.
 *
 * Memory: the vmapped executables' workspace (nb_fn_stats.workspace_bytes: intermediates and
 * kernel scratch beyond inputs and outputs) at several batch sizes.
 *
 * Every time is a median of interleaved samples (each a burst of >= 20 ms), 1 thread, nabla's
 * functions compiled natively (NB_NATIVE_NOW). Run from the repository root: make bench, or
 * ./build/benchmarks/bench_vmap [--samples S] [--lanes N]. Peers run when their interpreter
 * exists (build/peers/bin/python with jax and diffrax; /usr/bin/python3 with torch).
 */
#define BENCH_NAME "bench_vmap"
#include "bench_common.h"

#include "limits/limits.h"

#include <nabla/nabla.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NI = 784, NH = 256, NO = 10, BATCH = 128 };
static const char *const PK[6] = {"b0", "b1", "b2", "w0", "w1", "w2"}; /* sorted keys */

/* ---- deterministic data ------------------------------------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double uniform01(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) * 0x1.0p-53;
}
static double normal01(void) {
    double u = uniform01(), v = uniform01();
    return sqrt(-2.0 * log(u > 0 ? u : 1e-300)) * cos(6.283185307179586 * v);
}

static nb_tree *arr_leaf(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape,
                         const void *data) {
    nb_array *a = NULL;
    nb_tree *l = NULL;
    BENCH_CHECK(ctx, nb_array_from_data(ctx, dt, rank, shape, data, &a));
    BENCH_CHECK(ctx, nb_tree_array(a, &l));
    nb_array_destroy(a);
    return l;
}

static nb_tree *tuple(nb_ctx *ctx, int n, nb_tree **items) { /* takes the items */
    nb_tree *t = NULL;
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, n, items, &t));
    for (int i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    return t;
}

static nb_fn *jitted(nb_ctx *ctx, nb_fn *f) {
    nb_jit_opts o = nb_jit_opts_default();
    o.native = NB_NATIVE_NOW;
    nb_fn *j = NULL;
    BENCH_CHECK(ctx, nb_jit(f, &o, &j));
    nb_fn_destroy(f);
    return j;
}

/* ---- timing ------------------------------------------------------------------------------ */

typedef struct call_ud {
    nb_ctx *ctx;
    nb_fn *f;             /* one call of f on args[0], or */
    nb_tree **args;       /* n calls, one on each of args[0..n) */
    int n;                /* 1 for a single call */
    void (*c_fn)(void *); /* or a C function */
    void *c_ud;
    int burst;
} call_ud;

/* A loop keeps its calls' outputs until the end (the per-example gradients of a batch all
 * exist at once, as vmap's do: freed one by one, each call would write into the same
 * cache-hot memory). */
static void run_once(call_ud *u) {
    if (u->c_fn != NULL) {
        u->c_fn(u->c_ud);
        return;
    }
    nb_tree *outs[1024];
    for (int i0 = 0; i0 < u->n; i0 += 1024) {
        int m = u->n - i0 < 1024 ? u->n - i0 : 1024;
        for (int i = 0; i < m; i++) {
            BENCH_CHECK(u->ctx, nb_fn_call(u->f, u->args[i0 + i], &outs[i]));
        }
        for (int i = 0; i < m; i++) {
            nb_tree_destroy(outs[i]);
        }
    }
}

/* µs per run, over a burst sized on the first sample to last >= 20 ms */
static double sample_call(void *ud) {
    call_ud *u = ud;
    if (u->burst == 0) {
        double t0 = bench_now_s();
        int b = 0;
        while (bench_now_s() - t0 < 0.02 || b < 1) {
            run_once(u);
            b++;
        }
        u->burst = b;
    }
    double t0 = bench_now_s();
    for (int i = 0; i < u->burst; i++) {
        run_once(u);
    }
    return (bench_now_s() - t0) / u->burst * 1e6;
}

/* ---- peers ------------------------------------------------------------------------------- */

typedef struct peers {
    double pex_jax, pex_torch, lv_solve, lv_grad, lv_steps, lv_sum, lv_grad_sum;
    char jax[64], diffrax[64], torch[64], torch_api[64];
} peers;

/* lanes 0: none run */
static void run_peers(peers *p, int lanes) {
    p->pex_jax = p->pex_torch = p->lv_solve = p->lv_grad = NAN;
    p->lv_steps = p->lv_sum = p->lv_grad_sum = NAN;
    snprintf(p->jax, sizeof p->jax, "-");
    snprintf(p->diffrax, sizeof p->diffrax, "-");
    snprintf(p->torch, sizeof p->torch, "-");
    snprintf(p->torch_api, sizeof p->torch_api, "-");
    if (lanes == 0) {
        return;
    }
    if (access("build/peers/bin/python", X_OK) == 0) {
        char cmd[256];
        snprintf(cmd, sizeof cmd,
                 "build/peers/bin/python benchmarks/peers/jax_vmap.py --lanes %d 2>/dev/null",
                 lanes);
        const char *keys[] = {"pex_us",         "lv_solve_us", "lv_grad_us",
                              "lv_steps_total", "lv_sum",      "lv_grad_sum"};
        double v[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
        bench_peer_read(cmd, 6, keys, v, "jax_version", p->jax, sizeof p->jax);
        bench_peer_read("build/peers/bin/python -c 'import diffrax; print(\"v\", "
                        "diffrax.__version__)' 2>/dev/null",
                        0, NULL, NULL, "v", p->diffrax, sizeof p->diffrax);
        p->pex_jax = v[0], p->lv_solve = v[1], p->lv_grad = v[2];
        p->lv_steps = v[3], p->lv_sum = v[4], p->lv_grad_sum = v[5];
    }
    if (access("/usr/bin/python3", X_OK) == 0) {
        const char *keys[] = {"pex_us"};
        bench_peer_read("/usr/bin/python3 benchmarks/peers/torch_vmap.py 2>/dev/null", 1, keys,
                        &p->pex_torch, "torch_version", p->torch, sizeof p->torch);
        bench_peer_read("/usr/bin/python3 benchmarks/peers/torch_vmap.py --samples 1 "
                        "2>/dev/null",
                        0, NULL, NULL, "vmap_api", p->torch_api, sizeof p->torch_api);
    }
}

/* ---- table 1: per-example gradients -------------------------------------------------------- */

/* args: (params dict(b0, b1, b2, w0, w1, w2), x f32[784], y i32[]) -> the example's loss */
static nb_status body_pex_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    const nb_tree *p = nb_tree_child(args, 0);
    nb_var *h = nb_reshape(nb_get(tr, args, "[1]"), 2, (int64_t[]){1, NI});
    static const char *const w[3] = {"w0", "w1", "w2"}, *const b[3] = {"b0", "b1", "b2"};
    for (int k = 0; k < 3; k++) {
        h = nb_add(nb_matmul(h, nb_get(tr, p, "%s", w[k])), nb_get(tr, p, "%s", b[k]));
        if (k < 2) {
            h = nb_tanh(h);
        }
    }
    nb_var *lp = nb_log_softmax(h, -1);
    nb_var *y = nb_reshape(nb_get(tr, args, "[2]"), 1, (int64_t[]){1});
    nb_var *pick = nb_sum(nb_mul(lp, nb_one_hot(y, NO, NB_DTYPE_F32)), NULL, 0, false);
    return nb_return(nb_neg(pick), out);
}

static void call_lim_pex(void *ud) {
    lim_pex_grads(ud);
}

static void table_pex(nb_ctx *ctx, const peers *pe, int samples) {
    lim_pex *lim = lim_pex_create();
    if (lim == NULL) {
        fprintf(stderr, BENCH_NAME ": out of memory\n");
        exit(1);
    }
    static const int64_t shp[6][2] = {{NH, 0}, {NH, 0}, {NO, 0}, {NI, NH}, {NH, NH}, {NH, NO}};
    static const int lim_of[6] = {1, 3, 5, 0, 2, 4}; /* lim_pex's leaf for PK[k] */
    nb_tree *pl[6];
    for (int k = 0; k < 6; k++) {
        int rank = shp[k][1] ? 2 : 1;
        int64_t n = shp[k][0] * (shp[k][1] ? shp[k][1] : 1);
        float *d = lim_pex_param(lim, lim_of[k]);
        double r = 1.0 / sqrt((double)shp[k][0]);
        for (int64_t i = 0; i < n; i++) {
            d[i] = rank == 2 ? (float)((2.0 * uniform01() - 1.0) * r) : 0.0f;
        }
        pl[k] = arr_leaf(ctx, NB_DTYPE_F32, rank, shp[k], d);
    }
    nb_tree *params = NULL;
    BENCH_CHECK(ctx, nb_tree_dict(ctx, 6, PK, pl, &params));
    for (int k = 0; k < 6; k++) {
        nb_tree_destroy(pl[k]);
    }
    float *x = lim_pex_x(lim);
    int32_t *y = lim_pex_labels(lim);
    for (int i = 0; i < BATCH * NI; i++) {
        x[i] = (float)normal01();
    }
    for (int i = 0; i < BATCH; i++) {
        y[i] = (7 * i + 3) % NO;
    }
    /* nabla: vmap(grad) and a loop of single grads */
    nb_fn *loss = NULL, *g = NULL, *vg = NULL;
    BENCH_CHECK(ctx, nb_fn_create(ctx, "pex_loss", body_pex_loss, NULL, &loss));
    BENCH_CHECK(ctx, nb_grad(loss, NULL, &g));
    nb_tree *ax[3] = {NULL, NULL, NULL};
    BENCH_CHECK(ctx, nb_tree_null(ctx, &ax[0]));
    BENCH_CHECK(ctx, nb_tree_int(ctx, 0, &ax[1]));
    BENCH_CHECK(ctx, nb_tree_int(ctx, 0, &ax[2]));
    nb_tree *axes = tuple(ctx, 3, ax);
    nb_vmap_opts vo = nb_vmap_opts_default();
    vo.in_axes = axes;
    BENCH_CHECK(ctx, nb_vmap(g, &vo, &vg));
    nb_fn *jvg = jitted(ctx, vg), *jg = jitted(ctx, g);
    nb_fn_destroy(loss);
    nb_tree *bargs = tuple(ctx, 3,
                           (nb_tree *[]){nb_tree_retain(params),
                                         arr_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){BATCH, NI}, x),
                                         arr_leaf(ctx, NB_DTYPE_I32, 1, (int64_t[]){BATCH}, y)});
    nb_tree *one[BATCH];
    for (int b = 0; b < BATCH; b++) {
        one[b] = tuple(ctx, 3,
                       (nb_tree *[]){nb_tree_retain(params),
                                     arr_leaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){NI}, x + b * NI),
                                     arr_leaf(ctx, NB_DTYPE_I32, 0, NULL, y + b)});
    }
    /* the results: vmap against the loop (bit for bit?) and against the limit */
    nb_tree *vout = NULL;
    BENCH_CHECK(ctx, nb_fn_call(jvg, bargs, &vout));
    lim_pex_grads(lim);
    int64_t differ = 0, total = 0;
    double worst_lim = 0;
    for (int b = 0; b < BATCH; b++) {
        nb_tree *o = NULL;
        BENCH_CHECK(ctx, nb_fn_call(jg, one[b], &o));
        for (int k = 0; k < 6; k++) {
            const nb_array *va = nb_tree_get_array(nb_tree_get(vout, PK[k]));
            const nb_array *oa = nb_tree_get_array(nb_tree_get(o, PK[k]));
            int64_t n = nb_array_size(oa);
            const float *vv = (const float *)nb_array_data(va) + b * n;
            const float *ov = nb_array_data(oa);
            const float *lv = lim_pex_grad(lim, lim_of[k]) + b * n;
            for (int64_t i = 0; i < n; i++) {
                differ += memcmp(&vv[i], &ov[i], sizeof(float)) != 0;
                worst_lim = fmax(worst_lim, fabs((double)vv[i] - (double)lv[i]));
                total++;
            }
        }
        nb_tree_destroy(o);
    }
    nb_tree_destroy(vout);
    call_ud uv = {.ctx = ctx, .f = jvg, .args = &bargs, .n = 1};
    call_ud ul = {.ctx = ctx, .f = jg, .args = one, .n = BATCH};
    call_ud uc = {.c_fn = call_lim_pex, .c_ud = lim};
    bench_item items[3] = {
        {sample_call, &uv, {0}}, {sample_call, &ul, {0}}, {sample_call, &uc, {0}}};
    bench_rounds(items, 3, samples);
    double t_v = bench_median(items[0].s, samples), t_l = bench_median(items[1].s, samples);
    double t_c = bench_median(items[2].s, samples);
    printf("\n## Per-example gradients: MLP 784-256-256-10, f32, batch 128 (µs per batch)\n\n");
    printf("| implementation | µs | vs nabla vmap |\n|---|---:|---:|\n");
    printf("| nabla jit(vmap(grad)) | %.0f | 1.00 |\n", t_v);
    printf("| nabla: C loop of 128 jit(grad) calls | %.0f | %.2f |\n", t_l, t_l / t_v);
    printf("| plain C (limits/lim_pex.c: BLIS + loops) | %.0f | %.2f |\n", t_c, t_c / t_v);
    printf("| JAX %s jit(vmap(grad)) | %.0f | %.2f |\n", pe->jax, pe->pex_jax, pe->pex_jax / t_v);
    printf("| PyTorch %s %s vmap(grad) | %.0f | %.2f |\n", pe->torch, pe->torch_api, pe->pex_torch,
           pe->pex_torch / t_v);
    printf("\n- JAX / nabla: %.2fx (goal >= 1.5x); nabla / plain C: %.2fx\n", pe->pex_jax / t_v,
           t_v / t_c);
    printf("- vmap against the loop of single grads: %lld of %lld elements differ (BLIS's "
           "128-row and 1-row products round differently); largest difference from plain C "
           "%.2e\n",
           (long long)differ, (long long)total, worst_lim);
    /* memory against the batch size */
    printf("- workspace of jit(vmap(grad)) by batch size (outputs: B x 1,075,200 bytes):");
    for (int bs = 32; bs <= BATCH; bs *= 2) {
        nb_tree *a = tuple(ctx, 3,
                           (nb_tree *[]){nb_tree_retain(params),
                                         arr_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){bs, NI}, x),
                                         arr_leaf(ctx, NB_DTYPE_I32, 1, (int64_t[]){bs}, y)});
        nb_tree *o = NULL;
        BENCH_CHECK(ctx, nb_fn_call(jvg, a, &o));
        nb_fn_stats st;
        BENCH_CHECK(ctx, nb_fn_stats_get(jvg, &st));
        printf(" B=%d %.1f MB;", bs, (double)st.workspace_bytes / 1e6);
        nb_tree_destroy(o);
        nb_tree_destroy(a);
    }
    printf("\n");
    for (int b = 0; b < BATCH; b++) {
        nb_tree_destroy(one[b]);
    }
    nb_tree_destroy(bargs);
    nb_tree_destroy(axes);
    nb_tree_destroy(params);
    nb_fn_destroy(jvg);
    nb_fn_destroy(jg);
    lim_pex_destroy(lim);
}

/* ---- table 2: an ensemble of ODE solves ---------------------------------------------------- */

static nb_status term_lv(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *s = nb_get(tr, args, "[1]"), *p = nb_get(tr, args, "[2]");
    nb_var *x = nb_slice(s, (int64_t[]){0}, (int64_t[]){1}, NULL);
    nb_var *y = nb_slice(s, (int64_t[]){1}, (int64_t[]){2}, NULL);
    nb_var *c[4];
    for (int i = 0; i < 4; i++) {
        c[i] = nb_slice(p, (int64_t[]){i}, (int64_t[]){i + 1}, NULL);
    }
    nb_var *xy = nb_mul(x, y);
    nb_var *dx = nb_sub(nb_mul(c[0], x), nb_mul(c[1], xy));
    nb_var *dy = nb_add(nb_neg(nb_mul(c[2], y)), nb_mul(c[3], xy));
    return nb_return(nb_concatenate(2, (nb_var *[]){dx, dy}, 0), out);
}

/* self: grad (bool); args: (p f64[6]) -> ((x, y)(10), accepted steps), or G = x + y */
static nb_status body_lv(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    bool grad = false;
    nb_tree_get_bool(self, &grad);
    nb_fn *term = NULL;
    nb_status st = nb_fn_create(ctx, "lv", term_lv, NULL, &term);
    if (st != NB_OK) {
        return st;
    }
    nb_var *p = nb_get(tr, args, "[0]");
    nb_ode_opts o = nb_ode_opts_default();
    o.t0 = 0.0;
    o.t1 = 10.0;
    o.dt0 = 0.01;
    o.controller = nb_ode_pid(1e-8, 1e-8);
    o.max_steps = 4096;
    nb_tree *y0 = nb_leaf(nb_slice(p, (int64_t[]){4}, (int64_t[]){6}, NULL));
    nb_tree *pa = nb_leaf(nb_slice(p, (int64_t[]){0}, (int64_t[]){4}, NULL));
    const nb_tree *sol = nb_diffeqsolve(tr, term, y0, pa, &o);
    nb_fn_destroy(term);
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *yt = nb_reshape(nb_get(tr, sol, "ys"), 1, (int64_t[]){2});
    if (grad) {
        return nb_return(nb_sum(yt, NULL, 0, false), out);
    }
    return nb_tree_tuple(
        ctx, 2, (nb_tree *[]){nb_leaf(yt), nb_leaf(nb_get(tr, sol, "stats.num_accepted_steps"))},
        out);
}

static void lv_grid(int lanes, double *p) {
    for (int i = 0; i < lanes; i++) {
        int k = i % 1000;
        double *q = p + 6 * i;
        q[0] = 1.2 + 0.6 * (k % 40) / 39.0;
        q[1] = 1.0;
        q[2] = 2.5 + (double)(k / 40) / 24.0;
        q[3] = 1.0;
        q[4] = 1.0;
        q[5] = 1.0;
    }
}

typedef struct lim_ens {
    const double *p;
    int lanes;
    bool grad;
    lim_lv_opts o;
    void *work;
    double *out;
    int steps;
} lim_ens;

static void call_lim_lv(void *ud) {
    lim_ens *u = ud;
    u->steps = 0;
    for (int i = 0; i < u->lanes; i++) {
        lim_lv_stats st;
        if (u->grad) {
            lim_lv_grad(u->p + 6 * i, &u->o, u->work, u->out + 6 * i, NULL, &st);
        } else {
            lim_lv_solve(u->p + 6 * i, &u->o, u->out + 2 * i, NULL, &st);
        }
        u->steps += st.accepted;
    }
}

static void table_lv(nb_ctx *ctx, const peers *pe, int samples, int lanes) {
    double *p = malloc(sizeof(double) * 6 * (size_t)lanes);
    double *cout = malloc(sizeof(double) * 6 * (size_t)lanes);
    lim_ens le = {
        .p = p,
        .lanes = lanes,
        .o = {.t0 = 0.0, .t1 = 10.0, .dt0 = 0.01, .rtol = 1e-8, .atol = 1e-8, .max_steps = 4096},
        .out = cout};
    le.work = malloc(lim_lv_work_bytes(&le.o));
    nb_tree **one = malloc(sizeof(nb_tree *) * (size_t)lanes);
    if (p == NULL || cout == NULL || le.work == NULL || one == NULL) {
        fprintf(stderr, BENCH_NAME ": out of memory\n");
        exit(1);
    }
    lv_grid(lanes, p);
    nb_tree *bargs =
        tuple(ctx, 1, (nb_tree *[]){arr_leaf(ctx, NB_DTYPE_F64, 2, (int64_t[]){lanes, 6}, p)});
    for (int i = 0; i < lanes; i++) {
        one[i] =
            tuple(ctx, 1, (nb_tree *[]){arr_leaf(ctx, NB_DTYPE_F64, 1, (int64_t[]){6}, p + 6 * i)});
    }
    printf("\n## An ensemble: %d Lotka-Volterra solves, tsit5, rtol 1e-8 (ms per ensemble)\n\n",
           lanes);
    printf("| | nabla jit(vmap(f)) | nabla: C loop of %d jit(f) | plain C (lim_lv.c) | "
           "Diffrax %s jit(vmap(f)) | Diffrax / nabla | nabla / plain C |\n",
           lanes, pe->diffrax);
    printf("|---|---:|---:|---:|---:|---:|---:|\n");
    char notes[2][512];
    for (int gi = 0; gi < 2; gi++) {
        bool grad = gi == 1;
        nb_tree *self = NULL;
        BENCH_CHECK(ctx, nb_tree_bool(ctx, grad, &self));
        nb_fn *f = NULL, *fg = NULL, *v = NULL;
        BENCH_CHECK(ctx, nb_fn_create(ctx, "lv", body_lv, self, &f));
        nb_tree_destroy(self);
        if (grad) {
            BENCH_CHECK(ctx, nb_grad(f, NULL, &fg));
            nb_fn_destroy(f);
            f = fg;
        }
        BENCH_CHECK(ctx, nb_vmap(f, NULL, &v));
        nb_fn *jv = jitted(ctx, v), *jf = jitted(ctx, f);
        /* checks: vmap against the loop, bit for bit; steps against plain C */
        nb_tree *vout = NULL;
        BENCH_CHECK(ctx, nb_fn_call(jv, bargs, &vout));
        int n = grad ? 6 : 2, differ = 0;
        double vsum = 0;
        long steps = 0;
        for (int i = 0; i < lanes; i++) {
            nb_tree *o = NULL;
            BENCH_CHECK(ctx, nb_fn_call(jf, one[i], &o));
            const nb_tree *ol = grad ? o : nb_tree_child(o, 0);
            const nb_tree *vl = grad ? vout : nb_tree_child(vout, 0);
            const double *a = (const double *)nb_array_data(nb_tree_get_array(vl)) + n * i;
            const double *b = nb_array_data(nb_tree_get_array(ol));
            differ += memcmp(a, b, sizeof(double) * (size_t)n) != 0;
            for (int k = 0; k < n; k++) {
                vsum += a[k];
            }
            if (!grad) {
                steps +=
                    ((const int32_t *)nb_array_data(nb_tree_get_array(nb_tree_child(vout, 1))))[i];
            }
            nb_tree_destroy(o);
        }
        nb_tree_destroy(vout);
        le.grad = grad;
        call_lim_lv(&le);
        double csum = 0;
        for (int i = 0; i < lanes * n; i++) {
            csum += cout[i];
        }
        call_ud uv = {.ctx = ctx, .f = jv, .args = &bargs, .n = 1};
        call_ud ul = {.ctx = ctx, .f = jf, .args = one, .n = lanes};
        call_ud uc = {.c_fn = call_lim_lv, .c_ud = &le};
        bench_item items[3] = {
            {sample_call, &uv, {0}}, {sample_call, &ul, {0}}, {sample_call, &uc, {0}}};
        bench_rounds(items, 3, samples);
        double t_v = bench_median(items[0].s, samples) / 1e3;
        double t_l = bench_median(items[1].s, samples) / 1e3;
        double t_c = bench_median(items[2].s, samples) / 1e3;
        double t_d = (grad ? pe->lv_grad : pe->lv_solve) / 1e3;
        printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
               grad ? "gradient (every lane's)" : "solve", t_v, t_l, t_c, t_d, t_d / t_v,
               t_v / t_c);
        if (grad) {
            snprintf(notes[gi], sizeof notes[gi],
                     "gradients: vmap vs loop %d of %d lanes differ; sum of entries nabla "
                     "%.15g, plain C %.15g, Diffrax %.15g",
                     differ, lanes, vsum, csum, pe->lv_grad_sum);
        } else {
            snprintf(notes[gi], sizeof notes[gi],
                     "solves: vmap vs loop %d of %d lanes differ; accepted steps nabla %ld, "
                     "plain C %d, Diffrax %.0f; sum of (x, y)(10) nabla %.15g, plain C %.15g, "
                     "Diffrax %.15g",
                     differ, lanes, steps, le.steps, pe->lv_steps, vsum, csum, pe->lv_sum);
        }
        /* memory against the number of lanes */
        size_t ws[3] = {0, 0, 0};
        int nl[3] = {10, 100, lanes};
        for (int k = 0; k < 3; k++) {
            nb_tree *a = tuple(
                ctx, 1, (nb_tree *[]){arr_leaf(ctx, NB_DTYPE_F64, 2, (int64_t[]){nl[k], 6}, p)});
            nb_tree *o = NULL;
            BENCH_CHECK(ctx, nb_fn_call(jv, a, &o));
            nb_fn_stats st;
            BENCH_CHECK(ctx, nb_fn_stats_get(jv, &st));
            ws[k] = st.workspace_bytes;
            nb_tree_destroy(o);
            nb_tree_destroy(a);
        }
        size_t len = strlen(notes[gi]);
        snprintf(notes[gi] + len, sizeof notes[gi] - len,
                 "; workspace %d lanes %.2f MB, %d lanes %.2f MB, %d lanes %.2f MB", nl[0],
                 (double)ws[0] / 1e6, nl[1], (double)ws[1] / 1e6, nl[2], (double)ws[2] / 1e6);
        nb_fn_destroy(jv);
        nb_fn_destroy(jf);
    }
    printf("\n- %s\n- %s\n", notes[0], notes[1]);
    for (int i = 0; i < lanes; i++) {
        nb_tree_destroy(one[i]);
    }
    free(one);
    nb_tree_destroy(bargs);
    free(le.work);
    free(cout);
    free(p);
}

int main(int argc, char **argv) {
    int samples = 11, lanes = 1000;
    bool with_peers = true, with_lv = true;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-peers") == 0) {
            with_peers = false;
        } else if (strcmp(argv[i], "--no-ode") == 0) {
            with_lv = false;
        } else if (strcmp(argv[i], "--samples") == 0 && i + 1 < argc) {
            samples = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--lanes") == 0 && i + 1 < argc) {
            lanes = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_vmap [--samples S] [--lanes N] [--no-peers] "
                            "[--no-ode]\n");
            return 2;
        }
    }
    if (samples < 1 || samples > BENCH_MAX_ROUNDS || lanes < 100) {
        fprintf(stderr, BENCH_NAME ": samples in 1..%d, lanes >= 100\n", BENCH_MAX_ROUNDS);
        return 2;
    }
    nb_ctx_opts co = nb_ctx_opts_default();
    co.n_threads = 1;
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(&co, &ctx) != NB_OK) {
        fprintf(stderr, BENCH_NAME ": cannot create a context\n");
        return 1;
    }
    char load[16];
    bench_load_average(load, sizeof load);
    printf("# bench_vmap: nb_vmap against JAX, PyTorch, Diffrax and plain C (1 thread, load "
           "average %s)\n",
           load);
    peers pe;
    run_peers(&pe, with_peers ? lanes : 0);
    table_pex(ctx, &pe, samples);
    if (with_lv) {
        table_lv(ctx, &pe, samples, lanes);
    }
    nb_ctx_destroy(ctx);
    return 0;
}
