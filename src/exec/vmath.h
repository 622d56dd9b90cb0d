/*
 * src/exec/vmath.h -- contiguous vector math over SLEEF, one table per instruction set.
 *
 * Every element, tails included, goes through the same SLEEF vector function (tails via a
 * padded register), so a result never depends on how an array was split into chunks.
 * The functions are SLEEF's deterministic variants (finz_ with FMA, cinz_ without): the
 * plain ones pick a faster argument reduction for sin, cos and tan when every lane of the
 * register is small (|x| < 125 in f32, < 15 in f64), so an element's bits depended on its
 * neighbours -- sin(124.f) computed alone and next to 125.f differed by one ULP.
 * Accuracy, chosen per function: tanh uses SLEEF's u35 variant (max error 3.5 ULP; it is
 * an activation, where that bound suffices, and u35 is 2.7x faster here); everything else
 * uses u10 (max error 1.0 ULP): exp, log and friends feed losses and normalisations.
 */
#ifndef NABLA_SRC_AD_VMATH_H
#define NABLA_SRC_AD_VMATH_H

#include <stdint.h>

typedef enum nbi_vm_fn {
    NBI_VM_EXP,
    NBI_VM_EXPM1,
    NBI_VM_LOG,
    NBI_VM_LOG1P,
    NBI_VM_SIN,
    NBI_VM_COS,
    NBI_VM_TAN,
    NBI_VM_TANH,
    NBI_VM_ERF,
    NBI_VM_COUNT
} nbi_vm_fn;

typedef struct nbi_vmath {
    const char *isa;
    void (*f32[NBI_VM_COUNT])(float *o, const float *x, int64_t n);
    void (*f64[NBI_VM_COUNT])(double *o, const double *x, int64_t n);
    void (*pow_f32)(float *o, const float *x, const float *y, int64_t n);
    void (*pow_f64)(double *o, const double *x, const double *y, int64_t n);
} nbi_vmath;

/* The widest table this CPU supports (AVX2+FMA, else SSE2). Immutable; never fails. */
const nbi_vmath *nbi_vmath_get(void);

extern const nbi_vmath nbi_vmath_avx2;
extern const nbi_vmath nbi_vmath_sse2;

#endif
