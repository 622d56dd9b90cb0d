/*
 * rnn.c -- a tiny recurrent network trained with nb_scan: 32 sine waves of random phase
 * and frequency, each step's hidden state h = tanh(cell([x, h])) predicting the next value
 * through out(h); the initial state h0 is a frozen leaf (filter spec: no gradient, no
 * update, no optimizer state); the optimizer is chain(clip_by_global_norm(1), adam with a
 * warmup + cosine learning-rate schedule). The scan is checkpointed, so reverse mode runs
 * through it in bounded memory.
 */
#include <nabla/nabla.h>

#include <math.h>
#include <stdio.h>

/* Stop at the first failure with nabla's message (it names the call, the shapes, the fix). */
// clang-format off
#define CHECK(e) if ((e) != NB_OK) return fprintf(stderr, "%s\n", nb_ctx_errmsg(ctx)), 1
// clang-format on

enum { T = 24, B = 32, H = 8 };

/* one step: self = the params; ((h [B,H], x [B,1])) -> (h', prediction [B,1]) */
static nb_status cell(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *h = nb_get(tr, args, "[0]"), *x = nb_get(tr, args, "[1]");
    h = nb_tanh(
        nb_nn_linear(tr, nb_tree_get(self, "cell"), nb_concatenate(2, (nb_var *[]){x, h}, 1)));
    nb_tree *y = nb_leaf(nb_nn_linear(tr, nb_tree_get(self, "out"), h));
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(h), y}, out);
}

/* loss((params, xs [T,B,1])): mean squared error of each step's prediction of the next x */
static nb_status loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_fn *f = NULL;
    nb_fn_create(nb_trace_ctx(tr), "cell", cell, nb_tree_child(args, 0), &f);
    nb_var *xs = nb_get(tr, args, "[1]");
    nb_var *h0 = nb_broadcast_to(nb_get(tr, args, "[0].h0"), 2, (int64_t[]){B, H});
    const nb_tree *r = nb_scan(tr, f, nb_leaf(h0), nb_leaf(xs), T,
                               &(nb_loop_opts){.kind = NB_LOOP_CHECKPOINTED}); /* else defaults */
    nb_fn_destroy(f);
    nb_var *ys = nb_get(tr, r, "[1]"),
           *d = nb_sub(nb_slice(ys, (int64_t[]){0, 0, 0}, (int64_t[]){T - 1, B, 1}, NULL),
                       nb_slice(xs, (int64_t[]){1, 0, 0}, (int64_t[]){T, B, 1}, NULL));
    return nb_return(nb_mean(nb_mul(d, d), NULL, 0, false), out);
}

int main(void) {
    nb_ctx *ctx = NULL;
    nb_ctx_create(NULL, &ctx);
    float wave[T * B]; /* wave b at step t: sin(0.3 (1 + b mod 4) t + 0.7 b) */
    for (int i = 0; i < T * B; i++) {
        wave[i] = (float)sin(0.3 * (1 + i % B % 4) * (i / B) + 0.7 * (i % B));
    }
    nb_array *xs, *key, *k[2], *h0;
    nb_tree *data, *l[3], *params, *tt, *ff, *spec, *sched, *parts[2], *opt, *state;
    nb_fn *loss_fn, *step;
    CHECK(nb_array_from_data(ctx, NB_DTYPE_F32, 3, (int64_t[]){T, B, 1}, wave, &xs));
    CHECK(nb_tree_array(xs, &data));
    CHECK(nb_random_key(ctx, 0, &key));
    CHECK(nb_random_split_keys(key, 2, k));
    CHECK(nb_nn_linear_init(ctx, 1 + H, H, true, NB_DTYPE_F32, k[0], &l[0]));
    CHECK(nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){H}, &h0));
    CHECK(nb_tree_array(h0, &l[1]));
    CHECK(nb_nn_linear_init(ctx, H, 1, true, NB_DTYPE_F32, k[1], &l[2]));
    CHECK(nb_tree_dict(ctx, 3, (const char *[]){"cell", "h0", "out"}, l, &params));
    CHECK(nb_tree_bool(ctx, true, &tt));
    CHECK(nb_tree_bool(ctx, false, &ff));
    CHECK(nb_tree_dict(ctx, 3, (const char *[]){"cell", "h0", "out"}, (nb_tree *[]){tt, ff, tt},
                       &spec));
    CHECK(nb_schedule_warmup_cosine_decay(ctx, 0.0, 0.05, 20, 300, 1e-3, 1.0, &sched));
    nb_optim_opts oo = nb_optim_opts_default();
    oo.schedule = sched;
    CHECK(nb_optim_clip_by_global_norm(ctx, 1.0, &parts[0]));
    CHECK(nb_optim_adam(ctx, 0.0, &oo, &parts[1]));
    CHECK(nb_optim_chain(ctx, 2, parts, &opt));
    CHECK(nb_fn_create(ctx, "loss", loss, NULL, &loss_fn));
    nb_train_opts to = nb_train_opts_default();
    to.filter_spec = spec;
    CHECK(nb_train_step(loss_fn, opt, &to, &step));
    CHECK(nb_train_init(step, params, &state));
    double v = 0.0;
    for (int i = 0; i < 300; i++) {
        CHECK(nb_train_run(step, &params, &state, data, &v, NULL));
    }
    printf("loss after 300 steps %.6e (bits %a)\n", v, v);
    nb_ctx_destroy(ctx); /* releases every array, tree and function made in it */
    return 0;
}
