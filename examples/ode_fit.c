/*
 * ode_fit.c -- fit the parameters of an ODE to data by differentiating through its solver.
 *
 * The Lotka-Volterra (predator-prey) equations
 *
 *     dx/dt = a x - b x y,        dy/dt = -c y + d x y,        x(0) = y(0) = 1
 *
 * are solved with a = 1.5, b = 1, c = 3, d = 1 and saved at t = 0.5, 1.0, ..., 10; Gaussian
 * noise (standard deviation 0.05) is added, and then a, b, c and d are recovered from a
 * wrong guess by Adam on the mean squared error between a solve and the data. Gradients go
 * through the adaptive solver (Tsit5 with a PID step-size controller) by recursive
 * checkpointing, the default adjoint of nb_diffeqsolve, as in Diffrax.
 *
 * The whole train step -- solve, loss, gradient, Adam, update -- is one jitted function,
 * compiled on the first call and reused for every later one. A fuller version with options
 * is `nabla ode` (tools/ode.c).
 *
 * Build: the examples/ directory of the nabla tree builds it as `ode_fit`; elsewhere,
 *     cc -std=c17 ode_fit.c -lnabla -lm
 */
#include <nabla/nabla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Stop on the first failure, with nabla's message (it names the op, the shapes and the fix). */
#define CHECK(ctx, expr)                                                                           \
    do {                                                                                           \
        nb_status st_ = (expr);                                                                    \
        if (st_ != NB_OK) {                                                                        \
            fprintf(stderr, "%s failed: %s\n  %s\n", #expr, nb_status_name(st_),                   \
                    nb_ctx_errmsg(ctx));                                                           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { N_OBS = 20 }; /* observations at t = 0.5, 1.0, ..., 10 */
static const char *const names[4] = {"a", "b", "c", "d"};

/* The vector field. nb_diffeqsolve calls it on the tuple (t, y, args): here y is the state
 * dict(x, y) and args the parameters dict(a, b, c, d). It returns dy/dt with y's structure. */
static nb_status lotka_volterra(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[1].x"), *y = nb_get(tr, args, "[1].y");
    nb_var *a = nb_get(tr, args, "[2].a"), *b = nb_get(tr, args, "[2].b");
    nb_var *c = nb_get(tr, args, "[2].c"), *d = nb_get(tr, args, "[2].d");
    nb_var *dx = nb_sub(nb_mul(a, x), nb_mul(nb_mul(b, x), y));
    nb_var *dy = nb_sub(nb_mul(nb_mul(d, x), y), nb_mul(c, y));
    return nb_tree_dict(nb_trace_ctx(tr), 2, (const char *[]){"x", "y"},
                        (nb_tree *[]){nb_leaf(dx), nb_leaf(dy)}, out);
}

/* Solve from t = 0 to 10 with the given parameters (a tree of vars), saving at the
 * observation times. Returns the solution dict (ts, ys, result, stats), owned by the trace. */
static const nb_tree *solve(nb_trace *tr, const nb_tree *params, nb_ode_solver solver, double tol) {
    double ts[N_OBS];
    for (int i = 0; i < N_OBS; i++) {
        ts[i] = 0.5 * (i + 1);
    }
    nb_ode_opts o = nb_ode_opts_default();
    o.solver = solver;
    o.t0 = 0.0;
    o.t1 = 10.0;
    o.dt0 = 0.0; /* pick the first step automatically */
    o.controller = nb_ode_pid(tol, tol);
    o.saveat.kind = NB_SAVEAT_TS;
    o.saveat.ts = ts; /* copied: the array may go out of scope */
    o.saveat.n_ts = N_OBS;

    nb_fn *term = NULL;
    nb_tree *y0 = NULL;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *one_x = nb_scalar_typed(tr, NB_DTYPE_F64, 1.0);
    nb_var *one_y = nb_scalar_typed(tr, NB_DTYPE_F64, 1.0);
    if (nb_fn_create(ctx, "lotka_volterra", lotka_volterra, NULL, &term) != NB_OK ||
        nb_tree_dict(ctx, 2, (const char *[]){"x", "y"},
                     (nb_tree *[]){nb_leaf(one_x), nb_leaf(one_y)}, &y0) != NB_OK) {
        nb_fn_destroy(term);
        return NULL;
    }
    const nb_tree *sol = nb_diffeqsolve(tr, term, y0, params, &o);
    nb_tree_destroy(y0);
    nb_fn_destroy(term);
    return sol;
}

/* simulate(params) -> dict(x, y): an accurate solve (Dormand-Prince 8 at 1e-10), for data. */
static nb_status simulate(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *sol = solve(tr, nb_tree_child(args, 0), NB_ODE_DOPRI8, 1e-10);
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)nb_tree_get(sol, "ys"));
    return nb_trace_status(tr);
}

/* loss(params, data) -> mean squared error over both species and all times (Tsit5 at 1e-6).
 * nb_value_and_grad differentiates it with respect to its first argument, params. */
static nb_status loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *sol = solve(tr, nb_tree_child(args, 0), NB_ODE_TSIT5, 1e-6);
    if (sol == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *ex = nb_sub(nb_get(tr, sol, "ys.x"), nb_get(tr, args, "[1].x"));
    nb_var *ey = nb_sub(nb_get(tr, sol, "ys.y"), nb_get(tr, args, "[1].y"));
    nb_var *sum =
        nb_add(nb_mean(nb_square(ex), NULL, 0, false), nb_mean(nb_square(ey), NULL, 0, false));
    return nb_return(nb_mul(sum, nb_scalar(tr, 0.5)), out);
}

/* dict(a, b, c, d) of f64 scalars: the parameters as a pytree. */
static nb_tree *make_params(nb_ctx *ctx, const double v[4]) {
    nb_tree *leaves[4], *params = NULL;
    for (int i = 0; i < 4; i++) {
        nb_array *s = NULL;
        CHECK(ctx, nb_array_scalar(ctx, NB_DTYPE_F64, v[i], &s));
        CHECK(ctx, nb_tree_array(s, &leaves[i]));
        nb_array_destroy(s); /* the leaf holds its own reference */
    }
    CHECK(ctx, nb_tree_dict(ctx, 4, names, leaves, &params));
    for (int i = 0; i < 4; i++) {
        nb_tree_destroy(leaves[i]);
    }
    return params;
}

static double get(const nb_tree *t, const char *key) {
    double v = NAN;
    nb_array_get_flat(nb_tree_get_array(nb_tree_get(t, key)), 0, &v);
    return v;
}

int main(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(NULL, &ctx) != NB_OK) {
        return 1;
    }

    /* 1. Data: the true solution at 20 times, plus noise from a Threefry key (seed 0). */
    const double truth[4] = {1.5, 1.0, 3.0, 1.0};
    nb_tree *true_params = make_params(ctx, truth), *sim_args = NULL, *data = NULL;
    CHECK(ctx, nb_tree_tuple(ctx, 1, &true_params, &sim_args));
    CHECK(ctx, nb_eval(ctx, simulate, NULL, sim_args, &data)); /* dict(x, y): arrays of ours */
    nb_array *key = NULL, *noise = NULL;
    CHECK(ctx, nb_random_key(ctx, 0, &key));
    CHECK(ctx, nb_random_normal(key, NB_DTYPE_F64, 1, (int64_t[]){2 * N_OBS}, &noise));
    const double *eps = nb_array_data(noise);
    double *xs = nb_array_data(nb_tree_get_array(nb_tree_get(data, "x")));
    double *ys = nb_array_data(nb_tree_get_array(nb_tree_get(data, "y")));
    for (int i = 0; i < N_OBS; i++) {
        xs[i] += 0.05 * eps[i];
        ys[i] += 0.05 * eps[N_OBS + i];
    }

    /* 2. The model: a wrong guess and Adam. */
    nb_tree *params = make_params(ctx, (const double[]){1.2, 0.8, 2.5, 0.8});
    nb_tree *adam = NULL, *state = NULL;
    CHECK(ctx, nb_optim_adam(ctx, 0.05, NULL, &adam));

    /* 3. The train step: solve, loss, gradient, Adam and the update, jitted as one function
     * (nb_train_step), with Adam's state shaped like the gradients (nb_train_init).
     * max_traces 1 makes a second trace an error (it would mean the arguments changed shape
     * or structure). */
    nb_fn *loss_fn = NULL, *step = NULL;
    CHECK(ctx, nb_fn_create(ctx, "loss", loss, NULL, &loss_fn));
    nb_train_opts to = nb_train_opts_default();
    to.jit.max_traces = 1;
    CHECK(ctx, nb_train_step(loss_fn, adam, &to, &step));
    CHECK(ctx, nb_train_init(step, params, &state));

    /* 4. Train: each call replaces params and state by the new ones (donated: updated in
     * place); the loss is called as loss((params, data)). */
    for (int i = 1; i <= 500; i++) {
        double l = NAN;
        CHECK(ctx, nb_train_run(step, &params, &state, data, &l, NULL));
        if (i == 1 || i % 50 == 0) {
            printf("step %3d  loss %.3e  a %.4f  b %.4f  c %.4f  d %.4f\n", i, l, get(params, "a"),
                   get(params, "b"), get(params, "c"), get(params, "d"));
        }
    }

    /* 5. Report: the fit is as close as 40 noisy points allow (the loss is at sigma^2). */
    printf("\n      true    fitted\n");
    for (int i = 0; i < 4; i++) {
        double fit = get(params, names[i]);
        printf("  %s  %.3f  %8.4f  (%+.2f%%)\n", names[i], truth[i], fit,
               100.0 * (fit - truth[i]) / truth[i]);
    }
    nb_fn_stats stats;
    CHECK(ctx, nb_fn_stats_get(step, &stats));
    printf("the train step was traced %lld time(s) for %lld calls\n", (long long)stats.n_traces,
           (long long)stats.n_calls);

    nb_fn_destroy(step);
    nb_fn_destroy(loss_fn);
    nb_tree *trees[] = {true_params, sim_args, data, params, adam, state};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_array_destroy(noise);
    nb_array_destroy(key);
    nb_ctx_destroy(ctx);
    return 0;
}
