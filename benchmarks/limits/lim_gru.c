/*
 * lim_gru.c -- the 2-layer GRU character model's train step, hand-written (limits.h):
 * bench_layers' gru_loss (Embedding 65->32, GRU cells 32->128 and 128->128 over 64 steps,
 * Linear 128->65 on every step's top state, batch 32, mean cross-entropy over the 2,048
 * positions) and one Adam step. Time-major throughout: row t B + b is position (t, b).
 *
 *   cell (src/nn/rnn.c)  i = x W_ih^T + bias, g = h W_hh^T; r = sigmoid(i_r + g_r),
 *                        z = sigmoid(i_z + g_z), hn = g_n + bias_n, n = tanh(i_n + r hn),
 *                        h' = n + z (h - n)
 *   backward             dn = dh' (1 - z), dz = dh' (h - n), dh = dh' z + dg W_hh with
 *                        dn~ = dn (1 - n^2), dr~ = dn~ hn r (1 - r), dz~ = dz z (1 - z):
 *                        di = (dr~, dz~, dn~), dg = (dr~, dz~, dn~ r)
 *
 * The limit: the forward stores every step's gates (r, z, n, hn) and states, so the backward
 * recomputes nothing; a layer runs over all 64 steps before the next (the same arithmetic as
 * the scan, which steps both layers together). The products that do not sit on the
 * recurrence are one BLIS call each over the 2,048 rows: the input projections x W_ih^T, the
 * head, and in the backward the weight gradients dW_ih = di^T x and dW_hh = dg^T h_prev and
 * the inputs' gradient di W_ih -- after the loop, one product with k = 2,048 (measured a few
 * per cent faster than accumulating dW_ih and dW_hh per step in 64 products with k = 32, each
 * re-packing its operands). Only h W_hh^T and dg W_hh are per step ([32, 128] x [128, 384]
 * and back). Elementwise work in plain loops; tanh (u35) and exp (u10) through SLEEF's
 * vector functions (lim_vmath), as nabla's kernels call them; sigmoid in nabla's stable form
 * e = exp(-|x|), (x >= 0 ? 1 : e) / (1 + e); the log-softmax and Adam as lim_mlp784.c.
 *
 * The layer (lim_gru_layer_fwd, lim_gru_layer_bwd) takes its sizes at run time: lim_suite.c's
 * char_gru (one layer, hidden 64, 16 steps) runs the same code.
 */
#include "limits.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = LIM_GRU_B, T = LIM_GRU_T, E = LIM_GRU_E, H = LIM_GRU_H, V = LIM_GRU_V };
enum { TB = T * B, G3 = 3 * H, NLEAF = LIM_GRU_NLEAF };

enum { N_EMB = V * E, N_IH1 = G3 * E, N_HH = G3 * H, N_OUT = V * H }; /* weights' elements */
/* the leaves' sizes: emb.weight; gru1's weight_ih, weight_hh, bias, bias_n; gru2's; out's
 * weight and bias */
static const int64_t lim_gru_n[NLEAF] = {N_EMB, N_IH1, N_HH, G3, H, N_HH, N_HH, G3, H, N_OUT, V};

struct lim_gru {
    float *p[NLEAF], *mu[NLEAF], *nu[NLEAF], *g[NLEAF];
    int32_t *inputs, *targets; /* [B, T] */
    int32_t *tgt;              /* the targets time-major [TB] */
    int32_t count;
    double lr, b1, b2, eps, eps_root;
    float *x; /* embeddings [TB, E] */
    lim_gru_layer l[2];
    float *zo, *e;         /* logits [TB, V], exp(z - m) */
    float *s, *mx, *ls;    /* [TB] */
    float *dh2, *dh1, *dx; /* gradients of layer 2's and layer 1's outputs, of x */
    lim_bufs bufs;
};

/* ---- one layer --------------------------------------------------------------------------- */

int lim_gru_layer_alloc(lim_gru_layer *l, lim_bufs *bufs) {
    int64_t tb = l->t * l->b, g3 = 3 * l->h;
    int ok = 1;
    ok &= (l->ig = lim_bufs_alloc(bufs, tb * g3)) != NULL;
    ok &= (l->r = lim_bufs_alloc(bufs, tb * l->h)) != NULL;
    ok &= (l->z = lim_bufs_alloc(bufs, tb * l->h)) != NULL;
    ok &= (l->n = lim_bufs_alloc(bufs, tb * l->h)) != NULL;
    ok &= (l->hn = lim_bufs_alloc(bufs, tb * l->h)) != NULL;
    ok &= (l->hs = lim_bufs_alloc(bufs, (tb + l->b) * l->h)) != NULL;
    ok &= (l->di = lim_bufs_alloc(bufs, tb * g3)) != NULL;
    ok &= (l->dg = lim_bufs_alloc(bufs, tb * g3)) != NULL;
    ok &= (l->hg = lim_bufs_alloc(bufs, l->b * g3)) != NULL;
    ok &= (l->pre = lim_bufs_alloc(bufs, l->b * g3)) != NULL;
    ok &= (l->dh = lim_bufs_alloc(bufs, l->b * l->h)) != NULL;
    return ok;
}

/* c[mm, nn] = a @ b + beta c (lim_sgemm) */
static void gemm(int64_t mm, int64_t nn, int64_t kk, const float *a, int64_t ars, int64_t acs,
                 const float *b, int64_t brs, int64_t bcs, float beta, float *c) {
    lim_sgemm(mm, nn, kk, a, ars, acs, b, brs, bcs, beta, c, nn);
}

/* o = sigmoid(x) over n, nabla's stable form; e is scratch */
static void lim_sigmoid(const lim_vmath *vm, float *restrict o, const float *restrict x,
                        float *restrict e, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        e[i] = -fabsf(x[i]);
    }
    vm->expf_n(e, e, n);
    for (int64_t i = 0; i < n; i++) {
        o[i] = (x[i] >= 0 ? 1.0f : e[i]) / (1.0f + e[i]);
    }
}

/* The per-step elementwise work, one batch row at a time: kernels with restrict parameters (gcc
 * honours restrict on parameters, not on locals, and vectorises these only so). */

/* pr, pz = the r and z gates' inputs, i_r + g_r and i_z + g_z, from a row of ig and hg [3h] */
static void fwd_rz_row(float *restrict pr, float *restrict pz, const float *restrict ig,
                       const float *restrict hg, int64_t h) {
    for (int64_t j = 0; j < h; j++) {
        pr[j] = ig[j] + hg[j];
        pz[j] = ig[h + j] + hg[h + j];
    }
}

/* hn = g_n + bias_n, n = i_n + r hn (before its tanh) */
static void fwd_n_row(float *restrict hn, float *restrict n, const float *restrict ig,
                      const float *restrict hg, const float *restrict r, const float *restrict bn,
                      int64_t h) {
    for (int64_t j = 0; j < h; j++) {
        float v = hg[2 * h + j] + bn[j];
        hn[j] = v;
        n[j] = ig[2 * h + j] + r[j] * v;
    }
}

/* h' = n + z (h - n) over bh */
static void fwd_h(float *restrict hnew, const float *restrict hp, const float *restrict n,
                  const float *restrict z, int64_t bh) {
    for (int64_t i = 0; i < bh; i++) {
        hnew[i] = n[i] + z[i] * (hp[i] - n[i]);
    }
}

/* one row of the step's backward: from dy + dh (the gradient of h'), di and dg [3h], and dh
 * replaced by its direct part dh' z */
static void bwd_row(float *restrict di, float *restrict dg, float *restrict dh,
                    const float *restrict dy, const float *restrict hp, const float *restrict r,
                    const float *restrict z, const float *restrict n, const float *restrict hn,
                    int64_t h) {
    for (int64_t j = 0; j < h; j++) {
        float d = dy[j] + dh[j];
        float zj = z[j], nj = n[j], rj = r[j];
        float dn = d * (1.0f - zj) * (1.0f - nj * nj);
        float dz = d * (hp[j] - nj) * (zj * (1.0f - zj));
        float dr = dn * hn[j] * (rj * (1.0f - rj));
        di[j] = dr;
        di[h + j] = dz;
        di[2 * h + j] = dn;
        dg[j] = dr;
        dg[h + j] = dz;
        dg[2 * h + j] = dn * rj;
        dh[j] = d * zj;
    }
}

void lim_gru_layer_fwd(const lim_vmath *vm, lim_gru_layer *l, const float *const w[4]) {
    const int64_t b = l->b, h = l->h, in = l->in, g3 = 3 * h, tb = l->t * b;
    const float *wih = w[0], *whh = w[1], *bias = w[2], *bn = w[3];
    gemm(tb, g3, in, l->x, in, 1, wih, 1, in, 0.0f, l->ig); /* x W_ih^T */
    for (int64_t i = 0; i < tb; i++) {
        float *row = l->ig + i * g3;
        for (int64_t j = 0; j < g3; j++) {
            row[j] = row[j] + bias[j];
        }
    }
    float *hg = l->hg, *pre = l->pre;
    for (int64_t t = 0; t < l->t; t++) {
        const float *hp = l->hs + t * b * h;
        const float *ig = l->ig + t * b * g3;
        int64_t o = t * b * h;
        float *r = l->r + o, *z = l->z + o, *n = l->n + o, *hn = l->hn + o;
        gemm(b, g3, h, hp, h, 1, whh, 1, h, 0.0f, hg); /* h W_hh^T */
        for (int64_t i = 0; i < b; i++) {
            fwd_rz_row(pre + i * h, pre + (b + i) * h, ig + i * g3, hg + i * g3, h);
        }
        lim_sigmoid(vm, r, pre, pre + 2 * b * h, b * h);
        lim_sigmoid(vm, z, pre + b * h, pre + 2 * b * h, b * h);
        for (int64_t i = 0; i < b; i++) {
            fwd_n_row(hn + i * h, n + i * h, ig + i * g3, hg + i * g3, r + i * h, bn, h);
        }
        vm->tanhf_n(n, n, b * h);
        fwd_h(l->hs + (t + 1) * b * h, hp, n, z, b * h);
    }
}

void lim_gru_layer_bwd(lim_gru_layer *l, const float *const w[4], float *const gw[4],
                       const float *dy, float *dx) {
    const int64_t b = l->b, h = l->h, in = l->in, g3 = 3 * h, tb = l->t * b;
    const float *wih = w[0], *whh = w[1];
    float *dh = l->dh;
    memset(dh, 0, (size_t)(b * h) * sizeof(float));
    for (int64_t t = l->t - 1; t >= 0; t--) {
        int64_t o = t * b * h;
        float *di = l->di + t * b * g3, *dg = l->dg + t * b * g3;
        for (int64_t i = 0; i < b; i++) {
            int64_t k = o + i * h;
            bwd_row(di + i * g3, dg + i * g3, dh + i * h, dy + k, l->hs + k, l->r + k, l->z + k,
                    l->n + k, l->hn + k, h);
        }
        /* dh += dg W_hh (not at t = 0: the initial state is a constant) */
        if (t > 0) {
            gemm(b, h, g3, dg, g3, 1, whh, h, 1, 1.0f, dh);
        }
    }
    gemm(g3, in, tb, l->di, 1, g3, l->x, in, 1, 0.0f, gw[0]); /* dW_ih = di^T x */
    gemm(g3, h, tb, l->dg, 1, g3, l->hs, h, 1, 0.0f, gw[1]);  /* dW_hh = dg^T h_prev */
    lim_colsum(gw[2], l->di, tb, g3, g3);
    lim_colsum(gw[3], l->dg + 2 * h, tb, h, g3);
    if (dx != NULL) {
        gemm(tb, in, g3, l->di, g3, 1, wih, in, 1, 0.0f, dx); /* di W_ih */
    }
}

/* ---- the 2-layer model ------------------------------------------------------------------- */

lim_gru *lim_gru_create(void) {
    lim_gru *m = calloc(1, sizeof *m);
    if (m == NULL) {
        return NULL;
    }
    lim_bufs *bb = &m->bufs;
    int ok = 1;
    for (int i = 0; i < NLEAF; i++) {
        ok &= (m->p[i] = lim_bufs_alloc(bb, lim_gru_n[i])) != NULL;
        ok &= (m->mu[i] = lim_bufs_alloc(bb, lim_gru_n[i])) != NULL;
        ok &= (m->nu[i] = lim_bufs_alloc(bb, lim_gru_n[i])) != NULL;
        ok &= (m->g[i] = lim_bufs_alloc(bb, lim_gru_n[i])) != NULL;
    }
    ok &= (m->inputs = (int32_t *)lim_bufs_alloc(bb, TB)) != NULL;
    ok &= (m->targets = (int32_t *)lim_bufs_alloc(bb, TB)) != NULL;
    ok &= (m->tgt = (int32_t *)lim_bufs_alloc(bb, TB)) != NULL;
    ok &= (m->x = lim_bufs_alloc(bb, (int64_t)TB * E)) != NULL;
    for (int k = 0; k < 2; k++) {
        m->l[k] = (lim_gru_layer){.b = B, .t = T, .in = k == 0 ? E : H, .h = H};
        ok &= lim_gru_layer_alloc(&m->l[k], bb);
    }
    ok &= (m->zo = lim_bufs_alloc(bb, (int64_t)TB * V)) != NULL;
    ok &= (m->e = lim_bufs_alloc(bb, (int64_t)TB * V)) != NULL;
    ok &= (m->s = lim_bufs_alloc(bb, TB)) != NULL;
    ok &= (m->mx = lim_bufs_alloc(bb, TB)) != NULL;
    ok &= (m->ls = lim_bufs_alloc(bb, TB)) != NULL;
    ok &= (m->dh2 = lim_bufs_alloc(bb, (int64_t)TB * H)) != NULL;
    ok &= (m->dh1 = lim_bufs_alloc(bb, (int64_t)TB * H)) != NULL;
    ok &= (m->dx = lim_bufs_alloc(bb, (int64_t)TB * E)) != NULL;
    if (!ok) {
        lim_gru_destroy(m);
        return NULL;
    }
    m->l[0].x = m->x;
    m->l[1].x = m->l[0].hs + B * H;
    m->lr = 1e-3, m->b1 = 0.9, m->b2 = 0.999, m->eps = 1e-8, m->eps_root = 0.0;
    return m;
}

void lim_gru_destroy(lim_gru *m) {
    if (m != NULL) {
        lim_bufs_free(&m->bufs);
        free(m);
    }
}

float *lim_gru_leaf(lim_gru *m, int which, int i, int64_t *n) {
    if (n != NULL) {
        *n = lim_gru_n[i];
    }
    return which == 0 ? m->p[i] : which == 1 ? m->mu[i] : m->nu[i];
}

int32_t *lim_gru_inputs(lim_gru *m) {
    return m->inputs;
}

int32_t *lim_gru_targets(lim_gru *m) {
    return m->targets;
}

void lim_gru_set_adam(lim_gru *m, int32_t count, double lr, double b1, double b2, double eps,
                      double eps_root) {
    m->count = count, m->lr = lr, m->b1 = b1, m->b2 = b2, m->eps = eps, m->eps_root = eps_root;
}

double lim_gru_flops(void) {
    /* 2 m n k per product: the forward's input projections, recurrent products and head, and
     * twice as much in the backward (each product's two gradients), but for the recurrent
     * products' dh at t = 0 (the initial state is a constant) */
    double fwd = 2.0 * TB * G3 * E + 2.0 * TB * G3 * H + 2 * 2.0 * TB * G3 * H + 2.0 * TB * V * H;
    return 3 * fwd - 2 * 2.0 * B * G3 * H;
}

/* Adam over the leaves with the gradients in m->g */
static void adam(lim_gru *m) {
    lim_adam_step s = lim_adam_begin(&m->count, m->lr, m->b1, m->b2, m->eps, m->eps_root);
    for (int l = 0; l < NLEAF; l++) {
        lim_adam_leaf(&s, m->p[l], m->mu[l], m->nu[l], m->g[l], lim_gru_n[l]);
    }
}

float lim_gru_step(lim_gru *m) {
    const lim_vmath *vm = lim_vmath_get();
    /* embedding lookup and the targets, time-major */
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++) {
            memcpy(m->x + ((int64_t)t * B + b) * E, m->p[0] + (int64_t)m->inputs[b * T + t] * E,
                   E * sizeof(float));
            m->tgt[t * B + b] = m->targets[b * T + t];
        }
    }
    const float *w1[4] = {m->p[1], m->p[2], m->p[3], m->p[4]};
    const float *w2[4] = {m->p[5], m->p[6], m->p[7], m->p[8]};
    lim_gru_layer_fwd(vm, &m->l[0], w1);
    lim_gru_layer_fwd(vm, &m->l[1], w2);
    /* head and the stable log-softmax */
    const float *h2 = m->l[1].hs + B * H;
    const float *wo = m->p[9];
    float *zo = m->zo;
    gemm(TB, V, H, h2, H, 1, wo, 1, H, 0.0f, zo);
    float loss = lim_xent_fwd(vm, zo, m->p[10], m->e, m->mx, m->s, m->ls, m->tgt, TB, V);

    /* backward: dz = (softmax - onehot) / 2048 into zo */
    lim_xent_bwd(zo, m->e, m->s, m->tgt, TB, V);
    lim_colsum(m->g[10], zo, TB, V, V);
    gemm(V, H, TB, zo, 1, V, h2, H, 1, 0.0f, m->g[9]); /* dW_out = dz^T h2 */
    gemm(TB, H, V, zo, V, 1, wo, H, 1, 0.0f, m->dh2);  /* dh2 = dz W_out */
    lim_gru_layer_bwd(&m->l[1], w2, (float *const[4]){m->g[5], m->g[6], m->g[7], m->g[8]}, m->dh2,
                      m->dh1);
    lim_gru_layer_bwd(&m->l[0], w1, (float *const[4]){m->g[1], m->g[2], m->g[3], m->g[4]}, m->dh1,
                      m->dx);
    /* the embedding's gradient: the rows of dx added at their tokens */
    memset(m->g[0], 0, (size_t)V * E * sizeof(float));
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++) {
            float *restrict gr = m->g[0] + (int64_t)m->inputs[b * T + t] * E;
            const float *restrict dr = m->dx + ((int64_t)t * B + b) * E;
            for (int j = 0; j < E; j++) {
                gr[j] = gr[j] + dr[j];
            }
        }
    }
    adam(m);
    return loss;
}
