/*
 * lim_nn.c -- the pieces the hand-written models share (limits.h): the one-thread BLIS product,
 * the buffers, the log-softmax cross-entropy and its gradient (SLEEF expf, logf u10, as nabla's
 * kernels), and the 3x3 convolution, relu and max pool pieces of the digits CNNs (lim_cnn.c,
 * lim_suite.c's cnn_mb) on channel-major [c, n, 8, 8] activations.
 */
#include "limits.h"

#include <blis.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { S = 8, P = 4 };

void lim_sgemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t ars, int64_t acs,
               const float *b, int64_t brs, int64_t bcs, float beta, float *c, int64_t ldc) {
    rntm_t rntm;
    bli_rntm_init(&rntm);
    bli_rntm_set_num_threads(1, &rntm);
    float one = 1.0f;
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one, (float *)a, ars, acs,
                 (float *)b, brs, bcs, &beta, c, ldc, 1, NULL, &rntm);
}

float *lim_bufs_alloc(lim_bufs *b, int64_t n) {
    if (b->n == (int)(sizeof b->blocks / sizeof b->blocks[0])) {
        return NULL;
    }
    size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    float *q = aligned_alloc(64, bytes > 0 ? bytes : 64);
    if (q != NULL) {
        memset(q, 0, bytes);
        b->blocks[b->n++] = q;
    }
    return q;
}

void lim_bufs_free(lim_bufs *b) {
    for (int i = 0; i < b->n; i++) {
        free(b->blocks[i]);
    }
    b->n = 0;
}

float lim_xent_fwd(const lim_vmath *vm, float *z, const float *b, float *e, float *mx, float *s,
                   float *ls, const int32_t *y, int64_t rows, int64_t v) {
    for (int64_t i = 0; i < rows; i++) {
        float *zi = z + i * v;
        if (b != NULL) {
            for (int64_t j = 0; j < v; j++) {
                zi[j] = zi[j] + b[j];
            }
        }
        float m = zi[0];
        for (int64_t j = 1; j < v; j++) {
            m = (zi[j] > m || zi[j] != zi[j]) ? zi[j] : m;
        }
        mx[i] = fabsf(m) < INFINITY ? m : 0.0f;
        for (int64_t j = 0; j < v; j++) {
            e[i * v + j] = zi[j] - mx[i];
        }
    }
    vm->expf_n(e, e, rows * v);
    for (int64_t i = 0; i < rows; i++) {
        float t = e[i * v];
        for (int64_t j = 1; j < v; j++) {
            t = t + e[i * v + j];
        }
        s[i] = t;
    }
    vm->logf_n(ls, s, rows);
    float total = 0.0f;
    for (int64_t i = 0; i < rows; i++) {
        float q = (z[i * v + y[i]] - mx[i]) - ls[i];
        total = i == 0 ? q : total + q;
    }
    return -(total / (float)rows);
}

void lim_xent_bwd(float *dz, const float *e, const float *s, const int32_t *y, int64_t rows,
                  int64_t v) {
    const float inv = 1.0f / (float)rows;
    for (int64_t i = 0; i < rows; i++) {
        float r = inv * (1.0f / s[i]);
        for (int64_t j = 0; j < v; j++) {
            float dl = j == y[i] ? -inv : 0.0f;
            dz[i * v + j] = dl + r * e[i * v + j];
        }
    }
}

void lim_colsum(float *restrict c, const float *restrict a, int64_t rows, int64_t cols,
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

/* one row of the columns, the tap at (ky, kx) - 1: dst [n, 8, 8] = src [n, 8, 8] shifted, or 0
 * where it reads the padding */
static void im2col_row(float *restrict dst, const float *restrict src, int ky, int kx, int64_t n) {
    int x0 = kx == 0 ? 1 : 0, x1 = kx == 2 ? S - 1 : S;
    for (int64_t i = 0; i < n; i++) {
        for (int y = 0; y < S; y++) {
            float *restrict d = dst + i * 64 + y * S;
            int iy = y + ky - 1;
            if (iy < 0 || iy >= S) {
                memset(d, 0, S * sizeof(float));
                continue;
            }
            const float *restrict sr = src + i * 64 + iy * S;
            d[0] = 0.0f;
            d[S - 1] = 0.0f;
            for (int x = x0; x < x1; x++) {
                d[x] = sr[x + kx - 1];
            }
        }
    }
}

void lim_conv_im2col(float *cols, const float *in, int64_t c, int64_t n) {
    for (int64_t ch = 0; ch < c; ch++) {
        for (int k = 0; k < 9; k++) {
            im2col_row(cols + (ch * 9 + k) * n * 64, in + ch * n * 64, k / 3, k % 3, n);
        }
    }
}

/* the transpose of im2col_row: dst [n, 8, 8] += the row's elements at the inputs they read */
static void col2im_row(float *restrict dst, const float *restrict row, int ky, int kx, int64_t n) {
    int x0 = kx == 0 ? 1 : 0, x1 = kx == 2 ? S - 1 : S;
    for (int64_t i = 0; i < n; i++) {
        for (int y = 0; y < S; y++) {
            int iy = y + ky - 1;
            if (iy < 0 || iy >= S) {
                continue;
            }
            float *restrict d = dst + i * 64 + iy * S;
            const float *restrict r = row + i * 64 + y * S;
            for (int x = x0; x < x1; x++) {
                d[x + kx - 1] = d[x + kx - 1] + r[x];
            }
        }
    }
}

void lim_conv_col2im(float *out, const float *cols, int64_t c, int64_t n) {
    memset(out, 0, (size_t)(c * n * 64) * sizeof(float));
    for (int64_t ch = 0; ch < c; ch++) {
        for (int k = 0; k < 9; k++) {
            col2im_row(out + ch * n * 64, cols + (ch * 9 + k) * n * 64, k / 3, k % 3, n);
        }
    }
}

void lim_bias_relu_rows(float *restrict a, const float *restrict bias, int64_t rows, int64_t len) {
    for (int64_t c = 0; c < rows; c++) {
        float bc = bias[c];
        for (int64_t i = 0; i < len; i++) {
            float v = a[c * len + i] + bc;
            a[c * len + i] = v > 0.0f ? v : 0.0f;
        }
    }
}

/* 16 running sums, added pairwise at the end: a vector of accumulators, not one chain of
 * thousands of dependent additions */
void lim_relu_back_rows(float *restrict d, const float *restrict a, float *restrict db,
                        int64_t rows, int64_t len) {
    enum { W = 16 };
    for (int64_t c = 0; c < rows; c++) {
        float acc[W] = {0};
        for (int64_t i = 0; i < len; i += W) {
            for (int k = 0; k < W; k++) {
                int64_t q = c * len + i + k;
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

void lim_pool_fwd(float *restrict f, int32_t *restrict arg, const float *restrict a, int64_t c,
                  int64_t n) {
    static const int off[4] = {0, 1, S, S + 1};
    int64_t nl = n * 64, nf = c * P * P;
    for (int64_t ch = 0; ch < c; ch++) {
        for (int64_t i = 0; i < n; i++) {
            for (int py = 0; py < P; py++) {
                for (int px = 0; px < P; px++) {
                    int32_t base = (int32_t)(ch * nl + i * 64 + 2 * py * S + 2 * px), best = base;
                    for (int k = 1; k < 4; k++) {
                        float v = a[base + off[k]], bv = a[best];
                        best = (v > bv || (v != v && bv == bv)) ? base + off[k] : best;
                    }
                    int64_t fi = i * nf + ch * P * P + py * P + px;
                    arg[fi] = best;
                    f[fi] = a[best];
                }
            }
        }
    }
}

void lim_pool_bwd(float *restrict da, const float *restrict df, const int32_t *restrict arg,
                  int64_t c, int64_t n) {
    memset(da, 0, (size_t)(c * n * 64) * sizeof(float));
    for (int64_t i = 0; i < n * c * P * P; i++) {
        da[arg[i]] += df[i];
    }
}
