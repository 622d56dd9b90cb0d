/*
 * lim_suite.c -- the train steps of `nabla bench`'s stochastic problems (tools/bench_problems.c),
 * hand-written (limits.h), for bench_suite: one step on the minibatch nabla's step gets (the
 * batch arrays bench_stream fills, read where they are), Adam as nabla's (lim_adam.c) on every
 * leaf. Each forward stores what its backward needs; nothing is recomputed.
 *
 *   logreg_mb        z = x w + b (x [16, 30]); loss mean(softplus(z) - y z), softplus as nabla's
 *                    max(z, 0) + log1p(exp(-|z|)) (SLEEF expf, log1pf u10); dz = (sigmoid(z) -
 *                    y) / 16 with sigmoid from the same exp(-|z|); dw = x^T dz. Plain loops
 *                    (a [16, 30] matrix: a BLIS call would cost more than the product).
 *   mlp_mb           the MLP 64-32-10 (relu), batch 32: its 5 products in BLIS, bias, relu, the
 *                    cross-entropy (lim_nn.c) and the bias gradients in loops.
 *   cnn_mb           conv 1->8 3x3 SAME (im2col [9, 2048] and one BLIS product), bias + relu,
 *                    max pool 2x2 -> [32, 128], Linear 128->10 (BLIS), the cross-entropy; the
 *                    backward as lim_cnn.c's (the first convolution: dW only). lim_nn.c's
 *                    pieces, shared with lim_cnn.c.
 *   char_gru         Embedding 65->16, one GRU cell 16->64 over the 16 characters of each of 32
 *                    windows (lim_gru.c's layer, every step's gates stored), Linear 64->65 on
 *                    the 512 states (BLIS), the cross-entropy against the next characters. The
 *                    windows [32, 17] are read as nabla's step reads them: inputs the first 16
 *                    of each, targets the last 16 (the slicing is inside nabla's step).
 *   noisy_quadratic  r = theta - x (x [128, 100]), rh = r H (one BLIS product), loss 0.5
 *                    mean(sum(rh r, 1)); the gradient 0.5 / 128 (sum_i rh_i + (sum_i r_i) H^T):
 *                    nabla's dr = c (rh + r H^T) summed over the rows, with the sum taken
 *                    before the product (a [1, 100] x [100, 100] product; distributivity, so
 *                    the same value to rounding) -- what a C programmer writes, and what
 *                    nabla's sum-matmul pass makes of its gradient since session 21 (before,
 *                    a [128, 100] x [100, 100] product).
 *   lotka_volterra_mb  f64: the parameters (a, b, c, d) clamped into [0.05, 8] (the share of
 *                    the gradient nabla's maximum and minimum pass: 1, 1/2 on a tie, 0), one
 *                    solve from x = y = 1 (lim_lv.c: tsit5, PID rtol = atol = 1e-6, Hairer's
 *                    first step, t 0 .. 10, SaveAt ts 0.5, 1, .., 10, max_steps 4096: nabla's
 *                    steps), the mean of the squared residuals of the 20 saved (x, y) against
 *                    the batch's 4 observation sets [4, 2, 20], its gradient by lim_lv.c's
 *                    discrete adjoint (every step's stage inputs stored in the forward); +inf
 *                    and a zero gradient when a parameter is outside the box or the solve did
 *                    not succeed (nabla's select), then Adam in f64 (lim_adam_leaf_f64).
 */
#include "limits.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { K_LOGREG, K_MLP, K_CNN, K_GRU, K_NQ, K_LV };

/* sizes (bench_problems.c's) */
enum { LR_B = 16, LR_F = 30 };
enum { MLP_B = 32, MLP_IN = 64, MLP_H = 32, NCLS = 10 };
enum { CNN_B = 32, CNN_C = 8, CNN_NL = CNN_B * 64, CNN_F = CNN_C * 16 };
enum { GRU_B = 32, GRU_T = 16, GRU_W = GRU_T + 1, GRU_E = 16, GRU_H = 64, GRU_V = 65 };
enum { GRU_TB = GRU_T * GRU_B };
enum { NQ_B = 128, NQ_D = 100 };
enum { LV_B = 4, LV_PTS = 20, LV_MAX_STEPS = 4096 };
#define LV_LO 0.05 /* bench_problems.c's BP_LV_LO, BP_LV_HI, BP_LV_T_END */
#define LV_HI 8.0
#define LV_T1 10.0
#define LV_TOL 1e-6

typedef struct lim_suite_spec {
    const char *name;
    int kind, n_leaf;
    const char *path[LIM_SUITE_MAX_LEAF];
    int64_t n[LIM_SUITE_MAX_LEAF];
    int64_t nx, ny, nextra;
} lim_suite_spec;

static const lim_suite_spec lim_suite_specs[] = {
    {"logreg_mb", K_LOGREG, 2, {".w", ".b"}, {LR_F, 1}, LR_B *LR_F, LR_B, 0},
    {"mlp_mb",
     K_MLP,
     4,
     {".layers[0].weight", ".layers[0].bias", ".layers[1].weight", ".layers[1].bias"},
     {MLP_H * MLP_IN, MLP_H, NCLS *MLP_H, NCLS},
     MLP_B *MLP_IN,
     MLP_B,
     0},
    {"cnn_mb",
     K_CNN,
     4,
     {".layers[0].weight", ".layers[0].bias", ".layers[4].weight", ".layers[4].bias"},
     {CNN_C * 9, CNN_C, NCLS *CNN_F, NCLS},
     CNN_B * 64,
     CNN_B,
     0},
    {"char_gru",
     K_GRU,
     7,
     {".emb.weight", ".gru.weight_ih", ".gru.weight_hh", ".gru.bias", ".gru.bias_n", ".out.weight",
      ".out.bias"},
     {GRU_V * GRU_E, 3 * GRU_H *GRU_E, 3 * GRU_H *GRU_H, 3 * GRU_H, GRU_H, GRU_V *GRU_H, GRU_V},
     GRU_B *GRU_W,
     0,
     0},
    {"noisy_quadratic", K_NQ, 1, {".theta"}, {NQ_D}, NQ_B *NQ_D, 0, NQ_D *NQ_D},
    {"lotka_volterra_mb", K_LV, 4, {".a", ".b", ".c", ".d"}, {1, 1, 1, 1}, LV_B * 2 * LV_PTS, 0, 0},
};

struct lim_suite {
    const lim_suite_spec *spec;
    float *p[LIM_SUITE_MAX_LEAF], *mu[LIM_SUITE_MAX_LEAF], *nu[LIM_SUITE_MAX_LEAF];
    float *g[LIM_SUITE_MAX_LEAF];
    int32_t count;
    double lr, b1, b2, eps, eps_root;
    const float *x, *extra; /* the batch (borrowed) */
    const int32_t *xi, *y;
    /* activations and gradients (the ones a problem uses) */
    float *a0, *a1, *z, *e, *mx, *s, *ls, *d0, *d1;
    float *cols, *f, *df;
    int32_t *arg, *tgt;
    lim_gru_layer l;
    lim_bufs bufs;
    /* lotka_volterra_mb: f64 leaves, the batch [4, 2, 20], the solve's work and saves */
    double lp[4], lmu[4], lnu[4], lg[4];
    const double *lx;
    double ts[LV_PTS], ys[2 * LV_PTS], ysbar[2 * LV_PTS];
    lim_lv_opts lvo;
    lim_lv_stats lst;
    void *lwork;
};

lim_suite *lim_suite_create(const char *name) {
    const lim_suite_spec *sp = NULL;
    for (size_t i = 0; name != NULL && i < sizeof lim_suite_specs / sizeof lim_suite_specs[0];
         i++) {
        if (strcmp(lim_suite_specs[i].name, name) == 0) {
            sp = &lim_suite_specs[i];
        }
    }
    if (sp == NULL) {
        return NULL;
    }
    lim_suite *m = calloc(1, sizeof *m);
    if (m == NULL) {
        return NULL;
    }
    m->spec = sp;
    lim_bufs *b = &m->bufs;
    int ok = 1;
    for (int i = 0; sp->kind != K_LV && i < sp->n_leaf; i++) {
        ok &= (m->p[i] = lim_bufs_alloc(b, sp->n[i])) != NULL;
        ok &= (m->mu[i] = lim_bufs_alloc(b, sp->n[i])) != NULL;
        ok &= (m->nu[i] = lim_bufs_alloc(b, sp->n[i])) != NULL;
        ok &= (m->g[i] = lim_bufs_alloc(b, sp->n[i])) != NULL;
    }
    switch (sp->kind) {
    case K_LOGREG:
        ok &= (m->z = lim_bufs_alloc(b, LR_B)) != NULL;
        ok &= (m->e = lim_bufs_alloc(b, LR_B)) != NULL;
        ok &= (m->ls = lim_bufs_alloc(b, LR_B)) != NULL;
        ok &= (m->d0 = lim_bufs_alloc(b, LR_B)) != NULL;
        break;
    case K_MLP:
        ok &= (m->a0 = lim_bufs_alloc(b, MLP_B * MLP_H)) != NULL;
        ok &= (m->d0 = lim_bufs_alloc(b, MLP_B * MLP_H)) != NULL;
        ok &= (m->z = lim_bufs_alloc(b, MLP_B * NCLS)) != NULL;
        ok &= (m->e = lim_bufs_alloc(b, MLP_B * NCLS)) != NULL;
        ok &= (m->mx = lim_bufs_alloc(b, MLP_B)) != NULL;
        ok &= (m->s = lim_bufs_alloc(b, MLP_B)) != NULL;
        ok &= (m->ls = lim_bufs_alloc(b, MLP_B)) != NULL;
        break;
    case K_CNN:
        ok &= (m->cols = lim_bufs_alloc(b, 9 * CNN_NL)) != NULL;
        ok &= (m->a0 = lim_bufs_alloc(b, CNN_C * CNN_NL)) != NULL;
        ok &= (m->d0 = lim_bufs_alloc(b, CNN_C * CNN_NL)) != NULL;
        ok &= (m->arg = (int32_t *)lim_bufs_alloc(b, CNN_B * CNN_F)) != NULL;
        ok &= (m->f = lim_bufs_alloc(b, CNN_B * CNN_F)) != NULL;
        ok &= (m->df = lim_bufs_alloc(b, CNN_B * CNN_F)) != NULL;
        ok &= (m->z = lim_bufs_alloc(b, CNN_B * NCLS)) != NULL;
        ok &= (m->e = lim_bufs_alloc(b, CNN_B * NCLS)) != NULL;
        ok &= (m->mx = lim_bufs_alloc(b, CNN_B)) != NULL;
        ok &= (m->s = lim_bufs_alloc(b, CNN_B)) != NULL;
        ok &= (m->ls = lim_bufs_alloc(b, CNN_B)) != NULL;
        break;
    case K_GRU:
        ok &= (m->a0 = lim_bufs_alloc(b, GRU_TB * GRU_E)) != NULL; /* embeddings */
        ok &= (m->d0 = lim_bufs_alloc(b, GRU_TB * GRU_E)) != NULL; /* their gradient */
        ok &= (m->d1 = lim_bufs_alloc(b, GRU_TB * GRU_H)) != NULL; /* the states' */
        ok &= (m->z = lim_bufs_alloc(b, GRU_TB * GRU_V)) != NULL;
        ok &= (m->e = lim_bufs_alloc(b, GRU_TB * GRU_V)) != NULL;
        ok &= (m->mx = lim_bufs_alloc(b, GRU_TB)) != NULL;
        ok &= (m->s = lim_bufs_alloc(b, GRU_TB)) != NULL;
        ok &= (m->ls = lim_bufs_alloc(b, GRU_TB)) != NULL;
        ok &= (m->tgt = (int32_t *)lim_bufs_alloc(b, GRU_TB)) != NULL;
        m->l = (lim_gru_layer){.b = GRU_B, .t = GRU_T, .in = GRU_E, .h = GRU_H};
        ok &= lim_gru_layer_alloc(&m->l, b);
        m->l.x = m->a0;
        break;
    case K_LV:
        for (int i = 0; i < LV_PTS; i++) { /* bp_lv_solve's save times */
            m->ts[i] = LV_T1 * (double)(i + 1) / (double)LV_PTS;
        }
        m->lvo = (lim_lv_opts){.t0 = 0.0,
                               .t1 = LV_T1,
                               .dt0 = 0.0,
                               .rtol = LV_TOL,
                               .atol = LV_TOL,
                               .max_steps = LV_MAX_STEPS,
                               .n_ts = LV_PTS,
                               .ts = m->ts};
        m->lst.steps = -1;
        ok &= (m->lwork = lim_bufs_alloc(b, (int64_t)(lim_lv_work_bytes(&m->lvo) + 3) / 4)) != NULL;
        break;
    default:                                                    /* K_NQ */
        ok &= (m->a0 = lim_bufs_alloc(b, NQ_B * NQ_D)) != NULL; /* r */
        ok &= (m->a1 = lim_bufs_alloc(b, NQ_B * NQ_D)) != NULL; /* r H */
        ok &= (m->d0 = lim_bufs_alloc(b, NQ_D)) != NULL;
        ok &= (m->d1 = lim_bufs_alloc(b, NQ_D)) != NULL;
        break;
    }
    if (!ok) {
        lim_suite_destroy(m);
        return NULL;
    }
    m->lr = 1e-3, m->b1 = 0.9, m->b2 = 0.999, m->eps = 1e-8, m->eps_root = 0.0;
    return m;
}

void lim_suite_destroy(lim_suite *m) {
    if (m != NULL) {
        lim_bufs_free(&m->bufs);
        free(m);
    }
}

int lim_suite_n_leaves(const lim_suite *m) {
    return m->spec->n_leaf;
}

const char *lim_suite_leaf_path(const lim_suite *m, int i, int64_t *n) {
    if (n != NULL) {
        *n = m->spec->n[i];
    }
    return m->spec->path[i];
}

int lim_suite_f64(const lim_suite *m) {
    return m->spec->kind == K_LV;
}

void *lim_suite_leaf(lim_suite *m, int which, int i) {
    if (m->spec->kind == K_LV) {
        return which == 0 ? &m->lp[i] : which == 1 ? &m->lmu[i] : &m->lnu[i];
    }
    return which == 0 ? m->p[i] : which == 1 ? m->mu[i] : m->nu[i];
}

int lim_suite_ode_steps(const lim_suite *m) {
    return m->spec->kind == K_LV ? m->lst.steps : -1;
}

void lim_suite_set_batch(lim_suite *m, const void *x, const int32_t *y, const float *extra) {
    m->x = x;
    m->xi = x;
    m->lx = x;
    m->y = y;
    m->extra = extra;
}

void lim_suite_batch_size(const lim_suite *m, int64_t *nx, int64_t *ny, int64_t *nextra) {
    *nx = m->spec->nx;
    *ny = m->spec->ny;
    *nextra = m->spec->nextra;
}

void lim_suite_set_adam(lim_suite *m, int32_t count, double lr, double b1, double b2, double eps,
                        double eps_root) {
    m->count = count, m->lr = lr, m->b1 = b1, m->b2 = b2, m->eps = eps, m->eps_root = eps_root;
}

double lim_suite_flops(const lim_suite *m) {
    switch (m->spec->kind) {
    case K_LOGREG:
        return 2 * 2.0 * LR_B * LR_F; /* z = x w, dw = x^T dz */
    case K_MLP:
        return 3 * (2.0 * MLP_B * MLP_H * MLP_IN + 2.0 * MLP_B * NCLS * MLP_H) -
               2.0 * MLP_B * MLP_H * MLP_IN; /* no dx */
    case K_CNN:
        return 2 * 2.0 * CNN_C * 9 * CNN_NL + 3 * 2.0 * CNN_B * NCLS * CNN_F;
    case K_GRU: {
        double g3 = 3.0 * GRU_H;
        double fwd =
            2.0 * GRU_TB * g3 * GRU_E + 2.0 * GRU_TB * g3 * GRU_H + 2.0 * GRU_TB * GRU_V * GRU_H;
        return 3 * fwd - 2.0 * GRU_B * g3 * GRU_H; /* no dh at t = 0 */
    }
    case K_NQ:
        return 2.0 * NQ_B * NQ_D * NQ_D + 2.0 * NQ_D * NQ_D;
    default:
        return 0.0; /* lotka_volterra_mb: no products */
    }
}

/* c[mm, nn] = a @ b (lim_sgemm) */
static void gemm(int64_t mm, int64_t nn, int64_t kk, const float *a, int64_t ars, int64_t acs,
                 const float *b, int64_t brs, int64_t bcs, float *c) {
    lim_sgemm(mm, nn, kk, a, ars, acs, b, brs, bcs, 0.0f, c, nn);
}

static float step_logreg(lim_suite *m, const lim_vmath *vm) {
    const float *x = m->x, *w = m->p[0];
    float *z = m->z, *e = m->e, *t = m->ls, *dz = m->d0;
    const float bias = m->p[1][0];
    for (int i = 0; i < LR_B; i++) {
        float acc = x[i * LR_F] * w[0];
        for (int j = 1; j < LR_F; j++) {
            acc = acc + x[i * LR_F + j] * w[j];
        }
        z[i] = acc + bias;
        e[i] = -fabsf(z[i]);
    }
    vm->expf_n(e, e, LR_B); /* exp(-|z|) */
    vm->log1pf_n(t, e, LR_B);
    float total = 0.0f;
    const float inv = 1.0f / (float)LR_B;
    for (int i = 0; i < LR_B; i++) {
        float y = (float)m->y[i];
        float sp = (z[i] > 0 ? z[i] : 0.0f) + t[i];
        float v = sp - y * z[i];
        total = i == 0 ? v : total + v;
        float sg = (z[i] >= 0 ? 1.0f : e[i]) / (1.0f + e[i]);
        dz[i] = inv * sg - inv * y;
    }
    float *gw = m->g[0];
    for (int j = 0; j < LR_F; j++) {
        gw[j] = x[j] * dz[0];
    }
    float gb = dz[0];
    for (int i = 1; i < LR_B; i++) {
        for (int j = 0; j < LR_F; j++) {
            gw[j] = gw[j] + x[i * LR_F + j] * dz[i];
        }
        gb = gb + dz[i];
    }
    m->g[1][0] = gb;
    return total / (float)LR_B;
}

static float step_mlp(lim_suite *m, const lim_vmath *vm) {
    float *const *p = m->p;
    float *h = m->a0, *z = m->z, *dh = m->d0;
    gemm(MLP_B, MLP_H, MLP_IN, m->x, MLP_IN, 1, p[0], 1, MLP_IN, h); /* x W0^T */
    for (int i = 0; i < MLP_B; i++) {
        for (int j = 0; j < MLP_H; j++) {
            float v = h[i * MLP_H + j] + p[1][j];
            h[i * MLP_H + j] = v > 0.0f ? v : 0.0f;
        }
    }
    gemm(MLP_B, NCLS, MLP_H, h, MLP_H, 1, p[2], 1, MLP_H, z); /* h W1^T */
    float loss = lim_xent_fwd(vm, z, p[3], m->e, m->mx, m->s, m->ls, m->y, MLP_B, NCLS);
    lim_xent_bwd(z, m->e, m->s, m->y, MLP_B, NCLS);
    lim_colsum(m->g[3], z, MLP_B, NCLS, NCLS);
    gemm(NCLS, MLP_H, MLP_B, z, 1, NCLS, h, MLP_H, 1, m->g[2]); /* dW1 = dz^T h */
    gemm(MLP_B, MLP_H, NCLS, z, NCLS, 1, p[2], MLP_H, 1, dh);   /* dh = dz W1 */
    for (int i = 0; i < MLP_B * MLP_H; i++) {
        dh[i] = h[i] > 0.0f ? dh[i] : 0.0f;
    }
    lim_colsum(m->g[1], dh, MLP_B, MLP_H, MLP_H);
    gemm(MLP_H, MLP_IN, MLP_B, dh, 1, MLP_H, m->x, MLP_IN, 1, m->g[0]); /* dW0 = dh^T x */
    return loss;
}

static float step_cnn(lim_suite *m, const lim_vmath *vm) {
    float *const *p = m->p;
    /* x [32, 64] is [32, 1, 8, 8], and so [1, 32, 8, 8] */
    lim_conv_im2col(m->cols, m->x, 1, CNN_B);
    gemm(CNN_C, CNN_NL, 9, p[0], 9, 1, m->cols, CNN_NL, 1, m->a0);
    lim_bias_relu_rows(m->a0, p[1], CNN_C, CNN_NL);
    lim_pool_fwd(m->f, m->arg, m->a0, CNN_C, CNN_B);
    float *z = m->z;
    gemm(CNN_B, NCLS, CNN_F, m->f, CNN_F, 1, p[2], 1, CNN_F, z); /* f W^T */
    float loss = lim_xent_fwd(vm, z, p[3], m->e, m->mx, m->s, m->ls, m->y, CNN_B, NCLS);
    lim_xent_bwd(z, m->e, m->s, m->y, CNN_B, NCLS);
    lim_colsum(m->g[3], z, CNN_B, NCLS, NCLS);
    gemm(NCLS, CNN_F, CNN_B, z, 1, NCLS, m->f, CNN_F, 1, m->g[2]); /* dW = dz^T f */
    gemm(CNN_B, CNN_F, NCLS, z, NCLS, 1, p[2], CNN_F, 1, m->df);   /* df = dz W */
    lim_pool_bwd(m->d0, m->df, m->arg, CNN_C, CNN_B);
    lim_relu_back_rows(m->d0, m->a0, m->g[1], CNN_C, CNN_NL);
    gemm(CNN_C, 9, CNN_NL, m->d0, CNN_NL, 1, m->cols, 1, CNN_NL, m->g[0]); /* dW = dY cols^T */
    return loss;
}

static float step_gru(lim_suite *m, const lim_vmath *vm) {
    float *const *p = m->p;
    const int32_t *w = m->xi; /* windows [32, 17] */
    /* the embeddings of the inputs and the targets, time-major */
    for (int t = 0; t < GRU_T; t++) {
        for (int b = 0; b < GRU_B; b++) {
            memcpy(m->a0 + (t * GRU_B + b) * GRU_E, p[0] + w[b * GRU_W + t] * GRU_E,
                   GRU_E * sizeof(float));
            m->tgt[t * GRU_B + b] = w[b * GRU_W + t + 1];
        }
    }
    const float *wc[4] = {p[1], p[2], p[3], p[4]};
    lim_gru_layer_fwd(vm, &m->l, wc);
    const float *hs = m->l.hs + GRU_B * GRU_H;
    float *z = m->z;
    gemm(GRU_TB, GRU_V, GRU_H, hs, GRU_H, 1, p[5], 1, GRU_H, z);
    float loss = lim_xent_fwd(vm, z, p[6], m->e, m->mx, m->s, m->ls, m->tgt, GRU_TB, GRU_V);
    lim_xent_bwd(z, m->e, m->s, m->tgt, GRU_TB, GRU_V);
    lim_colsum(m->g[6], z, GRU_TB, GRU_V, GRU_V);
    gemm(GRU_V, GRU_H, GRU_TB, z, 1, GRU_V, hs, GRU_H, 1, m->g[5]); /* dW_out = dz^T h */
    gemm(GRU_TB, GRU_H, GRU_V, z, GRU_V, 1, p[5], GRU_H, 1, m->d1); /* dh = dz W_out */
    lim_gru_layer_bwd(&m->l, wc, (float *const[4]){m->g[1], m->g[2], m->g[3], m->g[4]}, m->d1,
                      m->d0);
    memset(m->g[0], 0, (size_t)GRU_V * GRU_E * sizeof(float));
    for (int t = 0; t < GRU_T; t++) {
        for (int b = 0; b < GRU_B; b++) {
            float *restrict gr = m->g[0] + w[b * GRU_W + t] * GRU_E;
            const float *restrict dr = m->d0 + (t * GRU_B + b) * GRU_E;
            for (int j = 0; j < GRU_E; j++) {
                gr[j] = gr[j] + dr[j];
            }
        }
    }
    return loss;
}

static float step_nq(lim_suite *m) {
    const float *theta = m->p[0], *x = m->x, *hm = m->extra;
    float *r = m->a0, *rh = m->a1, *rs = m->d0, *hs = m->d1, *g = m->g[0];
    for (int i = 0; i < NQ_B; i++) {
        for (int j = 0; j < NQ_D; j++) {
            r[i * NQ_D + j] = theta[j] - x[i * NQ_D + j];
        }
    }
    gemm(NQ_B, NQ_D, NQ_D, r, NQ_D, 1, hm, NQ_D, 1, rh); /* r H */
    float total = 0.0f;
    for (int i = 0; i < NQ_B; i++) {
        float q = rh[i * NQ_D] * r[i * NQ_D];
        for (int j = 1; j < NQ_D; j++) {
            q = q + rh[i * NQ_D + j] * r[i * NQ_D + j];
        }
        total = i == 0 ? q : total + q;
    }
    float loss = 0.5f * (total / (float)NQ_B);
    /* dtheta = c (sum_i rh_i + (sum_i r_i) H^T), c = 0.5 / 128 */
    lim_colsum(rs, r, NQ_B, NQ_D, NQ_D);
    lim_colsum(g, rh, NQ_B, NQ_D, NQ_D);
    gemm(1, NQ_D, NQ_D, rs, NQ_D, 1, hm, 1, NQ_D, hs); /* (sum r) H^T */
    const float c = 0.5f * (1.0f / (float)NQ_B);
    for (int j = 0; j < NQ_D; j++) {
        g[j] = c * (g[j] + hs[j]);
    }
    return loss;
}

/* nabla's maximum and minimum: NaN propagates */
static inline double lv_max(double x, double y) {
    return (x > y || x != x) ? x : y;
}
static inline double lv_min(double x, double y) {
    return (x < y || x != x) ? x : y;
}

static double step_lv(lim_suite *m) {
    const double *x = m->lx; /* [4, 2, 20]: the sets' x then y at ts */
    double pc[6], share[4];
    int inside = 1;
    for (int i = 0; i < 4; i++) {
        double p = m->lp[i], hi = lv_max(p, LV_LO);
        inside &= p >= LV_LO && p <= LV_HI;
        pc[i] = lv_min(hi, LV_HI);
        share[i] = (p > LV_LO    ? 1.0
                    : p == LV_LO ? 0.5
                                 : 0.0) *
                   (hi < LV_HI    ? 1.0
                    : hi == LV_HI ? 0.5
                                  : 0.0);
    }
    pc[4] = pc[5] = 1.0;
    double yend[2];
    const double *ys = m->ys;
    int result = lim_lv_forward(pc, &m->lvo, m->lwork, yend, m->ys, &m->lst);
    if (!inside || result != 0) {
        m->lg[0] = m->lg[1] = m->lg[2] = m->lg[3] = 0.0;
        return INFINITY;
    }
    /* the mean over [4, 2, 20] of (ys - x)^2; ysbar = sum over the sets of 2 r / 160 */
    const double inv = 1.0 / (double)(LV_B * 2 * LV_PTS);
    double total = 0.0, *ysbar = m->ysbar;
    for (int k = 0; k < 2 * LV_PTS; k++) {
        ysbar[k] = 0.0;
    }
    for (int b = 0; b < LV_B; b++) {
        for (int s = 0; s < 2; s++) {
            for (int j = 0; j < LV_PTS; j++) {
                double r = ys[2 * j + s] - x[(b * 2 + s) * LV_PTS + j];
                total += r * r;
                ysbar[2 * j + s] += 2.0 * r * inv;
            }
        }
    }
    double g6[6];
    lim_lv_reverse(pc, &m->lvo, m->lwork, &m->lst, NULL, ysbar, g6);
    for (int i = 0; i < 4; i++) {
        m->lg[i] = g6[i] * share[i];
    }
    return total * inv;
}

double lim_suite_step(lim_suite *m) {
    const lim_vmath *vm = lim_vmath_get();
    if (m->spec->kind == K_LV) {
        double loss = step_lv(m);
        lim_adam_step_f64 s =
            lim_adam_begin_f64(&m->count, m->lr, m->b1, m->b2, m->eps, m->eps_root);
        lim_adam_leaf_f64(&s, m->lp, m->lmu, m->lnu, m->lg, 4); /* four 0-d leaves in a row */
        return loss;
    }
    float loss;
    switch (m->spec->kind) {
    case K_LOGREG:
        loss = step_logreg(m, vm);
        break;
    case K_MLP:
        loss = step_mlp(m, vm);
        break;
    case K_CNN:
        loss = step_cnn(m, vm);
        break;
    case K_GRU:
        loss = step_gru(m, vm);
        break;
    default:
        loss = step_nq(m);
        break;
    }
    lim_adam_step s = lim_adam_begin(&m->count, m->lr, m->b1, m->b2, m->eps, m->eps_root);
    for (int l = 0; l < m->spec->n_leaf; l++) {
        lim_adam_leaf(&s, m->p[l], m->mu[l], m->nu[l], m->g[l], m->spec->n[l]);
    }
    return loss;
}
