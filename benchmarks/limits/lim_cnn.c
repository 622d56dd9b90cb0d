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
 * logf u10), the loss, the bias gradients and Adam -- plain loops as lim_mlp784.c.
 */
#include "limits.h"

#include <blis.h>
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
    float s[N], mx[N];
    float *dh0, *df, *da1, *dcols1, *da0;
    void *blocks[96]; /* every buffer, for destroy */
    int n_blocks;
    rntm_t rntm;
};

static void *lim_cnn_alloc(lim_cnn *m, int64_t n) {
    if (m->n_blocks == (int)(sizeof m->blocks / sizeof m->blocks[0])) {
        return NULL;
    }
    size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    void *q = aligned_alloc(64, bytes);
    if (q != NULL) {
        memset(q, 0, bytes);
        m->blocks[m->n_blocks++] = q;
    }
    return q;
}

lim_cnn *lim_cnn_create(void) {
    lim_cnn *m = calloc(1, sizeof *m);
    if (m == NULL) {
        return NULL;
    }
    int ok = 1;
    for (int i = 0; i < NLEAF; i++) {
        ok &= (m->p[i] = lim_cnn_alloc(m, lim_cnn_n[i])) != NULL;
        ok &= (m->mu[i] = lim_cnn_alloc(m, lim_cnn_n[i])) != NULL;
        ok &= (m->nu[i] = lim_cnn_alloc(m, lim_cnn_n[i])) != NULL;
        ok &= (m->g[i] = lim_cnn_alloc(m, lim_cnn_n[i])) != NULL;
    }
    ok &= (m->x = lim_cnn_alloc(m, NL)) != NULL;
    ok &= (m->y = lim_cnn_alloc(m, N)) != NULL;
    ok &= (m->cols0 = lim_cnn_alloc(m, 9 * NL)) != NULL;
    ok &= (m->a0 = lim_cnn_alloc(m, C1 * NL)) != NULL;
    ok &= (m->cols1 = lim_cnn_alloc(m, C1 * 9 * NL)) != NULL;
    ok &= (m->a1 = lim_cnn_alloc(m, C2 * NL)) != NULL;
    ok &= (m->arg = lim_cnn_alloc(m, N * F)) != NULL;
    ok &= (m->f = lim_cnn_alloc(m, N * F)) != NULL;
    ok &= (m->h0 = lim_cnn_alloc(m, N * HID)) != NULL;
    ok &= (m->zo = lim_cnn_alloc(m, N * NO)) != NULL;
    ok &= (m->e = lim_cnn_alloc(m, N * NO)) != NULL;
    ok &= (m->dh0 = lim_cnn_alloc(m, N * HID)) != NULL;
    ok &= (m->df = lim_cnn_alloc(m, N * F)) != NULL;
    ok &= (m->da1 = lim_cnn_alloc(m, C2 * NL)) != NULL;
    ok &= (m->dcols1 = lim_cnn_alloc(m, C1 * 9 * NL)) != NULL;
    ok &= (m->da0 = lim_cnn_alloc(m, C1 * NL)) != NULL;
    if (!ok) {
        lim_cnn_destroy(m);
        return NULL;
    }
    bli_rntm_init(&m->rntm);
    bli_rntm_set_num_threads(1, &m->rntm);
    m->lr = 1e-3, m->b1 = 0.9, m->b2 = 0.999, m->eps = 1e-8, m->eps_root = 0.0;
    return m;
}

void lim_cnn_destroy(lim_cnn *m) {
    if (m != NULL) {
        for (int i = 0; i < m->n_blocks; i++) {
            free(m->blocks[i]);
        }
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

/* c[mm, nn] = a @ b, with element strides (rows, columns) of a and b */
static void gemm(lim_cnn *m, int64_t mm, int64_t nn, int64_t kk, const float *a, int64_t ars,
                 int64_t acs, const float *b, int64_t brs, int64_t bcs, float *c) {
    float one = 1.0f, zero = 0.0f;
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, mm, nn, kk, &one, (float *)a, ars, acs,
                 (float *)b, brs, bcs, &zero, c, nn, 1, NULL, &m->rntm);
}

/* one row of the columns, the tap at (ky, kx) - 1: dst [N, 8, 8] = src [N, 8, 8] shifted, or 0
 * where it reads the padding */
static void im2col_row(float *restrict dst, const float *restrict src, int ky, int kx) {
    int x0 = kx == 0 ? 1 : 0, x1 = kx == 2 ? S - 1 : S;
    for (int n = 0; n < N; n++) {
        for (int y = 0; y < S; y++) {
            float *restrict d = dst + n * 64 + y * S;
            int iy = y + ky - 1;
            if (iy < 0 || iy >= S) {
                memset(d, 0, S * sizeof(float));
                continue;
            }
            const float *restrict sr = src + n * 64 + iy * S;
            d[0] = 0.0f;
            d[S - 1] = 0.0f;
            for (int x = x0; x < x1; x++) {
                d[x] = sr[x + kx - 1];
            }
        }
    }
}

/* cols [c 9, NL] from in [c, N, 8, 8], 3x3 taps, padding 1 */
static void im2col(float *cols, const float *in, int c) {
    for (int ch = 0; ch < c; ch++) {
        for (int k = 0; k < 9; k++) {
            im2col_row(cols + (int64_t)(ch * 9 + k) * NL, in + (int64_t)ch * NL, k / 3, k % 3);
        }
    }
}

/* the transpose of im2col_row: dst [N, 8, 8] += the row's elements at the inputs they read */
static void col2im_row(float *restrict dst, const float *restrict row, int ky, int kx) {
    int x0 = kx == 0 ? 1 : 0, x1 = kx == 2 ? S - 1 : S;
    for (int n = 0; n < N; n++) {
        for (int y = 0; y < S; y++) {
            int iy = y + ky - 1;
            if (iy < 0 || iy >= S) {
                continue;
            }
            float *restrict d = dst + n * 64 + iy * S;
            const float *restrict r = row + n * 64 + y * S;
            for (int x = x0; x < x1; x++) {
                d[x + kx - 1] = d[x + kx - 1] + r[x];
            }
        }
    }
}

/* out [c, N, 8, 8] = the sum of the columns' elements at each input */
static void col2im(float *out, const float *cols, int c) {
    memset(out, 0, (size_t)c * NL * sizeof(float));
    for (int ch = 0; ch < c; ch++) {
        for (int k = 0; k < 9; k++) {
            col2im_row(out + (int64_t)ch * NL, cols + (int64_t)(ch * 9 + k) * NL, k / 3, k % 3);
        }
    }
}

/* a [o, NL] = relu(a + bias) */
static void bias_relu(float *restrict a, const float *restrict bias, int o) {
    for (int c = 0; c < o; c++) {
        float bc = bias[c];
        for (int i = 0; i < NL; i++) {
            float v = a[(int64_t)c * NL + i] + bc;
            a[(int64_t)c * NL + i] = v > 0.0f ? v : 0.0f;
        }
    }
}

/* d [o, NL] *= (a > 0); db = its row sums (16 running sums, added pairwise at the end: a
 * vector of accumulators, not one chain of 4,096 dependent additions) */
static void relu_back_rows(float *restrict d, const float *restrict a, float *restrict db, int o) {
    enum { W = 16 };
    for (int c = 0; c < o; c++) {
        float acc[W] = {0};
        for (int i = 0; i < NL; i += W) {
            for (int k = 0; k < W; k++) {
                int64_t q = (int64_t)c * NL + i + k;
                float v = a[q] > 0.0f ? d[q] : 0.0f;
                d[q] = v;
                acc[k] = acc[k] + v;
            }
        }
        for (int w = W / 2; w > 0; w /= 2) {
            for (int k = 0; k < w; k++) {
                acc[k] = acc[k] + acc[k + w];
            }
        }
        db[c] = acc[0];
    }
}

static void adam(lim_cnn *m) {
    lim_adam_step s = lim_adam_begin(&m->count, m->lr, m->b1, m->b2, m->eps, m->eps_root);
    for (int l = 0; l < NLEAF; l++) {
        lim_adam_leaf(&s, m->p[l], m->mu[l], m->nu[l], m->g[l], lim_cnn_n[l]);
    }
}

float lim_cnn_step(lim_cnn *m) {
    const lim_vmath *vm = lim_vmath_get();
    float *const *p = m->p;
    /* the convolutions: x [N, 1, 8, 8] is [1, N, 8, 8] */
    im2col(m->cols0, m->x, 1);
    gemm(m, C1, NL, 9, p[0], 9, 1, m->cols0, NL, 1, m->a0);
    bias_relu(m->a0, p[1], C1);
    im2col(m->cols1, m->a0, C1);
    gemm(m, C2, NL, C1 * 9, p[2], C1 * 9, 1, m->cols1, NL, 1, m->a1);
    bias_relu(m->a1, p[3], C2);
    /* max pool 2x2 stride 2, flattened */
    for (int c = 0; c < C2; c++) {
        for (int n = 0; n < N; n++) {
            for (int py = 0; py < P; py++) {
                for (int px = 0; px < P; px++) {
                    int32_t base = c * NL + n * 64 + 2 * py * S + 2 * px, best = base;
                    static const int off[4] = {0, 1, S, S + 1};
                    for (int k = 1; k < 4; k++) {
                        float v = m->a1[base + off[k]], bv = m->a1[best];
                        best = (v > bv || (v != v && bv == bv)) ? base + off[k] : best;
                    }
                    int fi = n * F + c * P * P + py * P + px;
                    m->arg[fi] = best;
                    m->f[fi] = m->a1[best];
                }
            }
        }
    }
    /* the MLP */
    gemm(m, N, HID, F, m->f, F, 1, p[4], 1, F, m->h0);
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < HID; j++) {
            float v = m->h0[i * HID + j] + p[5][j];
            m->h0[i * HID + j] = v > 0.0f ? v : 0.0f;
        }
    }
    float *restrict z = m->zo, *restrict e = m->e;
    gemm(m, N, NO, HID, m->h0, HID, 1, p[6], 1, HID, z);
    for (int i = 0; i < N; i++) {
        float *zi = z + i * NO;
        for (int j = 0; j < NO; j++) {
            zi[j] = zi[j] + p[7][j];
        }
        float v = zi[0];
        for (int j = 1; j < NO; j++) {
            v = (zi[j] > v || zi[j] != zi[j]) ? zi[j] : v;
        }
        m->mx[i] = fabsf(v) < INFINITY ? v : 0.0f;
        for (int j = 0; j < NO; j++) {
            e[i * NO + j] = zi[j] - m->mx[i];
        }
    }
    vm->expf_n(e, e, N * NO);
    float ls[N];
    for (int i = 0; i < N; i++) {
        float s = e[i * NO];
        for (int j = 1; j < NO; j++) {
            s = s + e[i * NO + j];
        }
        m->s[i] = s;
    }
    vm->logf_n(ls, m->s, N);
    float total = 0.0f;
    for (int i = 0; i < N; i++) {
        float v = (z[i * NO + m->y[i]] - m->mx[i]) - ls[i];
        total = i == 0 ? v : total + v;
    }
    float loss = -(total / (float)N);

    /* backward: dz into z */
    const float inv = 1.0f / (float)N;
    for (int i = 0; i < N; i++) {
        float r = inv * (1.0f / m->s[i]);
        for (int j = 0; j < NO; j++) {
            float dl = j == m->y[i] ? -inv : 0.0f;
            z[i * NO + j] = dl + r * e[i * NO + j];
        }
    }
    for (int j = 0; j < NO; j++) {
        float s = z[j];
        for (int i = 1; i < N; i++) {
            s = s + z[i * NO + j];
        }
        m->g[7][j] = s;
    }
    gemm(m, NO, HID, N, z, 1, NO, m->h0, HID, 1, m->g[6]); /* dW = dz^T h0 */
    gemm(m, N, HID, NO, z, NO, 1, p[6], HID, 1, m->dh0);   /* dh0 = dz W */
    for (int i = 0; i < N * HID; i++) {
        m->dh0[i] = m->h0[i] > 0.0f ? m->dh0[i] : 0.0f;
    }
    for (int j = 0; j < HID; j++) {
        float s = m->dh0[j];
        for (int i = 1; i < N; i++) {
            s = s + m->dh0[i * HID + j];
        }
        m->g[5][j] = s;
    }
    gemm(m, HID, F, N, m->dh0, 1, HID, m->f, F, 1, m->g[4]); /* dW = dh0^T f */
    gemm(m, N, F, HID, m->dh0, HID, 1, p[4], F, 1, m->df);   /* df = dh0 W */
    /* the pool's gradient to each window's maximum */
    memset(m->da1, 0, (size_t)C2 * NL * sizeof(float));
    for (int i = 0; i < N * F; i++) {
        m->da1[m->arg[i]] += m->df[i];
    }
    relu_back_rows(m->da1, m->a1, m->g[3], C2);
    gemm(m, C2, C1 * 9, NL, m->da1, NL, 1, m->cols1, 1, NL, m->g[2]);   /* dW = dY cols^T */
    gemm(m, C1 * 9, NL, C2, p[2], 1, C1 * 9, m->da1, NL, 1, m->dcols1); /* W^T dY */
    col2im(m->da0, m->dcols1, C1);
    relu_back_rows(m->da0, m->a0, m->g[1], C1);
    gemm(m, C1, 9, NL, m->da0, NL, 1, m->cols0, 1, NL, m->g[0]);
    adam(m);
    return loss;
}
