/*
 * bench_loops.c -- one row: the cost of reverse mode through a long loop, and what
 * checkpointing trades for memory. A recurrence of 10^4 steps over a state of 256 f64,
 *
 *     x_{t+1} = tanh(W x_t + b),   W f64[256,256] and b closed over by the body,
 *     loss = sum(x_T),
 *
 * written as an nb_fori_loop, differentiated with respect to (W, b, x_0). One row per loop
 * kind: bounded (a tape of every step), and checkpointed with c = 10, 30, 100, 1000 slots
 * (a fori loop's trip count is known, so the executor runs revolve, the offline schedule of
 * src/loops/checkpoint.h). Each row: time(grad) / time(forward) (forward = the jitted loss
 * alone, grad = the jitted nb_grad of it), the peak memory of the stored states, the steps
 * recomputed (nb_loop_last_stats) and, beside them, what the closed forms predict: the
 * revolve optimum t(n, c), the online schedule (nbl_online_simulate: the same loop as a while
 * loop) and the lower bound for any schedule reversing from x_n with c slots. The gradients of
 * every kind must be bit-identical to the bounded one (nb_tree_equal), else the program exits with
 * status 1.
 *
 * As bench_speed: 1 thread, every call timed in interleaved rounds (the order rotated each
 * round), every number a median; slow rows get fewer samples. See benchmarks/README.md.
 */
#include "loops/checkpoint.h"

#define BENCH_NAME "bench_loops"
#include "bench_common.h"

#include <nabla/nabla.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
    N = 256,         /* the state: f64[N] */
    STEPS = 10000,   /* loop steps */
    KINDS = 5,       /* bounded, then checkpointed with each c below */
    MAX_ROUNDS = 11, /* interleaved rounds (fast rows sample in every one) */
};

static const int64_t checkpoints[KINDS] = {0, 10, 30, 100, 1000}; /* 0: bounded */

/* ---- the recurrence ------------------------------------------------------------------------ */

/* self = {w, b} (vars of the enclosing trace, closed over); args = (i, x) -> tanh(w x + b) */
static nb_status step_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *x = nb_get(tr, args, "[1]");
    nb_var *y = nb_tanh(nb_add(nb_matmul(nb_get(tr, self, "w"), x), nb_get(tr, self, "b")));
    return nb_return(y, out);
}

/* self = {steps, checkpoints (0: bounded)}; args = ({w, b, x0}) -> sum(x_steps) */
static nb_status loss_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t steps = 0, ck = 0;
    nb_tree_get_int(nb_tree_get(self, "steps"), &steps);
    nb_tree_get_int(nb_tree_get(self, "checkpoints"), &ck);
    const nb_tree *p = nb_tree_child(args, 0);
    nb_tree *bself = NULL;
    nb_fn *body = NULL;
    nb_status st = nb_tree_dict(
        nb_trace_ctx(tr), 2, (const char *[]){"w", "b"},
        (nb_tree *[]){(nb_tree *)nb_tree_get(p, "w"), (nb_tree *)nb_tree_get(p, "b")}, &bself);
    if (st == NB_OK) {
        st = nb_fn_create(nb_trace_ctx(tr), "step", step_body, bself, &body);
    }
    nb_tree_destroy(bself);
    if (st != NB_OK) {
        return st;
    }
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = ck > 0 ? NB_LOOP_CHECKPOINTED : NB_LOOP_BOUNDED;
    o.max_steps = steps;
    o.checkpoints = ck;
    const nb_tree *r = nb_fori_loop(tr, 0, steps, body, nb_tree_get(p, "x0"), &o);
    nb_fn_destroy(body);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    return nb_return(nb_sum(nb_var_of(tr, r), NULL, 0, false), out);
}

static nb_tree *leaf_of(nb_ctx *ctx, nb_array *a) {
    nb_tree *t = NULL;
    BENCH_CHECK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

static nb_tree *vec_f64(nb_ctx *ctx, int64_t n, const double *v) {
    nb_array *a = NULL;
    BENCH_CHECK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 1, &n, v, &a));
    return leaf_of(ctx, a);
}

/* ({w, b, x0}): w entries 1.2 sin(0.731 i + 0.3) / sqrt(N) (spectral radius near 1: the
 * recurrence neither dies out nor saturates), b 0.05 cos(0.37 i), x0 0.3 sin(1.7 i) -- as
 * tests/loops/test_loops.c's 1000-step rows. */
static nb_tree *make_args(nb_ctx *ctx) {
    static double w[N * N], b[N], x0[N];
    for (int i = 0; i < N * N; i++) {
        w[i] = 1.2 * sin(0.731 * i + 0.3) / sqrt((double)N);
    }
    for (int i = 0; i < N; i++) {
        b[i] = 0.05 * cos(0.37 * i);
        x0[i] = 0.3 * sin(1.7 * i);
    }
    nb_array *wa = NULL;
    BENCH_CHECK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){N, N}, w, &wa));
    nb_tree *lw = leaf_of(ctx, wa), *lb = vec_f64(ctx, N, b), *lx = vec_f64(ctx, N, x0);
    nb_tree *p = NULL, *args = NULL;
    BENCH_CHECK(
        ctx, nb_tree_dict(ctx, 3, (const char *[]){"w", "b", "x0"}, (nb_tree *[]){lw, lb, lx}, &p));
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 1, (nb_tree *[]){p}, &args));
    nb_tree_destroy(lw);
    nb_tree_destroy(lb);
    nb_tree_destroy(lx);
    nb_tree_destroy(p);
    return args;
}

/* ---- one row: a loop kind, its jitted loss and jitted grad ---------------------------------- */

typedef struct row {
    int64_t c; /* 0: bounded */
    nb_fn *loss, *jloss, *grad, *jgrad;
    nb_tree *g;             /* the gradient (first call) */
    double value;           /* the loss */
    nb_loop_stats ls;       /* after the first grad call (checkpointed rows) */
    size_t ws_fwd, ws_grad; /* nb_fn_stats workspace of the two executables */
    double first_grad_s;    /* the first grad call, trace + compile included */
    double fwd[MAX_ROUNDS], grd[MAX_ROUNDS];
    int n_fwd, n_grd, every; /* samples taken; sampled in rounds r with r % every == 0 */
} row;

static void row_init(row *r, nb_ctx *ctx, const nb_tree *args, int64_t c) {
    memset(r, 0, sizeof *r);
    r->c = c;
    nb_tree *sl = NULL, *cl = NULL, *self = NULL;
    BENCH_CHECK(ctx, nb_tree_int(ctx, STEPS, &sl));
    BENCH_CHECK(ctx, nb_tree_int(ctx, c, &cl));
    BENCH_CHECK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"steps", "checkpoints"},
                                  (nb_tree *[]){sl, cl}, &self));
    BENCH_CHECK(ctx, nb_fn_create(ctx, c > 0 ? "loss_checkpointed" : "loss_bounded", loss_body,
                                  self, &r->loss));
    nb_tree_destroy(self);
    nb_tree_destroy(sl);
    nb_tree_destroy(cl);
    nb_jit_opts jo = nb_jit_opts_default();
    jo.max_traces = 1;
    BENCH_CHECK(ctx, nb_jit(r->loss, &jo, &r->jloss));
    BENCH_CHECK(ctx, nb_grad(r->loss, NULL, &r->grad));
    BENCH_CHECK(ctx, nb_jit(r->grad, &jo, &r->jgrad));

    nb_tree *out = NULL;
    BENCH_CHECK(ctx, nb_fn_call(r->jloss, args, &out));
    BENCH_CHECK(ctx, nb_array_get_flat(nb_tree_get_array(out), 0, &r->value));
    nb_tree_destroy(out);
    double t0 = bench_now_s();
    BENCH_CHECK(ctx, nb_fn_call(r->jgrad, args, &r->g));
    r->first_grad_s = bench_now_s() - t0;
    BENCH_CHECK(ctx, nb_loop_last_stats(&r->ls));
    nb_fn_stats fs;
    BENCH_CHECK(ctx, nb_fn_stats_get(r->jloss, &fs));
    r->ws_fwd = fs.workspace_bytes;
    BENCH_CHECK(ctx, nb_fn_stats_get(r->jgrad, &fs));
    r->ws_grad = fs.workspace_bytes;
}

static void row_free(row *r) {
    nb_tree_destroy(r->g);
    nb_fn_destroy(r->jgrad);
    nb_fn_destroy(r->grad);
    nb_fn_destroy(r->jloss);
    nb_fn_destroy(r->loss);
}

/* one call of f on args: seconds */
static double time_call(nb_ctx *ctx, nb_fn *f, const nb_tree *args) {
    nb_tree *out = NULL;
    double t0 = bench_now_s();
    BENCH_CHECK(ctx, nb_fn_call(f, args, &out));
    double t = bench_now_s() - t0;
    nb_tree_destroy(out);
    return t;
}

static void mem_cell(char *buf, size_t cap, size_t bytes) {
    if (bytes >= (size_t)1 << 20) {
        snprintf(buf, cap, "%.2f MiB", (double)bytes / (1 << 20));
    } else {
        snprintf(buf, cap, "%.1f KiB", (double)bytes / 1024);
    }
}

int main(void) {
    char info[256], load[32];
    nb_build_info(info, sizeof info, NULL);
    bench_load_average(load, sizeof load);
    double t_start = bench_now_s();

    nb_ctx_opts co = nb_ctx_opts_default();
    co.n_threads = 1;
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(&co, &ctx) != NB_OK) {
        fprintf(stderr, "bench_loops: nb_ctx_create failed\n");
        return 1;
    }
    nb_tree *args = make_args(ctx);

    /* ---- the first calls: trace, compile, the gradients and the schedules' counters ---- */
    static row rows[KINDS];
    for (int k = 0; k < KINDS; k++) {
        row_init(&rows[k], ctx, args, checkpoints[k]);
    }
    bool identical = true, same_loss = true;
    for (int k = 1; k < KINDS; k++) {
        bool eq = false;
        BENCH_CHECK(ctx, nb_tree_equal(rows[k].g, rows[0].g, &eq));
        identical = identical && eq;
        same_loss = same_loss && rows[k].value == rows[0].value;
    }

    /* ---- interleaved rounds. A row samples in round r when r % every == 0 (its forward too,
     * so both halves of its ratio see the same rounds): every = 1 when its first grad call
     * took under 1 s, else enough to keep the row near 25 s; a row over 1 s gets no separate
     * warm-up call (its first call warmed it). */
    for (int k = 0; k < KINDS; k++) {
        double t = rows[k].first_grad_s;
        int want = t < 1.0 ? MAX_ROUNDS : (int)(25.0 / t);
        want = want < 3 ? 3 : want > MAX_ROUNDS ? MAX_ROUNDS : want;
        rows[k].every = (MAX_ROUNDS + want - 1) / want;
        if (t < 1.0) {
            (void)time_call(ctx, rows[k].jloss, args);
            (void)time_call(ctx, rows[k].jgrad, args);
        }
    }
    for (int rd = 0; rd < MAX_ROUNDS; rd++) {
        for (int j = 0; j < 2 * KINDS; j++) {
            int q = (j + rd) % (2 * KINDS);
            row *r = &rows[q / 2];
            if (rd % r->every != 0) {
                continue;
            }
            if (q % 2 == 0) {
                r->fwd[r->n_fwd++] = time_call(ctx, r->jloss, args);
            } else {
                r->grd[r->n_grd++] = time_call(ctx, r->jgrad, args);
            }
        }
    }

    /* ---- the table ---- */
    printf("%s\n", info);
    printf("machine: %ld CPUs, load average %s at start; 1 thread; medians of interleaved "
           "samples\n\n",
           sysconf(_SC_NPROCESSORS_ONLN), load);
    printf("x_{t+1} = tanh(W x_t + b), %d steps, state f64[%d] (%d bytes), W f64[%d,%d] closed "
           "over by the body; loss = sum(x_T); grad w.r.t. (W, b, x_0)\n\n",
           STEPS, N, N * 8, N, N);
    printf("| loop kind | forward | grad | grad / forward | stored states, peak | schedule: "
           "sweep + recomputed steps | measured (sweep + R) / n | revolve optimum t(n,c) / n | "
           "online schedule (n + R_on) / n | online lower bound (n + R_min) / n | grad / forward "
           "- R / n | samples |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const double n = STEPS;
    bool ok_counts = true;
    for (int k = 0; k < KINDS; k++) {
        row *r = &rows[k];
        const nb_loop_stats *ls = &r->ls;
        double f = bench_median(r->fwd, r->n_fwd), g = bench_median(r->grd, r->n_grd);
        char kind[48], mem[96], sched[64], meas[32], rev[48], onl[48], low[48], rest[32];
        if (r->c == 0) {
            snprintf(kind, sizeof kind, "bounded");
            char m[32];
            mem_cell(m, sizeof m, (size_t)STEPS * N * 8);
            snprintf(mem, sizeof mem, "%s (tape: %d x %d B)", m, STEPS, N * 8);
            snprintf(sched, sizeof sched, "tape every step: %d + 0", STEPS);
            snprintf(meas, sizeof meas, "1.00");
            snprintf(rev, sizeof rev, "—");
            snprintf(onl, sizeof onl, "—");
            snprintf(low, sizeof low, "—");
            snprintf(rest, sizeof rest, "%.2f", g / f);
        } else {
            int64_t t = nbl_revolve_advances(STEPS, r->c);
            int64_t rmin = nbl_ckpt_min_recomputations(STEPS, r->c);
            size_t wl = nbl_online_work_len(r->c) + nbl_ckpt_rev_work_len(r->c);
            int64_t *work = calloc(wl, sizeof(int64_t));
            nbl_ckpt_counts on = {0};
            if (work == NULL) {
                fprintf(stderr, "bench_loops: out of memory\n");
                return 1;
            }
            BENCH_CHECK(ctx, nbl_online_simulate(STEPS, r->c, work, wl, &on));
            free(work);
            int64_t rr = ls->recomputed_steps, sweep = ls->forward_sweep_steps;
            /* the executed counters are the schedule's: revolve's t(n, c) when offline (sweep
             * x_0 .. x_{n-1}), the simulated online schedule's otherwise */
            ok_counts = ok_counts && ls->primal_steps == STEPS && ls->taped_steps == STEPS &&
                        ls->checkpoints == r->c && ls->peak_checkpoints <= r->c &&
                        (ls->offline ? sweep == STEPS - 1 && sweep + rr == t
                                     : sweep == STEPS && rr == on.recomputed) &&
                        on.recomputed >= rmin;
            snprintf(kind, sizeof kind, "checkpointed, c = %lld", (long long)r->c);
            char m[32];
            mem_cell(m, sizeof m, ls->peak_checkpoint_bytes);
            snprintf(mem, sizeof mem, "%s (%lld states)", m, (long long)ls->peak_checkpoints);
            snprintf(sched, sizeof sched, "%s: %lld + %lld", ls->offline ? "revolve" : "online",
                     (long long)sweep, (long long)rr);
            snprintf(meas, sizeof meas, "%.2f", (double)(sweep + rr) / n);
            snprintf(rev, sizeof rev, "%.2f (t = %lld)", (double)t / n, (long long)t);
            snprintf(onl, sizeof onl, "%.2f (R_on = %lld)", (n + (double)on.recomputed) / n,
                     (long long)on.recomputed);
            snprintf(low, sizeof low, "%.2f (R_min = %lld)", (n + (double)rmin) / n,
                     (long long)rmin);
            snprintf(rest, sizeof rest, "%.2f", g / f - (double)rr / n);
        }
        printf("| %s | %.1f ms | %.1f ms | %.2f | %s | %s | %s | %s | %s | %s | %s | %d |\n", kind,
               f * 1e3, g * 1e3, g / f, mem, sched, meas, rev, onl, low, rest, r->n_grd);
    }
    printf("\nn = %d steps; R: steps run again during the reversal "
           "(nb_loop_last_stats.recomputed_steps). Factors are unrecorded step evaluations per "
           "step, the first forward sweep included (the taped step of every step not counted). "
           "measured: from the stats (sweep = forward_sweep_steps: n - 1 for revolve, which tapes "
           "step n-1 from x_{n-1}; n for the online schedule). revolve optimum: "
           "nbl_revolve_advances(n, c) / n, its sweep's n - 1 included. online schedule: what the "
           "same loop written as a while loop (trip count unknown) would run, n + R_on with R_on "
           "from nbl_online_simulate. online lower bound: n + R_min, R_min = "
           "nbl_ckpt_min_recomputations(n, c), the fewest recomputations of any schedule "
           "reversing from x_n with c slots (x_0 in one); revolve may go below it since it also "
           "holds x_{n-1} as its working state. grad / forward - R / n: the ratio without the "
           "recomputations, counted at one forward step each (should not depend on c).\n",
           STEPS);
    printf("gradients of every checkpointed kind bit-identical to bounded (nb_tree_equal): %s; "
           "losses equal: %s (%.17g)\n",
           identical ? "yes" : "NO", same_loss ? "yes" : "NO", rows[0].value);
    printf("executable workspace (nb_fn_stats), forward / grad:");
    for (int k = 0; k < KINDS; k++) {
        char a[32], b[32];
        mem_cell(a, sizeof a, rows[k].ws_fwd);
        mem_cell(b, sizeof b, rows[k].ws_grad);
        printf("%s c = %lld %s / %s", k ? ";" : "", (long long)rows[k].c, a, b);
    }
    printf(" (c = 0: bounded)\n");
    printf("first grad call (trace + compile + run), s:");
    for (int k = 0; k < KINDS; k++) {
        printf("%s c = %lld %.2f", k ? ";" : "", (long long)rows[k].c, rows[k].first_grad_s);
    }
    printf("\nwhole run: %.0f s\n", bench_now_s() - t_start);

    for (int k = 0; k < KINDS; k++) {
        row_free(&rows[k]);
    }
    nb_tree_destroy(args);
    nb_ctx_destroy(ctx);
    if (!identical || !same_loss) {
        fprintf(stderr, "bench_loops: the kinds' gradients or losses differ\n");
        return 1;
    }
    if (!ok_counts) {
        fprintf(stderr, "bench_loops: a schedule's counters are inconsistent\n");
        return 1;
    }
    return 0;
}
