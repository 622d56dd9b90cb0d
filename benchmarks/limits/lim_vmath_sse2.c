/* lim_vmath_sse2.c -- the SSE2 table of lim_vmath, for x86-64 CPUs without AVX2 and FMA; and
 * lim_vmath_get, which chooses between the two as nabla's nbi_vmath_get does. */
#include "limits.h"

#include <emmintrin.h>

#include <sleef.h>

#define LIM_ISA sse2
#define LIM_ISA_STRING "sse2"
#define LIM_WF 4
#define LIM_WD 2
#define LIM_LOAD_F(p) _mm_loadu_ps(p)
#define LIM_STORE_F(p, v) _mm_storeu_ps((p), (v))
#define LIM_SET1_D(x) _mm_set1_pd(x)
#define LIM_FIRST_D(v) _mm_cvtsd_f64(v)
#define LIM_SLEEF_TANHF Sleef_cinz_tanhf4_u35sse2
#define LIM_SLEEF_EXPF Sleef_cinz_expf4_u10sse2
#define LIM_SLEEF_LOGF Sleef_cinz_logf4_u10sse2
#define LIM_SLEEF_LOG1PF Sleef_cinz_log1pf4_u10sse2
#define LIM_SLEEF_POW Sleef_cinz_powd2_u10sse2

#include "lim_vmath.inc"

const lim_vmath *lim_vmath_get(void) {
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        return &lim_vmath_avx2;
    }
    return &lim_vmath_sse2;
}
