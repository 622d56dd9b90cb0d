/*
 * limits.h -- hand-written plain C versions of the workloads of bench_native (issue 19),
 * bench_vmap and bench_layers: the "limit" a compiled nabla program is measured against. No
 * nabla here: each is the computation written out as a C programmer would, doing the same
 * arithmetic in the same order as nabla's interpreter, so that the results agree bit for bit
 * where the order is the same (and the benchmark checks that they do).
 *
 *   lim_lv.c      Lotka-Volterra solved with Tsitouras 5(4) and the PID controller of
 *                 src/ode/solve.c (same first step, error norm, safety factors, clipping to
 *                 t1: the same steps); its gradient by the discrete adjoint of those steps,
 *                 every accepted step's state and stage inputs stored in the forward pass
 *                 (the limit of a checkpointed reverse sweep: nothing recomputed)
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
 *   lim_vmath_*.c SLEEF's vector functions, chosen per CPU as nabla chooses them (AVX2 + FMA,
 *                 else SSE2): tanhf u35, expf and logf u10, pow u10 (f64)
 *
 * The two models of bench_layers are checked against nabla within rounding, not bit for bit:
 * their products are single BLIS calls over the whole batch (and, for the GRU, the whole
 * sequence) where nabla's are not, so the sums are in another order.
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
    const char *isa;                                      /* "avx2" or "sse2" */
    void (*tanhf_n)(float *o, const float *x, int64_t n); /* Sleef_tanhf*_u35 */
    void (*expf_n)(float *o, const float *x, int64_t n);  /* Sleef_expf*_u10 */
    void (*logf_n)(float *o, const float *x, int64_t n);  /* Sleef_logf*_u10 */
    double (*pow1)(double x, double y);                   /* Sleef_powd*_u10, one lane */
} lim_vmath;

/* The table for this CPU (AVX2 and FMA: the AVX2 one, else SSE2), as nbi_vmath_get. */
const lim_vmath *lim_vmath_get(void);
extern const lim_vmath lim_vmath_avx2;
extern const lim_vmath lim_vmath_sse2;

/* ---- Lotka-Volterra, tsit5 --------------------------------------------------------------- */

/* Tsitouras 5(4) as src/ode/tableau.c has it (the same doubles: the benchmark compares them
 * with nabla's table bit for bit): c[7], a[7 * 7] (row-major, strictly lower), b[7], e[7]. */
extern const double lim_tsit5_c[7], lim_tsit5_a[49], lim_tsit5_b[7], lim_tsit5_e[7];

typedef struct lim_lv_opts {
    double t0, t1;
    double dt0;        /* the first step; 0: Hairer's initial step selection (as nabla) */
    double rtol, atol; /* the PID controller's (nb_ode_pid: I controller, safety 0.9, factors
                          0.2 .. 10) */
    int max_steps;
} lim_lv_opts;

typedef struct lim_lv_stats {
    int steps, accepted, rejected;
    int result; /* 0 successful, 1 max_steps reached, 2 step size underflow, 3 non-finite
                   (nb_ode_result's values) */
} lim_lv_stats;

/* dx/dt = a x - b x y, dy/dt = -c y + d x y; p = (a, b, c, d, x0, y0). y = (x(t1), y(t1)). */
int lim_lv_solve(const double p[6], const lim_lv_opts *o, double y[2], lim_lv_stats *st);

/* Bytes of the work buffer lim_lv_grad needs for up to max_steps steps. */
size_t lim_lv_grad_work_bytes(int max_steps);

/* g = dG/dp for G = x(t1) + y(t1): the discrete adjoint of the accepted steps (the step
 * sizes and the accept/reject decisions are constants, as nabla's stop_gradient makes
 * them). work: lim_lv_grad_work_bytes(o->max_steps) bytes, 8-byte aligned. y (may be NULL):
 * the solution at t1. Returns st->result. */
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

/* One step's coefficients, in f32 (the bias corrections rbc computed in f64). */
typedef struct lim_adam_step {
    float b1, c1, b2, c2, rbc1, rbc2, eps, eps_root, nlr;
} lim_adam_step;

/* Counts a step (*count + 1, saturating at INT32_MAX) and returns its coefficients. */
lim_adam_step lim_adam_begin(int32_t *count, double lr, double b1, double b2, double eps,
                             double eps_root);
/* One leaf of n elements: mu, nu and p updated in place from the gradient g. */
void lim_adam_leaf(const lim_adam_step *s, float *restrict p, float *restrict mu,
                   float *restrict nu, const float *restrict g, int64_t n);

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

#endif
