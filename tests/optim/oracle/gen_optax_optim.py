"""Oracle for nabla's optimizers (tests/optim): Optax trajectories on a fixed f64 least-squares
problem, and Optax's schedules' values.

Run with the JAX virtualenv (python3 -m venv build/peers && build/peers/bin/pip install
"jax[cpu]==0.10.2" optax==0.2.8 equinox==0.13.8):
    build/peers/bin/python tests/optim/oracle/gen_optax_optim.py > tests/optim/oracle/optax_optim.txt
Run it before gen_torch_optim.py, which compares PyTorch's trajectories with this file.
See README.md beside this script for the problem and the line formats.
"""
import math
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402
import jaxlib  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

M, N, STEPS, SCHED_COUNTS = 20, 5, 50, 61

# The problem. math.sin/math.cos (the C library's), not numpy's: a C test computing
# sin(1.0 + i*n + j) with libm gets the same doubles.
A = jnp.asarray([[math.sin(1.0 + i * N + j) for j in range(N)] for i in range(M)], jnp.float64)
Y = jnp.asarray([math.cos(0.5 * i) for i in range(M)], jnp.float64)


def init_params():
    return {"w": jnp.asarray([0.1 * (j + 1) for j in range(N)], jnp.float64),
            "b": jnp.asarray(-0.2, jnp.float64)}


def loss(p):
    r = A @ p["w"] + p["b"] - Y
    return 0.5 * jnp.mean(r ** 2)


grad_fn = jax.grad(loss)  # eager (no jit): one XLA op at a time

# Schedules: name -> expression. Each is also run as sgd(learning_rate=<schedule>).
SCHEDULES = [
    ("constant", "optax.constant_schedule(0.05)"),
    ("linear", "optax.linear_schedule(0.05, 0.005, 30)"),
    ("polynomial", "optax.polynomial_schedule(0.05, 0.001, 2.0, 40, transition_begin=5)"),
    ("cosine", "optax.cosine_decay_schedule(0.05, 40, alpha=0.1)"),
    ("warmup_cosine", "optax.warmup_cosine_decay_schedule(0.0, 0.05, 10, 45, end_value=0.001)"),
    ("exp_staircase", "optax.exponential_decay(0.05, 10, 0.5, transition_begin=3, staircase=True)"),
    ("exp_end", "optax.exponential_decay(0.05, 10, 0.5, transition_begin=3, end_value=0.01)"),
    ("piecewise", "optax.piecewise_constant_schedule(0.05, {10: 0.5, 25: 0.2})"),
]

CONFIGS = [
    ("sgd", "optax.sgd(0.05)"),
    ("sgd_momentum", "optax.sgd(0.05, momentum=0.9)"),
    ("sgd_nesterov", "optax.sgd(0.05, momentum=0.9, nesterov=True)"),
    ("adam", "optax.adam(0.01)"),
    ("adam_nesterov", "optax.adam(0.01, nesterov=True)"),
    ("adamw", "optax.adamw(0.01, weight_decay=0.1)"),
    ("rmsprop", "optax.rmsprop(0.01)"),
    ("rmsprop_eps_outside", "optax.rmsprop(0.01, decay=0.9, eps=1e-8, eps_in_sqrt=False)"),
    ("rmsprop_centered", "optax.rmsprop(0.01, centered=True)"),
    # The one centered setting that equals torch.optim.RMSprop(centered=True) (gen_torch_optim.py).
    ("rmsprop_centered_eps_outside",
     "optax.rmsprop(0.01, decay=0.9, eps=1e-8, centered=True, eps_in_sqrt=False)"),
    ("rmsprop_momentum", "optax.rmsprop(0.01, momentum=0.9, nesterov=True)"),
    ("adagrad", "optax.adagrad(0.1)"),
    # torch.optim.Adagrad(lr=0.1, initial_accumulator_value=0.1, eps=0.0)'s counterpart.
    ("adagrad_eps0", "optax.adagrad(0.1, initial_accumulator_value=0.1, eps=0.0)"),
    ("lion", "optax.lion(0.001)"),
    ("lamb", "optax.lamb(0.01)"),
    ("lamb_wd", "optax.lamb(0.01, weight_decay=0.1)"),
    ("clip_gn_adam", "optax.chain(optax.clip_by_global_norm(0.5), optax.adam(0.01))"),
    ("clip_sgd", "optax.chain(optax.clip(0.05), optax.sgd(0.05))"),
    ("masked_wd", 'optax.chain(optax.masked(optax.add_decayed_weights(0.1), {"w": True, "b": False}), '
                  "optax.sgd(0.05))"),
] + [("sgd_sched_" + name, "optax.sgd(learning_rate=f64_count(%s))" % expr)
      for name, expr in SCHEDULES]


def f64_count(schedule):
    """The schedule evaluated at Optax's step count converted to int64.

    Optax keeps the count as int32, and JAX 0.10 divides int32 by a Python int in f32 (even
    with x64), so several schedules return f32 values at an int32 count (see the header). An
    int64 count keeps every schedule in f64; the sgd_sched_* trajectories and the schedule lines
    use it, as nabla computes schedules in f64.
    """
    return lambda count: schedule(jnp.asarray(count, jnp.int64))

NOTES = """\
Notes from optax's source (optax/_src/alias.py, _src/transform.py, transforms/*.py,
schedules/_schedule.py, schedules/_join.py, tree_utils/_tree_math.py), g = incoming update:
- Every alias is chain(<direction>, ..., scale_by_learning_rate(lr)); scale_by_learning_rate
  multiplies by -lr (a schedule: -schedule(count), count starting at 0, so step s uses
  schedule(s-1)); scale_by_schedule computes jnp.array(step_size, dtype=g.dtype) * g.
  apply_updates: p + u cast to p's dtype.
- sgd(momentum): trace BEFORE the lr: t = g + m*t; nesterov u = g + m*t (new t); then -lr*u.
  rmsprop(momentum): trace AFTER the lr (the trace accumulates -lr*d); the same for constant lr.
- adam: mu = (1-b1)*g + b1*mu; nu = (1-b2)*g**2 + b2*nu; count += 1 (int32, saturating);
  bias_correction(m, decay, t) = m / (1 - decay**t); u = mu_hat / (sqrt(nu_hat + eps_root) + eps).
  nesterov: mu_hat = b1*bc(mu, b1, t+1) + (1-b1)*bc(g, b1, t) (Dozat's extra b2 factor omitted).
- adamw = chain(scale_by_adam, add_decayed_weights(wd, mask), lr): u = -lr*(adam + wd*p), with p
  the params before the step; torch.optim.AdamW does p *= 1 - lr*wd, then the Adam step: the same
  in exact arithmetic.
- rmsprop: nu = (1-decay)*g**2 + decay*nu from initial_scale (default 0; PyTorch 0, TF1 1);
  eps_in_sqrt=True (default): g * rsqrt(nu + eps); False: g / (sqrt(nu) + eps) (= PyTorch).
  centered (scale_by_stddev): mu = (1-decay)*g + decay*mu from 0; v = nu - mu**2, then
  rsqrt(v + eps) or 1/(sqrt(v) + eps). PyTorch's centered RMSprop is sqrt(nu - mu**2) + eps,
  i.e. optax.rmsprop(centered=True, eps_in_sqrt=False) (config rmsprop_centered_eps_outside);
  the default centered=True (eps inside the sqrt) does not match PyTorch.
  bias_correction (default False) divides nu (and mu) by 1 - decay**t.
- adagrad (scale_by_rss): s = g**2 + s from initial_accumulator_value (default 0.1);
  d = where(s > 0, rsqrt(s + eps), 0) * g, eps default 1e-7 INSIDE the sqrt. PyTorch: eps (default
  1e-10) outside, g / (sqrt(s) + eps), initial_accumulator_value default 0; identical when eps = 0.
- lion (scale_by_lion, mode 'hard'): d = sign((1-b1)*g + b1*mu) using the OLD mu, then
  mu = (1-b2)*g + b2*mu; then add_decayed_weights(1e-3 default): d + wd*p; then -lr. sign(0) = 0.
- lamb = chain(scale_by_adam(b1 .9, b2 .999, eps 1e-6, eps_root 0), add_decayed_weights(wd, default
  0), scale_by_trust_ratio(), lr). Trust ratio per LEAF (whole array, here w and the scalar b
  separately): r = ||p|| / ||u|| (2-norms, trust_coefficient 1, min_norm 0, eps 0), and r = 1 when
  ||p|| == 0 or ||u|| == 0; u = u * r. ||p|| is of the params before the step. No clipping of r.
  add_decayed_weights with a Python 0.0 is skipped entirely.
- clip(max_delta): clips each element to [-max_delta, max_delta]. clip_by_global_norm(max_norm):
  n = sqrt(sum over all leaves of sum(g**2)); if n < max_norm unchanged, else (g / n) * max_norm.
- masked(inner, mask): inner sees only the leaves whose mask is True (others are MaskedNode and
  pass through unchanged).
- Schedules (values computed with count an int32 array, as scale_by_schedule passes it):
  polynomial/linear: c = clip(count - begin, 0, steps); (init - end) * (1 - c/steps)**power + end;
  transition_steps <= 0 gives the constant init; begin < 0 is taken as 0.
  piecewise_constant: for boundaries in increasing order, indicator = max(0, sign(b - count)),
  v = v*indicator + (1 - indicator)*scale*v: the scale applies from count == boundary on
  (count >= b), scales multiply cumulatively (0.05 -> 0.05*0.5 -> (0.05*0.5)*0.2).
  exponential_decay: d = count - begin; p = d / steps (floor'ed if staircase);
  value = init if d <= 0 else init * rate**p; end_value clips with max if rate < 1 (a floor),
  with min if rate >= 1 (a ceiling). steps <= 0 or rate == 0 gives the constant init.
  cosine_decay: c = min(count, decay_steps); init * ((1 - alpha) * (0.5*(1 + cos(pi*c/decay_steps)))
  ** exponent + alpha): ends at init*alpha, then constant.
  warmup_cosine_decay(init, peak, warmup, decay_steps, end): join_schedules of
  linear_schedule(init, peak, warmup) and cosine_decay_schedule(peak, decay_steps - warmup,
  alpha=end/peak (0 if peak == 0)) at boundary warmup: count < warmup uses the linear part, else
  the cosine part at count - warmup. decay_steps counts the warmup; the end is reached as
  peak*alpha (not end exactly: peak * (end/peak) rounds).
- dtypes: with x64, JAX 0.10 computes int32 / int in f32 (also jnp.cos(int32)), so at Optax's int32
  count polynomial/linear, exponential_decay and warmup_cosine (its linear part's output joined
  with jnp.where) come out f32, and sgd then casts that f32 learning rate to f64 (rounded).
  cosine_decay (jnp.minimum(count, float) first), piecewise_constant and constant stay f64.
  Adam's bias correction 1 - b**count (Python float ** int32) is f64.
"""


def traj(expr):
    opt = eval(expr)
    p = init_params()
    state = opt.init(p)
    out = [p]
    for _ in range(STEPS):
        g = grad_fn(p)
        u, state = opt.update(g, state, p)
        p = optax.apply_updates(p, u)
        out.append(p)
    return out


def max_rel(ta, tb):
    a = np.array([[*np.asarray(p["w"]), np.asarray(p["b"])] for p in ta])
    b = np.array([[*np.asarray(p["w"]), np.asarray(p["b"])] for p in tb])
    return float(np.max(np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-300)))


def row(p):
    vals = [float(v) for v in np.asarray(p["w"])] + [float(np.asarray(p["b"]))]
    assert np.asarray(p["w"]).dtype == np.float64 and np.asarray(p["b"]).dtype == np.float64
    return " ".join(repr(v) for v in vals)


def main():
    pr = sys.stdout.write
    pr("# Optax oracle for tests/optim. Made by tests/optim/oracle/gen_optax_optim.py:\n")
    pr("#   build/peers/bin/python tests/optim/oracle/gen_optax_optim.py > tests/optim/oracle/optax_optim.txt\n")
    pr("# jax %s jaxlib %s optax %s numpy %s python %s, jax_enable_x64=True, CPU, eager (no jit)\n"
       % (jax.__version__, jaxlib.__version__, optax.__version__, np.__version__,
          sys.version.split()[0]))
    pr("# Problem (f64): m=%d n=%d A[i][j] = sin(1.0 + i*n + j), y[i] = cos(0.5*i) (C library sin/cos);\n"
       % (M, N))
    pr("#   params {'w': f64[5], 'b': f64[]}, w[j] = 0.1*(j+1), b = -0.2;\n")
    pr("#   loss = 0.5 * mean((A @ w + b - y)**2), gradient by jax.grad; each step: g = grad(params),\n")
    pr("#   updates, state = opt.update(g, state, params); params = optax.apply_updates(params, updates).\n")
    pr("# Lines: '<config> <step> <w0> <w1> <w2> <w3> <w4> <b>' for steps 0 (initial) .. %d, floats as repr;\n"
       % STEPS)
    pr("#        'schedule <name> <count> <value>' for counts 0 .. %d (f64).\n" % (SCHED_COUNTS - 1))
    pr("# Configs (import optax; the expression is eval'ed as written; f64_count(s) is\n"
       "# lambda count: s(jnp.asarray(count, jnp.int64)), see the dtypes note below):\n")
    for name, expr in CONFIGS:
        pr("#   config %s = %s\n" % (name, expr))
    pr("# Schedules:\n")
    for name, expr in SCHEDULES:
        pr("#   schedule %s = %s\n" % (name, expr))
    for line in NOTES.splitlines():
        pr("# " + line + "\n")
    trajs = {name: traj(expr) for name, expr in CONFIGS}
    pr("# Schedules at Optax's own int32 count (what optax.sgd(learning_rate=<schedule>) does), against\n"
       "# the f64 values below (max |difference| over counts 0..%d; max relative difference of the\n"
       "# 50-step sgd trajectory run literally, without f64_count, against sgd_sched_<name>):\n"
       % (SCHED_COUNTS - 1))
    for name, expr in SCHEDULES:
        s = eval(expr)
        v32 = [np.asarray(s(jnp.asarray(c, jnp.int32))) for c in range(SCHED_COUNTS)]
        v64 = [np.asarray(s(jnp.asarray(c, jnp.int64))) for c in range(SCHED_COUNTS)]
        lit = traj("optax.sgd(learning_rate=%s)" % expr)
        pr("#   %s: dtype %s, max |diff| %.3g; trajectory max rel diff %.3g\n"
           % (name, "/".join(sorted(set(str(v.dtype) for v in v32))),
              max(abs(float(a) - float(b)) for a, b in zip(v32, v64)),
              max_rel(lit, trajs["sgd_sched_" + name])))
    for name, _ in CONFIGS:
        for step, p in enumerate(trajs[name]):
            pr("%s %d %s\n" % (name, step, row(p)))
    for name, expr in SCHEDULES:
        s = eval(expr)
        for c in range(SCHED_COUNTS):
            v = np.asarray(s(jnp.asarray(c, jnp.int64)))
            assert v.dtype == np.float64, (name, v.dtype)
            pr("schedule %s %d %r\n" % (name, c, float(v)))


if __name__ == "__main__":
    main()
