/*
 * ode.c -- `nabla ode`: fit the four parameters of the Lotka-Volterra equations
 *
 *     dx/dt = a x - b x y,        dy/dt = -c y + d x y,        x(0) = y(0) = 1,
 *
 * to noisy observations, by differentiating through an adaptive ODE solve (nabla/ode.h) and
 * stepping Adam (nabla/optim.h). The observations come from the true parameters a = 1.5,
 * b = 1, c = 3, d = 1: an accurate solve (dopri8 at rtol = atol = 1e-10) saved at
 * t_i = 10 i / n, i = 1 .. n (n = 20 by default: t = 0.5, 1.0, ..., 10), plus independent
 * Gaussian noise of *absolute* standard deviation sigma (--noise, default 0.05) on both
 * species, drawn from the Threefry key of --seed. Absolute noise makes the mean squared
 * error the maximum-likelihood objective, and the MSE at the true parameters is then about
 * sigma^2: the floor the fit cannot go below.
 *
 * The loss is the MSE between the model's solve (tsit5 with a PID controller at
 * rtol = atol = 1e-6 by default, the same save times) and the observations. Its gradient
 * goes through the solve by recursive checkpointing (Diffrax's default adjoint) or, with
 * --adjoint direct, by storing every step; both give the gradient of the discrete solve,
 * the same bits. Loss, gradient, Adam and the parameter update are one jitted function whose
 * parameters and optimizer state are donated; it may be traced once only (nb_max_traces), so
 * a retrace would be an error, not a slowdown. The same seed gives the same output, bit for
 * bit, on any thread count.
 *
 * On a terminal a progress bar shows step, loss, the current parameters and an ETA;
 * otherwise (a pipe, a log file) one plain line every few steps. At the end: the fitted
 * parameters next to the true ones with relative errors, the loss at the fitted and at the
 * true parameters, the steps and wall time, and the number of traces of the train step.
 */
#include "cli.h"
#include "commands.h"

#include <nabla/nabla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ODE_NPARAM = 4, ODE_MAX_POINTS = 10000 };

static const char *const ode_param_names[ODE_NPARAM] = {"a", "b", "c", "d"};
static const double ode_truth[ODE_NPARAM] = {1.5, 1.0, 3.0, 1.0};
static const double ode_t_end = 10.0; /* the last observation time */

typedef struct ode_opts {
    int64_t steps, points, max_steps;
    double lr, noise, rtol, atol;
    double init[ODE_NPARAM];
    uint64_t seed;
    nb_ode_solver solver;
    nb_ode_adjoint_kind adjoint;
    int threads;
    int progress; /* -1 auto (a terminal), 0 plain lines, 1 bar */
} ode_opts;

/* On a failed call: "nabla ode: <doing>: <the library's message>", then to `done`; `doing` is
 * a local string naming the step under way in plain words. */
#define OCHECK(ctx, expr)                                                                          \
    do {                                                                                           \
        nb_status ocheck_st_ = (expr);                                                             \
        if (ocheck_st_ != NB_OK) {                                                                 \
            cli_fail("ode", ctx, ocheck_st_, "%s", doing);                                         \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* ---- the model (traced once per function) ------------------------------------------- */

/* The vector field: args = (t, state dict(x, y), params dict(a, b, c, d)). */
static nb_status ode_lv_term(nb_trace *tr, const nb_tree *self, const nb_tree *args,
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

static double ode_cfg_get(const nb_tree *cfg, const char *key) {
    double v = 0;
    nb_tree_get_float(nb_tree_get(cfg, key), &v);
    return v;
}

/* The solve of the LV system with params (a var tree) under cfg, a dict of static numbers:
 * solver, adjoint, rtol, atol, points, max_steps. The solution dict is owned by the trace (NULL
 * after a sticky error). */
static const nb_tree *ode_lv_solve(nb_trace *tr, const nb_tree *cfg, const nb_tree *params) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    int64_t n = (int64_t)ode_cfg_get(cfg, "points");
    double *ts = malloc((size_t)n * sizeof *ts);
    nb_fn *term = NULL;
    nb_tree *y0 = NULL;
    nb_status st =
        ts == NULL ? NB_ERR_OOM : nb_fn_create(ctx, "lotka_volterra", ode_lv_term, NULL, &term);
    if (st == NB_OK) {
        nb_var *x0 = nb_scalar_typed(tr, NB_DTYPE_F64, 1.0);
        nb_var *y0v = nb_scalar_typed(tr, NB_DTYPE_F64, 1.0);
        st = nb_tree_dict(ctx, 2, (const char *[]){"x", "y"},
                          (nb_tree *[]){nb_leaf(x0), nb_leaf(y0v)}, &y0);
    }
    const nb_tree *sol = NULL;
    if (st == NB_OK) {
        for (int64_t i = 0; i < n; i++) {
            ts[i] = ode_t_end * (double)(i + 1) / (double)n;
        }
        nb_ode_opts o = nb_ode_opts_default();
        o.solver = (nb_ode_solver)ode_cfg_get(cfg, "solver");
        o.t0 = 0.0;
        o.t1 = ode_t_end;
        o.dt0 = 0.0; /* the first step is picked automatically */
        o.controller = nb_ode_pid(ode_cfg_get(cfg, "rtol"), ode_cfg_get(cfg, "atol"));
        o.saveat.kind = NB_SAVEAT_TS;
        o.saveat.ts = ts; /* copied into the trace */
        o.saveat.n_ts = n;
        o.adjoint.kind = (nb_ode_adjoint_kind)ode_cfg_get(cfg, "adjoint");
        o.max_steps = (int64_t)ode_cfg_get(cfg, "max_steps");
        sol = nb_diffeqsolve(tr, term, y0, params, &o);
    } else {
        nb_trace_fail(tr, st, "ode: cannot set up the solve");
    }
    nb_tree_destroy(y0);
    nb_fn_destroy(term);
    free(ts);
    return sol;
}

/* truth(params) -> dict(x, y) of f64[points]: the solution at the observation times. */
static nb_status ode_truth_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    const nb_tree *sol = ode_lv_solve(tr, self, nb_tree_child(args, 0));
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)nb_tree_get(sol, "ys"));
    return nb_trace_status(tr);
}

/* loss(params, obs) -> (mse, (result, num_steps)): the mean squared error over both species
 * and every observation time, with the solve's result code and step count as aux. */
static nb_status ode_loss_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    const nb_tree *sol = ode_lv_solve(tr, self, nb_tree_child(args, 0));
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *rx = nb_sub(nb_get(tr, sol, "ys.x"), nb_get(tr, args, "[1].x"));
    nb_var *ry = nb_sub(nb_get(tr, sol, "ys.y"), nb_get(tr, args, "[1].y"));
    nb_var *mse = nb_mul(
        nb_add(nb_mean(nb_square(rx), NULL, 0, false), nb_mean(nb_square(ry), NULL, 0, false)),
        nb_scalar(tr, 0.5));
    nb_tree *aux = NULL;
    nb_status st =
        nb_tree_tuple(ctx, 2,
                      (const nb_tree *[]){nb_tree_get(sol, "result"),
                                          nb_tree_get(nb_tree_get(sol, "stats"), "num_steps")},
                      &aux);
    if (st != NB_OK) {
        return st;
    }
    st = nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(mse), aux}, out);
    nb_tree_destroy(aux);
    return st;
}

/* step(params, state, obs) -> (params, state, loss, result, num_steps);
 * self = dict(opt = the optimizer, cfg = the solve's settings). */
static nb_status ode_step_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    const nb_tree *opt = nb_tree_get(self, "opt");
    const nb_tree *params = nb_tree_child(args, 0), *state = nb_tree_child(args, 1);
    nb_fn *loss = NULL, *vg = NULL;
    nb_tree *largs = NULL;
    nb_grad_opts go = nb_grad_opts_default();
    go.has_aux = true;
    nb_status st = nb_fn_create(ctx, "lv_loss", ode_loss_body, nb_tree_get(self, "cfg"), &loss);
    if (st == NB_OK) {
        st = nb_value_and_grad(loss, &go, &vg);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (const nb_tree *[]){params, nb_tree_child(args, 2)}, &largs);
    }
    const nb_tree *res = st == NB_OK ? nb_apply(tr, vg, largs) : NULL; /* ((loss, aux), grads) */
    nb_tree_destroy(largs);
    nb_fn_destroy(vg);
    nb_fn_destroy(loss);
    if (res == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    const nb_tree *updates = NULL, *new_state = NULL;
    st = nb_optim_update(tr, opt, nb_tree_child(res, 1), state, params, &updates, &new_state);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *new_params = nb_apply_updates(tr, params, updates);
    if (new_params == NULL) {
        return nb_trace_status(tr);
    }
    const nb_tree *value = nb_tree_child(res, 0), *aux = nb_tree_child(value, 1);
    return nb_tree_tuple(ctx, 5,
                         (const nb_tree *[]){new_params, new_state, nb_tree_child(value, 0),
                                             nb_tree_child(aux, 0), nb_tree_child(aux, 1)},
                         out);
}

/* ---- options ------------------------------------------------------------------------ */

static void ode_usage(FILE *f) {
    fprintf(f,
            "usage: nabla ode [options]\n\n"
            "Fit the Lotka-Volterra parameters (a, b, c, d) of\n"
            "    dx/dt = a x - b x y,  dy/dt = -c y + d x y,  x(0) = y(0) = 1\n"
            "to noisy observations made from a = 1.5, b = 1, c = 3, d = 1, by Adam on the mean\n"
            "squared error, with gradients through an adaptive ODE solve. Observations: an\n"
            "accurate solve (dopri8, rtol = atol = 1e-10) at t_i = 10 i/n, i = 1..n, plus\n"
            "Gaussian noise of absolute standard deviation --noise. One jitted, donated train\n"
            "step, traced once; same seed, same bits on any thread count.\n\n"
            "options:\n"
            "  --steps N         Adam steps (default 500)\n"
            "  --lr X            Adam's learning rate (default 0.05)\n"
            "  --init A,B,C,D    the starting guess (default 1.2,0.8,2.5,0.8)\n"
            "  --seed N          the Threefry seed of the observation noise (default 0)\n"
            "  --noise X         the noise's standard deviation, absolute (default 0.05)\n"
            "  --points N        observation times in (0, 10] (default 20: 0.5, 1.0, ..., 10)\n"
            "  --solver NAME     the fit's solver: heun, midpoint, ralston, bosh3, dopri5, tsit5\n"
            "                    or dopri8 (default tsit5; euler and rk4 have no error estimate),\n"
            "                    or a stiff one: rodas5p, kvaerno5, ... (nabla/ode.h)\n"
            "  --adjoint KIND    checkpoint (recursive checkpointing) or direct (every step\n"
            "                    stored); the same gradient (default checkpoint)\n"
            "  --rtol X          the fit's relative tolerance (default 1e-6)\n"
            "  --atol X          the fit's absolute tolerance (default: --rtol)\n"
            "  --max-steps N     the most steps one solve may try (default 4096, Diffrax's)\n"
            "  --threads N       kernel threads, 0 = all cores, at most 256 (default 0; results\n"
            "                    are the same for any count)\n"
            "  --progress MODE   bar, lines or auto (bar on a terminal; default auto)\n");
}

/* --init A,B,C,D: four numbers in (0, 1000), each read whole by cli_parse_f64. */
static int ode_parse_init(const char *s, double init[ODE_NPARAM]) {
    const char *p = s;
    double v[ODE_NPARAM];
    for (int i = 0; i < ODE_NPARAM; i++) {
        const char *comma = strchr(p, ',');
        size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        char item[64];
        const char *why = NULL;
        bool last = i + 1 == ODE_NPARAM;
        if (last != (comma == NULL)) {
            why = "not four comma-separated numbers";
        } else if (len >= sizeof item) {
            why = "an overlong number";
        } else {
            memcpy(item, p, len);
            item[len] = '\0';
            if (cli_parse_f64(item, &v[i], &why) && !(v[i] > 0 && v[i] < 1e3)) {
                why = "each must be > 0 and < 1000";
            }
        }
        if (why != NULL) {
            fprintf(stderr,
                    "nabla ode: --init wants four positive numbers a,b,c,d (each < 1000), "
                    "got '%s' (%s)\n",
                    s, why);
            return 2;
        }
        p = comma != NULL ? comma + 1 : p + len;
    }
    memcpy(init, v, sizeof v);
    return 0;
}

static int ode_parse_solver(const char *s, nb_ode_solver *out) {
    for (int k = NB_ODE_EULER; k <= NB_ODE_BDF; k++) {
        if (strcmp(s, nb_ode_solver_name((nb_ode_solver)k)) != 0) {
            continue;
        }
        if (k == NB_ODE_EULER || k == NB_ODE_RK4) {
            fprintf(stderr,
                    "nabla ode: --solver %s has no error estimate, and the fit uses adaptive "
                    "steps: pick heun, midpoint, ralston, bosh3, dopri5, tsit5, dopri8, or a "
                    "stiff solver (kvaerno5, rodas5p, ...)\n",
                    s);
            return 2;
        }
        *out = (nb_ode_solver)k;
        return 0;
    }
    fprintf(stderr,
            "nabla ode: unknown solver '%s' (--solver wants heun, midpoint, ralston, bosh3, "
            "dopri5, tsit5, dopri8, or stiff: ros3p, rodas5p, rosenbrock23, implicit_euler, "
            "kvaerno3, kvaerno4, kvaerno5, kencarp3, kencarp4, kencarp5, bdf)\n",
            s);
    return 2;
}

static int ode_parse_args(int argc, char **argv, ode_opts *o) {
    o->steps = 500;
    o->points = 20;
    o->max_steps = 4096;
    o->lr = 0.05;
    o->noise = 0.05;
    o->rtol = 1e-6;
    o->atol = -1; /* = rtol */
    o->init[0] = 1.2;
    o->init[1] = 0.8;
    o->init[2] = 2.5;
    o->init[3] = 0.8;
    o->seed = 0;
    o->solver = NB_ODE_TSIT5;
    o->adjoint = NB_ADJOINT_RECURSIVE_CHECKPOINT;
    o->threads = 0;
    o->progress = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            ode_usage(stdout);
            return -1;
        }
        if (strncmp(a, "--", 2) != 0 || i + 1 >= argc) {
            fprintf(stderr, "nabla ode: unknown option or missing value: '%s'\n", a);
            ode_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        int64_t n = 0;
        int rc = 0;
        if (strcmp(a, "--steps") == 0) {
            rc = cli_i64("ode", a, v, 1, INT64_C(100000000), &o->steps);
        } else if (strcmp(a, "--points") == 0) {
            rc = cli_i64("ode", a, v, 1, ODE_MAX_POINTS, &o->points);
        } else if (strcmp(a, "--max-steps") == 0) {
            rc = cli_i64("ode", a, v, 1, INT64_C(1000000), &o->max_steps);
        } else if (strcmp(a, "--lr") == 0) {
            rc = cli_f64("ode", a, v, 0.0, 10.0, true, true, &o->lr);
        } else if (strcmp(a, "--noise") == 0) {
            rc = cli_f64("ode", a, v, 0.0, 10.0, false, true, &o->noise);
        } else if (strcmp(a, "--rtol") == 0) {
            rc = cli_f64("ode", a, v, 0.0, 1.0, true, true, &o->rtol);
        } else if (strcmp(a, "--atol") == 0) {
            rc = cli_f64("ode", a, v, 0.0, 1.0, true, true, &o->atol);
        } else if (strcmp(a, "--init") == 0) {
            rc = ode_parse_init(v, o->init);
        } else if (strcmp(a, "--seed") == 0) {
            rc = cli_i64("ode", a, v, 0, INT64_MAX, &n);
            o->seed = (uint64_t)n;
        } else if (strcmp(a, "--solver") == 0) {
            rc = ode_parse_solver(v, &o->solver);
        } else if (strcmp(a, "--adjoint") == 0) {
            if (strcmp(v, "checkpoint") == 0) {
                o->adjoint = NB_ADJOINT_RECURSIVE_CHECKPOINT;
            } else if (strcmp(v, "direct") == 0) {
                o->adjoint = NB_ADJOINT_DIRECT;
            } else if (strcmp(v, "backsolve") == 0 || strcmp(v, "interpolating") == 0) {
                fprintf(stderr,
                        "nabla ode: --adjoint %s is not offered: it saves at t1 only, and the "
                        "fit saves at every observation time (use checkpoint or direct)\n",
                        v);
                rc = 2;
            } else {
                fprintf(stderr, "nabla ode: --adjoint wants checkpoint or direct, got '%s'\n", v);
                rc = 2;
            }
        } else if (strcmp(a, "--threads") == 0) {
            rc = cli_i64("ode", a, v, 0, 256, &n);
            o->threads = (int)n;
        } else if (strcmp(a, "--progress") == 0) {
            rc = cli_progress_mode("ode", v, &o->progress);
        } else {
            fprintf(stderr, "nabla ode: unknown option '%s'\n", a);
            ode_usage(stderr);
            rc = 2;
        }
        if (rc != 0) {
            return rc;
        }
    }
    if (o->atol < 0) {
        o->atol = o->rtol;
    }
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------ */

/* dict(a, b, c, d) of new f64 0-d arrays. */
static nb_status ode_params_new(nb_ctx *ctx, const double v[ODE_NPARAM], nb_tree **out) {
    nb_tree *items[ODE_NPARAM] = {0};
    nb_status st = NB_OK;
    for (int i = 0; i < ODE_NPARAM && st == NB_OK; i++) {
        nb_array *a = NULL;
        st = nb_array_scalar(ctx, NB_DTYPE_F64, v[i], &a);
        if (st == NB_OK) {
            st = nb_tree_array(a, &items[i]);
        }
        nb_array_destroy(a);
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, ODE_NPARAM, ode_param_names, items, out);
    }
    for (int i = 0; i < ODE_NPARAM; i++) {
        nb_tree_destroy(items[i]);
    }
    return st;
}

static double ode_scalar(const nb_tree *t) {
    double v = NAN;
    const nb_array *a = nb_tree_get_array(t);
    if (a == NULL || nb_array_get_flat(a, 0, &v) != NB_OK) {
        return NAN;
    }
    return v;
}

static void ode_params_read(const nb_tree *params, double v[ODE_NPARAM]) {
    for (int i = 0; i < ODE_NPARAM; i++) {
        v[i] = ode_scalar(nb_tree_get(params, ode_param_names[i]));
    }
}

/* cfg: the solve's static settings (part of the cache key). */
static nb_status ode_cfg_new(nb_ctx *ctx, nb_ode_solver solver, nb_ode_adjoint_kind adjoint,
                             double rtol, double atol, int64_t points, int64_t max_steps,
                             nb_tree **out) {
    enum { N_CFG = 6 };
    static const char *const keys[N_CFG] = {"solver", "adjoint", "rtol",
                                            "atol",   "points",  "max_steps"};
    double v[N_CFG] = {(double)solver, (double)adjoint, rtol,
                       atol,           (double)points,  (double)max_steps};
    nb_tree *items[N_CFG] = {0};
    nb_status st = NB_OK;
    for (int i = 0; i < N_CFG && st == NB_OK; i++) {
        st = nb_tree_float(ctx, v[i], &items[i]);
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, N_CFG, keys, items, out);
    }
    for (int i = 0; i < N_CFG; i++) {
        nb_tree_destroy(items[i]);
    }
    return st;
}

/* ---- the command -------------------------------------------------------------------- */

int nabla_cmd_ode(int argc, char **argv) {
    ode_opts o;
    int prc = ode_parse_args(argc, argv, &o);
    if (prc != 0) {
        return prc < 0 ? 0 : prc;
    }
    nb_ctx_opts co = nb_ctx_opts_default();
    co.n_threads = o.threads;
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(&co, &ctx) != NB_OK) {
        fprintf(stderr, "nabla ode: cannot create a context\n");
        return 1;
    }
    int rc = 1;
    int64_t n = o.points;
    nb_array *key = NULL, *noise = NULL;
    nb_tree *truth = NULL, *params = NULL, *cfg_obs = NULL, *cfg_fit = NULL, *self = NULL,
            *obs = NULL, *targs = NULL, *opt = NULL, *tmpl = NULL, *state = NULL, *donate = NULL,
            *t_true = NULL, *t_false = NULL, *largs = NULL, *lres = NULL;
    nb_fn *truth_fn = NULL, *loss_fn = NULL, *step_fn = NULL, *step_once = NULL, *step_jit = NULL;

    /* observations: the accurate solve at the true parameters, plus noise */
    const char *doing = "cannot make the observations";
    OCHECK(ctx, ode_params_new(ctx, ode_truth, &truth));
    OCHECK(ctx, ode_cfg_new(ctx, NB_ODE_DOPRI8, NB_ADJOINT_RECURSIVE_CHECKPOINT, 1e-10, 1e-10, n,
                            65536, &cfg_obs));
    OCHECK(ctx, nb_fn_create(ctx, "lv_truth", ode_truth_body, cfg_obs, &truth_fn));
    OCHECK(ctx, nb_tree_tuple(ctx, 1, &truth, &targs));
    OCHECK(ctx, nb_fn_call(truth_fn, targs, &obs)); /* dict(x, y): new arrays, ours to edit */
    OCHECK(ctx, nb_random_key(ctx, o.seed, &key));
    OCHECK(ctx, nb_random_normal(key, NB_DTYPE_F64, 2, (int64_t[]){2, n}, &noise));
    const double *eps = nb_array_data(noise);
    for (int s = 0; s < 2; s++) {
        double *y = nb_array_data(nb_tree_get_array(nb_tree_get(obs, s == 0 ? "x" : "y")));
        for (int64_t i = 0; i < n; i++) {
            y[i] += o.noise * eps[s * n + i];
        }
    }

    /* the fit: parameters, Adam, and the jitted step that may be traced once only */
    doing = "cannot set up the fit";
    OCHECK(ctx, ode_params_new(ctx, o.init, &params));
    OCHECK(ctx, ode_cfg_new(ctx, o.solver, o.adjoint, o.rtol, o.atol, n, o.max_steps, &cfg_fit));
    OCHECK(ctx, nb_optim_adam(ctx, o.lr, NULL, &opt));
    OCHECK(ctx, nb_grad_template(params, NULL, &tmpl));
    OCHECK(ctx, nb_optim_init(opt, tmpl, &state));
    OCHECK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"opt", "cfg"}, (nb_tree *[]){opt, cfg_fit},
                             &self));
    OCHECK(ctx, nb_fn_create(ctx, "lv_train_step", ode_step_body, self, &step_fn));
    OCHECK(ctx, nb_max_traces(step_fn, 1, &step_once)); /* a retrace would be a bug */
    OCHECK(ctx, nb_jit(step_once, NULL, &step_jit));
    OCHECK(ctx, nb_tree_bool(ctx, true, &t_true));
    OCHECK(ctx, nb_tree_bool(ctx, false, &t_false));
    OCHECK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){t_true, t_true, t_false}, &donate));
    nb_call_opts call = nb_call_opts_default();
    call.donate = donate;

    printf("nabla ode: Lotka-Volterra dx/dt = a x - b x y, dy/dt = -c y + d x y, x0 = y0 = 1\n");
    printf("  %lld observations at t = %g .. %g of each species, Gaussian noise sigma %g "
           "(absolute), seed %llu\n",
           (long long)n, ode_t_end / (double)n, ode_t_end, o.noise, (unsigned long long)o.seed);
    printf("  fit: %s, PID rtol %g atol %g, adjoint %s; Adam lr %g, %lld steps; %d thread%s\n",
           nb_ode_solver_name(o.solver), o.rtol, o.atol,
           o.adjoint == NB_ADJOINT_DIRECT ? "direct" : "recursive checkpoint", o.lr,
           (long long)o.steps, nb_ctx_n_threads(ctx), nb_ctx_n_threads(ctx) == 1 ? "" : "s");
    printf("  start: a %.4f b %.4f c %.4f d %.4f\n", o.init[0], o.init[1], o.init[2], o.init[3]);
    fflush(stdout);

    int64_t every = o.steps / 20 > 0 ? o.steps / 20 : 1;
    cli_progress prog;
    cli_progress_start(&prog, o.progress, o.steps);
    prog.width = 12;
    double t0 = prog.t0, loss = NAN, p[ODE_NPARAM];
    memcpy(p, o.init, sizeof p);
    int64_t solver_steps = 0;
    doing = "the fit failed";
    for (int64_t s = 1; s <= o.steps; s++) {
        nb_tree *args = NULL, *res = NULL;
        double at[ODE_NPARAM]; /* the parameters this step's loss is evaluated at */
        memcpy(at, p, sizeof at);
        OCHECK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){params, state, obs}, &args));
        nb_status st = nb_fn_call_ex(step_jit, args, &call, &res);
        nb_tree_destroy(args);
        OCHECK(ctx, st);
        nb_tree_destroy(params);
        nb_tree_destroy(state);
        params = nb_tree_retain((nb_tree *)nb_tree_child(res, 0));
        state = nb_tree_retain((nb_tree *)nb_tree_child(res, 1));
        loss = ode_scalar(nb_tree_child(res, 2)); /* at the parameters before this update */
        int result = (int)ode_scalar(nb_tree_child(res, 3));
        solver_steps = (int64_t)ode_scalar(nb_tree_child(res, 4));
        nb_tree_destroy(res);
        ode_params_read(params, p);
        if (result != NB_ODE_SUCCESSFUL || !isfinite(loss)) {
            cli_progress_end(&prog);
            fprintf(stderr,
                    "nabla ode: the solve failed at step %lld (%s, loss %g) with a %.6g b %.6g "
                    "c %.6g d %.6g; %s\n",
                    (long long)s, nb_ode_result_string(result), loss, at[0], at[1], at[2], at[3],
                    result == NB_ODE_MAX_STEPS_REACHED
                        ? "raise --max-steps, loosen --rtol or pick a higher-order --solver"
                        : "try a smaller --lr or a guess closer to the data");
            goto done;
        }
        if (prog.bar) {
            cli_progress_update(&prog, s,
                                "step %lld/%lld  loss %.3e  a %.3f b %.3f c %.3f d %.3f  %.0f/s",
                                (long long)s, (long long)o.steps, loss, p[0], p[1], p[2], p[3],
                                (double)s / (cli_now_s() - t0));
        } else if (s == 1 || s % every == 0 || s == o.steps) { /* a pipe or a log file */
            cli_progress_line(&prog, "  step %5lld/%lld  loss %.6e  a %.6f b %.6f c %.6f d %.6f",
                              (long long)s, (long long)o.steps, loss, p[0], p[1], p[2], p[3]);
        }
    }
    double elapsed = cli_now_s() - t0;
    cli_progress_end(&prog);

    /* the loss at the fitted and at the true parameters (the noise floor), by one more
     * compile of the loss alone */
    double loss_fit = NAN, loss_true = NAN;
    doing = "cannot evaluate the loss";
    OCHECK(ctx, nb_fn_create(ctx, "lv_loss", ode_loss_body, cfg_fit, &loss_fn));
    for (int k = 0; k < 2; k++) {
        OCHECK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){k == 0 ? params : truth, obs}, &largs));
        OCHECK(ctx, nb_fn_call(loss_fn, largs, &lres));
        *(k == 0 ? &loss_fit : &loss_true) = ode_scalar(nb_tree_child(lres, 0));
        nb_tree_destroy(lres);
        nb_tree_destroy(largs);
        lres = largs = NULL;
    }
    nb_fn_stats stats;
    OCHECK(ctx, nb_fn_stats_get(step_jit, &stats));

    printf("fitted parameters (true, fitted, relative error):\n");
    double worst = 0;
    for (int i = 0; i < ODE_NPARAM; i++) {
        double rel = (p[i] - ode_truth[i]) / ode_truth[i];
        worst = fmax(worst, fabs(rel));
        printf("  %s  %8.4f  %10.6f  %+8.3f%%\n", ode_param_names[i], ode_truth[i], p[i],
               100.0 * rel);
    }
    printf("max relative error: %.3f%%\n", 100.0 * worst);
    printf("loss: %.6e at the fitted parameters, %.6e at the true ones (noise floor ~ sigma^2 = "
           "%.3g)\n",
           loss_fit, loss_true, o.noise * o.noise);
    printf("  %lld steps in %.2f s (%.0f steps/s); the last solve took %lld solver steps\n",
           (long long)o.steps, elapsed, (double)o.steps / elapsed, (long long)solver_steps);
    printf("train step traces: %lld (calls %lld, cache hits %lld)\n", (long long)stats.n_traces,
           (long long)stats.n_calls, (long long)stats.n_hits);
    uint64_t bits = 0;
    memcpy(&bits, &loss_fit, sizeof bits);
    printf("final loss: %.17g (bits 0x%016llx)\n", loss_fit, (unsigned long long)bits);
    rc = 0;
done:
    nb_fn_destroy(loss_fn);
    nb_fn_destroy(step_jit);
    nb_fn_destroy(step_once);
    nb_fn_destroy(step_fn);
    nb_fn_destroy(truth_fn);
    nb_tree *trees[] = {truth, params, cfg_obs, cfg_fit, self,    obs,   targs, opt,
                        tmpl,  state,  donate,  t_true,  t_false, largs, lres};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_array_destroy(noise);
    nb_array_destroy(key);
    nb_ctx_destroy(ctx);
    return rc;
}
