"""Peer numbers for benchmarks/bench_suite.c: the cells of `nabla bench` (tools/bench.c,
tools/bench_problems.c) with Adam, done with JAX + Optax (and Diffrax for the ODE fit), on
the CPU, 1 thread by default.

Run with build/peers/bin/python (the JAX virtualenv of benchmarks/README.md, plus
`pip install optax diffrax`), from the repository root (the UCI problems read data/*.csv):
    build/peers/bin/python benchmarks/peers/optax_suite.py [--steps N] [--lv-steps M]
        [--lr LR] [--samples S] [--cells K] [problem ...]
The problems (all of them when none is named) are those of bench_problems.c, with the same
sizes, dtypes and losses:
  rosenbrock2     f64[2]   sum 100 (x[1:] - x[:-1]^2)^2 + (1 - x[:-1])^2
  rosenbrock100   f64[100] the same
  quadratic       f64[50]  0.5 x^T A x, A = Q^T diag(1 .. 1e4 log-spaced) Q, Q three fixed
                           Householder reflections (bench_problems.c's construction)
  beale           f64[2]   Beale's function
  logreg          f32      w[30], b[]: mean(softplus(z) - y z), z = X w + b, X 455 x 30
                           (data/breast_cancer.csv split 80/20, standardised)
  softmax         f32      w[13, 3], b[3]: mean softmax cross-entropy, X 142 x 13 (wine)
  mlp             f32      Equinox-style MLP 64-32-10 (relu; W [out, in], x W^T + b), mean
                           softmax cross-entropy, X 1438 x 64 (data/digits.csv.gz)
  lotka_volterra  f64      a, b, c, d: the MSE of a Diffrax Tsit5 solve (PIDController rtol =
                           atol = 1e-6, RecursiveCheckpointAdjoint, max_steps 4096,
                           SaveAt(ts = 0.5 .. 10), throw=False) against 20 + 20 noisy
                           observations, parameters clamped to [0.05, 8] (+inf outside)
Every step is step(params, opt_state, data) -> (params, opt_state, loss) =
value_and_grad + optax.adam(LR).update + optax.apply_updates, jax.jit-ed with
donate_argnums=(0, 1), and the loss is read (float(loss): waits for the step) after every
step, as `nabla bench` does. What differs from nabla: the random draws (the split, the
starting points, the MLP's initialisation, the observation noise) come from numpy, not from
nabla's Threefry streams, so values differ; the work per step is the same.

Per problem it prints
  <problem>_cell_s   seconds of a whole cell, the median of K (default 3): setup (data
                     read, split, init), a fresh jax.jit (trace + compile on the first
                     call) and N steps (default 1000; M for lotka_volterra, default 1000)
  <problem>_setup_ms, <problem>_first_ms   the medians of its parts: the setup, and the
                     first step (trace + compile + one run)
  <problem>_step_us  the median over S (default 11) bursts of µs per step, each burst
                     >= 20 ms of steps, taken after the last cell on its compiled step
  <problem>_loss     the loss after the last cell's steps
  <problem>_ode_steps  (lotka_volterra) the steps of the forward solve at the final parameters
and before them jax_version, optax_version, diffrax_version, threads, pinned_cpu. x64 is
enabled (for the f64 problems); the f32 problems' arrays are f32 throughout.
NB_BENCH_THREADS (default 1) sets XLA's CPU threads, as in jax_jit.py; with 1 thread the
process is pinned to one CPU (its lowest allowed one) unless NB_BENCH_PIN=0.
"""
import gzip
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
# One thread: pin the process (and so every thread XLA starts) to one CPU. Unpinned, each
# step's hand-off between the Python thread and XLA's executor thread crosses cores, which on
# an idle 2-core VM costs more than the small steps themselves (NB_BENCH_PIN=0 to see it).
pinned = "none"
if (threads == 1 and os.environ.get("NB_BENCH_PIN", "1") == "1"
        and hasattr(os, "sched_setaffinity")):
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    pinned = str(cpu)

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

try:
    import diffrax  # noqa: E402
except ImportError:  # the ODE problem is then skipped
    diffrax = None

F32, F64 = jnp.float32, jnp.float64

# ---- the problems: setup(rng) -> (params, data), loss(params, data) ----------------------


def rosen_setup(n):
    def setup(rng):
        start = np.tile([-1.2, 1.0], n // 2)
        return {"x": jnp.asarray(start + 0.1 * rng.standard_normal(n), F64)}, ()
    return setup


def rosen_loss(params, data):
    x = params["x"]
    head, tail = x[:-1], x[1:]
    return jnp.sum(100.0 * jnp.square(tail - jnp.square(head)) + jnp.square(1.0 - head))


def quad_matrix(n=50, cond=1e4):
    """bench_problems.c's bp_quad_matrix: Q^T diag(lambda) Q, Q three reflections."""
    q = np.eye(n)
    t = np.arange(n, dtype=np.float64)
    for r in range(3):
        v = np.ones(n) if r == 0 else np.sin(1.0 + t) if r == 1 else np.cos(1.7 * t + 0.4) + 0.5
        q -= np.outer(v, (2.0 / (v @ v)) * (v @ q))
    lam = cond ** (t / (n - 1))
    a = q.T @ (lam[:, None] * q)
    a = np.triu(a) + np.triu(a, 1).T  # exactly symmetric, as the C code
    return a


def quad_setup(rng):
    return ({"x": jnp.asarray(rng.standard_normal(50), F64)},
            {"A": jnp.asarray(quad_matrix(), F64)})


def quad_loss(params, data):
    x = params["x"]
    return 0.5 * jnp.sum(x * (data["A"] @ x))


def beale_setup(rng):
    return {"x": jnp.asarray(1.0 + 0.1 * rng.standard_normal(2), F64)}, ()


def beale_loss(params, data):
    v = params["x"]
    x, y = v[0:1].reshape(()), v[1:2].reshape(())
    total, yk = None, y
    for c in (1.5, 2.25, 2.625):
        term = jnp.square(c - x + x * yk)
        total = term if total is None else total + term
        yk = yk * y
    return total


def read_csv(path):
    """features f64 [n, k], labels i32 [n]; a first line that is not all numbers is the
    header (as nb_csv_load's "n,k,names" line)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        lines = [ln.strip() for ln in fh if ln.strip()]
    try:
        [float(f) for f in lines[0].split(",")]
    except ValueError:
        lines = lines[1:]
    rows = np.array([[float(f) for f in ln.split(",")] for ln in lines])
    return rows[:, :-1], rows[:, -1].astype(np.int32)


def classifier_data(rng, file):
    """nb_data_split (test = the first round(0.2 n) rows of a permutation) and
    nb_data_standardize (training statistics, ddof 0; constant features only centred)."""
    x, y = read_csv(os.path.join("data", file))
    n = x.shape[0]
    n_test = int(np.floor(0.2 * n + 0.5))
    p = rng.permutation(n)
    te, tr = p[:n_test], p[n_test:]
    mean, std = x[tr].mean(axis=0), x[tr].std(axis=0)
    std = np.where(std == 0, 1.0, std)
    xs = (x - mean) / std
    return {"x_train": jnp.asarray(xs[tr], F32), "y_train": jnp.asarray(y[tr], jnp.int32),
            "x_test": jnp.asarray(xs[te], F32), "y_test": jnp.asarray(y[te], jnp.int32)}


def cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.sum(logp * jax.nn.one_hot(labels, logits.shape[-1], dtype=logp.dtype), axis=-1)
    return -jnp.mean(picked)


def logreg_setup(rng):
    data = classifier_data(rng, "breast_cancer.csv")
    k = data["x_train"].shape[1]
    return {"w": jnp.zeros((k,), F32), "b": jnp.zeros((), F32)}, data


def logreg_loss(params, data):
    z = data["x_train"] @ params["w"] + params["b"]
    y = data["y_train"].astype(z.dtype)
    return jnp.mean(jax.nn.softplus(z) - y * z)


def softmax_setup(rng):
    data = classifier_data(rng, "wine_data.csv")
    k = data["x_train"].shape[1]
    return {"w": jnp.zeros((k, 3), F32), "b": jnp.zeros((3,), F32)}, data


def softmax_loss(params, data):
    return cross_entropy(data["x_train"] @ params["w"] + params["b"], data["y_train"])


def mlp_setup(rng):
    data = classifier_data(rng, "digits.csv.gz")
    sizes = [data["x_train"].shape[1], 32, 10]
    layers = []
    for i in range(2):
        lim = 1.0 / np.sqrt(sizes[i])
        layers.append({
            "weight": jnp.asarray(rng.uniform(-lim, lim, (sizes[i + 1], sizes[i])), F32),
            "bias": jnp.asarray(rng.uniform(-lim, lim, (sizes[i + 1],)), F32)})
    return {"layers": layers}, data


def mlp_loss(params, data):
    h = data["x_train"]
    layers = params["layers"]
    for i, layer in enumerate(layers):
        h = h @ layer["weight"].T + layer["bias"]
        if i < len(layers) - 1:
            h = jax.nn.relu(h)
    return cross_entropy(h, data["y_train"])


LV_NAMES = ("a", "b", "c", "d")
LV_TS = 10.0 * np.arange(1, 21) / 20.0
LV_LO, LV_HI = 0.05, 8.0


def lv_field(t, u, args):
    x, y = u["x"], u["y"]
    xy = x * y
    return {"x": args["a"] * x - args["b"] * xy, "y": args["d"] * xy - args["c"] * y}


def lv_solve(params, solver, tol, max_steps, throw):
    one = jnp.asarray(1.0, F64)
    return diffrax.diffeqsolve(
        diffrax.ODETerm(lv_field), solver, 0.0, 10.0, None, {"x": one, "y": one},
        args=params, saveat=diffrax.SaveAt(ts=jnp.asarray(LV_TS, F64)),
        stepsize_controller=diffrax.PIDController(rtol=tol, atol=tol),
        adjoint=diffrax.RecursiveCheckpointAdjoint(), max_steps=max_steps, throw=throw)


def lv_setup(rng):
    truth = {k: jnp.asarray(v, F64) for k, v in zip(LV_NAMES, (1.5, 1.0, 3.0, 1.0))}
    sol = jax.jit(lambda p: lv_solve(p, diffrax.Dopri8(), 1e-10, 65536, True).ys)(truth)
    eps = rng.standard_normal((2, 20))
    data = {"x": jnp.asarray(np.asarray(sol["x"]) + 0.05 * eps[0], F64),
            "y": jnp.asarray(np.asarray(sol["y"]) + 0.05 * eps[1], F64)}
    start = np.array([1.2, 0.8, 2.5, 0.8]) * (1.0 + 0.05 * rng.standard_normal(4))
    return {k: jnp.asarray(v, F64) for k, v in zip(LV_NAMES, start)}, data


def lv_loss(params, data):
    inside = None
    clamped = {}
    for k in LV_NAMES:
        p = params[k]
        ok = (p >= LV_LO) & (p <= LV_HI)
        inside = ok if inside is None else inside & ok
        clamped[k] = jnp.minimum(jnp.maximum(p, LV_LO), LV_HI)
    sol = lv_solve(clamped, diffrax.Tsit5(), 1e-6, 4096, False)
    rx = sol.ys["x"] - data["x"]
    ry = sol.ys["y"] - data["y"]
    mse = (jnp.mean(jnp.square(rx)) + jnp.mean(jnp.square(ry))) * 0.5
    ok = inside & (sol.result == diffrax.RESULTS.successful)
    return jnp.where(ok, mse, jnp.asarray(jnp.inf, F64))


PROBLEMS = {
    "rosenbrock2": (rosen_setup(2), rosen_loss),
    "rosenbrock100": (rosen_setup(100), rosen_loss),
    "quadratic": (quad_setup, quad_loss),
    "beale": (beale_setup, beale_loss),
    "logreg": (logreg_setup, logreg_loss),
    "softmax": (softmax_setup, softmax_loss),
    "mlp": (mlp_setup, mlp_loss),
    "lotka_volterra": (lv_setup, lv_loss),
}

# ---- one cell ----------------------------------------------------------------------------


def make_step(loss, lr):
    """A fresh jitted step (new function objects: no cache hit from an earlier cell)."""
    tx = optax.adam(lr)

    def step(params, state, data):
        value, grads = jax.value_and_grad(loss)(params, data)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value
    return tx, jax.jit(step, donate_argnums=(0, 1))


def cell(name, steps, lr):
    """One whole cell: (seconds, setup s, first step s, step, params, state, data, loss)."""
    setup, loss = PROBLEMS[name]
    t0 = time.perf_counter()
    params, data = setup(np.random.default_rng(0))
    tx, step = make_step(loss, lr)
    state = tx.init(params)
    t1 = time.perf_counter()
    value = None
    for i in range(steps):
        params, state, value = step(params, state, data)
        value = float(value)  # waits for the step, as nabla bench reads every loss
        if i == 0:
            t2 = time.perf_counter()
    return time.perf_counter() - t0, t1 - t0, t2 - t1, step, params, state, data, value


def run(name, steps, lr, samples, cells):
    runs = [cell(name, steps, lr) for _ in range(cells)]
    _, _, _, step, params, state, data, value = runs[-1]
    print("%s_cell_s %.6f" % (name, statistics.median(r[0] for r in runs)))
    print("%s_setup_ms %.3f" % (name, statistics.median(r[1] for r in runs) * 1e3))
    print("%s_first_ms %.3f" % (name, statistics.median(r[2] for r in runs) * 1e3))
    print("%s_loss %r" % (name, value))
    sys.stdout.flush()
    # per step, on the compiled step: bursts of >= 20 ms
    t0 = time.perf_counter()
    params, state, value = step(params, state, data)
    float(value)
    inner = max(1, int(0.02 / max(time.perf_counter() - t0, 1e-9)))
    s = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            params, state, value = step(params, state, data)
            float(value)
        s.append((time.perf_counter() - t0) / inner * 1e6)
    print("%s_step_us %.3f" % (name, statistics.median(s)))
    if name == "lotka_volterra":
        clamped = {k: jnp.clip(params[k], LV_LO, LV_HI) for k in LV_NAMES}
        st = jax.jit(lambda p: lv_solve(p, diffrax.Tsit5(), 1e-6, 4096, False).stats)(clamped)
        print("%s_ode_steps %d" % (name, int(st["num_steps"])))
    sys.stdout.flush()


def main(argv):
    steps, lv_steps, lr, samples, cells = 1000, 1000, 1e-2, 11, 3
    names = []
    i = 0
    while i < len(argv):
        options = ("--steps", "--lv-steps", "--lr", "--samples", "--cells")
        if argv[i] in options and i + 1 < len(argv):
            v = argv[i + 1]
            if argv[i] == "--steps":
                steps = int(v)
            elif argv[i] == "--lv-steps":
                lv_steps = int(v)
            elif argv[i] == "--lr":
                lr = float(v)
            elif argv[i] == "--cells":
                cells = int(v)
            else:
                samples = int(v)
            i += 2
        else:
            if argv[i] not in PROBLEMS:
                sys.exit("optax_suite.py: unknown problem %r (known: %s)"
                         % (argv[i], " ".join(PROBLEMS)))
            names.append(argv[i])
            i += 1
    print("jax_version", jax.__version__)
    print("optax_version", optax.__version__)
    print("diffrax_version", diffrax.__version__ if diffrax is not None else "missing")
    print("threads", threads)
    print("pinned_cpu", pinned)
    sys.stdout.flush()
    # the backend and JAX's own first-use costs, outside every cell
    jax.jit(lambda x: x + 1)(jnp.zeros(4, F32)).block_until_ready()
    for name in names or list(PROBLEMS):
        if name == "lotka_volterra" and diffrax is None:
            continue
        run(name, lv_steps if name == "lotka_volterra" else steps, lr, samples, cells)


if __name__ == "__main__":
    main(sys.argv[1:])
