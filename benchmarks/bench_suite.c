/*
 * bench_suite.c -- the cells of `nabla bench` (tools/bench.c) timed next to JAX + Optax
 * doing the same cells (benchmarks/peers/optax_suite.py): for each of the suite's eight
 * full-batch and six stochastic problems (tools/bench_problems.c, compiled in; a stochastic
 * problem's step takes the next minibatch of its bench_stream first, as nabla bench's
 * does), with Adam at one learning rate, 1 thread,
 *
 *   us/step  the steady-state cost of one train step: the median over 11 bursts (each
 *            >= 20 ms of steps) of the mean step time, taken after a whole cell on its
 *            compiled step;
 *   cell s   one whole cell as `nabla bench` runs it: a context, the problem's setup (data
 *            read and split, initialisation), the optimizer, jit, then N steps (the first
 *            traces and compiles), every loss read back -- the median of K cells (each a new
 *            context, so every cell traces and compiles again).
 *
 * One step is bench_step_fn (tools/bench_problems.c), what nabla bench runs: value_and_grad
 * of the problem's loss, nb_optim_update, nb_apply_updates, jitted (max_traces 1) and called with
 * params and the optimizer state donated, a new argument tuple per call, the loss read after every
 * call (bn_run_cell's loop, without its periodic eval() calls). The peer does the same with
 * jax.jit(donate_argnums=(0, 1)), optax.adam and float(loss) after every step; it runs
 * first, pinned to one CPU (the table), then once more unpinned with short cells (its
 * us/step only, shown below the table). The random draws differ between the two (numpy
 * there), so the values differ, not the work.
 *
 *   C limit  the stochastic problems' train step hand-written in plain C
 *            (benchmarks/limits/lim_suite.c: logreg_mb, mlp_mb, cnn_mb, char_gru,
 *            noisy_quadratic, lotka_volterra_mb; BLIS products on one thread, SLEEF as nabla,
 *            lim_lv.c's tsit5 solve with SaveAt ts and its discrete adjoint, Adam as nabla's),
 *            on the minibatches of a stream of its own cell (the batch arrays bench_stream
 *            fills, read in place): each limit step timed alone, the stream advanced outside
 *            the timing (nabla's us/step includes bench_stream_next; the rows are gathered
 *            there, not in nabla's jitted step), in bursts of >= 20 ms alternating with
 *            nabla's, the median of 11; "limit / nabla" and the limit's GFLOP (its products,
 *            2 m n k each) beside nabla's us/step, "-" for the problems without a limit
 *            (the full-batch ones) and for the GFLOP of lotka_volterra_mb (no products).
 *            Before any timing each limit is checked: from nabla's initial parameters, Adam
 *            state and first minibatch, two steps of both (the stream's first two
 *            minibatches), the losses within 1e-5 relative and every new parameter and
 *            element of Adam's mu within 1e-4 of its leaf's largest magnitude after each
 *            (lotka_volterra_mb: also the solver's steps, kept and rejected, equal to
 *            nabla's at each step's parameters); a mismatch prints what differs and exits 1.
 *
 *   bench_suite [--steps N] [--lv-steps M] [--cells K] [--lr LR] [--no-peer] [problem ...]
 *
 * N (default 1000) steps per cell, M (default 1000) for lotka_volterra, K (default 3),
 * LR (default 1e-2). Run from the repository root (data/ and the peer's script).
 * See benchmarks/README.md.
 */
#define BENCH_NAME "bench_suite"
#include "bench_common.h"

#include "bench_problems.h"
#include "limits/limits.h"

#include <nabla/nabla.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { SUITE_SAMPLES = 11, SUITE_MAX_CELLS = 15, SUITE_MAX_PROBLEMS = 16 };

/* ---- one cell ----------------------------------------------------------------------------- */

/* Everything a cell holds, as bn_run_cell. */
typedef struct suite_cell {
    int p;
    nb_ctx *ctx;
    nb_array *key;
    nb_tree *params, *data, *opt, *tmpl, *state, *donate;
    nb_fn *step_jit;
    nb_call_opts call;
    bench_stream stream; /* a stochastic problem's minibatches */
    double loss;
} suite_cell;

/* One step: bn_run_cell's loop body (a new argument tuple, the call with params and state
 * donated, the outputs taken over, the loss read). */
static void suite_step_ex(suite_cell *c, bool next) {
    nb_tree *args = NULL, *res = NULL;
    nb_tree *data = c->data;
    if (c->stream.batch != NULL && next) { /* a stochastic problem: the next minibatch */
        BENCH_CHECK(c->ctx, bench_stream_next(&c->stream));
    }
    if (c->stream.batch != NULL) {
        data = c->stream.batch;
    }
    BENCH_CHECK(c->ctx, nb_tree_tuple(c->ctx, 3, (nb_tree *[]){c->params, c->state, data}, &args));
    static bool dumped = false;
    if (!dumped && getenv("BENCH_DUMP_IR") != NULL) { /* for a profiler: the step's IR */
        size_t need = 0;
        dumped = true;
        (void)nb_fn_format_ir(c->step_jit, args, NB_IR_OPTIMIZED, NULL, 0, &need);
        char *s = malloc(need + 1);
        if (s != NULL &&
            nb_fn_format_ir(c->step_jit, args, NB_IR_OPTIMIZED, s, need + 1, NULL) == NB_OK) {
            fputs(s, stderr);
        }
        free(s);
    }
    nb_status st = nb_fn_call_ex(c->step_jit, args, &c->call, &res);
    nb_tree_destroy(args);
    BENCH_CHECK(c->ctx, st);
    nb_tree_destroy(c->params);
    nb_tree_destroy(c->state);
    c->params = nb_tree_retain((nb_tree *)nb_tree_child(res, 0));
    c->state = nb_tree_retain((nb_tree *)nb_tree_child(res, 1));
    double v = NAN;
    BENCH_CHECK(c->ctx, nb_array_get_flat(nb_tree_get_array(nb_tree_child(res, 2)), 0, &v));
    c->loss = v;
    nb_tree_destroy(res);
}

static void suite_step(suite_cell *c) {
    suite_step_ex(c, true);
}

/* A cell of problem p: the context, setup, optimizer and jitted step (bn_run_cell's setup,
 * seed 0), ready for its first step. */
static void suite_cell_begin(suite_cell *c, int p, double lr) {
    memset(c, 0, sizeof *c);
    c->p = p;
    const bench_problem *pr = &bench_problems[p];
    nb_ctx_opts co = nb_ctx_opts_default();
    co.n_threads = 1;
    if (nb_ctx_create(&co, &c->ctx) != NB_OK) {
        fprintf(stderr, BENCH_NAME ": cannot create a context\n");
        exit(1);
    }
    nb_ctx *ctx = c->ctx;
    BENCH_CHECK(ctx, bench_cell_key(ctx, pr, 0, &c->key));
    BENCH_CHECK(ctx, pr->setup(ctx, "data", c->key, &c->params, &c->data));
    BENCH_CHECK(ctx, nb_optim_adam(ctx, lr, NULL, &c->opt));
    BENCH_CHECK(ctx, nb_grad_template(c->params, NULL, &c->tmpl));
    BENCH_CHECK(ctx, nb_optim_init(c->opt, c->tmpl, &c->state));
    BENCH_CHECK(ctx, bench_step_fn(ctx, pr, c->opt, &c->step_jit));
    BENCH_CHECK(ctx, bench_step_donate(ctx, &c->donate));
    if (pr->batch > 0) {
        BENCH_CHECK(ctx, bench_stream_create(ctx, pr, c->key, c->data, &c->stream));
    }
    c->call = nb_call_opts_default();
    c->call.donate = c->donate;
    c->loss = NAN;
}

static void suite_cell_end(suite_cell *c) {
    bench_stream_destroy(&c->stream);
    nb_fn_destroy(c->step_jit);
    nb_tree *trees[] = {c->params, c->data, c->opt, c->tmpl, c->state, c->donate};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_array_destroy(c->key);
    nb_ctx_destroy(c->ctx);
    memset(c, 0, sizeof *c);
}

/* ---- the C limit ---------------------------------------------------------------------------- */

/* A stochastic problem's hand-written step (benchmarks/limits/lim_suite.c) and a cell of its
 * own, whose stream gives the limit its minibatches: the limit reads the batch arrays that
 * bench_stream_next fills, where they are. */
typedef struct suite_limit {
    suite_cell cell;
    lim_suite *m;
    double loss_c, loss_nabla, loss_rel, err[2]; /* the check's figures */
    int at[2];
    int ode_c[2], ode_nabla[2]; /* lotka_volterra_mb: the solver's steps at each step (else -1) */
    bool ok;
} suite_limit;

/* The array at path in t, f64 (else f32), of n elements (else exit 1). */
static void *suite_leaf_data(const nb_tree *t, const char *path, int64_t n, bool f64) {
    const nb_tree *l = NULL;
    nb_array *a = nb_tree_lookup(t, path, &l) == NB_OK ? nb_tree_get_array(l) : NULL;
    if (a == NULL || nb_array_dtype(a) != (f64 ? NB_DTYPE_F64 : NB_DTYPE_F32) ||
        nb_array_size(a) != n) {
        fprintf(stderr, BENCH_NAME ": the C limit expects an %s leaf of %lld elements at %s\n",
                f64 ? "f64" : "f32", (long long)n, path);
        exit(1);
    }
    return nb_array_data(a);
}

/* The data of a batch array of n elements of dtype dt (n 0: none, NULL). */
static const void *suite_batch_data(const nb_tree *batch, const char *key, nb_dtype dt, int64_t n) {
    if (n == 0) {
        return NULL;
    }
    nb_array *a = nb_tree_get_array(nb_tree_get(batch, key));
    if (a == NULL || nb_array_dtype(a) != dt || nb_array_size(a) != n) {
        fprintf(stderr, BENCH_NAME ": the C limit expects %lld elements in the batch's %s\n",
                (long long)n, key);
        exit(1);
    }
    return nb_array_data(a);
}

static double suite_hyper(suite_cell *c, const char *name) {
    double v = NAN;
    const nb_tree *h = nb_tree_get(c->state, "hyper");
    BENCH_CHECK(c->ctx, nb_array_get_flat(nb_tree_get_array(nb_tree_get(h, name)), 0, &v));
    return v;
}

/* The limit of problem p (false: it has none): a new cell, its first minibatch taken, the
 * limit started from the cell's parameters, Adam's hyperparameters and count, and that
 * batch. */
static bool suite_limit_begin(suite_limit *L, int p, double lr) {
    memset(L, 0, sizeof *L);
    L->m = lim_suite_create(bench_problems[p].name);
    if (L->m == NULL) {
        return false;
    }
    suite_cell *c = &L->cell;
    suite_cell_begin(c, p, lr);
    BENCH_CHECK(c->ctx, bench_stream_next(&c->stream));
    int64_t nx, ny, nextra;
    lim_suite_batch_size(L->m, &nx, &ny, &nextra);
    bool f64 = lim_suite_f64(L->m) != 0;
    nb_dtype xdt = strcmp(bench_problems[p].name, "char_gru") == 0 ? NB_DTYPE_I32
                   : f64                                           ? NB_DTYPE_F64
                                                                   : NB_DTYPE_F32;
    lim_suite_set_batch(L->m, suite_batch_data(c->stream.batch, "x", xdt, nx),
                        suite_batch_data(c->stream.batch, "y", NB_DTYPE_I32, ny),
                        suite_batch_data(c->stream.batch, "H", NB_DTYPE_F32, nextra));
    for (int i = 0; i < lim_suite_n_leaves(L->m); i++) {
        int64_t n = 0;
        const char *path = lim_suite_leaf_path(L->m, i, &n);
        memcpy(lim_suite_leaf(L->m, 0, i), suite_leaf_data(c->params, path, n, f64),
               (size_t)n * (f64 ? sizeof(double) : sizeof(float)));
    }
    double count = NAN;
    BENCH_CHECK(c->ctx,
                nb_array_get_flat(nb_tree_get_array(nb_tree_get(c->state, "count")), 0, &count));
    lim_suite_set_adam(L->m, (int32_t)count, suite_hyper(c, "learning_rate"), suite_hyper(c, "b1"),
                       suite_hyper(c, "b2"), suite_hyper(c, "eps"), suite_hyper(c, "eps_root"));
    return true;
}

/* The largest |c - v| over the leaf's largest |v| (NaN wins); f64 or f32 elements. */
static double suite_leaf_err(const void *c, const void *v, int64_t n, bool f64) {
    double big = 0, d = 0;
    for (int64_t j = 0; j < n; j++) {
        double cj = f64 ? ((const double *)c)[j] : (double)((const float *)c)[j];
        double vj = f64 ? ((const double *)v)[j] : (double)((const float *)v)[j];
        double a = fabs(vj), e = fabs(cj - vj);
        big = a > big ? a : big;
        d = e > d || e != e ? e : d;
    }
    return d / (big > 0 ? big : 1.0);
}

/* Two steps of nabla's and of the limit on the same minibatches (the first and the second of
 * the stream) from the same start, compared after each (the first from the initial
 * parameters -- zeros for logreg_mb, where the forward's product does not show -- the second
 * from the updated ones, Adam's count 2): the losses within 1e-5 relative; each new parameter
 * and each leaf of Adam's mu (after a first step (1 - b1) times the gradient) within 1e-4 of
 * its leaf's largest magnitude; lotka_volterra_mb: also the solver's steps (kept and rejected)
 * at the step's parameters equal to nabla's (the same accepted steps). The worst of the two
 * steps is kept. */
static double suite_lv_steps(suite_cell *c);
static bool suite_limit_check(suite_limit *L) {
    suite_cell *c = &L->cell;
    bool f64 = lim_suite_f64(L->m) != 0;
    bool ode = strcmp(bench_problems[c->p].name, "lotka_volterra_mb") == 0;
    bool steps_ok = true;
    L->loss_rel = L->err[0] = L->err[1] = 0;
    for (int k = 0; k < 2; k++) {
        if (k > 0) { /* the next minibatch, into the arrays both read */
            BENCH_CHECK(c->ctx, bench_stream_next(&c->stream));
        }
        /* nabla's solver steps at this step's parameters (before they are donated) */
        L->ode_nabla[k] = ode ? (int)suite_lv_steps(c) : -1;
        suite_step_ex(c, false); /* nabla's step on the batch the limit holds */
        double ln = c->loss, lc = lim_suite_step(L->m);
        L->ode_c[k] = lim_suite_ode_steps(L->m);
        steps_ok = steps_ok && L->ode_c[k] == L->ode_nabla[k];
        double rel = fabs(lc - ln) / fmax(fabs(ln), 1e-30);
        if (k == 0 || rel > L->loss_rel || rel != rel) {
            L->loss_nabla = ln, L->loss_c = lc, L->loss_rel = rel;
        }
        for (int w = 0; w < 2; w++) { /* params, mu */
            const nb_tree *t = w == 0 ? c->params : nb_tree_get(c->state, "mu");
            for (int i = 0; i < lim_suite_n_leaves(L->m); i++) {
                int64_t n = 0;
                const char *path = lim_suite_leaf_path(L->m, i, &n);
                double e = suite_leaf_err(lim_suite_leaf(L->m, w, i),
                                          suite_leaf_data(t, path, n, f64), n, f64);
                if (e > L->err[w] || e != e) {
                    L->err[w] = e;
                    L->at[w] = i;
                }
            }
        }
    }
    L->ok = L->loss_rel <= 1e-5 && L->err[0] <= 1e-4 && L->err[1] <= 1e-4 && steps_ok;
    return L->ok;
}

static void suite_limit_print_check(const suite_limit *L, const char *name) {
    char steps[96] = "";
    if (L->ode_nabla[0] >= 0) {
        snprintf(steps, sizeof steps, "; solver steps C %d, %d / nabla %d, %d (equal)", L->ode_c[0],
                 L->ode_c[1], L->ode_nabla[0], L->ode_nabla[1]);
    }
    printf("- %s (worst of 2 steps): loss C %.9g, nabla %.9g, rel. diff %.2e (<= 1e-5); max |diff| "
           "/ max |leaf|: new params %.2e at %s, mu %.2e at %s (<= 1e-4)%s: %s\n",
           name, L->loss_c, L->loss_nabla, L->loss_rel, L->err[0],
           lim_suite_leaf_path(L->m, L->at[0], NULL), L->err[1],
           lim_suite_leaf_path(L->m, L->at[1], NULL), steps, L->ok ? "ok" : "FAILED");
}

/* One limit step on the stream's next minibatch; returns the step's time alone (s). */
static double suite_limit_step(suite_limit *L) {
    BENCH_CHECK(L->cell.ctx, bench_stream_next(&L->cell.stream));
    double t0 = bench_now_s();
    (void)lim_suite_step(L->m);
    return bench_now_s() - t0;
}

static void suite_limit_end(suite_limit *L) {
    if (L->m != NULL) {
        lim_suite_destroy(L->m);
        suite_cell_end(&L->cell);
    }
    memset(L, 0, sizeof *L);
}

/* ---- the ODE's step count ----------------------------------------------------------------- */

/* bench_problems.c's Lotka-Volterra field, to count the fit's solver steps (its solve is
 * file-static there): args = (t, dict(x, y), dict(a, b, c, d)). */
static nb_status suite_lv_term(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[1].x"), *y = nb_get(tr, args, "[1].y");
    nb_var *a = nb_get(tr, args, "[2].a"), *b = nb_get(tr, args, "[2].b");
    nb_var *c = nb_get(tr, args, "[2].c"), *d = nb_get(tr, args, "[2].d");
    nb_var *xy = nb_mul(x, y);
    nb_var *dx = nb_sub(nb_mul(a, x), nb_mul(b, xy));
    nb_var *dy = nb_sub(nb_mul(d, xy), nb_mul(c, y));
    return nb_tree_dict(nb_trace_ctx(tr), 2, (const char *[]){"x", "y"},
                        (nb_tree *[]){nb_leaf(dx), nb_leaf(dy)}, out);
}

/* (params) -> the number of steps of the fit's solve (tsit5, PID 1e-6, t 0 .. 10, SaveAt
 * 0.5 .. 10, max_steps 4096: bench_problems.c's bp_lv_solve for the loss). */
static nb_status suite_lv_steps_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                     nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    double ts[20];
    for (int i = 0; i < 20; i++) {
        ts[i] = 10.0 * (double)(i + 1) / 20.0;
    }
    nb_fn *term = NULL;
    nb_tree *y0 = NULL;
    nb_status st = nb_fn_create(ctx, "lotka_volterra", suite_lv_term, NULL, &term);
    if (st == NB_OK) {
        nb_var *one = nb_scalar_typed(tr, NB_DTYPE_F64, 1.0);
        st = nb_tree_dict(ctx, 2, (const char *[]){"x", "y"},
                          (nb_tree *[]){nb_leaf(one), nb_leaf(one)}, &y0);
    }
    if (st == NB_OK) {
        nb_ode_opts o = nb_ode_opts_default();
        o.solver = NB_ODE_TSIT5;
        o.t0 = 0.0;
        o.t1 = 10.0;
        o.dt0 = 0.0;
        o.controller = nb_ode_pid(1e-6, 1e-6);
        o.saveat.kind = NB_SAVEAT_TS;
        o.saveat.ts = ts;
        o.saveat.n_ts = 20;
        o.max_steps = 4096;
        o.throw_on_failure = false;
        const nb_tree *sol = nb_diffeqsolve(tr, term, y0, nb_tree_child(args, 0), &o);
        st = sol != NULL ? nb_return(nb_get(tr, sol, "stats.num_steps"), out) : nb_trace_status(tr);
    }
    nb_tree_destroy(y0);
    nb_fn_destroy(term);
    return st;
}

/* The fit's solver steps at the cell's current parameters (inside the box, as the
 * optimizer leaves them here). */
static double suite_lv_steps(suite_cell *c) {
    nb_fn *f = NULL;
    nb_tree *args = NULL, *res = NULL;
    double v = NAN;
    BENCH_CHECK(c->ctx, nb_fn_create(c->ctx, "lv_steps", suite_lv_steps_body, NULL, &f));
    BENCH_CHECK(c->ctx, nb_tree_tuple(c->ctx, 1, &c->params, &args));
    BENCH_CHECK(c->ctx, nb_fn_call(f, args, &res));
    BENCH_CHECK(c->ctx, nb_array_get_flat(nb_tree_get_array(res), 0, &v));
    nb_tree_destroy(res);
    nb_tree_destroy(args);
    nb_fn_destroy(f);
    return v;
}

/* ---- measuring one problem ---------------------------------------------------------------- */

typedef struct suite_result {
    double step_us, cell_s, setup_ms, first_ms, loss, ode_steps;
    double lim_us, lim_gflop; /* the C limit's (NaN: none) */
} suite_result;

/* L: the problem's C limit (NULL: none), timed in bursts interleaved with nabla's. */
static void suite_measure(int p, double lr, int64_t steps, int cells, suite_limit *L,
                          suite_result *r) {
    double cell_s[SUITE_MAX_CELLS], setup_ms[SUITE_MAX_CELLS], first_ms[SUITE_MAX_CELLS];
    suite_cell c;
    for (int k = 0; k < cells; k++) {
        double t0 = bench_now_s();
        suite_cell_begin(&c, p, lr);
        double t1 = bench_now_s();
        suite_step(&c); /* traces and compiles */
        double t2 = bench_now_s();
        for (int64_t i = 1; i < steps; i++) {
            suite_step(&c);
        }
        cell_s[k] = bench_now_s() - t0;
        setup_ms[k] = (t1 - t0) * 1e3;
        first_ms[k] = (t2 - t1) * 1e3;
        if (k + 1 < cells) {
            suite_cell_end(&c);
        }
    }
    r->loss = c.loss;
    r->cell_s = bench_median(cell_s, cells);
    r->setup_ms = bench_median(setup_ms, cells);
    r->first_ms = bench_median(first_ms, cells);
    /* per step, on the last cell's compiled step: bursts of >= 20 ms */
    double t0 = bench_now_s();
    suite_step(&c);
    double once = bench_now_s() - t0;
    int64_t inner = (int64_t)(0.02 / (once > 1e-9 ? once : 1e-9));
    inner = inner < 1 ? 1 : inner;
    double s[SUITE_SAMPLES], sl[SUITE_SAMPLES];
    int64_t lim_inner = 1;
    if (L != NULL) { /* its bursts: >= 20 ms of steps too */
        double once_l = suite_limit_step(L);
        lim_inner = (int64_t)(0.02 / (once_l > 1e-9 ? once_l : 1e-9));
        lim_inner = lim_inner < 1 ? 1 : lim_inner;
    }
    for (int k = 0; k < SUITE_SAMPLES; k++) {
        t0 = bench_now_s();
        for (int64_t i = 0; i < inner; i++) {
            suite_step(&c);
        }
        s[k] = (bench_now_s() - t0) / (double)inner * 1e6;
        if (L != NULL) {
            double sum = 0;
            for (int64_t i = 0; i < lim_inner; i++) {
                sum += suite_limit_step(L);
            }
            sl[k] = sum / (double)lim_inner * 1e6;
        }
    }
    r->step_us = bench_median(s, SUITE_SAMPLES);
    r->lim_us = L != NULL ? bench_median(sl, SUITE_SAMPLES) : NAN;
    r->lim_gflop = L != NULL ? lim_suite_flops(L->m) / 1e9 : NAN;
    nb_fn_stats fs;
    BENCH_CHECK(c.ctx, nb_fn_stats_get(c.step_jit, &fs));
    if (fs.n_traces != 1) {
        fprintf(stderr, BENCH_NAME ": %s: the step was traced %lld times\n", bench_problems[p].name,
                (long long)fs.n_traces);
        exit(1);
    }
    r->ode_steps = strcmp(bench_problems[p].name, "lotka_volterra") == 0 ? suite_lv_steps(&c) : NAN;
    suite_cell_end(&c);
}

/* ---- the peer ------------------------------------------------------------------------------- */

enum { PK_CELL, PK_STEP, PK_SETUP, PK_FIRST, PK_LOSS, PK_ODE, PK_COUNT };
/* keys printed by benchmarks/peers/optax_suite.py: <problem>_<suffix> */
static const char *const peer_suffix[PK_COUNT] = {"cell_s",   "step_us", "setup_ms",
                                                  "first_ms", "loss",    "ode_steps"};

/* ---- the table ------------------------------------------------------------------------------ */

static void suite_fmt(char *buf, size_t cap, double v, const char *fmt) {
    if (isnan(v)) {
        snprintf(buf, cap, "not run");
    } else {
        snprintf(buf, cap, fmt, v);
    }
}

static void suite_usage(void) {
    fprintf(stderr, "usage: bench_suite [--steps N] [--lv-steps M] [--cells K] [--lr LR] "
                    "[--no-peer] [problem ...]\n");
}

int main(int argc, char **argv) {
    int64_t steps = 1000, lv_steps = 1000;
    int cells = 3;
    double lr = 1e-2;
    bool peer = true;
    int chosen[SUITE_MAX_PROBLEMS], n_chosen = 0;
    for (int i = 1; i < argc; i++) {
        bool has_value = i + 1 < argc;
        if (strcmp(argv[i], "--steps") == 0 && has_value) {
            steps = atoll(argv[++i]);
        } else if (strcmp(argv[i], "--lv-steps") == 0 && has_value) {
            lv_steps = atoll(argv[++i]);
        } else if (strcmp(argv[i], "--cells") == 0 && has_value) {
            cells = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--lr") == 0 && has_value) {
            lr = atof(argv[++i]);
        } else if (strcmp(argv[i], "--no-peer") == 0) {
            peer = false;
        } else if (bench_problem_find(argv[i]) != NULL && n_chosen < SUITE_MAX_PROBLEMS) {
            chosen[n_chosen++] = (int)(bench_problem_find(argv[i]) - bench_problems);
        } else {
            suite_usage();
            return 2;
        }
    }
    if (steps < 1 || lv_steps < 1 || cells < 1 || cells > SUITE_MAX_CELLS || !(lr > 0)) {
        suite_usage();
        return 2;
    }
    if (n_chosen == 0) {
        for (int p = 0; p < bench_n_problems && p < SUITE_MAX_PROBLEMS; p++) {
            chosen[n_chosen++] = p;
        }
    }
    char info[256], load[32];
    nb_build_info(info, sizeof info, NULL);
    bench_load_average(load, sizeof load);

    /* ---- 1. the peer's program, first: pinned to one CPU (the table), then unpinned (only
     *         its us/step: short cells) ---- */
    enum { KEYS = SUITE_MAX_PROBLEMS * PK_COUNT };
    char key_text[KEYS][64];
    const char *keys[KEYS];
    double peer_vals[KEYS], unpinned[KEYS];
    for (int j = 0; j < n_chosen; j++) {
        for (int k = 0; k < PK_COUNT; k++) {
            snprintf(key_text[j * PK_COUNT + k], sizeof key_text[0], "%s_%s",
                     bench_problems[chosen[j]].name, peer_suffix[k]);
            keys[j * PK_COUNT + k] = key_text[j * PK_COUNT + k];
            peer_vals[j * PK_COUNT + k] = NAN;
            unpinned[j * PK_COUNT + k] = NAN;
        }
    }
    char jax[64] = "", peer_note[160] = "not run (--no-peer)";
    if (peer && access("build/peers/bin/python", X_OK) != 0) {
        snprintf(peer_note, sizeof peer_note,
                 "not run: no build/peers/bin/python (see benchmarks/README.md)");
    } else if (peer) {
        char names[512] = "";
        size_t len = 0;
        for (int j = 0; j < n_chosen && len < sizeof names; j++) {
            len += (size_t)snprintf(names + len, sizeof names - len, " %s",
                                    bench_problems[chosen[j]].name);
        }
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "NB_BENCH_PIN=1 build/peers/bin/python benchmarks/peers/optax_suite.py --steps "
                 "%lld --lv-steps %lld --cells %d --lr %.17g%s 2>/dev/null",
                 (long long)steps, (long long)lv_steps, cells, lr, names);
        bench_peer_read(cmd, n_chosen * PK_COUNT, keys, peer_vals, "jax_version", jax, sizeof jax);
        snprintf(cmd, sizeof cmd,
                 "NB_BENCH_PIN=0 build/peers/bin/python benchmarks/peers/optax_suite.py --steps "
                 "20 --lv-steps 20 --cells 1 --lr %.17g%s 2>/dev/null",
                 lr, names);
        char ignored[64];
        bench_peer_read(cmd, n_chosen * PK_COUNT, keys, unpinned, "jax_version", ignored,
                        sizeof ignored);
        snprintf(peer_note, sizeof peer_note, "%s",
                 jax[0] != '\0' ? "" : "not run: optax_suite.py failed (run it alone to see why)");
    }

    /* ---- 2. nabla, and the C limits: each checked against nabla's first step, then timed in
     *         bursts interleaved with nabla's ---- */
    suite_result res[SUITE_MAX_PROBLEMS];
    suite_limit lims[SUITE_MAX_PROBLEMS];
    bool has_lim[SUITE_MAX_PROBLEMS], checks_ok = true;
    for (int j = 0; j < n_chosen; j++) {
        int p = chosen[j];
        has_lim[j] = suite_limit_begin(&lims[j], p, lr);
        if (has_lim[j] && !suite_limit_check(&lims[j])) {
            checks_ok = false;
        }
    }
    if (!checks_ok) { /* what differs, and no timing */
        for (int j = 0; j < n_chosen; j++) {
            if (has_lim[j]) {
                suite_limit_print_check(&lims[j], bench_problems[chosen[j]].name);
            }
        }
        fprintf(stderr, BENCH_NAME ": the C limits' check FAILED (see above)\n");
        return 1;
    }
    for (int j = 0; j < n_chosen; j++) {
        int p = chosen[j];
        bool lv = strcmp(bench_problems[p].name, "lotka_volterra") == 0;
        suite_measure(p, lr, lv ? lv_steps : steps, cells, has_lim[j] ? &lims[j] : NULL, &res[j]);
    }

    /* ---- 3. the tables ---- */
    printf("## bench_suite: `nabla bench` cells (Adam, lr %g), nabla vs JAX + Optax\n\n", lr);
    printf("%s\n", info);
    printf("peer: %s%s\n", jax[0] != '\0' ? "JAX " : "", jax[0] != '\0' ? jax : peer_note);
    printf("machine: %ld CPUs, load average %s at start; 1 thread on both sides (the peer "
           "pinned to one CPU); us/step: "
           "median of %d bursts (>= 20 ms each); cell: median of %d cells of %lld steps "
           "(lotka_volterra: %lld) incl. setup, trace and compile\n\n",
           sysconf(_SC_NPROCESSORS_ONLN), load, SUITE_SAMPLES, cells, (long long)steps,
           (long long)lv_steps);
    printf("| problem | nabla us/step | C limit us/step | limit / nabla | limit GFLOP | Optax "
           "us/step | ratio (Optax/nabla) | nabla cell s | Optax cell s | ratio |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int j = 0; j < n_chosen; j++) {
        const suite_result *r = &res[j];
        const double *pv = &peer_vals[j * PK_COUNT];
        char a[32], b[32], cr[32], d[32], e[32], f[32], la[32], lr_[32], lg[32];
        if (has_lim[j]) {
            suite_fmt(la, sizeof la, r->lim_us, "%.2f");
            suite_fmt(lr_, sizeof lr_, r->lim_us / r->step_us, "%.2f");
            suite_fmt(lg, sizeof lg, r->lim_gflop, "%.2e");
            if (r->lim_gflop == 0) { /* lotka_volterra_mb: no products */
                snprintf(lg, sizeof lg, "-");
            }
        } else {
            snprintf(la, sizeof la, "-");
            snprintf(lr_, sizeof lr_, "-");
            snprintf(lg, sizeof lg, "-");
        }
        suite_fmt(a, sizeof a, r->step_us, "%.2f");
        suite_fmt(b, sizeof b, pv[PK_STEP], "%.2f");
        suite_fmt(cr, sizeof cr, pv[PK_STEP] / r->step_us, "%.2f");
        suite_fmt(d, sizeof d, r->cell_s, "%.3f");
        suite_fmt(e, sizeof e, pv[PK_CELL], "%.3f");
        suite_fmt(f, sizeof f, pv[PK_CELL] / r->cell_s, "%.2f");
        printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
               bench_problems[chosen[j]].name, a, la, lr_, lg, b, cr, d, e, f);
    }
    printf("\nC limit: the same train step hand-written in plain C (benchmarks/limits/lim_suite.c: "
           "BLIS products on one thread, SLEEF where nabla calls it, limits/lim_lv.c's solve and "
           "adjoint for lotka_volterra_mb, Adam as nabla's), on the "
           "minibatches nabla's stream gives (each step timed alone: the batcher not included, "
           "where nabla's us/step includes it); its bursts alternate with nabla's. GFLOP: the "
           "limit's products (2 m n k each). '-': no limit (the full-batch problems), or no "
           "products (lotka_volterra_mb's GFLOP). Checked "
           "before the timing (two steps from nabla's start on its first two minibatches):\n");
    for (int j = 0; j < n_chosen; j++) {
        if (has_lim[j]) {
            suite_limit_print_check(&lims[j], bench_problems[chosen[j]].name);
        }
    }
    printf("\nThe peer runs pinned to one CPU (sched_setaffinity before JAX starts its "
           "threads); the column 'not pinned' is its us/step in a second, unpinned run, where "
           "each step's hand-off between the Python thread and XLA's executor thread may "
           "cross cores. The cell, split (medians): setup = context (nabla), data, init, "
           "optimizer, jit objects; first step = trace + compile + one run. Final loss after "
           "the cell's steps (different random starts, splits and noise on the two sides, so "
           "close, not equal).\n\n");
    printf("| problem | nabla setup ms | Optax setup ms | nabla first step ms | Optax first step "
           "ms | Optax us/step, not pinned | loss nabla | loss Optax |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int j = 0; j < n_chosen; j++) {
        const suite_result *r = &res[j];
        const double *pv = &peer_vals[j * PK_COUNT];
        char ps[32], pf[32], pu[32], pl[32];
        suite_fmt(ps, sizeof ps, pv[PK_SETUP], "%.2f");
        suite_fmt(pf, sizeof pf, pv[PK_FIRST], "%.2f");
        suite_fmt(pu, sizeof pu, unpinned[j * PK_COUNT + PK_STEP], "%.2f");
        suite_fmt(pl, sizeof pl, pv[PK_LOSS], "%.4g");
        printf("| %s | %.2f | %s | %.2f | %s | %s | %.4g | %s |\n", bench_problems[chosen[j]].name,
               r->setup_ms, ps, r->first_ms, pf, pu, r->loss, pl);
    }
    for (int j = 0; j < n_chosen; j++) {
        if (!isnan(res[j].ode_steps)) {
            double peer_steps = peer_vals[j * PK_COUNT + PK_ODE];
            char ps[48];
            snprintf(ps, sizeof ps, isnan(peer_steps) ? "? (Diffrax not run)" : "%.0f in Diffrax",
                     peer_steps);
            printf("\nlotka_volterra: the fit's solve takes %.0f tsit5 steps in nabla and %s "
                   "at the final parameters (same tolerances and controller; nabla picks dt0 by "
                   "Hairer's rule, Diffrax 0.7.2 starts at 0.01).\n",
                   res[j].ode_steps, ps);
        }
    }
    printf("\nSame work per step on both sides: the same losses, sizes, dtypes (f64: "
           "rosenbrock*, quadratic, beale, lotka_volterra; f32: logreg, softmax, mlp) and "
           "data files; Adam with Optax's defaults; params and state donated; the loss read "
           "after every step. What differs: the random draws (numpy on the peer's side) and "
           "therefore the values; nabla's cell excludes bench.c's periodic eval() calls "
           "(the peer has none either).\n");
    for (int j = 0; j < n_chosen; j++) {
        if (has_lim[j]) {
            suite_limit_end(&lims[j]);
        }
    }
    return 0;
}
