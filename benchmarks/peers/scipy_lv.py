"""Peer numbers for nabla's ODE benchmarks (bench_ode), measured with SciPy's solve_ivp on the
Lotka-Volterra problem of tests/ode/oracle/lotka_volterra.txt:

  dx/dt = a x - b x y, dy/dt = -c y + d x y, a=1.5, b=1, c=3, d=1, x0=y0=1, t in [0, 10],
  G = x(10) + y(10), gradient w.r.t. (a, b, c, d, x0, y0).

Run with Debian's python3 and python3-scipy (apt-get install python3-scipy), from the
repository root (the reference is read from tests/ode/oracle/lotka_volterra.txt):
    /usr/bin/python3 benchmarks/peers/scipy_lv.py [--repeats N] [--tol T] [name ...]
The names choose the measurements (all of them when there are none): rk45_solve, rk45_grad,
dop853_solve, dop853_grad. N (default 21, or $NB_BENCH_REPEATS) is the number of samples,
each the mean of a burst of calls lasting about 20 ms or more; T (default 1e-8) is rtol = atol.

  <method>_solve  solve_ivp(lv, (0, 10), [1, 1], method=<method>, rtol=T, atol=T): the state
                  at t = 10 (the solve's end point)
  <method>_grad   the same solve of the system augmented with forward sensitivities
                  S = d(x, y)/d(a, b, c, d, x0, y0), S' = J S + F_p, S(0) = [0 | I] (2 + 12
                  states, all in the error norm); dG/dp = S[0] + S[1]

Prints "key value" lines: scipy_version, numpy_version, tol, then per measurement
  row scipy_<name> <median µs> <max relative error vs the reference>
      (solve: of x(10), y(10); grad: of the six gradient entries)
  scipy_<name>_nfev <right-hand-side evaluations> and scipy_<name>_values <the numbers>
The right-hand sides are plain Python on floats (the fastest form for a 2-state system).
"""
import os
import statistics
import sys
import time

import numpy as np
import scipy
from scipy.integrate import solve_ivp

A, B, C, D = 1.5, 1.0, 3.0, 1.0
X0, Y0 = 1.0, 1.0
T0, T1 = 0.0, 10.0
NAMES = ["a", "b", "c", "d", "x0", "y0"]
REF = "tests/ode/oracle/lotka_volterra.txt"


def lv(t, u, a, b, c, d):
    x, y = u
    return [a * x - b * x * y, -c * y + d * x * y]


def lv_sens(t, z, a, b, c, d):
    x, y = z[0], z[1]
    s0, s1 = z[2:8], z[8:14]          # rows of S (2x6)
    j00, j01, j10, j11 = a - b * y, -b * x, d * y, -c + d * x
    ds0 = j00 * s0 + j01 * s1
    ds1 = j10 * s0 + j11 * s1
    ds0[0] += x                        # F_p = [[x, -x y, 0, 0, 0, 0], [0, 0, -y, x y, 0, 0]]
    ds0[1] -= x * y
    ds1[2] -= y
    ds1[3] += x * y
    out = np.empty(14)
    out[0] = a * x - b * x * y
    out[1] = -c * y + d * x * y
    out[2:8] = ds0
    out[8:14] = ds1
    return out


Z0 = np.concatenate([[X0, Y0], np.hstack([np.zeros((2, 4)), np.eye(2)]).ravel()])


def solve(method, tol):
    sol = solve_ivp(lv, (T0, T1), [X0, Y0], method=method, rtol=tol, atol=tol,
                    args=(A, B, C, D))
    assert sol.success, sol.message
    return sol, sol.y[:, -1]


def grad(method, tol):
    sol = solve_ivp(lv_sens, (T0, T1), Z0, method=method, rtol=tol, atol=tol,
                    args=(A, B, C, D))
    assert sol.success, sol.message
    S = sol.y[2:, -1].reshape(2, 6)
    return sol, S[0] + S[1]


def read_reference(path):
    state, g = None, {}
    with open(path) as fh:
        for line in fh:
            w = line.split()
            if not w or w[0].startswith("#"):
                continue
            if w[0] == "state" and state is None and float(w[1]) == T1:
                state = [float(w[2]), float(w[3])]
            elif w[0] == "grad":
                g[w[1]] = float(w[2])
    return state, [g[n] for n in NAMES]


def relerr(u, ref):
    return max(abs(a - b) / abs(b) for a, b in zip(u, ref))


def med_us(fn, repeats):
    fn()
    t0 = time.perf_counter()
    fn()
    once = time.perf_counter() - t0
    inner = max(1, int(0.02 / max(once, 1e-9)))
    s = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        s.append((time.perf_counter() - t0) / inner * 1e6)
    return statistics.median(s)


def main(argv):
    repeats = int(os.environ.get("NB_BENCH_REPEATS", "21"))
    tol = 1e-8
    names = []
    i = 0
    while i < len(argv):
        if argv[i] == "--repeats":
            repeats = int(argv[i + 1])
            i += 2
        elif argv[i] == "--tol":
            tol = float(argv[i + 1])
            i += 2
        else:
            names.append(argv[i])
            i += 1
    measurements = {"rk45_solve": ("RK45", False), "rk45_grad": ("RK45", True),
                    "dop853_solve": ("DOP853", False), "dop853_grad": ("DOP853", True)}
    for n in names:
        if n not in measurements:
            sys.exit("scipy_lv.py: unknown measurement %r (known: %s)" % (n, " ".join(measurements)))
    ref_state, ref_grad = read_reference(REF)
    print("scipy_version", scipy.__version__)
    print("numpy_version", np.__version__)
    print("tol", repr(tol))
    sys.stdout.flush()
    for name in names or list(measurements):
        method, is_grad = measurements[name]
        fn = (lambda: grad(method, tol)) if is_grad else (lambda: solve(method, tol))
        sol, vals = fn()
        err = relerr(vals, ref_grad if is_grad else ref_state)
        print("row scipy_%s %.3f %.3g" % (name, med_us(fn, repeats), err))
        print("scipy_%s_nfev %d" % (name, sol.nfev))
        print("scipy_%s_values %s" % (name, " ".join(repr(float(v)) for v in vals)))
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
