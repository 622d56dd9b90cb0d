/*
 * transformer.c -- a one-block transformer language model on Tiny Shakespeare: character
 * and position embeddings, a pre-norm block (LayerNorm, causal MultiheadAttention with 4
 * heads, a residual; LayerNorm, an MLP with gelu, a residual), a final LayerNorm and a
 * Linear to the next character's logits; Adam with warmup and gradient clipping on random
 * windows of the first 90% of the text; the loss on windows of the last 10% in bits per
 * character. The same numbers on every run and for any thread count.
 * Usage: transformer [TEXT] [STEPS]  (defaults: data/tinyshakespeare.txt.gz, 300)
 */
#include <nabla/nabla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Stop at the first failure with nabla's message (it names the call, the shapes, the fix). */
// clang-format off
#define CHECK(e) if ((e) != NB_OK) return fprintf(stderr, "%s\n", nb_ctx_errmsg(ctx)), 1
// clang-format on

enum { B = 32, T = 64, D = 64, HEADS = 4 };

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
    nb_var *tgt = nb_slice(w, (int64_t[]){0, 1}, (int64_t[]){B, T + 1}, NULL);
    nb_var *pos = nb_iota(tr, NB_DTYPE_I32, 1, (int64_t[]){T}, 0);
    nb_var *x = nb_add(nb_nn_embedding(tr, nb_tree_get(p, "tok"), in),
                       nb_nn_embedding(tr, nb_tree_get(p, "pos"), pos)); /* [B, T, D] */
    nb_var *h = nb_nn_layer_norm(tr, nb_tree_get(p, "ln1"), x);
    x = nb_add(x, nb_nn_multihead_attention(tr, nb_tree_get(p, "attn"), h, h, h, NULL, NULL));
    x = nb_add(
        x, nb_nn_mlp(tr, nb_tree_get(p, "mlp"), nb_nn_layer_norm(tr, nb_tree_get(p, "ln2"), x)));
    nb_var *z =
        nb_nn_linear(tr, nb_tree_get(p, "out"), nb_nn_layer_norm(tr, nb_tree_get(p, "ln3"), x));
    nb_var *ll = nb_take_along_axis(nb_log_softmax(z, -1), nb_expand_dims(tgt, 2), 2);
    return nb_return(nb_neg(nb_mean(ll, NULL, 0, false)), out);
}

int main(int argc, char **argv) {
    nb_ctx *ctx = NULL;
    nb_ctx_create(NULL, &ctx);
    int v = 0, steps = argc > 2 ? atoi(argv[2]) : 300;
    nb_array *codes, *train, *test, *key, *k[6], *ks;
    nb_tree *l[8], *params, *parts[2], *opt, *state, *batch, *loss_v, *lt[2], *lk, *sched;
    nb_fn *loss_fn, *step;
    CHECK(nb_text_load(ctx, argc > 1 ? argv[1] : "data/tinyshakespeare.txt.gz", &codes, NULL, &v));
    int64_t n = nb_array_dim(codes, 0);
    CHECK(nb_array_rows(codes, 0, n - n / 10, &train));
    CHECK(nb_array_rows(codes, n - n / 10, n, &test));
    CHECK(nb_tree_array(train, &lt[0]));
    CHECK(nb_tree_array(test, &lt[1]));
    CHECK(nb_random_key(ctx, 0, &key));
    CHECK(nb_random_split_keys(key, 6, k)); /* tok, pos, attn, mlp, out, windows */
    nb_nn_mha_opts mo = nb_nn_mha_opts_default();
    mo.causal = true;
    nb_nn_mlp_opts po = nb_nn_mlp_opts_default();
    po.activation = nb_gelu;
    CHECK(nb_nn_embedding_init(ctx, v, D, NB_DTYPE_F32, k[0], &l[0]));
    CHECK(nb_nn_embedding_init(ctx, T, D, NB_DTYPE_F32, k[1], &l[1]));
    CHECK(nb_nn_multihead_attention_init(ctx, HEADS, D, &mo, NB_DTYPE_F32, k[2], &l[2]));
    CHECK(nb_nn_mlp_init(ctx, D, D, 4 * D, 1, &po, NB_DTYPE_F32, k[3], &l[3]));
    CHECK(nb_nn_linear_init(ctx, D, v, true, NB_DTYPE_F32, k[4], &l[4]));
    for (int i = 5; i < 8; i++) {
        CHECK(nb_nn_layer_norm_init(ctx, 1, (int64_t[]){D}, 1e-5, true, true, NB_DTYPE_F32, &l[i]));
    }
    CHECK(nb_tree_dict(ctx, 8,
                       (const char *[]){"tok", "pos", "attn", "mlp", "out", "ln1", "ln2", "ln3"}, l,
                       &params));
    CHECK(nb_schedule_warmup_cosine_decay(ctx, 0.0, 1e-2, steps / 10, steps, 1e-3, 1.0, &sched));
    nb_optim_opts oo = nb_optim_opts_default();
    oo.schedule = sched;
    CHECK(nb_optim_clip_by_global_norm(ctx, 1.0, &parts[0]));
    CHECK(nb_optim_adam(ctx, 0.0, &oo, &parts[1]));
    CHECK(nb_optim_chain(ctx, 2, parts, &opt));
    CHECK(nb_fn_create(ctx, "loss", loss, NULL, &loss_fn));
    CHECK(nb_train_step(loss_fn, opt, NULL, &step));
    CHECK(nb_train_init(step, params, &state));
    double nats = 0.0;
    for (int i = 0; i < steps; i++) {
        CHECK(nb_random_fold_in(k[5], (uint32_t)i, &ks)); /* this step's windows */
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
