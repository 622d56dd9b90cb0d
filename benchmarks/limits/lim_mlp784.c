/*
 * lim_mlp784.c -- the MLP 784-256-256-10 train step, hand-written (limits.h): bench_train's
 * model (tanh hidden layers, mean cross-entropy over 10 classes, batch 128) and one Adam step.
 * Its 8 GEMMs go to BLIS (bli_sgemm_ex on a one-thread runtime, transposes as strides, as
 * nabla calls it); the rest -- bias, tanh (SLEEF u35), the stable log-softmax (SLEEF expf,
 * logf u10), the loss, the backward elementwise work, the bias gradients and Adam -- are
 * plain loops doing nabla's operations in nabla's order (see lim_mlp.c for Adam's).
 *
 *   forward   h1 = tanh(x W0 + b0), h2 = tanh(h1 W1 + b1), z = h2 W2 + b2,
 *             m = max_j z (0 if not finite), s = sum_j exp(z - m), logp = (z - m) - log s,
 *             loss = -(sum_i logp[i, y_i] / 128)
 *   backward  dz = onehot(y) (-1/128) + ((1/128) / s) exp(z - m), then the three layers:
 *             db = sum over the batch, dW = h^T dz, dh = dz W^T, dz' = dh (1 - h^2)
 */
#include "limits.h"

#include <blis.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum { B = LIM_MLP_B, NI = LIM_MLP_IN, H = LIM_MLP_H, NO = LIM_MLP_OUT };

enum { N_W0 = NI * H, N_W1 = H * H, N_W2 = H * NO }; /* elements of the weights */
static const int64_t lim_leaf_n[6] = {N_W0, H, N_W1, H, N_W2, NO};

struct lim_mlp {
    float *leaf[3][6]; /* params, mu, nu */
    float *g[6];       /* gradients */
    /* lim_mlp_gemms_adam's copy of params, mu, nu (its Adam moves them; its GEMMs read the
     * model's own parameters, which it leaves alone, so its gradients stay the size of real
     * ones and nothing drifts towards overflow or subnormals) */
    float *shadow[3][6];
    int32_t shadow_count;
    bool shadow_set;
    float *x;
    int32_t *y;
    int32_t count;
    double lr, b1, b2, eps, eps_root;
    float *h1, *h2, *z, *e, *d2, *d1; /* activations, exp(z - m), layer gradients */
    float s[B];
    rntm_t rntm;
    void *block;
};

lim_mlp *lim_mlp_create(void) {
    lim_mlp *m = calloc(1, sizeof *m);
    if (m == NULL) {
        return NULL;
    }
    size_t n = 0;
    for (int i = 0; i < 6; i++) {
        n += 7 * ((size_t)lim_leaf_n[i] + 16); /* params, mu, nu, g, shadows; 64-byte aligned */
    }
    n += (size_t)B * NI + B + 2 * (size_t)B * H + 2 * (size_t)B * NO + 2 * (size_t)B * H + 64;
    m->block = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (m->block == NULL) {
        free(m);
        return NULL;
    }
    memset(m->block, 0, n * sizeof(float));
    float *q = m->block;
#define LIM_TAKE(ptr, count)                                                                       \
    do {                                                                                           \
        (ptr) = q;                                                                                 \
        q += ((size_t)(count) + 15) / 16 * 16;                                                     \
    } while (0)
    for (int i = 0; i < 6; i++) {
        for (int w = 0; w < 3; w++) {
            LIM_TAKE(m->leaf[w][i], lim_leaf_n[i]);
        }
        LIM_TAKE(m->g[i], lim_leaf_n[i]);
        for (int w = 0; w < 3; w++) {
            LIM_TAKE(m->shadow[w][i], lim_leaf_n[i]);
        }
    }
    LIM_TAKE(m->x, (size_t)B * NI);
    m->y = (int32_t *)q;
    q += B;
    LIM_TAKE(m->h1, (size_t)B * H);
    LIM_TAKE(m->h2, (size_t)B * H);
    LIM_TAKE(m->z, (size_t)B * NO);
    LIM_TAKE(m->e, (size_t)B * NO);
    LIM_TAKE(m->d2, (size_t)B * H);
    LIM_TAKE(m->d1, (size_t)B * H);
#undef LIM_TAKE
    bli_rntm_init(&m->rntm);
    bli_rntm_set_num_threads(1, &m->rntm);
    m->lr = 1e-3, m->b1 = 0.9, m->b2 = 0.999, m->eps = 1e-8, m->eps_root = 0.0;
    return m;
}

void lim_mlp_destroy(lim_mlp *m) {
    if (m != NULL) {
        free(m->block);
        free(m);
    }
}

float *lim_mlp_leaf(lim_mlp *m, int which, int i, int64_t *n) {
    if (n != NULL) {
        *n = lim_leaf_n[i];
    }
    return m->leaf[which][i];
}

float *lim_mlp_x(lim_mlp *m) {
    return m->x;
}

int32_t *lim_mlp_labels(lim_mlp *m) {
    return m->y;
}

void lim_mlp_set_adam(lim_mlp *m, int32_t count, double lr, double b1, double b2, double eps,
                      double eps_root) {
    m->count = count, m->lr = lr, m->b1 = b1, m->b2 = b2, m->eps = eps, m->eps_root = eps_root;
}

int32_t lim_mlp_count(const lim_mlp *m) {
    return m->count;
}

/* c[mm, nn] = a @ b, with element strides (rows, columns) of a and b */
static void gemm(lim_mlp *m, int64_t mm, int64_t nn, int64_t kk, const float *a, int64_t ars,
                 int64_t acs, const float *b, int64_t brs, int64_t bcs, float *c) {
    float one = 1.0f, zero = 0.0f;
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, mm, nn, kk, &one, (float *)a, ars, acs,
                 (float *)b, brs, bcs, &zero, c, nn, 1, NULL, &m->rntm);
}

/* h[B, n] = tanh(h + bias) */
static void bias_tanh(const lim_vmath *vm, float *restrict h, const float *restrict bias, int n) {
    for (int i = 0; i < B; i++) {
        for (int j = 0; j < n; j++) {
            h[i * n + j] = h[i * n + j] + bias[j];
        }
    }
    vm->tanhf_n(h, h, (int64_t)B * n);
}

/* d = d (1 - h^2) over [B, H]; db = its sum over the batch */
static void tanh_back(const float *restrict h, float *restrict d, float *restrict db) {
    for (int i = 0; i < B * H; i++) {
        d[i] = d[i] * (1.0f - h[i] * h[i]);
    }
    for (int j = 0; j < H; j++) {
        db[j] = d[j];
    }
    for (int i = 1; i < B; i++) {
        for (int j = 0; j < H; j++) {
            db[j] = db[j] + d[i * H + j];
        }
    }
}

/* Adam over the six leaves st[0] (params), st[1] (mu), st[2] (nu), with the gradients in
 * m->g and the step count *count */
static void adam(lim_mlp *m, float *(*st)[6], int32_t *count) {
    lim_adam_step s = lim_adam_begin(count, m->lr, m->b1, m->b2, m->eps, m->eps_root);
    for (int l = 0; l < 6; l++) {
        lim_adam_leaf(&s, st[0][l], st[1][l], st[2][l], m->g[l], lim_leaf_n[l]);
    }
}

float lim_mlp_step(lim_mlp *m) {
    const lim_vmath *vm = lim_vmath_get();
    float *const *p = m->leaf[0];
    float *restrict h1 = m->h1, *restrict h2 = m->h2, *restrict z = m->z, *restrict e = m->e;
    /* forward */
    gemm(m, B, H, NI, m->x, NI, 1, p[0], H, 1, h1);
    bias_tanh(vm, h1, p[1], H);
    gemm(m, B, H, H, h1, H, 1, p[2], H, 1, h2);
    bias_tanh(vm, h2, p[3], H);
    gemm(m, B, NO, H, h2, H, 1, p[4], NO, 1, z);
    /* the bias, softmax and mean cross-entropy, then dz into z (lim_nn.c) */
    float mx[B], ls[B];
    float loss = lim_xent_fwd(vm, z, p[5], e, mx, m->s, ls, m->y, B, NO);
    float *restrict dz = z;
    lim_xent_bwd(dz, e, m->s, m->y, B, NO);
    float *g5 = m->g[5];
    for (int j = 0; j < NO; j++) {
        g5[j] = dz[j];
    }
    for (int i = 1; i < B; i++) {
        for (int j = 0; j < NO; j++) {
            g5[j] = g5[j] + dz[i * NO + j];
        }
    }
    gemm(m, B, H, NO, dz, NO, 1, p[4], 1, NO, m->d2); /* dh2 = dz W2^T */
    gemm(m, H, NO, B, h2, 1, H, dz, NO, 1, m->g[4]);  /* dW2 = h2^T dz */
    tanh_back(h2, m->d2, m->g[3]);
    gemm(m, B, H, H, m->d2, H, 1, p[2], 1, H, m->d1); /* dh1 = d2 W1^T */
    gemm(m, H, H, B, h1, 1, H, m->d2, H, 1, m->g[2]); /* dW1 = h1^T d2 */
    tanh_back(h1, m->d1, m->g[1]);
    gemm(m, NI, H, B, m->x, 1, NI, m->d1, H, 1, m->g[0]); /* dW0 = x^T d1 */

    adam(m, m->leaf, &m->count);
    return loss;
}

void lim_mlp_gemms_adam(lim_mlp *m) {
    float *const *p = m->leaf[0];
    gemm(m, B, H, NI, m->x, NI, 1, p[0], H, 1, m->h1);
    gemm(m, B, H, H, m->h1, H, 1, p[2], H, 1, m->h2);
    gemm(m, B, NO, H, m->h2, H, 1, p[4], NO, 1, m->z);
    gemm(m, B, H, NO, m->z, NO, 1, p[4], 1, NO, m->d2);
    gemm(m, H, NO, B, m->h2, 1, H, m->z, NO, 1, m->g[4]);
    gemm(m, B, H, H, m->d2, H, 1, p[2], 1, H, m->d1);
    gemm(m, H, H, B, m->h1, 1, H, m->d2, H, 1, m->g[2]);
    gemm(m, NI, H, B, m->x, 1, NI, m->d1, H, 1, m->g[0]);
    if (!m->shadow_set) {
        for (int w = 0; w < 3; w++) {
            for (int l = 0; l < 6; l++) {
                memcpy(m->shadow[w][l], m->leaf[w][l], (size_t)lim_leaf_n[l] * sizeof(float));
            }
        }
        m->shadow_count = m->count;
        m->shadow_set = true;
    }
    adam(m, m->shadow, &m->shadow_count);
}
