/*
 * limits.h -- hand-written plain C versions of the workloads of bench_native (issue 19),
 * bench_vmap and bench_layers: the "limit" a compiled nabla program is measured against. No
 * nabla here: each is the computation written out as a C programmer would, doing the same
 * arithmetic in the same order as nabla's interpreter, so that the results agree bit for bit
 * where the order is the same (and the benchmark checks that they do).
 *
 *   lim_lv.c      Lotka-Volterra solved with Tsitouras 5(4) and the PID controller of
 *                 src/ode/solve.c (same first step, error norm, safety factors, clipping to
 *                 t1: the same steps), SaveAt ts from each step's dense output as nabla's;
 *                 its gradient by the discrete adjoint of those steps (and of the saves),
 *                 every accepted step's state and stage inputs stored in the forward pass
 *                 (the limit of a checkpointed reverse sweep: nothing recomputed); also
 *                 lim_suite.c's lotka_volterra_mb
 *   lim_mlp.c     the tiny MLP 2-32-32-1 (batch 16, tanh, mean squared error) train step:
 *                 forward, backward, Adam on all six leaves, in plain loops
 *   lim_mlp784.c  the MLP 784-256-256-10 (batch 128, tanh, mean cross-entropy) train step:
 *                 its 8 GEMMs in BLIS (bli_sgemm_ex, one thread), the rest and Adam in loops
 *   lim_pex.c     per-example gradients of that MLP (batch 128, each example's own loss):
 *                 the batch's forward and deltas in BLIS, each example's outer products in
 *                 loops (bench_vmap)
 *   lim_cnn.c     the digits CNN of bench_layers (batch 64 of [1, 8, 8]: two 3x3 convolutions
 *                 1->16->32 with relu, max pool 2x2, Linear 512->64, relu, Linear 64->10, mean
 *                 cross-entropy) train step: the convolutions by im2col and one BLIS product
 *                 each, the linear layers in BLIS, the rest and Adam in loops
 *   lim_gru.c     the 2-layer GRU character model of bench_layers (Embedding 65->32, GRU cells
 *                 32->128 and 128->128 over 64 steps, Linear 128->65, batch 32, mean
 *                 cross-entropy over the 2,048 positions) train step: every step's gates
 *                 stored in the forward (nothing recomputed), the per-step recurrent products
 *                 and the rest (as one product over all 2,048 rows each) in BLIS
 *   lim_suite.c   the stochastic problems of `nabla bench` (tools/bench_problems.c), timed by
 *                 bench_suite: logreg_mb (logistic regression 30 -> 1, batch 16), mlp_mb (the
 *                 MLP 64-32-10, relu, batch 32), cnn_mb (conv 1->8 3x3 SAME, relu, max pool 2,
 *                 Linear 128->10, batch 32), char_gru (Embedding 65->16, a GRU cell 16->64 over
 *                 16 characters, Linear 64->65, batch 32), noisy_quadratic (0.5 (theta - x)^T H
 *                 (theta - x) over 128 rows of 100), lotka_volterra_mb (lim_lv.c's solve
 *                 with SaveAt ts and its discrete adjoint, f64, batch 4 observation sets)
 *                 train steps with Adam
 *   lim_nn.c      what the models share: the one-thread BLIS product, the buffers, the
 *                 log-softmax cross-entropy and its gradient, the 3x3 convolution's im2col and
 *                 col2im on 8x8 images, bias + relu and its backward, the 2x2 max pool; the GRU
 *                 layer over a sequence is lim_gru.c's (lim_gru_layer_fwd, lim_gru_layer_bwd)
 *   lim_vmath_*.c SLEEF's vector functions, chosen per CPU as nabla chooses them (AVX2 + FMA,
 *                 else SSE2): tanhf u35, expf, logf and log1pf u10, pow u10 (f64)
 *
 * The two models of bench_layers and bench_suite's steps are checked against nabla within
 * rounding, not bit for bit: their products are single BLIS calls over the whole batch (and,
 * for the GRUs, the whole sequence) where nabla's are not, so the sums are in another order.
 * So is lim_mlp784 in practice: bench_native prints its loss bits equal but only about 38 %
 * of the new parameters and moments bit-equal (303,906 of 807,966, measured 2026-11-28): its
 * weight gradients come from BLIS calls laid out otherwise than nabla's (another order of
 * summation; the same figures before and after session 19's product changes), and a first
 * Adam step turns a last-bit difference in a gradient near zero into a large relative one
 * (max 0.89).
 *
 * Compiled with -O3 -ffp-contract=off -fno-math-errno -march=native (benchmarks/CMakeLists.txt):
 * the native tier's flags but -O3 for -O2 (the best plain C: gcc's -O2 leaves most of the MLPs'
 * loops scalar), no contraction into FMA, no reassociation.
 */
#ifndef NABLA_BENCH_LIMITS_H
#define NABLA_BENCH_LIMITS_H

#include <stddef.h>
#include <stdint.h>

/* ---- SLEEF, as nabla's executor calls it -------------------------------------------------- */

typedef struct lim_vmath {
    const char *isa;                                       /* "avx2" or "sse2" */
    void (*tanhf_n)(float *o, const float *x, int64_t n);  /* Sleef_tanhf*_u35 */
    void (*expf_n)(float *o, const float *x, int64_t n);   /* Sleef_expf*_u10 */
    void (*logf_n)(float *o, const float *x, int64_t n);   /* Sleef_logf*_u10 */
    void (*log1pf_n)(float *o, const float *x, int64_t n); /* Sleef_log1pf*_u10 */
    double (*pow1)(double x, double y);                    /* Sleef_powd*_u10, one lane */
} lim_vmath;

/* The table for this CPU (AVX2 and FMA: the AVX2 one, else SSE2), as nbi_vmath_get. */
const lim_vmath *lim_vmath_get(void);
extern const lim_vmath lim_vmath_avx2;
extern const lim_vmath lim_vmath_sse2;

/* ---- Lotka-Volterra, tsit5 --------------------------------------------------------------- */

/* Tsitouras 5(4) as src/ode/tableau.c has it (the same doubles: the benchmark compares them
 * with nabla's table bit for bit): c[7], a[7 * 7] (row-major, strictly lower), b[7], e[7];
 * dense[7 * 4] the dense output's b_j(theta) = sum_q dense[4 j + q] theta^(q + 1). */
extern const double lim_tsit5_c[7], lim_tsit5_a[49], lim_tsit5_b[7], lim_tsit5_e[7],
    lim_tsit5_dense[28];

typedef struct lim_lv_opts {
    double t0, t1;
    double dt0;        /* the first step; 0: Hairer's initial step selection (as nabla) */
    double rtol, atol; /* the PID controller's (nb_ode_pid: I controller, safety 0.9, factors
                          0.2 .. 10) */
    int max_steps;
    int n_ts;         /* SaveAt ts (0: none, only y(t1)): n_ts increasing times ts in */
    const double *ts; /* (t0, t1], each written from its step's dense output, as nabla's */
} lim_lv_opts;

typedef struct lim_lv_stats {
    int steps, accepted, rejected;
    int result; /* 0 successful, 1 max_steps reached, 2 step size underflow, 3 non-finite
                   (nb_ode_result's values) */
} lim_lv_stats;

/* dx/dt = a x - b x y, dy/dt = -c y + d x y; p = (a, b, c, d, x0, y0). y = (x(t1), y(t1));
 * ys (NULL: not wanted; else 2 n_ts doubles) the solution at o->ts as (x, y) pairs (NaN where
 * the solve stopped first). */
int lim_lv_solve(const double p[6], const lim_lv_opts *o, double y[2], double *ys,
                 lim_lv_stats *st);

/* Bytes of the work buffer of a gradient of the solve o: up to o->max_steps steps and o->n_ts
 * saves. */
size_t lim_lv_work_bytes(const lim_lv_opts *o);

/* A gradient by the discrete adjoint of the accepted steps (the step sizes and the
 * accept/reject decisions are constants, as nabla's stop_gradient makes them), in two passes:
 * the forward is lim_lv_solve storing in work (lim_lv_work_bytes(o) bytes, 8-byte aligned)
 * every accepted step's size and stage inputs, the final state and each save's step and
 * dense-output weights; the reverse, from that work and the forward's stats, gives g = dG/dp
 * for the G whose derivatives in y(t1) and ys are ybar [2] and ysbar [2 n_ts] (either NULL:
 * zero). Nothing is recomputed. */
int lim_lv_forward(const double p[6], const lim_lv_opts *o, void *work, double y[2], double *ys,
                   lim_lv_stats *st);
void lim_lv_reverse(const double p[6], const lim_lv_opts *o, const void *work,
                    const lim_lv_stats *st, const double ybar[2], const double *ysbar, double g[6]);

/* Both passes for G = x(t1) + y(t1): g = dG/dp. y (may be NULL): the solution at t1. Returns
 * st->result. */
int lim_lv_grad(const double p[6], const lim_lv_opts *o, void *work, double g[6], double y[2],
                lim_lv_stats *st);

/* ---- the tiny MLP 2-32-32-1, batch 16: one Adam train step --------------------------------- */

enum { LIM_TINY_B = 16, LIM_TINY_H = 32 };

/* The parameters as one array, the leaves of bench_train's params tree one after the other
 * in its order (w0 f32[2, 32], b0 [32], w1 [32, 32], b1 [32], w2 [32, 1], b2 [1], each
 * row-major); Adam's mu and nu laid out alike. */
enum {
    LIM_TINY_W0 = 0,
    LIM_TINY_B0 = LIM_TINY_W0 + 2 * LIM_TINY_H,
    LIM_TINY_W1 = LIM_TINY_B0 + LIM_TINY_H,
    LIM_TINY_B1 = LIM_TINY_W1 + LIM_TINY_H * LIM_TINY_H,
    LIM_TINY_W2 = LIM_TINY_B1 + LIM_TINY_H,
    LIM_TINY_B2 = LIM_TINY_W2 + LIM_TINY_H,
    LIM_TINY_NPARAM = LIM_TINY_B2 + 1 /* 1185 */
};

typedef struct lim_tiny {
    float p[LIM_TINY_NPARAM], mu[LIM_TINY_NPARAM], nu[LIM_TINY_NPARAM];
    int32_t count;
    double lr, b1, b2, eps, eps_root; /* Adam's hyperparameters (f64, as nabla's state) */
    float x[LIM_TINY_B * 2], y[LIM_TINY_B];
    /* scratch: activations and gradients */
    float h1[LIM_TINY_B * LIM_TINY_H], h2[LIM_TINY_B * LIM_TINY_H];
    float d1[LIM_TINY_B * LIM_TINY_H], d2[LIM_TINY_B * LIM_TINY_H], d3[LIM_TINY_B];
    float g[LIM_TINY_NPARAM];
} lim_tiny;

/* One train step in place (params, mu, nu, count); returns the loss before the update. */
float lim_tiny_step(lim_tiny *m);

/* ---- the MLP 784-256-256-10, batch 128: one Adam train step -------------------------------- */

enum { LIM_MLP_B = 128, LIM_MLP_IN = 784, LIM_MLP_H = 256, LIM_MLP_OUT = 10 };

typedef struct lim_mlp lim_mlp;

/* A model with its buffers: parameters (w0, b0, w1, b1, w2, b2, as bench_train's tree),
 * mu, nu, x f32[128, 784], labels i32[128]. NULL when out of memory. */
lim_mlp *lim_mlp_create(void);
void lim_mlp_destroy(lim_mlp *m);
/* The leaves: i in 0..5 (w0, b0, w1, b1, w2, b2); which: 0 params, 1 mu, 2 nu. */
float *lim_mlp_leaf(lim_mlp *m, int which, int i, int64_t *n);
float *lim_mlp_x(lim_mlp *m);
int32_t *lim_mlp_labels(lim_mlp *m);
/* Adam's state: count and the hyperparameters. */
void lim_mlp_set_adam(lim_mlp *m, int32_t count, double lr, double b1, double b2, double eps,
                      double eps_root);
int32_t lim_mlp_count(const lim_mlp *m);
/* One train step in place; returns the loss before the update. */
float lim_mlp_step(lim_mlp *m);
/* Only the step's 8 GEMMs (the same calls on the model's buffers) and an Adam update of as
 * many parameters: the base of issue 19's goal for this model ("its GEMMs + a plain-C Adam").
 * It leaves the model's parameters and state alone (its Adam updates a copy of them, made on
 * the first call), so that it can be timed between steps of the same model. */
void lim_mlp_gemms_adam(lim_mlp *m);

/* ---- per-example gradients of the MLP 784-256-256-10, batch 128 (lim_pex.c) -------------- */

typedef struct lim_pex lim_pex;

/* Zeroed buffers: parameters, x f32[128, 784], labels, per-example gradients. NULL when out
 * of memory. */
lim_pex *lim_pex_create(void);
void lim_pex_destroy(lim_pex *m);
/* Leaf i in 0..5 (w0, b0, w1, b1, w2, b2): the parameter, or its per-example gradients
 * ([128] + the leaf's shape). */
float *lim_pex_param(lim_pex *m, int i);
float *lim_pex_grad(lim_pex *m, int i);
float *lim_pex_x(lim_pex *m);
int32_t *lim_pex_labels(lim_pex *m);
/* Every example's gradient of its own cross-entropy. */
void lim_pex_grads(lim_pex *m);

/* ---- Adam, as nabla's (lim_adam.c) ------------------------------------------------------- */

/* One step's coefficients, in f64 and rounded to f32 (all computed in f64, as nabla's). */
typedef struct lim_adam_step_f64 {
    double b1, c1, b2, c2, rbc1, rbc2, eps, eps_root, nlr;
} lim_adam_step_f64;
typedef struct lim_adam_step {
    float b1, c1, b2, c2, rbc1, rbc2, eps, eps_root, nlr;
} lim_adam_step;

/* Counts a step (*count + 1, saturating at INT32_MAX) and returns its coefficients. */
lim_adam_step_f64 lim_adam_begin_f64(int32_t *count, double lr, double b1, double b2, double eps,
                                     double eps_root);
lim_adam_step lim_adam_begin(int32_t *count, double lr, double b1, double b2, double eps,
                             double eps_root);
/* One leaf of n elements: mu, nu and p updated in place from the gradient g (the same
 * formulas in f32 and in f64). */
void lim_adam_leaf(const lim_adam_step *s, float *restrict p, float *restrict mu,
                   float *restrict nu, const float *restrict g, int64_t n);
void lim_adam_leaf_f64(const lim_adam_step_f64 *s, double *restrict p, double *restrict mu,
                       double *restrict nu, const double *restrict g, int64_t n);

/* ---- the digits CNN, batch 64: one Adam train step (lim_cnn.c) ---------------------------- */

enum { LIM_CNN_B = 64, LIM_CNN_NLEAF = 8 };

typedef struct lim_cnn lim_cnn;

/* A model with its buffers, zeroed: the 8 parameters (conv 1->16 weight f32[16, 1, 3, 3],
 * bias [16] (nabla's [16, 1, 1]); conv 16->32 weight [32, 16, 3, 3], bias [32]; Linear
 * 512->64 weight [64, 512], bias [64]; Linear 64->10 weight [10, 64], bias [10]; row-major),
 * Adam's mu and nu, x f32[64, 1, 8, 8], labels i32[64]; Adam's hyperparameters Optax's
 * (1e-3, 0.9, 0.999, 1e-8, 0) and count 0. NULL when out of memory. */
lim_cnn *lim_cnn_create(void);
void lim_cnn_destroy(lim_cnn *m);
/* Leaf i in 0..7, in the order above, of the parameters (which 0), mu (1) or nu (2); *n (if
 * not NULL): its element count. */
float *lim_cnn_leaf(lim_cnn *m, int which, int i, int64_t *n);
float *lim_cnn_x(lim_cnn *m);
int32_t *lim_cnn_labels(lim_cnn *m);
void lim_cnn_set_adam(lim_cnn *m, int32_t count, double lr, double b1, double b2, double eps,
                      double eps_root);
/* One train step in place (params, mu, nu, count); returns the loss before the update. */
float lim_cnn_step(lim_cnn *m);
/* The floating-point operations of the step's products (2 m n k each). */
double lim_cnn_flops(void);

/* ---- the 2-layer GRU character model, batch 32, 64 steps: one Adam train step (lim_gru.c) -- */

enum { LIM_GRU_B = 32, LIM_GRU_T = 64, LIM_GRU_E = 32, LIM_GRU_H = 128, LIM_GRU_V = 65 };
enum { LIM_GRU_NLEAF = 11 };

typedef struct lim_gru lim_gru;

/* A model with its buffers, zeroed: the 11 parameters (emb.weight f32[65, 32]; gru1's
 * weight_ih [384, 32], weight_hh [384, 128], bias [384], bias_n [128]; gru2's weight_ih
 * [384, 128], weight_hh [384, 128], bias [384], bias_n [128]; out.weight [65, 128], out.bias
 * [65]; row-major, gates r, z, n along the 384 rows as src/nn/rnn.c), Adam's mu and nu, the
 * inputs and targets i32[32, 64] (batch-major, as bench_layers' batch); Adam as lim_cnn.
 * NULL when out of memory. */
lim_gru *lim_gru_create(void);
void lim_gru_destroy(lim_gru *m);
/* Leaf i in 0..10, in the order above, of the parameters (which 0), mu (1) or nu (2); *n (if
 * not NULL): its element count. */
float *lim_gru_leaf(lim_gru *m, int which, int i, int64_t *n);
int32_t *lim_gru_inputs(lim_gru *m);
int32_t *lim_gru_targets(lim_gru *m);
void lim_gru_set_adam(lim_gru *m, int32_t count, double lr, double b1, double b2, double eps,
                      double eps_root);
/* One train step in place (params, mu, nu, count); returns the loss before the update. */
float lim_gru_step(lim_gru *m);
/* The floating-point operations of the step's products (2 m n k each). */
double lim_gru_flops(void);

/* ---- shared pieces (lim_nn.c) ------------------------------------------------------------- */

/* c[m, n] (row stride ldc) = a @ b + beta c, a and b with element strides (rows, columns): one
 * BLIS call (bli_sgemm_ex) on one thread. */
void lim_sgemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t ars, int64_t acs,
               const float *b, int64_t brs, int64_t bcs, float beta, float *c, int64_t ldc);

/* A model's buffers: zeroed, 64-byte aligned, freed together. */
typedef struct lim_bufs {
    void *blocks[128];
    int n;
} lim_bufs;
/* n floats (or as many 4-byte elements); NULL when out of memory or out of slots. */
float *lim_bufs_alloc(lim_bufs *b, int64_t n);
void lim_bufs_free(lim_bufs *b);

/* The mean cross-entropy of the rows of z [rows, v] (bias b [v] added in place first, if not
 * NULL) against the labels y [rows], by the stable log-softmax as nabla's: mx (the row's
 * maximum, 0 if not finite), e = exp(z - mx) [rows, v], s = sum e [rows], ls [rows] scratch.
 * Returns the loss; z keeps the biased logits. */
float lim_xent_fwd(const lim_vmath *vm, float *z, const float *b, float *e, float *mx, float *s,
                   float *ls, const int32_t *y, int64_t rows, int64_t v);
/* Its gradient into dz [rows, v] (may be z): (softmax - onehot(y)) / rows. */
void lim_xent_bwd(float *dz, const float *e, const float *s, const int32_t *y, int64_t rows,
                  int64_t v);
/* c[j] = sum_i a[i, j], i < rows, j < cols, a's rows lda apart (in row order) */
void lim_colsum(float *restrict c, const float *restrict a, int64_t rows, int64_t cols,
                int64_t lda);

/* 3x3 convolutions with padding 1 on 8x8 images, channel-major activations [c, n, 8, 8]:
 * cols [c 9, n 64] (row c 9 + ky 3 + kx, zeros where a tap reads the padding) from in; the
 * transpose (out = the sum of the columns' elements at each input; out is overwritten). */
void lim_conv_im2col(float *cols, const float *in, int64_t c, int64_t n);
void lim_conv_col2im(float *out, const float *cols, int64_t c, int64_t n);
/* a [rows, len] = relu(a + bias[row]) */
void lim_bias_relu_rows(float *restrict a, const float *restrict bias, int64_t rows, int64_t len);
/* d [rows, len] *= (a > 0), db[row] = its row sums (16 running sums; len a multiple of 16) */
void lim_relu_back_rows(float *restrict d, const float *restrict a, float *restrict db,
                        int64_t rows, int64_t len);
/* Max pool 2x2 stride 2 of a [c, n, 8, 8] into f [n, c 16] (feature c 16 + y 4 + x, the
 * flatten of [n, c, 4, 4]), arg [n, c 16] the index in a of each window's first maximum (NaN
 * wins, as src/nn/pool.c); and its backward: da (zeroed first) gets df at those indices. */
void lim_pool_fwd(float *restrict f, int32_t *restrict arg, const float *restrict a, int64_t c,
                  int64_t n);
void lim_pool_bwd(float *restrict da, const float *restrict df, const int32_t *restrict arg,
                  int64_t c, int64_t n);

/* One GRU layer (src/nn/rnn.c's cell, gates r, z, n) over t steps of a batch of b, time-major
 * (row s b + i is step s, example i), every step's gates and states stored. The buffers: x
 * [t b, in] (the inputs, borrowed), ig [t b, 3h], r, z, n, hn [t b, h], hs [(t + 1) b, h]
 * (block 0 the zero initial state), di, dg [t b, 3h]; scratch hg, pre [b, 3h], dh [b, h]. */
typedef struct lim_gru_layer {
    int64_t b, t, in, h;
    const float *x;
    float *ig, *r, *z, *n, *hn, *hs, *di, *dg, *hg, *pre, *dh;
} lim_gru_layer;
/* The buffers of l (its sizes set) from bufs; 0 when out of memory. */
int lim_gru_layer_alloc(lim_gru_layer *l, lim_bufs *bufs);
/* w: weight_ih [3h, in], weight_hh [3h, h], bias [3h], bias_n [h]. */
void lim_gru_layer_fwd(const lim_vmath *vm, lim_gru_layer *l, const float *const w[4]);
/* From dy [t b, h] (the outputs' gradient): gw (the four weights' gradients, overwritten) and
 * dx [t b, in] (NULL: not wanted). */
void lim_gru_layer_bwd(lim_gru_layer *l, const float *const w[4], float *const gw[4],
                       const float *dy, float *dx);

/* ---- the stochastic problems of nabla bench: one Adam train step (lim_suite.c) ------------ */

enum { LIM_SUITE_MAX_LEAF = 8 };

typedef struct lim_suite lim_suite;

/* The limit of problem name (bench_problems.c's: "logreg_mb", "mlp_mb", "cnn_mb", "char_gru",
 * "noisy_quadratic", "lotka_volterra_mb"), its buffers zeroed and Adam as lim_cnn's; NULL for
 * another name or out of memory. */
lim_suite *lim_suite_create(const char *name);
void lim_suite_destroy(lim_suite *m);
int lim_suite_n_leaves(const lim_suite *m);
/* Leaf i's path in nabla's params tree (nb_tree_lookup syntax) and its element count. */
const char *lim_suite_leaf_path(const lim_suite *m, int i, int64_t *n);
/* 1 when the problem's leaves, batch and Adam are f64 (lotka_volterra_mb), else 0 (f32). */
int lim_suite_f64(const lim_suite *m);
/* Leaf i of the parameters (which 0), mu (1) or nu (2): float, or double when lim_suite_f64. */
void *lim_suite_leaf(lim_suite *m, int which, int i);
/* lotka_volterra_mb: the solver steps (kept and rejected) of the last step's solve (-1 before
 * the first); -1 for the other problems. */
int lim_suite_ode_steps(const lim_suite *m);
/* The minibatch, borrowed until the next call (the step reads it where it is): x and y as the
 * batch's train split holds them (x f32 [batch, features], char_gru's windows i32 [32, 17], or
 * lotka_volterra_mb's observation sets f64 [4, 2, 20]; y i32 [batch] or NULL), extra
 * noisy_quadratic's H f32 [100, 100] (else NULL). Sizes: lim_suite_batch_size. */
void lim_suite_set_batch(lim_suite *m, const void *x, const int32_t *y, const float *extra);
/* Elements of x, y (0: none) and extra (0: none) the problem expects. */
void lim_suite_batch_size(const lim_suite *m, int64_t *nx, int64_t *ny, int64_t *nextra);
void lim_suite_set_adam(lim_suite *m, int32_t count, double lr, double b1, double b2, double eps,
                        double eps_root);
/* One train step in place; returns the loss before the update. */
double lim_suite_step(lim_suite *m);
/* The floating-point operations of the step's products (2 m n k each; the logistic regression's
 * and the quadratic's loops counted alike; 0 for lotka_volterra_mb, which has none). */
double lim_suite_flops(const lim_suite *m);

#endif
