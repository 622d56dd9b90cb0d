"""Peer numbers for nabla's stiff ODE solvers, measured with SciPy's solve_ivp (Radau and
BDF) on the stiff test set of tests/ode/oracle/gen_stiff.py (problem definitions, sources and
the reference data: that script's docstring):

  robertson  Robertson's reaction, p = (k1, k2, k3), y0 = (1, 0, 0), t1 = 1e5
  hires      HIRES, 8 species, p = (p1..p12), t1 = 321.8122
  vdp        Van der Pol, unscaled, mu = 1000, p = (mu,), y0 = (2, 0), t1 = 3000
  pollu      POLLU, 20 species, 25 reactions, p = (k1..k25), t1 = 60

Run with build/peers/bin/python (the peers' virtualenv, in which gen_stiff.py made the
reference: numpy and scipy are all it needs), from the repository root:
    build/peers/bin/python benchmarks/peers/scipy_stiff.py [--repeats N]
        [--problems robertson,hires,vdp,pollu] [--rtols 1e-4,1e-6,1e-8]
        [--methods Radau,BDF] [--budget S] [--ref tests/ode/oracle/stiff_ref.txt]
t1, y0, p, the reference end state y1 and the benchmark atol scale s are read from the
reference file ("<problem> t1|y0|p|y1|bench_atol_scale ..." records) at run time. The
right-hand sides and their analytic Jacobians are gen_stiff.py's own (imported from
tests/ode/oracle: its data generation runs only as __main__): <problem>_f and <problem>_jac,
plain Python and NumPy.

For each problem and rtol, atol = rtol * s, and per method
  solve_ivp(<problem>_f, (0, t1), y0, method=<Radau|BDF>, rtol=rtol, atol=atol, args=(p,),
            jac=<problem>_jac)
(default first step and max_step: the solve of gen_stiff.py's benchmark records, whose step
and work counts these reproduce). One call is timed: after a warm-up call, one call is timed
alone and sizes the samples: a sample is the mean of a burst of calls lasting about 20 ms or
more (a call that takes that long is a sample alone, and the timed call is the first); the
median of N samples (default 11, or $NB_BENCH_REPEATS) is reported. Slow cases take fewer
samples so that one case's timing stays under about S seconds (default 4; never fewer than 3
samples), and a "# ..." line says so.

Prints "key value" lines scipy_version, numpy_version, then per problem, rtol and method
  row scipy_<radau|bdf>_<problem>_<e> <median us> <error> <steps>
with <e> = -log10(rtol) (4, 6, 8), steps = sol.t.size - 1 (accepted steps, as in
gen_stiff.py's records), and <error> = sqrt(mean_i ((y_i - y1_i) / (|y1_i| + s))^2) against
the reference end state y1; then "scipy_<method>_<problem>_<e>_counts <nfev> <njev> <nlu>",
and a "# ..." line if steps and counts differ from the file's "<problem> scipy <method>
<rtol> <steps> <nfev> <njev> <nlu> ..." record (gen_stiff.py's run of the same solve).
A solve that fails (sol.success false) gets a "# ..." line with SciPy's message and the t
reached, and no row. SciPy's BDF fails on vdp at tight tolerances ("Required step size is
less than spacing between numbers."): with atol = 1e-3 rtol at rtol 1e-9 (t = 2421.5) and
1e-10 (t = 807.08, the first relaxation jump), not at the default rtols.
"""
import math
import os
import statistics
import sys
import time

import numpy as np
import scipy
from scipy.integrate import solve_ivp

REF = "tests/ode/oracle/stiff_ref.txt"
ORACLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                          "ode", "oracle")
PROBLEMS = ["robertson", "hires", "vdp", "pollu"]
RTOLS = [1e-4, 1e-6, 1e-8]
METHODS = ["Radau", "BDF"]

sys.path.insert(0, os.path.normpath(ORACLE_DIR))
sys.dont_write_bytecode = True  # leave no __pycache__ in tests/ode/oracle
import gen_stiff  # noqa: E402  (defines the problems; generates data only as __main__)
sys.path.pop(0)


def read_reference(path, problems):
    """{problem: {field: [floats]}} for the fields t1, y0, p, y1, bench_atol_scale."""
    want = {"t1", "y0", "p", "y1", "bench_atol_scale"}
    ref = {name: {} for name in problems}
    with open(path) as fh:
        for line in fh:
            w = line.split()
            if len(w) < 3 or w[0].startswith("#") or w[0] not in ref:
                continue
            if w[1] == "scipy" and len(w) >= 8:
                ref[w[0]][("scipy", w[2], float(w[3]))] = [int(v) for v in w[4:8]]
            elif w[1] in want:
                ref[w[0]][w[1]] = [float(v) for v in w[2:]]
    for name in problems:
        for field in sorted(want):
            if field not in ref[name]:
                sys.exit("scipy_stiff.py: no '%s %s' record in %s" % (name, field, path))
    return ref


def solve(name, method, r, rtol, atol):
    return solve_ivp(getattr(gen_stiff, name + "_f"), (0.0, r["t1"][0]), r["y0"],
                     method=method, rtol=rtol, atol=atol, args=(np.array(r["p"]),),
                     jac=getattr(gen_stiff, name + "_jac"))


def solve_error(y, y1, scale):
    y, y1 = np.asarray(y), np.asarray(y1)
    return float(np.sqrt(np.mean(((y - y1) / (np.abs(y1) + scale)) ** 2)))


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
    problems, rtols, methods = list(PROBLEMS), list(RTOLS), list(METHODS)
    budget, ref_path = 4.0, REF
    i = 0
    while i < len(argv):
        opt = argv[i]
        if i + 1 >= len(argv):
            sys.exit("scipy_stiff.py: %s needs a value" % opt)
        val = argv[i + 1]
        if opt == "--repeats":
            repeats = int(val)
        elif opt == "--problems":
            problems = val.split(",")
        elif opt == "--rtols":
            rtols = [float(v) for v in val.split(",")]
        elif opt == "--methods":
            methods = val.split(",")
        elif opt == "--budget":
            budget = float(val)
        elif opt == "--ref":
            ref_path = val
        else:
            sys.exit("scipy_stiff.py: unknown option %r" % opt)
        i += 2
    for n in problems:
        if n not in PROBLEMS:
            sys.exit("scipy_stiff.py: unknown problem %r (known: %s)"
                     % (n, " ".join(PROBLEMS)))
    for m in methods:
        if m not in METHODS:
            sys.exit("scipy_stiff.py: unknown method %r (known: %s)" % (m, " ".join(METHODS)))
    ref = read_reference(ref_path, problems)
    print("scipy_version", scipy.__version__)
    print("numpy_version", np.__version__)
    sys.stdout.flush()
    for name in problems:
        r = ref[name]
        scale = r["bench_atol_scale"][0]
        for rtol in rtols:
            for method in methods:
                key = "scipy_%s_%s_%s" % (method.lower(), name, rtol_key(rtol))
                call = lambda: solve(name, method, r, rtol, rtol * scale)  # noqa: E731
                sol = call()
                if not sol.success:
                    print("# %s failed at t = %.6g of %g after %d steps: %s; no row"
                          % (key, sol.t[-1], r["t1"][0], sol.t.size - 1, sol.message))
                    sys.stdout.flush()
                    continue
                err = solve_error(sol.y[:, -1], r["y1"], scale)
                t0 = time.perf_counter()
                call()
                once = time.perf_counter() - t0
                med, n = timed(call, once, repeats, budget)
                if n < repeats:
                    print("# %s: %d samples, not %d (one call takes %.0f ms)"
                          % (key, n, repeats, once * 1e3))
                print("row %s %.3f %.3g %d" % (key, med, err, sol.t.size - 1))
                print("%s_counts %d %d %d" % (key, sol.nfev, sol.njev, sol.nlu))
                counts = [sol.t.size - 1, sol.nfev, sol.njev, sol.nlu]
                rec = r.get(("scipy", method, rtol))
                if rec is not None and rec != counts:
                    print("# %s: steps nfev njev nlu %s differ from the reference file's %s"
                          % (key, counts, rec))
                sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
