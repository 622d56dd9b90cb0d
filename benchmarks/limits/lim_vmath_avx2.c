/* lim_vmath_avx2.c -- the AVX2 + FMA table of lim_vmath (compiled with -mavx2 -mfma, chosen
 * at run time only on CPUs that have both, as nabla's src/exec/vmath_avx2.c). */
#if defined(__GNUC__) && !defined(__clang__) && !(defined(__AVX2__) && defined(__FMA__))
#pragma GCC target("avx2,fma") /* compiled alone without the flags: sleef.h's AVX2 part */
#endif
#include "limits.h"

#include <immintrin.h>

#include <sleef.h>

#define LIM_ISA avx2
#define LIM_ISA_STRING "avx2"
#define LIM_WF 8
#define LIM_WD 4
#define LIM_LOAD_F(p) _mm256_loadu_ps(p)
#define LIM_STORE_F(p, v) _mm256_storeu_ps((p), (v))
#define LIM_SET1_D(x) _mm256_set1_pd(x)
#define LIM_FIRST_D(v) _mm256_cvtsd_f64(v)
#define LIM_SLEEF_TANHF Sleef_finz_tanhf8_u35avx2
#define LIM_SLEEF_EXPF Sleef_finz_expf8_u10avx2
#define LIM_SLEEF_LOGF Sleef_finz_logf8_u10avx2
#define LIM_SLEEF_LOG1PF Sleef_finz_log1pf8_u10avx2
#define LIM_SLEEF_POW Sleef_finz_powd4_u10avx2

#include "lim_vmath.inc"
