"""Oracle for nabla's nn layers beyond those in gen_equinox_nn.py (tests/nn): Equinox's
convolutions (1-3d, grouped, dilated, SAME/VALID, transposed), pooling (max, average,
adaptive; with a max-pool gradient), GroupNorm, RMSNorm, BatchNorm (both modes, over four
training steps), MultiheadAttention (masks, dropout) and the GRU/LSTM cells: initial
parameters (from jax.random.PRNGKey keys) and outputs on fixed inputs, in f32 (Equinox's
default dtype when JAX is not in x64 mode).

Run with the JAX virtualenv (python3 -m venv build/peers && build/peers/bin/pip install
"jax[cpu]==0.10.2" optax==0.2.8 equinox==0.13.8):
    build/peers/bin/python tests/nn/oracle/gen_equinox_layers.py > tests/nn/oracle/equinox_layers.txt
Every line is "<name> <dtype> <shape> <values...>": shape as dims joined by 'x' ("4x3"; a 1-d
array is "4"; a scalar is "1"), values row-major, floats as %.9g (round-trips f32), integers in
decimal, bools as 0/1.
"""
import itertools
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
Inputs: every float input is sin_input(shape, amp=1, freq=0.3, phase=0.1):
  x[k] = amp*sin(freq*k + phase) for k = 0, 1, ... over the input's flattened row-major order,
  computed in f64 (C library sin) and rounded to f32. Other freq/phase are given below as
  sin(f, p). Conv/pool inputs are (channels, *spatial). Keys are printed as their key data (two
  uint32 words, jax.random.key_data): *_wkey/*_bkey (Conv, ConvTranspose), *_keys (the splits
  of GRU, LSTM, MHA). Lines per case: parameters (*_weight, *_bias, ...), inputs (*_x, ...),
  outputs (*_y, ...).
Layers (import equinox as eqx; from jax.random import PRNGKey) and their inputs:
  conv1d          = eqx.nn.Conv1d(3, 4, kernel_size=3, stride=2, padding=1, key=PRNGKey(10)); x (3, 11)
  conv1d_same     = eqx.nn.Conv1d(2, 3, kernel_size=4, padding="SAME", dilation=2, key=PRNGKey(11)); x (2, 9)
  conv2d_g        = eqx.nn.Conv2d(4, 6, kernel_size=(2, 3), stride=(1, 2), padding=((1, 0), (2, 1)),
                                  groups=2, key=PRNGKey(12)); x (4, 5, 7)
  conv2d_valid    = eqx.nn.Conv2d(2, 3, kernel_size=3, stride=2, padding="VALID", use_bias=False,
                                  key=PRNGKey(17)); x (2, 7, 6)
  conv3d          = eqx.nn.Conv3d(2, 3, kernel_size=2, stride=1, padding=1, key=PRNGKey(13)); x (2, 3, 4, 3)
  convt1d         = eqx.nn.ConvTranspose1d(3, 2, kernel_size=3, stride=2, padding=1, output_padding=1,
                                           key=PRNGKey(14)); x (3, 6)
  convt2d         = eqx.nn.ConvTranspose2d(2, 4, kernel_size=(3, 2), stride=(2, 3), padding=0,
                                           dilation=(1, 2), key=PRNGKey(15)); x (2, 4, 3)
  convt2d_same    = eqx.nn.ConvTranspose2d(4, 2, kernel_size=3, stride=2, padding="SAME", groups=2,
                                           key=PRNGKey(16)); x (4, 3, 5)
  convt2d_bigpad  = eqx.nn.ConvTranspose2d(2, 2, kernel_size=2, stride=1, padding=2, key=PRNGKey(18));
                    x (2, 5, 5) (padding > d*(k-1): negative transposed padding, i.e. cropping)
  maxpool2d       = eqx.nn.MaxPool2d(kernel_size=3, stride=2, padding=1); x (2, 7, 6);
                    maxpool2d_w = sin_input(y.shape, freq=0.7, phase=0.2);
                    maxpool2d_grad = jax.grad(lambda x: jnp.sum(pool(x) * w))(x)
  maxpool2d_ties  = the same layer, x = jnp.round(2 * sin_input((2, 7, 6))) / 2 (ties inside 16
                    of the 24 windows; small negatives round to -0, printed "-0"); w and grad
                    as for maxpool2d
  maxpool1d_ceil  = eqx.nn.MaxPool1d(2, stride=2, use_ceil=True); x (3, 7)
  avgpool2d       = eqx.nn.AvgPool2d(kernel_size=(2, 3), stride=(2, 1), padding=((1, 1), (0, 1))); x (2, 5, 6)
  avgpool1d_ceil  = eqx.nn.AvgPool1d(3, stride=2, padding=1, use_ceil=True); x (2, 8)
  maxpool3d       = eqx.nn.MaxPool3d(2, stride=1); x (2, 3, 3, 4)
  adaptive_avg1d  = eqx.nn.AdaptiveAvgPool1d(4); x (3, 10)
  adaptive_avg2d  = eqx.nn.AdaptiveAvgPool2d((3, 2)); x (2, 7, 5)
  adaptive_max2d  = eqx.nn.AdaptiveMaxPool2d((2, 3)); x (2, 5, 7)
  groupnorm       = eqx.nn.GroupNorm(2, 6), then eqx.tree_at: weight = 1 + 0.5*sin(0.9, 0.3) (6,),
                    bias = sin(1.3, 0.7) (6,); x (6, 3, 2)
  groupnorm_plain = eqx.nn.GroupNorm(3, 6, channelwise_affine=False); x (6, 4)
  rmsnorm         = eqx.nn.RMSNorm(5); x (5,)
  rmsnorm2        = eqx.nn.RMSNorm((2, 3)), then eqx.tree_at: weight = 1 + 0.5*sin(0.9, 0.3) (2, 3),
                    bias = sin(1.3, 0.7) (2, 3); x (2, 3)
  batchnorm_batch: bn, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, axis_name="batch",
                    mode="batch", momentum=0.9); four training steps i = 0..3 on
                    x_i = sin_input((5, 3, 2), freq=0.3 + 0.1*i, phase=0.1 + i) (batch 5, 3 channels,
                    2 spatial): y_i, state = jax.vmap(bn, axis_name="batch", in_axes=(0, None),
                    out_axes=(0, None))(x_i, state). Printed: _x{i}, _y{i} and the state after
                    step i: _counter{i} (state.get(bn.batch_counter)), _mean{i}, _var{i}
                    (state.get(bn.batch_state_index) = (hidden_mean, hidden_var)); _init_* is the
                    state before step 0. Then _yinf: the same vmap of eqx.nn.inference_mode(bn) on
                    x_3 with the state after step 3 (_inf_scale: the debias scale it uses).
  batchnorm_ema:  the same with mode="ema": the state after step i is _first_time{i}
                    (state.get(bn.ema_first_time_index), bool) and _mean{i}, _var{i}
                    (state.get(bn.ema_state_index)); then _yinf as above.
  mha             = eqx.nn.MultiheadAttention(num_heads=2, query_size=6, key_size=5, value_size=4,
                    output_size=3, qk_size=4, vo_size=2, use_query_bias=True,
                    use_output_bias=True, key=PRNGKey(20)); inputs mha_xq (3, 6),
                    mha_xk (4, 5) sin(0.5, 0.1), mha_xv (4, 4) sin(0.7, 0.1); mha_y = mha(xq, xk, xv);
                    mha_mask (3, 4) bool, mask[i, j] = j <= i + 1, mha_y_mask = mha(xq, xk, xv, mask);
                    mha_mask3 (2, 3, 4) bool, head 0 as mha_mask, head 1 mask[i, j] = j >= i,
                    mha_y_mask3. Linear sublayers: _q_ (query_proj), _k_, _v_, _o_ (output_proj).
  mha_drop        = the same constructor with dropout_p=0.3 (same weights), called in training mode
                    with key=PRNGKey(21): mha_drop_y = mha_drop(xq, xk, xv, key=PRNGKey(21));
                    mha_drop_head_keys = key_data(jax.random.split(PRNGKey(21), 2));
                    mha_drop_keep (2, 3, 4) bool: per head h, the dropout keep-mask
                    jax.random.bernoulli(head_keys[h], 0.7, (3, 4)) (checked to reproduce y).
  mha_self        = eqx.nn.MultiheadAttention(num_heads=4, query_size=8, key=PRNGKey(22)); x (5, 8);
                    mha_self_y = mha(x, x, x); mha_self_y_causal with mask = jnp.tril(jnp.ones((5, 5), bool))
  gru             = eqx.nn.GRUCell(3, 4, key=PRNGKey(30)); x (3,), h (4,) sin(0.5, 0.1); h1 = gru(x, h);
                    xs (5, 3) sin(0.7, 0.1): hT, hs = jax.lax.scan(lambda h, x: (gru(x, h), gru(x, h)),
                    zeros(4), xs) (gru_hT the final state, gru_hs all five states)
  gru_nobias      = eqx.nn.GRUCell(3, 4, use_bias=False, key=PRNGKey(30)); the same x, h; h1
  lstm            = eqx.nn.LSTMCell(3, 4, key=PRNGKey(31)); x (3,), h (4,) sin(0.5, 0.1),
                    c (4,) sin(0.9, 0.1); (h1, c1) = lstm(x, (h, c))
Equinox's rules, as read in its source (equinox/nn/_conv.py, _pool.py, _normalisation.py,
_batch_norm.py, _stateful.py, _attention.py, _dropout.py, _linear.py, _rnn.py, _misc.py) and
checked by this script (init exactly; formulas against f64 NumPy references to 1e-5):
- default_init(key, shape, lim) = jax.random.uniform(key, shape, f32, -lim, lim), as in
  equinox_nn.txt. Linear(in, out, key): wkey, bkey = split(key, 2), lim = 1/sqrt(in).
- Conv(n, in, out, k, stride, padding, dilation d, groups g, use_bias): wkey, bkey = split(key, 2);
  lim = 1/sqrt((in/g) * prod(k)); weight (out, in/g, *k), bias (out, 1, ..., 1) (bkey unused
  without bias). y = lax.conv_general_dilated(x[None], weight, stride, padding,
  rhs_dilation=d, feature_group_count=g)[0] + bias (cross-correlation; output channel o reads
  input channels of group o // (out/g)). An int padding p is (p, p) on every dim; "VALID" is
  (0, 0); "SAME" (lax.padtype_to_pads with the dilated kernel ke = d*(k-1)+1):
  out = ceil(n/s), total = max((out-1)*s + ke - n, 0), lo = total // 2, hi = total - lo.
- ConvTranspose(n, in, out, k, stride s, padding p, output_padding a, dilation d, groups g):
  the same init and weight shape (out, in/g, *k) (not (in, out/g, ...)); y =
  lax.conv_general_dilated(x[None], weight, window_strides=1, padding=padding_t,
  lhs_dilation=s, rhs_dilation=d, feature_group_count=g)[0] + bias, the weight NOT flipped and
  NOT transposed, with padding_t = (d*(k-1) - p0, d*(k-1) - p1 + a) per dim (negative values
  crop). For "SAME": p_sum = d*(k-1) - s + a + 1 (if p_sum < 0: a = -p_sum, p_sum = 0),
  p0 = p_sum // 2, p1 = p_sum - p0; "VALID": p0 = p1 = 0. Output size
  (n-1)*s + 1 + p0t + p1t - d*(k-1).
- Pool(init, op, k, stride, padding, use_ceil): lax.reduce_window(x, init, op, window k,
  stride, padding) per channel; padding int p -> (p, p); it raises if max(lo, hi) > k (after
  use_ceil). use_ceil: if (n + lo + hi - k) % s != 0 then hi += s (a whole stride, whatever is
  needed; the last window may then lie mostly in padding). MaxPool: init -inf, lax.max
  (padding never wins). AvgPool: init 0, lax.add, then divided by prod(k): padded cells count
  (count_include_pad, also in the use_ceil padding). The max-pool gradient (reduce_window_max
  VJP, select_and_scatter_add with >=): each output's cotangent goes to ONE input, the first
  maximum of its window in row-major window order; overlapping windows add.
- AdaptivePool(target): for each spatial dim in turn (dim 1 first), split its n cells into
  target chunks: r = n % target; if r != 0 the first r chunks have n//target + 1 cells and the
  rest n//target (the chunks do not overlap, unlike PyTorch's floor/ceil windows); then op
  (jnp.mean / jnp.max) over each chunk. 2-d: mean over rows of a chunk, then over columns.
- GroupNorm(groups, channels, eps=1e-5): weight ones(channels), bias zeros(channels) (none
  without channelwise_affine); x (C, ...) reshaped to (groups, C/groups, ...); per group
  mean, var = max(0, jnp.var) (population), out = (x - mean) * rsqrt(var + eps); then
  weight[c] * out + bias[c] (per channel).
- RMSNorm(shape, eps=1e-5, use_weight=True, use_bias=True): weight ones(shape), bias
  zeros(shape) (a bias by default); out = rsqrt(mean(x**2) + eps) * x, then weight * out + bias.
- BatchNorm(C, axis_name, eps=1e-5, momentum, mode): weight ones(C), bias zeros(C); no key.
  Batch statistics per channel: mean = pmean over the batch of each sample's spatial mean;
  var = max(0, pmean over the batch of each sample's spatial mean((y - mean)^2)) (biased,
  divided by batch*spatial); out = (y - mean) / sqrt(var + eps) * weight + bias (a division by
  sqrt, not rsqrt). mode "batch": state = {counter: int32 scalar 0, (hidden_mean zeros(C),
  hidden_var ones(C))}; training normalises with the batch statistics and sets counter += 1,
  hidden = hidden*momentum + batch*(1 - momentum); inference uses mean = hidden_mean / scale,
  var = hidden_var / scale with scale = 1 if counter == 0 else 1 - momentum**counter (f32)
  (so hidden_var's initial ones leak into the inference variance). mode "ema": state =
  {first_time: bool True, (mean, var) = jnp.empty(C) (zeros)}; training: m = (1-momentum)*batch
  + momentum*running, replaced by the batch statistics when first_time, and normalises with
  THESE (running) m, v, not the batch ones; first_time becomes False; inference uses (mean, var).
- MultiheadAttention(h, query_size, key_size=query_size, value_size=query_size,
  output_size=query_size, qk_size=query_size//h, vo_size=query_size//h, use_*_bias=False,
  dropout_p=0): qkey, kkey, vkey, okey = split(key, 4); query_proj = Linear(query_size, h*qk,
  key=qkey), key_proj = Linear(key_size, h*qk, kkey), value_proj = Linear(value_size, h*vo,
  vkey), output_proj = Linear(h*vo, output_size, okey) (each its own Linear init). Call: each
  projection row-wise, reshaped (seq, h, size) (head j = columns j*size .. (j+1)*size-1); per
  head logits = (q / sqrt(qk)) @ k^T, masked entries set to finfo(f32).min (not -inf), softmax
  over keys, (dropout), @ v; heads concatenated (seq, h*vo), then output_proj row-wise. A 2-d
  mask is shared by all heads, a 3-d one is per head. Dropout (training, p > 0): head keys =
  split(key, h); keep = jax.random.bernoulli(head_key, 1 - p, (q_seq, kv_seq)) (uniform < 0.7f),
  weights = where(keep, weights / (1 - p), 0), applied to the softmax weights.
- GRUCell(in, hid, use_bias=True): ihkey, hhkey, bkey, bkey2 = split(key, 4); lim =
  sqrt(1/hid); weight_ih (3*hid, in), weight_hh (3*hid, hid), bias (3*hid,), bias_n (hid,)
  (weights the same without bias). i = weight_ih @ x + bias, g = weight_hh @ h, split in
  thirds (r, z, n): r = sigmoid(i_r + g_r), z = sigmoid(i_z + g_z), n = tanh(i_n + r*(g_n +
  bias_n)), h' = n + z*(h - n).
- LSTMCell(in, hid): ihkey, hhkey, bkey = split(key, 3); lim = sqrt(1/hid); weight_ih
  (4*hid, in), weight_hh (4*hid, hid), bias (4*hid,). lin = weight_ih @ x + weight_hh @ h +
  bias split in quarters (i, f, g, o): c' = sigmoid(f)*c + sigmoid(i)*tanh(g),
  h' = sigmoid(o)*tanh(c').
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
    elif a.dtype == np.bool_:
        vals = " ".join("1" if v else "0" for v in a.ravel())
    else:
        raise TypeError((name, a.dtype))
    sys.stdout.write("%s %s %s %s\n" % (name, a.dtype.name, shape, vals))


def keydata(k):
    return jax.random.key_data(k)


def unif(key, a, lim):
    return np.asarray(jax.random.uniform(key, np.shape(a), jnp.float32, minval=-lim, maxval=lim))


def check_init(weight, bias, key, lim):
    """The Linear/Conv init rule stated in the header, checked against what Equinox made."""
    wkey, bkey = jax.random.split(key, 2)
    np.testing.assert_array_equal(np.asarray(weight), unif(wkey, weight, lim))
    if bias is not None:
        np.testing.assert_array_equal(np.asarray(bias), unif(bkey, bias, lim))


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


# ---- f64 NumPy references for the formulas in the header ----

def conv_ref(x, w, stride, pads, lhs_dil, rhs_dil, groups):
    """lax.conv_general_dilated on one (C, *spatial) input, OIHW weight, in f64."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    nd = x.ndim - 1
    # lhs dilation: zeros between input cells
    shp = [x.shape[0]] + [(n - 1) * s + 1 for n, s in zip(x.shape[1:], lhs_dil)]
    xd = np.zeros(shp)
    xd[(slice(None),) + tuple(slice(None, None, s) for s in lhs_dil)] = x
    # padding, negative = crop
    for ax, (lo, hi) in enumerate(pads, start=1):
        if lo < 0:
            xd = np.take(xd, range(-lo, xd.shape[ax]), axis=ax)
            lo = 0
        if hi < 0:
            xd = np.take(xd, range(0, xd.shape[ax] + hi), axis=ax)
            hi = 0
        pw = [(0, 0)] * xd.ndim
        pw[ax] = (lo, hi)
        xd = np.pad(xd, pw)
    ks = w.shape[2:]
    ke = [d * (k - 1) + 1 for k, d in zip(ks, rhs_dil)]
    outsp = [(n - e) // s + 1 for n, e, s in zip(xd.shape[1:], ke, stride)]
    out_c, in_g = w.shape[0], w.shape[1]
    per_g = out_c // groups
    y = np.zeros([out_c] + outsp)
    for o in range(out_c):
        g = o // per_g
        for pos in itertools.product(*[range(n) for n in outsp]):
            acc = 0.0
            for ci in range(in_g):
                for kk in itertools.product(*[range(k) for k in ks]):
                    idx = tuple(p * s + k * d for p, s, k, d in zip(pos, stride, kk, rhs_dil))
                    acc += w[(o, ci) + kk] * xd[(g * in_g + ci,) + idx]
            y[(o,) + pos] = acc
    assert nd == len(outsp)
    return y


def same_pads(n, k, s, d):
    ke = d * (k - 1) + 1
    out = -(-n // s)
    total = max((out - 1) * s + ke - n, 0)
    return (total // 2, total - total // 2)


def pool_ref(x, init, op, ks, stride, pads):
    x = np.asarray(x, np.float64)
    pw = [(0, 0)] + list(pads)
    xp = np.pad(x, pw, constant_values=init)
    outsp = [(n - k) // s + 1 for n, k, s in zip(xp.shape[1:], ks, stride)]
    y = np.zeros([x.shape[0]] + outsp)
    for c in range(x.shape[0]):
        for pos in itertools.product(*[range(n) for n in outsp]):
            sl = tuple(slice(p * s, p * s + k) for p, s, k in zip(pos, stride, ks))
            y[(c,) + pos] = op(xp[(c,) + sl])
    return y


def maxpool_grad_ref(x, w, ks, stride, pads):
    """Each output's cotangent to the first maximum (row-major) of its window."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    xp = np.pad(x, [(0, 0)] + list(pads), constant_values=-np.inf)
    g = np.zeros_like(xp)
    for c in range(x.shape[0]):
        for pos in itertools.product(*[range(n) for n in w.shape[1:]]):
            sl = tuple(slice(p * s, p * s + k) for p, s, k in zip(pos, stride, ks))
            win = xp[(c,) + sl]
            j = np.unravel_index(int(np.argmax(win)), win.shape)  # argmax: first maximum
            g[(c,) + tuple(p * s + jj for p, s, jj in zip(pos, stride, j))] += w[(c,) + pos]
    return g[(slice(None),) + tuple(slice(lo, lo + n) for (lo, _), n in zip(pads, x.shape[1:]))]


def ceil_pads(n_sp, ks, stride, pads):
    out = []
    for n, k, s, (lo, hi) in zip(n_sp, ks, stride, pads):
        out.append((lo, hi) if (n + lo + hi - k) % s == 0 else (lo, hi + s))
    return out


def adaptive_chunks(n, t):
    r, q = n % t, n // t
    sizes = [q + 1] * r + [q] * (t - r)
    starts = np.cumsum([0] + sizes[:-1])
    return [(int(a), int(a) + b) for a, b in zip(starts, sizes)]


def adaptive_ref(x, target, op):
    x = np.asarray(x, np.float64)
    for ax, t in enumerate(target, start=1):
        parts = [op(np.take(x, range(a, b), axis=ax), axis=ax, keepdims=True)
                 for a, b in adaptive_chunks(x.shape[ax], t)]
        x = np.concatenate(parts, axis=ax)
    return x


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def main():
    pr = sys.stdout.write
    pr("# Equinox oracle for tests/nn (more layers). Made by tests/nn/oracle/gen_equinox_layers.py:\n")
    pr("#   build/peers/bin/python tests/nn/oracle/gen_equinox_layers.py > tests/nn/oracle/equinox_layers.txt\n")
    pr("# equinox %s jax %s jaxlib %s numpy %s python %s, f32 (jax_enable_x64 False), CPU, eager,\n"
       % (eqx.__version__, jax.__version__, jaxlib.__version__, np.__version__,
          sys.version.split()[0]))
    pr("# jax_threefry_partitionable %s\n" % jax.config.jax_threefry_partitionable)
    pr("# Lines: '<name> <dtype> <shape> <values...>' (shape dims joined by 'x', row-major, f32 %.9g,\n")
    pr("# bool as 0/1, a scalar has shape 1).\n")
    for h in HEADER.splitlines():
        pr("# " + h + "\n")

    # ---------------- Conv ----------------
    def conv_case(name, conv, key, x, pads):
        wkey, bkey = jax.random.split(key, 2)
        line(name + "_wkey", keydata(wkey))
        line(name + "_bkey", keydata(bkey))
        g = conv.groups
        assert conv.weight.shape == (conv.out_channels, conv.in_channels // g) + conv.kernel_size
        assert conv.weight.dtype == jnp.float32
        check_init(conv.weight, conv.bias, key,
                   1 / math.sqrt(conv.in_channels // g * math.prod(conv.kernel_size)))
        line(name + "_weight", conv.weight)
        if conv.bias is not None:
            assert conv.bias.shape == (conv.out_channels,) + (1,) * conv.num_spatial_dims
            line(name + "_bias", conv.bias)
        line(name + "_x", x)
        y = conv(x)
        line(name + "_y", y)
        b = 0 if conv.bias is None else np.asarray(conv.bias, np.float64)
        if isinstance(conv, eqx.nn.ConvTranspose):
            ref = conv_ref(x, conv.weight, (1,) * conv.num_spatial_dims, pads, conv.stride,
                           conv.dilation, g)
        else:
            ref = conv_ref(x, conv.weight, conv.stride, pads, (1,) * conv.num_spatial_dims,
                           conv.dilation, g)
        assert y.shape == ref.shape, (name, y.shape, ref.shape)
        close(y, ref + b)

    conv_case("conv1d", eqx.nn.Conv1d(3, 4, kernel_size=3, stride=2, padding=1, key=PRNGKey(10)),
              PRNGKey(10), sin_input((3, 11)), [(1, 1)])
    assert same_pads(9, 4, 1, 2) == (3, 3)
    conv_case("conv1d_same", eqx.nn.Conv1d(2, 3, kernel_size=4, padding="SAME", dilation=2,
                                           key=PRNGKey(11)),
              PRNGKey(11), sin_input((2, 9)), [same_pads(9, 4, 1, 2)])
    conv_case("conv2d_g", eqx.nn.Conv2d(4, 6, kernel_size=(2, 3), stride=(1, 2),
                                        padding=((1, 0), (2, 1)), groups=2, key=PRNGKey(12)),
              PRNGKey(12), sin_input((4, 5, 7)), [(1, 0), (2, 1)])
    conv_case("conv2d_valid", eqx.nn.Conv2d(2, 3, kernel_size=3, stride=2, padding="VALID",
                                            use_bias=False, key=PRNGKey(17)),
              PRNGKey(17), sin_input((2, 7, 6)), [(0, 0), (0, 0)])
    conv_case("conv3d", eqx.nn.Conv3d(2, 3, kernel_size=2, stride=1, padding=1, key=PRNGKey(13)),
              PRNGKey(13), sin_input((2, 3, 4, 3)), [(1, 1)] * 3)

    # ---------------- ConvTranspose ----------------
    def tpads(k, s, p, a, d):
        return [(dd * (kk - 1) - p0, dd * (kk - 1) - p1 + aa)
                for kk, (p0, p1), aa, dd in zip(k, p, a, d)]

    def same_t(k, s, a, d):
        out_p, out_a = [], []
        for kk, ss, aa, dd in zip(k, s, a, d):
            ps = dd * (kk - 1) - ss + aa + 1
            if ps < 0:
                aa, ps = -ps, 0
            else:
                aa = 0
            out_p.append((ps // 2, ps - ps // 2))
            out_a.append(aa)
        return out_p, out_a

    ct = eqx.nn.ConvTranspose1d(3, 2, kernel_size=3, stride=2, padding=1, output_padding=1,
                                key=PRNGKey(14))
    conv_case("convt1d", ct, PRNGKey(14), sin_input((3, 6)), tpads((3,), (2,), [(1, 1)], (1,), (1,)))
    ct = eqx.nn.ConvTranspose2d(2, 4, kernel_size=(3, 2), stride=(2, 3), padding=0,
                                dilation=(1, 2), key=PRNGKey(15))
    conv_case("convt2d", ct, PRNGKey(15), sin_input((2, 4, 3)),
              tpads((3, 2), (2, 3), [(0, 0), (0, 0)], (0, 0), (1, 2)))
    ct = eqx.nn.ConvTranspose2d(4, 2, kernel_size=3, stride=2, padding="SAME", groups=2,
                                key=PRNGKey(16))
    p, a = same_t((3, 3), (2, 2), (0, 0), (1, 1))
    assert p == [(0, 1), (0, 1)] and a == [0, 0]
    assert ct._padding_transpose() == ((2, 1), (2, 1))
    conv_case("convt2d_same", ct, PRNGKey(16), sin_input((4, 3, 5)), tpads((3, 3), (2, 2), p, a, (1, 1)))
    ct = eqx.nn.ConvTranspose2d(2, 2, kernel_size=2, stride=1, padding=2, key=PRNGKey(18))
    assert ct._padding_transpose() == ((-1, -1), (-1, -1))
    conv_case("convt2d_bigpad", ct, PRNGKey(18), sin_input((2, 5, 5)),
              tpads((2, 2), (1, 1), [(2, 2), (2, 2)], (0, 0), (1, 1)))

    # ---------------- Pooling ----------------
    def maxpool_grad_case(name, pool, x):
        y = pool(x)
        line(name + "_x", x)
        line(name + "_y", y)
        close(y, pool_ref(x, -np.inf, np.max, pool.kernel_size, pool.stride, pool.padding))
        w = sin_input(y.shape, freq=0.7, phase=0.2)
        line(name + "_w", w)
        g = jax.grad(lambda x: jnp.sum(pool(x) * w))(x)
        line(name + "_grad", g)
        close(g, maxpool_grad_ref(x, w, pool.kernel_size, pool.stride, pool.padding))

    pool = eqx.nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
    maxpool_grad_case("maxpool2d", pool, sin_input((2, 7, 6)))
    xt = jnp.round(2 * sin_input((2, 7, 6))) / 2
    maxpool_grad_case("maxpool2d_ties", pool, xt)

    def pool_case(name, pool, x, kind):
        y = pool(x)
        line(name + "_x", x)
        line(name + "_y", y)
        pads = pool.padding
        if pool.use_ceil:
            pads = ceil_pads(x.shape[1:], pool.kernel_size, pool.stride, pads)
        if kind == "max":
            ref = pool_ref(x, -np.inf, np.max, pool.kernel_size, pool.stride, pads)
        else:
            ref = pool_ref(x, 0.0, np.sum, pool.kernel_size, pool.stride, pads) / math.prod(
                pool.kernel_size)
        assert y.shape == ref.shape, (name, y.shape, ref.shape)
        close(y, ref)

    pool_case("maxpool1d_ceil", eqx.nn.MaxPool1d(2, stride=2, use_ceil=True), sin_input((3, 7)), "max")
    pool_case("avgpool2d", eqx.nn.AvgPool2d(kernel_size=(2, 3), stride=(2, 1), padding=((1, 1), (0, 1))),
              sin_input((2, 5, 6)), "avg")
    assert ceil_pads((8,), (3,), (2,), [(1, 1)]) == [(1, 3)]
    pool_case("avgpool1d_ceil", eqx.nn.AvgPool1d(3, stride=2, padding=1, use_ceil=True),
              sin_input((2, 8)), "avg")
    pool_case("maxpool3d", eqx.nn.MaxPool3d(2, stride=1), sin_input((2, 3, 3, 4)), "max")

    for name, pool, shape, op in (
            ("adaptive_avg1d", eqx.nn.AdaptiveAvgPool1d(4), (3, 10), np.mean),
            ("adaptive_avg2d", eqx.nn.AdaptiveAvgPool2d((3, 2)), (2, 7, 5), np.mean),
            ("adaptive_max2d", eqx.nn.AdaptiveMaxPool2d((2, 3)), (2, 5, 7), np.max)):
        x = sin_input(shape)
        y = pool(x)
        line(name + "_x", x)
        line(name + "_y", y)
        close(y, adaptive_ref(x, pool.target_shape, op))
    assert adaptive_chunks(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]

    # ---------------- GroupNorm / RMSNorm ----------------
    def groupnorm_ref(x, groups, w, b, eps):
        x = np.asarray(x, np.float64)
        y = x.reshape(groups, -1)
        m = y.mean(axis=1, keepdims=True)
        v = y.var(axis=1, keepdims=True)
        out = ((y - m) / np.sqrt(v + eps)).reshape(x.shape)
        if w is not None:
            ex = (slice(None),) + (None,) * (x.ndim - 1)
            out = np.asarray(w, np.float64)[ex] * out + np.asarray(b, np.float64)[ex]
        return out

    gn = eqx.nn.GroupNorm(2, 6)
    assert gn.eps == 1e-5
    np.testing.assert_array_equal(np.asarray(gn.weight), np.ones(6, np.float32))
    np.testing.assert_array_equal(np.asarray(gn.bias), np.zeros(6, np.float32))
    assert gn.weight.dtype == jnp.float32
    gn = eqx.tree_at(lambda m: (m.weight, m.bias), gn,
                     (1 + 0.5 * sin_input((6,), freq=0.9, phase=0.3),
                      sin_input((6,), freq=1.3, phase=0.7)))
    line("groupnorm_weight", gn.weight)
    line("groupnorm_bias", gn.bias)
    x = sin_input((6, 3, 2))
    line("groupnorm_x", x)
    y = gn(x)
    line("groupnorm_y", y)
    close(y, groupnorm_ref(x, 2, gn.weight, gn.bias, 1e-5))

    gn = eqx.nn.GroupNorm(3, 6, channelwise_affine=False)
    assert gn.weight is None and gn.bias is None
    x = sin_input((6, 4))
    line("groupnorm_plain_x", x)
    y = gn(x)
    line("groupnorm_plain_y", y)
    close(y, groupnorm_ref(x, 3, None, None, 1e-5))

    def rms_ref(x, w, b, eps):
        x = np.asarray(x, np.float64)
        return np.asarray(w, np.float64) * (x / np.sqrt(np.mean(x * x) + eps)) + np.asarray(b, np.float64)

    rms = eqx.nn.RMSNorm(5)
    assert rms.eps == 1e-5 and rms.bias is not None
    line("rmsnorm_weight", rms.weight)
    line("rmsnorm_bias", rms.bias)
    x = sin_input((5,))
    line("rmsnorm_x", x)
    y = rms(x)
    line("rmsnorm_y", y)
    close(y, rms_ref(x, rms.weight, rms.bias, 1e-5))

    rms = eqx.nn.RMSNorm((2, 3))
    rms = eqx.tree_at(lambda m: (m.weight, m.bias), rms,
                      (1 + 0.5 * sin_input((2, 3), freq=0.9, phase=0.3),
                       sin_input((2, 3), freq=1.3, phase=0.7)))
    line("rmsnorm2_weight", rms.weight)
    line("rmsnorm2_bias", rms.bias)
    x = sin_input((2, 3))
    line("rmsnorm2_x", x)
    y = rms(x)
    line("rmsnorm2_y", y)
    close(y, rms_ref(x, rms.weight, rms.bias, 1e-5))

    # ---------------- BatchNorm ----------------
    def bn_stats(x):
        x = np.asarray(x, np.float64)
        axes = (0,) + tuple(range(2, x.ndim))
        return x.mean(axis=axes), x.var(axis=axes)

    def bn_norm(x, m, v, w, b, eps=1e-5):
        ex = (None, slice(None)) + (None,) * (x.ndim - 2)
        x = np.asarray(x, np.float64)
        return ((x - m[ex]) / np.sqrt(v[ex] + eps) * np.asarray(w, np.float64)[ex]
                + np.asarray(b, np.float64)[ex])

    for mode in ("batch", "ema"):
        name = "batchnorm_" + mode
        bn, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, axis_name="batch", mode=mode,
                                                             momentum=0.9)
        assert bn.eps == 1e-5 and bn.momentum == 0.9
        run = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
        line(name + "_weight", bn.weight)
        line(name + "_bias", bn.bias)
        if mode == "batch":
            assert bn.ema_state_index is None and bn.ema_first_time_index is None
            pr("# %s state keys: %r (counter), %r (hidden_mean, hidden_var)\n"
               % (name, bn.batch_counter.marker, bn.batch_state_index.marker))
            cnt = state.get(bn.batch_counter)
            hm, hv = state.get(bn.batch_state_index)
            line(name + "_init_counter", cnt)
            line(name + "_init_mean", hm)
            line(name + "_init_var", hv)
            ref_h = [np.zeros(3), np.ones(3)]
        else:
            assert bn.batch_counter is None and bn.batch_state_index is None
            pr("# %s state keys: %r (first_time), %r (mean, var)\n"
               % (name, bn.ema_first_time_index.marker, bn.ema_state_index.marker))
            ft = state.get(bn.ema_first_time_index)
            em, ev = state.get(bn.ema_state_index)
            line(name + "_init_first_time", ft)
            line(name + "_init_mean", em)
            line(name + "_init_var", ev)
            ref_r = None
        for i in range(4):
            x = sin_input((5, 3, 2), freq=0.3 + 0.1 * i, phase=0.1 + i)
            y, state = run(x, state)
            line("%s_x%d" % (name, i), x)
            line("%s_y%d" % (name, i), y)
            bm, bv = bn_stats(x)
            if mode == "batch":
                cnt = state.get(bn.batch_counter)
                hm, hv = state.get(bn.batch_state_index)
                assert cnt.dtype == jnp.int32 and cnt.shape == () and int(cnt) == i + 1
                assert hm.dtype == jnp.float32 and hv.dtype == jnp.float32
                line("%s_counter%d" % (name, i), cnt)
                line("%s_mean%d" % (name, i), hm)
                line("%s_var%d" % (name, i), hv)
                ref_h = [ref_h[0] * 0.9 + bm * 0.1, ref_h[1] * 0.9 + bv * 0.1]
                close(hm, ref_h[0])
                close(hv, ref_h[1])
                close(y, bn_norm(x, bm, bv, bn.weight, bn.bias))
            else:
                ft = state.get(bn.ema_first_time_index)
                em, ev = state.get(bn.ema_state_index)
                assert ft.dtype == jnp.bool_ and ft.shape == () and not bool(ft)
                line("%s_first_time%d" % (name, i), ft)
                line("%s_mean%d" % (name, i), em)
                line("%s_var%d" % (name, i), ev)
                ref_r = [bm, bv] if ref_r is None else [0.1 * bm + 0.9 * ref_r[0],
                                                        0.1 * bv + 0.9 * ref_r[1]]
                close(em, ref_r[0])
                close(ev, ref_r[1])
                close(y, bn_norm(x, ref_r[0], ref_r[1], bn.weight, bn.bias))
        bn_inf = eqx.nn.inference_mode(bn)
        assert bn_inf.inference
        yinf, state2 = jax.vmap(bn_inf, axis_name="batch", in_axes=(0, None),
                                out_axes=(0, None))(x, state)
        y2, _ = jax.vmap(lambda x, s: bn(x, s, inference=True), axis_name="batch",
                         in_axes=(0, None), out_axes=(0, None))(x, state2)
        np.testing.assert_array_equal(np.asarray(yinf), np.asarray(y2))
        if mode == "batch":
            cnt = state.get(bn.batch_counter)
            scale = jnp.where(cnt == 0, 1, 1 - bn.momentum ** cnt)
            line(name + "_inf_scale", scale)
            close(yinf, bn_norm(x, ref_h[0] / float(scale), ref_h[1] / float(scale),
                                bn.weight, bn.bias))
        else:
            close(yinf, bn_norm(x, ref_r[0], ref_r[1], bn.weight, bn.bias))
        line(name + "_yinf", yinf)

    # ---------------- MultiheadAttention ----------------
    def mha_params(name, mha, key):
        keys = jax.random.split(key, 4)
        line(name + "_keys", keydata(keys))
        for proj, k in zip((mha.query_proj, mha.key_proj, mha.value_proj, mha.output_proj), keys):
            check_init(proj.weight, proj.bias, k, 1 / math.sqrt(proj.in_features))
        for tag, proj in (("q", mha.query_proj), ("k", mha.key_proj), ("v", mha.value_proj),
                          ("o", mha.output_proj)):
            line("%s_%s_weight" % (name, tag), proj.weight)
            if proj.bias is not None:
                line("%s_%s_bias" % (name, tag), proj.bias)

    def mha_ref(mha, q, k, v, mask=None, keep=None, p=0.0):
        f = lambda a: np.asarray(a, np.float64)
        lin = lambda proj, x: f(x) @ f(proj.weight).T + (0 if proj.bias is None else f(proj.bias))
        h = mha.num_heads
        qh = lin(mha.query_proj, q).reshape(q.shape[0], h, -1)
        kh = lin(mha.key_proj, k).reshape(k.shape[0], h, -1)
        vh = lin(mha.value_proj, v).reshape(v.shape[0], h, -1)
        outs = []
        for j in range(h):
            lg = (qh[:, j] / math.sqrt(qh.shape[-1])) @ kh[:, j].T
            if mask is not None:
                mj = np.asarray(mask if mask.ndim == 2 else mask[j])
                lg = np.where(mj, lg, np.finfo(np.float32).min)
            wts = np.exp(lg - lg.max(axis=1, keepdims=True))
            wts /= wts.sum(axis=1, keepdims=True)
            if keep is not None:
                wts = np.where(np.asarray(keep[j]), wts / (1 - p), 0)
            outs.append(wts @ vh[:, j])
        return lin(mha.output_proj, np.concatenate(outs, axis=1))

    kw = dict(num_heads=2, query_size=6, key_size=5, value_size=4, output_size=3, qk_size=4,
              vo_size=2, use_query_bias=True, use_output_bias=True)
    mha = eqx.nn.MultiheadAttention(**kw, key=PRNGKey(20))
    assert mha.key_proj.bias is None and mha.value_proj.bias is None
    mha_params("mha", mha, PRNGKey(20))
    xq = sin_input((3, 6))
    xk = sin_input((4, 5), freq=0.5)
    xv = sin_input((4, 4), freq=0.7)
    line("mha_xq", xq)
    line("mha_xk", xk)
    line("mha_xv", xv)
    y = mha(xq, xk, xv)
    line("mha_y", y)
    close(y, mha_ref(mha, xq, xk, xv))
    ii, jj = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    mask = jnp.asarray(jj <= ii + 1)
    line("mha_mask", mask)
    y = mha(xq, xk, xv, mask)
    line("mha_y_mask", y)
    close(y, mha_ref(mha, xq, xk, xv, mask))
    mask3 = jnp.stack([mask, jnp.asarray(jj >= ii)])
    line("mha_mask3", mask3)
    y = mha(xq, xk, xv, mask3)
    line("mha_y_mask3", y)
    close(y, mha_ref(mha, xq, xk, xv, mask3))

    mhd = eqx.nn.MultiheadAttention(**kw, dropout_p=0.3, key=PRNGKey(20))
    assert mhd.dropout.p == 0.3 and not mhd.dropout.inference
    for a, b in zip(jax.tree_util.tree_leaves(eqx.filter(mha, eqx.is_array)),
                    jax.tree_util.tree_leaves(eqx.filter(mhd, eqx.is_array))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    mha_params("mha_drop", mhd, PRNGKey(20))
    line("mha_drop_xq", xq)
    line("mha_drop_xk", xk)
    line("mha_drop_xv", xv)
    hkeys = jax.random.split(PRNGKey(21), 2)
    line("mha_drop_head_keys", keydata(hkeys))
    keep = jnp.stack([jax.random.bernoulli(k, 1 - 0.3, (3, 4)) for k in hkeys])
    line("mha_drop_keep", keep)
    y = mhd(xq, xk, xv, key=PRNGKey(21))
    line("mha_drop_y", y)
    close(y, mha_ref(mhd, xq, xk, xv, keep=keep, p=0.3))

    mhs = eqx.nn.MultiheadAttention(num_heads=4, query_size=8, key=PRNGKey(22))
    assert (mhs.qk_size, mhs.vo_size, mhs.output_size) == (2, 2, 8)
    mha_params("mha_self", mhs, PRNGKey(22))
    x = sin_input((5, 8))
    line("mha_self_x", x)
    y = mhs(x, x, x)
    line("mha_self_y", y)
    close(y, mha_ref(mhs, x, x, x))
    causal = jnp.tril(jnp.ones((5, 5), bool))
    line("mha_self_mask", causal)
    y = mhs(x, x, x, causal)
    line("mha_self_y_causal", y)
    close(y, mha_ref(mhs, x, x, x, causal))

    # ---------------- GRU / LSTM ----------------
    def gru_ref(cell, x, h):
        f = lambda a: np.asarray(a, np.float64)
        x, h = f(x), f(h)
        bias = 0 if cell.bias is None else f(cell.bias)
        bias_n = 0 if cell.bias_n is None else f(cell.bias_n)
        ig = np.split(f(cell.weight_ih) @ x + bias, 3)
        hg = np.split(f(cell.weight_hh) @ h, 3)
        r = sigmoid(ig[0] + hg[0])
        z = sigmoid(ig[1] + hg[1])
        n = np.tanh(ig[2] + r * (hg[2] + bias_n))
        return n + z * (h - n)

    gru = eqx.nn.GRUCell(3, 4, key=PRNGKey(30))
    keys = jax.random.split(PRNGKey(30), 4)
    lim = math.sqrt(1 / 4)
    for a, k in zip((gru.weight_ih, gru.weight_hh, gru.bias, gru.bias_n), keys):
        np.testing.assert_array_equal(np.asarray(a), unif(k, a, lim))
    assert gru.weight_ih.shape == (12, 3) and gru.weight_hh.shape == (12, 4)
    line("gru_keys", keydata(keys))
    line("gru_weight_ih", gru.weight_ih)
    line("gru_weight_hh", gru.weight_hh)
    line("gru_bias", gru.bias)
    line("gru_bias_n", gru.bias_n)
    x = sin_input((3,))
    h = sin_input((4,), freq=0.5)
    line("gru_x", x)
    line("gru_h", h)
    h1 = gru(x, h)
    line("gru_h1", h1)
    close(h1, gru_ref(gru, x, h))
    xs = sin_input((5, 3), freq=0.7)
    line("gru_xs", xs)

    def step(hc, xt):
        hn = gru(xt, hc)
        return hn, hn

    hT, hs = jax.lax.scan(step, jnp.zeros(4), xs)
    line("gru_hT", hT)
    line("gru_hs", hs)
    hr = np.zeros(4)
    for t in range(5):
        hr = gru_ref(gru, xs[t], hr)
        close(hs[t], hr)
    np.testing.assert_array_equal(np.asarray(hT), np.asarray(hs[-1]))

    grn = eqx.nn.GRUCell(3, 4, use_bias=False, key=PRNGKey(30))
    assert grn.bias is None and grn.bias_n is None
    np.testing.assert_array_equal(np.asarray(grn.weight_ih), np.asarray(gru.weight_ih))
    np.testing.assert_array_equal(np.asarray(grn.weight_hh), np.asarray(gru.weight_hh))
    line("gru_nobias_weight_ih", grn.weight_ih)
    line("gru_nobias_weight_hh", grn.weight_hh)
    line("gru_nobias_x", x)
    line("gru_nobias_h", h)
    h1 = grn(x, h)
    line("gru_nobias_h1", h1)
    close(h1, gru_ref(grn, x, h))

    lstm = eqx.nn.LSTMCell(3, 4, key=PRNGKey(31))
    keys = jax.random.split(PRNGKey(31), 3)
    for a, k in zip((lstm.weight_ih, lstm.weight_hh, lstm.bias), keys):
        np.testing.assert_array_equal(np.asarray(a), unif(k, a, lim))
    assert lstm.weight_ih.shape == (16, 3) and lstm.weight_hh.shape == (16, 4)
    line("lstm_keys", keydata(keys))
    line("lstm_weight_ih", lstm.weight_ih)
    line("lstm_weight_hh", lstm.weight_hh)
    line("lstm_bias", lstm.bias)
    h = sin_input((4,), freq=0.5)
    c = sin_input((4,), freq=0.9)
    line("lstm_x", x)
    line("lstm_h", h)
    line("lstm_c", c)
    h1, c1 = lstm(x, (h, c))
    line("lstm_h1", h1)
    line("lstm_c1", c1)
    f = lambda a: np.asarray(a, np.float64)
    lin = f(lstm.weight_ih) @ f(x) + f(lstm.weight_hh) @ f(h) + f(lstm.bias)
    i_, f_, g_, o_ = np.split(lin, 4)
    cr = sigmoid(f_) * f(c) + sigmoid(i_) * np.tanh(g_)
    close(c1, cr)
    close(h1, sigmoid(o_) * np.tanh(cr))


if __name__ == "__main__":
    main()
