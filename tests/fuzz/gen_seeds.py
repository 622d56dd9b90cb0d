#!/usr/bin/env python3
"""gen_seeds.py -- writes the fuzzers' seed corpora (tests/fuzz/README.md).

    python3 tests/fuzz/gen_seeds.py

Python standard library only, deterministic. Rewrites every file in corpus_safetensors/
and corpus_csv/ (and removes nothing else). The hostile and valid safetensors files of
tests/io/oracle/hostile/ are a second safetensors seed directory that run_fuzz.sh passes
to the fuzzer as they are; the seeds here add what they lack: files in nabla's own form,
whose __metadata__ "nabla.tree" encodes the tree (every node kind, static leaves, frozen
marks), a few broken tree encodings, and files from other writers.

CSV seeds are one flag byte (options and zlib path, see fuzz_csv.c) then the file.
"""
import gzip
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ST_DIR = os.path.join(HERE, "corpus_safetensors")
CSV_DIR = os.path.join(HERE, "corpus_csv")

DT = {"F32": ("<f", 4), "F64": ("<d", 8), "I32": ("<i", 4), "I64": ("<q", 8), "BOOL": ("<B", 1)}


def tensor(dtype, shape, values):
    fmt, _ = DT[dtype]
    return dtype, list(shape), b"".join(struct.pack(fmt, v) for v in values)


def st_file(tensors, metadata=None, pad=True):
    """tensors: list of (name, (dtype, shape, bytes)) in data order."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, (dtype, shape, raw) in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    hb = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if pad:
        hb += b" " * (-(8 + len(hb)) % 8)
    return struct.pack("<Q", len(hb)) + hb + data


def nabla(tree, tensors):
    return st_file(tensors, {"format": "nabla", "nabla.tree": tree})


def s(text):
    """the tree encoding of a string: S<n>:<bytes> (n counts UTF-8 bytes)"""
    return "S%d:%s" % (len(text.encode("utf-8")), text)


def k(key):
    return "%d:%s" % (len(key.encode("utf-8")), key)


def safetensors_seeds():
    w1 = tensor("F32", [2, 3], [0.5, -1.0, 2.0, 0.0, -0.0, 3.25])
    b1 = tensor("F32", [3], [0.1, 0.2, 0.3])
    w2 = tensor("F64", [3, 1], [1.0, float("inf"), float("nan")])
    b2 = tensor("F64", [1], [-2.5])
    out = {}
    # an MLP's parameters: dict(layers=list(dict(b, w), dict(b, w)), act="relu")
    out["nabla_mlp"] = nabla(
        "D2(" + k("act") + s("relu") + k("layers") + "L2(D2(" + k("b") + "A" + k("w") + "A)D2("
        + k("b") + "A" + k("w") + "A)))",
        [("layers.0.b", b1), ("layers.0.w", w1), ("layers.1.b", b2), ("layers.1.w", w2)])
    # every static leaf kind, a null, a frozen array, a tuple
    out["nabla_statics"] = nabla(
        "T8(NI-42;F0x1.8p+1;B1B0" + s("héllo") + "!AI9223372036854775807;)",
        [("6", tensor("I32", [2], [7, -7]))])
    # every dtype, a scalar, an empty array, a frozen static leaf
    out["nabla_dtypes"] = nabla(
        "D7(" + k("bool") + "A" + k("empty") + "A" + k("f32") + "A" + k("f64") + "A" + k("i32")
        + "A" + k("i64") + "A" + k("lr") + "!F0x1.999999999999ap-4;)",
        [("bool", tensor("BOOL", [4], [0, 1, 1, 0])), ("empty", tensor("F32", [0, 3], [])),
         ("f32", tensor("F32", [], [1.5])), ("f64", tensor("F64", [2, 2], [1, 2, 3, 4])),
         ("i32", tensor("I32", [1, 1, 1], [-2147483648])),
         ("i64", tensor("I64", [2], [-1, 2**63 - 1]))])
    # nested lists ten deep around one array
    out["nabla_deep"] = nabla("L1(" * 10 + "A" + ")" * 10,
                              [(".".join(["0"] * 10), tensor("F32", [1], [1.0]))])
    # keys with dots, unicode, escapes (JSON \u escapes in the header)
    out["nabla_keys"] = nabla(
        "D3(" + k("a.b") + "A" + k("é\"\\") + "A" + k("😀") + "N)",
        [("a.b", tensor("I64", [1], [5])), ("é\"\\", tensor("F64", [], [0.25]))])
    # the deepest tree nabla reads (NB_TREE_MAX_DEPTH 256 levels below the root), and one
    # deeper
    out["nabla_depth_limit"] = nabla("L1(" * 256 + "N" + ")" * 256, [])
    out["nabla_bad_too_deep"] = nabla("L1(" * 257 + "N" + ")" * 257, [])
    # two leaves stored under one name (a key with a dot and a nested path): both read the
    # same tensor, and nb_save refuses to write the tree back
    out["nabla_dot_collision"] = nabla(
        "D2(" + k("a") + "D1(" + k("b") + "A)" + k("a.b") + "A)",
        [("a.b", tensor("F32", [2], [1.0, 2.0]))])
    out["nabla_empty_tree"] = nabla("D0()", [])
    out["nabla_null"] = nabla("N", [])
    # encodings nabla must refuse
    out["nabla_bad_fnref"] = nabla("D1(" + k("act") + "R4:relu)", [])
    out["nabla_bad_unclosed"] = nabla("L2(NN", [])
    out["nabla_bad_missing_tensor"] = nabla("D1(" + k("w") + "A)", [])
    out["nabla_bad_trailing"] = nabla("NN", [])
    out["nabla_bad_dup_key"] = nabla("D2(" + k("a") + "N" + k("a") + "N)", [])
    out["nabla_bad_frozen_node"] = nabla("!L1(N)", [])
    out["nabla_bad_frozen_end"] = nabla("L1(!", [])
    # other writers: no tree, names sorted into a dict
    out["foreign_flat"] = st_file(
        [("z.weight", w1), ("a.bias", b1), ("mask", tensor("BOOL", [3], [1, 0, 1]))],
        {"framework": "pt", "note": "no nabla.tree"})
    out["foreign_unpadded"] = st_file([("x", tensor("I32", [3], [1, 2, 3]))], pad=False)
    out["foreign_empty"] = st_file([])
    return out


def csv_seeds():
    F = {"comma": 0, "semicolon": 1, "tab": 2, "byte": 3, "nolabels": 4, "f64": 8, "i64": 16,
         "nolabelsout": 32, "gzcopy": 64, "gzcut": 128}

    def seed(flags, text, delim=None):
        b = bytes([sum(F[f] for f in flags)])
        if delim is not None:
            b += delim.encode("latin-1")
        return b + (text if isinstance(text, bytes) else text.encode("utf-8"))

    iris = ("3,4,setosa,versicolor,virginica\n5.1,3.5,1.4,0.2,0\n7.0,3.2,4.7,1.4,1\n"
            "6.3,3.3,6.0,2.5,2\n")
    plain = "1,2,3,0\n4,5,6,1\n-7.5e-3,+8,0x1p3,2\n"
    out = {}
    out["iris_header"] = seed(["gzcopy"], iris)
    out["plain"] = seed([], plain)
    out["plain_f64_i64"] = seed(["f64", "i64", "gzcopy"], plain)
    out["semicolon"] = seed(["semicolon"], "1;2;0\n3;4;1\n")
    out["tab_nolabels"] = seed(["tab", "nolabels", "f64"], "1\t2\t3\n4\t5\t6\n")
    out["pipe_byte_delim"] = seed(["byte", "nolabelsout"], "a|b|label\n1|2|0\n3|4|1\n", "|")
    out["crlf_blank_spaces"] = seed(["gzcopy"], "x, y ,lab\r\n\r\n 1 , 2 , 0 \r\n\n3,4,1\r\n")
    out["no_final_newline"] = seed([], "1,2,0\n3,4,1")
    out["long_line"] = seed(["nolabels"], ",".join(str(i) for i in range(1500)) + "\n")
    out["edge_numbers"] = seed(["f64", "i64"], "1e308,-1e-320,0,9223372036854775807\n"
                               "4.9e-324,-0.0,1,-9223372036854775808\n")
    out["f32_overflow"] = seed([], "1e300,1,0\n")
    # malformed
    out["bad_ragged"] = seed([], "1,2,0\n3,4,5,1\n")
    out["bad_nan"] = seed([], "nan,1,0\n")
    out["bad_inf"] = seed(["f64"], "1,inf,0\n")
    out["bad_label"] = seed([], "1,2,2.5\n")
    out["bad_label_i32"] = seed([], "1,2,2147483648\n")
    out["bad_empty_field"] = seed([], "1,,0\n")
    out["bad_empty"] = seed([], "")
    out["bad_header_only"] = seed([], "a,b,c\n")
    out["bad_one_column"] = seed([], "1\n2\n")
    out["bad_header_counts"] = seed([], "5,2,a,b\n1,2,0\n")
    out["bad_nul_byte"] = seed([], b"1,2,0\n3,\x004,1\n")
    # a NUL cut the line there and glued the next line on, or dropped a row (gzgets)
    out["bad_nul_glues_lines"] = seed([], b"1,2,0\n3,4\x00junk\n,1\n")
    out["bad_nul_drops_row"] = seed([], b"1,2,0\n\x00\n\x003,4,1\n")
    out["bad_delim_nul"] = seed(["byte"], "1,2,0\n", "\0")
    out["bad_delim_quote"] = seed(["byte"], "1\"2\"0\n", '"')
    # gzip: a gzip file as the content itself (zlib reads it), a damaged one, and a
    # compressed copy cut short by the harness
    gz = gzip.compress(plain.encode(), mtime=0)
    out["gz_content"] = seed([], gz)
    out["gz_content_damaged"] = seed([], gz[:len(gz) // 2] + b"\xff" * 8)
    out["gz_content_badcrc"] = seed([], gz[:-8] + b"\0" * 8)
    out["gz_cut"] = seed(["gzcut"], iris)
    return out


def write(directory, files, ext):
    os.makedirs(directory, exist_ok=True)
    for name, data in sorted(files.items()):
        with open(os.path.join(directory, name + ext), "wb") as f:
            f.write(data)
    print("%s: %d files" % (os.path.relpath(directory, HERE), len(files)))


def main():
    write(ST_DIR, safetensors_seeds(), ".safetensors")
    write(CSV_DIR, csv_seeds(), ".csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
