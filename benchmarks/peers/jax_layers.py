"""Peer numbers for benchmarks/bench_layers.c, measured with JAX + Equinox + Optax on the
CPU, 1 thread by default. All f32; weights from Equinox's default init (jax.random.PRNGKey
0), data fixed random (numpy, seed 0: the values differ from bench_layers', the work does
not).

Run with build/peers/bin/python (the JAX virtualenv of benchmarks/README.md, plus
`pip install equinox optax`), from anywhere:
    build/peers/bin/python benchmarks/peers/jax_layers.py [--samples S]
Measured (median µs per call):
  cnn_us    one optax.adam(1e-3) train step of the digits CNN, batch 64, x [64, 1, 8, 8],
            labels in 0..9: eqx.nn.Conv2d(1->16, 3x3, pad 1) -> relu -> Conv2d(16->32, 3x3,
            pad 1) -> relu -> MaxPool2d(2, 2) -> flatten 512 -> Linear(512->64) -> relu ->
            Linear(64->10), mean softmax cross-entropy; the model runs on one example
            [1, 8, 8] and is jax.vmap-ed over the batch (the Equinox convention)
  gru_us    one optax.adam(1e-3) train step of a character LM: Embedding(65, 32), two
            eqx.nn.GRUCell (32->128, 128->128), Linear(128->65), batch 32, sequence 64, mean
            cross-entropy over all 32*64 positions; each GRU layer is its own jax.lax.scan
            over the sequence (layer 1 over the 64 steps, then layer 2 over layer 1's
            outputs), the whole per-sequence model jax.vmap-ed over the batch
  conv_{a,b,c}_fwd_us / conv_{a,b,c}_fwdbwd_us   one Conv2d with bias, 3x3, stride 1, pad 1:
            a: x [32, 3, 32, 32] -> 16 channels; b: x [32, 32, 16, 16] -> 64;
            c: x [8, 64, 28, 28] -> 64. Done directly with lax.conv_general_dilated in
            NCHW / OIHW (+ bias) on weights of an eqx.nn.Conv2d; fwd = jax.jit(conv),
            fwdbwd = jax.jit(jax.grad(sum(conv(x, w, b) * r), argnums=(0, 1, 2))), r fixed
            random of y's shape
A train step is step(params, opt_state, x, y) -> (params, opt_state, loss) with params the
arrays of the Equinox model (eqx.partition(model, eqx.is_array)): jax.value_and_grad,
optax.adam(1e-3).update, optax.apply_updates, all under one jax.jit with
donate_argnums=(0, 1). Each function is compiled first; a timed call waits for its outputs
(jax.block_until_ready); each sample is the mean over a burst of >= 20 ms of calls, S
(default 11) samples, medians printed.

Prints "key value" lines: jax_version, equinox_version, optax_version, threads, then the
keys above. NB_BENCH_THREADS (default 1) sets XLA's CPU threads; with 1 thread the process
is pinned to one CPU unless NB_BENCH_PIN=0 (as jax_vmap.py).
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

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

RNG = np.random.default_rng(0)
KEYS = iter(jax.random.split(jax.random.PRNGKey(0), 32))


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


class CNN(eqx.Module):
    c1: eqx.nn.Conv2d
    c2: eqx.nn.Conv2d
    pool: eqx.nn.MaxPool2d
    l1: eqx.nn.Linear
    l2: eqx.nn.Linear

    def __init__(self):
        self.c1 = eqx.nn.Conv2d(1, 16, 3, padding=1, key=next(KEYS))
        self.c2 = eqx.nn.Conv2d(16, 32, 3, padding=1, key=next(KEYS))
        self.pool = eqx.nn.MaxPool2d(2, 2)
        self.l1 = eqx.nn.Linear(512, 64, key=next(KEYS))
        self.l2 = eqx.nn.Linear(64, 10, key=next(KEYS))

    def __call__(self, x):  # x [1, 8, 8] -> logits [10]
        h = jax.nn.relu(self.c2(jax.nn.relu(self.c1(x))))
        h = self.pool(h).reshape(-1)
        return self.l2(jax.nn.relu(self.l1(h)))


class CharGRU(eqx.Module):
    emb: eqx.nn.Embedding
    g1: eqx.nn.GRUCell
    g2: eqx.nn.GRUCell
    out: eqx.nn.Linear

    def __init__(self):
        self.emb = eqx.nn.Embedding(65, 32, key=next(KEYS))
        self.g1 = eqx.nn.GRUCell(32, 128, key=next(KEYS))
        self.g2 = eqx.nn.GRUCell(128, 128, key=next(KEYS))
        self.out = eqx.nn.Linear(128, 65, key=next(KEYS))

    def __call__(self, tokens):  # tokens [64] -> logits [64, 65]
        h = jax.vmap(self.emb)(tokens)
        for cell in (self.g1, self.g2):
            def f(state, xt, cell=cell):
                state = cell(xt, state)
                return state, state
            _, h = jax.lax.scan(f, jnp.zeros(cell.hidden_size, jnp.float32), h)
        return jax.vmap(self.out)(h)


def train_step_us(model, x, y, samples):
    params, static = eqx.partition(model, eqx.is_array)
    opt = optax.adam(1e-3)

    def loss(p, xb, yb):
        logits = jax.vmap(eqx.combine(p, static))(xb)
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    def step(p, state, xb, yb):
        value, grads = jax.value_and_grad(loss)(p, xb, yb)
        updates, state = opt.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    step = jax.jit(step, donate_argnums=(0, 1))
    carry = [params, opt.init(params)]

    def call():
        carry[0], carry[1], value = step(carry[0], carry[1], x, y)
        jax.block_until_ready(value)

    return med_us(call, samples)


def conv(x, w, b):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return y + b[None, :, None, None]


def conv_case(name, shape, cout, samples):
    layer = eqx.nn.Conv2d(shape[1], cout, 3, padding=1, key=next(KEYS))
    w, b = layer.weight, layer.bias.reshape(-1)
    x = jnp.asarray(RNG.standard_normal(shape), jnp.float32)
    r = jnp.asarray(RNG.standard_normal((shape[0], cout, shape[2], shape[3])), jnp.float32)
    fwd = jax.jit(conv)
    fwdbwd = jax.jit(jax.grad(lambda x, w, b: jnp.sum(conv(x, w, b) * r), argnums=(0, 1, 2)))
    print("conv_%s_fwd_us %.1f" % (name, med_us(
        lambda: jax.block_until_ready(fwd(x, w, b)), samples)))
    print("conv_%s_fwdbwd_us %.1f" % (name, med_us(
        lambda: jax.block_until_ready(fwdbwd(x, w, b)), samples)))


def main(argv):
    samples = 11
    if len(argv) >= 2 and argv[0] == "--samples":
        samples = int(argv[1])
    print("jax_version", jax.__version__)
    print("equinox_version", eqx.__version__)
    print("optax_version", optax.__version__)
    print("threads", threads)
    sys.stdout.flush()
    x = jnp.asarray(RNG.standard_normal((64, 1, 8, 8)), jnp.float32)
    y = jnp.asarray(RNG.integers(0, 10, 64), jnp.int32)
    print("cnn_us %.1f" % train_step_us(CNN(), x, y, samples))
    sys.stdout.flush()
    x = jnp.asarray(RNG.integers(0, 65, (32, 64)), jnp.int32)
    y = jnp.asarray(RNG.integers(0, 65, (32, 64)), jnp.int32)
    print("gru_us %.1f" % train_step_us(CharGRU(), x, y, samples))
    sys.stdout.flush()
    for name, shape, cout in (("a", (32, 3, 32, 32), 16), ("b", (32, 32, 16, 16), 64),
                              ("c", (8, 64, 28, 28), 64)):
        conv_case(name, shape, cout, samples)
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
