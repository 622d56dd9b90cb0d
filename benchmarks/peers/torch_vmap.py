"""Peer numbers for benchmarks/bench_vmap.c, measured with PyTorch (Debian's python3-torch,
run with /usr/bin/python3): per-example gradients of the MLP 784-256-256-10 (tanh hidden
layers, each example's own cross-entropy of log_softmax), f32, batch 128, 1 thread, as
vmap(grad(loss), in_dims=(None, 0, 0)) -- torch.func in PyTorch 2, functorch in 1.13.
Weights uniform in +-1/sqrt(fan_in), biases 0, x standard normal, labels (7 i + 3) mod 10.
Each sample is the mean over a burst of >= 20 ms of calls; S (default 11) samples.

    /usr/bin/python3 benchmarks/peers/torch_vmap.py [--samples S]

Prints "key value" lines: torch_version, vmap_api (torch.func or functorch), then
  pex_us    median µs per call (the 128 examples' gradients)
"""
import statistics
import sys
import time

import torch

try:
    from torch.func import grad, vmap
    API = "torch.func"
except ImportError:
    from functorch import grad, vmap
    API = "functorch"


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


def main(argv):
    samples = 11
    if len(argv) >= 2 and argv[0] == "--samples":
        samples = int(argv[1])
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    sizes = [784, 256, 256, 10]
    params = []
    for i in range(3):
        r = 1.0 / sizes[i] ** 0.5
        params.append(((torch.rand(sizes[i], sizes[i + 1], generator=g) * 2 - 1) * r,
                       torch.zeros(sizes[i + 1])))
    x = torch.randn(128, 784, generator=g)
    y = torch.tensor([(7 * i + 3) % 10 for i in range(128)])

    def loss(p, xi, yi):
        h = xi
        for k, (w, b) in enumerate(p):
            h = h @ w + b
            if k < 2:
                h = torch.tanh(h)
        return -torch.log_softmax(h, -1).gather(0, yi.reshape(1)).sum()

    f = vmap(grad(loss), in_dims=(None, 0, 0))
    print("torch_version", torch.__version__)
    print("vmap_api", API)
    sys.stdout.flush()
    print("pex_us %.1f" % med_us(lambda: f(params, x, y), samples))


if __name__ == "__main__":
    main(sys.argv[1:])
