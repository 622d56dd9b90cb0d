/* vmath_avx2.c -- the AVX2+FMA table (this file is compiled with -mavx2 -mfma). */
/* Built alone without those flags (by hand, or a tool's plain compile), gcc gets them here:
 * sleef.h declares its AVX2 functions only where __AVX2__ is defined. */
#if defined(__GNUC__) && !defined(__clang__) && !(defined(__AVX2__) && defined(__FMA__))
#pragma GCC target("avx2,fma")
#endif
#include "exec/vmath.h"

#include <immintrin.h>

#include <sleef.h>

#define NBI_ISA_NAME avx2
#define NBI_ISA_STRING "avx2"
#define NBI_SLEEF_DET Sleef_finz_ /* deterministic, with FMA */
#define NBI_WF 8
#define NBI_WD 4
#define NBI_LOAD_F(p) _mm256_loadu_ps(p)
#define NBI_STORE_F(p, v) _mm256_storeu_ps((p), (v))
#define NBI_LOAD_D(p) _mm256_loadu_pd(p)
#define NBI_STORE_D(p, v) _mm256_storeu_pd((p), (v))

#include "vmath.inc"
