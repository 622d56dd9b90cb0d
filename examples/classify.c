/*
 * classify.c -- train a classifier on a shipped data set: an MLP on the UCI iris flowers,
 * a train/test split, standardised features, shuffled minibatches, Adam, the test accuracy,
 * and a checkpoint of the run. Every number it prints is the same on every run.
 *
 * The train step (loss, gradient, Adam, update; jitted, parameters donated) is built by
 * nb_train_step from the loss alone. Usage: classify [IRIS_CSV] [CHECKPOINT]
 * (defaults: data/iris.csv, classify.safetensors).
 */
#include <nabla/nabla.h>

#include <stdio.h>

/* Stop at the first failure with nabla's message (it names the call, the shapes, the fix). */
// clang-format off
#define CHECK(e) if ((e) != NB_OK) return fprintf(stderr, "%s\n", nb_ctx_errmsg(ctx)), 1
// clang-format on

/* logits((params, x)) */
static nb_status logits(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_nn_mlp(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]")), out);
}

/* loss((params, x, y)): the mean cross-entropy of the logits against the labels y */
static nb_status loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *z = nb_nn_mlp(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]"));
    nb_var *y = nb_one_hot(nb_get(tr, args, "[2]"), 3, NB_DTYPE_F32);
    nb_var *ll = nb_sum(nb_mul(nb_log_softmax(z, -1), y), (int[]){-1}, 1, false);
    return nb_return(nb_neg(nb_mean(ll, NULL, 0, false)), out);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "data/iris.csv";
    nb_ctx *ctx = NULL;
    nb_ctx_create(NULL, &ctx);
    nb_array *x, *y, *key, *k[3], *xtr, *ytr, *xte, *yte, *xb, *yb, *pred;
    nb_tree *params, *opt, *state, *xbl, *ybl, *batch, *test, *z;
    nb_fn *loss_fn, *logits_fn, *step;
    nb_batcher *batches;
    CHECK(nb_csv_load(ctx, path, NULL, &x, &y));
    CHECK(nb_random_key(ctx, 0, &key));
    CHECK(nb_random_split_keys(key, 3, k)); /* split, init, shuffling */
    CHECK(nb_data_split(x, y, k[0], 0.2, &xtr, &ytr, &xte, &yte));
    CHECK(nb_data_standardize(xtr, xte, NULL, NULL));
    CHECK(nb_nn_mlp_init(ctx, 4, 3, 32, 2, NULL, NB_DTYPE_F32, k[1], &params));
    CHECK(nb_optim_adam(ctx, 1e-2, NULL, &opt));
    CHECK(nb_fn_create(ctx, "loss", loss, NULL, &loss_fn));
    CHECK(nb_train_step(loss_fn, opt, NULL, &step));
    CHECK(nb_train_init(step, params, &state));
    CHECK(nb_batcher_create(xtr, ytr, k[2], 16, NULL, &batches));
    CHECK(nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){16, 4}, &xb));
    CHECK(nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){16}, &yb));
    CHECK(nb_tree_array(xb, &xbl));
    CHECK(nb_tree_array(yb, &ybl));
    CHECK(nb_tree_tuple(ctx, 2, (nb_tree *[]){xbl, ybl}, &batch));
    double l = 0.0;
    for (int64_t e = 0, rows = 0; e < 40; e++) {
        CHECK(nb_batcher_epoch(batches, e));
        while (nb_batcher_next(batches, xb, yb, &rows) == NB_OK && rows > 0) {
            CHECK(nb_train_run(step, &params, &state, batch, &l, NULL));
        }
        if (e % 10 == 9) {
            printf("epoch %2lld  loss %.6f\n", (long long)e + 1, l);
        }
    }
    CHECK(nb_tree_array(xte, &test));
    CHECK(nb_fn_create(ctx, "logits", logits, NULL, &logits_fn));
    CHECK(nb_train_eval(logits_fn, params, test, &z));
    int64_t correct = 0;
    CHECK(nb_array_argmax(nb_tree_get_array(z), -1, &pred));
    CHECK(nb_array_count_equal(pred, yte, &correct));
    printf("test accuracy %lld of %lld\n", (long long)correct, (long long)nb_array_dim(yte, 0));
    CHECK(nb_checkpoint_save(argc > 2 ? argv[2] : "classify.safetensors", params, state, key, 40));
    printf("final loss %a\n", l);
    nb_ctx_destroy(ctx); /* releases every array, tree and function made in it */
    return 0;
}
