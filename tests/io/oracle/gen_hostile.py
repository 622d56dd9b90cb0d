#!/usr/bin/env python3
"""gen_hostile.py -- writes the malformed (and a few valid) safetensors files of hostile/.

    /usr/bin/python3 tests/io/oracle/gen_hostile.py

Python standard library only. Every file is built here byte by byte (no safetensors
library), deterministically. Then each is read back with st_read.py (imported from this
directory) in both modes, the verdicts are checked against the case's kind, and
hostile/README.md is written with the table. Exits 1 if any verdict is not the expected one.

Kinds:
  format  breaks the safetensors format: the official library, st_read.py and
          st_read.py --nabla reject it.
  strict  the official library 0.8.0 accepts it, but it is ambiguous or malformed
          (a duplicate tensor name or metadata key, an unknown key, a null __metadata__, an
          entry or a dtype in serde's alternative forms):
          st_read.py rejects it in both modes, and so must nabla.
  nabla   a valid safetensors file beyond nabla's limits (dtype, rank 8, BOOL bytes, U+0000
          in a name): st_read.py accepts it, st_read.py --nabla rejects it.
  valid   valid_*.safetensors: every reader must accept it.
check_official.py (run with the official library) checks the official side of these claims.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "hostile")
sys.dont_write_bytecode = True  # no __pycache__ beside the oracle files
sys.path.insert(0, HERE)
import st_read  # noqa: E402


def header_bytes(h):
    if isinstance(h, bytes):
        return h
    if isinstance(h, str):
        return h.encode("utf-8")
    return json.dumps(h, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def st(h, buf=b"", pad=True):
    """8-byte length, the header (padded with spaces so the buffer starts at a multiple of 8,
    as the official writer does), the buffer."""
    hb = header_bytes(h)
    if pad:
        hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + buf


def raw(n, h, rest=b""):
    """A file with header length n whatever follows."""
    return struct.pack("<Q", n) + header_bytes(h) + rest


def t(dtype, shape, b, e):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


def ts(dtype, shape, b, e):
    """The same as JSON text, for headers written by hand."""
    return json.dumps(t(dtype, shape, b, e), separators=(",", ":"))


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def f64(*v):
    return struct.pack("<%dd" % len(v), *v)


def i32(*v):
    return struct.pack("<%di" % len(v), *v)


def i64(*v):
    return struct.pack("<%dq" % len(v), *v)


B4 = f32(1.5)
B8 = f32(1.5, -2.0)
B12 = f32(1.5, -2.0, 0.25)
B16 = f32(1.5, -2.0, 0.25, 8.0)


def cases():
    """(file name, kind, why it must be rejected / what it shows, bytes)."""
    A4 = ts("F32", [1], 0, 4)
    good = st({"a": t("F32", [4], 0, 16)}, B16)
    c = []

    def add(name, kind, why, data):
        c.append((name + ".safetensors", kind, why, data))

    # ---- lengths
    add("empty", "format", "0 bytes: no header length", b"")
    add("seven_bytes", "format", "7 bytes: shorter than the 8-byte header length",
        b"\x02\x00\x00\x00\x00\x00\x00")
    add("header_len_past_eof", "format", "header length 1000 in a 66-byte file",
        raw(1000, '{"a":%s}' % A4, B4))
    add("header_len_over_100mb", "format",
        "header length 100,000,001: over the official 100,000,000 limit (file is tiny)",
        raw(100_000_001, "{}      "))
    add("header_len_u64_max", "format",
        "header length 2^64-1: 8 + N overflows a u64", raw(2**64 - 1, "{}      "))
    add("header_len_zero", "format", "header length 0: an empty string is not JSON",
        raw(0, b""))
    # ---- the header's JSON
    add("header_not_json", "format", "header text is not JSON",
        st("{this is not json}"))
    add("header_json_array", "format", "header JSON is an array, not an object",
        st("[1,2,3]"))
    add("header_json_string", "format", "header JSON is a string, not an object",
        st('"tensors"'))
    full = ('{"a":%s}' % A4).encode()
    add("header_truncated_json", "format",
        "header length covers only the first 30 bytes of the JSON (cut inside the shape list)",
        raw(30, full[:30], full[30:] + B4))
    add("header_trailing_garbage", "format", "non-space bytes after the JSON object",
        st('{"a":%s} x' % A4, B4))
    add("header_nul_padding", "format",
        "header padded with NUL bytes instead of spaces (NUL is not JSON whitespace)",
        st(full + b"\x00" * (-len(full) % 8), B4, pad=False))
    add("header_nul_in_string", "format",
        "a raw NUL byte inside a name (JSON forbids raw control characters in strings)",
        st(b'{"a\x00b":' + A4.encode() + b"}", B4))
    add("header_utf8_bom", "format", "a UTF-8 byte order mark before the '{'",
        st(b"\xef\xbb\xbf" + full, B4))
    add("header_nan", "format", "NaN in a shape (accepted by Python's json, not JSON)",
        st('{"a":{"dtype":"F32","shape":[NaN],"data_offsets":[0,4]}}', B4))
    add("header_deeply_nested", "format",
        "10000 nested '[' (closed again) as a tensor entry: must fail by depth, not stack",
        st('{"a":' + "[" * 10000 + "]" * 10000 + "}"))
    add("header_deeply_nested_unclosed", "format",
        "10000 nested '[' and the header ends", st('{"a":' + "[" * 10000))
    add("name_invalid_utf8", "format", "byte 0xff inside a name: invalid UTF-8",
        st(b'{"a\xff":' + A4.encode() + b"}", B4))
    add("name_overlong_utf8", "format", "an overlong UTF-8 encoding (C0 AF for '/') in a name",
        st(b'{"a\xc0\xaf":' + A4.encode() + b"}", B4))
    add("name_lone_surrogate", "format", "a name with the escape \\ud800 (a lone surrogate)",
        st('{"a\\ud800":%s}' % A4, B4))
    # ---- entries
    add("tensor_not_object", "format", "a tensor entry that is an array",
        st('{"a":[0,4]}', B4))
    add("tensor_missing_dtype", "format", "a tensor entry without dtype",
        st('{"a":{"shape":[1],"data_offsets":[0,4]}}', B4))
    add("dtype_unknown", "format", "dtype 'F33' is not a safetensors dtype",
        st({"a": t("F33", [1], 0, 4)}, B4))
    add("dtype_lowercase", "format", "dtype 'f32': dtype strings are case-sensitive",
        st({"a": t("f32", [1], 0, 4)}, B4))
    add("dtype_not_string", "format", "dtype is the number 32",
        st({"a": t(32, [1], 0, 4)}, B4))
    add("shape_negative", "format", "shape [-1]", st({"a": t("F32", [-1], 0, 4)}, B4))
    add("shape_float", "format", "shape [1.0]: a dim must be a JSON integer",
        st('{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}', B4))
    add("shape_bool", "format", "shape [true]", st({"a": t("F32", [True], 0, 4)}, B4))
    add("shape_not_list", "format", "shape is the string \"1\"",
        st({"a": t("F32", "1", 0, 4)}, B4))
    add("shape_product_overflow", "format",
        "shape [2^32, 2^32]: the element count 2^64 overflows int64 and u64",
        st({"a": t("F32", [2**32, 2**32], 0, 4)}, B4))
    add("shape_count_over_int64", "format",
        "shape [2^62, 2]: 2^63 elements overflow int64 (and 2^65 bytes a u64)",
        st({"a": t("F32", [2**62, 2], 0, 4)}, B4))
    add("shape_bytes_overflow", "format",
        "F64 shape [2^61]: the count fits but 2^64 bytes overflow",
        st({"a": t("F64", [2**61], 0, 8)}, f64(1.0)))
    add("shape_dim_over_u64", "format", "shape [2^64]: a dim no 64-bit integer holds",
        st({"a": t("F32", [2**64], 0, 4)}, B4))
    add("shape_huge_product_then_zero", "format",
        "shape [2^40, 2^40, 0]: the running product overflows before the 0",
        st({"a": t("F32", [2**40, 2**40, 0], 0, 0)}))
    add("subbyte_not_whole_bytes", "format", "3 elements of F4 are 12 bits, not whole bytes",
        st({"a": t("F4", [3], 0, 2)}, b"\x00\x00"))
    add("offsets_out_of_buffer", "format", "data_offsets [8, 16] in an 8-byte buffer",
        st({"a": t("F32", [2], 8, 16)}, B8))
    add("offsets_huge", "format", "data_offsets [2^63, 2^63+4]",
        st({"a": t("F32", [1], 2**63, 2**63 + 4)}, B4))
    add("offsets_end_before_begin", "format", "data_offsets [8, 4]",
        st({"a": t("F32", [1], 8, 4)}, B8))
    add("offsets_negative", "format", "data_offsets [-4, 0]",
        st({"a": t("F32", [1], -4, 0)}, B4))
    add("offsets_size_mismatch", "format", "F32 [3] needs 12 bytes, data_offsets [0, 8] give 8",
        st({"a": t("F32", [3], 0, 8)}, B8))
    add("offsets_three", "format", "data_offsets [0, 4, 4]: not two integers",
        st('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}}', B4))
    add("tensors_overlap", "format", "a = [0, 8] and b = [4, 12] share bytes 4..8",
        st({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}, B12))
    add("tensors_nested", "format", "b = [4, 8] lies inside a = [0, 8]",
        st({"a": t("F32", [2], 0, 8), "b": t("F32", [1], 4, 8)}, B8))
    add("tensors_gap", "format", "a = [0, 4], b = [8, 12]: bytes 4..8 belong to no tensor",
        st({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}, B12))
    add("buffer_trailing_bytes", "format", "the tensors cover 4 of the buffer's 8 bytes",
        st({"a": t("F32", [1], 0, 4)}, B8))
    add("buffer_truncated", "format",
        "a valid file (F32 [4] at [0, 16]) cut 8 bytes short", good[:-8])
    add("zero_size_past_end", "format",
        "a zero-size tensor at [8, 8] in a 4-byte buffer",
        st({"a": t("F32", [1], 0, 4), "z": t("F32", [0], 8, 8)}, B4))
    add("duplicate_name_tiling", "format",
        "two tensors named a at [0, 4] and [4, 8] (the official reader keeps the second and "
        "then finds bytes 0..4 uncovered)",
        st('{"a":%s,"a":%s}' % (A4, ts("F32", [1], 4, 8)), B8))
    add("metadata_non_string", "format", "__metadata__ {\"k\": 1}: values must be strings",
        st({"__metadata__": {"k": 1}}))
    add("metadata_nested", "format", "__metadata__ value is an object",
        st({"__metadata__": {"k": {"x": "y"}}}))
    add("metadata_not_object", "format", "__metadata__ is a string",
        st({"__metadata__": "format"}))
    add("duplicate_key_in_tensor", "format",
        "one entry with dtype F32 and then dtype I32 (serde rejects a struct's duplicate field)",
        st('{"a":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}}', B4))
    add("duplicate_metadata", "format",
        "two __metadata__ objects (serde rejects it as a duplicate field)",
        st('{"__metadata__":{"k":"1"},"__metadata__":{"j":"2"}}'))
    # ---- accepted by the official library 0.8.0, but ambiguous or malformed
    add("duplicate_name", "strict",
        "two identical entries named a: the official reader keeps one silently",
        st('{"a":%s,"a":%s}' % (A4, A4), B4))
    add("duplicate_name_retyped", "strict",
        "a as F32 then a as I32 at the same bytes: readers that keep the first and the last "
        "see different tensors",
        st('{"a":%s,"a":%s}' % (A4, ts("I32", [1], 0, 4)), B4))
    add("duplicate_metadata_key", "strict", "__metadata__ with key k twice",
        st('{"__metadata__":{"k":"1","k":"2"}}'))
    add("tensor_extra_key", "strict", "a tensor entry with a fourth key \"x\"",
        st('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":[]}}', B4))
    add("tensor_as_array", "strict",
        "a tensor entry written as the array [\"F32\", [1], [0, 4]] (serde reads a struct "
        "from a sequence)", st('{"a":["F32",[1],[0,4]]}', B4))
    add("dtype_as_object", "strict",
        "dtype written as {\"F32\": null} (serde reads an enum from a one-key map)",
        st('{"a":{"dtype":{"F32":null},"shape":[1],"data_offsets":[0,4]}}', B4))
    add("metadata_null", "strict", "\"__metadata__\": null",
        st('{"__metadata__":null,"a":%s}' % A4, B4))
    # ---- valid safetensors beyond nabla's limits
    add("rank_100", "nabla", "shape of 100 dims (all 1): over nabla's rank limit 8",
        st({"a": t("F32", [1] * 100, 0, 4)}, B4))
    add("rank_9", "nabla", "shape of 9 dims (all 1): one over nabla's rank limit 8",
        st({"a": t("F32", [1] * 9, 0, 4)}, B4))
    add("dtype_f16", "nabla", "dtype F16: a safetensors dtype nabla does not support",
        st({"a": t("F16", [2], 0, 4)}, b"\x00\x3c\x00\xc0"))
    add("bool_byte_2", "nabla", "a BOOL tensor holding the byte 2",
        st({"a": t("BOOL", [4], 0, 4)}, b"\x00\x01\x02\x01"))
    add("name_escaped_nul", "nabla", "a name with the escape \\u0000 (U+0000 in a C string)",
        st('{"a\\u0000b":%s}' % A4, B4))
    # ---- valid
    add("valid_empty", "valid", "no tensors, no metadata: the header {} and no buffer",
        st({}))
    add("valid_metadata_only", "valid", "only __metadata__, no tensors",
        st({"__metadata__": {"format": "pt", "empty": ""}}))
    add("valid_scalar_f32", "valid", "one F32 scalar", st({"x": t("F32", [], 0, 4)}, f32(-0.5)))
    buf = f64(2.5) + i64(-(2**63), 2**63 - 1) + f32(1.0, -0.0) + i32(-7, 0, 7, 2**31 - 1) + b"\x01\x00\x01"
    add("valid_all_dtypes", "valid",
        "F64 [], I64 [2,1,1], F32 [2], I32 [2,2], BOOL [3]; header order differs from buffer "
        "order; metadata",
        st({"mask": t("BOOL", [3], 48, 51), "w": t("F32", [2], 24, 32),
            "ids": t("I64", [2, 1, 1], 8, 24), "__metadata__": {"format": "np"},
            "scale": t("F64", [], 0, 8), "n": t("I32", [2, 2], 32, 48)}, buf))
    add("valid_zero_size", "valid",
        "zero-size tensors at the buffer's start, middle and end, and a [0,3] one",
        st({"z0": t("F32", [0], 0, 0), "a": t("F32", [1], 0, 4), "z1": t("I64", [0, 3], 4, 4),
            "b": t("F32", [1], 4, 8), "z2": t("BOOL", [2, 0], 8, 8)}, B8))
    add("valid_unpadded", "valid",
        "header not padded: the buffer starts at byte 63 (the official reader accepts it)",
        st('{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}', f64(3.0), pad=False))
    add("valid_whitespace", "valid",
        "pretty-printed header with leading and trailing JSON whitespace (\\n, \\t, spaces)",
        st("\n\t " + json.dumps({"a": t("F32", [2], 0, 8)}, indent=2) + "\n\t", B8))
    add("valid_large_padding", "valid", "a header padded with 4096 spaces",
        st(full + b" " * 4096, B4))
    add("valid_unicode_names", "valid",
        "names: raw UTF-8, a \\u escape, space, quote, backslash, newline, dots",
        st('{"\u00e9":%s,"\\u00e9x":%s,"a b":%s,"q\\"uote":%s,"back\\\\slash":%s,'
           '"line\\nbreak":%s,"\u5c42.0.w":%s}'
           % tuple(ts("F32", [1], 4 * i, 4 * i + 4) for i in range(7)),
           f32(*range(7))))
    add("valid_rank8", "valid", "a shape of 8 dims (nabla's limit)",
        st({"a": t("I32", [1, 2, 1, 2, 1, 1, 1, 1], 0, 16)}, i32(1, 2, 3, 4)))
    return c


def verdict(data, nabla):
    try:
        st_read.parse(data, nabla)
        return True, ""
    except st_read.Invalid as e:
        return False, str(e)


README_HEAD = """\
# Hostile safetensors files

Seed corpus for a safetensors loader fuzzer and for tests that every malformed file is
rejected cleanly (an error, never a crash, a hang or a read out of bounds). Made by
`../gen_hostile.py` with Python's standard library only: every byte is written by hand, no
safetensors library is involved. The script reads each file back with `../st_read.py` and
checks the verdicts below; `../check_official.py` checks the official library's (safetensors
0.8.0) and writes `official_verdicts.txt`.

Kinds:

- **format**: breaks the safetensors format. The official library, `st_read.py` and
  `st_read.py --nabla` all reject it.
- **strict**: the official library 0.8.0 accepts it, yet it is ambiguous or malformed.
  `st_read.py` rejects it in both modes, and nabla's loader must too. The cases: a tensor
  name or a metadata key twice (the official serde_json map keeps the last one silently, so
  `duplicate_name_retyped` is an F32 to a reader that keeps the first and an I32 to one that
  keeps the last); an unknown key in a tensor entry (ignored); a null `__metadata__` (taken
  as absent); a tensor entry written as the JSON array `["F32", [1], [0, 4]]`, or a dtype
  written as `{"F32": null}` (serde's derived deserializers take both forms). A key twice
  inside one tensor entry, or two `__metadata__`, the official library does reject (serde's
  "duplicate field"): those files are of the format kind.
- **nabla**: a valid safetensors file beyond nabla's limits (dtypes F32 F64 I32 I64 BOOL,
  rank <= 8, BOOL bytes 0/1, no U+0000 in names). The official library and `st_read.py`
  accept it; `st_read.py --nabla` and nabla's loader must reject it.
- **valid** (`valid_*.safetensors`): everyone must accept it.

Every file except `valid_*` must be rejected by nabla's loader. The message column is
`st_read.py`'s (with `--nabla` for the nabla kind).

| file | bytes | kind | why | st_read.py says |
| --- | --- | --- | --- | --- |
"""


def main():
    os.makedirs(OUT, exist_ok=True)
    cs = cases()
    names = [n for n, _, _, _ in cs]
    assert len(set(names)) == len(names)
    for f in os.listdir(OUT):
        if f.endswith(".safetensors") and f not in names:
            os.remove(os.path.join(OUT, f))
    rows = []
    bad = 0
    for name, kind, why, data in cs:
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        ok_plain, msg_plain = verdict(data, False)
        ok_nabla, msg_nabla = verdict(data, True)
        want_plain, want_nabla = {"format": (False, False), "strict": (False, False),
                                  "nabla": (True, False), "valid": (True, True)}[kind]
        good = ok_plain == want_plain and ok_nabla == want_nabla
        bad += not good
        said = msg_nabla if kind == "nabla" else msg_plain
        print("%-5s %-7s %-40s plain=%s nabla=%s %s" % ("ok" if good else "WRONG", kind, name,
              "accept" if ok_plain else "reject", "accept" if ok_nabla else "reject", said))
        cell = (said or "accepted").replace("|", "\\|")
        rows.append("| `%s` | %d | %s | %s | %s |\n" % (name, len(data), kind,
                                                         why.replace("|", "\\|"), cell))
    with open(os.path.join(OUT, "README.md"), "w", encoding="utf-8") as f:
        f.write(README_HEAD)
        f.writelines(rows)
    print("%d files, %d with an unexpected verdict" % (len(cs), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
