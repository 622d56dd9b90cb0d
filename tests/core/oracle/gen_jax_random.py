"""Oracle for tests/core/test_random.c: JAX's own outputs for its threefry PRNG.

Run with the JAX virtualenv (python3 -m venv build/peers && build/peers/bin/pip install
"jax[cpu]"):  build/peers/bin/python tests/core/oracle/gen_jax_random.py > tests/core/oracle/jax_random.txt
Made with JAX 0.10.2 (jax_threefry_partitionable at its default, True). Every line is
"name v0 v1 ...": uint32 values in hex, floats as their bit patterns in hex.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def words(a):
    return " ".join("%08x" % int(v) for v in np.asarray(a, dtype=np.uint32).ravel())


def keydata(k):
    return jax.random.key_data(k)


print("# jax", jax.__version__, "threefry_partitionable", jax.config.jax_threefry_partitionable)
for seed in (0, 1, 42, 2**32 + 7):
    print("key_%d %s" % (seed, words(keydata(jax.random.PRNGKey(seed)))))
k = jax.random.PRNGKey(0)
print("split_0_2 %s" % words(keydata(jax.random.split(k, 2))))
print("split_0_5 %s" % words(keydata(jax.random.split(k, 5))))
k42 = jax.random.PRNGKey(42)
print("split_42_3 %s" % words(keydata(jax.random.split(k42, 3))))
print("fold_in_0_7 %s" % words(keydata(jax.random.fold_in(k, 7))))
print("fold_in_42_123456 %s" % words(keydata(jax.random.fold_in(k42, 123456))))
print("bits32_0_10 %s" % words(jax.random.bits(k, (10,), jnp.uint32)))
print("bits32_42_2x3 %s" % words(jax.random.bits(k42, (2, 3), jnp.uint32)))
u = jax.random.uniform(k42, (7,), jnp.float32)
print("uniform_f32_42_7 %s" % words(np.asarray(u).view(np.uint32)))
u = jax.random.uniform(k, (5,), jnp.float32, minval=-2.0, maxval=3.0)
print("uniform_f32_0_5_m2_3 %s" % words(np.asarray(u).view(np.uint32)))
d = np.asarray(jax.random.uniform(k42, (4,), jnp.float64)).view(np.uint32)
print("uniform_f64_42_4 %s" % words(d))
n = np.asarray(jax.random.normal(k42, (8,), jnp.float32))
print("normal_f32_42_8 %s" % words(n.view(np.uint32)))
n = np.asarray(jax.random.normal(k, (4,), jnp.float64))
print("normal_f64_0_4 %s" % words(n.view(np.uint32)))
# p as f32: what JAX does by default (without x64 a Python float is f32)
b = np.asarray(jax.random.bernoulli(k42, jnp.float32(0.3), (16,))).astype(np.uint32)
print("bernoulli_42_p03_16 %s" % words(b))
print("permutation_42_10 %s" % words(jax.random.permutation(k42, 10)))
print("permutation_0_37 %s" % words(jax.random.permutation(k, 37)))
t = np.asarray(jax.random.truncated_normal(k42, -2.0, 1.0, (6,), jnp.float64))
print("truncated_normal_f64_42_m2_1_6 %s" % words(t.view(np.uint32)))
