/*
 * lim_adam.c -- Adam as nabla's src/optim/optim.c has it, for the limits that train (limits.h):
 * the count saturating at INT32_MAX, the bias corrections 1 / (1 - b^t) in f64 with SLEEF's
 * pow (as nabla's), everything else in the leaves' dtype (f32, or f64 for lim_suite.c's
 * lotka_volterra_mb) in nabla's order of operations. The coefficients are computed once, in
 * f64 (lim_adam_begin_f64), and rounded to f32 for the f32 leaves (lim_adam_begin): nabla
 * computes them in f64 and casts them to each leaf's dtype.
 */
#include "limits.h"

#include <math.h>

lim_adam_step_f64 lim_adam_begin_f64(int32_t *count, double lr, double b1, double b2, double eps,
                                     double eps_root) {
    const lim_vmath *vm = lim_vmath_get();
    int32_t cnt = *count < INT32_MAX ? *count + 1 : *count;
    *count = cnt;
    double t = (double)cnt;
    lim_adam_step_f64 s;
    s.rbc1 = 1.0 / (1.0 - vm->pow1(b1, t));
    s.rbc2 = 1.0 / (1.0 - vm->pow1(b2, t));
    s.b1 = b1, s.c1 = 1.0 - b1;
    s.b2 = b2, s.c2 = 1.0 - b2;
    s.eps = eps, s.eps_root = eps_root, s.nlr = -lr;
    return s;
}

lim_adam_step lim_adam_begin(int32_t *count, double lr, double b1, double b2, double eps,
                             double eps_root) {
    lim_adam_step_f64 d = lim_adam_begin_f64(count, lr, b1, b2, eps, eps_root);
    lim_adam_step s;
    s.rbc1 = (float)d.rbc1, s.rbc2 = (float)d.rbc2;
    s.b1 = (float)d.b1, s.c1 = (float)d.c1;
    s.b2 = (float)d.b2, s.c2 = (float)d.c2;
    s.eps = (float)d.eps, s.eps_root = (float)d.eps_root, s.nlr = (float)d.nlr;
    return s;
}

/* One leaf's update in type T (sqrt: SQRT): the same formulas for f32 and f64. */
#define LIM_ADAM_LEAF(T, SQRT)                                                                     \
    do {                                                                                           \
        T b1 = (T)s->b1, c1 = (T)s->c1, b2 = (T)s->b2, c2 = (T)s->c2;                              \
        T rbc1 = (T)s->rbc1, rbc2 = (T)s->rbc2;                                                    \
        T eps = (T)s->eps, eps_root = (T)s->eps_root, nlr = (T)s->nlr;                             \
        for (int64_t i = 0; i < n; i++) {                                                          \
            T gi = g[i];                                                                           \
            T mi = c1 * gi + b1 * mu[i];                                                           \
            T ni = c2 * (gi * gi) + b2 * nu[i];                                                    \
            mu[i] = mi;                                                                            \
            nu[i] = ni;                                                                            \
            p[i] = p[i] + nlr * ((mi * rbc1) / (SQRT(ni * rbc2 + eps_root) + eps));                \
        }                                                                                          \
    } while (0)

void lim_adam_leaf(const lim_adam_step *s, float *restrict p, float *restrict mu,
                   float *restrict nu, const float *restrict g, int64_t n) {
    LIM_ADAM_LEAF(float, sqrtf);
}

void lim_adam_leaf_f64(const lim_adam_step_f64 *s, double *restrict p, double *restrict mu,
                       double *restrict nu, const double *restrict g, int64_t n) {
    LIM_ADAM_LEAF(double, sqrt);
}
