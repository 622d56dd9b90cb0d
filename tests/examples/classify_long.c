/*
 * classify_long.c -- examples/classify.c written without nabla/train.h, the eager views
 * and the eager reductions: the step by hand (value_and_grad, nb_optim_update,
 * nb_apply_updates in a body, jitted, called with params and state donated), the keys
 * copied out of nb_random_split's array, the accuracy as a traced function. The test
 * (test_examples) runs both and requires the same output, and the same checkpoint file
 * byte for byte: the short program is this one, not an approximation of it.
 * Usage: classify_long IRIS_CSV CHECKPOINT
 */
#include <nabla/nabla.h>

#include <stdio.h>

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        if ((expr) != NB_OK) {                                                                     \
            fprintf(stderr, "classify_long: %s\n", nb_ctx_errmsg(ctx));                            \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* loss((params, x, y)) */
static nb_status loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *z = nb_nn_mlp(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]"));
    nb_var *y = nb_one_hot(nb_get(tr, args, "[2]"), 3, NB_DTYPE_F32);
    nb_var *ll = nb_sum(nb_mul(nb_log_softmax(z, -1), y), (int[]){-1}, 1, false);
    return nb_return(nb_neg(nb_mean(ll, NULL, 0, false)), out);
}

/* step((params, state, x, y)) -> (params, state, loss); self = the optimizer */
static nb_fn *g_vg;
static nb_status step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    const nb_tree *params = nb_tree_child(args, 0), *state = nb_tree_child(args, 1);
    nb_tree *la = NULL;
    nb_status st = nb_tree_tuple(
        ctx, 3, (const nb_tree *[]){params, nb_tree_child(args, 2), nb_tree_child(args, 3)}, &la);
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

/* correct((params, x, y)): rows whose argmax is the label */
static nb_status correct_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    nb_var *z = nb_nn_mlp(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]"));
    nb_var *y = nb_cast(nb_get(tr, args, "[2]"), NB_DTYPE_I64);
    return nb_return(
        nb_sum(nb_cast(nb_eq(nb_argmax(z, -1, false), y), NB_DTYPE_I32), NULL, 0, false), out);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: classify_long IRIS_CSV CHECKPOINT\n");
        return 2;
    }
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(NULL, &ctx) != NB_OK) {
        return 1;
    }
    nb_array *x = NULL, *y = NULL, *key = NULL, *keys = NULL, *k[3] = {NULL}, *xtr = NULL,
             *ytr = NULL, *xte = NULL, *yte = NULL, *xb = NULL, *yb = NULL;
    nb_tree *params = NULL, *opt = NULL, *tmpl = NULL, *state = NULL, *xbl = NULL, *ybl = NULL,
            *t = NULL, *f = NULL, *donate = NULL, *xtl = NULL, *ytl = NULL;
    nb_fn *loss_fn = NULL, *step_fn = NULL, *step_jit = NULL, *corr = NULL;
    nb_batcher *batches = NULL;
    CHECK(nb_csv_load(ctx, argv[1], NULL, &x, &y));
    CHECK(nb_random_key(ctx, 0, &key));
    CHECK(nb_random_split(key, 3, &keys));
    const int32_t *kw = nb_array_data(keys);
    for (int i = 0; i < 3; i++) {
        CHECK(nb_array_from_data(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, kw + 2 * i, &k[i]));
    }
    CHECK(nb_data_split(x, y, k[0], 0.2, &xtr, &ytr, &xte, &yte));
    CHECK(nb_data_standardize(xtr, xte, NULL, NULL));
    CHECK(nb_nn_mlp_init(ctx, 4, 3, 32, 2, NULL, NB_DTYPE_F32, k[1], &params));
    CHECK(nb_optim_adam(ctx, 1e-2, NULL, &opt));
    CHECK(nb_grad_template(params, NULL, &tmpl));
    CHECK(nb_optim_init(opt, tmpl, &state));
    CHECK(nb_fn_create(ctx, "loss", loss, NULL, &loss_fn));
    CHECK(nb_value_and_grad(loss_fn, NULL, &g_vg));
    CHECK(nb_fn_create(ctx, "train_step", step, opt, &step_fn));
    CHECK(nb_jit(step_fn, NULL, &step_jit));
    CHECK(nb_tree_bool(ctx, true, &t));
    CHECK(nb_tree_bool(ctx, false, &f));
    CHECK(nb_tree_tuple(ctx, 4, (nb_tree *[]){t, t, f, f}, &donate));
    nb_call_opts call = nb_call_opts_default();
    call.donate = donate;
    CHECK(nb_batcher_create(xtr, ytr, k[2], 16, NULL, &batches));
    CHECK(nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){16, 4}, &xb));
    CHECK(nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){16}, &yb));
    CHECK(nb_tree_array(xb, &xbl));
    CHECK(nb_tree_array(yb, &ybl));
    double l = 0.0;
    for (int64_t e = 0, rows = 0; e < 40; e++) {
        CHECK(nb_batcher_epoch(batches, e));
        while (nb_batcher_next(batches, xb, yb, &rows) == NB_OK && rows > 0) {
            nb_tree *args = NULL, *res = NULL;
            CHECK(nb_tree_tuple(ctx, 4, (nb_tree *[]){params, state, xbl, ybl}, &args));
            CHECK(nb_fn_call_ex(step_jit, args, &call, &res));
            nb_tree_destroy(args);
            nb_tree_destroy(params);
            nb_tree_destroy(state);
            params = nb_tree_retain((nb_tree *)nb_tree_child(res, 0));
            state = nb_tree_retain((nb_tree *)nb_tree_child(res, 1));
            CHECK(nb_array_get_flat(nb_tree_get_array(nb_tree_child(res, 2)), 0, &l));
            nb_tree_destroy(res);
        }
        if (e % 10 == 9) {
            printf("epoch %2lld  loss %.6f\n", (long long)e + 1, l);
        }
    }
    CHECK(nb_tree_array(xte, &xtl));
    CHECK(nb_tree_array(yte, &ytl));
    nb_tree *eargs = NULL, *res = NULL;
    CHECK(nb_tree_tuple(ctx, 3, (nb_tree *[]){params, xtl, ytl}, &eargs));
    CHECK(nb_fn_create(ctx, "correct", correct_body, NULL, &corr));
    CHECK(nb_fn_call(corr, eargs, &res));
    double c = 0;
    CHECK(nb_array_get_flat(nb_tree_get_array(res), 0, &c));
    printf("test accuracy %lld of %lld\n", (long long)c, (long long)nb_array_dim(yte, 0));
    CHECK(nb_checkpoint_save(argv[2], params, state, key, 40));
    printf("final loss %a\n", l);
    nb_tree_destroy(res);
    nb_tree_destroy(eargs);
    nb_fn_destroy(g_vg);
    nb_ctx_destroy(ctx);
    return 0;
}
