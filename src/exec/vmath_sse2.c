/* vmath_sse2.c -- the SSE2 table, for x86-64 CPUs without AVX2 and FMA. */
#include "exec/vmath.h"

#include <emmintrin.h>

#include <sleef.h>

#define NBI_ISA_NAME sse2
#define NBI_ISA_STRING "sse2"
#define NBI_SLEEF_DET Sleef_cinz_ /* deterministic, without FMA */
#define NBI_WF 4
#define NBI_WD 2
#define NBI_LOAD_F(p) _mm_loadu_ps(p)
#define NBI_STORE_F(p, v) _mm_storeu_ps((p), (v))
#define NBI_LOAD_D(p) _mm_loadu_pd(p)
#define NBI_STORE_D(p, v) _mm_storeu_pd((p), (v))

#include "vmath.inc"
