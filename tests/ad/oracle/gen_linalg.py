#!/usr/bin/env python3
"""Reference values for tests/ad/test_ops_decomp.c, from NumPy and SciPy (LAPACK).

Run with the peers' virtualenv (make test never runs it; its output is committed):
    build/peers/bin/python tests/ad/oracle/gen_linalg.py > tests/ad/oracle/linalg_ref.txt

The matrices are made from integer formulas that C computes to the same bits:
    A[i, j] = ((3 i^3 + 5 j^3 + 7 i j^2 + 11 i^2 j + 17 j + 1) mod 251) / 125 - 1
                                         (general, cond 9 / 180 / 1100: pivots)
    S = A A^T / n + I                                       (symmetric positive definite)
    T = tril(A) + (2 + n / 10) I                            (lower triangular)
    b[i] = ((13 i + 5) mod 17) / 8 - 1
For each n the file holds lines "<name> n v0 v1 ..." (%.17g):
    solve       x = solve(A, b)
    solve_t     x = solve(A^T, b)              (lu_solve(lu_factor(A), b, trans=1))
    chol_diag   diag(cholesky(S))
    chol_last   the last row of cholesky(S)
    cho_solve   x = cho_solve(cho_factor(S, lower=True), b)
    tri         x = solve_triangular(T, b, lower=True)
    tri_t       x = solve_triangular(T, b, lower=True, trans=1)
    slogdet     sign, logabsdet of A
    inv_row0    the first row of inv(A)
    lu_perm     the permutation of scipy's lu_factor(A) as row order (row i of PA = row p[i] of A)
    lu_diag     diag(U) of that factorisation
"""
import numpy as np
import scipy
import scipy.linalg as sl
import sys


def mats(n):
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    a = ((3 * i**3 + 5 * j**3 + 7 * i * j * j + 11 * i * i * j + 17 * j + 1) % 251) / 125.0 - 1.0
    s = a @ a.T / n + np.eye(n)
    t = np.tril(a) + (2 + n / 10.0) * np.eye(n)
    b = ((13 * np.arange(n) + 5) % 17) / 8.0 - 1.0
    return a, s, t, b


def perm_of(piv, n):
    p = np.arange(n)
    for k, q in enumerate(piv):
        p[k], p[q] = p[q], p[k]
    return p


def line(name, n, v):
    print(name, n, " ".join("%.17g" % x for x in np.ravel(v)))


print("# numpy %s, scipy %s: tests/ad/oracle/gen_linalg.py" % (np.__version__, scipy.__version__))
for n in (6, 40, 200):
    a, s, t, b = mats(n)
    line("solve", n, np.linalg.solve(a, b))
    line("solve_t", n, np.linalg.solve(a.T, b))
    lc = np.linalg.cholesky(s)
    line("chol_diag", n, np.diag(lc))
    line("chol_last", n, lc[-1])
    line("cho_solve", n, sl.cho_solve((lc, True), b))
    line("tri", n, sl.solve_triangular(t, b, lower=True))
    line("tri_t", n, sl.solve_triangular(t, b, lower=True, trans=1))
    sign, logabs = np.linalg.slogdet(a)
    line("slogdet", n, [sign, logabs])
    line("inv_row0", n, np.linalg.inv(a)[0])
    lu, piv = sl.lu_factor(a)
    line("lu_perm", n, perm_of(piv, n))
    line("lu_diag", n, np.diag(lu))
sys.stdout.flush()
