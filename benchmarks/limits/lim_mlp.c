/*
 * lim_mlp.c -- the tiny MLP 2-32-32-1 train step, hand-written (limits.h): bench_train's tiny
 * model (tanh hidden layers, mean squared error, batch 16) and one Adam step of all 1,185
 * parameters, in plain loops over one array of parameters.
 *
 * The arithmetic is nabla's, in nabla's order (bench_native checks the bits):
 *   - a product c = a b: every output summed from 0 over k in increasing order, a rounded
 *     multiply and a rounded add per term (nabla's small-product loops); a loop over i, then
 *     k, then j advances a row of outputs together without changing any output's order;
 *   - tanh: SLEEF's tanhf u35 (lim_vmath), over the whole layer;
 *   - sums over the batch: left to right from the first element;
 *   - the loss: sum((z + b - y)^2) / 16; its gradient 0.0625 (2 (z + b - y));
 *   - Adam (nabla's nb_optim_adam with its default b1 0.9, b2 0.999, eps 1e-8, eps_root 0):
 *     the count saturates at INT32_MAX; the bias corrections 1 / (1 - b^t) in f64 (SLEEF's
 *     pow) rounded to f32; then per element, in f32,
 *       mu = (1 - b1) g + b1 mu,  nu = (1 - b2) g^2 + b2 nu,
 *       p = p + (-lr) ((mu rbc1) / (sqrt(nu rbc2 + eps_root) + eps)).
 */
#include "limits.h"

#include <math.h>
#include <string.h>

enum { B = LIM_TINY_B, H = LIM_TINY_H };

/* c[B, H] = a[B, K] @ w[K, H] + bias, then tanh */
static void dense_tanh(const lim_vmath *vm, int K, const float *restrict a, const float *restrict w,
                       const float *restrict bias, float *restrict c) {
    for (int i = 0; i < B; i++) {
        float acc[H];
        for (int j = 0; j < H; j++) {
            acc[j] = 0.0f;
        }
        for (int k = 0; k < K; k++) {
            float x = a[i * K + k];
            for (int j = 0; j < H; j++) {
                acc[j] = acc[j] + x * w[k * H + j];
            }
        }
        for (int j = 0; j < H; j++) {
            c[i * H + j] = acc[j] + bias[j];
        }
    }
    vm->tanhf_n(c, c, B * H);
}

/* the gradient of a tanh layer's input: d = dh (1 - h^2), in place on dh */
static void tanh_back(const float *restrict h, float *restrict d) {
    for (int i = 0; i < B * H; i++) {
        d[i] = d[i] * (1.0f - h[i] * h[i]);
    }
}

/* db = sum over the batch of d[B, H], dw[K, H] = a[B, K]^T @ d[B, H] */
static void dense_back_w(int K, const float *restrict a, const float *restrict d,
                         float *restrict dw, float *restrict db) {
    for (int j = 0; j < H; j++) {
        db[j] = d[j];
    }
    for (int i = 1; i < B; i++) {
        for (int j = 0; j < H; j++) {
            db[j] = db[j] + d[i * H + j];
        }
    }
    for (int k = 0; k < K; k++) {
        float acc[H];
        for (int j = 0; j < H; j++) {
            acc[j] = 0.0f;
        }
        for (int i = 0; i < B; i++) {
            float x = a[i * K + k];
            for (int j = 0; j < H; j++) {
                acc[j] = acc[j] + x * d[i * H + j];
            }
        }
        for (int j = 0; j < H; j++) {
            dw[k * H + j] = acc[j];
        }
    }
}

/* Adam on elements [i0, i1) (constant bounds once inlined: the first span, a multiple of 8
 * elements, vectorises with no scalar tail) */
static inline void adam_span(float *restrict p, float *restrict mu, float *restrict nu,
                             const float *restrict g, int i0, int i1, float c1, float b1, float c2,
                             float b2, float rbc1, float rbc2, float eps_root, float eps,
                             float nlr) {
    for (int i = i0; i < i1; i++) {
        float gi = g[i];
        float mi = c1 * gi + b1 * mu[i];
        float ni = c2 * (gi * gi) + b2 * nu[i];
        mu[i] = mi;
        nu[i] = ni;
        p[i] = p[i] + nlr * ((mi * rbc1) / (sqrtf(ni * rbc2 + eps_root) + eps));
    }
}

float lim_tiny_step(lim_tiny *m) {
    const lim_vmath *vm = lim_vmath_get();
    float *restrict p = m->p, *restrict g = m->g;
    float *restrict h1 = m->h1, *restrict h2 = m->h2, *restrict d1 = m->d1, *restrict d2 = m->d2;
    /* every product below: each output summed from 0 over k in increasing order (loops
     * ordered so that outputs advance side by side, in vectors) */
    /* forward */
    dense_tanh(vm, 2, m->x, p + LIM_TINY_W0, p + LIM_TINY_B0, h1);
    dense_tanh(vm, H, h1, p + LIM_TINY_W1, p + LIM_TINY_B1, h2);
    /* z3 = h2 @ w2 (one column): h2 transposed first, so that the rows advance together */
    const float *w2 = p + LIM_TINY_W2;
    float ht[H][B];
    for (int i = 0; i < B; i++) {
        for (int k = 0; k < H; k++) {
            ht[k][i] = h2[i * H + k];
        }
    }
    float z3[B];
    for (int i = 0; i < B; i++) {
        z3[i] = 0.0f;
    }
    for (int k = 0; k < H; k++) {
        for (int i = 0; i < B; i++) {
            z3[i] = z3[i] + ht[k][i] * w2[k];
        }
    }
    float b2 = p[LIM_TINY_B2], loss = 0.0f, *restrict d3 = m->d3;
    for (int i = 0; i < B; i++) {
        float r = (z3[i] + b2) - m->y[i];
        loss = i == 0 ? r * r : loss + r * r;
        d3[i] = 0.0625f * (2.0f * r);
    }
    loss = loss / 16.0f;
    /* backward: the last layer */
    float db2 = d3[0];
    for (int i = 1; i < B; i++) {
        db2 = db2 + d3[i];
    }
    g[LIM_TINY_B2] = db2;
    float *restrict gw2 = g + LIM_TINY_W2;
    for (int k = 0; k < H; k++) {
        gw2[k] = 0.0f;
    }
    for (int i = 0; i < B; i++) {
        for (int k = 0; k < H; k++) {
            gw2[k] = gw2[k] + h2[i * H + k] * d3[i];
        }
    }
    for (int i = 0; i < B; i++) {
        for (int j = 0; j < H; j++) {
            d2[i * H + j] = 0.0f + d3[i] * w2[j];
        }
    }
    tanh_back(h2, d2);
    dense_back_w(H, h1, d2, g + LIM_TINY_W1, g + LIM_TINY_B1);
    /* d1 = d2 @ w1^T: w1 transposed first, so that a row of outputs advances together */
    const float *w1 = p + LIM_TINY_W1;
    float wt[H * H];
    for (int j = 0; j < H; j++) {
        for (int k = 0; k < H; k++) {
            wt[k * H + j] = w1[j * H + k];
        }
    }
    for (int i = 0; i < B; i++) {
        float acc[H];
        for (int j = 0; j < H; j++) {
            acc[j] = 0.0f;
        }
        for (int k = 0; k < H; k++) {
            float x = d2[i * H + k];
            for (int j = 0; j < H; j++) {
                acc[j] = acc[j] + x * wt[k * H + j];
            }
        }
        for (int j = 0; j < H; j++) {
            d1[i * H + j] = acc[j];
        }
    }
    tanh_back(h1, d1);
    dense_back_w(2, m->x, d1, g + LIM_TINY_W0, g + LIM_TINY_B0);

    /* Adam */
    int32_t cnt = m->count < INT32_MAX ? m->count + 1 : m->count;
    m->count = cnt;
    double t = (double)cnt;
    float rbc1 = (float)(1.0 / (1.0 - vm->pow1(m->b1, t)));
    float rbc2 = (float)(1.0 / (1.0 - vm->pow1(m->b2, t)));
    float b1 = (float)m->b1, c1 = (float)(1.0 - m->b1);
    float b2f = (float)m->b2, c2 = (float)(1.0 - m->b2);
    float eps = (float)m->eps, eps_root = (float)m->eps_root, nlr = (float)-m->lr;
    adam_span(p, m->mu, m->nu, g, 0, LIM_TINY_NPARAM / 8 * 8, c1, b1, c2, b2f, rbc1, rbc2, eps_root,
              eps, nlr);
    adam_span(p, m->mu, m->nu, g, LIM_TINY_NPARAM / 8 * 8, LIM_TINY_NPARAM, c1, b1, c2, b2f, rbc1,
              rbc2, eps_root, eps, nlr);
    return loss;
}
