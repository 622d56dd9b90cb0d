"""Oracle for nabla's ODE solver tests (tests/ode, issue 8): SciPy DOP853 solution of
Lotka-Volterra and the gradient of G = x(10) + y(10) by forward sensitivity, cross-checked
against central finite differences of G through solve_ivp.

The SciPy numbers are also checked against mpmath's arbitrary-precision Taylor solver
(mpmath.odefun, 30 digits), for the state and (via the same sensitivity system) the gradient.

Run with Debian's python3, python3-scipy and python3-mpmath (apt-get install python3-scipy):
    /usr/bin/python3 tests/ode/oracle/gen_scipy_lotka_volterra.py > tests/ode/oracle/lotka_volterra.txt
See README.md beside this script for the problem and the line formats.
"""
import platform
import sys

import mpmath
import numpy as np
import scipy
from scipy.integrate import solve_ivp

A, B, C, D = 1.5, 1.0, 3.0, 1.0
X0, Y0 = 1.0, 1.0
T0, T1 = 0.0, 10.0
RTOL = ATOL = 1e-13  # SciPy's floor is rtol >= 100*eps (2.2e-14); 1e-13 is the tightest round value
TS = [0.5 * k for k in range(1, 21)]  # 0.5, 1, ..., 10
NAMES = ["a", "b", "c", "d", "x0", "y0"]
P = [A, B, C, D, X0, Y0]


def lv(t, u, a, b, c, d):
    x, y = u
    return [a * x - b * x * y, -c * y + d * x * y]


def solve(p, t1=T1, dense=False):
    a, b, c, d, x0, y0 = p
    sol = solve_ivp(lv, (T0, t1), [x0, y0], method="DOP853", rtol=RTOL, atol=ATOL,
                    args=(a, b, c, d), dense_output=dense)
    assert sol.success, sol.message
    return sol


def lv_sens(t, z, a, b, c, d):
    """State (x, y) followed by the 2x6 sensitivity S = du/dp (row-major): S' = J S + F_p."""
    x, y = z[0], z[1]
    S = z[2:].reshape(2, 6)
    J = np.array([[a - b * y, -b * x],
                  [d * y, -c + d * x]])
    Fp = np.array([[x, -x * y, 0.0, 0.0, 0.0, 0.0],
                   [0.0, 0.0, -y, x * y, 0.0, 0.0]])
    dS = J @ S + Fp
    return np.concatenate([[a * x - b * x * y, -c * y + d * x * y], dS.ravel()])


def mp_reference():
    """State at TS and the gradient by mpmath's Taylor-series solver at 30 digits."""
    mpmath.mp.dps = 30
    a, b, c, d = (mpmath.mpf(v) for v in (A, B, C, D))

    def f(t, z):
        x, y = z[0], z[1]
        S = [z[2:8], z[8:14]]
        J = [[a - b * y, -b * x], [d * y, -c + d * x]]
        Fp = [[x, -x * y, 0, 0, 0, 0], [0, 0, -y, x * y, 0, 0]]
        dS = [[J[r][0] * S[0][k] + J[r][1] * S[1][k] + Fp[r][k] for k in range(6)]
              for r in range(2)]
        return [a * x - b * x * y, -c * y + d * x * y] + dS[0] + dS[1]

    z0 = [mpmath.mpf(X0), mpmath.mpf(Y0)] + [0, 0, 0, 0, 1, 0] + [0, 0, 0, 0, 0, 1]
    sol = mpmath.odefun(f, T0, [mpmath.mpf(v) for v in z0])
    states = {t: [float(v) for v in sol(t)[:2]] for t in TS}
    z = sol(T1)
    grad = [float(z[2 + k] + z[8 + k]) for k in range(6)]
    return states, grad


def G(p):
    u = solve(p).y[:, -1]
    return u[0] + u[1]


def main():
    out = []
    # State: dense output at TS, and t = 10 from the solve's end point.
    sol = solve(P, dense=True)
    end = sol.y[:, -1]
    dense = {t: sol.sol(t) for t in TS}
    # Cross-check of the dense output: a separate solve ending exactly at each t.
    dense_vs_endpoint = 0.0
    for t in TS:
        u = solve(P, t1=t).y[:, -1]
        dense_vs_endpoint = max(dense_vs_endpoint,
                                float(np.max(np.abs(dense[t] - u) / np.abs(u))))
    # Tolerance check: the same solve at rtol = atol = 1e-12.
    u12 = solve_ivp(lv, (T0, T1), [X0, Y0], method="DOP853", rtol=1e-12, atol=1e-12,
                    args=(A, B, C, D)).y[:, -1]
    tol_diff = float(np.max(np.abs(u12 - end) / np.abs(end)))

    # Forward sensitivity.
    z0 = np.concatenate([[X0, Y0], np.hstack([np.zeros((2, 4)), np.eye(2)]).ravel()])
    ss = solve_ivp(lv_sens, (T0, T1), z0, method="DOP853", rtol=RTOL, atol=ATOL,
                   args=(A, B, C, D))
    assert ss.success, ss.message
    zs = ss.y[:, -1]
    S = zs[2:].reshape(2, 6)
    grad = S[0] + S[1]
    sens_state_diff = float(np.max(np.abs(zs[:2] - end) / np.abs(end)))

    # Central finite differences of G through solve_ivp, h = 1e-4 * max(1, |p_i|), and a
    # Richardson extrapolation of steps h and 2h (fourth order) for a second opinion.
    fd, fd_rich = [], []
    for i in range(6):
        h = 1e-5 * max(1.0, abs(P[i]))
        def g_at(delta):
            q = list(P)
            q[i] += delta
            return G(q)
        d1 = (g_at(h) - g_at(-h)) / (2 * h)
        d2 = (g_at(2 * h) - g_at(-2 * h)) / (4 * h)
        fd.append(d1)
        fd_rich.append((4 * d1 - d2) / 3)
    rel = lambda u, v: abs(u - v) / max(abs(u), abs(v))
    mp_states, mp_grad = mp_reference()
    mp_state_rel = max(rel(u, v) for t in TS for u, v in zip(dense[t], mp_states[t]))
    mp_end_rel = max(rel(u, v) for u, v in zip(end, mp_states[T1]))
    mp_grad_rel = max(rel(u, v) for u, v in zip(grad, mp_grad))
    fd_rel = max(rel(g, f) for g, f in zip(grad, fd))
    rich_rel = max(rel(g, f) for g, f in zip(grad, fd_rich))

    out.append("# SciPy oracle for tests/ode (issue 8). Made by tests/ode/oracle/gen_scipy_lotka_volterra.py:")
    out.append("#   /usr/bin/python3 tests/ode/oracle/gen_scipy_lotka_volterra.py > tests/ode/oracle/lotka_volterra.txt")
    out.append(f"# scipy {scipy.__version__} (Debian python3-scipy) numpy {np.__version__} "
               f"mpmath {mpmath.__version__} python {platform.python_version()}, float64")
    out.append(f"# Problem: dx/dt = a x - b x y, dy/dt = -c y + d x y; a={A!r} b={B!r} c={C!r} d={D!r}, "
               f"x0={X0!r} y0={Y0!r}, t in [{T0!r}, {T1!r}]")
    out.append(f"# Solver: scipy.integrate.solve_ivp(method='DOP853', rtol={RTOL!r}, atol={ATOL!r}, "
               "dense_output=True)")
    out.append("# Lines: 'state <t> <x> <y>': t = 10 first (the solve's end point), then t = 0.5, 1, ..., 10 "
               "from the dense output;")
    out.append("#   'grad <name> <dG/dname>' for G = x(10) + y(10), name in a b c d x0 y0, by forward "
               "sensitivity:")
    out.append("#   (x, y) augmented with S = d(x,y)/d(a,b,c,d,x0,y0) (2x6), S' = J S + F_p, "
               "S(0) = [0 | I], same solver and tolerances.")
    out.append("# Floats are Python repr (round-trip exactly with strtod).")
    out.append("# Checks (relative differences, max over components):")
    out.append(f"#   dense output vs separate solves ending at each t: {dense_vs_endpoint:.3g}")
    out.append(f"#   state at t=10 vs rtol=atol=1e-12 solve: {tol_diff:.3g}")
    out.append(f"#   state at t=10 from the sensitivity solve vs the plain solve: {sens_state_diff:.3g}")
    out.append(f"#   grad vs central differences (h = 1e-5*max(1,|p|)): {fd_rel:.3g}")
    out.append(f"#   grad vs Richardson-extrapolated central differences (h, 2h): {rich_rel:.3g}")
    out.append(f"#   state (dense, t = 0.5..10) vs mpmath.odefun (Taylor, 30 digits): {mp_state_rel:.3g}")
    out.append(f"#   state at t=10 (end point) vs mpmath.odefun: {mp_end_rel:.3g}")
    out.append(f"#   grad vs mpmath.odefun forward sensitivity (30 digits): {mp_grad_rel:.3g}")
    out.append(f"state {T1!r} {end[0]!r} {end[1]!r}")
    for t in TS:
        out.append(f"state {t!r} {dense[t][0]!r} {dense[t][1]!r}")
    for name, g in zip(NAMES, grad):
        out.append(f"grad {name} {g!r}")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
