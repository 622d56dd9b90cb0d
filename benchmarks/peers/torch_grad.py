"""Peer numbers for benchmarks/bench_speed.c, measured with PyTorch (Debian's python3-torch,
run with /usr/bin/python3). Prints "key value" lines (medians, µs):
  torch_version                        the PyTorch version
  rosen_fwd_us_<n> / rosen_vg_us_<n>   Rosenbrock f64 forward, and value + gradient, 1 thread
  rosen_fwd_us_<n>_t2 / rosen_vg_us_<n>_t2   the same with 2 threads
  mlp_us_t<threads>                    MLP 784-256-256-10, batch 128, f32: forward + backward
  tiny_us / tiny_us_t2                 MLP 2-32-32-1, batch 16, MSE: forward + backward, 1 and
                                       2 threads
"""
import statistics
import sys
import time

import torch


def med_us(fn, reps, inner):
    fn()
    s = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        s.append((time.perf_counter() - t0) / inner * 1e6)
    return statistics.median(s)


def rosen(x):
    return (100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2).sum()


print("torch_version", torch.__version__)
for t in (1, 2):
    torch.set_num_threads(t)
    suffix = "" if t == 1 else "_t%d" % t
    for n in (2, 1000, 1000000):
        x = torch.linspace(-1.0, 2.0, n, dtype=torch.float64)
        inner = 2000 if n < 10000 else 5

        def fwd():
            with torch.no_grad():
                return rosen(x)

        def vg():
            xx = x.detach().requires_grad_()
            y = rosen(xx)
            y.backward()
            return y, xx.grad

        print("rosen_fwd_us_%d%s %.3f" % (n, suffix, med_us(fwd, 9, inner)))
        print("rosen_vg_us_%d%s %.3f" % (n, suffix, med_us(vg, 9, inner)))
    sys.stdout.flush()

torch.manual_seed(0)
sizes = [784, 256, 256, 10]
ws = [(torch.randn(sizes[i], sizes[i + 1]) * 0.05).requires_grad_() for i in range(3)]
bs = [torch.zeros(sizes[i + 1]).requires_grad_() for i in range(3)]
xb = torch.randn(128, 784)
yb = torch.randint(0, 10, (128,))


def mlp_step():
    h = xb
    for i in range(3):
        h = h @ ws[i] + bs[i]
        if i < 2:
            h = torch.tanh(h)
    loss = torch.nn.functional.cross_entropy(h, yb)
    for p in ws + bs:
        p.grad = None
    loss.backward()
    return loss


for t in (1, 2):
    torch.set_num_threads(t)
    print("mlp_us_t%d %.3f" % (t, med_us(mlp_step, 15, 20)))

# tiny MLP 2-32-32-1, batch 16, mean squared error: forward + backward
tsz = [2, 32, 32, 1]
tws = [(torch.randn(tsz[i], tsz[i + 1]) * 0.3).requires_grad_() for i in range(3)]
tbs = [torch.zeros(tsz[i + 1]).requires_grad_() for i in range(3)]
tx = torch.randn(16, 2)
ty = torch.randn(16, 1)


def tiny_step():
    h = tx
    for i in range(3):
        h = h @ tws[i] + tbs[i]
        if i < 2:
            h = torch.tanh(h)
    loss = ((h - ty) ** 2).mean()
    for p in tws + tbs:
        p.grad = None
    loss.backward()
    return loss


for t in (1, 2):
    torch.set_num_threads(t)
    print("tiny_us%s %.3f" % ("" if t == 1 else "_t%d" % t, med_us(tiny_step, 15, 200)))
sys.stdout.flush()
