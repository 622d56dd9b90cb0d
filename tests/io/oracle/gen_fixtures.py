#!/usr/bin/env python3
"""gen_fixtures.py -- a safetensors file written by the official library, and its expected contents.

    build/peers/bin/python tests/io/oracle/gen_fixtures.py

Needs the `safetensors` package and numpy. Writes, beside this script:

  official_mixed.safetensors  safetensors.numpy.save_file of the tensors below with
                              __metadata__ {"format": "np", "note": "fixture"}
  official_mixed.txt          '#' comment lines (versions, the header length, the file's sha256,
                              the official writer's buffer layout), then exactly what
                              `st_read.py official_mixed.safetensors` prints, then one line per
                              element:  value <name> <flat row-major index> <value>
                              (floats: Python repr of the value as a double -- strtod gives it
                              back exactly, and an F32 value converts to float exactly; also
                              nan, inf, -inf, -0.0; ints: decimal; BOOL: 0 or 1)

Deterministic: fixed values, no randomness. Checks: the file read back with the official
library equals the input bit for bit; st_read.py (imported, and run under /usr/bin/python3
when present) accepts it in both modes and prints the lines in the .txt; the values in the
.txt parse back to the same bits.
"""
import hashlib
import math
import os
import platform
import struct
import subprocess
import sys

import numpy as np
import safetensors
from safetensors.numpy import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ beside the oracle files
sys.path.insert(0, HERE)
import st_read  # noqa: E402

ST = os.path.join(HERE, "official_mixed.safetensors")
TXT = os.path.join(HERE, "official_mixed.txt")
METADATA = {"format": "np", "note": "fixture"}

F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)          # smallest normal
F32_SUB = float(np.float32(2.0**-149))               # smallest subnormal
I32 = np.iinfo(np.int32)
I64 = np.iinfo(np.int64)


def tensors():
    f32, f64, i32, i64, b = np.float32, np.float64, np.int32, np.int64, np.bool_
    return {
        # F32, ranks 0..3
        "layers.0.weight": np.array([[1.5, -2.25, 0.1], [F32_MAX, F32_TINY, -0.0]], f32),
        "layers.0.bias": np.array([0.0, F32_SUB, -1.0 / 3.0], f32),
        "layers.2.kernel": np.arange(-6, 6, dtype=f32).reshape(2, 3, 2) / f32(4),
        "temperature": np.array(0.7, f32),
        "special.f32": np.array([math.inf, -math.inf, math.nan, -0.0, 1e-40], f32),
        "empty": np.zeros((0, 3), f32),
        # F64
        "layers.1.weight": np.array([[[0.1, -0.2], [1.0 / 3.0, math.pi]],
                                     [[5e-324, -1.7976931348623157e308],
                                      [2.2250738585072014e-308, 1e100]]], f64),
        "layers.1.bias": np.array([-1.5, 2.0**-30], f64),
        "scale": np.array(math.e, f64),
        "special.f64": np.array([math.nan, math.inf, -math.inf, -0.0], f64),
        "grid": np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], f64) * 0.1,
        # I32
        "counts": np.array([I32.min, -1, 0, 1, I32.max], i32),
        "offset": np.array(-7, i32),
        "cube.i32": np.arange(6, dtype=i32).reshape(2, 1, 3) - 3,
        "table.i32": np.array([[10, -20], [30, -40]], i32),
        # I64
        "step": np.array(1234567890123, i64),
        "ids": np.array([[I64.min, -1], [1 << 40, I64.max]], i64),
        "empty.i64": np.zeros((0,), i64),
        "vol.i64": np.arange(8, dtype=i64).reshape(2, 2, 2) * -(1 << 33),
        "seq.i64": np.array([3, 1, 4, 1, 5], i64),
        # BOOL
        "mask": np.array([[[True, False], [False, True]], [[True, True], [False, False]]], b),
        "flag": np.array(True, b),
        "keep": np.array([False, True, True], b),
        "grid.mask": np.array([[True, False, True], [False, True, False]], b),
    }


def fmt(dtype, x):
    if dtype in ("F32", "F64"):
        return repr(float(x))
    if dtype == "BOOL":
        return "1" if bool(x) else "0"
    return str(int(x))


def value_lines(ts):
    out = []
    for name in sorted(ts):
        a = ts[name]
        dt = {"float32": "F32", "float64": "F64", "int32": "I32", "int64": "I64",
              "bool": "BOOL"}[a.dtype.name]
        for i, x in enumerate(a.reshape(-1)):
            out.append("value %s %d %s" % (st_read.esc(name), i, fmt(dt, x)))
    return out


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def main():
    ts = tensors()
    save_file(ts, ST, metadata=METADATA)
    os.chmod(ST, 0o644)  # the writer creates it 0600
    with open(ST, "rb") as f:
        data = f.read()
    # the official reader gives back the same bits
    back = load_file(ST)
    assert sorted(back) == sorted(ts)
    for k in ts:
        assert same_bits(back[k], ts[k]), k
    # the independent reader accepts it (both modes) and sees the same bytes
    parsed, meta = st_read.parse(data)
    assert st_read.parse(data, nabla=True)[1] == meta == METADATA
    for name, dtype, shape, raw in parsed:
        assert shape == ts[name].shape and raw == ts[name].tobytes(), name
    lines = st_read.report_lines(parsed, meta)
    if os.access("/usr/bin/python3", os.X_OK):
        out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "st_read.py"), ST],
                             check=True, capture_output=True).stdout.decode("utf-8")
        assert out.splitlines() == lines, "st_read.py under /usr/bin/python3 differs"
    # the header as the official writer laid it out
    (n,) = struct.unpack("<Q", data[:8])
    import json
    hdr = json.loads(data[8:8 + n])
    layout = sorted((v["data_offsets"][0], v["data_offsets"][1], k)
                    for k, v in hdr.items() if k != "__metadata__")
    vals = value_lines(ts)
    # the value lines parse back to the same bits
    for line in vals:
        _, name, idx, text = line.split(" ")
        a = ts[name].reshape(-1)
        x = a[int(idx)]
        if a.dtype.kind == "f":
            y = np.array(float(text), a.dtype)
            assert y.tobytes() == np.array(x).tobytes() or (math.isnan(x) and math.isnan(y)), line
        else:
            assert int(text) == int(x), line
    head = [
        "# official_mixed.safetensors, written by safetensors.numpy.save_file (gen_fixtures.py)",
        "# safetensors %s, numpy %s, Python %s" % (safetensors.__version__, np.__version__,
                                                   platform.python_version()),
        "# file_bytes %d" % len(data),
        "# file_sha256 %s" % hashlib.sha256(data).hexdigest(),
        "# header_length %d (the buffer starts at byte %d)" % (n, 8 + n),
        "# header_keys_in_order %s" % " ".join(hdr.keys()),
        "# layout <begin> <end> <name>, in buffer order:",
    ] + ["# layout %d %d %s" % e for e in layout] + [
        "# then: the lines st_read.py prints, then value <name> <flat index> <value>",
    ]
    with open(TXT, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(s + "\n" for s in head + lines + vals))
    print("wrote %s (%d bytes, %d tensors) and %s (%d value lines)"
          % (os.path.basename(ST), len(data), len(ts), os.path.basename(TXT), len(vals)))


if __name__ == "__main__":
    main()
