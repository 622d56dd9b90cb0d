"""Peer numbers for nabla's ODE benchmarks (bench_ode): a 1000-dimensional neural ODE solved
and differentiated with Diffrax (JAX, CPU).

  dy/dt = tanh(W y + b), y in R^1000, t in [0, 1], loss L = sum(y(1)),
  gradient of L w.r.t. (W, b, y0).

  W = N(0, 1) / sqrt(1000) (1000 x 1000), b = N(0, 1), y0 = N(0, 1): jax.random.normal with
  keys kW, kb, ky = jax.random.split(jax.random.PRNGKey(0), 3), drawn in float64 and then
  rounded to the run's dtype.

Run with build/peers/bin/python (the JAX virtualenv of benchmarks/README.md, plus
`pip install diffrax`):
    build/peers/bin/python benchmarks/peers/diffrax_node.py [--repeats N] [--f64] [name ...]
The names choose the measurements (all of them when there are none), <ctrl>_<what> with
  <ctrl>  const  Tsit5, ConstantStepSize, dt0 = 0.01: 100 steps
          pid    Tsit5, PIDController(rtol=1e-6, atol=1e-6), dt0 = 0.01
  <what>  solve         the jitted solve, (W, b, y0) -> y(1)
          grad_ckpt10   jitted jax.grad of L with RecursiveCheckpointAdjoint(checkpoints=10)
          grad_ckpt100  the same with checkpoints=100
          grad_direct   the same with DirectAdjoint()
Every solve: diffeqsolve(ODETerm(f), Tsit5(), t0=0, t1=1, dt0=0.01, y0, args=(W, b),
SaveAt(t1=True), max_steps=100) -- 100 is exactly the constant-step count, and far above the
PID's (5 steps in f32 and f64: the field is smooth and the error norm is an RMS over 1000
entries); DirectAdjoint's cost depends on max_steps, so nabla should use the same.
N (default 7, or $NB_BENCH_REPEATS) samples of one call each (after a warm-up call that
compiles); the median is printed. float32 unless --f64. NB_BENCH_THREADS (default 1) sets
XLA's CPU threads, as in jax_jit.py.

Prints "key value" lines: jax_version, diffrax_version, threads, dtype, then per measurement
  row diffrax_node_<name> <median µs> <error>
  diffrax_node_<ctrl>_steps <num_steps> <num_accepted_steps> <num_rejected_steps>   (solve)
  diffrax_node_<name>_value <L, the solve's sum(y(1))>                              (solve)
where <error> is a norm-wise relative error against a float64 reference computed once per run
(Tsit5, PIDController(rtol=atol=1e-10), DirectAdjoint, max_steps=1000):
max |u - u_ref| / max |u_ref| over y(1) (solve) or over all of (dW, db, dy0) (grads). In
float32 it is dominated by rounding (~1e-6); in float64 it shows the discretisation error.
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

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # float64 available; the dtype is chosen per run

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

N = 1000
T0, T1, DT0 = 0.0, 1.0, 0.01
MAX_STEPS = 100


def make_data(dtype):
    """Drawn in float64 and rounded to dtype (JAX's float32 draws are other numbers)."""
    kW, kb, ky = jax.random.split(jax.random.PRNGKey(0), 3)
    W = jax.random.normal(kW, (N, N), jnp.float64) / np.sqrt(N)
    b = jax.random.normal(kb, (N,), jnp.float64)
    y0 = jax.random.normal(ky, (N,), jnp.float64)
    return W.astype(dtype), b.astype(dtype), y0.astype(dtype)


def vector_field(t, y, args):
    W, b = args
    return jnp.tanh(W @ y + b)


TERM = diffrax.ODETerm(vector_field)


def controller(ctrl):
    if ctrl == "const":
        return diffrax.ConstantStepSize()
    if ctrl == "pid":
        return diffrax.PIDController(rtol=1e-6, atol=1e-6)
    return diffrax.PIDController(rtol=1e-10, atol=1e-10)  # "ref"


def solve(W, b, y0, ctrl, adjoint, max_steps=MAX_STEPS):
    return diffrax.diffeqsolve(TERM, diffrax.Tsit5(), T0, T1, DT0, y0, args=(W, b),
                               stepsize_controller=controller(ctrl), adjoint=adjoint,
                               max_steps=max_steps)


ADJOINTS = {
    "grad_ckpt10": lambda: diffrax.RecursiveCheckpointAdjoint(checkpoints=10),
    "grad_ckpt100": lambda: diffrax.RecursiveCheckpointAdjoint(checkpoints=100),
    "grad_direct": lambda: diffrax.DirectAdjoint(),
}


def make(ctrl, what):
    if what == "solve":
        def f(W, b, y0):
            sol = solve(W, b, y0, ctrl, diffrax.RecursiveCheckpointAdjoint())
            return sol.ys[0], sol.stats
        return jax.jit(f)
    adjoint = ADJOINTS[what]()

    def L(W, b, y0):
        return jnp.sum(solve(W, b, y0, ctrl, adjoint).ys[0])
    return jax.jit(jax.grad(L, argnums=(0, 1, 2)))


def reference():
    """float64 y(1) and gradient at rtol = atol = 1e-10."""
    W, b, y0 = make_data(jnp.float64)

    def L(W, b, y0):
        return jnp.sum(solve(W, b, y0, "ref", diffrax.DirectAdjoint(), 1000).ys[0])
    y1 = jax.jit(lambda W, b, y0: solve(W, b, y0, "ref", diffrax.DirectAdjoint(), 1000).ys[0])
    g = jax.jit(jax.grad(L, argnums=(0, 1, 2)))(W, b, y0)
    return np.asarray(y1(W, b, y0)), [np.asarray(x) for x in g]


def normwise(us, refs):
    num = max(float(np.max(np.abs(np.asarray(u, np.float64) - r))) for u, r in zip(us, refs))
    den = max(float(np.max(np.abs(r))) for r in refs)
    return num / den


def med_us(fn, repeats):
    fn()
    s = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        s.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(s)


def main(argv):
    repeats = int(os.environ.get("NB_BENCH_REPEATS", "7"))
    dtype = jnp.float32
    names = []
    i = 0
    while i < len(argv):
        if argv[i] == "--repeats":
            repeats = int(argv[i + 1])
            i += 2
        elif argv[i] == "--f64":
            dtype = jnp.float64
            i += 1
        else:
            names.append(argv[i])
            i += 1
    known = [c + "_" + w for c in ("const", "pid")
             for w in ("solve", "grad_ckpt10", "grad_ckpt100", "grad_direct")]
    for n in names:
        if n not in known:
            sys.exit("diffrax_node.py: unknown measurement %r (known: %s)" % (n, " ".join(known)))
    print("jax_version", jax.__version__)
    print("diffrax_version", diffrax.__version__)
    print("threads", threads)
    print("dtype", jnp.dtype(dtype).name)
    sys.stdout.flush()
    ref_y1, ref_g = reference()
    W, b, y0 = make_data(dtype)
    for name in names or known:
        ctrl, _, what = name.partition("_")
        f = make(ctrl, what)
        if what == "solve":
            fn = lambda: jax.block_until_ready(f(W, b, y0))  # noqa: E731
            y1, stats = fn()
            err = normwise([y1], [ref_y1])
        else:
            fn = lambda: jax.block_until_ready(f(W, b, y0))  # noqa: E731
            err = normwise(fn(), ref_g)
        print("row diffrax_node_%s %.1f %.3g" % (name, med_us(fn, repeats), err))
        if what == "solve":
            print("diffrax_node_%s_steps %d %d %d" % (ctrl, int(stats["num_steps"]),
                                                      int(stats["num_accepted_steps"]),
                                                      int(stats["num_rejected_steps"])))
            print("diffrax_node_%s_value %r" % (name, float(jnp.sum(y1))))
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
