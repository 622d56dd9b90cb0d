"""Oracle for nabla's nn layers (tests/nn): Equinox layers' initial parameters (from
jax.random.PRNGKey keys) and their outputs on fixed inputs, in f32 (Equinox's default dtype
when JAX is not in x64 mode).

Run with the JAX virtualenv (python3 -m venv build/peers && build/peers/bin/pip install
"jax[cpu]==0.10.2" optax==0.2.8 equinox==0.13.8):
    build/peers/bin/python tests/nn/oracle/gen_equinox_nn.py > tests/nn/oracle/equinox_nn.txt
Every line is "<name> <dtype> <shape> <values...>": shape as dims joined by 'x' ("4x3"; a 1-d
array is "4"), values row-major, floats as %.9g (round-trips f32), integers in decimal.
"""
import math
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402
import jaxlib  # noqa: E402

assert not jax.config.jax_enable_x64  # Equinox's default dtype is then f32
import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.random import PRNGKey  # noqa: E402

HEADER = """\
Inputs: every float input is x[k] = sin(0.3*k + 0.1) for k = 0, 1, ... over the input's
  flattened row-major order, computed in f64 (C library sin) and rounded to f32:
  linear_x, linear_nobias_x (3,), mlp_x (2,), conv_a_x and conv_b_x (2, 6, 5) (channels, H, W;
  the same array), layernorm_x (5,). Embedding indices: [3, 0, 9] (int32), applied with
  jax.vmap(emb). The MLP's first input leaves its second hidden layer all zero after relu, so
  it also gets a batch mlp_xb (8, 2) with xb[k] = 3*sin(0.7*k + 0.5) (same rounding), run
  as jax.vmap(mlp)(xb) (mlp_hb0, mlp_hb1: the hidden activations). Keys are printed as their key data (two uint32 words, jax.random.key_data).
Layers (import equinox as eqx; from jax.random import PRNGKey):
  linear        = eqx.nn.Linear(3, 4, key=PRNGKey(0))
  linear_nobias = eqx.nn.Linear(3, 4, use_bias=False, key=PRNGKey(0))
  mlp           = eqx.nn.MLP(in_size=2, out_size=1, width_size=4, depth=2, key=PRNGKey(1))
  embedding     = eqx.nn.Embedding(10, 3, key=PRNGKey(2))
  conv_a        = eqx.nn.Conv2d(2, 3, kernel_size=3, key=PRNGKey(3))
  conv_b        = eqx.nn.Conv2d(2, 4, kernel_size=(3, 2), stride=(2, 1), padding=1, key=PRNGKey(4))
  layernorm     = eqx.nn.LayerNorm(5)
Equinox's init rules, as read in its source (equinox/nn/_linear.py, _mlp.py, _embedding.py,
_conv.py, _normalisation.py, _misc.py):
- default_init(key, shape, dtype, lim) = jax.random.uniform(key, shape, dtype, minval=-lim,
  maxval=lim) (real dtypes). jax.random.uniform (jax/_src/random/core.py): minval, maxval
  converted to dtype; 32 random bits per element; f = bitcast((bits >> 9) | bits(1.0f)) - 1.0
  in [0, 1); value = max(minval, f * (maxval - minval) + minval), all in f32.
- dtype=None means f32 (f64 when jax_enable_x64).
- Linear(in, out, use_bias=True, key): wkey, bkey = jax.random.split(key, 2);
  lim = 1/sqrt(in) (1.0 if in == 0; in 'scalar' counts as 1); weight = default_init(wkey,
  (out, in), lim); bias = default_init(bkey, (out,), lim), or None without bias (bkey then
  unused: weight is the same with or without bias). y = weight @ x + bias.
- MLP(in, out, width, depth, activation=jax.nn.relu, final_activation=identity,
  use_bias=True, use_final_bias=True, key): keys = jax.random.split(key, depth + 1);
  layers[0] = Linear(in, width, key=keys[0]); layers[i] = Linear(width, width, key=keys[i])
  for i in 1..depth-1; layers[depth] = Linear(width, out, key=keys[-1]) (depth 0: one
  Linear(in, out, use_bias=use_final_bias, key=keys[0])). Each Linear splits its own key into
  (wkey, bkey) as above. Call: x = activation(layer(x)) for every layer but the last, then
  final_activation(last(x)).
- Embedding(num, size, key): weight = jax.random.normal(key, (num, size), dtype), the key used
  directly (no split). Call on a scalar index: weight[index].
- Conv(num_spatial_dims, in, out, kernel_size, stride=1, padding=0, dilation=1, groups=1,
  use_bias=True, key): wkey, bkey = jax.random.split(key, 2); lim = 1/sqrt((in/groups) *
  prod(kernel_size)); weight = default_init(wkey, (out, in/groups, *kernel_size), lim);
  bias = default_init(bkey, (out, 1, ..., 1) (one 1 per spatial dim), lim). An int padding p
  means (p, p) on every spatial dim. Call on x (in, *spatial): lax.conv_general_dilated(
  x[None], weight, window_strides=stride, padding, rhs_dilation=dilation,
  feature_group_count=groups)[0] + bias (a cross-correlation, NCHW/OIHW).
- LayerNorm(shape, eps=1e-5, use_weight=True, use_bias=True): weight = ones(shape),
  bias = zeros(shape) (no key). Call (x.shape must equal shape): mean = mean(x),
  var = max(0, var(x)) (population variance, jnp.var), out = (x - mean) * rsqrt(var + eps),
  then weight * out + bias, computed in result_type(x.dtype, f32).
"""


def sin_input(shape, amp=1.0, freq=0.3, phase=0.1):
    n = int(np.prod(shape))
    return jnp.asarray(np.array([amp * math.sin(freq * k + phase) for k in range(n)],
                                np.float64).astype(np.float32).reshape(shape))


def line(name, a):
    a = np.asarray(a)
    shape = "x".join(str(d) for d in a.shape) if a.ndim else "1"
    if a.dtype == np.float32:
        vals = " ".join("%.9g" % float(v) for v in a.ravel())
    elif a.dtype.kind in "iu":
        vals = " ".join("%d" % int(v) for v in a.ravel())
    else:
        raise TypeError((name, a.dtype))
    sys.stdout.write("%s %s %s %s\n" % (name, a.dtype.name, shape, vals))


def keydata(k):
    return jax.random.key_data(k)


def check_init(weight, bias, key, lim):
    """The init rules stated in the header, checked against what Equinox made."""
    wkey, bkey = jax.random.split(key, 2)
    u = lambda k, a: jax.random.uniform(k, a.shape, jnp.float32, minval=-lim, maxval=lim)
    np.testing.assert_array_equal(np.asarray(weight), np.asarray(u(wkey, weight)))
    if bias is not None:
        np.testing.assert_array_equal(np.asarray(bias), np.asarray(u(bkey, bias)))


def main():
    pr = sys.stdout.write
    pr("# Equinox oracle for tests/nn. Made by tests/nn/oracle/gen_equinox_nn.py:\n")
    pr("#   build/peers/bin/python tests/nn/oracle/gen_equinox_nn.py > tests/nn/oracle/equinox_nn.txt\n")
    pr("# equinox %s jax %s jaxlib %s numpy %s python %s, f32 (jax_enable_x64 False), CPU, eager,\n"
       % (eqx.__version__, jax.__version__, jaxlib.__version__, np.__version__,
          sys.version.split()[0]))
    pr("# jax_threefry_partitionable %s\n" % jax.config.jax_threefry_partitionable)
    pr("# Lines: '<name> <dtype> <shape> <values...>' (shape dims joined by 'x', row-major, f32 %.9g).\n")
    for h in HEADER.splitlines():
        pr("# " + h + "\n")

    # Linear
    linear = eqx.nn.Linear(3, 4, key=PRNGKey(0))
    wkey, bkey = jax.random.split(PRNGKey(0), 2)
    line("linear_wkey", keydata(wkey))
    line("linear_bkey", keydata(bkey))
    check_init(linear.weight, linear.bias, PRNGKey(0), 1 / math.sqrt(3))
    line("linear_weight", linear.weight)
    line("linear_bias", linear.bias)
    x = sin_input((3,))
    line("linear_x", x)
    line("linear_y", linear(x))

    nob = eqx.nn.Linear(3, 4, use_bias=False, key=PRNGKey(0))
    assert nob.bias is None
    line("linear_nobias_weight", nob.weight)
    line("linear_nobias_x", x)
    line("linear_nobias_y", nob(x))

    # MLP
    mlp = eqx.nn.MLP(in_size=2, out_size=1, width_size=4, depth=2, key=PRNGKey(1))
    assert mlp.activation is not None
    line("mlp_keys", keydata(jax.random.split(PRNGKey(1), 3)))
    for i, layer in enumerate(mlp.layers):
        check_init(layer.weight, layer.bias, jax.random.split(PRNGKey(1), 3)[i],
                   1 / math.sqrt(layer.in_features))
        line("mlp_layer%d_weight" % i, layer.weight)
        line("mlp_layer%d_bias" % i, layer.bias)
    x = sin_input((2,))
    line("mlp_x", x)
    h = x
    for i, layer in enumerate(mlp.layers[:-1]):
        h = jax.nn.relu(layer(h))
        line("mlp_h%d" % i, h)  # after layer i and its relu
    y = mlp(x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(mlp.layers[-1](h)))
    line("mlp_y", y)
    xb = sin_input((8, 2), amp=3.0, freq=0.7, phase=0.5)
    line("mlp_xb", xb)
    hb = xb
    for i, layer in enumerate(mlp.layers[:-1]):
        hb = jax.nn.relu(jax.vmap(layer)(hb))
        line("mlp_hb%d" % i, hb)
    yb = jax.vmap(mlp)(xb)
    np.testing.assert_array_equal(np.asarray(yb), np.asarray(jax.vmap(mlp.layers[-1])(hb)))
    line("mlp_yb", yb)

    # Embedding
    emb = eqx.nn.Embedding(10, 3, key=PRNGKey(2))
    np.testing.assert_array_equal(np.asarray(emb.weight),
                                  np.asarray(jax.random.normal(PRNGKey(2), (10, 3), jnp.float32)))
    line("embedding_weight", emb.weight)
    idx = jnp.asarray([3, 0, 9], jnp.int32)
    line("embedding_idx", idx)
    line("embedding_y", jax.vmap(emb)(idx))

    # Conv2d
    x = sin_input((2, 6, 5))
    for name, conv, key in (
            ("conv_a", eqx.nn.Conv2d(2, 3, kernel_size=3, key=PRNGKey(3)), PRNGKey(3)),
            ("conv_b", eqx.nn.Conv2d(2, 4, kernel_size=(3, 2), stride=(2, 1), padding=1,
                                     key=PRNGKey(4)), PRNGKey(4))):
        wkey, bkey = jax.random.split(key, 2)
        line(name + "_wkey", keydata(wkey))
        line(name + "_bkey", keydata(bkey))
        check_init(conv.weight, conv.bias, key, 1 / math.sqrt(2 * math.prod(conv.kernel_size)))
        line(name + "_weight", conv.weight)
        line(name + "_bias", conv.bias)
        line(name + "_x", x)
        line(name + "_y", conv(x))

    # LayerNorm
    ln = eqx.nn.LayerNorm(5)
    pr("# layernorm eps = %r (a static Python float)\n" % ln.eps)
    line("layernorm_weight", ln.weight)
    line("layernorm_bias", ln.bias)
    x = sin_input((5,))
    line("layernorm_x", x)
    line("layernorm_y", ln(x))


if __name__ == "__main__":
    main()
