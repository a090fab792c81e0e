#!/usr/bin/env python3
"""Shards as other tools write and read them, against the packbert binary.

1. h5py writes shards the way NVIDIA's and MLPerf's scripts do (fixed format with int32 ids and
   gzip compression; variable-length int16), and `packbert inspect` must report exactly the
   counts computed here.
2. `packbert prepare` writes shards; h5py must read them with the MLPerf dtypes and shapes, and
   every sample must obey the format's rules.
Usage: shard_interop.py PACKBERT_BINARY REPO_DATA_DIR
"""
import os
import re
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BIN, REPO_DATA = sys.argv[1], sys.argv[2]
CLS, SEP, VOCAB = 101, 102, 30522
rng = np.random.default_rng()
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def random_samples(n, max_len, max_pred):
    out = []
    for _ in range(n):
        length = int(rng.integers(5, max_len + 1))
        a_end = int(rng.integers(2, length - 2))  # [SEP] of A
        ids = rng.integers(999, VOCAB, size=length)
        ids[0], ids[a_end], ids[-1] = CLS, SEP, SEP
        seg = (np.arange(length) > a_end).astype(np.int64)
        cand = [i for i in range(1, length) if ids[i] != SEP]
        k = int(rng.integers(0, min(max_pred, len(cand)) + 1))
        pos = np.sort(rng.choice(cand, size=k, replace=False)) if k else np.zeros(0, np.int64)
        mids = rng.integers(999, VOCAB, size=k)
        out.append((ids, seg, pos, mids, int(rng.integers(0, 2))))
    return out


def inspect(path):
    r = subprocess.run([BIN, "inspect", path], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def numbers_in(text):
    return set(int(x) for x in re.findall(r"\b\d+\b", text.replace(",", "")))


def write_nvidia_fixed(path, samples, L, P):
    n = len(samples)
    ids = np.zeros((n, L), np.int32); mask = np.zeros((n, L), np.int8)
    seg = np.zeros((n, L), np.int8); pos = np.zeros((n, P), np.int32)
    mids = np.zeros((n, P), np.int32); nsp = np.zeros(n, np.int8)
    for i, (a, s, p, m, l) in enumerate(samples):
        ids[i, :len(a)] = a; mask[i, :len(a)] = 1; seg[i, :len(a)] = s
        pos[i, :len(p)] = p; mids[i, :len(m)] = m; nsp[i] = l
    with h5py.File(path, "w") as f:
        for name, data in [("input_ids", ids), ("input_mask", mask), ("segment_ids", seg),
                           ("masked_lm_positions", pos), ("masked_lm_ids", mids),
                           ("next_sentence_labels", nsp)]:
            f.create_dataset(name, data=data, compression="gzip")


def write_mlperf_varlength(path, samples):
    n = len(samples)
    with h5py.File(path, "w") as f:
        for name, k, dt in [("input_ids", 0, np.int16), ("segment_ids", 1, np.int8),
                            ("masked_lm_positions", 2, np.int16), ("masked_lm_ids", 3, np.int16)]:
            d = f.create_dataset(name, (n,), dtype=h5py.vlen_dtype(np.dtype(dt)))
            for i, smp in enumerate(samples):
                d[i] = smp[k].astype(dt)
        f.create_dataset("next_sentence_labels", data=np.array([s[4] for s in samples], np.int8))


with tempfile.TemporaryDirectory() as tmp:
    for fmt, writer in [("fixed-int32-gzip", lambda p, s: write_nvidia_fixed(p, s, 128, 20)),
                        ("varlength-int16", write_mlperf_varlength)]:
        samples = random_samples(int(rng.integers(50, 300)), 128, 20)
        path = os.path.join(tmp, fmt + ".h5")
        writer(path, samples)
        rc, out = inspect(path)
        check(rc == 0, f"{fmt}: inspect exit {rc}: {out}")
        nums = numbers_in(out)
        tokens = sum(len(s[0]) for s in samples)
        masked = sum(len(s[2]) for s in samples)
        for name, v in [("samples", len(samples)), ("tokens", tokens), ("masked", masked),
                        ("min length", min(len(s[0]) for s in samples)),
                        ("max length", max(len(s[0]) for s in samples))]:
            check(v in nums, f"{fmt}: {name} = {v} not in inspect output:\n{out}")

    # A corrupted sample written by another tool: clear error naming file, dataset and index.
    samples = random_samples(40, 64, 8)
    bad = int(rng.integers(0, 40))
    samples[bad][0][1] = VOCAB + 5
    path = os.path.join(tmp, "bad.h5")
    write_nvidia_fixed(path, samples, 64, 8)
    rc, out = inspect(path)
    check(rc != 0, f"bad token id accepted: {out}")
    check("bad.h5" in out and "input_ids" in out and str(bad) in out,
          f"error does not name file, dataset and sample {bad}: {out}")

    # packbert prepare -> h5py reads MLPerf dtypes and shapes.
    for fmt in ["fixed", "varlength"]:
        outdir = os.path.join(tmp, "prep-" + fmt)
        r = subprocess.run([BIN, "prepare", "--input", os.path.join(REPO_DATA, "kjv-bible-docs.txt.gz"),
                            "--vocab", os.path.join(REPO_DATA, "vocab.txt"), "--output", outdir,
                            "--max-seq-len", "64", "--max-predictions-per-seq", "10",
                            "--dupe-factor", "1", "--num-shards", "2", "--format", fmt,
                            "--seed", str(int(rng.integers(1, 1 << 30)))],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"prepare {fmt} failed: {r.stderr}")
        shards = []
        for root, _, files in os.walk(outdir):
            shards += [os.path.join(root, f) for f in files if f.endswith(".h5")]
        check(len(shards) >= 2, f"prepare {fmt}: expected >= 2 shards, found {shards}")
        for path in shards:
            with h5py.File(path, "r") as f:
                n = f["next_sentence_labels"].shape[0]
                check(f["next_sentence_labels"].dtype == np.int8, f"{path}: nsp dtype")
                if fmt == "fixed":
                    check(f["input_ids"].dtype == np.int16 and f["input_ids"].shape == (n, 64),
                          f"{path}: input_ids {f['input_ids'].dtype} {f['input_ids'].shape}")
                    check(f["input_mask"].dtype == np.int8, f"{path}: input_mask dtype")
                    check(f["masked_lm_positions"].shape == (n, 10), f"{path}: positions shape")
                    ids, mask = f["input_ids"][:], f["input_mask"][:]
                    lens = mask.sum(axis=1)
                    check(np.all(ids[np.arange(n), 0] == CLS), f"{path}: first token not [CLS]")
                    check(np.all(ids[np.arange(n), lens - 1] == SEP), f"{path}: last token not [SEP]")
                    check(np.all(ids[mask == 0] == 0), f"{path}: padding not zero")
                else:
                    check("input_mask" not in f, f"{path}: varlength has input_mask")
                    check(h5py.check_vlen_dtype(f["input_ids"].dtype) == np.int16,
                          f"{path}: input_ids not vlen int16")
                    for i in range(n):
                        ids = f["input_ids"][i]
                        check(ids[0] == CLS and ids[-1] == SEP, f"{path}: sample {i} framing")
                        check(len(f["segment_ids"][i]) == len(ids), f"{path}: sample {i} segments")
                        if failures:
                            break

print(f"shard_interop: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
