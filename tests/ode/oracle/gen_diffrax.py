"""Oracle for nabla's ODE solver tests (tests/ode, issue 8): Diffrax's own numbers for the
Lotka-Volterra problem of lotka_volterra.txt, solver by solver, so that nabla's
nb_diffeqsolve can be checked against the library it follows -- step counts, end states,
gradients of the discrete solve, automatic initial steps and dense output.

Run with the peers' virtualenv (JAX on the CPU, `pip install diffrax`, see
benchmarks/README.md), from the repository root:
    build/peers/bin/python tests/ode/oracle/gen_diffrax.py > tests/ode/oracle/diffrax.txt
See README.md beside this script for the line formats. Everything is float64
(jax_enable_x64). Takes a few minutes (one compile per configuration).
"""
import os
import platform
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One XLA CPU thread: no reductions split across threads (the output must not depend on them).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402
from diffrax._solver.runge_kutta import AbstractERK, ButcherTableau  # noqa: E402

A, B, C, D = 1.5, 1.0, 3.0, 1.0
X0, Y0 = 1.0, 1.0
T0, T1 = 0.0, 10.0
DT0 = 0.01
NAMES = ["a", "b", "c", "d", "x0", "y0"]
P = [A, B, C, D, X0, Y0]
HERE = os.path.dirname(os.path.abspath(__file__))


# Classical RK4: Diffrax has no such solver, so it is written here as a Diffrax ERK from
# its Butcher tableau (no error estimate: b_error = 0, constant steps only), with the cubic
# Hermite interpolant of Diffrax's other low-order solvers.
class RK4(AbstractERK):
    tableau = ButcherTableau(
        a_lower=(np.array([0.5]), np.array([0.0, 0.5]), np.array([0.0, 0.0, 1.0])),
        b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
        b_error=np.zeros(4),
        c=np.array([0.5, 0.5, 1.0]),
    )
    interpolation_cls = diffrax.ThirdOrderHermitePolynomialInterpolation.from_k

    def order(self, terms):
        return 4


SOLVERS = {
    "euler": diffrax.Euler, "heun": diffrax.Heun, "midpoint": diffrax.Midpoint,
    "ralston": diffrax.Ralston, "bosh3": diffrax.Bosh3, "rk4": RK4,
    "dopri5": diffrax.Dopri5, "tsit5": diffrax.Tsit5, "dopri8": diffrax.Dopri8,
}
ADAPTIVE = ["heun", "midpoint", "ralston", "bosh3", "dopri5", "tsit5", "dopri8"]
RTOLS = [1e-4, 1e-6, 1e-8]
STEP_LIMIT = 100000      # the order-2 solvers skip a tolerance needing more steps than this
MAX_STEPS = 400000       # diffeqsolve's max_steps: above anything the runs below need
TS = [0.0, 0.3333] + [0.5 * k for k in range(1, 6)] + [2.718] + \
     [0.5 * k for k in range(6, 15)] + [7.07] + [0.5 * k for k in range(15, 21)]
DENSE_SOLVERS = ["tsit5", "dopri5", "dopri8", "bosh3"]


def vector_field(t, u, args):
    a, b, c, d = args
    x, y = u[0], u[1]
    return jnp.stack([a * x - b * x * y, -c * y + d * x * y])


TERM = diffrax.ODETerm(vector_field)


def controller(rtol):
    return diffrax.ConstantStepSize() if rtol is None else diffrax.PIDController(rtol=rtol, atol=rtol)


def solve(p, solver, rtol, dt0, saveat):
    a, b, c, d, x0, y0 = p
    return diffrax.diffeqsolve(
        TERM, SOLVERS[solver](), T0, T1, dt0, jnp.stack([x0, y0]), args=(a, b, c, d),
        saveat=saveat, stepsize_controller=controller(rtol), max_steps=MAX_STEPS,
        adjoint=diffrax.RecursiveCheckpointAdjoint())


def make_fns(solver, rtol, dt0):
    def fwd(p):
        sol = solve(p, solver, rtol, dt0, diffrax.SaveAt(t1=True))
        return sol.ys[0], sol.stats, sol.result

    def G(p):
        sol = solve(p, solver, rtol, dt0, diffrax.SaveAt(t1=True))
        return sol.ys[0, 0] + sol.ys[0, 1]

    return jax.jit(fwd), jax.jit(jax.grad(G))


def run(solver, rtol, dt0, step_limit=None):
    """Steps, end state and gradient; no gradient (None) past step_limit steps."""
    p = jnp.array(P, dtype=jnp.float64)
    fwd, grad = make_fns(solver, rtol, dt0)
    ys, stats, result = fwd(p)
    assert result == diffrax.RESULTS.successful, (solver, rtol, dt0, result)
    st = tuple(int(stats[k]) for k in ("num_steps", "num_accepted_steps", "num_rejected_steps"))
    if step_limit is not None and st[0] > step_limit:
        return st, [float(v) for v in ys], None
    g = grad(p)
    return st, [float(v) for v in ys], [float(v) for v in g]


def initial_step(solver, rtol, wrapped):
    """The first step PIDController.init picks for dt0=None (Hairer's algorithm in
    _select_initial_step). wrapped=True: called exactly as diffeqsolve calls it, on the
    term wrapped in diffrax's WrapTerm (time direction). wrapped=False: on the ODETerm
    itself, which is the only case _select_initial_step runs its algorithm for -- on any
    other term it returns 0.01."""
    s = SOLVERS[solver]()
    ctrl = controller(rtol)
    args = tuple(jnp.float64(v) for v in (A, B, C, D))
    y0 = jnp.array([X0, Y0], dtype=jnp.float64)

    def first(y0, args):
        term = TERM
        if wrapped:
            term = diffrax._term.WrapTerm(TERM, jnp.where(T0 < T1, 1, -1))
        return ctrl.init(term, T0, T1, y0, None, args, s.func, s.error_order(TERM))[0]

    return float(jax.jit(first)(y0, args)) - T0, s.error_order(TERM)


def dense(solver, rtol, dt0):
    p = jnp.array(P, dtype=jnp.float64)

    def fwd(p):
        sol = solve(p, solver, rtol, dt0, diffrax.SaveAt(ts=jnp.array(TS, dtype=jnp.float64)))
        return sol.ts, sol.ys, sol.stats, sol.result

    ts, ys, stats, result = jax.jit(fwd)(p)
    assert result == diffrax.RESULTS.successful
    st = tuple(int(stats[k]) for k in ("num_steps", "num_accepted_steps", "num_rejected_steps"))
    return st, [(float(t), float(y[0]), float(y[1])) for t, y in zip(ts, ys)]


def read_reference():
    states, grad = {}, {}
    with open(os.path.join(HERE, "lotka_volterra.txt")) as fh:
        for line in fh:
            w = line.split()
            if not w or w[0].startswith("#"):
                continue
            if w[0] == "state":
                states[float(w[1])] = (float(w[2]), float(w[3]))
            elif w[0] == "grad":
                grad[w[1]] = float(w[2])
    return states, [grad[n] for n in NAMES]


def relerr(u, v):
    return max(abs(a - b) / abs(b) for a, b in zip(u, v))


def fmt_dt0(dt0):
    return "auto" if dt0 is None else repr(dt0)


def fmt_ctrl(rtol):
    return "const" if rtol is None else repr(rtol)


def main():
    ref_states, ref_grad = read_reference()
    ref_end = ref_states[T1]
    lines, notes = [], []

    def record(solver, rtol, dt0, st, ys, g):
        key = "%s %s %s" % (solver, fmt_ctrl(rtol), fmt_dt0(dt0))
        lines.append("steps %s %d %d %d" % ((key,) + st))
        lines.append("state %s %r %r %r" % (key, T1, ys[0], ys[1]))
        lines.append("grad %s %s" % (key, " ".join(repr(v) for v in g)))
        notes.append("#   %-26s steps %6d  state %.2e  grad %.2e"
                     % (key, st[0], relerr(ys, ref_end), relerr(g, ref_grad)))

    # Adaptive, dt0 = 0.01.
    for solver in ADAPTIVE:
        for rtol in RTOLS:
            st, ys, g = run(solver, rtol, DT0, STEP_LIMIT)
            if g is None:
                notes.append("#   %s %r %r: skipped, %d steps > %d"
                             % (solver, rtol, DT0, st[0], STEP_LIMIT))
                continue
            record(solver, rtol, DT0, st, ys, g)

    # Adaptive, dt0 = None: Diffrax's automatic initial step. As diffeqsolve runs it, and
    # then a solve started from what Hairer's algorithm gives (see initial_step).
    for solver in ["tsit5", "dopri5"]:
        rtol = 1e-8
        st, ys, g = run(solver, rtol, None)
        record(solver, rtol, None, st, ys, g)
        h, order = initial_step(solver, rtol, wrapped=True)
        lines.append("initdt %s %r diffeqsolve %r" % (solver, rtol, h))
        # Check: a solve given that step as dt0 is the same solve, bit for bit.
        assert run(solver, rtol, h) == (st, ys, g), solver
        notes.append("#   %s %r auto: diffeqsolve's first step %r; a solve with dt0 set to it is "
                     "identical bit for bit" % (solver, rtol, h))
        hh, order = initial_step(solver, rtol, wrapped=False)
        lines.append("initdt %s %r hairer %r" % (solver, rtol, hh))
        st, ys, g = run(solver, rtol, hh)
        record(solver, rtol, hh, st, ys, g)
        notes.append("#   %s %r: Hairer's initial step (error order %r) %r, solved from in the "
                     "line above" % (solver, rtol, order, hh))

    # Dense output at TS.
    for solver in DENSE_SOLVERS:
        rtol = 1e-6
        st, rows = dense(solver, rtol, DT0)
        st1, ys1, _ = run(solver, rtol, DT0)
        assert st == st1, (solver, st, st1)   # saving at ts leaves the steps alone
        key = "%s %r %r" % (solver, rtol, DT0)
        for t, x, y in rows:
            lines.append("ts %s %r %r %r" % (key, t, x, y))
        err = max(relerr((x, y), ref_states[t]) for t, x, y in rows if t in ref_states and t > 0)
        notes.append("#   ts %-23s at t = 0.5..10: max rel. diff. vs lotka_volterra.txt %.2e; "
                     "x(10), y(10) equal to the SaveAt(t1) run: %s"
                     % (key, err, "yes" if list(rows[-1][1:]) == ys1 else "no"))

    # Constant steps dt0 = 0.01 (1000 steps), every solver.
    for solver in SOLVERS:
        st, ys, g = run(solver, None, DT0)
        record(solver, None, DT0, st, ys, g)

    out = [
        "# Diffrax oracle for tests/ode (issue 8). Made by tests/ode/oracle/gen_diffrax.py:",
        "#   build/peers/bin/python tests/ode/oracle/gen_diffrax.py > tests/ode/oracle/diffrax.txt",
        "# diffrax %s equinox %s jax %s jaxlib %s numpy %s python %s, CPU, float64 (jax_enable_x64)"
        % (diffrax.__version__, eqx.__version__, jax.__version__, jaxlib.__version__,
           np.__version__, platform.python_version()),
        "# Problem: dx/dt = a x - b x y, dy/dt = -c y + d x y; a=%r b=%r c=%r d=%r, x0=%r y0=%r, "
        "t in [%r, %r]; state a 1-D array [x, y]" % (A, B, C, D, X0, Y0, T0, T1),
        "# diffeqsolve(ODETerm, solver, t0=0, t1=10, dt0, y0, args=(a, b, c, d), max_steps=%d,"
        % MAX_STEPS,
        "#   adjoint=RecursiveCheckpointAdjoint(), stepsize_controller=PIDController(rtol=r, atol=r)"
        " with its defaults",
        "#   (pcoeff 0, icoeff 1, dcoeff 0, factormin 0.2, factormax 10, safety 0.9) or "
        "ConstantStepSize() ('const')",
        "# Solvers: diffrax.Euler, Heun, Midpoint, Ralston (the 2/3 method), Bosh3, Dopri5, Tsit5, "
        "Dopri8; rk4 is classical RK4",
        "#   written here as a diffrax AbstractERK (Diffrax has none). PID error order = the "
        "solver's order (Diffrax's rule).",
        "# Lines (<ctrl> is the rtol = atol of the PID controller, or 'const'; <dt0> a float or "
        "'auto' for dt0=None):",
        "#   steps <solver> <ctrl> <dt0> <num_steps> <num_accepted_steps> <num_rejected_steps>",
        "#   state <solver> <ctrl> <dt0> <t=10> <x(10)> <y(10)>                    (SaveAt(t1=True))",
        "#   grad <solver> <ctrl> <dt0> <dG/da> <dG/db> <dG/dc> <dG/dd> <dG/dx0> <dG/dy0>",
        "#        G = x(10) + y(10), jax.grad through diffeqsolve: the exact derivative of the "
        "discrete solve",
        "#        (Diffrax stops the gradient through the step-size factor and the initial step)",
        "#   initdt <solver> <ctrl> diffeqsolve <dt>   the first step diffeqsolve takes with dt0=None",
        "#   initdt <solver> <ctrl> hairer <dt>   the step Hairer's algorithm gives (Diffrax's "
        "_select_initial_step on the ODETerm);",
        "#        diffeqsolve in this version never runs it for an ODETerm: it wraps the term in "
        "WrapTerm first, and",
        "#        _select_initial_step returns 0.01 for anything but an ODETerm. The runs with dt0 = "
        "the hairer step are",
        "#        recorded under that dt0 (what a solver implementing the algorithm should reproduce).",
        "#   ts <solver> <ctrl> <dt0> <t> <x(t)> <y(t)>   SaveAt(ts=...): dense output, the solver's "
        "own interpolant",
        "#        (tsit5, dopri5, dopri8) or cubic Hermite (bosh3); same steps as the SaveAt(t1) run",
        "# Order-2 solvers at rtol 1e-8 are left out when they need more than %d steps." % STEP_LIMIT,
        "# Floats are Python repr (round-trip exactly with strtod).",
        "# Max relative differences vs lotka_volterra.txt (SciPy DOP853 at 1e-13: the true "
        "solution to ~1e-12):",
    ] + notes + lines
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
