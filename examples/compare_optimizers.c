/*
 * compare_optimizers.c -- compare optimizers programmatically: the same MLP on the UCI wine
 * data (13 features, 3 classes), the same initial parameters and the same minibatches, trained
 * with each of sgd (with and without momentum), rmsprop, adam, adamw and lion at a few
 * learning rates; a table of the final training loss and the test accuracy. Every number is
 * the same on every run (`nabla bench` does this at scale, with plots and resumable runs).
 */
#include <nabla/nabla.h>

#include <stdio.h>

/* Stop at the first failure with nabla's message (it names the call, the shapes, the fix). */
// clang-format off
#define CHECK(e) if ((e) != NB_OK) return fprintf(stderr, "%s\n", nb_ctx_errmsg(ctx)), 1
// clang-format on

/* logits((params, x)) and loss((params, x, y)): the mean cross-entropy */
static nb_status logits(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_nn_mlp(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]")), out);
}
static nb_status loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *z = nb_nn_mlp(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]"));
    nb_var *y = nb_one_hot(nb_get(tr, args, "[2]"), 3, NB_DTYPE_F32);
    nb_var *ll = nb_sum(nb_mul(nb_log_softmax(z, -1), y), (int[]){-1}, 1, false);
    return nb_return(nb_neg(nb_mean(ll, NULL, 0, false)), out);
}

/* optimizer i at learning rate lr (and its name) */
static nb_status make_opt(nb_ctx *ctx, int i, double lr, const char **name, nb_tree **opt) {
    nb_optim_opts o = nb_optim_opts_default();
    static const char *const names[] = {"sgd", "sgd+momentum", "rmsprop", "adam", "adamw", "lion"};
    *name = names[i];
    o.momentum = i == 1 ? 0.9 : o.momentum;
    o.weight_decay = i == 4 ? 1e-2 : o.weight_decay;
    return i <= 1   ? nb_optim_sgd(ctx, lr, &o, opt)
           : i == 2 ? nb_optim_rmsprop(ctx, lr, &o, opt)
           : i == 3 ? nb_optim_adam(ctx, lr, &o, opt)
           : i == 4 ? nb_optim_adamw(ctx, lr, &o, opt)
                    : nb_optim_lion(ctx, lr, &o, opt);
}

int main(int argc, char **argv) {
    nb_ctx *ctx = NULL;
    nb_ctx_create(NULL, &ctx);
    nb_array *x, *y, *key, *k[3], *xtr, *ytr, *xte, *yte, *xb, *yb;
    nb_tree *init, *xbl, *ybl, *batch, *test;
    nb_fn *loss_fn, *logits_fn;
    CHECK(nb_csv_load(ctx, argc > 1 ? argv[1] : "data/wine_data.csv", NULL, &x, &y));
    CHECK(nb_random_key(ctx, 0, &key));
    CHECK(nb_random_split_keys(key, 3, k)); /* split, init, shuffling */
    CHECK(nb_data_split(x, y, k[0], 0.25, &xtr, &ytr, &xte, &yte));
    CHECK(nb_data_standardize(xtr, xte, NULL, NULL));
    CHECK(nb_nn_mlp_init(ctx, 13, 3, 32, 1, NULL, NB_DTYPE_F32, k[1], &init));
    CHECK(nb_fn_create(ctx, "loss", loss, NULL, &loss_fn));
    CHECK(nb_fn_create(ctx, "logits", logits, NULL, &logits_fn));
    CHECK(nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){16, 13}, &xb));
    CHECK(nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){16}, &yb));
    CHECK(nb_tree_array(xb, &xbl));
    CHECK(nb_tree_array(yb, &ybl));
    CHECK(nb_tree_tuple(ctx, 2, (nb_tree *[]){xbl, ybl}, &batch));
    CHECK(nb_tree_array(xte, &test));
    printf("%-13s %8s %12s %9s\n", "optimizer", "lr", "train loss", "test acc");
    for (int i = 0; i < 6; i++) {
        for (double lr = 1e-3; lr < 0.2; lr *= 10) {
            const char *name = NULL;
            nb_tree *opt, *params = nb_tree_retain(init), *state, *z;
            nb_fn *step;
            nb_batcher *batches; /* the same batches for every optimizer: the same key */
            nb_array *pred;
            CHECK(make_opt(ctx, i, lr, &name, &opt));
            nb_train_opts to = nb_train_opts_default();
            to.donate = false; /* params start from init each time: keep init's arrays */
            CHECK(nb_train_step(loss_fn, opt, &to, &step));
            CHECK(nb_train_init(step, params, &state));
            CHECK(nb_batcher_create(xtr, ytr, k[2], 16, NULL, &batches));
            double l = 0.0;
            for (int64_t e = 0, rows = 0; e < 30; e++) {
                CHECK(nb_batcher_epoch(batches, e));
                while (nb_batcher_next(batches, xb, yb, &rows) == NB_OK && rows > 0) {
                    CHECK(nb_train_run(step, &params, &state, batch, &l, NULL));
                }
            }
            int64_t correct = 0;
            CHECK(nb_train_eval(logits_fn, params, test, &z));
            CHECK(nb_array_argmax(nb_tree_get_array(z), -1, &pred));
            CHECK(nb_array_count_equal(pred, yte, &correct));
            printf("%-13s %8.0e %12.6f %4lld / %lld\n", name, lr, l + 0.0, (long long)correct,
                   (long long)nb_array_dim(yte, 0));
            nb_tree *done[] = {opt, params, state, z};
            for (int j = 0; j < 4; j++) {
                nb_tree_destroy(done[j]);
            }
            nb_fn_destroy(step);
            nb_batcher_destroy(batches);
            nb_array_destroy(pred);
        }
    }
    nb_ctx_destroy(ctx); /* releases every array, tree and function still alive in it */
    return 0;
}
