#!/usr/bin/env python3
"""Writes equinox_counts.txt: how many steps Equinox recomputes when it reverse-differentiates
a checkpointed while loop of n steps with c checkpoints.

Method: instrumentation, not a re-implementation. The loop body calls jax.debug.callback
once per evaluation, so the counter sees every body evaluation Equinox performs:
n in the forward loop, then one per iteration of its backward loop (either a recomputed
step or a U-turn, which evaluates the body under jax.vjp and applies the VJP). Each of the
n steps gets exactly one U-turn, so

    recomputations = evaluations - 2 n.

The loop is equinox.internal.while_loop(cond, body, init, kind="checkpointed",
checkpoints=c) with max_steps=None (Equinox's online algorithm: the step count is not
known in advance); cond is `i < n`, the body x -> sin(x) + x/2 on an f32[2] state, the
whole thing under jax.jit(jax.grad(...)) on the CPU.

Run with the peers' interpreter (JAX 0.10.2, Equinox 0.13.8 when this file was made):
    build/peers/bin/python tests/loops/oracle/gen_equinox_counts.py
"""
import os
import sys

import equinox
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import jaxlib

_count = [0]


def _tick():
    _count[0] += 1


def evaluations(n, c):
    """Body evaluations (forward + backward) of Equinox's checkpointed while loop."""

    def cond(carry):
        return carry[0] < n

    def body(carry):
        i, x = carry
        jax.debug.callback(_tick)
        return i + 1, jnp.sin(x) + 0.5 * x

    def loss(x):
        _, y = eqxi.while_loop(cond, body, (jnp.array(0), x), kind="checkpointed", checkpoints=c)
        return jnp.sum(y)

    _count[0] = 0
    jax.jit(jax.grad(loss))(jnp.ones(2, jnp.float32)).block_until_ready()
    return _count[0]


def rows():
    out = []
    # The grid of the issue (c = 1 only where its quadratic count stays small).
    for n in (10, 50, 100, 500, 1000, 4096):
        for c in (1, 2, 5, 12, 30, 100):
            if c == 1 and n > 100:
                continue
            out.append((n, c))
    # Both sides of the end of the optimal regime, n = (c+1)(c+2)/2 - 1 and the next two.
    for c in (2, 3, 5, 12, 30):
        u = (c + 1) * (c + 2) // 2
        out += [(u - 1, c), (u, c), (u + 1, c)]
    # The step orders pinned by Equinox's own tests (tests/test_while_loop.py): c = 4 and
    # n = 4..14, and a few small cases.
    out += [(n, 4) for n in range(4, 15)]
    out += [(3, 1), (5, 1), (8, 2), (5, 2), (11, 3), (5, 9)]
    # Longer loops with the default checkpoint count of the benchmarks' c values.
    out += [(10000, 10), (10000, 30), (10000, 100), (10000, 1000)]
    seen, uniq = set(), []
    for r in out:
        if r not in seen:
            seen.add(r)
            uniq.append(r)
    return sorted(uniq, key=lambda r: (r[1], r[0]))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "equinox_counts.txt")
    lines = [
        "# Equinox's checkpointed while loop: recomputed steps when reverse-differentiating",
        "# n steps with c checkpoints (equinox.internal.while_loop, kind=\"checkpointed\",",
        "# max_steps=None). Made by gen_equinox_counts.py beside this file, by counting body",
        "# evaluations with jax.debug.callback: recomputations = evaluations - 2 n (n forward",
        "# steps, n U-turns in the backward loop).",
        f"# equinox {equinox.__version__}, jax {jax.__version__}, jaxlib {jaxlib.__version__}",
        "# columns: n c recomputations evaluations",
    ]
    for n, c in rows():
        ev = evaluations(n, c)
        lines.append(f"{n} {c} {ev - 2 * n} {ev}")
        print(lines[-1], flush=True)
    published = {(4096, 30): 12770, (4096, 12): 19127}
    got = {}
    for line in lines:
        if not line.startswith("#"):
            n, c, r, _ = map(int, line.split())
            got[(n, c)] = r
    for key, want in published.items():
        if got[key] != want:
            sys.exit(f"n={key[0]} c={key[1]}: counted {got[key]}, published {want}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
