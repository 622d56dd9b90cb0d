"""Peer numbers for nabla's ODE benchmarks (bench_ode), measured with Diffrax (JAX, CPU,
float64) on the Lotka-Volterra problem of tests/ode/oracle/lotka_volterra.txt:

  dx/dt = a x - b x y, dy/dt = -c y + d x y, a=1.5, b=1, c=3, d=1, x0=y0=1, t in [0, 10],
  G = x(10) + y(10), gradient w.r.t. p = (a, b, c, d, x0, y0) (one f64[6] array).

Run with build/peers/bin/python (the JAX virtualenv of benchmarks/README.md, plus
`pip install diffrax`), from the repository root (the reference is read from
tests/ode/oracle/lotka_volterra.txt):
    build/peers/bin/python benchmarks/peers/diffrax_lv.py [--repeats N] [--tol T]
        [--max-steps M] [name ...]
The names choose the measurements (all of them when there are none):
  <solver>_solve, <solver>_grad, <solver>_grad_backsolve   for <solver> in tsit5, dopri5
N (default 21, or $NB_BENCH_REPEATS) is the number of samples, each the mean of a burst of
calls lasting about 20 ms or more; T (default 1e-8) is rtol = atol; M (default 4096, Diffrax's
and nb_ode_opts' default) is diffeqsolve's max_steps. NB_BENCH_THREADS (default 1) sets XLA's
CPU threads, as in jax_jit.py.

Every solve: diffeqsolve(ODETerm(f), solver, t0=0, t1=10, dt0=0.01, y0=[x0, y0],
args=(a, b, c, d), stepsize_controller=PIDController(rtol=T, atol=T), SaveAt(t1=True),
max_steps=M). dt0 = 0.01 rather than None: Diffrax 0.7.2 with dt0=None
takes a first step of 0.01 anyway for an ODETerm (see tests/ode/oracle/README.md), so the two
are the same solve. Each timed function is jax.jit-ed, warmed up (compiled) first, and its
result waited for (block_until_ready):
  <solver>_solve            p -> (x(10), y(10))
  <solver>_grad             jax.grad(G) with RecursiveCheckpointAdjoint() (Diffrax's default):
                            the derivative of the discrete solve. Its time grows with M, not
                            only with the steps taken: Equinox's checkpointed loop is sized by
                            max_steps (at T = 1e-8, tsit5: ~7.9 ms with M = 4096, ~1.4 ms with
                            M = 256, for the same 224 steps)
  <solver>_grad_backsolve   jax.grad(G) with BacksolveAdjoint() (the continuous adjoint, solved
                            backwards with the same solver and controller)

Prints "key value" lines: jax_version, diffrax_version, threads, tol, max_steps, then per
measurement
  row diffrax_<name> <median µs> <max relative error vs the reference>
      (solve: of x(10), y(10); grads: of the six gradient entries)
  diffrax_<solver>_steps <num_steps> <num_accepted_steps> <num_rejected_steps>   (solve only)
  diffrax_<name>_values <the numbers>
"""
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
threads = int(os.environ.get("NB_BENCH_THREADS", "1"))
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + (
    " --xla_cpu_multi_thread_eigen=%s intra_op_parallelism_threads=%d"
    % ("false" if threads == 1 else "true", threads))
os.environ.setdefault("OMP_NUM_THREADS", str(threads))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

A, B, C, D = 1.5, 1.0, 3.0, 1.0
X0, Y0 = 1.0, 1.0
T0, T1, DT0 = 0.0, 10.0, 0.01
NAMES = ["a", "b", "c", "d", "x0", "y0"]
REF = "tests/ode/oracle/lotka_volterra.txt"
SOLVERS = {"tsit5": diffrax.Tsit5, "dopri5": diffrax.Dopri5}


def vector_field(t, u, args):
    a, b, c, d = args
    x, y = u[0], u[1]
    return jnp.stack([a * x - b * x * y, -c * y + d * x * y])


TERM = diffrax.ODETerm(vector_field)


MAX_STEPS = [4096]


def solve(p, solver, tol, adjoint):
    return diffrax.diffeqsolve(
        TERM, SOLVERS[solver](), T0, T1, DT0, p[4:6], args=(p[0], p[1], p[2], p[3]),
        saveat=diffrax.SaveAt(t1=True),
        stepsize_controller=diffrax.PIDController(rtol=tol, atol=tol), adjoint=adjoint,
        max_steps=MAX_STEPS[0])


def make(name, tol):
    """(jitted function, kind) for a measurement name."""
    solver, _, kind = name.partition("_")
    if kind == "solve":
        def f(p):
            sol = solve(p, solver, tol, diffrax.RecursiveCheckpointAdjoint())
            return sol.ys[0], sol.stats
        return jax.jit(f), solver, kind
    adjoint = {"grad": diffrax.RecursiveCheckpointAdjoint(),
               "grad_backsolve": diffrax.BacksolveAdjoint()}[kind]

    def G(p):
        sol = solve(p, solver, tol, adjoint)
        return sol.ys[0, 0] + sol.ys[0, 1]
    return jax.jit(jax.grad(G)), solver, kind


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
        elif argv[i] == "--max-steps":
            MAX_STEPS[0] = int(argv[i + 1])
            i += 2
        else:
            names.append(argv[i])
            i += 1
    known = [s + k for s in SOLVERS for k in ("_solve", "_grad", "_grad_backsolve")]
    for n in names:
        if n not in known:
            sys.exit("diffrax_lv.py: unknown measurement %r (known: %s)" % (n, " ".join(known)))
    ref_state, ref_grad = read_reference(REF)
    print("jax_version", jax.__version__)
    print("diffrax_version", diffrax.__version__)
    print("threads", threads)
    print("tol", repr(tol))
    print("max_steps", MAX_STEPS[0])
    sys.stdout.flush()
    p = jnp.array([A, B, C, D, X0, Y0], dtype=jnp.float64)
    for name in names or known:
        f, solver, kind = make(name, tol)
        if kind == "solve":
            fn = lambda: jax.block_until_ready(f(p))  # noqa: E731
            ys, stats = fn()
            vals = [float(v) for v in ys]
            err = relerr(vals, ref_state)
        else:
            fn = lambda: f(p).block_until_ready()  # noqa: E731
            vals = [float(v) for v in fn()]
            err = relerr(vals, ref_grad)
        print("row diffrax_%s %.3f %.3g" % (name, med_us(fn, repeats), err))
        if kind == "solve":
            print("diffrax_%s_steps %d %d %d" % (solver, int(stats["num_steps"]),
                                                 int(stats["num_accepted_steps"]),
                                                 int(stats["num_rejected_steps"])))
        print("diffrax_%s_values %s" % (name, " ".join(repr(v) for v in vals)))
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
