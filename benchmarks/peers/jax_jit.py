"""Peer numbers for benchmarks/bench_jit.c, measured with JAX on the CPU.

Run by bench_jit with build/peers/bin/python (a virtualenv with `pip install "jax[cpu]"`,
see benchmarks/README.md); prints "key value" lines:
  jit_hit_us       median µs per call of a jitted x + 1 on f32[4] (cache hit, result ready)
  mlp_compile_ms   median ms to trace + compile a 784-256-256-10 MLP forward, batch 128
"""
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
threads = os.environ.get("NB_BENCH_THREADS", "1")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + (
    " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=%s" % threads)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402


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
    key = jax.random.PRNGKey(0)
    sizes = [784, 256, 256, 10]
    params = []
    for i in range(3):
        key, k1 = jax.random.split(key)
        params.append((jax.random.normal(k1, (sizes[i], sizes[i + 1]), jnp.float32),
                       jnp.zeros((sizes[i + 1],), jnp.float32)))
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


print("jax_version", jax.__version__)
print("jit_hit_us %.3f" % tiny_hit_us())
print("mlp_compile_ms %.3f" % mlp_compile_ms())
sys.stdout.flush()
