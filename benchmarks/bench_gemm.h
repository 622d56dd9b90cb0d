/*
 * bench_gemm.h -- the BLIS floor of the 784-256-256-10 MLP's step (bench_speed, bench_train):
 * its 8 GEMMs (3 forward, 3 weight gradients, 2 input gradients: the first layer's is not
 * needed) in BLIS alone, on buffers of the same shapes, with transposes as strides, on 1 or
 * 2 threads.
 *
 * 2 threads: BLIS's own threads where the BLIS build has them (bli_rntm_set_num_threads).
 * nabla prefers Debian's single-threaded build (cmake/FindBLIS.cmake), which ignores a
 * thread request; then each GEMM is cut in two halves of its rows, and a second pthread
 * runs the halves of all 8 while this one runs the others, into its own output buffer --
 * no join between GEMMs, so about as low a bound as BLIS splitting each call itself (it
 * splits rows and columns too, never k). The thread's start and join (~20 us) are timed,
 * spread over the sample's `inner` sets.
 */
#ifndef NABLA_BENCH_GEMM_H
#define NABLA_BENCH_GEMM_H

#include "bench_common.h"

#include <blis.h>
#include <stdint.h>

#define BG_OUT (784 * 256) /* the largest output's floats */

typedef struct gemm_ud {
    float *A, *B;
    float *C;    /* 2 x BG_OUT floats at least: the second thread writes the upper half */
    int threads; /* 1 or 2 */
    int inner;   /* sets of 8 per sample */
} gemm_ud;

typedef struct gemm_part {
    const gemm_ud *g;
    int part, parts;
    rntm_t rntm;
} gemm_part;

/* rows [m part / parts, m (part + 1) / parts) of each GEMM, inner times */
static void *bench_gemm_rows(void *arg) {
    gemm_part *p = arg;
    const gemm_ud *g = p->g;
    float *C = g->C + (p->part > 0 ? BG_OUT : 0); /* no cache line shared by the threads */
    const int64_t b = 128, sz[4] = {784, 256, 256, 10};
    float one = 1, zero = 0;
#define BG_LO(m) ((m)*p->part / p->parts)
#define BG_N(m) ((m) * (p->part + 1) / p->parts - BG_LO(m))
    for (int r = 0; r < g->inner; r++) {
        for (int i = 0; i < 3; i++) { /* forward: [b,in] @ [in,out] */
            bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, BG_N(b), sz[i + 1], sz[i], &one,
                         g->A + BG_LO(b) * sz[i], sz[i], 1, g->B, sz[i + 1], 1, &zero,
                         C + BG_LO(b) * sz[i + 1], sz[i + 1], 1, NULL, &p->rntm);
        }
        for (int i = 0; i < 3; i++) { /* dW = h^T [in,b] @ g [b,out] */
            bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, BG_N(sz[i]), sz[i + 1], b, &one,
                         g->A + BG_LO(sz[i]), 1, sz[i], g->B, sz[i + 1], 1, &zero,
                         C + BG_LO(sz[i]) * sz[i + 1], sz[i + 1], 1, NULL, &p->rntm);
        }
        for (int i = 1; i < 3; i++) { /* dh = g [b,out] @ W^T [out,in] */
            bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, BG_N(b), sz[i], sz[i + 1], &one,
                         g->A + BG_LO(b) * sz[i + 1], sz[i + 1], 1, g->B, 1, sz[i + 1], &zero,
                         C + BG_LO(b) * sz[i], sz[i], 1, NULL, &p->rntm);
        }
    }
#undef BG_LO
#undef BG_N
    return NULL;
}

/* µs per set of 8 */
static double sample_gemms(void *ud) {
    const gemm_ud *g = ud;
    bool split = g->threads > 1 && !bli_info_get_enable_threading();
    gemm_part parts[2];
    for (int q = 0; q < 2; q++) {
        parts[q] = (gemm_part){g, q, split ? 2 : 1, BLIS_RNTM_INITIALIZER};
        bli_rntm_set_num_threads(split ? 1 : g->threads, &parts[q].rntm);
    }
    double t0 = bench_now_s();
    if (!split) {
        bench_gemm_rows(&parts[0]);
    } else {
        bench_two_halves(bench_gemm_rows, &parts[0], &parts[1]);
    }
    return (bench_now_s() - t0) / g->inner * 1e6;
}

#endif /* NABLA_BENCH_GEMM_H */
