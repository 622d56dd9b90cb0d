"""Oracle for nabla's optimizers (tests/optim): PyTorch (torch.optim) trajectories on the fixed
f64 least-squares problem of gen_optax_optim.py, compared with Optax's.

Run with Debian's python3 and python3-torch (apt-get install python3-torch), after
gen_optax_optim.py (this script reads optax_optim.txt beside it for the comparisons):
    /usr/bin/python3 tests/optim/oracle/gen_torch_optim.py > tests/optim/oracle/torch_optim.txt
See README.md beside this script for the problem and the line formats.
"""
import math
import os
import sys

import numpy as np
import torch

M, N, STEPS = 20, 5, 50
HERE = os.path.dirname(os.path.abspath(__file__))

# math.sin/math.cos (the C library's): the same doubles as gen_optax_optim.py and a C test.
A = torch.tensor([[math.sin(1.0 + i * N + j) for j in range(N)] for i in range(M)],
                 dtype=torch.float64)
Y = torch.tensor([math.cos(0.5 * i) for i in range(M)], dtype=torch.float64)

# name -> (expression, the Optax config in optax_optim.txt it should equal, or None)
CONFIGS = [
    ("sgd_momentum", "torch.optim.SGD(params, lr=0.05, momentum=0.9, foreach=False)",
     "sgd_momentum"),
    ("sgd_nesterov", "torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, foreach=False)",
     "sgd_nesterov"),
    ("adam", "torch.optim.Adam(params, lr=0.01, foreach=False)", "adam"),
    ("adamw", "torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, foreach=False)", "adamw"),
    ("rmsprop_eps_outside", "torch.optim.RMSprop(params, lr=0.01, alpha=0.9, eps=1e-8, foreach=False)",
     "rmsprop_eps_outside"),
    ("rmsprop_centered",
     "torch.optim.RMSprop(params, lr=0.01, alpha=0.9, eps=1e-8, centered=True, foreach=False)",
     "rmsprop_centered_eps_outside"),
    ("adagrad",
     "torch.optim.Adagrad(params, lr=0.1, initial_accumulator_value=0.1, eps=0.0, foreach=False)",
     "adagrad_eps0"),
]
# Comparisons that are expected NOT to agree, shown for contrast.
CONTRAST = [("rmsprop_eps_outside", "rmsprop"), ("rmsprop_centered", "rmsprop_centered"),
            ("adagrad", "adagrad")]


def traj(expr):
    w = torch.tensor([0.1 * (j + 1) for j in range(N)], dtype=torch.float64, requires_grad=True)
    b = torch.tensor(-0.2, dtype=torch.float64, requires_grad=True)
    params = [w, b]
    opt = eval(expr)
    out = [np.array([*w.detach().numpy(), b.item()])]
    for _ in range(STEPS):
        opt.zero_grad()
        loss = 0.5 * torch.mean((A @ w + b - Y) ** 2)
        loss.backward()
        opt.step()
        out.append(np.array([*w.detach().numpy(), b.item()]))
    return np.array(out)


def read_optax():
    path = os.path.join(HERE, "optax_optim.txt")
    rows, header = {}, []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                if line.startswith("# jax"):
                    header.append(line[2:].strip())
                continue
            parts = line.split()
            if parts[0] == "schedule":
                continue
            rows.setdefault(parts[0], []).append([float(v) for v in parts[2:]])
    return {k: np.array(v) for k, v in rows.items()}, header


def diffs(a, b):
    d = np.abs(a - b)
    rel = d / np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-300)
    return float(rel.max()), float(d.max())


def main():
    pr = sys.stdout.write
    optax_rows, optax_header = read_optax()
    trajs = {name: traj(expr) for name, expr, _ in CONFIGS}
    pr("# PyTorch oracle for tests/optim. Made by tests/optim/oracle/gen_torch_optim.py:\n")
    pr("#   /usr/bin/python3 tests/optim/oracle/gen_torch_optim.py > tests/optim/oracle/torch_optim.txt\n")
    pr("# torch %s (Debian python3-torch 1.13.1) numpy %s python %s, float64, CPU, foreach=False\n"
       % (torch.__version__, np.__version__, sys.version.split()[0]))
    pr("# Problem (f64): m=%d n=%d A[i][j] = sin(1.0 + i*n + j), y[i] = cos(0.5*i) (C library sin/cos);\n"
       % (M, N))
    pr("#   params [w f64[5], b f64[] (0-d)], w[j] = 0.1*(j+1), b = -0.2;\n")
    pr("#   loss = 0.5 * torch.mean((A @ w + b - y)**2); each step: zero_grad, loss.backward(), opt.step().\n")
    pr("# Lines: '<config> <step> <w0> <w1> <w2> <w3> <w4> <b>' for steps 0 (initial) .. %d, floats as repr.\n"
       % STEPS)
    pr("# Configs (import torch; params = [w, b]; the expression is eval'ed as written):\n")
    for name, expr, _ in CONFIGS:
        pr("#   config %s = %s\n" % (name, expr))
    pr("# Against optax_optim.txt (made with %s):\n" % "; ".join(optax_header))
    pr("# max relative difference over all steps and params (|a-b| / max(|a|,|b|)), max absolute:\n")
    for name, _, oname in CONFIGS:
        rel, ab = diffs(trajs[name], optax_rows[oname])
        pr("#   torch %s vs optax %s: max rel %.3g, max abs %.3g\n" % (name, oname, rel, ab))
    pr("# For contrast, settings that do not agree:\n")
    for name, oname in CONTRAST:
        rel, ab = diffs(trajs[name], optax_rows[oname])
        pr("#   torch %s vs optax %s: max rel %.3g, max abs %.3g\n" % (name, oname, rel, ab))
    pr("# So: RMSprop(alpha=0.9, eps=1e-8) == optax.rmsprop(0.01, decay=0.9, eps=1e-8, eps_in_sqrt=False)\n"
       "#   (PyTorch: g / (sqrt(nu) + eps)); RMSprop(centered=True) == optax.rmsprop(..., centered=True,\n"
       "#   eps_in_sqrt=False) (PyTorch: g / (sqrt(nu - mu**2) + eps)); Adagrad(initial_accumulator_value=0.1,\n"
       "#   eps=0) == optax.adagrad(0.1, initial_accumulator_value=0.1, eps=0.0) (PyTorch adds eps outside\n"
       "#   the sqrt, Optax inside: they differ for eps != 0, and their default eps and initial accumulator\n"
       "#   differ: PyTorch 1e-10 and 0, Optax 1e-7 and 0.1). AdamW: PyTorch p *= 1 - lr*wd, then the Adam\n"
       "#   step; Optax -lr*(adam + wd*p): equal. The remaining differences are rounding (e.g. g/d against\n"
       "#   g*(1/d), rsqrt, and the order of the gradient's sums).\n")
    for name, _, _ in CONFIGS:
        for step, r in enumerate(trajs[name]):
            pr("%s %d %s\n" % (name, step, " ".join(repr(float(v)) for v in r)))


if __name__ == "__main__":
    main()
