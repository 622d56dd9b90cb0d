"""Oracle for test_stiff's judgement on the two limit cycles (issue 20): Diffrax's own
final-state errors for the ESDIRK methods nabla shares with it (Kvaerno3/4/5, KenCarp3/4/5,
the same tableaus), on Van der Pol (mu 1e3) and OREGO at rtol 1e-6, atol = rtol * the
problem's bench_atol_scale, with the controller nabla uses (an I-controller: pcoeff 0,
icoeff 1, dcoeff 0), SaveAt(t1), in test_stiff.c's measure (set_error: the RMS over
components of |y - ref| / (|ref| + scale), in units of rtol; ref from stiff_ref.txt).

On a limit cycle a local error becomes a phase error that grows with the time integrated,
so a method's final-state error can be tens of rtol; this file shows how large it is for
the method itself, independently of nabla.

KenCarp runs as Diffrax requires, MultiTerm(ODETerm(0), ODETerm(f)) (all of f implicit).
The nonlinear solver is optimistix's Chord (rtol, atol as the controller's): Diffrax 0.7.2's
default VeryChord declares divergence on round-off (contraction rate > 2 with corrections
near 1e-13) under jit, rejects most steps for Kvaerno and cannot take a step longer than
about 0.01 with KenCarp (max_steps); with Chord (or Newton: the same numbers) the step
counts are those of nabla's solver, whose Newton iteration differs only in its stopping
rule.

Run with the peers' virtualenv (benchmarks/README.md), from the repository root:
    build/peers/bin/python tests/ode/oracle/gen_diffrax_cycles.py \
        > tests/ode/oracle/diffrax_cycles.txt
Line format: `<problem> <method> err <error in rtol> steps <steps> rejected <rejected>`.
"""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import diffrax as dfx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optimistix as optx  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RTOL = 1e-6


def ref_read(prob, field):
    with open(os.path.join(HERE, "stiff_ref.txt")) as fh:
        for line in fh:
            parts = line.split()
            if not line.startswith("#") and len(parts) >= 2 and parts[:2] == [prob, field]:
                return np.array([float(x) for x in parts[2:]])
    raise KeyError((prob, field))


def f_vdp(t, y, p):
    return jnp.stack([y[1], p[0] * ((1.0 - y[0] * y[0]) * y[1]) - y[0]])


def f_orego(t, y, p):
    s, q, w = p[0], p[1], p[2]
    return jnp.stack([s * (y[1] + y[0] * ((1.0 - q * y[0]) - y[1])),
                      (y[2] - (1.0 + y[0]) * y[1]) / s,
                      w * (y[0] - y[2])])


PROBLEMS = {"vdp": f_vdp, "orego": f_orego}
METHODS = {"kvaerno3": dfx.Kvaerno3, "kvaerno4": dfx.Kvaerno4, "kvaerno5": dfx.Kvaerno5,
           "kencarp3": dfx.KenCarp3, "kencarp4": dfx.KenCarp4, "kencarp5": dfx.KenCarp5}


def run(prob, name):
    f = PROBLEMS[prob]
    t1 = float(ref_read(prob, "t1")[0])
    y0 = jnp.asarray(ref_read(prob, "y0"))
    p = jnp.asarray(ref_read(prob, "p"))
    ref = ref_read(prob, "y1")
    scale = float(ref_read(prob, "bench_atol_scale")[0])
    solver = METHODS[name](root_finder=optx.Chord(rtol=RTOL, atol=RTOL * scale))
    if name.startswith("kencarp"):
        terms = dfx.MultiTerm(dfx.ODETerm(lambda t, y, a: jnp.zeros_like(y)), dfx.ODETerm(f))
    else:
        terms = dfx.ODETerm(f)
    ctrl = dfx.PIDController(rtol=RTOL, atol=RTOL * scale, pcoeff=0.0, icoeff=1.0, dcoeff=0.0)
    sol = dfx.diffeqsolve(terms, solver, 0.0, t1, None, y0, p, stepsize_controller=ctrl,
                          saveat=dfx.SaveAt(t1=True), max_steps=200000, throw=False)
    if sol.result != dfx.RESULTS.successful:
        sys.exit(f"{prob} {name}: {sol.result}")
    e = np.abs(np.asarray(sol.ys[-1]) - ref) / (np.abs(ref) + scale)
    return (float(np.sqrt(np.mean(e * e)) / RTOL), int(sol.stats["num_steps"]),
            int(sol.stats["num_rejected_steps"]))


if __name__ == "__main__":
    import optimistix
    print(f"# diffrax {dfx.__version__}, optimistix {optimistix.__version__}, "
          f"jax {jax.__version__}; rtol {RTOL:g}; made by gen_diffrax_cycles.py")
    for prob in PROBLEMS:
        for name in METHODS:
            err, steps, rej = run(prob, name)
            print(f"{prob} {name} err {err:.4f} steps {steps} rejected {rej}", flush=True)
