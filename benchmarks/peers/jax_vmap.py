"""Peer numbers for benchmarks/bench_vmap.c, measured with JAX (and Diffrax) on the CPU, 1
thread by default.

Run with build/peers/bin/python (the JAX virtualenv of benchmarks/README.md, with diffrax),
from anywhere:
    build/peers/bin/python benchmarks/peers/jax_vmap.py [--samples S] [--lanes N] [name ...]
The names (all when none is given):
  pex       per-example gradients of an MLP 784-256-256-10 (tanh hidden layers, each
            example's own cross-entropy of log_softmax), f32, batch 128:
            jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))); weights uniform in
            +-1/sqrt(fan_in), biases 0, x standard normal, labels (7 i + 3) mod 10 (numpy's
            draws: the values differ from bench_vmap's, the work does not)
  lv_solve  N (default 1000) Lotka-Volterra solves, f64, Tsit5, PIDController(rtol=atol=1e-8),
            t in [0, 10], dt0 = 0.01, SaveAt(t1=True), max_steps 4096, one lane per parameter
            set of bench_vmap's grid: lane i has a = 1.2 + 0.6 (i mod 40) / 39, b = 1,
            c = 2.5 + (i div 40) / 24, d = 1, x0 = y0 = 1 (wrapping after 1,000 lanes):
            jax.jit(jax.vmap(solve)) -> (x(10), y(10)) and the steps of every lane
  lv_grad   every lane's gradient of G = x(10) + y(10) w.r.t. its (a, b, c, d, x0, y0):
            jax.jit(jax.vmap(jax.grad(G))), RecursiveCheckpointAdjoint (Diffrax's default)
Each is compiled first; a timed call waits for its outputs (block_until_ready); each sample
is the mean over a burst of >= 20 ms of calls, S (default 11) samples, medians printed.

Prints "key value" lines: jax_version, diffrax_version, threads, then
  <name>_us          median µs per call
  <name>_first_ms    the first call: trace + compile + one run
  lv_steps_total     the lanes' accepted steps summed; lv_sum   sum over the lanes of G
  lv_grad_sum        the gradients' entries summed (a check against nabla's)
NB_BENCH_THREADS (default 1) sets XLA's CPU threads; with 1 thread the process is pinned
to one CPU unless NB_BENCH_PIN=0 (as jax_mlp_step.py).
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
if (threads == 1 and os.environ.get("NB_BENCH_PIN", "1") == "1"
        and hasattr(os, "sched_setaffinity")):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def med_us(fn, samples):
    fn()
    t0 = time.perf_counter()
    fn()
    once = time.perf_counter() - t0
    inner = max(1, int(0.02 / max(once, 1e-9)))
    s = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        s.append((time.perf_counter() - t0) / inner * 1e6)
    return statistics.median(s)


def first_ms(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def pex(samples):
    rng = np.random.default_rng(0)
    sizes = [784, 256, 256, 10]
    params = []
    for i in range(3):
        r = 1.0 / np.sqrt(sizes[i])
        params.append((jnp.asarray(rng.uniform(-r, r, (sizes[i], sizes[i + 1])), jnp.float32),
                       jnp.zeros((sizes[i + 1],), jnp.float32)))
    x = jnp.asarray(rng.standard_normal((128, 784)), jnp.float32)
    y = jnp.asarray([(7 * i + 3) % 10 for i in range(128)], jnp.int32)

    def loss(p, xi, yi):
        h = xi
        for k, (w, b) in enumerate(p):
            h = h @ w + b
            if k < 2:
                h = jnp.tanh(h)
        return -jax.nn.log_softmax(h)[yi]

    f = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))
    call = lambda: jax.block_until_ready(f(params, x, y))  # noqa: E731
    print("pex_first_ms %.1f" % first_ms(call))
    print("pex_us %.1f" % med_us(call, samples))


def lv_params(n):
    p = np.zeros((n, 6))
    for i in range(n):
        k = i % 1000
        p[i] = [1.2 + 0.6 * (k % 40) / 39.0, 1.0, 2.5 + (k // 40) / 24.0, 1.0, 1.0, 1.0]
    return jnp.asarray(p)


def vf(t, u, args):
    a, b, c, d = args
    return jnp.stack([a * u[0] - b * u[0] * u[1], -c * u[1] + d * u[0] * u[1]])


TERM = diffrax.ODETerm(vf)


def solve(p):
    return diffrax.diffeqsolve(
        TERM, diffrax.Tsit5(), 0.0, 10.0, 0.01, p[4:6], args=(p[0], p[1], p[2], p[3]),
        saveat=diffrax.SaveAt(t1=True),
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8), max_steps=4096)


def lv(name, samples, lanes):
    p = lv_params(lanes)
    if name == "lv_solve":
        def one(q):
            sol = solve(q)
            return sol.ys[0], sol.stats["num_accepted_steps"]
        f = jax.jit(jax.vmap(one))
        call = lambda: jax.block_until_ready(f(p))  # noqa: E731
        print("lv_solve_first_ms %.1f" % first_ms(call))
        ys, steps = call()
        print("lv_steps_total %d" % int(jnp.sum(steps)))
        print("lv_sum %.17g" % float(jnp.sum(ys)))
        print("lv_solve_us %.1f" % med_us(call, samples))
    else:
        def G(q):
            ys = solve(q).ys
            return ys[0, 0] + ys[0, 1]
        f = jax.jit(jax.vmap(jax.grad(G)))
        call = lambda: jax.block_until_ready(f(p))  # noqa: E731
        print("lv_grad_first_ms %.1f" % first_ms(call))
        print("lv_grad_sum %.17g" % float(jnp.sum(call())))
        print("lv_grad_us %.1f" % med_us(call, samples))


def main(argv):
    samples, lanes, names = 11, 1000, []
    i = 0
    while i < len(argv):
        if argv[i] == "--samples":
            samples = int(argv[i + 1])
            i += 2
        elif argv[i] == "--lanes":
            lanes = int(argv[i + 1])
            i += 2
        else:
            names.append(argv[i])
            i += 1
    known = ["pex", "lv_solve", "lv_grad"]
    for n in names:
        if n not in known:
            sys.exit("jax_vmap.py: unknown measurement %r (known: %s)" % (n, " ".join(known)))
    print("jax_version", jax.__version__)
    print("diffrax_version", diffrax.__version__)
    print("threads", threads)
    sys.stdout.flush()
    for n in names or known:
        if n == "pex":
            pex(samples)
        else:
            lv(n, samples, lanes)
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
