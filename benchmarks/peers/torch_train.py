"""Peer numbers for benchmarks/bench_train.c, measured with PyTorch (Debian's python3-torch,
run with /usr/bin/python3). One full Adam train step -- zero_grad, forward, loss, backward,
torch.optim.Adam(foreach=True).step() -- on a fixed synthetic batch, at 1 and then 2
threads (torch.set_num_threads; alternating the count sample by sample slows PyTorch's
2-thread steps by a third, so each count is measured in one block). Prints "key value"
lines (medians of 21 samples, each the mean of a burst of steps; µs unless said otherwise):
  torch_version                     the PyTorch version
  train_us_t<threads>               MLP 784-256-256-10, batch 128, f32, mean cross-entropy
  tiny_train_us_t<threads>          MLP 2-32-32-1, batch 16, f32, mean squared error
  train_loss_first / train_loss_last    the MLP's loss at the first and the last step run
                                    (a sanity check: it must decrease)
The data follow bench_train.c's formulas (weights uniform in +-1/sqrt(fan_in), biases 0,
labels (7 i + 3) mod 10, tiny targets sin(2 x0) cos(x1)); the random draws are torch's own
(seed 0), so the losses are alike, not equal.
"""
import math
import statistics
import sys
import time

import torch

LR = 1e-3


def med_us(fn, reps, inner):
    fn()
    s = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        s.append((time.perf_counter() - t0) / inner * 1e6)
    return statistics.median(s)


def make_params(sizes):
    ws, bs = [], []
    for i in range(3):
        r = 1.0 / math.sqrt(sizes[i])
        ws.append(((torch.rand(sizes[i], sizes[i + 1]) * 2 - 1) * r).requires_grad_())
        bs.append(torch.zeros(sizes[i + 1]).requires_grad_())
    return ws, bs


def forward(ws, bs, x):
    h = x
    for i in range(3):
        h = h @ ws[i] + bs[i]
        if i < 2:
            h = torch.tanh(h)
    return h


print("torch_version", torch.__version__)
sys.stdout.flush()
torch.manual_seed(0)

# MLP 784-256-256-10, batch 128, mean cross-entropy
ws, bs = make_params([784, 256, 256, 10])
xb = torch.randn(128, 784)
yb = torch.tensor([(7 * i + 3) % 10 for i in range(128)], dtype=torch.int64)
opt = torch.optim.Adam(ws + bs, lr=LR, foreach=True)
losses = []


def mlp_step():
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(forward(ws, bs, xb), yb)
    loss.backward()
    opt.step()
    losses.append(loss.item())


for t in (1, 2):
    torch.set_num_threads(t)
    print("train_us_t%d %.3f" % (t, med_us(mlp_step, 21, 10)))
print("train_loss_first %.6f" % losses[0])
print("train_loss_last %.6f" % losses[-1])
sys.stdout.flush()

# tiny MLP 2-32-32-1, batch 16, mean squared error
tws, tbs = make_params([2, 32, 32, 1])
tx = torch.rand(16, 2) * 2 - 1
ty = (torch.sin(2 * tx[:, 0]) * torch.cos(tx[:, 1])).reshape(16, 1)
topt = torch.optim.Adam(tws + tbs, lr=LR, foreach=True)


def tiny_step():
    topt.zero_grad(set_to_none=True)
    loss = ((forward(tws, tbs, tx) - ty) ** 2).mean()
    loss.backward()
    topt.step()
    return loss


for t in (1, 2):
    torch.set_num_threads(t)
    print("tiny_train_us_t%d %.3f" % (t, med_us(tiny_step, 21, 100)))
sys.stdout.flush()
