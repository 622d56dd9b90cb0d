/*
 * tests/ode/stiff_problems.h -- five standard stiff test problems as nabla ODE terms.
 *
 * The same problems, y0, p and t1 as tests/ode/oracle/gen_stiff.py (whose docstring gives
 * the equations and their sources: Hairer & Wanner's stiff set as in the IVPtestset and
 * SciML's ODEProblemLibrary / SciMLBenchmarks, and MATLAB's vdp1000), whose reference data
 * is tests/ode/oracle/stiff_ref.txt. Each right-hand side uses the same operations in the
 * same order as the script, so f(0, y0) agrees with it to the last bits.
 *
 * A term is called on the tuple (t, y, p): t a 0-d var, y an f64 var of shape [n], p an f64
 * var of shape [np]; it returns dy/dt, an f64 var of shape [n]. Every numeric rate constant
 * is an entry of p (in the script's order), so gradients with respect to them can be taken;
 * the only literals left are the structural 1s and 2s.
 *
 *   robertson, robertson_long  p = (k1, k2, k3)                        n = 3,  np = 3
 *   vdp                        p = (mu)                                n = 2,  np = 1
 *   hires                      p = (p1..p12), the 12 distinct numbers  n = 8,  np = 12
 *                              of hires.f in order of appearance
 *   orego                      p = (s, q, w)                           n = 3,  np = 3
 *   pollu                      p = (k1..k25)                           n = 20, np = 25
 *
 * Header-only and self-contained: everything is static and marked unused, so a test that
 * includes it and uses only some of it compiles without warnings.
 */
#ifndef NABLA_TESTS_ODE_STIFF_PROBLEMS_H
#define NABLA_TESTS_ODE_STIFF_PROBLEMS_H

#include <nabla/nabla.h>
#include <stdint.h>

#if defined(__GNUC__)
#define SP_UNUSED __attribute__((unused))
#else
#define SP_UNUSED
#endif

/* x[i:i+1], a [1] var. */
static inline nb_var *sp_at(nb_var *x, int64_t i) {
    return nb_slice(x, (int64_t[]){i}, (int64_t[]){i + 1}, NULL);
}

/* ---- Robertson -------------------------------------------------------------------------
 * y1' = -k1 y1 + k3 y2 y3, y2' = k1 y1 - k3 y2 y3 - k2 y2^2, y3' = k2 y2^2. */
static SP_UNUSED nb_status term_robertson(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                          nb_tree **out) {
    (void)self;
    nb_var *y = nb_get(tr, args, "[1]"), *k = nb_get(tr, args, "[2]");
    nb_var *y1 = sp_at(y, 0), *y2 = sp_at(y, 1), *y3 = sp_at(y, 2);
    nb_var *a = nb_mul(sp_at(k, 0), y1), *b = nb_mul(nb_mul(sp_at(k, 2), y2), y3);
    nb_var *c = nb_mul(nb_mul(sp_at(k, 1), y2), y2);
    return nb_return(
        nb_concatenate(3, (nb_var *[]){nb_add(nb_neg(a), b), nb_sub(nb_sub(a, b), c), c}, 0), out);
}

/* ---- Van der Pol, unscaled, mu = 1000 ---------------------------------------------------
 * y1' = y2, y2' = mu ((1 - y1^2) y2) - y1. */
static SP_UNUSED nb_status term_vdp(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                    nb_tree **out) {
    (void)self;
    nb_var *y = nb_get(tr, args, "[1]"), *p = nb_get(tr, args, "[2]");
    nb_var *y1 = sp_at(y, 0), *y2 = sp_at(y, 1), *mu = sp_at(p, 0);
    nb_var *one = nb_scalar(tr, 1.0);
    nb_var *d2 = nb_sub(nb_mul(mu, nb_mul(nb_sub(one, nb_square(y1)), y2)), y1);
    return nb_return(nb_concatenate(2, (nb_var *[]){y2, d2}, 0), out);
}

/* ---- HIRES (IVPtestset hires.f) ---------------------------------------------------------
 * p = (1.71, 0.43, 8.32, 0.0007, 8.75, 10.03, 0.035, 1.12, 1.745, 280, 0.69, 1.81):
 *   y1' = -p1 y1 + p2 y2 + p3 y3 + p4           y5' = -p9 y5 + p2 (y6 + y7)
 *   y2' =  p1 y1 - p5 y2                        y6' = -p10 y6 y8 + p11 y4 + p1 y5 - p2 y6 + p11 y7
 *   y3' = -p6 y3 + p2 y4 + p7 y5                y7' =  p10 y6 y8 - p12 y7
 *   y4' =  p3 y2 + p1 y3 - p8 y4                y8' = -y7'                                    */
static SP_UNUSED nb_status term_hires(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                      nb_tree **out) {
    (void)self;
    nb_var *y = nb_get(tr, args, "[1]"), *p = nb_get(tr, args, "[2]");
    nb_var *Y[8], *P[12];
    for (int i = 0; i < 8; i++)
        Y[i] = sp_at(y, i);
    for (int i = 0; i < 12; i++)
        P[i] = sp_at(p, i);
    nb_var *y1 = Y[0], *y2 = Y[1], *y3 = Y[2], *y4 = Y[3], *y5 = Y[4], *y6 = Y[5], *y7 = Y[6],
           *y8 = Y[7];
    nb_var *p1 = P[0], *p2 = P[1], *p3 = P[2], *p4 = P[3], *p5 = P[4], *p6 = P[5], *p7 = P[6],
           *p8 = P[7], *p9 = P[8], *p10 = P[9], *p11 = P[10], *p12 = P[11];
    nb_var *p10y6y8 = nb_mul(nb_mul(p10, y6), y8);
    nb_var *f1 = nb_add(nb_add(nb_add(nb_neg(nb_mul(p1, y1)), nb_mul(p2, y2)), nb_mul(p3, y3)), p4);
    nb_var *f2 = nb_sub(nb_mul(p1, y1), nb_mul(p5, y2));
    nb_var *f3 = nb_add(nb_add(nb_neg(nb_mul(p6, y3)), nb_mul(p2, y4)), nb_mul(p7, y5));
    nb_var *f4 = nb_sub(nb_add(nb_mul(p3, y2), nb_mul(p1, y3)), nb_mul(p8, y4));
    nb_var *f5 = nb_add(nb_neg(nb_mul(p9, y5)), nb_mul(p2, nb_add(y6, y7)));
    nb_var *f6 = nb_add(
        nb_sub(nb_add(nb_add(nb_neg(p10y6y8), nb_mul(p11, y4)), nb_mul(p1, y5)), nb_mul(p2, y6)),
        nb_mul(p11, y7));
    nb_var *f7 = nb_sub(p10y6y8, nb_mul(p12, y7));
    nb_var *f8 = nb_neg(f7);
    return nb_return(nb_concatenate(8, (nb_var *[]){f1, f2, f3, f4, f5, f6, f7, f8}, 0), out);
}

/* ---- Oregonator (IVPtestset orego.f) ----------------------------------------------------
 * p = (s, q, w) = (77.27, 8.375e-6, 0.161):
 *   y1' = s (y2 + y1 (1 - q y1 - y2)), y2' = (y3 - (1 + y1) y2) / s, y3' = w (y1 - y3). */
static SP_UNUSED nb_status term_orego(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                      nb_tree **out) {
    (void)self;
    nb_var *y = nb_get(tr, args, "[1]"), *p = nb_get(tr, args, "[2]");
    nb_var *y1 = sp_at(y, 0), *y2 = sp_at(y, 1), *y3 = sp_at(y, 2);
    nb_var *s = sp_at(p, 0), *q = sp_at(p, 1), *w = sp_at(p, 2);
    nb_var *one = nb_scalar(tr, 1.0);
    nb_var *f1 = nb_mul(s, nb_add(y2, nb_mul(y1, nb_sub(nb_sub(one, nb_mul(q, y1)), y2))));
    nb_var *f2 = nb_div(nb_sub(y3, nb_mul(nb_add(one, y1), y2)), s);
    nb_var *f3 = nb_mul(w, nb_sub(y1, y3));
    return nb_return(nb_concatenate(3, (nb_var *[]){f1, f2, f3}, 0), out);
}

/* ---- POLLU (IVPtestset pollu.f) ---------------------------------------------------------
 * 25 reactions r_j = k_j y_a (y_b) (1-based species, multiplied left to right), and
 * dy_i/dt = a signed sum of rates, summed left to right as in pollu.f. */
static const int SP_POLLU_REACTANTS[25][2] SP_UNUSED = {
    {1, 0},  {2, 4},  {5, 2},  {7, 0},  {7, 0}, {7, 6},  {9, 0}, {9, 6}, {11, 2},
    {11, 1}, {13, 0}, {10, 2}, {14, 0}, {1, 6}, {3, 0},  {4, 0}, {4, 0}, {16, 0},
    {16, 0}, {17, 6}, {19, 0}, {19, 0}, {1, 4}, {19, 1}, {20, 0}};
/* Signed 1-based reaction indices per equation, 0-terminated. */
static const int SP_POLLU_SUMS[20][13] SP_UNUSED = {
    {-1, -10, -14, -23, -24, 2, 3, 9, 11, 12, 22, 25, 0},
    {-2, -3, -9, -12, 1, 21, 0},
    {-15, 1, 17, 19, 22, 0},
    {-2, -16, -17, -23, 15, 0},
    {-3, 4, 4, 6, 7, 13, 20, 0},
    {-6, -8, -14, -20, 3, 18, 18, 0},
    {-4, -5, -6, 13, 0},
    {4, 5, 6, 7, 0},
    {-7, -8, 0},
    {-12, 7, 9, 0},
    {-9, -10, 8, 11, 0},
    {9, 0},
    {-11, 10, 0},
    {-13, 12, 0},
    {14, 0},
    {-18, -19, 16, 0},
    {-20, 0},
    {20, 0},
    {-21, -22, -24, 23, 25, 0},
    {-25, 24, 0}};

static SP_UNUSED nb_status term_pollu(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                      nb_tree **out) {
    (void)self;
    nb_var *y = nb_get(tr, args, "[1]"), *k = nb_get(tr, args, "[2]");
    nb_var *Y[20], *r[25], *f[20];
    for (int i = 0; i < 20; i++)
        Y[i] = sp_at(y, i);
    for (int j = 0; j < 25; j++) {
        r[j] = nb_mul(sp_at(k, j), Y[SP_POLLU_REACTANTS[j][0] - 1]);
        if (SP_POLLU_REACTANTS[j][1])
            r[j] = nb_mul(r[j], Y[SP_POLLU_REACTANTS[j][1] - 1]);
    }
    for (int i = 0; i < 20; i++) {
        const int *s = SP_POLLU_SUMS[i];
        nb_var *acc = s[0] > 0 ? r[s[0] - 1] : nb_neg(r[-s[0] - 1]);
        for (int m = 1; s[m] != 0; m++)
            acc = s[m] > 0 ? nb_add(acc, r[s[m] - 1]) : nb_sub(acc, r[-s[m] - 1]);
        f[i] = acc;
    }
    return nb_return(nb_concatenate(20, f, 0), out);
}

/* ---- data (the numbers of gen_stiff.py, digit for digit) -------------------------------- */
static const double SP_ROBERTSON_Y0[3] SP_UNUSED = {1.0, 0.0, 0.0};
static const double SP_ROBERTSON_P[3] SP_UNUSED = {0.04, 3e7, 1e4};
static const double SP_VDP_Y0[2] SP_UNUSED = {2.0, 0.0};
static const double SP_VDP_P[1] SP_UNUSED = {1000.0};
static const double SP_HIRES_Y0[8] SP_UNUSED = {1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0057};
static const double SP_HIRES_P[12] SP_UNUSED = {1.71,  0.43, 8.32,  0.0007, 8.75, 10.03,
                                                0.035, 1.12, 1.745, 280.0,  0.69, 1.81};
static const double SP_OREGO_Y0[3] SP_UNUSED = {1.0, 2.0, 3.0};
static const double SP_OREGO_P[3] SP_UNUSED = {77.27, 8.375e-6, 0.161};
static const double SP_POLLU_Y0[20] SP_UNUSED = {0.0, 0.2,  0.0,   0.04, 0.0, 0.0, 0.1,
                                                 0.3, 0.01, 0.0,   0.0,  0.0, 0.0, 0.0,
                                                 0.0, 0.0,  0.007, 0.0,  0.0, 0.0};
static const double SP_POLLU_P[25] SP_UNUSED = {
    .35e0,   .266e2, .123e5, .86e-3, .82e-3,  .15e5,  .13e-3, .24e5,   .165e5,
    .9e4,    .22e-1, .12e5,  .188e1, .163e5,  .48e7,  .35e-3, .175e-1, .1e9,
    .444e12, .124e4, .21e1,  .578e1, .474e-1, .178e4, .312e1};

typedef struct sp_problem {
    const char *name;
    nb_fn_body term;
    int n, np;
    double t1;
    const double *y0, *p;
} sp_problem;

/* In the order of tests/ode/oracle/stiff_ref.txt. */
static const sp_problem SP_PROBLEMS[] SP_UNUSED = {
    {"robertson", term_robertson, 3, 3, 1e5, SP_ROBERTSON_Y0, SP_ROBERTSON_P},
    {"robertson_long", term_robertson, 3, 3, 1e11, SP_ROBERTSON_Y0, SP_ROBERTSON_P},
    {"vdp", term_vdp, 2, 1, 3000.0, SP_VDP_Y0, SP_VDP_P},
    {"hires", term_hires, 8, 12, 321.8122, SP_HIRES_Y0, SP_HIRES_P},
    {"orego", term_orego, 3, 3, 360.0, SP_OREGO_Y0, SP_OREGO_P},
    {"pollu", term_pollu, 20, 25, 60.0, SP_POLLU_Y0, SP_POLLU_P},
};
#define SP_N_PROBLEMS ((int)(sizeof SP_PROBLEMS / sizeof SP_PROBLEMS[0]))

#endif /* NABLA_TESTS_ODE_STIFF_PROBLEMS_H */
