"""Peer numbers for benchmarks/bench_jit.c and benchmarks/bench_speed.c, measured with JAX
on the CPU.

Run with build/peers/bin/python (a virtualenv with `pip install "jax[cpu]"`, see
benchmarks/README.md). NB_BENCH_THREADS (default 1) sets XLA's CPU threads. The arguments
name the measurements to make (all of them when there are none); prints "key value" lines:
  jax_version      the JAX version (always)
  jit_hit_us       median µs per call of a jitted x + 1 on f32[4] (cache hit, result ready)
  mlp_compile_ms   median ms to trace + compile a 784-256-256-10 MLP forward, batch 128
  step_compile_ms  median ms of jax.jit(step).lower(params, batch).compile() for an MLP
                   784-256-256-10 train step, batch 128: value_and_grad of the mean
                   cross-entropy and the SGD update params - 0.01 * grads, in one jit
"""
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
threads = int(os.environ.get("NB_BENCH_THREADS", "1"))
# One thread: Eigen's thread pool off. More: on, with that many intra-op threads.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + (
    " --xla_cpu_multi_thread_eigen=%s intra_op_parallelism_threads=%d"
    % ("false" if threads == 1 else "true", threads))
os.environ.setdefault("OMP_NUM_THREADS", str(threads))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

SIZES = [784, 256, 256, 10]


def mlp_params():
    key = jax.random.PRNGKey(0)
    params = []
    for i in range(3):
        key, k1 = jax.random.split(key)
        params.append((jax.random.normal(k1, (SIZES[i], SIZES[i + 1]), jnp.float32) * 0.05,
                       jnp.zeros((SIZES[i + 1],), jnp.float32)))
    return params


def tiny_hit_us():
    f = jax.jit(lambda x: x + 1)
    x = jnp.arange(4, dtype=jnp.float32)
    f(x).block_until_ready()
    samples = []
    for _ in range(15):
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            f(x).block_until_ready()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def mlp_compile_ms():
    params = mlp_params()
    x = jnp.ones((128, 784), jnp.float32)
    samples = []
    for _ in range(7):
        def mlp(params, x):  # a new function object: no cache hit
            h = x
            for i, (w, b) in enumerate(params):
                h = h @ w + b
                if i < 2:
                    h = jnp.tanh(h)
            return h
        t0 = time.perf_counter()
        jax.jit(mlp).lower(params, x).compile()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def step_compile_ms():
    params = mlp_params()
    batch = (jnp.ones((128, 784), jnp.float32), jnp.arange(128, dtype=jnp.int32) % 10)
    samples = []
    for _ in range(7):
        def loss(params, batch):  # new function objects: no cache hit
            h, y = batch
            for i, (w, b) in enumerate(params):
                h = h @ w + b
                if i < 2:
                    h = jnp.tanh(h)
            logp = jax.nn.log_softmax(h, axis=-1)
            return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))

        def step(params, batch):
            value, grads = jax.value_and_grad(loss)(params, batch)
            return value, jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)
        t0 = time.perf_counter()
        jax.jit(step).lower(params, batch).compile()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


MEASUREMENTS = {"jit_hit_us": tiny_hit_us, "mlp_compile_ms": mlp_compile_ms,
                "step_compile_ms": step_compile_ms}

print("jax_version", jax.__version__)
for name in sys.argv[1:] or list(MEASUREMENTS):
    print("%s %.3f" % (name, MEASUREMENTS[name]()))
    sys.stdout.flush()
