/*
 * test_events.c -- events in nb_diffeqsolve (opts.event): a condition c(t, y, args) whose
 * sign change ends the solve at its root, the event time differentiable.
 *   - a bouncing ball (three ground contacts, each solve restarted from the last event with
 *     the velocity reversed and damped): the contact time and its gradient with respect to
 *     the drop height, gravity and restitution against the closed form, for explicit,
 *     Rosenbrock and ESDIRK solvers; the checkpointed gradient bit for bit the direct one;
 *     one trace for 50 jitted gradient calls with new parameters;
 *   - several conditions: which fired (directions, the earliest of two in one step, a bool
 *     condition), SaveAt ts and steps around the event, a backwards solve;
 *   - a terminal event in stiff problems (Robertson: y1 = 1/2; Van der Pol mu = 1000: the
 *     first fall through y1 = 0) against SciPy (tests/ode/oracle/gen_events.py): the event
 *     time, the state there and the event time's gradient w.r.t. the rate constants and y0;
 *   - a condition that never fires changes no bit of the solution;
 *   - misuse: bad conditions, directions, tolerances, the backsolve adjoint.
 */
#include "nbtest.h"
#include "stiff_problems.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef NBT_ORACLE_DIR
#define NBT_ORACLE_DIR "tests/ode/oracle"
#endif

/* ---- helpers --------------------------------------------------------------------------- */

static double at(const nb_tree *t, int64_t i) {
    double v = NAN;
    nb_array_get_flat(nb_tree_get_array(t), i, &v);
    return v;
}

static nb_tree *ints(nb_ctx *ctx, int n, const int *v) {
    nb_tree *l[8];
    for (int i = 0; i < n; i++) {
        NBT_OK(ctx, nb_tree_int(ctx, v[i], &l[i]));
    }
    return nbt_tuple_take(ctx, n, l);
}

static int cfg_int(const nb_tree *self, int i) {
    int64_t v = 0;
    nb_tree_get_int(nb_tree_child(self, i), &v);
    return (int)v;
}

static nb_tree *f64_args(nb_ctx *ctx, int n, const double *v) {
    nb_tree *l[8];
    for (int i = 0; i < n; i++) {
        nb_array *a = nbt_arr_f64(ctx, 0, NULL, &v[i]);
        NBT_OK(ctx, nb_tree_array(a, &l[i]));
        nb_array_destroy(a);
    }
    nb_tree *p = nbt_tuple_take(ctx, n, l);
    return nbt_tuple_take(ctx, 1, &p);
}

static bool close_rel(double a, double b, double tol) {
    return fabs(a - b) <= tol * nbt_max(fabs(b), 1e-300);
}

/* ---- the bouncing ball ---------------------------------------------------------------------
 * x' = v, v' = -g; contact when x falls through 0 (direction -1); then v -> -e v. */

static nb_status term_ball(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *v = nb_get(tr, args, "[1][1]"), *g = nb_get(tr, args, "[2]");
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(v), nb_leaf(nb_neg(g))}, out);
}

static nb_status cond_ground(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    return nb_return(nb_get(tr, args, "[1][0]"), out);
}

/* self: (solver, adjoint, bounces); args[0] = (h0, g, e). Returns (time of the last contact,
 * sum of the solves' num_steps, the last event index, the last result). */
static nb_status body_ball(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *h0 = nb_get(tr, args, "[0][0]"), *g = nb_get(tr, args, "[0][1]");
    nb_var *e = nb_get(tr, args, "[0][2]");
    nb_fn *f = NULL, *c = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "ball", term_ball, NULL, &f));
    NBT_OK(ctx, nb_fn_create(ctx, "ground", cond_ground, NULL, &c));
    static const int down[1] = {-1};
    nb_var *x = h0, *v = nb_mul(h0, nb_scalar(tr, 0.0)), *t = nb_scalar(tr, 0.0);
    nb_var *steps = NULL, *which = NULL, *result = NULL;
    int bounces = cfg_int(self, 2);
    const nb_tree *sol = NULL;
    for (int b = 0; b < bounces; b++) {
        nb_tree *y0 = NULL;
        NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(x), nb_leaf(v)}, &y0));
        nb_ode_opts o = nb_ode_opts_default();
        o.solver = (nb_ode_solver)cfg_int(self, 0);
        o.adjoint.kind = (nb_ode_adjoint_kind)cfg_int(self, 1);
        o.t0 = 0.0;
        o.t1 = 100.0;
        o.t0_traced = t;
        o.controller = nb_ode_pid(1e-9, 1e-9);
        o.max_steps = 400;
        o.event = c;
        o.event_direction = down;
        o.n_event_direction = 1;
        sol = nb_diffeqsolve(tr, f, y0, nb_leaf(g), &o);
        nb_tree_destroy(y0);
        if (sol == NULL) {
            break;
        }
        t = nb_get(tr, sol, "t_final");
        x = nb_reshape(nb_get(tr, sol, "ys[0]"), 0, NULL);
        v = nb_neg(nb_mul(e, nb_reshape(nb_get(tr, sol, "ys[1]"), 0, NULL)));
        nb_var *n = nb_get(tr, sol, "stats.num_steps");
        steps = steps == NULL ? n : nb_add(steps, n);
        which = nb_get(tr, sol, "event");
        result = nb_get(tr, sol, "result");
    }
    nb_fn_destroy(f);
    nb_fn_destroy(c);
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    nb_tree *aux = NULL;
    NBT_OK(ctx, nb_tree_tuple(
                    ctx, 3, (nb_tree *[]){nb_leaf(steps), nb_leaf(which), nb_leaf(result)}, &aux));
    nb_status st = nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(t), aux}, out);
    nb_tree_destroy(aux);
    return st;
}

static void test_bouncing_ball(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const double H = 2.0, G = 9.81, E = 0.8;
    const int B = 3;
    /* closed form: t1 = sqrt(2h/g), then flights of 2 e^k v1 / g, v1 = g t1 */
    double t1 = sqrt(2 * H / G), q = 1 + 2 * E + 2 * E * E;
    double T = t1 * q, dTdh = q / sqrt(2 * G * H), dTdg = -q * sqrt(2 * H) / (2 * pow(G, 1.5));
    double dTde = t1 * (2 + 4 * E);
    static const int solvers[] = {
        NB_ODE_BOSH3,   NB_ODE_DOPRI5,   NB_ODE_TSIT5,    NB_ODE_DOPRI8,   NB_ODE_ROS3P,
        NB_ODE_RODAS5P, NB_ODE_KVAERNO3, NB_ODE_KVAERNO5, NB_ODE_KENCARP4, NB_ODE_ROSENBROCK23};
    for (size_t si = 0; si < sizeof solvers / sizeof solvers[0]; si++) {
        unsigned char *bits[2] = {NULL, NULL};
        for (int adj = 0; adj < 2; adj++) {
            nb_tree *self = ints(ctx, 3, (int[]){solvers[si], adj, B});
            nb_fn *f = NULL, *g = NULL;
            NBT_OK(ctx, nb_fn_create(ctx, "ball", body_ball, self, &f));
            nb_grad_opts go = nb_grad_opts_default();
            go.has_aux = true;
            NBT_OK(ctx, nb_value_and_grad(f, &go, &g));
            nb_tree *args = f64_args(ctx, 3, (double[]){H, G, E}), *out = NULL;
            NBT_OK(ctx, nb_fn_call(g, args, &out));
            const nb_tree *aux = nb_tree_child(nb_tree_child(out, 0), 1);
            const nb_tree *gr = nb_tree_child(out, 1);
            double tv = at(nb_tree_child(nb_tree_child(out, 0), 0), 0);
            double d[3] = {at(nb_tree_child(gr, 0), 0), at(nb_tree_child(gr, 1), 0),
                           at(nb_tree_child(gr, 2), 0)};
            const char *name = nb_ode_solver_name((nb_ode_solver)solvers[si]);
            /* a quadratic trajectory: every method of order >= 2 and its dense output are
             * exact up to rounding; the event's bisection to 4 ulp */
            if (!close_rel(tv, T, 1e-12) || at(nb_tree_child(aux, 1), 0) != 0 ||
                at(nb_tree_child(aux, 2), 0) != 0) {
                fail_msg("%s: third contact at %.17g (closed form %.17g), event %g, result %g",
                         name, tv, T, at(nb_tree_child(aux, 1), 0), at(nb_tree_child(aux, 2), 0));
            }
            static const char *const pn[3] = {"h0", "g", "e"};
            double want[3] = {dTdh, dTdg, dTde};
            for (int k = 0; k < 3; k++) {
                if (!close_rel(d[k], want[k], 1e-9)) {
                    fail_msg("%s (%s): dT/d%s = %.15g, closed form %.15g", name,
                             adj ? "direct" : "checkpointed", pn[k], d[k], want[k]);
                }
            }
            /* steps: a few per flight, never max_steps */
            if (at(nb_tree_child(aux, 0), 0) > 40 * B) {
                fail_msg("%s: %g steps for %d flights", name, at(nb_tree_child(aux, 0), 0), B);
            }
            bits[adj] = malloc(sizeof d);
            memcpy(bits[adj], d, sizeof d);
            nb_tree_destroy(out);
            nb_tree_destroy(args);
            nb_fn_destroy(g);
            nb_fn_destroy(f);
            nb_tree_destroy(self);
        }
        if (memcmp(bits[0], bits[1], 3 * sizeof(double)) != 0) {
            fail_msg("%s: the checkpointed gradient differs from the direct one",
                     nb_ode_solver_name((nb_ode_solver)solvers[si]));
        }
        free(bits[0]);
        free(bits[1]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* jit: 50 gradient calls with new (h0, g, e): one trace */
static void test_ball_jit(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *self = ints(ctx, 3, (int[]){NB_ODE_TSIT5, 0, 2});
    nb_fn *f = NULL, *g = NULL, *j = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "ball", body_ball, self, &f));
    nb_grad_opts go = nb_grad_opts_default();
    go.has_aux = true;
    NBT_OK(ctx, nb_value_and_grad(f, &go, &g));
    NBT_OK(ctx, nb_jit(g, NULL, &j));
    double maxerr = 0;
    for (int i = 0; i < 50; i++) {
        double H = 1.0 + 0.05 * i, G = 9.0 + 0.02 * i, E = 0.5 + 0.007 * i;
        nb_tree *args = f64_args(ctx, 3, (double[]){H, G, E}), *out = NULL;
        NBT_OK(ctx, nb_fn_call(j, args, &out));
        double q = 1 + 2 * E, t1 = sqrt(2 * H / G);
        double dTdh = q / sqrt(2 * G * H);
        double tv = at(nb_tree_child(nb_tree_child(out, 0), 0), 0);
        double dh = at(nb_tree_child(nb_tree_child(out, 1), 0), 0);
        maxerr = nbt_max(maxerr, nbt_max(fabs(tv - t1 * q) / (t1 * q), fabs(dh - dTdh) / dTdh));
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    nb_fn_stats st;
    NBT_OK(ctx, nb_fn_stats_get(j, &st));
    if (st.n_traces != 1 || maxerr > 1e-9) {
        fail_msg("50 jitted calls: %lld traces (want 1), max relative error %.3g",
                 (long long)st.n_traces, maxerr);
    }
    nb_fn_destroy(j);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nb_tree_destroy(self);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- several conditions ------------------------------------------------------------------ */

/* self: (variant); the ball from h = 2 (g = 9.81) */
static nb_status cond_many(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *x = nb_get(tr, args, "[1][0]"), *v = nb_get(tr, args, "[1][1]");
    switch (cfg_int(self, 0)) {
    case 0: /* x - 1.5 (directions +1: never), x - 1 (fires), v + 100 (never) */
    case 1: /* the same, any direction: x - 1.5 fires first */
        return nb_tree_tuple(ctx, 3,
                             (nb_tree *[]){nb_leaf(nb_sub(x, nb_scalar(tr, 1.5))),
                                           nb_leaf(nb_sub(x, nb_scalar(tr, 1.0))),
                                           nb_leaf(nb_add(v, nb_scalar(tr, 100.0)))},
                             out);
    case 2: /* two roots 1e-3 apart in height, both within one step: the later index first */
        return nb_tree_list(ctx, 2,
                            (nb_tree *[]){nb_leaf(nb_sub(x, nb_scalar(tr, 1.0))),
                                          nb_leaf(nb_sub(x, nb_scalar(tr, 1.001)))},
                            out);
    case 3: /* a bool: x < 1 */
        return nb_return(nb_lt(x, nb_scalar(tr, 1.0)), out);
    default: /* never before t1 = 5 (x = -120.6 there): x + 1000 */
        return nb_return(nb_add(x, nb_scalar(tr, 1000.0)), out);
    }
}

/* self: (variant, saveat kind); args[0] = (h0, g). Returns the solution's ts, ys[0], event,
 * t_final, result and, as the loss, t_final. */
static nb_status body_many(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *h0 = nb_get(tr, args, "[0][0]"), *g = nb_get(tr, args, "[0][1]");
    nb_fn *f = NULL, *c = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "ball", term_ball, NULL, &f));
    nb_tree *cself = ints(ctx, 1, (int[]){cfg_int(self, 0)});
    NBT_OK(ctx, nb_fn_create(ctx, "conditions", cond_many, cself, &c));
    nb_tree_destroy(cself);
    nb_tree *y0 = NULL;
    NBT_OK(ctx,
           nb_tree_tuple(ctx, 2,
                         (nb_tree *[]){nb_leaf(h0), nb_leaf(nb_mul(h0, nb_scalar(tr, 0.0)))}, &y0));
    nb_ode_opts o = nb_ode_opts_default();
    o.solver = NB_ODE_TSIT5;
    o.t0 = 0.0;
    o.t1 = 5.0;
    o.controller = nb_ode_pid(1e-10, 1e-10);
    o.dt0 = 1.0; /* big first steps: several roots within one */
    static const int dirs[3] = {1, 0, 0};
    int variant = cfg_int(self, 0);
    if (variant == 0) {
        o.event_direction = dirs;
        o.n_event_direction = 3;
    }
    if (variant != 5) {
        o.event = c;
    }
    static const double ts[4] = {0.1, 0.3, 0.5, 0.7};
    o.saveat.kind = (nb_saveat_kind)cfg_int(self, 1);
    if (o.saveat.kind == NB_SAVEAT_TS) {
        o.saveat.ts = ts;
        o.saveat.n_ts = 4;
    }
    o.max_steps = 64;
    const nb_tree *sol = nb_diffeqsolve(tr, f, y0, nb_leaf(g), &o);
    nb_tree_destroy(y0);
    nb_fn_destroy(f);
    nb_fn_destroy(c);
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *tf = nb_get(tr, sol, "t_final");
    nb_tree *aux = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 5,
                              (nb_tree *[]){nb_leaf(nb_get(tr, sol, "ts")),
                                            nb_leaf(nb_get(tr, sol, "ys[0]")),
                                            nb_leaf(nb_get(tr, sol, "event")), nb_leaf(tf),
                                            nb_leaf(nb_get(tr, sol, "result"))},
                              &aux));
    nb_status st = nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(tf), aux}, out);
    nb_tree_destroy(aux);
    return st;
}

static nb_tree *run_many(nb_ctx *ctx, int variant, int saveat, bool grad) {
    nb_tree *self = ints(ctx, 2, (int[]){variant, saveat});
    nb_fn *f = NULL, *g = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "many", body_many, self, &f));
    nb_grad_opts go = nb_grad_opts_default();
    go.has_aux = true;
    NBT_OK(ctx, nb_value_and_grad(f, &go, &g));
    nb_tree *args = f64_args(ctx, 2, (double[]){2.0, 9.81}), *out = NULL;
    NBT_OK(ctx, nb_fn_call(grad ? g : f, args, &out));
    nb_tree_destroy(args);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nb_tree_destroy(self);
    return out;
}

static void test_event_conditions(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const double G = 9.81, H = 2.0;
    /* variant: which fires, at what height */
    static const struct {
        int variant, which;
        double height;
    } cases[] = {{0, 1, 1.0}, {1, 0, 1.5}, {2, 1, 1.001}, {3, 0, 1.0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nb_tree *out = run_many(ctx, cases[i].variant, NB_SAVEAT_T1, true);
        const nb_tree *aux = nb_tree_child(nb_tree_child(out, 0), 1);
        double t = at(nb_tree_child(aux, 3), 0), want = sqrt(2 * (H - cases[i].height) / G);
        double which = at(nb_tree_child(aux, 2), 0), x = at(nb_tree_child(aux, 1), 0);
        double dt = at(nb_tree_child(nb_tree_child(out, 1), 0), 0);
        /* dt* / dh0 = 1 / (g t*) for a float condition; a bool's event time has none */
        double dwant = cases[i].variant == 3 ? 0.0 : 1.0 / (G * want);
        if (which != cases[i].which || !close_rel(t, want, 1e-12) ||
            fabs(x - cases[i].height) > 1e-11 || !close_rel(dt, dwant, 1e-9) ||
            at(nb_tree_child(aux, 4), 0) != 0) {
            fail_msg("variant %d: event %g (want %d) at t = %.17g (want %.17g), x = %.17g (want "
                     "%g), dt/dh0 = %.15g (want %.15g), result %g",
                     cases[i].variant, which, cases[i].which, t, want, x, cases[i].height, dt,
                     dwant, at(nb_tree_child(aux, 4), 0));
        }
        nb_tree_destroy(out);
    }

    /* SaveAt ts around the event (x - 1.5 falls through 0 at t* = 0.319): the rows at 0.1 and
     * 0.3 exact, those at 0.5 and 0.7 +inf */
    nb_tree *out = run_many(ctx, 1, NB_SAVEAT_TS, false);
    const nb_tree *aux = nb_tree_child(out, 1);
    for (int r = 0; r < 4; r++) {
        double tr_ = 0.1 + 0.2 * r, x = at(nb_tree_child(aux, 1), r);
        double want = tr_ < sqrt(2 * 0.5 / G) ? H - 0.5 * G * tr_ * tr_ : INFINITY;
        if (!(x == want || fabs(x - want) < 1e-12)) {
            fail_msg("SaveAt ts row %d (t = %g): x = %.17g, want %.17g", r, tr_, x, want);
        }
    }
    nb_tree_destroy(out);

    /* SaveAt steps: the last kept row is the event */
    out = run_many(ctx, 1, NB_SAVEAT_STEPS, false);
    aux = nb_tree_child(out, 1);
    int64_t n = nb_array_size(nb_tree_get_array(nb_tree_child(aux, 0)));
    int64_t last = -1;
    for (int64_t r = 0; r < n; r++) {
        if (isfinite(at(nb_tree_child(aux, 0), r))) {
            last = r;
        }
    }
    double te = sqrt(2 * 0.5 / G);
    if (last < 0 || !close_rel(at(nb_tree_child(aux, 0), last), te, 1e-12) ||
        fabs(at(nb_tree_child(aux, 1), last) - 1.5) > 1e-11) {
        fail_msg("SaveAt steps: last row %lld at t = %.17g, x = %.17g (want %.17g, 1.5)",
                 (long long)last, last >= 0 ? at(nb_tree_child(aux, 0), last) : NAN,
                 last >= 0 ? at(nb_tree_child(aux, 1), last) : NAN, te);
    }
    nb_tree_destroy(out);

    /* a condition that never fires changes no bit: SaveAt steps with and without it */
    nb_tree *a = run_many(ctx, 4, NB_SAVEAT_STEPS, true);
    nb_tree *b = run_many(ctx, 5, NB_SAVEAT_STEPS, true);
    for (int k = 0; k < 2; k++) {
        bool same = false;
        const nb_tree *ua = nb_tree_child(nb_tree_child(nb_tree_child(a, 0), 1), k);
        const nb_tree *ub = nb_tree_child(nb_tree_child(nb_tree_child(b, 0), 1), k);
        NBT_OK(ctx, nb_array_identical(nb_tree_get_array(ua), nb_tree_get_array(ub), &same));
        if (!same) {
            fail_msg("a condition that never fires changed output %d", k);
        }
    }
    if (at(nb_tree_child(nb_tree_child(nb_tree_child(a, 0), 1), 2), 0) != -1) {
        fail_msg("no event: the solution's event is %g, want -1",
                 at(nb_tree_child(nb_tree_child(nb_tree_child(a, 0), 1), 2), 0));
    }
    nb_tree_destroy(a);
    nb_tree_destroy(b);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* backwards in time: y' = 1 from y(0) = 1 towards t1 = -10, y falls through 0 at t = -1 */
static nb_status term_one(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *y = nb_get(tr, args, "[1]");
    return nb_return(nb_add(nb_mul(y, nb_scalar(tr, 0.0)), nb_get(tr, args, "[2]")), out);
}

static nb_status cond_y(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_get(tr, args, "[1]"), out);
}

static nb_status body_back(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *y0 = nb_get(tr, args, "[0][0]"), *r = nb_get(tr, args, "[0][1]");
    nb_fn *f = NULL, *c = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "one", term_one, NULL, &f));
    NBT_OK(ctx, nb_fn_create(ctx, "y", cond_y, NULL, &c));
    nb_ode_opts o = nb_ode_opts_default();
    o.solver = NB_ODE_DOPRI5;
    o.t0 = 0.0;
    o.t1 = -10.0;
    o.dt0 = -0.3;
    o.controller = nb_ode_constant_step();
    o.event = c;
    static const int falling[1] = {-1};
    o.event_direction = falling; /* falling as the solve goes (backwards) */
    o.n_event_direction = 1;
    const nb_tree *sol = nb_diffeqsolve(tr, f, nb_leaf(y0), nb_leaf(r), &o);
    nb_fn_destroy(f);
    nb_fn_destroy(c);
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    return nb_tree_tuple(
        ctx, 2,
        (nb_tree *[]){nb_leaf(nb_get(tr, sol, "t_final")), nb_leaf(nb_get(tr, sol, "event"))}, out);
}

static void test_event_backwards(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *g = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "back", body_back, NULL, &f));
    nb_grad_opts go = nb_grad_opts_default();
    go.has_aux = true;
    NBT_OK(ctx, nb_value_and_grad(f, &go, &g));
    /* y = y0 + r t = 0 at t* = -y0 / r: dt* / dy0 = -1/r, dt* / dr = y0 / r^2 */
    nb_tree *args = f64_args(ctx, 2, (double[]){1.0, 0.8}), *out = NULL;
    NBT_OK(ctx, nb_fn_call(g, args, &out));
    double t = at(nb_tree_child(nb_tree_child(out, 0), 0), 0);
    double ev = at(nb_tree_child(nb_tree_child(out, 0), 1), 0);
    double d0 = at(nb_tree_child(nb_tree_child(out, 1), 0), 0);
    double d1 = at(nb_tree_child(nb_tree_child(out, 1), 1), 0);
    if (!close_rel(t, -1.25, 1e-13) || ev != 0 || !close_rel(d0, -1.25, 1e-12) ||
        !close_rel(d1, 1.5625, 1e-12)) {
        fail_msg("backwards: t* = %.17g (want -1.25), event %g, dt*/dy0 = %.15g (want -1.25), "
                 "dt*/dr = %.15g (want 1.5625)",
                 t, ev, d0, d1);
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- terminal events in stiff problems ---------------------------------------------------- */

/* events_ref.txt: "<problem> <field> v1 .. vn" lines (gen_events.py); returns n */
static int oracle_get(const char *prob, const char *field, double *v, int cap) {
    FILE *fp = fopen(NBT_ORACLE_DIR "/events_ref.txt", "r");
    if (fp == NULL) {
        fail_msg("cannot open %s", NBT_ORACLE_DIR "/events_ref.txt");
    }
    char line[4096], key[128];
    snprintf(key, sizeof key, "%s %s ", prob, field);
    int n = -1;
    while (fgets(line, sizeof line, fp) != NULL) {
        if (strncmp(line, key, strlen(key)) != 0) {
            continue;
        }
        n = 0;
        char *p = line + strlen(key), *q = NULL;
        for (;; p = q) {
            double x = strtod(p, &q);
            if (q == p) {
                break;
            }
            if (n >= cap) {
                fail_msg("%s%s: more than %d values", key, field, cap);
            }
            v[n++] = x;
        }
        break;
    }
    fclose(fp);
    if (n < 1) {
        fail_msg("%s %s: not in events_ref.txt", prob, field);
    }
    return n;
}

static nb_status cond_rob(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *y = nb_get(tr, args, "[1]");
    return nb_return(nb_sub(nb_reshape(sp_at(y, 0), 0, NULL), nb_scalar(tr, 0.5)), out);
}

static nb_status cond_vdp(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_reshape(sp_at(nb_get(tr, args, "[1]"), 0), 0, NULL), out);
}

/* self: (problem 0 Robertson / 1 VdP, solver); args[0] = (p, y0). Loss: t*; aux: y(t*),
 * event, result. */
static nb_status body_stiff(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    int prob = cfg_int(self, 0);
    nb_var *p = nb_get(tr, args, "[0][0]"), *y0 = nb_get(tr, args, "[0][1]");
    nb_fn *f = NULL, *c = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "term", prob == 0 ? term_robertson : term_vdp, NULL, &f));
    NBT_OK(ctx, nb_fn_create(ctx, "cond", prob == 0 ? cond_rob : cond_vdp, NULL, &c));
    nb_ode_opts o = nb_ode_opts_default();
    o.solver = (nb_ode_solver)cfg_int(self, 1);
    o.t0 = 0.0;
    o.t1 = prob == 0 ? 1e5 : 3000.0;
    o.controller = prob == 0 ? nb_ode_pid(1e-9, 1e-12) : nb_ode_pid(1e-9, 1e-9);
    o.max_steps = 20000;
    o.event = c;
    static const int falling[1] = {-1};
    o.event_direction = falling;
    o.n_event_direction = 1;
    const nb_tree *sol = nb_diffeqsolve(tr, f, nb_leaf(y0), nb_leaf(p), &o);
    nb_fn_destroy(f);
    nb_fn_destroy(c);
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    nb_tree *aux = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 3,
                              (nb_tree *[]){nb_leaf(nb_get(tr, sol, "ys")),
                                            nb_leaf(nb_get(tr, sol, "event")),
                                            nb_leaf(nb_get(tr, sol, "result"))},
                              &aux));
    nb_status st =
        nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(nb_get(tr, sol, "t_final")), aux}, out);
    nb_tree_destroy(aux);
    return st;
}

static void test_event_stiff(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const struct {
        const char *name;
        int n, np;
        double p[3], y0[3];
    } probs[2] = {{"robertson", 3, 3, {0.04, 3e7, 1e4}, {1, 0, 0}},
                  {"vdp", 2, 1, {1000.0}, {2, 0}}};
    static const int solvers[] = {NB_ODE_RODAS5P, NB_ODE_KVAERNO5, NB_ODE_ROS3P, NB_ODE_KENCARP5,
                                  NB_ODE_BDF};
    for (int pi = 0; pi < 2; pi++) {
        double tref = 0, yref[3], dp[3], dy0[3];
        const char *pn = probs[pi].name;
        if (oracle_get(pn, "t_event", &tref, 1) != 1 ||
            oracle_get(pn, "y_event", yref, 3) != probs[pi].n ||
            oracle_get(pn, "dt_dp", dp, 3) != probs[pi].np ||
            oracle_get(pn, "dt_dy0", dy0, 3) != probs[pi].n) {
            fail_msg("%s: events_ref.txt has the wrong counts", pn);
        }
        for (size_t si = 0; si < sizeof solvers / sizeof solvers[0]; si++) {
            const char *sname = nb_ode_solver_name((nb_ode_solver)solvers[si]);
            nb_tree *self = ints(ctx, 2, (int[]){pi, solvers[si]});
            nb_fn *f = NULL, *g = NULL;
            NBT_OK(ctx, nb_fn_create(ctx, "stiff_event", body_stiff, self, &f));
            nb_grad_opts go = nb_grad_opts_default();
            go.has_aux = true;
            NBT_OK(ctx, nb_value_and_grad(f, &go, &g));
            nb_array *pa = nbt_arr_f64(ctx, 1, (int64_t[]){probs[pi].np}, probs[pi].p);
            nb_array *ya = nbt_arr_f64(ctx, 1, (int64_t[]){probs[pi].n}, probs[pi].y0);
            nb_tree *lp = NULL, *ly = NULL, *out = NULL;
            NBT_OK(ctx, nb_tree_array(pa, &lp));
            NBT_OK(ctx, nb_tree_array(ya, &ly));
            nb_tree *pt = nbt_tuple_take(ctx, 2, (nb_tree *[]){lp, ly});
            nb_tree *args = nbt_tuple_take(ctx, 1, &pt);
            nb_array_destroy(pa);
            nb_array_destroy(ya);
            NBT_OK(ctx, nb_fn_call(g, args, &out));
            const nb_tree *aux = nb_tree_child(nb_tree_child(out, 0), 1);
            double t = at(nb_tree_child(nb_tree_child(out, 0), 0), 0);
            /* rtol 1e-9: the event time within 1e-6 relative (measured 6e-10..2.9e-7) */
            bool ok = close_rel(t, tref, 1e-6) && at(nb_tree_child(aux, 1), 0) == 0 &&
                      at(nb_tree_child(aux, 2), 0) == 0;
            double ymax = 0;
            for (int i = 0; i < probs[pi].n; i++) {
                ymax = nbt_max(ymax, fabs(yref[i]));
            }
            for (int i = 0; i < probs[pi].n; i++) { /* norm-wise, as the controller's atol */
                ok = ok && fabs(at(nb_tree_child(aux, 0), i) - yref[i]) <= 1e-6 * ymax;
            }
            double worst = 0;
            for (int i = 0; i < probs[pi].np; i++) {
                double d = at(nb_tree_child(nb_tree_child(out, 1), 0), i);
                worst = nbt_max(worst, fabs(d - dp[i]) / fabs(dp[i]));
            }
            for (int i = 0; i < probs[pi].n; i++) {
                double d = at(nb_tree_child(nb_tree_child(out, 1), 1), i);
                worst = nbt_max(worst, fabs(d - dy0[i]) / nbt_max(fabs(dy0[i]), 1e-3 * fabs(tref)));
            }
            /* rtol 1e-9: the gradient of the event time within 1e-6 with rodas5p (measured:
             * 3.5e-8 Robertson, 8.1e-8 VdP), 5e-4 with the lower-order or ESDIRK methods
             * (worst: ros3p on VdP, 2.1e-4) */
            if (!ok || worst > (solvers[si] == NB_ODE_RODAS5P ? 1e-6 : 5e-4)) {
                fail_msg("%s, %s: t* = %.15g (SciPy %.15g), event %g, result %g, y* = (%.10g, "
                         "%.10g), gradient worst relative error %.3g",
                         probs[pi].name, sname, t, tref, at(nb_tree_child(aux, 1), 0),
                         at(nb_tree_child(aux, 2), 0), at(nb_tree_child(aux, 0), 0),
                         at(nb_tree_child(aux, 0), 1), worst);
            }
            nb_tree_destroy(out);
            nb_tree_destroy(args);
            nb_fn_destroy(g);
            nb_fn_destroy(f);
            nb_tree_destroy(self);
        }
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- misuse ------------------------------------------------------------------------------- */

static nb_status cond_bad(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *x = nb_get(tr, args, "[1][0]");
    switch (cfg_int(self, 0)) {
    case 0: /* a vector */
        return nb_return(nb_broadcast_to(x, 1, (int64_t[]){2}), out);
    case 1: /* an i32 */
        return nb_return(nb_cast(x, NB_DTYPE_I32), out);
    default: /* an empty tuple */
        return nb_tree_tuple(nb_trace_ctx(tr), 0, NULL, out);
    }
}

/* self: (case): 0-2 the conditions above; 3 two directions for one condition; 4 direction 2;
 * 5 event_tol -1; 6 backsolve; 7 directions without an event */
static nb_status body_bad(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    int k = cfg_int(self, 0);
    nb_var *h0 = nb_get(tr, args, "[0][0]"), *g = nb_get(tr, args, "[0][1]");
    nb_fn *f = NULL, *c = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "ball", term_ball, NULL, &f));
    nb_tree *cs = ints(ctx, 1, (int[]){k});
    NBT_OK(ctx,
           nb_fn_create(ctx, k <= 2 ? "bad" : "ground", k <= 2 ? cond_bad : cond_ground, cs, &c));
    nb_tree_destroy(cs);
    nb_tree *y0 = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(h0), nb_leaf(nb_neg(h0))}, &y0));
    nb_ode_opts o = nb_ode_opts_default();
    o.controller = nb_ode_pid(1e-6, 1e-6);
    o.event = k == 7 ? NULL : c;
    static const int two[2] = {-1, -1}, bad[1] = {2};
    if (k == 3 || k == 7) {
        o.event_direction = two;
        o.n_event_direction = 2;
    } else if (k == 4) {
        o.event_direction = bad;
        o.n_event_direction = 1;
    }
    if (k == 5) {
        o.event_tol = -1;
    }
    if (k == 6 || k == 8) {
        o.adjoint.kind = k == 6 ? NB_ADJOINT_BACKSOLVE : NB_ADJOINT_INTERPOLATED;
    }
    const nb_tree *sol = nb_diffeqsolve(tr, f, y0, nb_leaf(g), &o);
    nb_tree_destroy(y0);
    nb_fn_destroy(f);
    nb_fn_destroy(c);
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    return nb_return(nb_get(tr, sol, "t_final"), out);
}

static void test_event_misuse(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const struct {
        nb_status st;
        const char *msg;
    } want[9] = {
        {NB_ERR_SHAPE, "returned f64[2] as condition 0; each condition must be a 0-d float"},
        {NB_ERR_SHAPE, "returned i32[] as condition 0"},
        {NB_ERR_SHAPE, "returned an empty tuple -- return at least one condition"},
        {NB_ERR_SHAPE, "returned 1 conditions where 2 were expected"},
        {NB_ERR_INVALID, "opts.event_direction[0] = 2 -- each must be 0"},
        {NB_ERR_INVALID, "opts.event_tol = -1 must be >= 0"},
        {NB_ERR_UNSUPPORTED, "events (opts.event) with the backsolve adjoint"},
        {NB_ERR_INVALID, "opts.event_direction is set but opts.event is NULL"},
        {NB_ERR_UNSUPPORTED, "events (opts.event) with the interpolating adjoint"},
    };
    for (int k = 0; k < 9; k++) {
        nb_tree *self = ints(ctx, 1, (int[]){k});
        nb_fn *f = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "bad", body_bad, self, &f));
        nb_tree *args = f64_args(ctx, 2, (double[]){2.0, 9.81}), *out = NULL;
        NBT_STATUS(ctx, want[k].st, nb_fn_call(f, args, &out));
        NBT_ERRMSG_HAS(ctx, want[k].msg);
        NBT_ERRMSG_HAS(ctx, "nb_diffeqsolve");
        nb_tree_destroy(args);
        nb_fn_destroy(f);
        nb_tree_destroy(self);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- allocation failures -------------------------------------------------------------------
 * Every allocation of an event solve and its gradient (the trace, the bisection loop, the
 * branches, compile, run) failing in turn: NB_ERR_OOM, nothing leaked. No NBT_OK here: every
 * status is passed on. */

static nb_status body_oom(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *h0 = nb_get(tr, args, "[0][0]"), *g = nb_get(tr, args, "[0][1]");
    nb_fn *f = NULL, *c = NULL;
    nb_tree *y0 = NULL;
    nb_status st = nb_fn_create(ctx, "ball", term_ball, NULL, &f);
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "ground", cond_ground, NULL, &c);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(
            ctx, 2, (nb_tree *[]){nb_leaf(h0), nb_leaf(nb_mul(h0, nb_scalar(tr, 0.0)))}, &y0);
    }
    const nb_tree *sol = NULL;
    if (st == NB_OK) {
        nb_ode_opts o = nb_ode_opts_default();
        o.solver = NB_ODE_RODAS5P;
        o.t1 = 10.0;
        o.controller = nb_ode_pid(1e-6, 1e-6);
        o.event = c;
        o.max_steps = 50;
        sol = nb_diffeqsolve(tr, f, y0, nb_leaf(g), &o);
    }
    nb_tree_destroy(y0);
    nb_fn_destroy(f);
    nb_fn_destroy(c);
    if (st != NB_OK) {
        return st;
    }
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    return nb_return(nb_get(tr, sol, "t_final"), out);
}

static nb_status scenario_events(nb_ctx *ctx) {
    double v[2] = {2.0, 9.81};
    nb_array *a[2] = {NULL, NULL};
    nb_tree *l[2] = {NULL, NULL}, *p = NULL, *args = NULL, *out = NULL;
    nb_fn *f = NULL, *g = NULL;
    nb_status st = NB_OK;
    for (int i = 0; i < 2 && st == NB_OK; i++) {
        st = nb_array_from_data(ctx, NB_DTYPE_F64, 0, NULL, &v[i], &a[i]);
        if (st == NB_OK) {
            st = nb_tree_array(a[i], &l[i]);
        }
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, l, &p);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 1, &p, &args);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "oom", body_oom, NULL, &f);
    }
    if (st == NB_OK) {
        st = nb_value_and_grad(f, NULL, &g);
    }
    if (st == NB_OK) {
        st = nb_fn_call(g, args, &out);
    }
    nb_tree_destroy(out);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nb_tree_destroy(args);
    nb_tree_destroy(p);
    for (int i = 0; i < 2; i++) {
        nb_tree_destroy(l[i]);
        nb_array_destroy(a[i]);
    }
    return st;
}

static void test_event_out_of_memory(void **state) {
    (void)state;
    int points = nbt_oom_sweep("scenario_events", scenario_events, false, false);
    print_message("allocation failures: %d points, each NB_ERR_OOM with nothing leaked\n", points);
    NBT_TRUE(points > 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bouncing_ball),       cmocka_unit_test(test_ball_jit),
        cmocka_unit_test(test_event_conditions),    cmocka_unit_test(test_event_backwards),
        cmocka_unit_test(test_event_stiff),         cmocka_unit_test(test_event_misuse),
        cmocka_unit_test(test_event_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
