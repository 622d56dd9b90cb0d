"""Peer numbers for benchmarks/bench_layers.c, measured with PyTorch (Debian's python3-torch,
run with /usr/bin/python3), f32, 1 thread (torch.set_num_threads(1)). Weights from the
torch.nn modules' default init (torch.manual_seed(0)), data fixed random (torch's own
draws: the values differ from bench_layers', the work does not). Each sample is the mean
over a burst of >= 20 ms of calls; S (default 11) samples; medians printed.

    /usr/bin/python3 benchmarks/peers/torch_layers.py [--samples S]

Measured (median µs per call):
  cnn_us    one Adam(lr 1e-3, foreach=True when the version has it) train step -- zero_grad,
            forward, F.cross_entropy (mean), loss.backward(), opt.step() -- of the digits
            CNN, batch 64, x [64, 1, 8, 8] (NCHW), labels in 0..9: Conv2d(1->16, 3x3, pad 1)
            -> ReLU -> Conv2d(16->32, 3x3, pad 1) -> ReLU -> MaxPool2d(2, 2) -> Flatten
            [64, 512] -> Linear(512->64) -> ReLU -> Linear(64->10)
  gru_us    the same kind of Adam step for a character LM: nn.Embedding(65, 32) ->
            nn.GRU(32, 128, num_layers=2, batch_first=True) -> nn.Linear(128, 65), batch 32,
            sequence 64, mean cross-entropy over all 32*64 positions
  conv_{a,b,c}_fwd_us / conv_{a,b,c}_fwdbwd_us   F.conv2d with bias, 3x3, stride 1, pad 1
            (weights of an nn.Conv2d): a: x [32, 3, 32, 32] -> 16 channels; b: x [32, 32,
            16, 16] -> 64; c: x [8, 64, 28, 28] -> 64. fwd = y = conv(x) under
            torch.no_grad(); fwdbwd = torch.autograd.grad(sum(conv(x) * r), (x, w, b)) with
            x, w, b requiring grad and r fixed random of y's shape

Prints "key value" lines: torch_version, adam_foreach (1 or 0), mkldnn_available
(torch.backends.mkldnn.is_available()), mkldnn_enabled (torch.backends.mkldnn.enabled: when
both are 1, f32 CPU convolutions may go through oneDNN), conv_mkldnn (1 when the autograd
profiler shows aten::mkldnn_convolution for a forward of conv a: oneDNN is the path taken;
all the shapes here, batch > 1 and 3x3, take the same one), threads, then the keys above.
"""
import inspect
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn


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


FOREACH = "foreach" in inspect.signature(torch.optim.Adam).parameters


def adam(params):
    if FOREACH:
        return torch.optim.Adam(params, lr=1e-3, foreach=True)
    return torch.optim.Adam(params, lr=1e-3)


class CharGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(65, 32)
        self.gru = nn.GRU(32, 128, num_layers=2, batch_first=True)
        self.out = nn.Linear(128, 65)

    def forward(self, tokens):  # [32, 64] -> [32, 64, 65]
        h, _ = self.gru(self.emb(tokens))
        return self.out(h)


def train_step_us(model, x, y, samples):
    opt = adam(model.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()

    return med_us(step, samples)


def conv_case(name, shape, cout, samples):
    layer = nn.Conv2d(shape[1], cout, 3, padding=1)
    w = layer.weight.detach().clone().requires_grad_()
    b = layer.bias.detach().clone().requires_grad_()
    x = torch.randn(*shape).requires_grad_()
    r = torch.randn(shape[0], cout, shape[2], shape[3])

    def fwd():
        with torch.no_grad():
            F.conv2d(x, w, b, padding=1)

    def fwdbwd():
        torch.autograd.grad((F.conv2d(x, w, b, padding=1) * r).sum(), (x, w, b))

    print("conv_%s_fwd_us %.1f" % (name, med_us(fwd, samples)))
    print("conv_%s_fwdbwd_us %.1f" % (name, med_us(fwdbwd, samples)))


def conv_mkldnn():
    x, w = torch.randn(32, 3, 32, 32), torch.randn(16, 3, 3, 3)
    with torch.autograd.profiler.profile() as prof:
        F.conv2d(x, w, padding=1)
    return int(any(e.name == "aten::mkldnn_convolution" for e in prof.function_events))


def main(argv):
    samples = 11
    if len(argv) >= 2 and argv[0] == "--samples":
        samples = int(argv[1])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print("torch_version", torch.__version__)
    print("adam_foreach", int(FOREACH))
    print("mkldnn_available", int(torch.backends.mkldnn.is_available()))
    print("mkldnn_enabled", int(torch.backends.mkldnn.enabled))
    print("conv_mkldnn", conv_mkldnn())
    print("threads", torch.get_num_threads())
    sys.stdout.flush()
    cnn = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                        nn.MaxPool2d(2, 2), nn.Flatten(),
                        nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10))
    x = torch.randn(64, 1, 8, 8)
    y = torch.randint(0, 10, (64,))
    print("cnn_us %.1f" % train_step_us(cnn, x, y, samples))
    sys.stdout.flush()
    x = torch.randint(0, 65, (32, 64))
    y = torch.randint(0, 65, (32, 64))
    print("gru_us %.1f" % train_step_us(CharGRU(), x, y, samples))
    sys.stdout.flush()
    for name, shape, cout in (("a", (32, 3, 32, 32), 16), ("b", (32, 32, 16, 16), 64),
                              ("c", (8, 64, 28, 28), 64)):
        conv_case(name, shape, cout, samples)
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
