#!/usr/bin/env python3
"""check_official.py -- the official safetensors library's verdict on every file here.

    build/peers/bin/python tests/io/oracle/check_official.py

Needs the `safetensors` package (and numpy, for safe_open(framework="np")). Reads every
hostile/*.safetensors and official_mixed.safetensors with two official entry points:
safetensors.deserialize(bytes) and safe_open(path, "np") (whose header checks run on opening;
get_tensor is then called for every name, and a numpy limit it hits is noted, not counted). Writes hostile/official_verdicts.txt, one line per file:

    <file> <ACCEPT|REJECT> <deserialize's error, or the tensors it returned (names as st_read.py
    prints them)>

and checks the kinds of gen_hostile.py: "format" files rejected by both entry points, "strict",
"nabla" and "valid" files accepted by both (the official library is more lenient than
st_read.py for "strict"). Exits 1 when a verdict differs from that or the two entry points
disagree.
"""
import os
import sys

import safetensors
from safetensors import safe_open

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ beside the oracle files
sys.path.insert(0, HERE)
import gen_hostile  # noqa: E402
import st_read  # noqa: E402


def by_deserialize(data):
    try:
        got = safetensors.deserialize(data)
        names = ",".join(st_read.esc(n) for n, _ in sorted(got))
        return True, ("%d tensors: %s" % (len(got), names)) if got else "0 tensors"
    except Exception as e:  # noqa: BLE001 -- any error is a rejection
        return False, "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")


def by_safe_open(path):
    """(accepted, note): the header is validated when the file is opened; get_tensor then
    makes numpy arrays, and numpy's own limits (at most 64 dims) are noted, not counted."""
    try:
        with safe_open(path, framework="np") as f:
            f.metadata()
            names = list(f.keys())
            note = ""
            for k in names:
                try:
                    f.get_tensor(k)
                except ValueError as e:  # numpy, not the format
                    note = " (safe_open: numpy cannot hold it: %s)" % str(e).splitlines()[0]
        return True, note
    except Exception:  # noqa: BLE001
        return False, ""


def main():
    kinds = {name: kind for name, kind, _, _ in gen_hostile.cases()}
    files = [os.path.join("hostile", n) for n in sorted(kinds)]
    files.append("official_mixed.safetensors")
    lines = ["# safetensors %s: deserialize() verdict per file (made by check_official.py)\n"
             % safetensors.__version__]
    bad = 0
    for rel in files:
        path = os.path.join(HERE, rel)
        with open(path, "rb") as f:
            data = f.read()
        ok, what = by_deserialize(data)
        ok2, note = by_safe_open(path)
        what += note
        kind = kinds.get(os.path.basename(rel), "valid")
        want = kind != "format"
        good = ok == want and ok2 == ok
        bad += not good
        print("%-5s %-7s %-45s deserialize=%s safe_open=%s %s" % (
            "ok" if good else "WRONG", kind, rel, "accept" if ok else "reject",
            "accept" if ok2 else "reject", what))
        lines.append("%s %s %s\n" % (rel, "ACCEPT" if ok else "REJECT", what))
    with open(os.path.join(HERE, "hostile", "official_verdicts.txt"), "w", encoding="utf-8") as f:
        f.writelines(lines)
    print("%d files, %d with an unexpected verdict" % (len(files), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
