/*
 * test_stiff.c -- the stiff side of nb_diffeqsolve: the Rosenbrock (ros3p, rodas5p) and
 * ESDIRK (implicit_euler, kvaerno3/4/5) solvers and traced times.
 *   - traced times: t0, t1 and SaveAt ts as vars -- values and derivatives against the
 *     closed form of y' = -k y, and one trace for 50 gradient calls with new times;
 *   - failures: runtime checks of traced times, a Newton iteration that cannot converge at
 *     dtmin, constant steps, max_steps.
 * (Order tests of the stiff methods: test_ode.c test_convergence_order; their tableaus:
 * test_tableau.c.)
 */
#include "nbtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- helpers --------------------------------------------------------------------------- */

static double leaf_at(const nb_tree *t, const char *path, int64_t i) {
    const nb_tree *l = t;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = strtok(buf, "."); p != NULL; p = strtok(NULL, ".")) {
        l = p[0] >= '0' && p[0] <= '9' ? nb_tree_child(l, atoi(p)) : nb_tree_get(l, p);
    }
    double v = NAN;
    nb_array_get_flat(nb_tree_get_array(l), i, &v);
    return v;
}

static nb_array *vec(nb_ctx *ctx, int64_t n, const double *v) {
    return nbt_arr_f64(ctx, 1, (int64_t[]){n}, v);
}

static nb_array *scalar(nb_ctx *ctx, double v) {
    return nbt_arr_f64(ctx, 0, NULL, &v);
}

/* ---- traced times ---------------------------------------------------------------------- */

/* y' = -k y */
static nb_status term_decay(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *y = nb_get(tr, args, "[1]"), *k = nb_get(tr, args, "[2]");
    return nb_return(nb_neg(nb_mul(k, y)), out);
}

/* self: (solver, backwards) as static ints -- part of the cache key (globals would not be) */
static nb_tree *cfg2(nb_ctx *ctx, int a, int b) {
    nb_tree *l[2];
    NBT_OK(ctx, nb_tree_int(ctx, a, &l[0]));
    NBT_OK(ctx, nb_tree_int(ctx, b, &l[1]));
    return nbt_tuple_take(ctx, 2, l);
}

static int cfg_int(const nb_tree *self, int i) {
    int64_t v = 0;
    nb_tree_get_int(nb_tree_child(self, i), &v);
    return (int)v;
}

/* args: (times = (t0, t1, ts), k): sum of ys at the ts + y(t1) (a second solve, SaveAt t1) */
static nb_status body_times(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_fn *term = NULL;
    NBT_OK(nb_trace_ctx(tr), nb_fn_create(nb_trace_ctx(tr), "decay", term_decay, NULL, &term));
    nb_var *t0 = nb_get(tr, args, "[0][0]"), *t1 = nb_get(tr, args, "[0][1]");
    nb_var *ts = nb_get(tr, args, "[0][2]"), *k = nb_get(tr, args, "[1]");
    nb_ode_opts o = nb_ode_opts_default();
    o.solver = (nb_ode_solver)cfg_int(self, 0);
    o.controller = nb_ode_pid(1e-10, 1e-12);
    o.max_steps = 2000;
    if (cfg_int(self, 1)) {
        o.t0 = 1.0;
        o.t1 = 0.0;
    }
    o.t0_traced = t0;
    o.t1_traced = t1;
    o.ts_traced = ts;
    o.saveat.kind = NB_SAVEAT_TS;
    nb_tree *y0 = nb_leaf(nb_full(tr, NB_DTYPE_F64, 0, NULL, 1.0));
    const nb_tree *a = nb_diffeqsolve(tr, term, y0, nb_leaf(k), &o);
    o.saveat.kind = NB_SAVEAT_T1;
    o.ts_traced = NULL;
    const nb_tree *b = a != NULL ? nb_diffeqsolve(tr, term, y0, nb_leaf(k), &o) : NULL;
    nb_fn_destroy(term);
    if (b == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *v = nb_add(nb_sum(nb_get(tr, a, "ys"), NULL, 0, false),
                       nb_sum(nb_get(tr, b, "ys"), NULL, 0, false));
    return nb_return(v, out);
}

static nb_tree *times_args(nb_ctx *ctx, double t0, double t1, int64_t n, const double *ts,
                           double k) {
    nb_tree *tl[3], *l[2];
    NBT_OK(ctx, nb_tree_array(scalar(ctx, t0), &tl[0]));
    NBT_OK(ctx, nb_tree_array(scalar(ctx, t1), &tl[1]));
    NBT_OK(ctx, nb_tree_array(vec(ctx, n, ts), &tl[2]));
    for (int i = 0; i < 3; i++) {
        nb_array_destroy(nb_tree_get_array(tl[i])); /* the leaf holds its own reference */
    }
    l[0] = nbt_tuple_take(ctx, 3, tl);
    NBT_OK(ctx, nb_tree_array(scalar(ctx, k), &l[1]));
    nb_array_destroy(nb_tree_get_array(l[1]));
    return nbt_tuple_take(ctx, 2, l);
}

static void test_traced_times(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const int solvers[] = {NB_ODE_KVAERNO5, NB_ODE_RODAS5P, NB_ODE_TSIT5};
    for (size_t si = 0; si < sizeof solvers / sizeof solvers[0]; si++) {
        for (int back = 0; back < 2; back++) {
            int solver = solvers[si];
            nb_fn *f = NULL, *g = NULL, *jg = NULL;
            nb_tree *self = cfg2(ctx, solver, back);
            NBT_OK(ctx, nb_fn_create(ctx, "times", body_times, self, &f));
            nb_tree_destroy(self);
            NBT_OK(ctx, nb_value_and_grad(f, NULL, &g));
            NBT_OK(ctx, nb_jit(g, NULL, &jg));
            double maxerr = 0;
            for (int call = 0; call < 50; call++) {
                /* new, irregular times on every call: no retrace */
                double t0 = 0.1 + 0.01 * call, t1 = t0 + 1.0 + 0.03 * (call % 7), k = 1.3;
                double ts[3] = {t0 + 0.05, t0 + 0.3 + 0.01 * (call % 5), t1 - 0.2};
                if (back) { /* from t0 down to t1 */
                    double tmp = t0;
                    t0 = t1;
                    t1 = tmp;
                    ts[0] = t0 - 0.05;
                    ts[1] = t0 - 0.3 - 0.01 * (call % 5);
                    ts[2] = t1 + 0.2;
                }
                nb_tree *args = times_args(ctx, t0, t1, 3, ts, k), *out = NULL;
                NBT_OK(ctx, nb_fn_call(jg, args, &out));
                /* value and d/dt0, d/dt1, d/dts of sum_j exp(-k (ts_j - t0)) + exp(-k (t1 - t0)) */
                double v = exp(-k * (t1 - t0)), d0 = k * v, d1 = -k * v, dts[3];
                for (int j = 0; j < 3; j++) {
                    double e = exp(-k * (ts[j] - t0));
                    v += e;
                    d0 += k * e;
                    dts[j] = -k * e;
                }
                double got[6] = {leaf_at(out, "0", 0),   leaf_at(out, "1.0", 0),
                                 leaf_at(out, "1.1", 0), leaf_at(out, "1.2", 0),
                                 leaf_at(out, "1.2", 1), leaf_at(out, "1.2", 2)};
                double want[6] = {v, d0, d1, dts[0], dts[1], dts[2]};
                /* the value and d/dt1 to the solve's tolerance; d/dt0 and d/dts go through
                 * the dense output's derivative in time (the cubic Hermite of the stiff
                 * solvers: errors O(h^3), ~1e-6 at these steps) */
                static const double tol[6] = {1e-8, 1e-7, 1e-7, 2e-5, 2e-5, 2e-5};
                for (int i = 0; i < 6; i++) {
                    double e = fabs(got[i] - want[i]) / fmax(1.0, fabs(want[i]));
                    maxerr = fmax(maxerr, e);
                    if (!(e < tol[i] * (i == 1 ? 300 : 1))) {
                        fail_msg("%s %s call %d: [%d] got %.15g want %.15g",
                                 nb_ode_solver_name((nb_ode_solver)solver),
                                 back ? "backwards" : "forwards", call, i, got[i], want[i]);
                    }
                }
                nb_tree_destroy(out);
                nb_tree_destroy(args);
            }
            nb_fn_stats st;
            NBT_OK(ctx, nb_fn_stats_get(jg, &st));
            print_message("traced times, %s %s: 50 gradient calls, %lld trace(s), max rel err "
                          "%.2e\n",
                          nb_ode_solver_name((nb_ode_solver)solver),
                          back ? "backwards" : "forwards", (long long)st.n_traces, maxerr);
            NBT_EQ_I64(st.n_traces, 1);
            nb_fn_destroy(jg);
            nb_fn_destroy(g);
            nb_fn_destroy(f);
        }
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* traced times that do not fit the static direction, or unsorted ts: NB_ERR_RUNTIME with a
 * message naming the values */
static void test_traced_times_checked(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL;
    nb_tree *self = cfg2(ctx, NB_ODE_KVAERNO5, 0);
    NBT_OK(ctx, nb_fn_create(ctx, "times", body_times, self, &f));
    nb_tree_destroy(self);
    static const struct {
        double t0, t1, ts[3];
        const char *msg;
    } C[] = {
        {1.0, 0.5, {0.6, 0.7, 0.8}, "t1 = 0.5"},  /* backwards where the static is forwards */
        {0.0, 1.0, {0.5, 0.2, 0.8}, "sorted"},    /* unsorted */
        {0.0, 1.0, {0.5, 0.6, 1.5}, "to 1.5"},    /* beyond t1 */
        {0.0, 1.0, {-0.1, 0.6, 0.7}, "from -0.1"} /* before t0 */
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        nb_tree *args = times_args(ctx, C[i].t0, C[i].t1, 3, C[i].ts, 1.0), *out = NULL;
        NBT_STATUS(ctx, NB_ERR_RUNTIME, nb_fn_call(f, args, &out));
        NBT_ERRMSG_HAS(ctx, "traced times");
        NBT_ERRMSG_HAS(ctx, C[i].msg);
        NBT_TRUE(out == NULL);
        nb_tree_destroy(args);
    }
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- IMEX: the KenCarp solvers with opts.explicit_term ------------------------------------ */

/* Prothero-Robinson, split: dy/dt = lambda (y - cos t) [stiff, implicit] - sin t [explicit],
 * y(0) = 1: y = cos t for any lambda. And the harmonic oscillator split x' = v [explicit],
 * v' = -x [implicit]: x = cos t. self of the solve: (solver, problem, n steps or 0, rtol
 * exponent). */
static nb_status term_pr_stiff(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *t = nb_get(tr, args, "[0]"), *y = nb_get(tr, args, "[1]");
    return nb_return(nb_mul(nb_scalar(tr, -1e5), nb_sub(y, nb_cos(t))), out);
}
static nb_status term_pr_explicit(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                  nb_tree **out) {
    (void)self;
    nb_var *t = nb_get(tr, args, "[0]");
    return nb_return(nb_broadcast_to(nb_neg(nb_sin(t)), 1, (int64_t[]){1}), out);
}
static nb_status term_ho_implicit(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                  nb_tree **out) {
    (void)self;
    nb_var *y = nb_get(tr, args, "[1]");
    nb_var *x = nb_slice(y, (int64_t[]){0}, (int64_t[]){1}, NULL);
    return nb_return(nb_concatenate(2, (nb_var *[]){nb_mul(x, nb_scalar(tr, 0.0)), nb_neg(x)}, 0),
                     out);
}
static nb_status term_ho_explicit(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                  nb_tree **out) {
    (void)self;
    nb_var *y = nb_get(tr, args, "[1]");
    nb_var *v = nb_slice(y, (int64_t[]){1}, (int64_t[]){2}, NULL);
    return nb_return(nb_concatenate(2, (nb_var *[]){v, nb_mul(v, nb_scalar(tr, 0.0))}, 0), out);
}

static nb_status body_imex(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)args;
    nb_ctx *ctx = nb_trace_ctx(tr);
    int pr = cfg_int(self, 1) == 0, n = cfg_int(self, 2);
    nb_fn *ti = NULL, *te = NULL;
    NBT_OK(ctx,
           nb_fn_create(ctx, "implicit part", pr ? term_pr_stiff : term_ho_implicit, NULL, &ti));
    NBT_OK(ctx,
           nb_fn_create(ctx, "explicit part", pr ? term_pr_explicit : term_ho_explicit, NULL, &te));
    nb_ode_opts o = nb_ode_opts_default();
    o.solver = (nb_ode_solver)cfg_int(self, 0);
    o.explicit_term = te;
    o.t1 = pr ? 2.0 : 1.0;
    o.max_steps = 20000;
    if (n > 0) {
        o.dt0 = o.t1 / n;
    } else {
        double rtol = pow(10.0, -cfg_int(self, 3));
        o.controller = nb_ode_pid(rtol, rtol);
    }
    double y0v[2] = {1.0, 0.0};
    nb_array *a = nbt_arr_f64(ctx, 1, (int64_t[]){pr ? 1 : 2}, y0v);
    nb_tree *yl = nb_leaf(nb_constant(tr, a));
    nb_array_destroy(a);
    const nb_tree *sol = nb_diffeqsolve(tr, ti, yl, NULL, &o);
    nb_fn_destroy(ti);
    nb_fn_destroy(te);
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)sol);
    return NB_OK;
}

static nb_tree *cfg4(nb_ctx *ctx, int a, int b, int c, int d) {
    nb_tree *l[4];
    int v[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++) {
        NBT_OK(ctx, nb_tree_int(ctx, v[i], &l[i]));
    }
    return nbt_tuple_take(ctx, 4, l);
}

static nb_tree *run_imex(nb_ctx *ctx, int solver, int problem, int n, int rtol_exp) {
    nb_tree *self = cfg4(ctx, solver, problem, n, rtol_exp), *args = nbt_tuple_take(ctx, 0, NULL);
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "imex", body_imex, self, &f));
    nb_tree_destroy(self);
    nb_tree *out = NULL;
    NBT_OK(ctx, nb_fn_call(f, args, &out));
    nb_fn_destroy(f);
    nb_tree_destroy(args);
    return out;
}

static void test_imex(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const int S[3] = {NB_ODE_KENCARP3, NB_ODE_KENCARP4, NB_ODE_KENCARP5};
    for (int k = 0; k < 3; k++) {
        /* stiff Prothero-Robinson: accurate to the tolerance where explicit methods would
         * need ~1e5 steps */
        for (int e = 5; e <= 8; e += 3) {
            nb_tree *sol = run_imex(ctx, S[k], 0, 0, e);
            double y = leaf_at(sol, "ys", 0), err = fabs(y - cos(2.0));
            int steps = (int)leaf_at(sol, "stats.num_steps", 0);
            print_message("%s Prothero-Robinson (lambda -1e5), rtol 1e-%d: |error| %.2e in %d "
                          "steps\n",
                          nb_ode_solver_name((nb_ode_solver)S[k]), e, err, steps);
            NBT_EQ_I64((int)leaf_at(sol, "result", 0), NB_ODE_SUCCESSFUL);
            /* global error of a problem with order reduction (DIRK stage order 2): within
             * 100 rtol (measured 3.5e-6 and 2.1e-7 for kencarp3) */
            NBT_TRUE(err < 100 * pow(10.0, -e));
            NBT_TRUE(steps < 5000);
            nb_tree_destroy(sol);
        }
        /* the split oscillator with constant steps: the additive pair's order (its coupling
         * conditions included) */
        double le[4], lh[4];
        for (int r = 0; r < 4; r++) {
            int n = (k == 2 ? 4 : 8) << r;
            nb_tree *sol = run_imex(ctx, S[k], 1, n, 0);
            double x = leaf_at(sol, "ys", 0), v = leaf_at(sol, "ys", 1);
            le[r] = log(fmax(fabs(x - cos(1.0)), fabs(v + sin(1.0))));
            lh[r] = log(1.0 / n);
            nb_tree_destroy(sol);
        }
        double slope = (le[0] - le[3]) / (lh[0] - lh[3]);
        int order = nb_ode_solver_order((nb_ode_solver)S[k]);
        print_message("%s split oscillator: slope %.3f (order %d)\n",
                      nb_ode_solver_name((nb_ode_solver)S[k]), slope, order);
        NBT_TRUE(fabs(slope - order) < 0.25);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_imex),
        cmocka_unit_test(test_traced_times),
        cmocka_unit_test(test_traced_times_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
