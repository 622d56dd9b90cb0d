"""Reference data for nabla's terminal-event tests on stiff problems: the time t* at which
an event condition first fires, the state y(t*) there, and the derivatives of t* with
respect to the parameters p and the initial state y0, by SciPy's Radau IIA with forward
sensitivities. tests/ode/stiff_problems.h defines the same two problems as nabla terms
(same y0, p and order of operations as gen_stiff.py, whose functions these copy).

How it was run (from the repository root; the peers' virtualenv: CPython 3.11.7, numpy 2.4.6,
scipy 1.17.1, float64; nothing else is needed):

    build/peers/bin/python tests/ode/oracle/gen_events.py

It writes tests/ode/oracle/events_ref.txt (beside this script; another path can be given as
the only argument) and prints the finite-difference cross-check of the derivatives to
stdout (it is not in the data file; run times go to stderr). It takes about 45 s on one core
and writes the same bytes on every run.

Problems (t0 = 0; the same equations, constants and sources as gen_stiff.py's docstring):
  robertson  Robertson's chemical reaction (H&W II sec. IV.1, IVPtestset "rober"):
               y1' = -k1 y1 + k3 y2 y3, y2' = k1 y1 - k3 y2 y3 - k2 y2^2, y3' = k2 y2^2,
               p = (k1, k2, k3) = (0.04, 3e7, 1e4), y0 = (1, 0, 0), t1 = 1e5.
             Event: c(t, y) = y1 - 0.5, falling (from > 0 to <= 0); fires at t* ~ 268.3.
  vdp        Van der Pol, unscaled, mu = 1000 (MATLAB's vdp1000): y1' = y2,
               y2' = mu ((1 - y1^2) y2) - y1, p = (mu,), y0 = (2, 0), t1 = 3000.
             Event: c(t, y) = y1, falling: the first downward zero crossing of y1, in the
             middle of the first relaxation jump (t* ~ 807.08, y2(t*) ~ -667).
  (HIRES and the other problems of stiff_ref.txt have no event here.)

Method:
  - theta = (p, y0) collects every input; S = dy/dtheta (n x (np + n)) solves
    S' = J S + [df/dp | 0], S(0) = [0 | I], integrated together with y by
    solve_ivp(method="Radau", rtol=1e-12) with the event as a solve_ivp event
    (terminal=True, direction=-1). The augmented state is (y, S row-major); its Jacobian is
    the block lower triangular [[J, 0], [d(J S + df/dp)/dy, J kron I]] with J = df/dy
    analytic and the lower-left block by complex step (exact to rounding: f is polynomial),
    as in gen_stiff.py. atol is ATOL[problem] for y, ATOL / |p_j| for the column d/dp_j of
    S and ATOL / max(|y0_j|, 1) for the column d/dy0_j (CVODES' pbar scaling).
  - solve_ivp locates the event as the root of the Radau dense output (brentq, xtol 4 eps),
    which for robertson is off by up to ~1e-10 in t (state-only solves: 4e-11 at rtol
    1e-12, 6e-10 at 1e-11; the check lines give those of the sensitivity runs): y1 falls
    slowly there (y1' ~ -5e-4), so the collocation polynomial's small error in y1 moves the
    root visibly. So t* is refined by Newton's method on step end points: from the last
    step point before the event, solve (same tolerances, no events) to t_k, take
    t_{k+1} = t_k - c(y(t_k)) / (dc/dy . f(t_k, y(t_k))), until the step is below 2 ulp of
    t or c is within 2 ulp of 0 (one or two iterations). t_event, y_event and S are those of the last such solve, so
    the y_event's event component is 0 (robertson: 0.5) only to within the rounding of t*
    (vdp: |y1| up to ~1e-10, as y1' ~ -667 and one ulp of 807 is 1.1e-13).
  - The implicit function theorem, c(t*(theta), y(t*(theta); theta)) = 0 with c depending
    on neither t nor theta directly: dt*/dtheta = -(dc/dy . S(t*)) / (dc/dy . f(t*, y*)).
  - Checks in the data file's header (comment lines): the analytic J and df/dp against
    complex-step derivatives of f at y0 and at y(t*) (the script stops if they differ by
    > 1e-12); the event run's work; the dense-output event time against the refined t*; the
    whole computation repeated at rtol 1e-11 and 1e-13 (max relative difference of t*,
    y_event and each derivative from the rtol 1e-12 reference); t* from a state-only solve
    (no sensitivities, other steps) at rtol 1e-12; t* with a larger atol; and a summary
    line "estimated accuracy" (the largest of those differences, without the larger atol's).
    They put t* within ~3e-14 relative, the rest of y(t*) within ~1e-14 (robertson) and
    ~5e-11 (vdp's y2 ~ -667, on the steep jump), dt*/dtheta within ~1e-14 (robertson) and
    ~2e-12 (vdp).
  - Checks on stdout only: each derivative against a central difference of t* from
    state-only event solves (Radau rtol 1e-12 with the same refinement),
    h_j = 1e-6 |theta_j|, or for theta_j = 0 the step that moves t* by the same relative
    amount, h_j = 1e-6 |t* / (dt*/dtheta_j)|. They agree to ~1e-8 relative or better (the
    central difference's own error: the solves' noise in t*, ~1e-14 relative, over the 2e-6
    relative change of t*).

Output (events_ref.txt): one record per line, fields separated by one space; lines starting
with '#' are comments. Numbers are printf "%.17g" (round-trip through strtod); the
component index is an integer. The same "<problem> <field> v0 v1 ..." records as
stiff_ref.txt (the number of values is implied by the line):
  <problem> t1 <t1>                          end of the span (not reached: the event fires)
  <problem> y0 <y0[0]> ... <y0[n-1]>
  <problem> p <p[0]> ... <p[np-1]>
  <problem> event <i> <level> <direction>    c(t, y) = y[i] - level (i from 0), direction -1
                                             (fires when c goes from > 0 to <= 0)
  <problem> rtol <rtol>                      of the reference solve (1e-12)
  <problem> atol <atol>                      of the reference solve, on y
  <problem> t_event <t*>
  <problem> y_event <y(t*)[0]> ... <y(t*)[n-1]>
  <problem> dt_dp <dt*/dp[0]> ... <dt*/dp[np-1]>
  <problem> dt_dy0 <dt*/dy0[0]> ... <dt*/dy0[n-1]>
Problems appear in the order robertson, vdp.
"""
import os
import platform
import sys
import time

import numpy as np
import scipy
from scipy.integrate import solve_ivp

RTOL_REF = 1e-12
RTOL_CHECKS = (1e-11, 1e-13)
FD_REL_STEP = 1e-6
NEWTON_MAX = 6

# atol on y. robertson: y2 ~ 4e-6 at t*; the brief's 1e-14 leaves y2 under absolute
# control only and moves t* by ~1e-11 between rtols, 1e-20 (gen_stiff.py's sensitivity
# atol) keeps it relative. vdp: 1e-16 (gen_stiff.py's reference atol); the event time sits
# right after the slow phase, whose timing 1e-12 controls to only ~5e-12 relative.
ATOL = {"robertson": 1e-20, "vdp": 1e-16}
# the larger atol of the "atol check" line
ATOL_LOOSE = {"robertson": 1e-14, "vdp": 1e-12}


# ---- problems (copied from gen_stiff.py; they work on complex arrays too) -------------

def _vec(items):
    return np.array(items, dtype=np.result_type(*[np.asarray(v) for v in items], float))


def robertson_f(t, y, k):
    a = k[0] * y[0]
    b = k[2] * y[1] * y[2]
    c = k[1] * y[1] * y[1]
    return _vec([-a + b, a - b - c, c])


def robertson_jac(t, y, k):
    dt = np.result_type(y, k, float)
    return np.array([[-k[0], k[2] * y[2], k[2] * y[1]],
                     [k[0], -k[2] * y[2] - 2 * k[1] * y[1], -k[2] * y[1]],
                     [0 * k[0], 2 * k[1] * y[1], 0 * k[0]]], dtype=dt)


def robertson_fp(t, y, k):
    dt = np.result_type(y, k, float)
    z = 0 * y[0]
    return np.array([[-y[0], z, y[1] * y[2]],
                     [y[0], -y[1] * y[1], -y[1] * y[2]],
                     [z, y[1] * y[1], z]], dtype=dt)


def vdp_f(t, y, p):
    mu = p[0]
    return _vec([y[1], mu * ((1 - y[0] * y[0]) * y[1]) - y[0]])


def vdp_jac(t, y, p):
    mu = p[0]
    dt = np.result_type(y, p, float)
    return np.array([[0 * mu, 1 + 0 * mu],
                     [-2 * mu * y[0] * y[1] - 1, mu * (1 - y[0] * y[0])]], dtype=dt)


def vdp_fp(t, y, p):
    return _vec([0 * y[0], (1 - y[0] * y[0]) * y[1]]).reshape(2, 1)


class Problem:
    def __init__(self, name, f, jac, fp, y0, p, t1, ev_index, ev_level):
        self.name, self.f, self.jac, self.fp = name, f, jac, fp
        self.y0 = np.array(y0, dtype=float)
        self.p = np.array(p, dtype=float)
        self.t1 = float(t1)
        self.ev_index, self.ev_level, self.ev_direction = ev_index, float(ev_level), -1
        self.n, self.np = self.y0.size, self.p.size
        self.m = self.np + self.n  # columns of S: d/dp, then d/dy0

    def theta(self):
        return np.concatenate([self.p, self.y0])

    def split(self, theta):
        return theta[:self.np], theta[self.np:]


PROBLEMS = [
    Problem("robertson", robertson_f, robertson_jac, robertson_fp, [1.0, 0.0, 0.0],
            [0.04, 3e7, 1e4], 1e5, 0, 0.5),
    Problem("vdp", vdp_f, vdp_jac, vdp_fp, [2.0, 0.0], [1000.0], 3000.0, 0, 0.0),
]


# ---- helpers --------------------------------------------------------------------------

def fmt(v):
    return "%.17g" % v


def rec(out, prob, field, values):
    out.append(" ".join([prob.name, field] + [fmt(v) for v in np.atleast_1d(values)]))


def rel(a, b):
    """max_i |a_i - b_i| / |b_i|"""
    a, b = np.atleast_1d(np.asarray(a, float)), np.atleast_1d(np.asarray(b, float))
    return float(np.max(np.abs(a - b) / np.abs(b)))


def complex_step_check(prob, y):
    """Max relative difference of the analytic J and df/dp from complex-step derivatives."""
    h = 1e-30
    J = prob.jac(0.0, y, prob.p)
    Fp = prob.fp(0.0, y, prob.p)
    Jc = np.empty_like(J)
    for k in range(prob.n):
        yc = y.astype(complex)
        yc[k] += 1j * h
        Jc[:, k] = prob.f(0.0, yc, prob.p).imag / h
    Fc = np.empty_like(Fp)
    for j in range(prob.np):
        pc = prob.p.astype(complex)
        pc[j] += 1j * h
        Fc[:, j] = prob.f(0.0, y, pc).imag / h
    r = lambda a, b: float(np.max(np.where(b == 0, np.abs(a), np.abs(a - b) / np.where(b == 0, 1.0, np.abs(b)))))
    return r(J, Jc), r(Fp, Fc)


# The two systems a solve can integrate: the state alone (sens=False) or the state with S.

def sens_rhs(t, z, prob, p):
    n, m = prob.n, prob.m
    y, S = z[:n], z[n:].reshape(n, m)
    dS = prob.jac(t, y, p) @ S
    dS[:, :prob.np] += prob.fp(t, y, p)
    return np.concatenate([prob.f(t, y, p), dS.ravel()])


def sens_jac(t, z, prob, p):
    n, m = prob.n, prob.m
    y, S = z[:n], z[n:].reshape(n, m)
    J = prob.jac(t, y, p)
    A = np.zeros((n + n * m, n + n * m))
    A[:n, :n] = J
    A[n:, n:] = np.kron(J, np.eye(m))
    h = 1e-30
    for k in range(n):  # d(J S + [df/dp | 0])/dy_k by complex step (f is polynomial in y)
        yc = y.astype(complex)
        yc[k] += 1j * h
        B = prob.jac(t, yc, p) @ S
        B[:, :prob.np] += prob.fp(t, yc, p)
        A[n:, k] = (B.imag / h).ravel()
    return A


class System:
    def __init__(self, prob, theta, sens, rtol, atol):
        self.prob, self.sens, self.rtol = prob, sens, rtol
        self.p, y0 = prob.split(np.asarray(theta, float))
        n, m = prob.n, prob.m
        if sens:
            self.fun, self.jac = sens_rhs, sens_jac
            self.z0 = np.concatenate([y0, np.hstack([np.zeros((n, prob.np)), np.eye(n)]).ravel()])
            scale = np.maximum(np.abs(prob.theta()), 1.0)
            scale[:prob.np] = np.abs(prob.p)
            self.atol = np.concatenate([np.full(n, atol), np.tile(atol / scale, n)])
        else:
            self.fun = lambda t, y, prob, p: prob.f(t, y, p)
            self.jac = lambda t, y, prob, p: prob.jac(t, y, p)
            self.z0 = y0
            self.atol = atol

    def solve(self, t0, z0, t1, events=None):
        return solve_ivp(self.fun, (t0, t1), z0, method="Radau", rtol=self.rtol, atol=self.atol,
                         args=(self.prob, self.p), jac=self.jac, events=events)


def find_event(prob, theta, sens, rtol, atol):
    """Event time and state at it: solve_ivp's event, then Newton on step end points."""
    sysm = System(prob, theta, sens, rtol, atol)
    i, lev = prob.ev_index, prob.ev_level

    def cond(t, z, prob_, p):
        return z[i] - lev
    cond.terminal, cond.direction = True, prob.ev_direction

    run = sysm.solve(0.0, sysm.z0, prob.t1, events=cond)
    assert run.status == 1 and run.t_events[0].size == 1, (prob.name, run.message)
    t_dense = float(run.t_events[0][0])
    ta, za = float(run.t[-2]), run.y[:, -2]  # the last step point before the event
    t = t_dense
    for it in range(NEWTON_MAX):
        z = sysm.solve(ta, za, t).y[:, -1]
        fi = prob.f(t, z[:prob.n], sysm.p)[i]
        dt = -(z[i] - lev) / fi
        # converged: a step below 2 ulp of t, or c within 2 ulp of zero (robertson's slow
        # y1 resolves t* only to ~4 ulp of t: one ulp of y1 = 0.5 is ~2e-13 in t)
        if abs(dt) <= 2 * np.spacing(t) or abs(z[i] - lev) <= 2 * np.spacing(max(abs(z[i]), abs(lev))):
            break
        t += dt
    else:
        raise RuntimeError(f"{prob.name}: Newton refinement of t* did not converge")
    res = {"t": t, "y": z[:prob.n], "t_dense": t_dense, "run": run, "newton": it + 1}
    if sens:
        S = z[prob.n:].reshape(prob.n, prob.m)
        res["dt"] = -S[i, :] / fi  # dc/dy = e_i
    return res


# ---- main -----------------------------------------------------------------------------

def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "events_ref.txt")
    t_start = time.time()
    out = []
    out.append("# Terminal events in stiff ODEs: reference data for nabla's tests (tests/ode). Made by:")
    out.append("#   build/peers/bin/python tests/ode/oracle/gen_events.py   (writes tests/ode/oracle/events_ref.txt)")
    out.append(f"# python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}, "
               "float64. Problem definitions, sources, method and line formats: the script's docstring.")
    out.append(f"# Reference: solve_ivp(method='Radau', rtol={RTOL_REF:g}, atol=atol on y and atol/|theta_j| on "
               "S = dy/d(p, y0), jac=analytic) with a terminal event, t* refined by Newton on step end points;")
    out.append("# dt*/dtheta = -S[i, :] / f_i(t*, y*) (implicit function theorem, c = y[i] - level). "
               "Check lines give max relative differences from the reference.")
    out.append("# Records: <problem> t1|y0|p|event|rtol|atol|t_event|y_event|dt_dp|dt_dy0 ...")
    report = []
    for prob in PROBLEMS:
        t0 = time.time()
        theta = prob.theta()
        a = ATOL[prob.name]
        out.append(f"# ---- {prob.name}: n = {prob.n}, np = {prob.np}")
        rec(out, prob, "t1", prob.t1)
        rec(out, prob, "y0", prob.y0)
        rec(out, prob, "p", prob.p)
        out.append(f"{prob.name} event {prob.ev_index} {fmt(prob.ev_level)} {prob.ev_direction}")
        rec(out, prob, "rtol", RTOL_REF)
        rec(out, prob, "atol", a)

        ref = find_event(prob, theta, True, RTOL_REF, a)
        dt = ref["dt"]
        rec(out, prob, "t_event", ref["t"])
        rec(out, prob, "y_event", ref["y"])
        rec(out, prob, "dt_dp", dt[:prob.np])
        rec(out, prob, "dt_dy0", dt[prob.np:])

        dj0, dp0 = complex_step_check(prob, prob.y0)
        dj1, dp1 = complex_step_check(prob, ref["y"])
        assert max(dj0, dp0, dj1, dp1) < 1e-12, (prob.name, dj0, dp0, dj1, dp1)
        out.append(f"# {prob.name} jacobian check (analytic vs complex step; at y0, at y(t*)): "
                   f"df/dy {dj0:.2g}, {dj1:.2g}; df/dp {dp0:.2g}, {dp1:.2g}")
        run = ref["run"]
        out.append(f"# {prob.name} reference event run: {run.t.size - 2} steps, nfev {run.nfev}, "
                   f"njev {run.njev}, nlu {run.nlu}; Newton solves {ref['newton']}; "
                   f"dense-output event time - t* = {ref['t_dense'] - ref['t']:.2g} "
                   f"(relative {rel(ref['t_dense'], ref['t']):.2g})")
        other = np.arange(prob.n) != prob.ev_index
        acc = {"t_event": 0.0, "y_event": 0.0, "dt": 0.0}
        for rtol in RTOL_CHECKS:
            c = find_event(prob, theta, True, rtol, a)
            acc["t_event"] = max(acc["t_event"], rel(c["t"], ref["t"]))
            acc["y_event"] = max(acc["y_event"], rel(c["y"][other], ref["y"][other]))
            acc["dt"] = max(acc["dt"], rel(c["dt"], dt))
            out.append(f"# {prob.name} check rtol {rtol:g}: t_event {rel(c['t'], ref['t']):.2g}; "
                       f"y_event {rel(c['y'][other], ref['y'][other]):.2g} (all but y[{prob.ev_index}]); dt_dp {rel(c['dt'][:prob.np], dt[:prob.np]):.2g}; "
                       f"dt_dy0 {rel(c['dt'][prob.np:], dt[prob.np:]):.2g}; "
                       f"dense-output t_event {rel(c['t_dense'], ref['t']):.2g}")
        st = find_event(prob, theta, False, RTOL_REF, a)
        lo = find_event(prob, theta, False, RTOL_REF, ATOL_LOOSE[prob.name])
        out.append(f"# {prob.name} check t_event: state-only solve (rtol {RTOL_REF:g}, atol {a:g}) "
                   f"{rel(st['t'], ref['t']):.2g}; state-only, atol {ATOL_LOOSE[prob.name]:g} "
                   f"{rel(lo['t'], ref['t']):.2g}")
        acc["t_event"] = max(acc["t_event"], rel(st["t"], ref["t"]))
        out.append(f"# {prob.name} estimated accuracy (largest relative difference in the rtol and "
                   f"state-only checks): t_event {acc['t_event']:.2g}; y_event {acc['y_event']:.2g} "
                   f"(all but y[{prob.ev_index}], whose distance from the level, "
                   f"{abs(ref['y'][prob.ev_index] - prob.ev_level):.2g}, is rounding: one ulp of t* "
                   f"moves it by {abs(prob.f(0.0, ref['y'], prob.p)[prob.ev_index]) * np.spacing(ref['t']):.2g}); "
                   f"dt_dp, dt_dy0 {acc['dt']:.2g}")

        # central differences of t* (stdout only)
        names = [f"p[{j}]" for j in range(prob.np)] + [f"y0[{j}]" for j in range(prob.n)]
        report.append(f"{prob.name}: t* = {fmt(ref['t'])}; dt*/dtheta vs central differences "
                      f"(state-only Radau rtol {RTOL_REF:g}, h = {FD_REL_STEP:g} |theta_j|, or "
                      f"{FD_REL_STEP:g} |t* / (dt*/dtheta_j)| for theta_j = 0):")
        worst = 0.0
        for j in range(prob.m):
            # relative step; for a zero theta_j the step that moves t* by the same relative
            # amount (vdp's dt*/dy0[1] = 0.5: h = 1e-6 would move t* by only 6e-10 relative,
            # close to the solves' noise, ~1e-14 relative)
            h = FD_REL_STEP * (abs(theta[j]) if theta[j] != 0 else abs(ref["t"] / dt[j]))
            tp, tm = theta.copy(), theta.copy()
            tp[j] += h
            tm[j] -= h
            fd = (find_event(prob, tp, False, RTOL_REF, a)["t"] -
                  find_event(prob, tm, False, RTOL_REF, a)["t"]) / (tp[j] - tm[j])
            r = abs(fd - dt[j]) / abs(dt[j])
            worst = max(worst, r)
            report.append(f"  {names[j]:6s} h {h:<8.2g} sens {fmt(dt[j]):>24s}  fd {fmt(fd):>24s}  "
                          f"rel diff {r:.2g}")
        report.append(f"  max rel diff {worst:.2g}")
        print(f"{prob.name}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    with open(path, "w") as fh:
        fh.write("\n".join(out) + "\n")
    print("\n".join(report))
    print(f"wrote {path}")
    print(f"total: {time.time() - t_start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
