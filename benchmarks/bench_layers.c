/*
 * bench_layers.c -- the standard layers' rows, next to PyTorch and JAX + Equinox measured in
 * the same run (benchmarks/peers/torch_layers.py, jax_layers.py), 1 thread, f32.
 *
 * Table 1, train steps (forward, backward, Adam update; nb_train_step, jitted, donated):
 *   - cnn: the digits CNN of examples/cnn.c, batch 64 of [1, 8, 8] images: conv 1->16 3x3
 *     SAME, relu, conv 16->32 3x3 SAME, relu, max pool 2x2 stride 2, Linear 512->64, relu,
 *     Linear 64->10, mean cross-entropy, Adam 1e-3;
 *   - gru: a character model of examples/char_rnn.c's shape: Embedding 65->32, GRU cells
 *     32->128 and 128->128, each layer nb_nn_gru over the 64 steps (a bounded scan, every
 *     step stored; its input side one product before the scan, as the peers' layer-by-layer
 *     runs), Linear 128->65,
 *     batch 32, mean cross-entropy over the 2,048 positions, Adam 1e-3;
 * each next to its C limit (benchmarks/limits/lim_cnn.c, lim_gru.c: the same step hand-written,
 * BLIS for the products and plain loops for the rest, every activation stored), started from
 * nabla's initial parameters and the same batch, with the GFLOP of the step's products. Before
 * the timing one step of each is checked against nabla's (the loss within 1e-5 relative, every
 * new parameter and every element of Adam's mu -- the gradient times 0.1 -- within 1e-4 of its
 * leaf's largest magnitude); a failed check makes the exit status 1.
 * Table 2, one Conv2d (bias, 3x3, stride 1, padding 1): forward, and forward + the gradients
 * of sum(conv(x) * r) with respect to x, the weight and the bias, on
 *   a: x [32, 3, 32, 32] -> 16 channels; b: [32, 32, 16, 16] -> 64; c: [8, 64, 28, 28] -> 64;
 * next to the BLIS floor of its im2col formulation as nabla makes it, one example at a time
 * (src/ad/op_conv.c: each example's columns stay in cache): the forward's N products
 * [O, C*9] x [C*9, H*W], and for forward + backward also dW = sum over the examples of
 * dY_n cols_n^T (accumulated in place) and dcols_n = W^T dY_n, called directly on buffers of
 * those shapes.
 *
 * Every time is a median of interleaved samples (each a burst of >= 20 ms). Run from the
 * repository root: ./build/benchmarks/bench_layers [--samples S] [--no-peers] [--only ROW N]
 * (ROW 0 cnn, 1 gru, 2..7 the convolutions, 8 the cnn's C limit, 9 the gru's: N calls alone,
 * for a profiler).
 */
#define BENCH_NAME "bench_layers"
#include "bench_common.h"

#include "limits/limits.h"

#include <blis.h>
#include <nabla/nabla.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double uniform01(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) * 0x1.0p-53;
}

static nb_array *rand_arr(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape, int64_t hi) {
    nb_array *a = NULL;
    BENCH_CHECK(ctx, nb_array_zeros(ctx, dt, rank, shape, &a));
    int64_t n = nb_array_size(a);
    if (dt == NB_DTYPE_F32) {
        float *d = nb_array_data(a);
        for (int64_t i = 0; i < n; i++) {
            d[i] = (float)(2 * uniform01() - 1);
        }
    } else {
        int32_t *d = nb_array_data(a);
        for (int64_t i = 0; i < n; i++) {
            d[i] = (int32_t)(uniform01() * (double)hi);
        }
    }
    return a;
}

static nb_tree *leaf(nb_ctx *ctx, nb_array *a) {
    nb_tree *t = NULL;
    BENCH_CHECK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

/* ---- timing ------------------------------------------------------------------------------- */

typedef struct runner {
    nb_ctx *ctx;
    void (*run)(struct runner *);
    nb_fn *f;
    nb_tree *args, *params, *state, *batch;
    /* a BLIS floor: up to 3 products, each made for n_ex examples (a, b, c advanced by sa,
     * sb, sc elements per example; sc == 0: accumulated into one c) */
    int n_mm, n_ex;
    int64_t m[3], n[3], k[3], sa[3], sb[3], sc[3];
    int tb[3]; /* b transposed */
    float *a[3], *b[3], *c[3];
    void *lim; /* a C limit: lim_cnn or lim_gru */
    int burst;
} runner;

static void run_call(runner *r) {
    nb_tree *out = NULL;
    BENCH_CHECK(r->ctx, nb_fn_call(r->f, r->args, &out));
    nb_tree_destroy(out);
}

static void run_step(runner *r) {
    double v = 0;
    BENCH_CHECK(r->ctx, nb_train_run(r->f, &r->params, &r->state, r->batch, &v, NULL));
}

static void run_blis(runner *r) {
    float one = 1.0f, zero = 0.0f;
    for (int i = 0; i < r->n_mm; i++) {
        for (int e = 0; e < r->n_ex; e++) {
            /* row-major c[m, n] = a[m, k] b[k, n] (b read as its transpose when stored [n, k]) */
            bli_sgemm(BLIS_NO_TRANSPOSE, r->tb[i] ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, r->m[i],
                      r->n[i], r->k[i], &one, r->a[i] + e * r->sa[i], r->k[i], 1,
                      r->b[i] + e * r->sb[i], r->tb[i] ? r->k[i] : r->n[i], 1,
                      r->sc[i] == 0 && e > 0 ? &one : &zero, r->c[i] + e * r->sc[i], r->n[i], 1);
        }
    }
}

/* n floats of small values (the zero page of a calloc would make the reads unrealistic) */
static float *floor_buf(int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    if (p == NULL) {
        fprintf(stderr, BENCH_NAME ": out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) {
        p[i] = 0.01f * (float)(i % 7) - 0.03f;
    }
    return p;
}

static void run_lim_cnn(runner *r) {
    (void)lim_cnn_step(r->lim);
}

static void run_lim_gru(runner *r) {
    (void)lim_gru_step(r->lim);
}

static double sample(void *ud) {
    runner *r = ud;
    if (r->burst == 0) {
        double t0 = bench_now_s();
        int b = 0;
        while (bench_now_s() - t0 < 0.02 || b < 1) {
            r->run(r);
            b++;
        }
        r->burst = b;
    }
    double t0 = bench_now_s();
    for (int i = 0; i < r->burst; i++) {
        r->run(r);
    }
    return (bench_now_s() - t0) / r->burst * 1e6;
}

/* ---- the models ------------------------------------------------------------------------- */

static nb_var *flatten(nb_var *x) {
    return nb_reshape(x, 2, (int64_t[]){nb_var_dim(x, 0), -1});
}

static nb_var *ce(nb_trace *tr, nb_var *z, nb_var *y, int classes) {
    (void)tr;
    nb_var *ll = nb_sum(nb_mul(nb_log_softmax(z, -1), nb_one_hot(y, classes, NB_DTYPE_F32)),
                        (int[]){-1}, 1, false);
    return nb_neg(nb_mean(ll, NULL, 0, false));
}

/* loss((model, x [64,1,8,8], y [64])) */
static nb_status cnn_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *z = nb_nn_apply(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]"), NULL);
    return nb_return(ce(tr, z, nb_get(tr, args, "[2]"), 10), out);
}

static nb_tree *cnn_model(nb_ctx *ctx, const nb_array *key) {
    nb_array *k[3];
    nb_tree *l[7], *model = NULL;
    BENCH_CHECK(ctx, nb_random_split_keys(key, 3, k));
    nb_nn_conv_opts same = nb_nn_conv_opts_default();
    same.padding_kind = NB_NN_PAD_SAME;
    nb_nn_pool_opts p2 = nb_nn_pool_opts_default();
    p2.stride[0] = p2.stride[1] = 2;
    BENCH_CHECK(
        ctx, nb_nn_conv_init(ctx, 2, 1, 16, (int64_t[]){3, 3}, &same, NB_DTYPE_F32, k[0], &l[0]));
    BENCH_CHECK(ctx, nb_nn_activation_leaf(ctx, nb_relu, NULL, &l[1]));
    BENCH_CHECK(
        ctx, nb_nn_conv_init(ctx, 2, 16, 32, (int64_t[]){3, 3}, &same, NB_DTYPE_F32, k[1], &l[2]));
    l[3] = l[1];
    BENCH_CHECK(ctx, nb_nn_max_pool_init(ctx, 2, (int64_t[]){2, 2}, &p2, &l[4]));
    BENCH_CHECK(ctx, nb_nn_activation_leaf(ctx, flatten, "flatten", &l[5]));
    BENCH_CHECK(ctx, nb_nn_mlp_init(ctx, 512, 10, 64, 1, NULL, NB_DTYPE_F32, k[2], &l[6]));
    BENCH_CHECK(ctx, nb_nn_sequential_init(ctx, 7, l, &model));
    return model;
}

enum { GB = 32, GT = 64, GE = 32, GH = 128, GV = 65 };

/* loss((params, inputs i32[B, T], targets i32[B, T])) */
static nb_status gru_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *p = nb_tree_child(args, 0);
    nb_var *xs = nb_transpose(nb_nn_embedding(tr, nb_tree_get(p, "emb"), nb_get(tr, args, "[1]")),
                              (int[]){1, 0, 2});
    nb_var *h0 = nb_full(tr, NB_DTYPE_F32, 2, (int64_t[]){GB, GH}, 0.0);
    /* each layer over the whole sequence (as the peers: JAX a lax.scan per layer, PyTorch
     * nn.GRU), its input side one product before its scan */
    nb_var *h1 = nb_nn_gru(tr, nb_tree_get(p, "gru1"), xs, h0, NULL);
    nb_var *h2 = nb_nn_gru(tr, nb_tree_get(p, "gru2"), h1, h0, NULL);
    nb_var *z = nb_nn_linear(tr, nb_tree_get(p, "out"), h2); /* [T, B, V] */
    nb_var *y = nb_transpose(nb_get(tr, args, "[2]"), NULL);
    return nb_return(ce(tr, z, y, GV), out);
}

static nb_tree *gru_model(nb_ctx *ctx, const nb_array *key) {
    nb_array *k[4];
    nb_tree *l[4], *p = NULL;
    BENCH_CHECK(ctx, nb_random_split_keys(key, 4, k));
    BENCH_CHECK(ctx, nb_nn_embedding_init(ctx, GV, GE, NB_DTYPE_F32, k[0], &l[0]));
    BENCH_CHECK(ctx, nb_nn_gru_cell_init(ctx, GE, GH, true, NB_DTYPE_F32, k[1], &l[1]));
    BENCH_CHECK(ctx, nb_nn_gru_cell_init(ctx, GH, GH, true, NB_DTYPE_F32, k[2], &l[2]));
    BENCH_CHECK(ctx, nb_nn_linear_init(ctx, GH, GV, true, NB_DTYPE_F32, k[3], &l[3]));
    BENCH_CHECK(ctx, nb_tree_dict(ctx, 4, (const char *[]){"emb", "gru1", "gru2", "out"}, l, &p));
    return p;
}

static void step_runner(nb_ctx *ctx, runner *r, nb_fn *loss, nb_tree *params, nb_tree *batch) {
    nb_tree *opt = NULL;
    memset(r, 0, sizeof *r);
    r->ctx = ctx;
    r->run = run_step;
    BENCH_CHECK(ctx, nb_optim_adam(ctx, 1e-3, NULL, &opt));
    BENCH_CHECK(ctx, nb_train_step(loss, opt, NULL, &r->f));
    BENCH_CHECK(ctx, nb_train_init(r->f, params, &r->state));
    r->params = params;
    r->batch = batch;
}

/* ---- the C limits --------------------------------------------------------------------------- */

/* the data of the array at leaf t, of dtype dt and n elements */
static void *leaf_data(const nb_tree *t, nb_dtype dt, int64_t n) {
    nb_array *a = nb_tree_get_array(t);
    if (a == NULL || nb_array_dtype(a) != dt || nb_array_size(a) != n) {
        fprintf(stderr, BENCH_NAME ": unexpected parameter or batch tree\n");
        exit(1);
    }
    return nb_array_data(a);
}

static float *leaf_f32(const nb_tree *t, int64_t n) {
    return leaf_data(t, NB_DTYPE_F32, n);
}

static const char *const cnn_leaf_names[LIM_CNN_NLEAF] = {
    "conv0.weight", "conv0.bias", "conv1.weight", "conv1.bias",
    "mlp0.weight",  "mlp0.bias",  "mlp1.weight",  "mlp1.bias"};
static const char *const gru_leaf_names[LIM_GRU_NLEAF] = {
    "emb.weight",  "gru1.weight_ih", "gru1.weight_hh", "gru1.bias",
    "gru1.bias_n", "gru2.weight_ih", "gru2.weight_hh", "gru2.bias",
    "gru2.bias_n", "out.weight",     "out.bias"};

/* nabla's arrays of the cnn's parameters in lim_cnn's order (n[i] elements each) */
static void cnn_leaves(const nb_tree *model, const int64_t *n, float **leaf) {
    const nb_tree *ls = nb_tree_get(model, "layers");
    const nb_tree *mlp = nb_tree_get(nb_tree_child(ls, 6), "layers");
    const nb_tree *l[4] = {nb_tree_child(ls, 0), nb_tree_child(ls, 2), nb_tree_child(mlp, 0),
                           nb_tree_child(mlp, 1)};
    for (int i = 0; i < 4; i++) {
        leaf[2 * i] = leaf_f32(nb_tree_get(l[i], "weight"), n[2 * i]);
        leaf[2 * i + 1] = leaf_f32(nb_tree_get(l[i], "bias"), n[2 * i + 1]);
    }
}

/* nabla's arrays of the gru's parameters in lim_gru's order */
static void gru_leaves(const nb_tree *p, const int64_t *n, float **leaf) {
    static const char *const k[LIM_GRU_NLEAF][2] = {
        {"emb", "weight"},  {"gru1", "weight_ih"}, {"gru1", "weight_hh"}, {"gru1", "bias"},
        {"gru1", "bias_n"}, {"gru2", "weight_ih"}, {"gru2", "weight_hh"}, {"gru2", "bias"},
        {"gru2", "bias_n"}, {"out", "weight"},     {"out", "bias"}};
    for (int i = 0; i < LIM_GRU_NLEAF; i++) {
        leaf[i] = leaf_f32(nb_tree_get(nb_tree_get(p, k[i][0]), k[i][1]), n[i]);
    }
}

static double state_hyper(nb_ctx *ctx, const nb_tree *state, const char *name) {
    double v = NAN;
    BENCH_CHECK(ctx, nb_array_get_flat(
                         nb_tree_get_array(nb_tree_get(nb_tree_get(state, "hyper"), name)), 0, &v));
    return v;
}

/* A C limit for the train step of r (model 0 cnn, 1 gru) from r's current parameters, batch
 * and Adam hyperparameters (before r's first step: count 0); u runs it. */
static void lim_runner(runner *u, const runner *r, int model) {
    memset(u, 0, sizeof *u);
    u->ctx = r->ctx;
    const nb_tree *bx = nb_tree_child(r->batch, 0), *by = nb_tree_child(r->batch, 1);
    int nl = model == 0 ? LIM_CNN_NLEAF : LIM_GRU_NLEAF;
    int64_t n[LIM_GRU_NLEAF];
    float *dst[LIM_GRU_NLEAF], *src[LIM_GRU_NLEAF];
    if (model == 0) {
        lim_cnn *m = lim_cnn_create();
        if (m == NULL) {
            fprintf(stderr, BENCH_NAME ": out of memory\n");
            exit(1);
        }
        for (int i = 0; i < nl; i++) {
            dst[i] = lim_cnn_leaf(m, 0, i, &n[i]);
        }
        cnn_leaves(r->params, n, src);
        memcpy(lim_cnn_x(m), leaf_f32(bx, LIM_CNN_B * 64), LIM_CNN_B * 64 * sizeof(float));
        memcpy(lim_cnn_labels(m), leaf_data(by, NB_DTYPE_I32, LIM_CNN_B),
               LIM_CNN_B * sizeof(int32_t));
        u->lim = m;
        u->run = run_lim_cnn;
    } else {
        lim_gru *m = lim_gru_create();
        if (m == NULL) {
            fprintf(stderr, BENCH_NAME ": out of memory\n");
            exit(1);
        }
        for (int i = 0; i < nl; i++) {
            dst[i] = lim_gru_leaf(m, 0, i, &n[i]);
        }
        gru_leaves(r->params, n, src);
        int64_t nt = (int64_t)LIM_GRU_B * LIM_GRU_T;
        memcpy(lim_gru_inputs(m), leaf_data(bx, NB_DTYPE_I32, nt), (size_t)nt * sizeof(int32_t));
        memcpy(lim_gru_targets(m), leaf_data(by, NB_DTYPE_I32, nt), (size_t)nt * sizeof(int32_t));
        u->lim = m;
        u->run = run_lim_gru;
    }
    for (int i = 0; i < nl; i++) {
        memcpy(dst[i], src[i], (size_t)n[i] * sizeof(float));
    }
    double h[5] = {state_hyper(r->ctx, r->state, "learning_rate"),
                   state_hyper(r->ctx, r->state, "b1"), state_hyper(r->ctx, r->state, "b2"),
                   state_hyper(r->ctx, r->state, "eps"), state_hyper(r->ctx, r->state, "eps_root")};
    if (model == 0) {
        lim_cnn_set_adam(u->lim, 0, h[0], h[1], h[2], h[3], h[4]);
    } else {
        lim_gru_set_adam(u->lim, 0, h[0], h[1], h[2], h[3], h[4]);
    }
}

/* The largest |c - v| over a leaf's largest |v|, over the leaves (n[i] elements each); *at:
 * the leaf where it is. */
static double leaf_err(int nl, const int64_t *n, float *const *c, float *const *v, int *at) {
    double worst = 0;
    *at = 0;
    for (int i = 0; i < nl; i++) {
        double big = 0, d = 0;
        for (int64_t j = 0; j < n[i]; j++) {
            double a = fabs((double)v[i][j]), e = fabs((double)c[i][j] - (double)v[i][j]);
            big = a > big ? a : big;
            d = e > d || e != e ? e : d;
        }
        double q = d / (big > 0 ? big : 1.0);
        if (q > worst || q != q) {
            worst = q;
            *at = i;
        }
    }
    return worst;
}

/* One step of nabla's r and of its limit u from the same start, compared: the losses within
 * 1e-5 relative; each new parameter, and each leaf of Adam's mu (after a first step (1 - b1)
 * times the gradient: where the parameters, moved by about lr sign(g), show only the
 * gradients' signs, mu shows their values), within 1e-4 of its leaf's largest magnitude.
 * Prints the result; true if it passed. */
static bool lim_check(runner *r, runner *u, int model) {
    double ln = 0;
    BENCH_CHECK(r->ctx, nb_train_run(r->f, &r->params, &r->state, r->batch, &ln, NULL));
    double lc = model == 0 ? lim_cnn_step(u->lim) : lim_gru_step(u->lim);
    int nl = model == 0 ? LIM_CNN_NLEAF : LIM_GRU_NLEAF;
    const char *const *names = model == 0 ? cnn_leaf_names : gru_leaf_names;
    double err[2];
    int at[2];
    for (int w = 0; w < 2; w++) { /* params, mu */
        int64_t n[LIM_GRU_NLEAF];
        float *c[LIM_GRU_NLEAF], *v[LIM_GRU_NLEAF];
        for (int i = 0; i < nl; i++) {
            c[i] =
                model == 0 ? lim_cnn_leaf(u->lim, w, i, &n[i]) : lim_gru_leaf(u->lim, w, i, &n[i]);
        }
        const nb_tree *t = w == 0 ? r->params : nb_tree_get(r->state, "mu");
        if (model == 0) {
            cnn_leaves(t, n, v);
        } else {
            gru_leaves(t, n, v);
        }
        err[w] = leaf_err(nl, n, c, v, &at[w]);
    }
    double lrel = fabs(lc - ln) / fmax(fabs(ln), 1e-30);
    bool ok = lrel <= 1e-5 && err[0] <= 1e-4 && err[1] <= 1e-4;
    printf("- %s: loss C %.9g, nabla %.9g, rel. diff %.2e (<= 1e-5); max |diff| / max |leaf|: "
           "new params %.2e at %s, mu %.2e at %s (<= 1e-4): %s\n",
           model == 0 ? "cnn" : "gru", lc, ln, lrel, err[0], names[at[0]], err[1], names[at[1]],
           ok ? "ok" : "FAILED");
    return ok;
}

/* ---- one convolution ---------------------------------------------------------------------- */

/* args = ((layer, x), r): forward only uses (layer, x) */
static nb_status conv_fwd(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *lx = nb_tree_child(args, 0);
    return nb_return(nb_nn_conv(tr, nb_tree_child(lx, 0), nb_get(tr, lx, "[1]")), out);
}
static nb_status conv_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *lx = nb_tree_child(args, 0);
    nb_var *y = nb_nn_conv(tr, nb_tree_child(lx, 0), nb_get(tr, lx, "[1]"));
    return nb_return(nb_sum(nb_mul(y, nb_get(tr, args, "[1]")), NULL, 0, false), out);
}

typedef struct conv_shape {
    const char *name;
    int64_t n, c, hw, o;
} conv_shape;

int main(int argc, char **argv) {
    int samples = 11, only = -1, only_n = 0;
    bool with_peers = true;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-peers") == 0) {
            with_peers = false;
        } else if (strcmp(argv[i], "--only") == 0 && i + 2 < argc) {
            /* for a profiler: row I (0 cnn, 1 gru, 2..7 the convolutions, 8 and 9 the cnn's and
             * the gru's C limits) run N times alone */
            only = atoi(argv[++i]);
            only_n = atoi(argv[++i]);
            with_peers = false;
        } else if (strcmp(argv[i], "--samples") == 0 && i + 1 < argc) {
            samples = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_layers [--samples S] [--no-peers] [--only ROW N]\n");
            return 2;
        }
    }
    if (samples < 1 || samples > BENCH_MAX_ROUNDS) {
        fprintf(stderr, BENCH_NAME ": samples in 1..%d\n", BENCH_MAX_ROUNDS);
        return 2;
    }
    bli_thread_set_num_threads(1);
    nb_ctx_opts co = nb_ctx_opts_default();
    co.n_threads = 1;
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(&co, &ctx) != NB_OK) {
        fprintf(stderr, BENCH_NAME ": cannot create a context\n");
        return 1;
    }
    char load[16];
    bench_load_average(load, sizeof load);
    printf("# bench_layers: layers and models against PyTorch, JAX + Equinox and the BLIS floor "
           "(1 thread, load average %s)\n\n",
           load);

    static const char *const keys[8] = {"cnn_us",           "gru_us",          "conv_a_fwd_us",
                                        "conv_a_fwdbwd_us", "conv_b_fwd_us",   "conv_b_fwdbwd_us",
                                        "conv_c_fwd_us",    "conv_c_fwdbwd_us"};
    double torch[8], jax[8];
    char tv[64] = "not run", jv[64] = "not run";
    for (int i = 0; i < 8; i++) {
        torch[i] = jax[i] = NAN;
    }
    if (with_peers) {
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 benchmarks/peers/torch_layers.py --samples %d 2>/dev/null",
                 samples);
        if (access("/usr/bin/python3", X_OK) == 0) {
            bench_peer_read(cmd, 8, keys, torch, "torch_version", tv, sizeof tv);
        }
        snprintf(cmd, sizeof cmd,
                 "build/peers/bin/python benchmarks/peers/jax_layers.py --samples %d 2>/dev/null",
                 samples);
        if (access("build/peers/bin/python", X_OK) == 0) {
            bench_peer_read(cmd, 8, keys, jax, "jax_version", jv, sizeof jv);
        }
    }

    nb_array *key = NULL;
    BENCH_CHECK(ctx, nb_random_key(ctx, 0, &key));
    runner run[10];
    memset(run, 0, sizeof run);
    /* cnn */
    nb_fn *cl = NULL, *gl = NULL;
    BENCH_CHECK(ctx, nb_fn_create(ctx, "cnn_loss", cnn_loss, NULL, &cl));
    nb_tree *cb = NULL,
            *cx = leaf(ctx, rand_arr(ctx, NB_DTYPE_F32, 4, (int64_t[]){64, 1, 8, 8}, 0)),
            *cy = leaf(ctx, rand_arr(ctx, NB_DTYPE_I32, 1, (int64_t[]){64}, 10));
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){cx, cy}, &cb));
    step_runner(ctx, &run[0], cl, cnn_model(ctx, key), cb);
    /* gru */
    BENCH_CHECK(ctx, nb_fn_create(ctx, "gru_loss", gru_loss, NULL, &gl));
    nb_tree *gb = NULL, *gx = leaf(ctx, rand_arr(ctx, NB_DTYPE_I32, 2, (int64_t[]){GB, GT}, GV)),
            *gy = leaf(ctx, rand_arr(ctx, NB_DTYPE_I32, 2, (int64_t[]){GB, GT}, GV));
    BENCH_CHECK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){gx, gy}, &gb));
    step_runner(ctx, &run[1], gl, gru_model(ctx, key), gb);
    /* their C limits, from the same parameters and batches */
    lim_runner(&run[8], &run[0], 0);
    lim_runner(&run[9], &run[1], 1);
    /* convolutions and their BLIS floors */
    static const conv_shape CS[3] = {
        {"a: [32,3,32,32] -> 16", 32, 3, 32, 16},
        {"b: [32,32,16,16] -> 64", 32, 32, 16, 64},
        {"c: [8,64,28,28] -> 64", 8, 64, 28, 64},
    };
    runner floor_[6];
    memset(floor_, 0, sizeof floor_);
    nb_fn *ff = NULL, *lf = NULL, *gf = NULL, *jf = NULL, *jg = NULL;
    BENCH_CHECK(ctx, nb_fn_create(ctx, "conv_fwd", conv_fwd, NULL, &ff));
    BENCH_CHECK(ctx, nb_fn_create(ctx, "conv_loss", conv_loss, NULL, &lf));
    BENCH_CHECK(ctx, nb_jit(ff, NULL, &jf));
    BENCH_CHECK(ctx, nb_grad(lf, NULL, &gf));
    BENCH_CHECK(ctx, nb_jit(gf, NULL, &jg));
    for (int s = 0; s < 3; s++) {
        const conv_shape *c = &CS[s];
        nb_nn_conv_opts o = nb_nn_conv_opts_default();
        o.padding_kind = NB_NN_PAD_SAME;
        nb_tree *layer = NULL, *pair = NULL, *args = NULL;
        BENCH_CHECK(ctx, nb_nn_conv_init(ctx, 2, c->c, c->o, (int64_t[]){3, 3}, &o, NB_DTYPE_F32,
                                         key, &layer));
        nb_tree *x =
            leaf(ctx, rand_arr(ctx, NB_DTYPE_F32, 4, (int64_t[]){c->n, c->c, c->hw, c->hw}, 0));
        nb_tree *r =
            leaf(ctx, rand_arr(ctx, NB_DTYPE_F32, 4, (int64_t[]){c->n, c->o, c->hw, c->hw}, 0));
        BENCH_CHECK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){layer, x}, &pair));
        BENCH_CHECK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){pair, r}, &args));
        for (int fb = 0; fb < 2; fb++) {
            runner *u = &run[2 + 2 * s + fb];
            u->ctx = ctx;
            u->run = run_call;
            u->f = fb ? jg : jf;
            u->args = args;
            runner *fl = &floor_[2 * s + fb];
            int64_t ck = c->c * 9, l = c->hw * c->hw;
            /* per example n: y_n [O, L] = W [O, CK] cols_n [CK, L]; backward: dW [O, CK] +=
             * dY_n [O, L] cols_n^T (cols stored [CK, L]), dcols_n [CK, L] = W^T [CK, O] dY_n */
            fl->run = run_blis;
            fl->n_mm = fb ? 3 : 1;
            fl->n_ex = (int)c->n;
            int64_t mm[3] = {c->o, c->o, ck}, nn[3] = {l, ck, l}, kk[3] = {ck, l, c->o};
            int64_t sa[3] = {0, c->o * l, 0}, sb[3] = {ck * l, ck * l, c->o * l};
            int64_t sc[3] = {c->o * l, 0, ck * l};
            for (int i = 0; i < fl->n_mm; i++) {
                fl->m[i] = mm[i], fl->n[i] = nn[i], fl->k[i] = kk[i], fl->tb[i] = i == 1;
                fl->sa[i] = sa[i], fl->sb[i] = sb[i], fl->sc[i] = sc[i];
                fl->a[i] = floor_buf(mm[i] * kk[i] + (c->n - 1) * sa[i]);
                fl->b[i] = floor_buf(kk[i] * nn[i] + (c->n - 1) * sb[i]);
                fl->c[i] = floor_buf(mm[i] * nn[i] + (c->n - 1) * sc[i]);
            }
        }
        nb_tree_destroy(pair);
        nb_tree_destroy(layer);
        nb_tree_destroy(x);
        nb_tree_destroy(r);
    }
    if (only >= 0 && only < 10 && getenv("BENCH_DUMP_IR") != NULL && run[only].run == run_step) {
        nb_tree *a = NULL;
        runner *u = &run[only];
        BENCH_CHECK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){u->params, u->state, u->batch}, &a));
        size_t need = 0;
        (void)nb_fn_format_ir(u->f, a, NB_IR_OPTIMIZED, NULL, 0, &need); /* NB_ERR_TRUNCATED */
        char *s = malloc(need + 1);
        BENCH_CHECK(ctx, nb_fn_format_ir(u->f, a, NB_IR_OPTIMIZED, s, need + 1, NULL));
        fputs(s, stdout);
        free(s);
        nb_tree_destroy(a);
    }
    if (only >= 0 && only < 10) {
        run[only].run(&run[only]);
        double t0 = bench_now_s();
        for (int i = 0; i < only_n; i++) {
            run[only].run(&run[only]);
        }
        printf("row %d: %.3f ms per call\n", only,
               (bench_now_s() - t0) * 1e3 / (only_n ? only_n : 1));
        lim_cnn_destroy(run[8].lim);
        lim_gru_destroy(run[9].lim);
        nb_ctx_destroy(ctx);
        return 0;
    }
    printf("Checks: one Adam step of the C limit against nabla's, from the same parameters and "
           "batch:\n\n");
    bool ok = lim_check(&run[0], &run[8], 0);
    ok = lim_check(&run[1], &run[9], 1) && ok;
    printf("\n");
    /* med[0..9]: run (the limits at 8, 9), med[10..15]: the BLIS floors */
    bench_item items[16];
    for (int i = 0; i < 10; i++) {
        items[i].sample = sample;
        items[i].ud = &run[i];
    }
    for (int i = 0; i < 6; i++) {
        items[10 + i].sample = sample;
        items[10 + i].ud = &floor_[i];
    }
    bench_rounds(items, 16, samples);
    double med[16];
    for (int i = 0; i < 16; i++) {
        med[i] = bench_median(items[i].s, samples);
    }
    printf("PyTorch %s, JAX %s. Times in ms; ratio = peer / nabla (> 1: nabla faster); limit / "
           "nabla (< 1: the C limit faster); GFLOP: the step's products (2 m n k each).\n\n",
           tv, jv);
    printf("| train step | GFLOP | nabla | C limit | limit / nabla | PyTorch | JAX + Equinox | "
           "PyTorch / nabla | JAX / nabla |\n|---|---|---|---|---|---|---|---|---|\n");
    static const char *const sn[2] = {"digits CNN, batch 64", "2-layer GRU, B 32, H 128, T 64"};
    const double gflop[2] = {lim_cnn_flops() / 1e9, lim_gru_flops() / 1e9};
    for (int i = 0; i < 2; i++) {
        printf("| %s | %.3f | %.3f | %.3f | %.2f | %.3f | %.3f | %.2f | %.2f |\n", sn[i], gflop[i],
               med[i] / 1e3, med[8 + i] / 1e3, med[8 + i] / med[i], torch[i] / 1e3, jax[i] / 1e3,
               torch[i] / med[i], jax[i] / med[i]);
    }
    printf("\n| Conv2d 3x3 | pass | nabla | BLIS floor | nabla / floor | PyTorch | JAX | PyTorch / "
           "nabla | JAX / nabla |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < 3; s++) {
        for (int fb = 0; fb < 2; fb++) {
            int i = 2 + 2 * s + fb;
            double fl = med[10 + 2 * s + fb];
            printf("| %s | %s | %.3f | %.3f | %.2f | %.3f | %.3f | %.2f | %.2f |\n", CS[s].name,
                   fb ? "fwd+bwd" : "fwd", med[i] / 1e3, fl / 1e3, med[i] / fl, torch[i] / 1e3,
                   jax[i] / 1e3, torch[i] / med[i], jax[i] / med[i]);
        }
    }
    lim_cnn_destroy(run[8].lim);
    lim_gru_destroy(run[9].lim);
    nb_ctx_destroy(ctx);
    if (!ok) {
        fprintf(stderr, BENCH_NAME ": the C limits' check FAILED (see above)\n");
        return 1;
    }
    return 0;
}
