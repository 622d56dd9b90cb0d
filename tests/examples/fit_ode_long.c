/*
 * fit_ode_long.c -- examples/fit_ode.c written without nabla/train.h: the step by hand
 * (value_and_grad, nb_optim_update, nb_apply_updates in a body, jitted, called with params and
 * state donated), the state from the gradient template, the data by nb_fn_call on an
 * argument tuple. test_examples requires the same output as the short program.
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

/* step((params, state, data)) -> (params, state, loss); self = the optimizer */
static nb_fn *g_vg;
static nb_status step_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    const nb_tree *params = nb_tree_child(args, 0), *state = nb_tree_child(args, 1);
    nb_tree *la = NULL;
    nb_status st = nb_tree_tuple(ctx, 2, (const nb_tree *[]){params, nb_tree_child(args, 2)}, &la);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *vg = nb_apply(tr, g_vg, la);
    nb_tree_destroy(la);
    if (vg == NULL) {
        return nb_trace_status(tr);
    }
    const nb_tree *updates = NULL, *new_state = NULL;
    st = nb_optim_update(tr, self, nb_tree_child(vg, 1), state, params, &updates, &new_state);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *new_params = nb_apply_updates(tr, params, updates);
    if (new_params == NULL) {
        return nb_trace_status(tr);
    }
    return nb_tree_tuple(ctx, 3, (const nb_tree *[]){new_params, new_state, nb_tree_child(vg, 0)},
                         out);
}

int main(void) {
    nb_ctx *ctx = NULL;
    nb_ctx_create(NULL, &ctx);
    nb_array *truth, *guess, *key;
    nb_tree *tl, *kl, *sargs, *data, *params, *opt, *state, *tmpl, *t, *f, *donate;
    nb_fn *sim, *loss_fn, *step, *jstep;
    CHECK(nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){2.0, 0.3}, &truth));
    CHECK(nb_random_key(ctx, 0, &key));
    CHECK(nb_tree_array(truth, &tl));
    CHECK(nb_tree_array(key, &kl));
    CHECK(nb_fn_create(ctx, "simulate", simulate, NULL, &sim));
    CHECK(nb_tree_tuple(ctx, 2, (nb_tree *[]){tl, kl}, &sargs));
    CHECK(nb_fn_call(sim, sargs, &data)); /* the data: the true states with noise */
    CHECK(nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){1.0, 0.1}, &guess));
    CHECK(nb_tree_array(guess, &params));
    CHECK(nb_optim_adam(ctx, 0.05, NULL, &opt));
    CHECK(nb_fn_create(ctx, "loss", loss, NULL, &loss_fn));
    CHECK(nb_value_and_grad(loss_fn, NULL, &g_vg));
    CHECK(nb_fn_create(ctx, "train_step", step_body, opt, &step));
    CHECK(nb_jit(step, NULL, &jstep));
    CHECK(nb_grad_template(params, NULL, &tmpl));
    CHECK(nb_optim_init(opt, tmpl, &state));
    CHECK(nb_tree_bool(ctx, true, &t));
    CHECK(nb_tree_bool(ctx, false, &f));
    CHECK(nb_tree_tuple(ctx, 3, (nb_tree *[]){t, t, f}, &donate));
    nb_call_opts call = nb_call_opts_default();
    call.donate = donate;
    double l = 0.0, k = 0.0, c = 0.0;
    for (int i = 1; i <= 300; i++) {
        nb_tree *args = NULL, *res = NULL;
        CHECK(nb_tree_tuple(ctx, 3, (nb_tree *[]){params, state, data}, &args));
        CHECK(nb_fn_call_ex(jstep, args, &call, &res));
        nb_tree_destroy(args);
        nb_tree_destroy(params);
        nb_tree_destroy(state);
        params = nb_tree_retain((nb_tree *)nb_tree_child(res, 0));
        state = nb_tree_retain((nb_tree *)nb_tree_child(res, 1));
        CHECK(nb_array_get_flat(nb_tree_get_array(nb_tree_child(res, 2)), 0, &l));
        nb_tree_destroy(res);
        if (i % 100 == 0) {
            printf("step %3d  loss %.6e\n", i, l);
        }
    }
    CHECK(nb_array_get_flat(nb_tree_get_array(params), 0, &k));
    CHECK(nb_array_get_flat(nb_tree_get_array(params), 1, &c));
    printf("k %.4f (true 2)  c %.4f (true 0.3)\nbits %a %a %a\n", k, c, k, c, l);
    nb_fn_destroy(g_vg);
    nb_ctx_destroy(ctx);
    return 0;
}
