/*
 * char_rnn.c -- a character-level language model on Tiny Shakespeare (data/README.md): an
 * Embedding, two GRU cells run over 64 characters by nb_scan (every step stored for reverse mode),
 * a Linear to the next character's logits; Adam with gradient clipping on random windows of the
 * first 90% of the text (drawn inside the step from a per-step key); the loss on windows of the
 * last 10% in bits per character. The same numbers on every run and for any thread count. Usage:
 * char_rnn [TEXT] [STEPS]  (defaults: data/tinyshakespeare.txt.gz, 300)
 */
#include <nabla/nabla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Stop at the first failure with nabla's message (it names the call, the shapes, the fix). */
// clang-format off
#define CHECK(e) if ((e) != NB_OK) return fprintf(stderr, "%s\n", nb_ctx_errmsg(ctx)), 1
// clang-format on

enum { B = 32, T = 64, E = 32, H = 128 };

/* one character: self = the params; (((h1, h2), x [B, E])) -> ((h1', h2'), h2') */
static nb_status cell(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *h1 = nb_get(tr, args, "[0][0]"), *h2 = nb_get(tr, args, "[0][1]");
    h1 = nb_nn_gru_cell(tr, nb_tree_get(self, "gru1"), nb_get(tr, args, "[1]"), h1);
    h2 = nb_nn_gru_cell(tr, nb_tree_get(self, "gru2"), h1, h2);
    nb_tree *carry = NULL;
    nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(h1), nb_leaf(h2)}, &carry);
    nb_status st = nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){carry, nb_leaf(h2)}, out);
    nb_tree_destroy(carry);
    return st;
}

/* loss((params, codes i32[n], key)): mean cross-entropy (nats) of B random windows */
static nb_status loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *p = nb_tree_child(args, 0);
    nb_var *codes = nb_get(tr, args, "[1]"), *key = nb_get(tr, args, "[2]");
    nb_var *u = nb_rng_uniform(key, NB_DTYPE_F32, 2, (int64_t[]){B, 1}, 0.0, 1.0);
    nb_var *off = nb_cast(nb_mul(u, nb_scalar(tr, (double)(nb_var_dim(codes, 0) - T - 1))),
                          NB_DTYPE_I32); /* window starts */
    nb_var *w = nb_take(codes, nb_add(off, nb_iota(tr, NB_DTYPE_I32, 2, (int64_t[]){B, T + 1}, 1)),
                        0); /* [B, T + 1] */
    nb_var *in = nb_slice(w, (int64_t[]){0, 0}, (int64_t[]){B, T}, NULL);
    nb_var *tgt = nb_transpose(nb_slice(w, (int64_t[]){0, 1}, (int64_t[]){B, T + 1}, NULL), NULL);
    nb_var *xs = nb_transpose(nb_nn_embedding(tr, nb_tree_get(p, "emb"), in), (int[]){1, 0, 2});
    nb_var *h0 = nb_full(tr, NB_DTYPE_F32, 2, (int64_t[]){B, H}, 0.0);
    nb_tree *carry = NULL;
    nb_fn *f = NULL;
    nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(h0), nb_leaf(h0)}, &carry);
    nb_fn_create(nb_trace_ctx(tr), "cell", cell, p, &f);
    const nb_tree *r =
        nb_scan(tr, f, carry, nb_leaf(xs), T, &(nb_loop_opts){.kind = NB_LOOP_BOUNDED});
    nb_fn_destroy(f);
    nb_tree_destroy(carry);
    nb_var *z = nb_nn_linear(tr, nb_tree_get(p, "out"), nb_get(tr, r, "[1]")); /* [T, B, V] */
    nb_var *ll = nb_take_along_axis(nb_log_softmax(z, -1), nb_expand_dims(tgt, 2), 2);
    return nb_return(nb_neg(nb_mean(ll, NULL, 0, false)), out);
}

int main(int argc, char **argv) {
    nb_ctx *ctx = NULL;
    nb_ctx_create(NULL, &ctx);
    int v = 0, steps = argc > 2 ? atoi(argv[2]) : 300;
    nb_array *codes, *train, *test, *key, *k[5], *ks;
    nb_tree *l[4], *params, *parts[2], *opt, *state, *batch, *loss_v, *lt[3], *lk;
    nb_fn *loss_fn, *step;
    CHECK(nb_text_load(ctx, argc > 1 ? argv[1] : "data/tinyshakespeare.txt.gz", &codes, NULL, &v));
    int64_t n = nb_array_dim(codes, 0);
    CHECK(nb_array_rows(codes, 0, n - n / 10, &train));
    CHECK(nb_array_rows(codes, n - n / 10, n, &test));
    CHECK(nb_tree_array(train, &lt[0]));
    CHECK(nb_tree_array(test, &lt[1]));
    CHECK(nb_random_key(ctx, 0, &key));
    CHECK(nb_random_split_keys(key, 5, k)); /* emb, gru1, gru2, out, windows */
    CHECK(nb_nn_embedding_init(ctx, v, E, NB_DTYPE_F32, k[0], &l[0]));
    CHECK(nb_nn_gru_cell_init(ctx, E, H, true, NB_DTYPE_F32, k[1], &l[1]));
    CHECK(nb_nn_gru_cell_init(ctx, H, H, true, NB_DTYPE_F32, k[2], &l[2]));
    CHECK(nb_nn_linear_init(ctx, H, v, true, NB_DTYPE_F32, k[3], &l[3]));
    CHECK(nb_tree_dict(ctx, 4, (const char *[]){"emb", "gru1", "gru2", "out"}, l, &params));
    CHECK(nb_optim_clip_by_global_norm(ctx, 1.0, &parts[0]));
    CHECK(nb_optim_adam(ctx, 3e-3, NULL, &parts[1]));
    CHECK(nb_optim_chain(ctx, 2, parts, &opt));
    CHECK(nb_fn_create(ctx, "loss", loss, NULL, &loss_fn));
    CHECK(nb_train_step(loss_fn, opt, NULL, &step));
    CHECK(nb_train_init(step, params, &state));
    double nats = 0.0;
    for (int i = 0; i < steps; i++) {
        CHECK(nb_random_fold_in(k[4], (uint32_t)i, &ks)); /* this step's windows */
        CHECK(nb_tree_array(ks, &lk));
        CHECK(nb_tree_tuple(ctx, 2, (nb_tree *[]){lt[0], lk}, &batch));
        CHECK(nb_train_run(step, &params, &state, batch, &nats, NULL));
        nb_tree_destroy(batch), nb_tree_destroy(lk), nb_array_destroy(ks);
        if (i % 100 == 99) {
            printf("step %4d  loss %.4f bits per character\n", i + 1, nats / log(2.0));
        }
    }
    double sum = 0.0; /* the test text: 8 draws of 32 windows */
    for (int i = 0; i < 8; i++) {
        CHECK(nb_random_fold_in(key, (uint32_t)(1000000 + i), &ks));
        CHECK(nb_tree_array(ks, &lk));
        CHECK(nb_tree_tuple(ctx, 2, (nb_tree *[]){lt[1], lk}, &batch));
        CHECK(nb_train_eval(loss_fn, params, batch, &loss_v));
        double x = 0.0;
        CHECK(nb_array_get_flat(nb_tree_get_array(loss_v), 0, &x));
        sum += x;
    }
    printf("test %.4f bits per character (%d characters, vocabulary %d)\n", sum / 8 / log(2.0),
           8 * B * T, v);
    printf("final loss %a\n", nats);
    nb_ctx_destroy(ctx); /* releases every array, tree and function made in it */
    return 0;
}
