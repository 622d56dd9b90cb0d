/*
 * lim_cnn.c -- the digits CNN's train step, hand-written (limits.h): bench_layers' cnn_model
 * (batch 64 of [1, 8, 8] images: conv 1->16 3x3 SAME, relu, conv 16->32 3x3 SAME, relu, max
 * pool 2x2 stride 2, flatten, Linear 512->64, relu, Linear 64->10, mean cross-entropy) and one
 * Adam step.
 *
 * The convolutions as nabla's (src/nn/conv.c): im2col, the columns [C 9, N 64] (row c 9 +
 * ky 3 + kx, column n 64 + y 8 + x, the padding of 1 as zeros at the edges) times the weight
 * [O, C 9] in one BLIS product; the activations stay channel-major [C, N, 8, 8] between the
 * convolutions, so no transposes. The backward: dW = dY cols^T, dcols = W^T dY and col2im
 * (the first convolution's input needs no gradient). The pool keeps the index of each
 * window's first maximum (src/nn/pool.c: the gradient goes to that element alone) and writes
 * the flattened [N, 512] (feature c 16 + y 4 + x) directly. The linear layers are BLIS
 * products (x W^T, transposes as strides), the rest -- bias, relu, the log-softmax (SLEEF expf,
 * logf u10), the loss, the bias gradients and Adam -- plain loops as lim_mlp784.c. The
 * convolution, relu, pool and cross-entropy pieces are lim_nn.c's (shared with lim_suite.c).
 */
#include "limits.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { N = LIM_CNN_B, C1 = 16, C2 = 32, S = 8, P = 4, NL = N * S * S, F = C2 * P * P };
enum { HID = 64, NO = 10, NLEAF = LIM_CNN_NLEAF };

enum { N_W0 = C1 * 9, N_W1 = C2 * C1 * 9, N_L0 = HID * F, N_L1 = NO * HID }; /* weights' elements */
static const int64_t lim_cnn_n[NLEAF] = {N_W0, C1, N_W1, C2, N_L0, HID, N_L1, NO};

struct lim_cnn {
    float *p[NLEAF], *mu[NLEAF], *nu[NLEAF], *g[NLEAF];
    float *x; /* [N, 1, 8, 8] */
    int32_t *y;
    int32_t count;
    double lr, b1, b2, eps, eps_root;
    float *cols0, *a0, *cols1, *a1; /* [9, NL], [16, NL], [144, NL], [32, NL] */
    int32_t *arg;                   /* [N, 512]: the pooled element's index in a1 */
    float *f, *h0, *zo, *e;         /* [N, 512], [N, 64], [N, 10], exp(z - m) */
    float s[N], mx[N], ls[N];
    float *dh0, *df, *da1, *dcols1, *da0;
    lim_bufs bufs;
};

lim_cnn *lim_cnn_create(void) {
    lim_cnn *m = calloc(1, sizeof *m);
    if (m == NULL) {
        return NULL;
    }
    lim_bufs *b = &m->bufs;
    int ok = 1;
    for (int i = 0; i < NLEAF; i++) {
        ok &= (m->p[i] = lim_bufs_alloc(b, lim_cnn_n[i])) != NULL;
        ok &= (m->mu[i] = lim_bufs_alloc(b, lim_cnn_n[i])) != NULL;
        ok &= (m->nu[i] = lim_bufs_alloc(b, lim_cnn_n[i])) != NULL;
        ok &= (m->g[i] = lim_bufs_alloc(b, lim_cnn_n[i])) != NULL;
    }
    ok &= (m->x = lim_bufs_alloc(b, NL)) != NULL;
    ok &= (m->y = (int32_t *)lim_bufs_alloc(b, N)) != NULL;
    ok &= (m->cols0 = lim_bufs_alloc(b, 9 * NL)) != NULL;
    ok &= (m->a0 = lim_bufs_alloc(b, C1 * NL)) != NULL;
    ok &= (m->cols1 = lim_bufs_alloc(b, C1 * 9 * NL)) != NULL;
    ok &= (m->a1 = lim_bufs_alloc(b, C2 * NL)) != NULL;
    ok &= (m->arg = (int32_t *)lim_bufs_alloc(b, N * F)) != NULL;
    ok &= (m->f = lim_bufs_alloc(b, N * F)) != NULL;
    ok &= (m->h0 = lim_bufs_alloc(b, N * HID)) != NULL;
    ok &= (m->zo = lim_bufs_alloc(b, N * NO)) != NULL;
    ok &= (m->e = lim_bufs_alloc(b, N * NO)) != NULL;
    ok &= (m->dh0 = lim_bufs_alloc(b, N * HID)) != NULL;
    ok &= (m->df = lim_bufs_alloc(b, N * F)) != NULL;
    ok &= (m->da1 = lim_bufs_alloc(b, C2 * NL)) != NULL;
    ok &= (m->dcols1 = lim_bufs_alloc(b, C1 * 9 * NL)) != NULL;
    ok &= (m->da0 = lim_bufs_alloc(b, C1 * NL)) != NULL;
    if (!ok) {
        lim_cnn_destroy(m);
        return NULL;
    }
    m->lr = 1e-3, m->b1 = 0.9, m->b2 = 0.999, m->eps = 1e-8, m->eps_root = 0.0;
    return m;
}

void lim_cnn_destroy(lim_cnn *m) {
    if (m != NULL) {
        lim_bufs_free(&m->bufs);
        free(m);
    }
}

float *lim_cnn_leaf(lim_cnn *m, int which, int i, int64_t *n) {
    if (n != NULL) {
        *n = lim_cnn_n[i];
    }
    return which == 0 ? m->p[i] : which == 1 ? m->mu[i] : m->nu[i];
}

float *lim_cnn_x(lim_cnn *m) {
    return m->x;
}

int32_t *lim_cnn_labels(lim_cnn *m) {
    return m->y;
}

void lim_cnn_set_adam(lim_cnn *m, int32_t count, double lr, double b1, double b2, double eps,
                      double eps_root) {
    m->count = count, m->lr = lr, m->b1 = b1, m->b2 = b2, m->eps = eps, m->eps_root = eps_root;
}

double lim_cnn_flops(void) {
    /* 2 m n k per product; the first convolution has 2 (forward, dW), the others 3 */
    return 2.0 * 2.0 * C1 * 9 * NL + 3 * 2.0 * C2 * C1 * 9 * NL + 3 * 2.0 * N * HID * F +
           3 * 2.0 * N * NO * HID;
}

static void adam(lim_cnn *m) {
    lim_adam_step s = lim_adam_begin(&m->count, m->lr, m->b1, m->b2, m->eps, m->eps_root);
    for (int l = 0; l < NLEAF; l++) {
        lim_adam_leaf(&s, m->p[l], m->mu[l], m->nu[l], m->g[l], lim_cnn_n[l]);
    }
}

/* c[mm, nn] = a @ b (lim_sgemm) */
static void gemm(int64_t mm, int64_t nn, int64_t kk, const float *a, int64_t ars, int64_t acs,
                 const float *b, int64_t brs, int64_t bcs, float *c) {
    lim_sgemm(mm, nn, kk, a, ars, acs, b, brs, bcs, 0.0f, c, nn);
}

float lim_cnn_step(lim_cnn *m) {
    const lim_vmath *vm = lim_vmath_get();
    float *const *p = m->p;
    /* the convolutions: x [N, 1, 8, 8] is [1, N, 8, 8] */
    lim_conv_im2col(m->cols0, m->x, 1, N);
    gemm(C1, NL, 9, p[0], 9, 1, m->cols0, NL, 1, m->a0);
    lim_bias_relu_rows(m->a0, p[1], C1, NL);
    lim_conv_im2col(m->cols1, m->a0, C1, N);
    gemm(C2, NL, C1 * 9, p[2], C1 * 9, 1, m->cols1, NL, 1, m->a1);
    lim_bias_relu_rows(m->a1, p[3], C2, NL);
    lim_pool_fwd(m->f, m->arg, m->a1, C2, N); /* max pool 2x2 stride 2, flattened */
    /* the MLP */
    gemm(N, HID, F, m->f, F, 1, p[4], 1, F, m->h0);
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < HID; j++) {
            float v = m->h0[i * HID + j] + p[5][j];
            m->h0[i * HID + j] = v > 0.0f ? v : 0.0f;
        }
    }
    float *z = m->zo;
    gemm(N, NO, HID, m->h0, HID, 1, p[6], 1, HID, z);
    float loss = lim_xent_fwd(vm, z, p[7], m->e, m->mx, m->s, m->ls, m->y, N, NO);

    /* backward: dz into z */
    lim_xent_bwd(z, m->e, m->s, m->y, N, NO);
    lim_colsum(m->g[7], z, N, NO, NO);
    gemm(NO, HID, N, z, 1, NO, m->h0, HID, 1, m->g[6]); /* dW = dz^T h0 */
    gemm(N, HID, NO, z, NO, 1, p[6], HID, 1, m->dh0);   /* dh0 = dz W */
    for (int i = 0; i < N * HID; i++) {
        m->dh0[i] = m->h0[i] > 0.0f ? m->dh0[i] : 0.0f;
    }
    lim_colsum(m->g[5], m->dh0, N, HID, HID);
    gemm(HID, F, N, m->dh0, 1, HID, m->f, F, 1, m->g[4]); /* dW = dh0^T f */
    gemm(N, F, HID, m->dh0, HID, 1, p[4], F, 1, m->df);   /* df = dh0 W */
    lim_pool_bwd(m->da1, m->df, m->arg, C2, N); /* the pool's gradient to each window's maximum */
    lim_relu_back_rows(m->da1, m->a1, m->g[3], C2, NL);
    gemm(C2, C1 * 9, NL, m->da1, NL, 1, m->cols1, 1, NL, m->g[2]);   /* dW = dY cols^T */
    gemm(C1 * 9, NL, C2, p[2], 1, C1 * 9, m->da1, NL, 1, m->dcols1); /* W^T dY */
    lim_conv_col2im(m->da0, m->dcols1, C1, N);
    lim_relu_back_rows(m->da0, m->a0, m->g[1], C1, NL);
    gemm(C1, 9, NL, m->da0, NL, 1, m->cols0, 1, NL, m->g[0]);
    adam(m);
    return loss;
}
