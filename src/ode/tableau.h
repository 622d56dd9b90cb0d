/*
 * tableau.h -- the explicit Runge-Kutta methods of nabla/ode.h as data: Butcher tableaus,
 * embedded error estimates and dense-output polynomials (src/ode/tableau.c).
 *
 * A step from (t0, y0) with step h computes stages
 *     k_i = f(t0 + c_i h, y0 + h sum_{j<i} a_ij k_j),   i = 0 .. stages-1
 * and the solution y1 = y0 + h sum_i b_i k_i. With an embedded method the local error
 * estimate is h sum_i e_i k_i (e = b - bhat). FSAL: the last stage is f(t0 + h, y1), i.e.
 * c_{s-1} = 1 and a_{s-1, j} = b_j.
 *
 * Dense output: y(t0 + theta h) = y0 + h sum_{i < dense_stages} B_i(theta) k_i, where
 * B_i(theta) = sum_{p=1..dense_degree} dense[i * dense_degree + p - 1] theta^p. Stages beyond
 * `stages` (i >= stages) are extra stages evaluated only for dense output, with their a and
 * c rows in the same arrays (a and c have dense_stages rows). When extra_uses_f1 is set
 * (non-FSAL methods whose interpolant needs f(t0 + h, y1), as DOP853's), stage index
 * `stages` is f(t0 + h, y1) itself -- the solver always computes it (it is the next step's
 * first stage), so its a row is unused and c = 1 -- and the extra stages follow it.
 * dense_degree == 0: the method has no interpolant of its own and
 * the solver uses the cubic Hermite interpolant through (y0, f(t0, y0), y1, f(t0 + h, y1)).
 */
#ifndef NABLA_ODE_TABLEAU_H
#define NABLA_ODE_TABLEAU_H

#include <stdbool.h>

/* A Rosenbrock(-Wanner) method in the transformed form of Hairer & Wanner (Solving ODEs II,
 * IV.7, as OrdinaryDiffEq.jl's RodasTableau): with W = I / (h gamma) - J, J = df/dy(t0, y0)
 * and T = df/dt(t0, y0), stage i solves
 *     W k_i = f(t0 + c_i h, y0 + sum_{j<i} A_ij k_j) + h d_i T + sum_{j<i} (C_ij / h) k_j,
 * and y1 = y0 + sum_i b_i k_i, error estimate sum_i btilde_i k_i. Dense output with n_h rows
 * of H (K_r = sum_i H_ri k_i):
 *     y(t0 + theta h) = (1 - theta) y0 + theta (y1 + (1 - theta)(K_1 + theta (K_2 + theta K_3)))
 * (n_h = 3; n_h = 2 drops K_3); n_h = 0: the cubic Hermite of the explicit methods. */
typedef struct nbo_rosen {
    /* Shampine's Rosenbrock23 (ode23s) is written in its own form instead (solve.c,
     * nbo_ros23_step): gamma = d, the other fields unused */
    bool ros23;
    int stages;
    double gamma;
    const double *A, *C; /* stages x stages, row-major, strictly lower */
    const double *c, *d, *b, *btilde;
    int n_h;
    const double *H; /* n_h x stages */
} nbo_rosen;

/* An ESDIRK method (Diffrax's implicit Runge-Kutta tableaus): stage 0 explicit (f0 =
 * f(t0, y0)), stages i >= 1 implicit with the diagonal gamma,
 *     z_i = y0 + h sum_{j<i} A_ij f_j + h gamma f_i,   f_i = f(t0 + c_i h, z_i),
 * stiffly accurate (y1 = z_{s-1}, c_{s-1} = 1); the error estimate h sum_i e_i f_i; the
 * Newton iteration of stage i starts from y0 + h sum_{j<i} A_ij f_j + h gamma sum_{j<i} P_ij
 * f_j (Diffrax's a_predictor). */
typedef struct nbo_dirk {
    int stages;
    double gamma;
    const double *A; /* stages x stages, row-major, strictly lower (the diagonal is gamma) */
    const double *P; /* the predictor, stages x stages, strictly lower */
    const double *e, *c;
    /* Additive (IMEX, KenCarp) methods: the explicit tableau AE (strictly lower) for the
     * explicit part f_E, the weights b of y1 = y0 + h sum_i b_i (f_E + f_I)_i, and the dense
     * output y0 + h sum_i theta P_i(theta) (f_E + f_I)_i with P_i of dense_degree
     * coefficients H[i], highest power first (Diffrax's KenCarpInterpolation). NULL/0 for
     * the plain (stiffly accurate) ESDIRK methods. */
    const double *AE, *b;
    int dense_degree;
    const double *H;
} nbo_dirk;

typedef struct nbo_tableau {
    const char *name;     /* "tsit5", ... (for messages) */
    int stages;           /* s: stages of the step */
    int order;            /* order of y1 */
    int error_order;      /* Diffrax's error order for the PID controller (0: no estimate) */
    bool fsal;            /* the last stage is f(t0 + h, y1) */
    const double *c;      /* dense_stages nodes (c[0] = 0) */
    const double *a;      /* dense_stages x dense_stages, row-major, strictly lower */
    const double *b;      /* stages weights of y1 */
    const double *e;      /* stages weights of the error estimate (b - bhat), NULL: none */
    int dense_stages;     /* stages [+ the f1 slot] + extra stages (== stages when none) */
    bool extra_uses_f1;   /* stage index `stages` is f(t0 + h, y1) (see above) */
    int dense_degree;     /* degree of the B_i polynomials (0: Hermite cubic) */
    const double *dense;  /* dense_stages x dense_degree coefficients of theta^1.. */
    int dense_order;      /* the interpolant's order (global error O(h^dense_order)) */
    const nbo_rosen *ros; /* a Rosenbrock method (the fields above but name, order,
                             error_order and dense_order unused), or NULL */
    const nbo_dirk *dirk; /* an ESDIRK method (likewise), or NULL */
    double stiff_bound;   /* FSAL explicit methods: the real stability boundary |h lambda| that
                             the stiffness test compares with (0: no test) */
    bool bdf;             /* the variable-order BDF (solve.c; the fields above but name, order
                             and dense_order unused) */
} nbo_tableau;

/* The methods, indexed by nb_ode_solver (nabla/ode.h); NULL for an unknown index. */
const nbo_tableau *nbo_tableau_get(int solver);

#endif /* NABLA_ODE_TABLEAU_H */
