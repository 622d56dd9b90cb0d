"""Peer numbers for benchmarks/bench_native.c: one Adam train step of bench_train's two MLPs,
done with JAX + Optax on the CPU, 1 thread by default.

Run with build/peers/bin/python (the JAX virtualenv of benchmarks/README.md, plus
`pip install optax`), from anywhere:
    build/peers/bin/python benchmarks/peers/jax_mlp_step.py [--samples S] [name ...]
The names (both when none is given):
  tiny   MLP 2-32-32-1, batch 16, f32, tanh hidden layers, mean squared error; x uniform in
         [-1, 1), targets sin(2 x0) cos(x1)
  mlp    MLP 784-256-256-10, batch 128, f32, tanh hidden layers, mean cross-entropy of
         log_softmax; x standard normal, labels (7 i + 3) mod 10
Weights uniform in +-1/sqrt(fan_in), biases 0, as bench_train (numpy's draws, not nabla's:
the values differ, the work does not). One step is step(params, opt_state, batch) ->
(params, opt_state, loss) = jax.value_and_grad of the loss, optax.adam(1e-3).update,
optax.apply_updates, jax.jit-ed with donate_argnums=(0, 1) and compiled first; a timed call
ends when its outputs are ready (jax.block_until_ready). Each sample is the mean over a burst
of >= 20 ms of steps, S (default 21) samples; the medians are printed.

Prints "key value" lines: jax_version, optax_version, threads, pinned_cpu, then
  <name>_step_us     median µs per step
  <name>_first_ms    the first call of a fresh jax.jit of the step: trace + compile + one run
  <name>_loss_first, <name>_loss_last   the loss at the first and at the last step run
NB_BENCH_THREADS (default 1) sets XLA's CPU threads, as in jax_jit.py; with 1 thread the
process is pinned to one CPU (its lowest allowed one) unless NB_BENCH_PIN=0, as in
optax_suite.py (unpinned, the hand-off between Python and XLA's threads crosses cores).
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
pinned = "none"
if (threads == 1 and os.environ.get("NB_BENCH_PIN", "1") == "1"
        and hasattr(os, "sched_setaffinity")):
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    pinned = str(cpu)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

LR = 1e-3


def init(sizes, batch, tiny, seed):
    rng = np.random.default_rng(seed)
    params = []
    for i in range(3):
        r = 1.0 / np.sqrt(sizes[i])
        params.append({"w": jnp.asarray(rng.uniform(-r, r, (sizes[i], sizes[i + 1])),
                                        jnp.float32),
                       "b": jnp.zeros((sizes[i + 1],), jnp.float32)})
    if tiny:
        x = rng.uniform(-1.0, 1.0, (batch, sizes[0])).astype(np.float32)
        y = (np.sin(2.0 * x[:, 0]) * np.cos(x[:, 1])).astype(np.float32)[:, None]
        return params, (jnp.asarray(x), jnp.asarray(y))
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = (7 * np.arange(batch) + 3) % 10
    return params, (jnp.asarray(x), jnp.asarray(y, jnp.int32))


def logits(params, x):
    h = x
    for i, layer in enumerate(params):
        h = h @ layer["w"] + layer["b"]
        if i < 2:
            h = jnp.tanh(h)
    return h


def loss_tiny(params, batch):
    x, y = batch
    return jnp.mean(jnp.square(logits(params, x) - y))


def loss_mlp(params, batch):
    x, y = batch
    logp = jax.nn.log_softmax(logits(params, x), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))


def make_step(loss, opt):
    def step(params, state, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value
    return jax.jit(step, donate_argnums=(0, 1))


CASES = {"tiny": ([2, 32, 32, 1], 16, True, loss_tiny),
         "mlp": ([784, 256, 256, 10], 128, False, loss_mlp)}


def measure(name, samples):
    sizes, batch, tiny, loss = CASES[name]
    opt = optax.adam(LR)
    params, data = init(sizes, batch, tiny, 0)
    state = opt.init(params)
    step = make_step(loss, opt)
    t0 = time.perf_counter()
    params, state, value = step(params, state, data)
    jax.block_until_ready(value)
    first_ms = (time.perf_counter() - t0) * 1e3
    loss_first = float(value)
    t0 = time.perf_counter()
    params, state, value = step(params, state, data)
    jax.block_until_ready(value)
    once = time.perf_counter() - t0
    inner = max(1, int(0.02 / max(once, 1e-9)))
    s = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            params, state, value = step(params, state, data)
            jax.block_until_ready(value)
        s.append((time.perf_counter() - t0) / inner * 1e6)
    print("%s_step_us %.3f" % (name, statistics.median(s)))
    print("%s_first_ms %.3f" % (name, first_ms))
    print("%s_loss_first %.6g" % (name, loss_first))
    print("%s_loss_last %.6g" % (name, float(value)))
    sys.stdout.flush()


def main(argv):
    samples = 21
    names = []
    i = 0
    while i < len(argv):
        if argv[i] == "--samples":
            samples = int(argv[i + 1])
            i += 2
        else:
            if argv[i] not in CASES:
                sys.exit("jax_mlp_step.py: unknown measurement %r (known: %s)"
                         % (argv[i], " ".join(CASES)))
            names.append(argv[i])
            i += 1
    print("jax_version", jax.__version__)
    print("optax_version", optax.__version__)
    print("threads", threads)
    print("pinned_cpu", pinned)
    sys.stdout.flush()
    for name in names or list(CASES):
        measure(name, samples)


if __name__ == "__main__":
    main(sys.argv[1:])
