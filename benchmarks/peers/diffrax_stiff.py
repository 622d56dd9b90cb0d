"""Peer numbers for nabla's stiff ODE solvers, measured with Diffrax (JAX, CPU, float64) on
the stiff test set of tests/ode/oracle/gen_stiff.py (problem definitions, sources and the
reference data: that script's docstring):

  robertson  Robertson's reaction, p = (k1, k2, k3), y0 = (1, 0, 0), t1 = 1e5
  hires      HIRES, 8 species, p = (p1..p12), t1 = 321.8122
  vdp        Van der Pol, unscaled, mu = 1000, p = (mu,), y0 = (2, 0), t1 = 3000
  pollu      POLLU, 20 species, 25 reactions, p = (k1..k25), t1 = 60

Run with build/peers/bin/python (the JAX virtualenv of benchmarks/README.md, plus
`pip install diffrax`), from the repository root:
    build/peers/bin/python benchmarks/peers/diffrax_stiff.py [--repeats N]
        [--problems robertson,hires,vdp,pollu] [--rtols 1e-4,1e-6,1e-8]
        [--solvers kvaerno5,kencarp5,grad] [--max-steps M] [--grad-max-steps G]
        [--budget S] [--ref tests/ode/oracle/stiff_ref.txt]
t1, y0, p, the loss weights w, the reference end state y1, the reference gradient and the
benchmark atol scale s are read from the reference file ("<problem> t1|y0|p|w|y1|grad|
bench_atol_scale ..." records) at run time. The right-hand sides are re-implemented below in
jax.numpy with the operations of gen_stiff.py's robertson_f, hires_f, vdp_f and pollu_f in
the same order (gen_stiff.py's own functions build NumPy arrays and cannot be traced); at
start-up they are compared with gen_stiff.py's (imported: its data generation runs only as
__main__) at y0 and at the reference y1 ("# rhs check" lines): evaluated op by op they must
agree bit for bit (the script stops otherwise); the jitted ones, where XLA may fuse a * b + c
into an FMA, are compared for information.

For each problem and rtol, atol = rtol * s. Every solve is
  diffeqsolve(terms, solver, t0=0, t1, dt0=None, y0, args=p, saveat=SaveAt(t1=True),
              stepsize_controller=PIDController(rtol, atol), max_steps=M, throw=False)
with the solver's default root finder (VeryChord with the controller's rtol and atol).
dt0=None is Diffrax's automatic first step: Hairer's algorithm for an ODETerm, but 0.01 for
a MultiTerm (tests/ode/oracle/README.md). The measurements (--solvers):
  kvaerno5  terms = ODETerm(f), Kvaerno5()
  kencarp5  terms = MultiTerm(ODETerm(explicit), ODETerm(implicit)), KenCarp5(), with the
            explicit part the zero vector field and the implicit part the whole f (the IMEX
            method used as a plain ESDIRK method)
  grad      (robertson and hires only, the problems with w and grad records) jax.grad of
            L = sum_i w_i y_i(t1) w.r.t. p, Kvaerno5, adjoint=RecursiveCheckpointAdjoint()
            (Diffrax's default: the derivative of the discrete solve), max_steps = G (default
            M). With checkpoints=None Equinox's checkpointed loop keeps ~sqrt(2 G)
            checkpoints, so its time depends on G, not only on the steps taken: at rtol 1e-8
            (~5000 steps) G = 8192 recomputes more and was slower than 16384 and 100000,
            which were about equal.
Each timed function is jax.jit-ed with p, rtol and atol as arguments (one compilation per
problem and measurement, reused for the three rtols; the first call's time, minus one
compiled call, is printed as "# compile ..."), and its result waited for
(block_until_ready). Per rtol, one compiled call (the one after the compiling call, or the
rtol's first) is timed alone and sizes the samples: a sample is the mean of a burst of calls
lasting about 20 ms or more (a call that takes that long is a sample alone, and the timed
call is the first); the median of N samples (default 11, or $NB_BENCH_REPEATS) is reported.
Slow cases take fewer samples so that one case's timing stays under about S seconds (default
4; never fewer than 3 samples), and a "# ..." line says so. NB_BENCH_THREADS (default 1)
sets XLA's CPU threads, as in jax_jit.py. M (default 100000) is diffeqsolve's max_steps;
Kvaerno5 needs at most 21709 (vdp at rtol 1e-8).

Prints "key value" lines diffrax_version, jax_version, threads, max_steps, grad_max_steps,
then per problem, rtol and measurement
  row diffrax_<solver>_<problem>_<e> <median us> <error> <num_steps>
  row diffrax_kvaerno5_grad_<problem>_<e> <median us> <error> <num_steps>
with <e> = -log10(rtol) (4, 6, 8) and num_steps = sol.stats["num_steps"] (accepted and
rejected). <error> is, for a solve, sqrt(mean_i ((y_i - y1_i) / (|y1_i| + s))^2) against the
reference end state y1, and for a gradient max_i |g_i - grad_i| / max_i |grad_i|. A
configuration that fails (Diffrax's result is not successful, e.g. max_steps reached) gets
a "# ..." line with Diffrax's message, the time reached and the step counts, and no row.

KenCarp5 in Diffrax 0.7.2 mostly fails here, and takes many more steps than Kvaerno5 where
it finishes: its explicit tableau is not FSAL, so neither is the pair, and each step then
solves the implicit tableau's explicit first stage (diagonal 0) with VeryChord too, starting
from that stage's exact value. The residual is rounding noise that does not change from one
iteration to the next (rate 1): at the second iteration VeryChord's test finds it neither
converged (rate / (1 - rate) is infinite) nor small (< 1e-13 in tolerance units), reports a
nonlinear divergence, and the step is rejected, whenever the noise is not exactly zero; the
step size collapses (about 41140 accepted and 58860 rejected of 100000 steps in every failed
run here). The runs say so and report the steps and the time reached. (Checked outside this
script: with a VeryChord subclass that accepts a zero-diagonal stage after its first
iteration, KenCarp5 finishes robertson in 552, 678 and 823 steps at rtol 1e-4, 1e-6, 1e-8;
that variant is not measured here.)
"""
import math
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
import numpy as np  # noqa: E402

REF = "tests/ode/oracle/stiff_ref.txt"
ORACLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                          "ode", "oracle")
PROBLEMS = ["robertson", "hires", "vdp", "pollu"]
RTOLS = [1e-4, 1e-6, 1e-8]
MEASUREMENTS = ["kvaerno5", "kencarp5", "grad"]


# ---- right-hand sides (gen_stiff.py's, in jax.numpy, same operations in the same order) --

def robertson_f(t, y, k):
    a = k[0] * y[0]
    b = k[2] * y[1] * y[2]
    c = k[1] * y[1] * y[1]
    return jnp.stack([-a + b, a - b - c, c])


def vdp_f(t, y, p):
    mu = p[0]
    return jnp.stack([y[1], mu * ((1 - y[0] * y[0]) * y[1]) - y[0]])


def hires_f(t, y, p):
    p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12 = (p[i] for i in range(12))
    y1, y2, y3, y4, y5, y6, y7, y8 = (y[i] for i in range(8))
    f7 = p10 * y6 * y8 - p12 * y7
    return jnp.stack([-p1 * y1 + p2 * y2 + p3 * y3 + p4,
                      p1 * y1 - p5 * y2,
                      -p6 * y3 + p2 * y4 + p7 * y5,
                      p3 * y2 + p1 * y3 - p8 * y4,
                      -p9 * y5 + p2 * (y6 + y7),
                      -p10 * y6 * y8 + p11 * y4 + p1 * y5 - p2 * y6 + p11 * y7,
                      f7,
                      -f7])


# POLLU: reaction j (1-based) has rate k_j * y[a] (* y[b]) (1-based species), multiplied
# left to right; dy_i/dt is the signed sum of the listed reactions, left to right. The
# tables are pollu.f's (the same as gen_stiff.py's POLLU_REACTANTS and POLLU_SUMS, which
# the rhs check compares against).
POLLU_REACTANTS = [(1,), (2, 4), (5, 2), (7,), (7,), (7, 6), (9,), (9, 6), (11, 2), (11, 1),
                   (13,), (10, 2), (14,), (1, 6), (3,), (4,), (4,), (16,), (16,), (17, 6),
                   (19,), (19,), (1, 4), (19, 1), (20,)]
POLLU_SUMS = [
    (-1, -10, -14, -23, -24, 2, 3, 9, 11, 12, 22, 25),
    (-2, -3, -9, -12, 1, 21),
    (-15, 1, 17, 19, 22),
    (-2, -16, -17, -23, 15),
    (-3, 4, 4, 6, 7, 13, 20),
    (-6, -8, -14, -20, 3, 18, 18),
    (-4, -5, -6, 13),
    (4, 5, 6, 7),
    (-7, -8),
    (-12, 7, 9),
    (-9, -10, 8, 11),
    (9,),
    (-11, 10),
    (-13, 12),
    (14,),
    (-18, -19, 16),
    (-20,),
    (20,),
    (-21, -22, -24, 23, 25),
    (-25, 24),
]


def pollu_f(t, y, k):
    r = []
    for j, a in enumerate(POLLU_REACTANTS):
        v = k[j] * y[a[0] - 1]
        if len(a) == 2:
            v = v * y[a[1] - 1]
        r.append(v)
    out = []
    for terms in POLLU_SUMS:
        acc = r[terms[0] - 1] if terms[0] > 0 else -r[-terms[0] - 1]
        for s in terms[1:]:
            acc = acc + r[s - 1] if s > 0 else acc - r[-s - 1]
        out.append(acc)
    return jnp.stack(out)


RHS = {"robertson": robertson_f, "hires": hires_f, "vdp": vdp_f, "pollu": pollu_f}


def zero_f(t, y, args):
    return jnp.zeros_like(y)


# ---- reference data ---------------------------------------------------------------------

def read_reference(path, problems):
    """{problem: {field: [floats]}} for the fields t1, y0, p, y1, w, grad, bench_atol_scale."""
    want = {"t1", "y0", "p", "y1", "w", "grad", "bench_atol_scale"}
    ref = {name: {} for name in problems}
    with open(path) as fh:
        for line in fh:
            w = line.split()
            if len(w) < 3 or w[0].startswith("#") or w[0] not in ref or w[1] not in want:
                continue
            ref[w[0]][w[1]] = [float(v) for v in w[2:]]
    for name in problems:
        for field in ("t1", "y0", "p", "y1", "bench_atol_scale"):
            if field not in ref[name]:
                sys.exit("diffrax_stiff.py: no '%s %s' record in %s" % (name, field, path))
    return ref


def check_rhs(ref, problems):
    """Compare the jax.numpy right-hand sides with gen_stiff.py's at y0 and y1: op by op
    (not jitted) they must agree bit for bit; jitted, XLA may contract a * b + c into an FMA,
    so that comparison is only printed (relative to max |f|; vdp's f2 cancels at y1)."""
    sys.path.insert(0, os.path.normpath(ORACLE_DIR))
    sys.dont_write_bytecode = True  # leave no __pycache__ in tests/ode/oracle
    import gen_stiff  # noqa: E402  (defines the problems; generates data only as __main__)
    sys.path.pop(0)
    assert gen_stiff.POLLU_REACTANTS == POLLU_REACTANTS and gen_stiff.POLLU_SUMS == POLLU_SUMS
    for name in problems:
        r = ref[name]
        p = np.array(r["p"])
        fj = jax.jit(RHS[name])
        parts = []
        for label in ("y0", "y1"):
            y = np.array(r[label])
            want = np.asarray(getattr(gen_stiff, name + "_f")(0.0, y, p), dtype=float)
            eager = np.asarray(RHS[name](0.0, jnp.asarray(y), jnp.asarray(p)))
            jitted = np.asarray(fj(0.0, jnp.asarray(y), jnp.asarray(p)))
            if not np.array_equal(eager, want):
                sys.exit("diffrax_stiff.py: %s right-hand side differs from gen_stiff.py's"
                         " at %s: %r vs %r" % (name, label, eager, want))
            diff = float(np.max(np.abs(jitted - want)) / np.max(np.abs(want)))
            parts.append("at %s equal op by op; jitted %d/%d equal, max |diff| / max |f| %.2g"
                         % (label, int(np.sum(jitted == want)), y.size, diff))
        print("# rhs check %s vs gen_stiff.py: %s" % (name, "; ".join(parts)))


# ---- solves ---------------------------------------------------------------------------------

def solve(name, solver, p, rtol, atol, r, max_steps):
    f = RHS[name]
    if solver == "kencarp5":
        terms = diffrax.MultiTerm(diffrax.ODETerm(zero_f), diffrax.ODETerm(f))
        s = diffrax.KenCarp5()
    else:
        terms = diffrax.ODETerm(f)
        s = diffrax.Kvaerno5()
    return diffrax.diffeqsolve(
        terms, s, 0.0, r["t1"][0], None, jnp.array(r["y0"]), args=p,
        saveat=diffrax.SaveAt(t1=True),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        adjoint=diffrax.RecursiveCheckpointAdjoint(), max_steps=max_steps, throw=False)


def info(sol):
    return (sol.result, sol.ts[0], sol.stats["num_steps"],
            sol.stats["num_accepted_steps"], sol.stats["num_rejected_steps"])


def make(name, what, r, max_steps, grad_max_steps):
    """A jitted function of (p, rtol, atol) -> (values, info)."""
    if what != "grad":
        def fn(p, rtol, atol):
            sol = solve(name, what, p, rtol, atol, r, max_steps)
            return sol.ys[0], info(sol)
        return jax.jit(fn)
    w = jnp.array(r["w"])

    def loss(p, rtol, atol):
        sol = solve(name, "kvaerno5", p, rtol, atol, r, grad_max_steps)
        return jnp.dot(w, sol.ys[0]), info(sol)
    return jax.jit(jax.grad(loss, has_aux=True))


def solve_error(y, y1, scale):
    y, y1 = np.asarray(y), np.asarray(y1)
    return float(np.sqrt(np.mean(((y - y1) / (np.abs(y1) + scale)) ** 2)))


def grad_error(g, ref):
    g, ref = np.asarray(g), np.asarray(ref)
    return float(np.max(np.abs(g - ref)) / np.max(np.abs(ref)))


def timed(fn, once, repeats, budget):
    """(median µs, samples taken): samples are bursts of >= ~20 ms; once = s per call."""
    inner = max(1, int(0.02 / max(once, 1e-9)))
    n = max(3, min(repeats, int(budget / max(once * inner, 1e-9))))
    s = [once * 1e6] if inner == 1 else []   # a call of >= 20 ms is a sample by itself
    for _ in range(n - len(s)):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        s.append((time.perf_counter() - t0) / inner * 1e6)
    return statistics.median(s), n


def rtol_key(rtol):
    return "%d" % round(-math.log10(rtol))


def main(argv):
    repeats = int(os.environ.get("NB_BENCH_REPEATS", "11"))
    problems, rtols, whats = list(PROBLEMS), list(RTOLS), list(MEASUREMENTS)
    max_steps, grad_max_steps, budget, ref_path = 100_000, None, 4.0, REF
    i = 0
    while i < len(argv):
        opt = argv[i]
        if i + 1 >= len(argv):
            sys.exit("diffrax_stiff.py: %s needs a value" % opt)
        val = argv[i + 1]
        if opt == "--repeats":
            repeats = int(val)
        elif opt == "--problems":
            problems = val.split(",")
        elif opt == "--rtols":
            rtols = [float(v) for v in val.split(",")]
        elif opt == "--solvers":
            whats = val.split(",")
        elif opt == "--max-steps":
            max_steps = int(val)
        elif opt == "--grad-max-steps":
            grad_max_steps = int(val)
        elif opt == "--budget":
            budget = float(val)
        elif opt == "--ref":
            ref_path = val
        else:
            sys.exit("diffrax_stiff.py: unknown option %r" % opt)
        i += 2
    for n in problems:
        if n not in RHS:
            sys.exit("diffrax_stiff.py: unknown problem %r (known: %s)" % (n, " ".join(RHS)))
    for n in whats:
        if n not in MEASUREMENTS:
            sys.exit("diffrax_stiff.py: unknown measurement %r (known: %s)"
                     % (n, " ".join(MEASUREMENTS)))
    if grad_max_steps is None:
        grad_max_steps = max_steps
    ref = read_reference(ref_path, problems)
    print("diffrax_version", diffrax.__version__)
    print("jax_version", jax.__version__)
    print("threads", threads)
    print("max_steps", max_steps)
    print("grad_max_steps", grad_max_steps)
    check_rhs(ref, problems)
    sys.stdout.flush()
    for name in problems:
        r = ref[name]
        scale = r["bench_atol_scale"][0]
        p = jnp.array(r["p"])
        for what in whats:
            if what == "grad" and ("w" not in r or "grad" not in r):
                continue
            label = "kvaerno5_grad" if what == "grad" else what
            fn = make(name, what, r, max_steps, grad_max_steps)
            compiled = False
            for rtol in rtols:
                key = "diffrax_%s_%s_%s" % (label, name, rtol_key(rtol))
                args = (p, jnp.float64(rtol), jnp.float64(rtol * scale))
                call = lambda: jax.block_until_ready(fn(*args))  # noqa: E731
                t0 = time.perf_counter()
                vals, (res, t_end, steps, acc, rej) = call()
                once = time.perf_counter() - t0
                if not compiled:
                    first = once
                    t0 = time.perf_counter()
                    call()
                    once = again = time.perf_counter() - t0
                    print("# compile %s_%s: %.1f s (first call %.2f s, then %.3f s)"
                          % (label, name, first - again, first, again))
                    compiled = True
                if bool(res != diffrax.RESULTS.successful):
                    print("# %s failed: %s; t reached %.6g of %g after %d steps (%d accepted,"
                          " %d rejected); no row" % (key, diffrax.RESULTS[res],
                                                     float(t_end), r["t1"][0], int(steps),
                                                     int(acc), int(rej)))
                    sys.stdout.flush()
                    continue
                if what == "grad":
                    err = grad_error(vals, r["grad"])
                else:
                    err = solve_error(vals, r["y1"], scale)
                med, n = timed(call, once, repeats, budget)
                if n < repeats:
                    print("# %s: %d samples, not %d (one call takes %.0f ms)"
                          % (key, n, repeats, once * 1e3))
                print("row %s %.3f %.3g %d" % (key, med, err, int(steps)))
                sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
