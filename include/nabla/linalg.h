/*
 * nabla/linalg.h -- linear algebra inside traces, with derivatives: LU, Cholesky,
 * triangular and general solves, inverse, log-determinant (as jax.numpy.linalg and
 * jax.scipy.linalg).
 *
 * Every function builds IR like the ops of nabla/trace.h: it takes vars of one trace and
 * returns a var (poison after an error, with a message naming the function, the shapes and
 * the fix). Matrices are f32 or f64 stacks [..., n, n]: leading dims are a batch, each
 * matrix handled on its own. A right-hand side b is a vector per matrix, [..., n] (when b
 * is rank 1 or has one dim fewer than the matrix, as JAX decides), or k columns,
 * [..., n, k]; the matrix's batch dims broadcast against b's (numpy-style), and a matrix
 * shared by a batch of right-hand sides is factored once.
 *
 * Everything differentiates in both modes (nb_grad, nb_vjp, nb_jvp) by the adjoint
 * formulas -- a solve's reverse pass is one more solve with the transposed factors it
 * already has, never the factorisation's loops unrolled (src/ad/op_decomp.c lists the
 * rules and their sources). Results are bit-identical for any thread count.
 *
 * Failure is a value the caller can test, never a crash or a silent wrong number:
 *   - a singular matrix (a zero pivot) or one with a non-finite entry makes every element
 *     of its nb_solve / nb_lu_solve / nb_inv result NaN, its nb_slogdet (0, -inf) (NaN for
 *     non-finite input), and nb_lu_singular true;
 *   - a matrix that is not (numerically) positive definite makes its whole nb_cholesky
 *     factor NaN (test one entry: nb_cholesky_failed);
 *   - a zero on the diagonal makes nb_triangular_solve's and nb_cholesky_solve's result NaN;
 *   - factors not made by nb_lu_factor whose permutation row is not a permutation of
 *     0..n-1 make nb_lu_solve's result and nb_slogdet NaN (never an index out of bounds).
 * Other batch elements are unaffected.
 */
#ifndef NABLA_LINALG_H
#define NABLA_LINALG_H

#include "trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x with a x = b (LU with partial pivoting; numpy.linalg.solve). */
NB_API nb_var *nb_solve(nb_var *a, nb_var *b);

/* The LU factorisation with partial pivoting of a [..., n, n], packed as [..., n+1, n]:
 * rows 0..n-1 hold L (unit lower, strictly below the diagonal) and U (upper) of PA = LU,
 * row n the permutation p as values of a's dtype (row i of PA is row p[i] of a) -- one
 * array, so it passes through loops, jit and pytrees as a single leaf. Factor once, solve
 * many times with nb_lu_solve (scipy.linalg.lu_factor / lu_solve). */
NB_API nb_var *nb_lu_factor(nb_var *a);
/* x with a x = b, or a^T x = b when transpose, from nb_lu_factor(a). */
NB_API nb_var *nb_lu_solve(nb_var *lu, nb_var *b, bool transpose);
/* bool [...]: true where the factored matrix is singular (a zero pivot) or was not finite
 * (a non-finite pivot) -- where nb_lu_solve returns NaN. */
NB_API nb_var *nb_lu_singular(nb_var *lu);

/* The lower Cholesky factor L of (a + a^T) / 2 (L L^T = a for a symmetric positive
 * definite a; zeros above the diagonal). As JAX, the input is symmetrised, so the
 * derivative with respect to a is symmetric. All NaN where not positive definite. */
NB_API nb_var *nb_cholesky(nb_var *a);
/* bool [...]: true where nb_cholesky failed (its factor is NaN). */
NB_API nb_var *nb_cholesky_failed(nb_var *l);
/* x with (l l^T) x = b, reading l's lower triangle (scipy.linalg.cho_solve). */
NB_API nb_var *nb_cholesky_solve(nb_var *l, nb_var *b);

/* x with op(t) x = b for the lower (or upper) triangle of t, op the identity or the
 * transpose; unit_diagonal takes the diagonal as ones without reading it
 * (scipy.linalg.solve_triangular). The other triangle is never read. */
NB_API nb_var *nb_triangular_solve(nb_var *t, nb_var *b, bool lower, bool transpose,
                                   bool unit_diagonal);

/* log|det a| [...]; *sign (may be NULL) receives sign(det a): -1, 0 or 1
 * (numpy.linalg.slogdet). Differentiable in log|det a|: d = tr(a^{-1} da). */
NB_API nb_var *nb_slogdet(nb_var *a, nb_var **sign);
/* det a [...] = sign * exp(log|det a|). */
NB_API nb_var *nb_det(nb_var *a);
/* a^{-1} [..., n, n] (a solve against the identity). Prefer nb_solve when the inverse is
 * only multiplied by something. */
NB_API nb_var *nb_inv(nb_var *a);
/* The diagonal [..., n] of x [..., n, n]. */
NB_API nb_var *nb_diagonal(nb_var *x);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_LINALG_H */
