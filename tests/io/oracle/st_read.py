#!/usr/bin/env python3
"""st_read.py -- an independent, strict safetensors reader (Python standard library only).

    python3 st_read.py [--nabla] FILE

Validates FILE and prints, for each tensor sorted by name (code point order, which is also
UTF-8 byte order):

    <name> <dtype> <shape> <sha256 of the tensor's bytes>

<shape> is the comma-separated dims ("2,3", "0,3", "5") or "scalar" for rank 0. Then one line

    metadata <key> <value>

per __metadata__ entry, sorted by key. Names, keys and values are printed with every
backslash, whitespace character and non-printable character replaced by \\xHH escapes of its
UTF-8 bytes (a space is \\x20, a newline \\x0a, a backslash \\x5c), so each line splits on
single spaces into exactly its fields; other characters (including non-ASCII) are printed
as UTF-8.

On any violation it prints one line "st_read: FILE: <reason>" to stderr and exits 1. Usage
errors and unreadable files exit 2. Exit 0 means the file is valid.

Rules (the safetensors format as the official library 0.8.0 enforces it, with the points
marked [stricter] going beyond it):
  - the file has at least 8 bytes; N = little-endian u64 of the first 8; N <= 100,000,000
    (the official limit); 8 + N <= file size;
  - the N header bytes are valid UTF-8 and one JSON value (RFC 8259: no NaN/Infinity, no
    raw control characters in strings, leading/trailing JSON whitespace allowed, nothing
    else after the value); strings with lone surrogate escapes are rejected;
  - [stricter] no object anywhere in the header has a key twice (the official library's
    serde_json keeps the last one silently);
  - the value is an object; "__metadata__", when present, is an object of string values
    ([stricter] null is rejected; the official library takes it as absent);
  - every other entry is an object with dtype, shape and data_offsets ([stricter] and no
    other key; the official library ignores extra keys);
  - dtype is one of the official dtype strings (DTYPE_BITS below);
  - shape is a list of integers (JSON integers, not 1.0 or true), each 0 <= d <= 2^63-1,
    whose product is <= 2^63-1;
  - data_offsets is a list of exactly two integers 0 <= begin <= end <= buffer length, where
    the buffer is everything after the header; end - begin equals the tensor's byte size
    (product(shape) * bits / 8, which must be a whole number of bytes for the sub-byte
    dtypes F4, F6_*);
  - sorted by (begin, end), the tensors tile the buffer exactly: the first begins at 0, each
    begins where the previous ended (earlier: overlap; later: gap), the last ends at the
    buffer's end (no trailing bytes).

--nabla adds nabla's own limits (what nb_load accepts): dtype one of F32 F64 I32 I64 BOOL,
rank <= 8 (NB_MAX_RANK), BOOL bytes 0 or 1, no U+0000 in names, metadata keys or values.
"""
import hashlib
import json
import struct
import sys

MAX_HEADER = 100_000_000
INT64_MAX = 2**63 - 1

# Every dtype string safetensors 0.8.0 knows, with its size in bits.
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8,
    "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}
NABLA_DTYPES = ("F32", "F64", "I32", "I64", "BOOL")
NABLA_MAX_RANK = 8
TENSOR_KEYS = ("dtype", "shape", "data_offsets")


class Invalid(Exception):
    """The file breaks a rule; the message is one line."""


def esc(s):
    """A string as one space-free token: backslash, whitespace, non-printables as \\xHH."""
    out = []
    for ch in s:
        if ch == "\\" or ch.isspace() or not ch.isprintable():
            out.extend("\\x%02x" % b for b in ch.encode("utf-8", "surrogatepass"))
        else:
            out.append(ch)
    return "".join(out)


def _check_str(s, what):
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise Invalid("%s %s holds a lone surrogate" % (what, esc(s))) from None


def _pairs(pairs):
    d = {}
    for k, v in pairs:
        _check_str(k, "key")
        if k in d:
            raise Invalid("duplicate key %s in a JSON object" % esc(k))
        d[k] = v
    return d


def _no_constant(name):
    raise Invalid("%s is not JSON" % name)


def _int(v, what):
    if type(v) is not int:  # rejects floats such as 1.0 and booleans
        raise Invalid("%s is %s, not an integer" % (what, esc(json.dumps(v))[:60]))
    if v < 0:
        raise Invalid("%s is negative (%d)" % (what, v))
    if v > INT64_MAX:
        raise Invalid("%s (%d) exceeds 2^63-1" % (what, v))
    return v


def parse(data, nabla=False):
    """Validates the bytes of a whole file. Returns (tensors, metadata): tensors a list of
    (name, dtype, shape tuple, bytes) sorted by name, metadata a dict (empty if absent)."""
    if len(data) < 8:
        raise Invalid("%d bytes: too short for the 8-byte header length" % len(data))
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER:
        raise Invalid("header length %d exceeds the limit %d" % (n, MAX_HEADER))
    if 8 + n > len(data):
        raise Invalid("header length %d runs past the end of the %d-byte file" % (n, len(data)))
    try:
        text = data[8:8 + n].decode("utf-8")
    except UnicodeDecodeError as e:
        raise Invalid("header is not valid UTF-8 (byte %d)" % e.start) from None
    try:
        top = json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
    except RecursionError:
        raise Invalid("header JSON nests too deeply") from None
    except ValueError as e:  # json.JSONDecodeError and int conversion limits
        raise Invalid("header is not JSON: %s" % str(e).splitlines()[0]) from None
    if not isinstance(top, dict):
        raise Invalid("header JSON is a %s, not an object" % type(top).__name__)
    buf = data[8 + n:]
    metadata = {}
    entries = []
    for name, info in top.items():
        if name == "__metadata__":
            if not isinstance(info, dict):
                raise Invalid("__metadata__ is not an object")
            for k, v in info.items():
                if not isinstance(v, str):
                    raise Invalid("__metadata__ value of %s is not a string" % esc(k))
                _check_str(v, "__metadata__ value")
                if nabla and ("\0" in k or "\0" in v):
                    raise Invalid("nabla: __metadata__ entry %s holds U+0000" % esc(k))
            metadata = info
            continue
        who = "tensor %s" % esc(name)
        if nabla and "\0" in name:
            raise Invalid("nabla: %s: a name holding U+0000" % who)
        if not isinstance(info, dict):
            raise Invalid("%s: entry is not an object" % who)
        for k in TENSOR_KEYS:
            if k not in info:
                raise Invalid("%s: lacks %s" % (who, k))
        for k in info:
            if k not in TENSOR_KEYS:
                raise Invalid("%s: unknown key %s" % (who, esc(k)))
        dtype = info["dtype"]
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            raise Invalid("%s: unknown dtype %s" % (who, esc(json.dumps(dtype))[:40]))
        if nabla and dtype not in NABLA_DTYPES:
            raise Invalid("nabla: %s: dtype %s is not one nabla supports" % (who, dtype))
        shape = info["shape"]
        if not isinstance(shape, list):
            raise Invalid("%s: shape is not a list" % who)
        if nabla and len(shape) > NABLA_MAX_RANK:
            raise Invalid("nabla: %s: rank %d exceeds %d" % (who, len(shape), NABLA_MAX_RANK))
        count = 1
        for i, d in enumerate(shape):
            count *= _int(d, "%s: shape[%d]" % (who, i))
            if count > INT64_MAX:
                raise Invalid("%s: shape's element count overflows int64" % who)
        offs = info["data_offsets"]
        if not isinstance(offs, list) or len(offs) != 2:
            raise Invalid("%s: data_offsets is not a list of two integers" % who)
        begin = _int(offs[0], "%s: data_offsets[0]" % who)
        end = _int(offs[1], "%s: data_offsets[1]" % who)
        if end < begin:
            raise Invalid("%s: data_offsets end %d < begin %d" % (who, end, begin))
        if end > len(buf):
            raise Invalid("%s: data_offsets [%d, %d] lie outside the %d-byte buffer"
                          % (who, begin, end, len(buf)))
        bits = count * DTYPE_BITS[dtype]
        if bits % 8:
            raise Invalid("%s: %d elements of %s are not a whole number of bytes"
                          % (who, count, dtype))
        if bits // 8 > INT64_MAX:
            raise Invalid("%s: byte size overflows int64" % who)
        if end - begin != bits // 8:
            raise Invalid("%s: data_offsets [%d, %d] hold %d bytes but %s [%s] needs %d"
                          % (who, begin, end, end - begin, dtype,
                             ",".join(map(str, shape)), bits // 8))
        entries.append((begin, end, name, dtype, tuple(shape)))
    pos = 0
    prev = None
    for begin, end, name, dtype, shape in sorted(entries):
        if begin < pos:
            raise Invalid("tensors %s and %s overlap" % (esc(prev), esc(name)))
        if begin > pos:
            raise Invalid("a gap of %d bytes at buffer offset %d (before %s)"
                          % (begin - pos, pos, esc(name)))
        pos = end
        prev = name
    if pos != len(buf):
        raise Invalid("tensors cover %d of the %d buffer bytes" % (pos, len(buf)))
    tensors = []
    for begin, end, name, dtype, shape in sorted(entries, key=lambda e: e[2]):
        raw = buf[begin:end]
        if nabla and dtype == "BOOL":
            bad = [b for b in raw if b > 1]
            if bad:
                raise Invalid("nabla: tensor %s is BOOL but holds byte %d" % (esc(name), bad[0]))
        tensors.append((name, dtype, shape, raw))
    return tensors, metadata


def report_lines(tensors, metadata):
    """The output lines (without newlines) for parse()'s result."""
    lines = []
    for name, dtype, shape, raw in tensors:
        dims = ",".join(str(d) for d in shape) if shape else "scalar"
        lines.append("%s %s %s %s" % (esc(name), dtype, dims, hashlib.sha256(raw).hexdigest()))
    for k in sorted(metadata):
        lines.append("metadata %s %s" % (esc(k), esc(metadata[k])))
    return lines


def main(argv):
    args = argv[1:]
    nabla = "--nabla" in args
    args = [a for a in args if a != "--nabla"]
    if len(args) != 1 or args[0].startswith("-"):
        sys.stderr.write("usage: st_read.py [--nabla] FILE\n")
        return 2
    path = args[0]
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        sys.stderr.write("st_read: %s: %s\n" % (path, e.strerror))
        return 2
    try:
        tensors, metadata = parse(data, nabla)
    except Invalid as e:
        sys.stderr.write("st_read: %s: %s\n" % (path, e))
        return 1
    out = "".join(line + "\n" for line in report_lines(tensors, metadata))
    sys.stdout.buffer.write(out.encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
