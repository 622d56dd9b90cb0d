"""Peer numbers for benchmarks/bench_suite.c: the cells of `nabla bench` (tools/bench.c,
tools/bench_problems.c) with Adam, done with JAX + Optax (and Diffrax for the ODE fit), on
the CPU, 1 thread by default.

Run with build/peers/bin/python (the JAX virtualenv of benchmarks/README.md, plus
`pip install optax diffrax`), from the repository root (the UCI problems read data/*.csv):
    build/peers/bin/python benchmarks/peers/optax_suite.py [--steps N] [--lv-steps M]
        [--lr LR] [--samples S] [--cells K] [problem ...]
The problems (all of them when none is named) are those of bench_problems.c, with the same
sizes, dtypes and losses, first the full-batch ones:
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
and the stochastic ones, each step on a minibatch of `batch` rows of the training split
(bench_problems.c's: the UCI and text splits put the full-batch test rows (20 %) aside, then
split the rest 80/20 into train and valid; features standardised with the training rows'
statistics):
  logreg_mb          logreg's model and loss; batch 16 of 364 training rows
  mlp_mb             mlp's model and loss; batch 32 of 1150 training rows
  cnn_mb             the digits as [B, 1, 8, 8]: Conv2d 1 -> 8 3x3 SAME (+ bias; lax.
                     conv_general_dilated, NCHW / OIHW), relu, max pool 2x2 stride 2 (lax.
                     reduce_window) -> [B, 8, 4, 4], flatten (128), Linear 128 -> 10; mean
                     softmax cross-entropy; batch 32 of 1150; Equinox's init
  char_gru           data/tinyshakespeare.txt.gz: the first 1985 * 17 characters as 1985
                     windows i32[17] (codes: the index in the file's sorted byte alphabet,
                     65), 1270 training windows; Embedding(65, 16) -> Equinox's GRUCell(16,
                     64) (weight_ih [3H, in], weight_hh [3H, H], bias [3H], bias_n [H]) over
                     the 16 inputs with lax.scan from h0 = 0 -> Linear(64, 65) on every step's
                     h; mean cross-entropy of the 16 next characters; batch 32
  noisy_quadratic    f32 theta[100] = 1 + N(0, 0.1^2); rows x ~ N(0, I_100) f32 (1000
                     training); mean over the rows of 0.5 (theta - x)^T H (theta - x), H =
                     Q^T diag(lambda) Q f32 (quadratic's Q; lambda k / 90, k = 1 .. 90, and
                     30 + 30 j / 9, j = 0 .. 9), H passed with every minibatch; batch 128
  lotka_volterra_mb  lotka_volterra's fit (same solve, box and +inf) against observation
                     sets f64[2, 20] (64 training sets: the accurate solve plus each its own
                     N(0, 0.05^2) noise); loss the mean over [B, 2, 20] of (pred - obs)^2,
                     pred = stack(ys.x, ys.y); batch 4
Every step is step(params, opt_state, data) -> (params, opt_state, loss) =
value_and_grad + optax.adam(LR).update + optax.apply_updates, jax.jit-ed with
donate_argnums=(0, 1), and the loss is read (float(loss): waits for the step) after every
step, as `nabla bench` does. What differs from nabla: the random draws (the split, the
starting points, the MLP's initialisation, the observation noise, the minibatches' order)
come from numpy, not from nabla's Threefry streams, so values differ; the work per step is
the same.

Minibatches (class Batches), as nabla's batcher with drop_last: epoch e is a fresh numpy
permutation of the n training rows (drawn on the host once per epoch, from its own stream,
default_rng((0, 5))), its consecutive `batch`-row slices are the epoch's steps, the n %
batch rows left over are dropped. NB_BENCH_FEED chooses how a step gets its rows:
  index (default)  the training split is put on the device once (in the setup); each step
                   is passed the whole split (device arrays, not copied) and that step's row
                   indices (a numpy int32[batch], transferred with the call) and gathers the
                   rows inside the jitted step (x[idx]: an XLA gather, which needs no
                   gradient)
  host             each step is passed the rows gathered on the host by numpy (x[idx]), as
                   nabla's batcher copies them into its batch buffers
Measured interleaved (2-core VM, under load), index was as fast as host or faster (by ~5-20
us per step on logreg_mb, mlp_mb, noisy_quadratic), so it is the default; a third variant,
each epoch's minibatches pre-gathered on the device by one jitted gather per epoch and passed
as ready device arrays, was no faster per step and added ~1 s of compile to the first step.

Per problem it prints
  <problem>_cell_s   seconds of a whole cell, the median of K (default 3): setup (data
                     read, split, init), a fresh jax.jit (trace + compile on the first
                     call) and N steps (default 1000; M for lotka_volterra, default 1000)
  <problem>_setup_ms, <problem>_first_ms   the medians of its parts: the setup, and the
                     first step (trace + compile + one run)
  <problem>_step_us  the median over S (default 11) bursts of µs per step, each burst
                     >= 20 ms of steps, taken after the last cell on its compiled step
  <problem>_loss     the loss after the last cell's steps
  <problem>_ode_steps  (lotka_volterra, lotka_volterra_mb) the steps of the forward solve at
                     the final parameters
and before them jax_version, optax_version, diffrax_version, threads, pinned_cpu,
minibatch_feed. x64 is enabled (for the f64 problems); the f32 problems' arrays are f32
throughout. A stochastic problem's cell_s and step_us include handing out the minibatches
(the permutation per epoch, the indices per step); its setup the split's transfer to the
device; the --lv-steps count applies to lotka_volterra only (lotka_volterra_mb takes --steps,
as in bench_suite.c).
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


def quad_matrix(n=50, cond=1e4, eig=None):
    """bench_problems.c's bp_quad_matrix: Q^T diag(lambda) Q, Q three reflections; lambda
    log-spaced 1 .. cond, or the n values eig."""
    q = np.eye(n)
    t = np.arange(n, dtype=np.float64)
    for r in range(3):
        v = np.ones(n) if r == 0 else np.sin(1.0 + t) if r == 1 else np.cos(1.7 * t + 0.4) + 0.5
        q -= np.outer(v, (2.0 / (v @ v)) * (v @ q))
    lam = cond ** (t / (n - 1)) if eig is None else np.asarray(eig, np.float64)
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


# ---- the stochastic problems: minibatches of the training split ---------------------------
# setup(rng) -> (params, splits, const): splits = dict(train, valid, test) of dicts of numpy
# rows (x[, y]), const = the arrays every minibatch carries (noisy_quadratic's H); the loss
# is loss(params, batch) with batch = dict(x[, y], **const) of `batch` rows.

STREAM_BATCH = 5  # bench_problems.h's BENCH_STREAM_BATCH: the minibatches' own stream


def split_rows(rng, n):
    """bench_problems.c's splits of n rows: test = the first round(0.2 n) of a permutation,
    the rest split the same way into valid (the first round(0.2 m)) and train.
    Returns the row indices (train, valid, test)."""
    n_test = int(np.floor(0.2 * n + 0.5))
    p = rng.permutation(n)
    te, rest = p[:n_test], p[n_test:]
    m = rest.shape[0]
    n_valid = int(np.floor(0.2 * m + 0.5))
    q = rng.permutation(m)
    return rest[q[n_valid:]], rest[q[:n_valid]], te


def csv_splits(rng, file):
    """bp_csv_splits: the file split test / valid / train, features standardised (f32) with
    the training rows' statistics (ddof 0; constant features only centred)."""
    x, y = read_csv(os.path.join("data", file))
    tr, va, te = split_rows(rng, x.shape[0])
    mean, std = x[tr].mean(axis=0), x[tr].std(axis=0)
    std = np.where(std == 0, 1.0, std)
    xs = ((x - mean) / std).astype(np.float32)
    return {name: {"x": xs[rows], "y": y[rows]}
            for name, rows in (("train", tr), ("valid", va), ("test", te))}


def uniform(rng, lim, shape):
    return jnp.asarray(rng.uniform(-lim, lim, shape), F32)


def logreg_mb_setup(rng):
    splits = csv_splits(rng, "breast_cancer.csv")
    k = splits["train"]["x"].shape[1]
    return {"w": jnp.zeros((k,), F32), "b": jnp.zeros((), F32)}, splits, {}


def logreg_mb_loss(params, batch):
    z = batch["x"] @ params["w"] + params["b"]
    y = batch["y"].astype(z.dtype)
    return jnp.mean(jax.nn.softplus(z) - y * z)


def mlp_mb_setup(rng):
    splits = csv_splits(rng, "digits.csv.gz")
    sizes = [splits["train"]["x"].shape[1], 32, 10]
    layers = []
    for i in range(2):
        lim = 1.0 / np.sqrt(sizes[i])
        layers.append({"weight": uniform(rng, lim, (sizes[i + 1], sizes[i])),
                       "bias": uniform(rng, lim, (sizes[i + 1],))})
    return {"layers": layers}, splits, {}


def mlp_mb_loss(params, batch):
    return mlp_loss(params, {"x_train": batch["x"], "y_train": batch["y"]})


CNN_CHANNELS = 8


def cnn_setup(rng):
    """Conv2d 1 -> 8 (3x3, SAME, bias [8, 1, 1]), Linear 128 -> 10; Equinox's init (uniform
    +-1/sqrt(fan_in), weight and bias alike)."""
    splits = csv_splits(rng, "digits.csv.gz")
    lim = 1.0 / np.sqrt(1 * 3 * 3)
    flat = CNN_CHANNELS * 4 * 4
    return ({"conv": {"weight": uniform(rng, lim, (CNN_CHANNELS, 1, 3, 3)),
                      "bias": uniform(rng, lim, (CNN_CHANNELS, 1, 1))},
             "out": {"weight": uniform(rng, 1.0 / np.sqrt(flat), (10, flat)),
                     "bias": uniform(rng, 1.0 / np.sqrt(flat), (10,))}},
            splits, {})


def cnn_loss(params, batch):
    x = batch["x"].reshape(-1, 1, 8, 8)
    h = jax.lax.conv_general_dilated(x, params["conv"]["weight"], (1, 1), "SAME",
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    h = jax.nn.relu(h + params["conv"]["bias"])
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    h = h.reshape(h.shape[0], -1)
    return cross_entropy(h @ params["out"]["weight"].T + params["out"]["bias"], batch["y"])


GRU_T, GRU_WINDOWS, GRU_EMB, GRU_HIDDEN = 16, 1985, 16, 64


def gru_setup(rng):
    """The first 1985 * 33 characters of Tiny Shakespeare as windows i32[1985, 33] (codes:
    the index in the whole file's sorted byte alphabet, 65), split as the classifiers';
    Embedding(65, 16) (N(0, 1)), Equinox's GRUCell(16, 64) (weight_ih [3H, in], weight_hh
    [3H, H], bias [3H], bias_n [H], uniform +-1/sqrt(H)), Linear(64, 65)."""
    with gzip.open(os.path.join("data", "tinyshakespeare.txt.gz"), "rb") as fh:
        text = np.frombuffer(fh.read(), np.uint8)
    present = np.bincount(text, minlength=256) > 0
    vocab = int(present.sum())
    code = (np.cumsum(present) - 1).astype(np.int32)  # byte -> its index in the alphabet
    w = code[text[:GRU_WINDOWS * (GRU_T + 1)]].reshape(GRU_WINDOWS, GRU_T + 1)
    tr, va, te = split_rows(rng, GRU_WINDOWS)
    splits = {"train": {"x": w[tr]}, "valid": {"x": w[va]}, "test": {"x": w[te]}}
    lim = 1.0 / np.sqrt(GRU_HIDDEN)
    h3 = 3 * GRU_HIDDEN
    return ({"emb": {"weight": jnp.asarray(rng.standard_normal((vocab, GRU_EMB)), F32)},
             "gru": {"weight_ih": uniform(rng, lim, (h3, GRU_EMB)),
                     "weight_hh": uniform(rng, lim, (h3, GRU_HIDDEN)),
                     "bias": uniform(rng, lim, (h3,)),
                     "bias_n": uniform(rng, lim, (GRU_HIDDEN,))},
             "out": {"weight": uniform(rng, lim, (vocab, GRU_HIDDEN)),
                     "bias": uniform(rng, lim, (vocab,))}},
            splits, {})


def gru_loss(params, batch):
    w = batch["x"]
    inp, tgt = w[:, :GRU_T], w[:, 1:].T  # [B, T], [T, B]
    xs = jnp.transpose(jnp.take(params["emb"]["weight"], inp, axis=0), (1, 0, 2))  # [T, B, E]
    g = params["gru"]
    hid = GRU_HIDDEN

    def cell(h, x):  # Equinox's GRUCell, over the batch's rows
        ig = x @ g["weight_ih"].T + g["bias"]
        hg = h @ g["weight_hh"].T
        r = jax.nn.sigmoid(ig[:, :hid] + hg[:, :hid])
        z = jax.nn.sigmoid(ig[:, hid:2 * hid] + hg[:, hid:2 * hid])
        n = jnp.tanh(ig[:, 2 * hid:] + r * (hg[:, 2 * hid:] + g["bias_n"]))
        h = n + z * (h - n)
        return h, h

    h0 = jnp.zeros((w.shape[0], hid), xs.dtype)
    _, hs = jax.lax.scan(cell, h0, xs)  # [T, B, H]
    logits = hs @ params["out"]["weight"].T + params["out"]["bias"]
    ll = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tgt[:, :, None], axis=2)
    return -jnp.mean(ll)


NQ_N, NQ_ROWS = 100, (1000, 250, 1000)


def nq_setup(rng):
    """DeepOBS's noisy quadratic: H = Q^T diag(lambda) Q (f32; lambda k / 90, k = 1 .. 90,
    and 30 + 30 j / 9, j = 0 .. 9; Q the quadratic's reflections), rows N(0, I_100) f32,
    theta = 1 + N(0, 0.1^2)."""
    lam = [(k + 1) / 90.0 if k < 90 else 30.0 + 30.0 * (k - 90) / 9.0 for k in range(NQ_N)]
    h = jnp.asarray(quad_matrix(NQ_N, 0.0, lam), F32)
    theta = jnp.asarray(1.0 + 0.1 * rng.standard_normal(NQ_N), F32)
    splits = {name: {"x": rng.standard_normal((rows, NQ_N)).astype(np.float32)}
              for name, rows in zip(("train", "valid", "test"), NQ_ROWS)}
    return {"theta": theta}, splits, {"H": h}


def nq_loss(params, batch):
    r = params["theta"] - batch["x"]  # [B, 100]
    return 0.5 * jnp.mean(jnp.sum((r @ batch["H"]) * r, axis=1))


LVN_ROWS = (64, 16, 16)


def lvn_setup(rng):
    """Observation sets f64[2, 20] (x then y), each the accurate solve at the truth plus its
    own N(0, 0.05^2) noise (train 64, valid 16, test 16); the start as lotka_volterra's."""
    truth = {k: jnp.asarray(v, F64) for k, v in zip(LV_NAMES, (1.5, 1.0, 3.0, 1.0))}
    sol = jax.jit(lambda p: lv_solve(p, diffrax.Dopri8(), 1e-10, 65536, True).ys)(truth)
    clean = np.stack([np.asarray(sol["x"]), np.asarray(sol["y"])])  # [2, 20]
    splits = {name: {"x": clean + 0.05 * rng.standard_normal((rows, 2, 20))}
              for name, rows in zip(("train", "valid", "test"), LVN_ROWS)}
    start = np.array([1.2, 0.8, 2.5, 0.8]) * (1.0 + 0.05 * rng.standard_normal(4))
    return {k: jnp.asarray(v, F64) for k, v in zip(LV_NAMES, start)}, splits, {}


def lvn_loss(params, batch):
    inside = None
    clamped = {}
    for k in LV_NAMES:
        p = params[k]
        ok = (p >= LV_LO) & (p <= LV_HI)
        inside = ok if inside is None else inside & ok
        clamped[k] = jnp.minimum(jnp.maximum(p, LV_LO), LV_HI)
    sol = lv_solve(clamped, diffrax.Tsit5(), 1e-6, 4096, False)
    pred = jnp.stack([sol.ys["x"], sol.ys["y"]])  # [2, 20]
    mse = jnp.mean(jnp.square(pred - batch["x"]))  # over [B, 2, 20]
    ok = inside & (sol.result == diffrax.RESULTS.successful)
    return jnp.where(ok, mse, jnp.asarray(jnp.inf, F64))


# NB_BENCH_FEED: how the minibatches reach the step (see Batches and the docstring)
FEED = os.environ.get("NB_BENCH_FEED", "index")


class Batches:
    """nabla's batcher (nb_batcher, drop_last) over the training split: epoch e is a fresh
    permutation of the n rows (numpy, on the host, one per epoch), batch i its rows
    [i b, (i + 1) b), the n % b rows left over dropped.
    FEED "index" (the default): the split is put on the device once, at setup; a step is
      passed the whole split (device arrays: nothing copied) and its b row indices (a numpy
      int32[b] slice of the epoch's permutation, transferred with the call), and gathers the
      rows itself inside the jitted step (batch_loss).
    FEED "host": a step is passed the rows themselves, gathered on the host with numpy
      (x[idx], as nabla's batcher copies them into its batch buffers) and transferred with
      the call.
    next() -> the step's data argument."""

    def __init__(self, rng, train, const, batch):
        self.rng, self.batch, self.const = rng, batch, const
        self.n = next(iter(train.values())).shape[0]
        self.per_epoch = self.n // batch
        self.rows = train if FEED == "host" else {k: jnp.asarray(v) for k, v in train.items()}
        self.i = self.per_epoch  # the first next() starts epoch 0

    def next(self):
        if self.i == self.per_epoch:
            perm = self.rng.permutation(self.n)[:self.per_epoch * self.batch]
            self.idx = perm.astype(np.int32).reshape(self.per_epoch, self.batch)
            self.i = 0
        idx = self.idx[self.i]
        self.i += 1
        if FEED == "host":
            return dict({k: v[idx] for k, v in self.rows.items()}, **self.const)
        return {"rows": self.rows, "idx": idx, "const": self.const}


def batch_loss(loss):
    """loss(params, batch) as the step's loss of its data argument (FEED)."""
    if FEED == "host":
        return loss

    def indexed(params, data):
        rows = {k: v[data["idx"]] for k, v in data["rows"].items()}
        return loss(params, dict(rows, **data["const"]))
    return indexed


STOCHASTIC = {  # name: (setup, loss, batch)
    "logreg_mb": (logreg_mb_setup, logreg_mb_loss, 16),
    "mlp_mb": (mlp_mb_setup, mlp_mb_loss, 32),
    "cnn_mb": (cnn_setup, cnn_loss, 32),
    "char_gru": (gru_setup, gru_loss, 32),
    "noisy_quadratic": (nq_setup, nq_loss, 128),
    "lotka_volterra_mb": (lvn_setup, lvn_loss, 4),
}


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
    if name in STOCHASTIC:
        return cell_mb(name, steps, lr)
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


def cell_mb(name, steps, lr):
    """One whole cell of a stochastic problem: as cell(), each step on the next minibatch;
    the setup includes the split's transfer to the device and the batcher; the data
    returned is the batcher (the Batches)."""
    setup, loss, batch = STOCHASTIC[name]
    t0 = time.perf_counter()
    params, splits, const = setup(np.random.default_rng(0))
    batches = Batches(np.random.default_rng((0, STREAM_BATCH)), splits["train"], const, batch)
    tx, step = make_step(batch_loss(loss), lr)
    state = tx.init(params)
    t1 = time.perf_counter()
    value = None
    for i in range(steps):
        params, state, value = step(params, state, batches.next())
        value = float(value)
        if i == 0:
            t2 = time.perf_counter()
    return time.perf_counter() - t0, t1 - t0, t2 - t1, step, params, state, batches, value


def run(name, steps, lr, samples, cells):
    runs = [cell(name, steps, lr) for _ in range(cells)]
    _, _, _, step, params, state, data, value = runs[-1]
    if name in STOCHASTIC:
        return run_mb(name, step, params, state, data, value, runs, samples)
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


def run_mb(name, step, params, state, batches, value, runs, samples):
    """run() for a stochastic problem: the same keys, every step on the next minibatch."""
    print("%s_cell_s %.6f" % (name, statistics.median(r[0] for r in runs)))
    print("%s_setup_ms %.3f" % (name, statistics.median(r[1] for r in runs) * 1e3))
    print("%s_first_ms %.3f" % (name, statistics.median(r[2] for r in runs) * 1e3))
    print("%s_loss %r" % (name, value))
    sys.stdout.flush()
    t0 = time.perf_counter()
    params, state, value = step(params, state, batches.next())
    float(value)
    inner = max(1, int(0.02 / max(time.perf_counter() - t0, 1e-9)))
    s = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            params, state, value = step(params, state, batches.next())
            float(value)
        s.append((time.perf_counter() - t0) / inner * 1e6)
    print("%s_step_us %.3f" % (name, statistics.median(s)))
    if name == "lotka_volterra_mb":
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
            if argv[i] not in PROBLEMS and argv[i] not in STOCHASTIC:
                sys.exit("optax_suite.py: unknown problem %r (known: %s)"
                         % (argv[i], " ".join(list(PROBLEMS) + list(STOCHASTIC))))
            names.append(argv[i])
            i += 1
    print("jax_version", jax.__version__)
    print("optax_version", optax.__version__)
    print("diffrax_version", diffrax.__version__ if diffrax is not None else "missing")
    print("threads", threads)
    print("pinned_cpu", pinned)
    print("minibatch_feed", FEED)
    sys.stdout.flush()
    # the backend and JAX's own first-use costs, outside every cell
    jax.jit(lambda x: x + 1)(jnp.zeros(4, F32)).block_until_ready()
    if FEED not in ("index", "host"):
        sys.exit("optax_suite.py: NB_BENCH_FEED is %r (index or host)" % FEED)
    for name in names or list(PROBLEMS) + list(STOCHASTIC):
        if name in ("lotka_volterra", "lotka_volterra_mb") and diffrax is None:
            continue
        run(name, lv_steps if name == "lotka_volterra" else steps, lr, samples, cells)


if __name__ == "__main__":
    main(sys.argv[1:])
