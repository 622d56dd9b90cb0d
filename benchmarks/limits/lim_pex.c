/*
 * lim_pex.c -- per-example gradients of the MLP 784-256-256-10 (tanh hidden layers, each
 * example's own cross-entropy over 10 classes), batch 128, hand-written (limits.h): the
 * limit of bench_vmap's vmap(grad). The forward and the backward deltas of the whole batch
 * are GEMMs in BLIS (one-thread runtime); each example's weight gradients are outer
 * products written out in plain loops (they are the output: 128 x 268,800 floats, 138 MB,
 * so the work is bound by writing them), its bias gradients its deltas.
 *
 *   forward   h1 = tanh(x W0 + b0), h2 = tanh(h1 W1 + b1), z = h2 W2 + b2 (per row)
 *   backward  dz = softmax(z) - onehot(y), dh2 = (dz W2^T) (1 - h2^2), dh1 = (dh2 W1^T)
 *             (1 - h1^2); example b: dW2 = h2_b^T dz_b, dW1 = h1_b^T dh2_b, dW0 = x_b^T dh1_b
 */
#include "limits.h"

#include <blis.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum { B = LIM_MLP_B, NI = LIM_MLP_IN, H = LIM_MLP_H, NO = LIM_MLP_OUT };

struct lim_pex {
    float *w[3], *b[3]; /* the parameters */
    float *x;           /* [B, NI] */
    int32_t *y;         /* [B] */
    float *h1, *h2, *z, *d1, *d2, *dz;
    float *gw[3], *gb[3]; /* per-example gradients, [B, ...] each */
    rntm_t rntm;
};

static void *lim_zalloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n) != 0) {
        return NULL;
    }
    memset(p, 0, n);
    return p;
}

lim_pex *lim_pex_create(void) {
    lim_pex *m = calloc(1, sizeof *m);
    if (m == NULL) {
        return NULL;
    }
    static const int64_t win[3] = {NI, H, H}, wout[3] = {H, H, NO};
    for (int l = 0; l < 3; l++) {
        m->w[l] = lim_zalloc(sizeof(float) * (size_t)(win[l] * wout[l]));
        m->b[l] = lim_zalloc(sizeof(float) * (size_t)wout[l]);
        m->gw[l] = lim_zalloc(sizeof(float) * (size_t)(B * win[l] * wout[l]));
        m->gb[l] = lim_zalloc(sizeof(float) * (size_t)(B * wout[l]));
    }
    m->x = lim_zalloc(sizeof(float) * B * NI);
    m->y = lim_zalloc(sizeof(int32_t) * B);
    m->h1 = lim_zalloc(sizeof(float) * B * H);
    m->h2 = lim_zalloc(sizeof(float) * B * H);
    m->d1 = lim_zalloc(sizeof(float) * B * H);
    m->d2 = lim_zalloc(sizeof(float) * B * H);
    m->z = lim_zalloc(sizeof(float) * B * NO);
    m->dz = lim_zalloc(sizeof(float) * B * NO);
    bool ok = m->x && m->y && m->h1 && m->h2 && m->d1 && m->d2 && m->z && m->dz;
    for (int l = 0; l < 3; l++) {
        ok = ok && m->w[l] && m->b[l] && m->gw[l] && m->gb[l];
    }
    if (!ok) {
        lim_pex_destroy(m);
        return NULL;
    }
    bli_rntm_init(&m->rntm);
    bli_rntm_set_num_threads(1, &m->rntm);
    return m;
}

void lim_pex_destroy(lim_pex *m) {
    if (m == NULL) {
        return;
    }
    for (int l = 0; l < 3; l++) {
        free(m->w[l]);
        free(m->b[l]);
        free(m->gw[l]);
        free(m->gb[l]);
    }
    free(m->x);
    free(m->y);
    free(m->h1);
    free(m->h2);
    free(m->d1);
    free(m->d2);
    free(m->z);
    free(m->dz);
    free(m);
}

float *lim_pex_param(lim_pex *m, int i) {
    return i % 2 == 0 ? m->w[i / 2] : m->b[i / 2];
}

float *lim_pex_grad(lim_pex *m, int i) {
    return i % 2 == 0 ? m->gw[i / 2] : m->gb[i / 2];
}

float *lim_pex_x(lim_pex *m) {
    return m->x;
}

int32_t *lim_pex_labels(lim_pex *m) {
    return m->y;
}

/* c[mm, nn] = a @ b with element strides (rows, columns) */
static void gemm(lim_pex *m, int64_t mm, int64_t nn, int64_t kk, const float *a, int64_t ars,
                 int64_t acs, const float *b, int64_t brs, int64_t bcs, float *c) {
    float one = 1.0f, zero = 0.0f;
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, mm, nn, kk, &one, (float *)a, ars, acs,
                 (float *)b, brs, bcs, &zero, c, nn, 1, NULL, &m->rntm);
}

static void bias_tanh(const lim_vmath *vm, float *restrict h, const float *restrict bias, int n) {
    for (int i = 0; i < B; i++) {
        for (int j = 0; j < n; j++) {
            h[i * n + j] += bias[j];
        }
    }
    vm->tanhf_n(h, h, (int64_t)B * n);
}

/* g[b] = u_b^T v_b for every example: [nu, nv] outer products */
static void outer(float *restrict g, const float *restrict u, const float *restrict v, int nu,
                  int nv) {
    for (int b = 0; b < B; b++) {
        const float *ub = u + (size_t)b * nu, *vb = v + (size_t)b * nv;
        float *gb = g + (size_t)b * nu * nv;
        for (int i = 0; i < nu; i++) {
            float s = ub[i];
            for (int j = 0; j < nv; j++) {
                gb[(size_t)i * nv + j] = s * vb[j];
            }
        }
    }
}

void lim_pex_grads(lim_pex *m) {
    const lim_vmath *vm = lim_vmath_get();
    gemm(m, B, H, NI, m->x, NI, 1, m->w[0], H, 1, m->h1);
    bias_tanh(vm, m->h1, m->b[0], H);
    gemm(m, B, H, H, m->h1, H, 1, m->w[1], H, 1, m->h2);
    bias_tanh(vm, m->h2, m->b[1], H);
    gemm(m, B, NO, H, m->h2, H, 1, m->w[2], NO, 1, m->z);
    for (int b = 0; b < B; b++) {
        float *z = m->z + b * NO, *dz = m->dz + b * NO, mx = -INFINITY, s = 0;
        for (int j = 0; j < NO; j++) {
            z[j] += m->b[2][j];
            mx = z[j] > mx ? z[j] : mx;
        }
        for (int j = 0; j < NO; j++) {
            dz[j] = expf(z[j] - mx);
            s += dz[j];
        }
        for (int j = 0; j < NO; j++) {
            dz[j] = dz[j] / s - (j == m->y[b] ? 1.0f : 0.0f);
        }
    }
    /* dh2 = dz W2^T (1 - h2^2), dh1 = dh2 W1^T (1 - h1^2) */
    gemm(m, B, H, NO, m->dz, NO, 1, m->w[2], 1, NO, m->d2);
    for (int i = 0; i < B * H; i++) {
        m->d2[i] *= 1.0f - m->h2[i] * m->h2[i];
    }
    gemm(m, B, H, H, m->d2, H, 1, m->w[1], 1, H, m->d1);
    for (int i = 0; i < B * H; i++) {
        m->d1[i] *= 1.0f - m->h1[i] * m->h1[i];
    }
    outer(m->gw[2], m->h2, m->dz, H, NO);
    outer(m->gw[1], m->h1, m->d2, H, H);
    outer(m->gw[0], m->x, m->d1, NI, H);
    memcpy(m->gb[2], m->dz, sizeof(float) * B * NO);
    memcpy(m->gb[1], m->d2, sizeof(float) * B * H);
    memcpy(m->gb[0], m->d1, sizeof(float) * B * H);
}
