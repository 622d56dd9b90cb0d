/*
 * bench_train.c -- the train-step rows: a whole Adam train step as ONE jitted nabla function
 * (forward, loss, backward, Adam update, apply), the parameters and the optimizer state
 * donated so that the step updates them in place, next to PyTorch doing the same step with
 * torch.optim.Adam(foreach=True), at 1 and 2 threads, with the goal of each row:
 *
 *   MLP 784-256-256-10, b=128, f32, cross-entropy   vs PyTorch, and vs its 8 GEMMs in BLIS
 *   tiny MLP 2-32-32-1, b=16, f32, MSE              per-step overhead, PyTorch beside it
 *
 * Below the table: the train step's workspace, its number of traces over the whole run (must
 * be 1: the step is jitted with max_traces = 1), the time of a plain value_and_grad of the
 * same model (no optimizer) so that the optimizer's own cost shows, and the loss before and
 * after the timed steps (it must decrease, else the program exits with status 1).
 *
 * As bench_speed: the peer runs first (benchmarks/peers/torch_train.py, through popen, from
 * the repository root), then nabla and the in-process peer (BLIS) are measured in
 * interleaved rounds, every number a median. See benchmarks/README.md.
 *
 * `bench_train profile [mlp|tiny [threads [seconds]]]` runs only one train step in a loop,
 * for a profiler (perf record -e cpu-clock ./build/benchmarks/bench_train profile).
 */
#define BENCH_NAME "bench_train"
#include "bench_common.h"
#include "bench_gemm.h"

#include <nabla/nabla.h>

#include <blis.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const double learning_rate = 1e-3; /* as benchmarks/peers/torch_train.py */

/* ---- the peer, run as a program ---------------------------------------------------------- */

enum { TK_MLP_T1, TK_MLP_T2, TK_TINY_T1, TK_TINY_T2, TK_LOSS_FIRST, TK_LOSS_LAST, TK_COUNT };
/* keys printed by benchmarks/peers/torch_train.py (µs; losses) */
static const char *const torch_keys[TK_COUNT] = {
    [TK_MLP_T1] = "train_us_t1",          [TK_MLP_T2] = "train_us_t2",
    [TK_TINY_T1] = "tiny_train_us_t1",    [TK_TINY_T2] = "tiny_train_us_t2",
    [TK_LOSS_FIRST] = "train_loss_first", [TK_LOSS_LAST] = "train_loss_last",
};

/* ---- interleaved measurement ------------------------------------------------------------ */

enum { ROUNDS = 21 }; /* <= BENCH_MAX_ROUNDS */

static double item_median(bench_item *it) {
    return bench_median(it->s, ROUNDS);
}

/* inner calls of f on args: µs per call. With loss_at >= 0, the output's child loss_at is
 * the loss, kept in loss (the last call's) and steps counts the calls. */
typedef struct call_ud {
    nb_ctx *ctx;
    nb_fn *f;
    const nb_tree *args;
    const nb_call_opts *opts; /* may be NULL */
    int inner;
    int loss_at;
    double loss;
    int64_t steps;
} call_ud;

static double sample_call(void *ud) {
    call_ud *c = ud;
    double t0 = bench_now_s();
    for (int i = 0; i < c->inner; i++) {
        nb_tree *out = NULL;
        BENCH_CHECK(c->ctx, nb_fn_call_ex(c->f, c->args, c->opts, &out));
        if (c->loss_at >= 0) {
            BENCH_CHECK(c->ctx, nb_array_get_flat(nb_tree_get_array(nb_tree_child(out, c->loss_at)),
                                                  0, &c->loss));
            c->steps++;
        }
        nb_tree_destroy(out);
    }
    return (bench_now_s() - t0) / c->inner * 1e6;
}

/* ---- the functions measured --------------------------------------------------------------- */

/* args = (params [{w, b} x 3], batch {x, y}): the tanh MLP's logits */
static nb_var *mlp_logits(nb_trace *tr, const nb_tree *args) {
    nb_var *h = nb_get(tr, args, "[1].x");
    for (int i = 0; i < 3; i++) {
        h = nb_add(nb_matmul(h, nb_get(tr, args, "[0][%d].w", i)),
                   nb_get(tr, args, "[0][%d].b", i));
        if (i < 2) {
            h = nb_tanh(h);
        }
    }
    return h;
}

/* mean cross-entropy against i32 labels batch.y */
static nb_status body_mlp(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *picked = nb_take_along_axis(nb_log_softmax(mlp_logits(tr, args), -1),
                                        nb_expand_dims(nb_get(tr, args, "[1].y"), -1), -1);
    return nb_return(nb_neg(nb_mean(picked, NULL, 0, false)), out);
}

/* mean squared error against f32 targets batch.y */
static nb_status body_tiny(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *d = nb_sub(mlp_logits(tr, args), nb_get(tr, args, "[1].y"));
    return nb_return(nb_mean(nb_square(d), NULL, 0, false), out);
}

/* The train step, self = the optimizer, args = (params, state, batch) -> (params, state,
 * loss): value_and_grad of loss_body on (params, batch), the optimizer's update, apply. */
static nb_status train_step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out,
                            nb_fn_body loss_body) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_tree *params = (nb_tree *)nb_tree_child(args, 0), *batch = (nb_tree *)nb_tree_child(args, 2);
    const nb_tree *state = nb_tree_child(args, 1);
    nb_fn *loss = NULL, *vg = NULL;
    nb_tree *gargs = NULL;
    nb_status st = nb_fn_create(ctx, "loss", loss_body, NULL, &loss);
    if (st == NB_OK) {
        st = nb_value_and_grad(loss, NULL, &vg);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){params, batch}, &gargs);
    }
    const nb_tree *r = st == NB_OK ? nb_apply(tr, vg, gargs) : NULL; /* (loss, grads) */
    const nb_tree *updates = NULL, *new_state = NULL, *new_params = NULL;
    if (st == NB_OK && r != NULL) {
        st = nb_optim_update(tr, self, nb_tree_child(r, 1), state, params, &updates, &new_state);
    }
    if (st == NB_OK && r != NULL) {
        new_params = nb_apply_updates(tr, params, updates);
    }
    if (st == NB_OK && new_params != NULL) {
        st = nb_tree_tuple(ctx, 3,
                           (nb_tree *[]){(nb_tree *)new_params, (nb_tree *)new_state,
                                         (nb_tree *)nb_tree_child(r, 0)},
                           out);
    }
    nb_tree_destroy(gargs);
    nb_fn_destroy(vg);
    nb_fn_destroy(loss);
    return st != NB_OK ? st : nb_trace_status(tr);
}

static nb_status body_train_mlp(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    return train_step(tr, self, args, out, body_mlp);
}

static nb_status body_train_tiny(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    return train_step(tr, self, args, out, body_tiny);
}

/* ---- data --------------------------------------------------------------------------------- */

static nb_tree *leaf_of(nb_ctx *ctx, nb_array *a) {
    nb_tree *t = NULL;
    BENCH_CHECK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

/* One model and its training: everything a train step and a value_and_grad call need, in
 * one context. Deterministic: the parameters and x come from nb_random_* with fixed keys,
 * the targets from formulas. */
typedef struct model {
    nb_ctx *ctx;
    nb_tree *params, *batch, *opt, *state;
    nb_tree *train_args, *vg_args, *donate;
    nb_call_opts copts;
    nb_fn *step, *jstep, *loss, *vg;
} model;

static void model_init(model *m, nb_ctx *ctx, bool tiny) {
    memset(m, 0, sizeof *m);
    m->ctx = ctx;
    const int64_t big[4] = {784, 256, 256, 10}, small[4] = {2, 32, 32, 1};
    const int64_t *sz = tiny ? small : big, batch = tiny ? 16 : 128;
    nb_array *key = NULL, *k = NULL, *a = NULL;
    BENCH_CHECK(ctx, nb_random_key(ctx, tiny ? 1 : 0, &key));
    /* weights uniform in +-1/sqrt(fan_in) (PyTorch's nn.Linear bound), biases 0 */
    nb_tree *layers[3];
    for (int i = 0; i < 3; i++) {
        double r = 1.0 / sqrt((double)sz[i]);
        BENCH_CHECK(ctx, nb_random_fold_in(key, (uint32_t)i, &k));
        BENCH_CHECK(
            ctx, nb_random_uniform(k, NB_DTYPE_F32, 2, (int64_t[]){sz[i], sz[i + 1]}, -r, r, &a));
        nb_array_destroy(k);
        nb_tree *w = leaf_of(ctx, a);
        BENCH_CHECK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, &sz[i + 1], &a));
        nb_tree *b = leaf_of(ctx, a);
        BENCH_CHECK(
            ctx, nb_tree_dict(ctx, 2, (const char *[]){"w", "b"}, (nb_tree *[]){w, b}, &layers[i]));
        nb_tree_destroy(w);
        nb_tree_destroy(b);
    }
    BENCH_CHECK(ctx, nb_tree_list(ctx, 3, layers, &m->params));
    for (int i = 0; i < 3; i++) {
        nb_tree_destroy(layers[i]);
    }
    /* x: standard normal (MLP) or uniform in [-1, 1) (tiny); y: labels (7 i + 3) mod 10, or
     * sin(2 x0) cos(x1) */
    nb_array *xa = NULL, *ya = NULL;
    BENCH_CHECK(ctx, nb_random_fold_in(key, 100, &k));
    if (tiny) {
        BENCH_CHECK(ctx,
                    nb_random_uniform(k, NB_DTYPE_F32, 2, (int64_t[]){batch, sz[0]}, -1, 1, &xa));
        BENCH_CHECK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){batch, 1}, &ya));
        const float *x = nb_array_data(xa);
        for (int64_t i = 0; i < batch; i++) {
            ((float *)nb_array_data(ya))[i] = (float)(sin(2.0 * x[2 * i]) * cos(x[2 * i + 1]));
        }
    } else {
        BENCH_CHECK(ctx, nb_random_normal(k, NB_DTYPE_F32, 2, (int64_t[]){batch, sz[0]}, &xa));
        BENCH_CHECK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 1, &batch, &ya));
        for (int64_t i = 0; i < batch; i++) {
            ((int32_t *)nb_array_data(ya))[i] = (int32_t)((7 * i + 3) % 10);
        }
    }
    nb_array_destroy(k);
    nb_array_destroy(key);
    nb_tree *x = leaf_of(ctx, xa), *y = leaf_of(ctx, ya);
    BENCH_CHECK(ctx,
                nb_tree_dict(ctx, 2, (const char *[]){"x", "y"}, (nb_tree *[]){x, y}, &m->batch));
    nb_tree_destroy(x);
    nb_tree_destroy(y);

    /* Adam and its state (from the gradient template) */
    nb_tree *tmpl = NULL;
    BENCH_CHECK(ctx, nb_optim_adam(ctx, learning_rate, NULL, &m->opt));
    BENCH_CHECK(ctx, nb_grad_template(m->params, NULL, &tmpl));
    BENCH_CHECK(ctx, nb_optim_init(m->opt, tmpl, &m->state));
    nb_tree_destroy(tmpl);

    /* the train step, jitted, traced once at most: args (params, state, batch), the first two
     * donated -- its outputs are the very arrays of args, updated in place, so the same args
     * tree serves every step */
    BENCH_CHECK(
        ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){m->params, m->state, m->batch}, &m->train_args));
    nb_tree *yes = NULL, *no = NULL;
    BENCH_CHECK(ctx, nb_tree_bool(ctx, true, &yes));
    BENCH_CHECK(ctx, nb_tree_bool(ctx, false, &no));
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){yes, yes, no}, &m->donate));
    nb_tree_destroy(yes);
    nb_tree_destroy(no);
    m->copts = nb_call_opts_default();
    m->copts.donate = m->donate;
    BENCH_CHECK(ctx, nb_fn_create(ctx, tiny ? "train_step_tiny" : "train_step",
                                  tiny ? body_train_tiny : body_train_mlp, m->opt, &m->step));
    nb_jit_opts jo = nb_jit_opts_default();
    jo.max_traces = 1;
    BENCH_CHECK(ctx, nb_jit(m->step, &jo, &m->jstep));

    /* value_and_grad alone, args (params, batch) (the same arrays, not donated) */
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){m->params, m->batch}, &m->vg_args));
    BENCH_CHECK(ctx, nb_fn_create(ctx, tiny ? "tiny_loss" : "mlp_loss", tiny ? body_tiny : body_mlp,
                                  NULL, &m->loss));
    BENCH_CHECK(ctx, nb_value_and_grad(m->loss, NULL, &m->vg));
}

static void model_free(model *m) {
    nb_fn_destroy(m->vg);
    nb_fn_destroy(m->loss);
    nb_fn_destroy(m->jstep);
    nb_fn_destroy(m->step);
    nb_tree *all[] = {m->vg_args, m->train_args, m->donate, m->state, m->opt, m->batch, m->params};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        nb_tree_destroy(all[i]);
    }
}

/* The first step (trace + compile + run), checked: the outputs are args' own arrays (the
 * update is in place), the loss is finite. Returns the loss. */
static double model_first_step(model *m) {
    nb_ctx *ctx = m->ctx;
    nb_tree *out = NULL, *in_leaves = NULL, *out_leaves = NULL;
    BENCH_CHECK(ctx, nb_fn_call_ex(m->jstep, m->train_args, &m->copts, &out));
    nb_tree *in2 = NULL, *out2 = NULL;
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){m->params, m->state}, &in2));
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 2,
                                   (nb_tree *[]){(nb_tree *)nb_tree_child(out, 0),
                                                 (nb_tree *)nb_tree_child(out, 1)},
                                   &out2));
    BENCH_CHECK(ctx, nb_tree_flatten(in2, &in_leaves, NULL));
    BENCH_CHECK(ctx, nb_tree_flatten(out2, &out_leaves, NULL));
    int64_t n = nb_tree_len(in_leaves);
    bool same = n == nb_tree_len(out_leaves);
    for (int64_t i = 0; same && i < n; i++) {
        same = nb_tree_get_array(nb_tree_child(in_leaves, i)) ==
               nb_tree_get_array(nb_tree_child(out_leaves, i));
    }
    if (!same) {
        fprintf(stderr,
                "bench_train: %s: the donated parameters and state were not updated in "
                "place\n",
                nb_fn_name(m->jstep));
        exit(1);
    }
    double loss = NAN;
    BENCH_CHECK(ctx, nb_array_get_flat(nb_tree_get_array(nb_tree_child(out, 2)), 0, &loss));
    if (!isfinite(loss)) {
        fprintf(stderr, "bench_train: %s: the first loss is %g\n", nb_fn_name(m->jstep), loss);
        exit(1);
    }
    nb_tree *all[] = {in_leaves, out_leaves, in2, out2, out};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        nb_tree_destroy(all[i]);
    }
    return loss;
}

/* ---- the in-process peer: BLIS ------------------------------------------------------------ */

/* The MLP's 8 GEMMs in BLIS alone, on 1 or 2 threads (sample_gemms, gemm_ud): bench_gemm.h */

/* ---- the table ---------------------------------------------------------------------------- */

typedef enum goal_kind {
    GOAL_NABLA_AT_MOST,            /* nabla's number <= limit */
    GOAL_PEER_OVER_NABLA_AT_LEAST, /* peer / nabla >= limit */
    GOAL_NABLA_OVER_PEER_AT_MOST   /* nabla / peer <= limit */
} goal_kind;

typedef struct table_row {
    const char *workload;
    const char *unit; /* appended to each number */
    int prec;
    double nb[2], peer[2]; /* at 1 and 2 threads */
    bool nabla_over_peer;  /* the ratio column: nabla / peer, else peer / nabla */
    const char *ratio_name;
    goal_kind goal;
    double limit[2]; /* at 1 and 2 threads */
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
    return r->goal == GOAL_PEER_OVER_NABLA_AT_LEAST ? q >= r->limit[t] : q <= r->limit[t];
}

static void print_row(const table_row *r) {
    char c[4][48], ratio[96];
    for (int t = 0; t < 2; t++) {
        cell(c[t], sizeof c[t], r->nb[t], r->unit, r->prec);
        cell(c[2 + t], sizeof c[2 + t], r->peer[t], r->unit, r->prec);
    }
    double q[2];
    for (int t = 0; t < 2; t++) {
        q[t] = r->nabla_over_peer ? r->nb[t] / r->peer[t] : r->peer[t] / r->nb[t];
    }
    if (isnan(q[0]) && isnan(q[1])) {
        snprintf(ratio, sizeof ratio, "n/a");
    } else {
        snprintf(ratio, sizeof ratio, "%.2f / %.2f (%s)", q[0], q[1], r->ratio_name);
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

static nb_ctx *ctx_with_threads(int n) {
    nb_ctx_opts o = nb_ctx_opts_default();
    o.n_threads = n;
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(&o, &ctx) != NB_OK) {
        fprintf(stderr, "bench_train: nb_ctx_create failed\n");
        exit(1);
    }
    return ctx;
}

/* bench_train profile [mlp|tiny [threads [seconds]]]: one train step alone, in a loop */
static int profile(bool tiny, int threads, double seconds) {
    nb_ctx *ctx = ctx_with_threads(threads);
    model m;
    model_init(&m, ctx, tiny);
    double first = model_first_step(&m);
    call_ud cu = {ctx, m.jstep, m.train_args, &m.copts, tiny ? 1000 : 10, 2, NAN, 1};
    double t0 = bench_now_s();
    while (bench_now_s() - t0 < seconds) {
        (void)sample_call(&cu);
    }
    double t = bench_now_s() - t0;
    printf("%s train step, %d thread(s): %lld steps in %.2f s, %.2f µs per step; loss %.4g -> "
           "%.4g\n",
           tiny ? "tiny MLP" : "MLP", threads, (long long)cu.steps, t, t / (double)cu.steps * 1e6,
           first, cu.loss);
    model_free(&m);
    nb_ctx_destroy(ctx);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "profile") == 0) {
        bool tiny = argc > 2 && strcmp(argv[2], "tiny") == 0;
        return profile(tiny, argc > 3 ? atoi(argv[3]) : 1, argc > 4 ? atof(argv[4]) : 10.0);
    }
    char info[256], load[32];
    nb_build_info(info, sizeof info, NULL);
    bench_load_average(load, sizeof load);

    /* ---- 1. the peer's program, first ---- */
    double torch[TK_COUNT];
    for (int i = 0; i < TK_COUNT; i++) {
        torch[i] = NAN;
    }
    char torch_version[64] = "";
    if (access("/usr/bin/python3", X_OK) == 0) {
        bench_peer_read("/usr/bin/python3 benchmarks/peers/torch_train.py 2>/dev/null", TK_COUNT,
                        torch_keys, torch, "torch_version", torch_version, sizeof torch_version);
    }

    nb_ctx *ctx[2] = {ctx_with_threads(1), ctx_with_threads(2)};
    bool ok = true;

    /* ---- 2. MLP: the train step and value_and_grad at 1 and 2 threads, its 8 GEMMs in BLIS */
    double mlp[2], mlp_vg[2], gemm[2], mlp_loss0[2], mlp_loss1[2];
    int64_t mlp_steps[2];
    nb_fn_stats mlp_st[2];
    {
        model m[2];
        call_ud step[2], vg[2];
        gemm_ud gu[2];
        size_t nf = 2 * 1024 * 1024;
        float *A = malloc(nf * sizeof(float)), *B = malloc(nf * sizeof(float)),
              *C = malloc(nf * sizeof(float));
        if (A == NULL || B == NULL || C == NULL) {
            fprintf(stderr, "bench_train: out of memory\n");
            return 1;
        }
        for (size_t i = 0; i < nf; i++) { /* real values, as in the model */
            A[i] = (float)((int)(i % 13) - 6) * 0.05f;
            B[i] = (float)((int)(i % 11) - 5) * 0.05f;
        }
        bench_item items[6];
        for (int t = 0; t < 2; t++) {
            model_init(&m[t], ctx[t], false);
            mlp_loss0[t] = model_first_step(&m[t]);
            step[t] = (call_ud){ctx[t], m[t].jstep, m[t].train_args, &m[t].copts, 10, 2, NAN, 1};
            vg[t] = (call_ud){ctx[t], m[t].vg, m[t].vg_args, NULL, 10, -1, NAN, 0};
            gu[t] = (gemm_ud){A, B, C, t + 1, 10};
            items[t] = (bench_item){.sample = sample_call, .ud = &step[t]};
            items[2 + t] = (bench_item){.sample = sample_call, .ud = &vg[t]};
            items[4 + t] = (bench_item){.sample = sample_gemms, .ud = &gu[t]};
        }
        bench_rounds(items, 6, ROUNDS);
        for (int t = 0; t < 2; t++) {
            mlp[t] = item_median(&items[t]);
            mlp_vg[t] = item_median(&items[2 + t]);
            gemm[t] = item_median(&items[4 + t]);
            mlp_loss1[t] = step[t].loss;
            mlp_steps[t] = step[t].steps;
            BENCH_CHECK(ctx[t], nb_fn_stats_get(m[t].jstep, &mlp_st[t]));
            ok = ok && isfinite(mlp_loss1[t]) && mlp_loss1[t] < mlp_loss0[t];
            model_free(&m[t]);
        }
        free(A);
        free(B);
        free(C);
    }

    /* ---- 3. tiny MLP: the train step and value_and_grad at 1 and 2 threads ---- */
    double tiny[2], tiny_vg[2], tiny_loss0[2], tiny_loss1[2];
    int64_t tiny_steps[2];
    nb_fn_stats tiny_st[2];
    {
        model m[2];
        call_ud step[2], vg[2];
        bench_item items[4];
        for (int t = 0; t < 2; t++) {
            model_init(&m[t], ctx[t], true);
            tiny_loss0[t] = model_first_step(&m[t]);
            step[t] = (call_ud){ctx[t], m[t].jstep, m[t].train_args, &m[t].copts, 1000, 2, NAN, 1};
            vg[t] = (call_ud){ctx[t], m[t].vg, m[t].vg_args, NULL, 1000, -1, NAN, 0};
            items[t] = (bench_item){.sample = sample_call, .ud = &step[t]};
            items[2 + t] = (bench_item){.sample = sample_call, .ud = &vg[t]};
        }
        bench_rounds(items, 4, ROUNDS);
        for (int t = 0; t < 2; t++) {
            tiny[t] = item_median(&items[t]);
            tiny_vg[t] = item_median(&items[2 + t]);
            tiny_loss1[t] = step[t].loss;
            tiny_steps[t] = step[t].steps;
            BENCH_CHECK(ctx[t], nb_fn_stats_get(m[t].jstep, &tiny_st[t]));
            ok = ok && isfinite(tiny_loss1[t]) && tiny_loss1[t] < tiny_loss0[t];
            model_free(&m[t]);
        }
    }

    /* ---- the table ---- */
    char pt[160];
    if (torch_version[0]) {
        snprintf(pt, sizeof pt, "PyTorch %.63s (/usr/bin/python3), torch.optim.Adam(foreach=True)",
                 torch_version);
    } else {
        snprintf(pt, sizeof pt, "PyTorch not run (needs /usr/bin/python3 with python3-torch)");
    }
    const table_row rows[] = {
        {"MLP 784-256-256-10, b=128, f32, Adam train step (one jitted call, params and state "
         "donated), vs PyTorch",
         "µs",
         1,
         {mlp[0], mlp[1]},
         {torch[TK_MLP_T1], torch[TK_MLP_T2]},
         false,
         "PyTorch/nabla",
         GOAL_PEER_OVER_NABLA_AT_LEAST,
         {1.5, 2.0},
         ">= 1.5x faster than PyTorch at 1 thread, >= 2x at 2"},
        {"same, vs its 8 GEMMs in BLIS alone",
         "µs",
         1,
         {mlp[0], mlp[1]},
         {gemm[0], gemm[1]},
         true,
         "nabla/GEMMs",
         GOAL_NABLA_OVER_PEER_AT_MOST,
         {1.1, 1.1},
         "<= 1.1x the GEMMs"},
        {"tiny MLP 2-32-32-1, b=16, f32, Adam train step (MSE), vs PyTorch",
         "µs",
         2,
         {tiny[0], tiny[1]},
         {torch[TK_TINY_T1], torch[TK_TINY_T2]},
         false,
         "PyTorch/nabla",
         GOAL_NABLA_AT_MOST,
         {5.0, 5.0},
         "<= 5 µs"},
    };

    printf("%s\npeers: %s; BLIS in process\n", info, pt);
    printf("machine: %ld CPUs, load average %s at start; medians of %d interleaved samples\n\n",
           sysconf(_SC_NPROCESSORS_ONLN), load, ROUNDS);
    printf("| workload | nabla 1 thread | nabla 2 threads | peer 1 thread | peer 2 threads | ratio "
           "(1 / 2 threads) | goal | met |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        print_row(&rows[i]);
    }
    printf("\nmet: the goal holds at 1 and at 2 threads. ratio: peer / nabla against PyTorch (> 1: "
           "nabla is faster), nabla / peer against BLIS (1.00: no overhead).\n");
    printf("train step workspace (nb_fn_stats): MLP %.2f MiB, tiny %.1f KiB (parameters: MLP "
           "%.2f MiB, Adam state twice that, updated in place)\n",
           (double)mlp_st[0].workspace_bytes / (1 << 20), (double)tiny_st[0].workspace_bytes / 1024,
           (double)(784 * 256 + 256 * 256 + 256 * 10 + 522) * 4 / (1 << 20));
    bool once = true;
    for (int t = 0; t < 2; t++) {
        once = once && mlp_st[t].n_traces == 1 && tiny_st[t].n_traces == 1;
    }
    printf("traces of the train step over the whole run (must be 1): MLP %lld / %lld, tiny %lld "
           "/ %lld (1 / 2 threads; jitted with max_traces = 1)\n",
           (long long)mlp_st[0].n_traces, (long long)mlp_st[1].n_traces,
           (long long)tiny_st[0].n_traces, (long long)tiny_st[1].n_traces);
    printf("value_and_grad alone (no optimizer), 1 / 2 threads: MLP %.1f / %.1f µs (the Adam "
           "update + apply: %.1f / %.1f µs of the step); tiny %.2f / %.2f µs (%.2f / %.2f µs)\n",
           mlp_vg[0], mlp_vg[1], mlp[0] - mlp_vg[0], mlp[1] - mlp_vg[1], tiny_vg[0], tiny_vg[1],
           tiny[0] - tiny_vg[0], tiny[1] - tiny_vg[1]);
    char torch_loss[64] = "PyTorch not run";
    if (!isnan(torch[TK_LOSS_FIRST])) {
        snprintf(torch_loss, sizeof torch_loss, "PyTorch %.4f -> %.4f", torch[TK_LOSS_FIRST],
                 torch[TK_LOSS_LAST]);
    }
    printf("loss over the steps run (Adam, lr %g, fixed batch), 1 / 2 threads: MLP %.4f -> "
           "%.4f / %.4f -> %.4f (%lld / %lld steps; %s), tiny %.3g -> %.3g / %.3g -> %.3g "
           "(%lld / %lld steps)\n",
           learning_rate, mlp_loss0[0], mlp_loss1[0], mlp_loss0[1], mlp_loss1[1],
           (long long)mlp_steps[0], (long long)mlp_steps[1], torch_loss, tiny_loss0[0],
           tiny_loss1[0], tiny_loss0[1], tiny_loss1[1], (long long)tiny_steps[0],
           (long long)tiny_steps[1]);

    nb_ctx_destroy(ctx[1]);
    nb_ctx_destroy(ctx[0]);
    if (!ok) {
        fprintf(stderr, "bench_train: the loss did not decrease over the steps run\n");
        return 1;
    }
    if (!once) {
        fprintf(stderr, "bench_train: the train step was traced more than once\n");
        return 1;
    }
    return 0;
}
