"""Oracle for tests/core/test_random.c: jax.random.truncated_normal's own outputs.

Run with a JAX virtualenv (python3 -m venv build/peers-tn && build/peers-tn/bin/pip install
"jax[cpu]"):
    build/peers-tn/bin/python tests/core/oracle/gen_truncated_normal.py \
        > tests/core/oracle/jax_truncated_normal.txt
Made with JAX 0.10.2 (jaxlib 0.10.2, XLA's CPU backend, x86-64 with FMA), jax_enable_x64 on so
that both f32 and f64 can be asked for; the bounds are Python floats, converted to the dtype
inside truncated_normal as JAX always does.

Every case line is
    tn <dtype> <seed> <lower> <upper> <rows> <cols> <v0> <v1> ...
with the key jax.random.PRNGKey(seed), the bounds as exact hex floats (float.hex; "inf",
"-inf"), the shape (rows, cols) -- cols 0 for a 1-d shape (rows,) -- and the values in
row-major order as the bit patterns of the dtype in hex (8 digits for f32, 16 for f64).

Only bounds where nabla uses JAX's inverse-CDF form are recorded (the probability mass
between the bounds, erf(upper/sqrt2) - erf(lower/sqrt2) in the dtype, spans at least 2^12
units in the last place of the larger of the two erf values): there nabla gives JAX's bits.
Farther in a tail JAX's float32 or float64 arithmetic cannot resolve the mass any more and
it returns a handful of values or the clip bound itself; nabla samples those tails another
way (include/nabla/random.h). The "# jax far out" comment lines show what JAX gives there.

f32 goes through XLA's own polynomials (erf, log1p, erf_inv), all of them reproduced by
nabla; f64 calls the C library's erf and log for two of its steps, as XLA's CPU backend
does, so those lines hold exactly where the C library is the one this was made with
(glibc 2.36 here): the "libm" lines record what it gave, for the test to check.
"""
import math
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

INF = math.inf
COMMON = [
    (-2.0, 1.0), (-1.0, 1.0), (0.0, INF), (-INF, INF), (-INF, 0.5), (0.5, 2.0), (1.0, 2.0),
    (2.5, 3.5), (-3.0, -2.0), (-0.5, 0.25), (-1e-3, 2e-3), (0.0, 1e-30), (3.0, 4.0),
    (-4.0, -3.0), (1.5, INF), (-INF, -2.5), (-0.1, 7.0),
]
F64_ONLY = [(4.0, 5.0), (5.0, 6.0), (6.0, 7.0), (-6.5, -5.5), (7.0, 7.5), (-INF, -6.0)]
TAILS = {
    jnp.float32: [(4.0, 5.0), (5.0, 6.0), (5.5, 6.0), (7.0, 8.0), (8.0, 9.0), (-8.0, -7.0),
                  (30.0, INF), (-INF, -30.0), (3.0, 3.0 + 1e-6)],
    jnp.float64: [(8.0, 9.0), (9.0, 10.0), (-10.0, -9.0), (20.0, 21.0), (30.0, INF),
                  (-INF, -30.0)],
}


def bits(x, dt):
    u = np.uint32 if dt == jnp.float32 else np.uint64
    w = 8 if dt == jnp.float32 else 16
    return " ".join("%0*x" % (w, int(v)) for v in np.asarray(x).view(u).ravel())


def name(dt):
    return "f32" if dt == jnp.float32 else "f64"


print("# jax", jax.__version__, "jaxlib", jax.lib.__version__, "threefry_partitionable",
      jax.config.jax_threefry_partitionable)
for dt, bounds in ((jnp.float32, COMMON), (jnp.float64, COMMON + F64_ONLY)):
    for c, (lo, hi) in enumerate(bounds):
        seed = (0, 42, 7, 2**32 + 7)[c % 4]
        shape = (3, 43) if c % 5 == 2 else (129,)
        x = jax.random.truncated_normal(jax.random.PRNGKey(seed), lo, hi, shape, dt)
        rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (shape[0], 0)
        print("tn %s %d %s %s %d %d %s" % (name(dt), seed, float.hex(lo), float.hex(hi), rows,
                                           cols, bits(x, dt)))
# the C library's erf and log as XLA's CPU backend calls them for f64
probe = np.array([0.1, 0.70710678118654746, -1.5, 2.1213203435596424, 3.5, -4.9, 5.3, 6.1],
                 np.float64)
print("libm erf %s %s" % (bits(probe, jnp.float64), bits(jax.lax.erf(probe), jnp.float64)))
probe = np.array([0.25, 0.5, 0.75, 1e-3, 3e-7, 1e-12, 2.5e-15, 1e-300], np.float64)
print("libm log %s %s" % (bits(probe, jnp.float64), bits(jnp.log(probe), jnp.float64)))
for dt in (jnp.float32, jnp.float64):
    for lo, hi in TAILS[dt]:
        x = np.asarray(jax.random.truncated_normal(jax.random.PRNGKey(0), lo, hi, (1000,), dt))
        v, n = np.unique(x, return_counts=True)
        top = ", ".join("%r x%d" % (float(a), int(b)) for a, b in
                        sorted(zip(v, n), key=lambda p: -p[1])[:3])
        print("# jax far out, %s (%r, %r): %d distinct values in 1000; most frequent: %s" %
              (name(dt), lo, hi, len(v), top))
