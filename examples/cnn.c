/*
 * cnn.c -- a convolutional network on the UCI 8x8 handwritten digits: two 3x3
 * convolutions, max pooling and two Linears in one Sequential (a user-defined "flatten"
 * activation between the pooling and the Linears, as Equinox's Lambda), Adam, shuffled
 * minibatches of 64, the test accuracy on 359 held-out digits. The same numbers on every
 * run and for any thread count (NABLA_THREADS=1 or 2). Usage: cnn [DIGITS_CSV_GZ] [EPOCHS]
 * (defaults: data/digits.csv.gz, 30).
 */
#include <nabla/nabla.h>

#include <stdio.h>
#include <stdlib.h>

/* Stop at the first failure with nabla's message (it names the call, the shapes, the fix). */
// clang-format off
#define CHECK(e) if ((e) != NB_OK) return fprintf(stderr, "%s\n", nb_ctx_errmsg(ctx)), 1
// clang-format on

static nb_var *flatten(nb_var *x) {
    return nb_reshape(x, 2, (int64_t[]){nb_var_dim(x, 0), -1});
}

/* logits((model, x [B, 64])): the pixels (0..16) scaled to [0, 1] as [B, 1, 8, 8] images */
static nb_status logits(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_div(nb_get(tr, args, "[1]"), nb_scalar(tr, 16.0));
    x = nb_reshape(x, 4, (int64_t[]){-1, 1, 8, 8});
    return nb_return(nb_nn_apply(tr, nb_tree_child(args, 0), x, NULL), out);
}

/* loss((model, x, y)): the mean cross-entropy of the logits against the labels */
static nb_status loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_tree *z = NULL;
    nb_status st = logits(tr, self, args, &z);
    nb_var *y = nb_one_hot(nb_get(tr, args, "[2]"), 10, NB_DTYPE_F32);
    nb_var *ll = nb_sum(nb_mul(nb_log_softmax(nb_var_of(tr, z), -1), y), (int[]){-1}, 1, false);
    nb_tree_destroy(z);
    return st != NB_OK ? st : nb_return(nb_neg(nb_mean(ll, NULL, 0, false)), out);
}

int main(int argc, char **argv) {
    nb_ctx *ctx = NULL;
    nb_ctx_create(NULL, &ctx);
    nb_array *x, *y, *key, *k[5], *xtr, *ytr, *xte, *yte, *xb, *yb, *pred;
    nb_tree *l[9], *model, *opt, *state, *batch, *test, *z;
    nb_fn *loss_fn, *logits_fn, *step;
    nb_batcher *batches;
    CHECK(nb_csv_load(ctx, argc > 1 ? argv[1] : "data/digits.csv.gz", NULL, &x, &y));
    CHECK(nb_random_key(ctx, 0, &key));
    CHECK(nb_random_split_keys(key, 5, k)); /* split, conv1, conv2, fc1 + fc2, shuffling */
    CHECK(nb_data_split(x, y, k[0], 0.2, &xtr, &ytr, &xte, &yte));
    nb_nn_conv_opts same = nb_nn_conv_opts_default();
    same.padding_kind = NB_NN_PAD_SAME;
    nb_nn_pool_opts p2 = nb_nn_pool_opts_default();
    p2.stride[0] = p2.stride[1] = 2;
    CHECK(nb_nn_conv_init(ctx, 2, 1, 16, (int64_t[]){3, 3}, &same, NB_DTYPE_F32, k[1], &l[0]));
    CHECK(nb_nn_activation_leaf(ctx, nb_relu, NULL, &l[1]));
    CHECK(nb_nn_conv_init(ctx, 2, 16, 32, (int64_t[]){3, 3}, &same, NB_DTYPE_F32, k[2], &l[2]));
    l[3] = l[1];
    CHECK(nb_nn_max_pool_init(ctx, 2, (int64_t[]){2, 2}, &p2, &l[4])); /* [B, 32, 4, 4] */
    CHECK(nb_nn_activation_leaf(ctx, flatten, "flatten", &l[5]));
    CHECK(nb_nn_mlp_init(ctx, 512, 10, 64, 1, NULL, NB_DTYPE_F32, k[3], &l[6]));
    CHECK(nb_nn_sequential_init(ctx, 7, l, &model));
    CHECK(nb_optim_adam(ctx, 2e-3, NULL, &opt));
    CHECK(nb_fn_create(ctx, "loss", loss, NULL, &loss_fn));
    CHECK(nb_train_step(loss_fn, opt, NULL, &step));
    CHECK(nb_train_init(step, model, &state));
    CHECK(nb_batcher_create(xtr, ytr, k[4], 64, NULL, &batches));
    CHECK(nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){64, 64}, &xb));
    CHECK(nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){64}, &yb));
    CHECK(nb_tree_array(xb, &l[7]));
    CHECK(nb_tree_array(yb, &l[8]));
    CHECK(nb_tree_tuple(ctx, 2, &l[7], &batch));
    double v = 0.0;
    for (int64_t e = 0, rows = 0, epochs = argc > 2 ? atoi(argv[2]) : 30; e < epochs; e++) {
        CHECK(nb_batcher_epoch(batches, e));
        while (nb_batcher_next(batches, xb, yb, &rows) == NB_OK && rows > 0) {
            CHECK(nb_train_run(step, &model, &state, batch, &v, NULL));
        }
        if (e % 10 == 9) {
            printf("epoch %2lld  loss %.6f\n", (long long)e + 1, v);
        }
    }
    CHECK(nb_tree_array(xte, &test));
    CHECK(nb_fn_create(ctx, "logits", logits, NULL, &logits_fn));
    CHECK(nb_train_eval(logits_fn, model, test, &z));
    int64_t correct = 0;
    CHECK(nb_array_argmax(nb_tree_get_array(z), -1, &pred));
    CHECK(nb_array_count_equal(pred, yte, &correct));
    printf("test accuracy %lld of %lld\n", (long long)correct, (long long)nb_array_dim(yte, 0));
    printf("final loss %a\n", v);
    nb_ctx_destroy(ctx); /* releases every array, tree and function made in it */
    return 0;
}
