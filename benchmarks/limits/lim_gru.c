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
 */
#include "limits.h"

#include <blis.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = LIM_GRU_B, T = LIM_GRU_T, E = LIM_GRU_E, H = LIM_GRU_H, V = LIM_GRU_V };
enum { TB = T * B, G3 = 3 * H, NLEAF = LIM_GRU_NLEAF };

enum { N_EMB = V * E, N_IH1 = G3 * E, N_HH = G3 * H, N_OUT = V * H }; /* weights' elements */
/* the leaves' sizes: emb.weight; gru1's weight_ih, weight_hh, bias, bias_n; gru2's; out's
 * weight and bias */
static const int64_t lim_gru_n[NLEAF] = {N_EMB, N_IH1, N_HH, G3, H, N_HH, N_HH, G3, H, N_OUT, V};

/* one layer's stored forward and its backward buffers */
typedef struct lim_gru_layer {
    const float *x;        /* its inputs [TB, in] (the embeddings, or layer 1's states) */
    float *ig;             /* x W_ih^T + bias [TB, 3H] */
    float *r, *z, *n, *hn; /* gates [TB, H] */
    float *hs;             /* states [(T + 1) B, H]: block 0 the zero initial state */
    float *di, *dg;        /* gradients of i and g [TB, 3H] */
} lim_gru_layer;

struct lim_gru {
    float *p[NLEAF], *mu[NLEAF], *nu[NLEAF], *g[NLEAF];
    int32_t *inputs, *targets; /* [B, T] */
    int32_t count;
    double lr, b1, b2, eps, eps_root;
    float *x; /* embeddings [TB, E] */
    lim_gru_layer l[2];
    float *zo, *e;         /* logits [TB, V], exp(z - m) */
    float *s, *mx;         /* [TB] */
    float *dh2, *dh1, *dx; /* gradients of layer 2's and layer 1's outputs, of x */
    float *hg, *tmp, *dh;  /* per step: [B, 3H], [B, 3H], [B, H] */
    void *blocks[96];      /* every buffer, for destroy */
    int n_blocks;
    rntm_t rntm;
};

static float *lim_gru_alloc(lim_gru *m, int64_t n) {
    if (m->n_blocks == (int)(sizeof m->blocks / sizeof m->blocks[0])) {
        return NULL;
    }
    size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    float *q = aligned_alloc(64, bytes);
    if (q != NULL) {
        memset(q, 0, bytes);
        m->blocks[m->n_blocks++] = q;
    }
    return q;
}

lim_gru *lim_gru_create(void) {
    lim_gru *m = calloc(1, sizeof *m);
    if (m == NULL) {
        return NULL;
    }
    int ok = 1;
    for (int i = 0; i < NLEAF; i++) {
        ok &= (m->p[i] = lim_gru_alloc(m, lim_gru_n[i])) != NULL;
        ok &= (m->mu[i] = lim_gru_alloc(m, lim_gru_n[i])) != NULL;
        ok &= (m->nu[i] = lim_gru_alloc(m, lim_gru_n[i])) != NULL;
        ok &= (m->g[i] = lim_gru_alloc(m, lim_gru_n[i])) != NULL;
    }
    ok &= (m->inputs = (int32_t *)lim_gru_alloc(m, TB)) != NULL;
    ok &= (m->targets = (int32_t *)lim_gru_alloc(m, TB)) != NULL;
    ok &= (m->x = lim_gru_alloc(m, (int64_t)TB * E)) != NULL;
    for (int k = 0; k < 2; k++) {
        lim_gru_layer *l = &m->l[k];
        ok &= (l->ig = lim_gru_alloc(m, (int64_t)TB * G3)) != NULL;
        ok &= (l->r = lim_gru_alloc(m, (int64_t)TB * H)) != NULL;
        ok &= (l->z = lim_gru_alloc(m, (int64_t)TB * H)) != NULL;
        ok &= (l->n = lim_gru_alloc(m, (int64_t)TB * H)) != NULL;
        ok &= (l->hn = lim_gru_alloc(m, (int64_t)TB * H)) != NULL;
        ok &= (l->hs = lim_gru_alloc(m, (int64_t)(TB + B) * H)) != NULL;
        ok &= (l->di = lim_gru_alloc(m, (int64_t)TB * G3)) != NULL;
        ok &= (l->dg = lim_gru_alloc(m, (int64_t)TB * G3)) != NULL;
    }
    ok &= (m->zo = lim_gru_alloc(m, (int64_t)TB * V)) != NULL;
    ok &= (m->e = lim_gru_alloc(m, (int64_t)TB * V)) != NULL;
    ok &= (m->s = lim_gru_alloc(m, TB)) != NULL;
    ok &= (m->mx = lim_gru_alloc(m, TB)) != NULL;
    ok &= (m->dh2 = lim_gru_alloc(m, (int64_t)TB * H)) != NULL;
    ok &= (m->dh1 = lim_gru_alloc(m, (int64_t)TB * H)) != NULL;
    ok &= (m->dx = lim_gru_alloc(m, (int64_t)TB * E)) != NULL;
    ok &= (m->hg = lim_gru_alloc(m, (int64_t)B * G3)) != NULL;
    ok &= (m->tmp = lim_gru_alloc(m, (int64_t)B * G3)) != NULL;
    ok &= (m->dh = lim_gru_alloc(m, (int64_t)B * H)) != NULL;
    if (!ok) {
        lim_gru_destroy(m);
        return NULL;
    }
    m->l[0].x = m->x;
    m->l[1].x = m->l[0].hs + B * H;
    bli_rntm_init(&m->rntm);
    bli_rntm_set_num_threads(1, &m->rntm);
    m->lr = 1e-3, m->b1 = 0.9, m->b2 = 0.999, m->eps = 1e-8, m->eps_root = 0.0;
    return m;
}

void lim_gru_destroy(lim_gru *m) {
    if (m != NULL) {
        for (int i = 0; i < m->n_blocks; i++) {
            free(m->blocks[i]);
        }
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

/* c[mm, nn] = a @ b + beta c, with element strides (rows, columns) of a and b */
static void gemm(lim_gru *m, int64_t mm, int64_t nn, int64_t kk, const float *a, int64_t ars,
                 int64_t acs, const float *b, int64_t brs, int64_t bcs, float beta, float *c) {
    float one = 1.0f;
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, mm, nn, kk, &one, (float *)a, ars, acs,
                 (float *)b, brs, bcs, &beta, c, nn, 1, NULL, &m->rntm);
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

/* c[j] = sum_i a[i, j] over rows rows of a [rows, lda] */
static void colsum(float *restrict c, const float *restrict a, int64_t rows, int64_t cols,
                   int64_t lda) {
    for (int64_t j = 0; j < cols; j++) {
        c[j] = a[j];
    }
    for (int64_t i = 1; i < rows; i++) {
        for (int64_t j = 0; j < cols; j++) {
            c[j] = c[j] + a[i * lda + j];
        }
    }
}

/* The per-step elementwise work, one batch row at a time: kernels with restrict parameters (gcc
 * honours restrict on parameters, not on locals, and vectorises these only so). */

/* pr, pz = the r and z gates' inputs, i_r + g_r and i_z + g_z, from a row of ig and hg [3H] */
static void fwd_rz_row(float *restrict pr, float *restrict pz, const float *restrict ig,
                       const float *restrict hg) {
    for (int j = 0; j < H; j++) {
        pr[j] = ig[j] + hg[j];
        pz[j] = ig[H + j] + hg[H + j];
    }
}

/* hn = g_n + bias_n, n = i_n + r hn (before its tanh) */
static void fwd_n_row(float *restrict hn, float *restrict n, const float *restrict ig,
                      const float *restrict hg, const float *restrict r, const float *restrict bn) {
    for (int j = 0; j < H; j++) {
        float v = hg[2 * H + j] + bn[j];
        hn[j] = v;
        n[j] = ig[2 * H + j] + r[j] * v;
    }
}

/* h' = n + z (h - n) over B H */
static void fwd_h(float *restrict hnew, const float *restrict hp, const float *restrict n,
                  const float *restrict z) {
    for (int i = 0; i < B * H; i++) {
        hnew[i] = n[i] + z[i] * (hp[i] - n[i]);
    }
}

/* one row of the step's backward: from dy + dh (the gradient of h'), di and dg [3H], and dh
 * replaced by its direct part dh' z */
static void bwd_row(float *restrict di, float *restrict dg, float *restrict dh,
                    const float *restrict dy, const float *restrict hp, const float *restrict r,
                    const float *restrict z, const float *restrict n, const float *restrict hn) {
    for (int j = 0; j < H; j++) {
        float d = dy[j] + dh[j];
        float zj = z[j], nj = n[j], rj = r[j];
        float dn = d * (1.0f - zj) * (1.0f - nj * nj);
        float dz = d * (hp[j] - nj) * (zj * (1.0f - zj));
        float dr = dn * hn[j] * (rj * (1.0f - rj));
        di[j] = dr;
        di[H + j] = dz;
        di[2 * H + j] = dn;
        dg[j] = dr;
        dg[H + j] = dz;
        dg[2 * H + j] = dn * rj;
        dh[j] = d * zj;
    }
}

/* layer k over the 64 steps; its weights are leaves w .. w + 3 */
static void layer_fwd(lim_gru *m, const lim_vmath *vm, lim_gru_layer *l, int64_t in, int w) {
    const float *wih = m->p[w], *whh = m->p[w + 1], *bias = m->p[w + 2], *bn = m->p[w + 3];
    gemm(m, TB, G3, in, l->x, in, 1, wih, 1, in, 0.0f, l->ig); /* x W_ih^T */
    for (int64_t i = 0; i < TB; i++) {
        float *row = l->ig + i * G3;
        for (int j = 0; j < G3; j++) {
            row[j] = row[j] + bias[j];
        }
    }
    float *hg = m->hg, *pre = m->tmp;
    for (int t = 0; t < T; t++) {
        const float *hp = l->hs + (int64_t)t * B * H;
        const float *ig = l->ig + (int64_t)t * B * G3;
        int64_t o = (int64_t)t * B * H;
        float *r = l->r + o, *z = l->z + o, *n = l->n + o, *hn = l->hn + o;
        gemm(m, B, G3, H, hp, H, 1, whh, 1, H, 0.0f, hg); /* h W_hh^T */
        for (int b = 0; b < B; b++) {
            fwd_rz_row(pre + b * H, pre + (B + b) * H, ig + b * G3, hg + b * G3);
        }
        lim_sigmoid(vm, r, pre, pre + 2 * B * H, B * H);
        lim_sigmoid(vm, z, pre + B * H, pre + 2 * B * H, B * H);
        for (int b = 0; b < B; b++) {
            fwd_n_row(hn + b * H, n + b * H, ig + b * G3, hg + b * G3, r + b * H, bn);
        }
        vm->tanhf_n(n, n, B * H);
        fwd_h(l->hs + (int64_t)(t + 1) * B * H, hp, n, z);
    }
}

/* the backward of layer_fwd, given the gradient dy [TB, H] of its outputs; dx [TB, in] (NULL:
 * not wanted) receives its inputs' */
static void layer_bwd(lim_gru *m, lim_gru_layer *l, int64_t in, int w, const float *dy, float *dx) {
    const float *wih = m->p[w], *whh = m->p[w + 1];
    float *dh = m->dh;
    memset(dh, 0, (size_t)B * H * sizeof(float));
    for (int t = T - 1; t >= 0; t--) {
        int64_t o = (int64_t)t * B * H;
        float *di = l->di + (int64_t)t * B * G3, *dg = l->dg + (int64_t)t * B * G3;
        for (int b = 0; b < B; b++) {
            int64_t k = o + b * H;
            bwd_row(di + b * G3, dg + b * G3, dh + b * H, dy + k, l->hs + k, l->r + k, l->z + k,
                    l->n + k, l->hn + k);
        }
        /* dh += dg W_hh (not at t = 0: the initial state is a constant) */
        if (t > 0) {
            gemm(m, B, H, G3, dg, G3, 1, whh, H, 1, 1.0f, dh);
        }
    }
    gemm(m, G3, in, TB, l->di, 1, G3, l->x, in, 1, 0.0f, m->g[w]);    /* dW_ih = di^T x */
    gemm(m, G3, H, TB, l->dg, 1, G3, l->hs, H, 1, 0.0f, m->g[w + 1]); /* dW_hh = dg^T h_prev */
    colsum(m->g[w + 2], l->di, TB, G3, G3);
    colsum(m->g[w + 3], l->dg + 2 * H, TB, H, G3);
    if (dx != NULL) {
        gemm(m, TB, in, G3, l->di, G3, 1, wih, in, 1, 0.0f, dx); /* di W_ih */
    }
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
    /* embedding lookup, time-major */
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++) {
            memcpy(m->x + ((int64_t)t * B + b) * E, m->p[0] + (int64_t)m->inputs[b * T + t] * E,
                   E * sizeof(float));
        }
    }
    layer_fwd(m, vm, &m->l[0], E, 1);
    layer_fwd(m, vm, &m->l[1], H, 5);
    /* head and the stable log-softmax */
    const float *h2 = m->l[1].hs + B * H;
    float *restrict zo = m->zo, *restrict e = m->e, *restrict mx = m->mx;
    const float *wo = m->p[9], *bo = m->p[10];
    gemm(m, TB, V, H, h2, H, 1, wo, 1, H, 0.0f, zo);
    for (int64_t i = 0; i < TB; i++) {
        float *zi = zo + i * V;
        for (int j = 0; j < V; j++) {
            zi[j] = zi[j] + bo[j];
        }
        float v = zi[0];
        for (int j = 1; j < V; j++) {
            v = (zi[j] > v || zi[j] != zi[j]) ? zi[j] : v;
        }
        mx[i] = fabsf(v) < INFINITY ? v : 0.0f;
        for (int j = 0; j < V; j++) {
            e[i * V + j] = zi[j] - mx[i];
        }
    }
    vm->expf_n(e, e, (int64_t)TB * V);
    for (int64_t i = 0; i < TB; i++) {
        float s = e[i * V];
        for (int j = 1; j < V; j++) {
            s = s + e[i * V + j];
        }
        m->s[i] = s;
    }
    float *ls = m->dh1; /* scratch until the backward */
    vm->logf_n(ls, m->s, TB);
    float total = 0.0f;
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++) {
            int64_t i = (int64_t)t * B + b;
            float v = (zo[i * V + m->targets[b * T + t]] - mx[i]) - ls[i];
            total = i == 0 ? v : total + v;
        }
    }
    float loss = -(total / (float)TB);

    /* backward: dz = (softmax - onehot) / 2048 into zo */
    const float inv = 1.0f / (float)TB;
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++) {
            int64_t i = (int64_t)t * B + b;
            float r = inv * (1.0f / m->s[i]);
            int y = m->targets[b * T + t];
            for (int j = 0; j < V; j++) {
                float dl = j == y ? -inv : 0.0f;
                zo[i * V + j] = dl + r * e[i * V + j];
            }
        }
    }
    colsum(m->g[10], zo, TB, V, V);
    gemm(m, V, H, TB, zo, 1, V, h2, H, 1, 0.0f, m->g[9]); /* dW_out = dz^T h2 */
    gemm(m, TB, H, V, zo, V, 1, wo, H, 1, 0.0f, m->dh2);  /* dh2 = dz W_out */
    layer_bwd(m, &m->l[1], H, 5, m->dh2, m->dh1);
    layer_bwd(m, &m->l[0], E, 1, m->dh1, m->dx);
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
