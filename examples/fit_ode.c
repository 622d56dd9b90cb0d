/*
 * fit_ode.c -- fit an ODE to data by differentiating through its solver: a damped
 * oscillator x'' = -k x - c x' observed at 40 times with noise; k and c recovered from a
 * wrong guess by Adam on the mean squared error. Tsit5 with PID step control at 1e-8, the
 * gradient by the recursive checkpoint adjoint (nb_diffeqsolve's default, as Diffrax).
 * The train step is built by nb_train_step from the loss alone.
 */
#include <nabla/nabla.h>

#include <stdio.h>

/* Stop at the first failure with nabla's message (it names the call, the shapes, the fix). */
// clang-format off
#define CHECK(e) if ((e) != NB_OK) return fprintf(stderr, "%s\n", nb_ctx_errmsg(ctx)), 1
// clang-format on

static nb_var *at(nb_var *v, int64_t i) { /* element i as a [1] array */
    return nb_slice(v, (int64_t[]){i}, (int64_t[]){i + 1}, NULL);
}

/* dy/dt at (t, y = (x, v), p = (k, c)): (v, -k x - c v) */
static nb_status field(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *y = nb_get(tr, args, "[1]"), *p = nb_get(tr, args, "[2]");
    nb_var *acc = nb_neg(nb_add(nb_mul(at(p, 0), at(y, 0)), nb_mul(at(p, 1), at(y, 1))));
    return nb_return(nb_concatenate(2, (nb_var *[]){at(y, 1), acc}, 0), out);
}

/* the states (x, v) at t = 0.25, 0.5, ..., 10 from (1, 0) for parameters p: [40, 2] */
static nb_var *solve(nb_trace *tr, nb_var *p) {
    nb_var *one = nb_scalar_typed(tr, NB_DTYPE_F64, 1.0);
    nb_ode_opts o = nb_ode_opts_default();
    o.t1 = 10.0;
    o.controller = nb_ode_pid(1e-8, 1e-8);
    o.saveat.kind = NB_SAVEAT_TS; /* at 0.25 (i + 1), i < 40 */
    o.ts_traced = nb_mul(nb_add(nb_iota(tr, NB_DTYPE_F64, 1, (int64_t[]){40}, 0), one),
                         nb_scalar_typed(tr, NB_DTYPE_F64, 0.25));
    nb_fn *f = NULL;
    nb_fn_create(nb_trace_ctx(tr), "field", field, NULL, &f);
    nb_var *y0 = nb_sub(one, nb_iota(tr, NB_DTYPE_F64, 1, (int64_t[]){2}, 0)); /* (1, 0) */
    const nb_tree *sol = nb_diffeqsolve(tr, f, nb_leaf(y0), nb_leaf(p), &o);
    nb_fn_destroy(f);
    return sol != NULL ? nb_get(tr, sol, "ys") : NULL;
}

/* simulate((p, key)) -> the states plus noise (sd 0.02); loss((p, data)) -> the mean squared
 * error of the states against the data */
static nb_status simulate(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *e = nb_rng_normal(nb_get(tr, args, "[1]"), NB_DTYPE_F64, 2, (int64_t[]){40, 2});
    return nb_return(nb_add(solve(tr, nb_get(tr, args, "[0]")), nb_mul(e, nb_scalar(tr, 0.02))),
                     out);
}
static nb_status loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *d = nb_sub(solve(tr, nb_get(tr, args, "[0]")), nb_get(tr, args, "[1]"));
    return nb_return(nb_mean(nb_mul(d, d), NULL, 0, false), out);
}

int main(void) {
    nb_ctx *ctx = NULL;
    nb_ctx_create(NULL, &ctx);
    nb_array *truth, *guess, *key;
    nb_tree *tl, *kl, *data, *params, *opt, *state;
    nb_fn *sim, *loss_fn, *step;
    CHECK(nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){2.0, 0.3}, &truth));
    CHECK(nb_random_key(ctx, 0, &key));
    CHECK(nb_tree_array(truth, &tl));
    CHECK(nb_tree_array(key, &kl));
    CHECK(nb_fn_create(ctx, "simulate", simulate, NULL, &sim));
    CHECK(nb_train_eval(sim, tl, kl, &data)); /* the data: the true states with noise */
    CHECK(nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){1.0, 0.1}, &guess));
    CHECK(nb_tree_array(guess, &params));
    CHECK(nb_optim_adam(ctx, 0.05, NULL, &opt));
    CHECK(nb_fn_create(ctx, "loss", loss, NULL, &loss_fn));
    CHECK(nb_train_step(loss_fn, opt, NULL, &step));
    CHECK(nb_train_init(step, params, &state));
    double l = 0.0, k = 0.0, c = 0.0;
    for (int i = 1; i <= 300; i++) {
        CHECK(nb_train_run(step, &params, &state, data, &l, NULL));
        if (i % 100 == 0) {
            printf("step %3d  loss %.6e\n", i, l);
        }
    }
    CHECK(nb_array_get_flat(nb_tree_get_array(params), 0, &k));
    CHECK(nb_array_get_flat(nb_tree_get_array(params), 1, &c));
    printf("k %.4f (true 2)  c %.4f (true 0.3)\nbits %a %a %a\n", k, c, k, c, l);
    nb_ctx_destroy(ctx); /* releases every array, tree and function made in it */
    return 0;
}
