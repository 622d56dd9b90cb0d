/*
 * lim_adam.c -- Adam as nabla's src/optim/optim.c has it, for the limits that train (limits.h):
 * the count saturating at INT32_MAX, the bias corrections 1 / (1 - b^t) in f64 with SLEEF's
 * pow (as nabla's), everything else in f32 in nabla's order of operations.
 */
#include "limits.h"

#include <math.h>

lim_adam_step lim_adam_begin(int32_t *count, double lr, double b1, double b2, double eps,
                             double eps_root) {
    const lim_vmath *vm = lim_vmath_get();
    int32_t cnt = *count < INT32_MAX ? *count + 1 : *count;
    *count = cnt;
    double t = (double)cnt;
    lim_adam_step s;
    s.rbc1 = (float)(1.0 / (1.0 - vm->pow1(b1, t)));
    s.rbc2 = (float)(1.0 / (1.0 - vm->pow1(b2, t)));
    s.b1 = (float)b1, s.c1 = (float)(1.0 - b1);
    s.b2 = (float)b2, s.c2 = (float)(1.0 - b2);
    s.eps = (float)eps, s.eps_root = (float)eps_root, s.nlr = (float)-lr;
    return s;
}

void lim_adam_leaf(const lim_adam_step *s, float *restrict p, float *restrict mu,
                   float *restrict nu, const float *restrict g, int64_t n) {
    float b1 = s->b1, c1 = s->c1, b2 = s->b2, c2 = s->c2, rbc1 = s->rbc1, rbc2 = s->rbc2;
    float eps = s->eps, eps_root = s->eps_root, nlr = s->nlr;
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = c1 * gi + b1 * mu[i];
        float ni = c2 * (gi * gi) + b2 * nu[i];
        mu[i] = mi;
        nu[i] = ni;
        p[i] = p[i] + nlr * ((mi * rbc1) / (sqrtf(ni * rbc2 + eps_root) + eps));
    }
}
