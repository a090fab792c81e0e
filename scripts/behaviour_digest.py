#!/usr/bin/env python3
"""What `packbert train` computes, as digests: a fixed-seed matrix of short runs whose every loss,
gradient norm, memory figure and checkpoint byte a refactor must leave as it was.

  scripts/behaviour_digest.py --cpu BIN [--emu BIN] --out DIR [--only SUBSTRING]

BIN --cpu: a packbert of any build (its CPU backend runs); --emu: one of the emulated CUDA build
(PACKBERT_CUDA=EMULATED, docs/testing.md), for the cases on train.device = cuda. DIR gets the
prepared demo data (once) and a folder per case. Prints one row per case: the digest of its
metrics (every figure of every train and eval line but the times and rates) and of each file of
its checkpoints, then one digest of all. A checkpoint holds its run's config, paths included, so
compare two builds with the same DIR (one after the other) from the same checkout: they behave
the same, bit for bit, on this matrix when their tables are equal. Each case's digest.jsonl says
where two differ (keep the first one's copy: diff it with the second's).

The cases: the CPU in fp32 (the three layouts, 1 and 2 ranks, micro-steps, MST and layer
recomputation, the sharded optimizer, a resume from step 3),,
bf16, fp16 and fp8; with --emu the CUDA backend in fp32, bf16 and fp8 with graphs off, segmented
and full, at 1 and 2 ranks (emulated NCCL), sharded too.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader",
             "-x", "OMP_NUM_THREADS=1", "-x", "OPENBLAS_NUM_THREADS=1"]
# Figures that measure time or the machine, not what was computed.
VOLATILE = {"data_wait_s", "elapsed_s", "eta_s", "samples_per_s", "step_time_s", "tokens_per_s",
            "peak_rss_bytes", "device_free_bytes", "seconds", "eval_time_s", "time_s"}

CPU = [  # name, ranks, overrides
    ("cpu-fp32-unpadded-2r", 2, ["--train.gradient_accumulation_steps=2"]),
    ("cpu-fp32-resume-2r", 2, ["--train.gradient_accumulation_steps=2"]),
    ("cpu-fp32-packed-1r-mst", 1, ["--train.layout=packed", "--model.mst_chunks=2",
                                   "--model.recompute=layer"]),
    ("cpu-fp32-padded-2r-sharded", 2, ["--train.layout=padded", "--optim.sharded=true"]),
    ("cpu-bf16-2r-sharded", 2, ["--train.precision=bf16", "--optim.sharded=true",
                                "--train.gradient_accumulation_steps=2"]),
    ("cpu-fp16-1r", 1, ["--train.precision=fp16"]),
    ("cpu-fp8-2r", 2, ["--train.precision=fp8", "--train.fp8_history=4"]),
]
EMU = [
    ("emu-fp32-off-2r", 2, ["--train.cuda_graphs=off"]),
    ("emu-fp32-full-2r", 2, ["--train.cuda_graphs=full", "--train.gradient_accumulation_steps=2"]),
    ("emu-bf16-segmented-1r", 1, ["--train.precision=bf16", "--train.cuda_graphs=segmented"]),
    ("emu-bf16-full-2r-sharded", 2, ["--train.precision=bf16", "--train.cuda_graphs=full",
                                     "--optim.sharded=true"]),
    ("emu-fp8-off-1r", 1, ["--train.precision=fp8", "--train.fp8_history=4",
                           "--train.cuda_graphs=off"]),
    ("emu-fp8-full-2r", 2, ["--train.precision=fp8", "--train.fp8_history=4",
                            "--train.cuda_graphs=full", "--model.mst_chunks=2"]),
]


def run(cmd, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.exit(f"behaviour_digest: {' '.join(cmd)} failed ({r.returncode}); see {log}")


def train(binary, ranks, case_dir, data, steps, overrides):
    cmd = ["mpirun", *MPI_FLAGS, "-np", str(ranks), binary, "train",
           "--config", "configs/demo_tiny_cpu.toml",
           f"--data.train_dir={data}/train", f"--data.eval_dir={data}/eval",
           f"--train.max_steps={steps}", "--train.global_batch_size=16",
           f"--checkpoint.dir={case_dir}/ckpt", "--checkpoint.every_steps=3",
           "--checkpoint.keep=4", f"--log.metrics_file={case_dir}/metrics.jsonl",
           "--log.every_steps=1", "--eval.every_samples=48", "--eval.max_samples=32",
           "--eval.batch_size=16", *overrides]
    run(cmd, os.path.join(case_dir, "train.log"))


def metrics_digest(case_dir):
    lines = []
    with open(os.path.join(case_dir, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                lines.append(json.dumps({k: v for k, v in rec.items() if k not in VOLATILE},
                                        sort_keys=True))
    with open(os.path.join(case_dir, "digest.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def checkpoint_digest(case_dir):
    h = hashlib.sha256()
    ckpt = os.path.join(case_dir, "ckpt")
    files = 0
    for step in sorted(d for d in os.listdir(ckpt) if d.startswith("step_")):
        for name in sorted(os.listdir(os.path.join(ckpt, step))):
            with open(os.path.join(ckpt, step, name), "rb") as f:
                data = f.read()
            h.update(f"{step}/{name}\0".encode())
            h.update(hashlib.sha256(data).digest())
            files += 1
    return h.hexdigest()[:16], files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", required=True)
    ap.add_argument("--emu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    work = os.path.abspath(a.out)
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "data")
    if not os.path.isdir(data):
        run([os.path.abspath(a.cpu), "prepare", "--config", "configs/prepare_demo.toml",
             "--input", "data/kjv-bible-docs.txt.gz", "--output", data],
            os.path.join(work, "prepare.log"))
    cases = [(n, r, o, a.cpu) for n, r, o in CPU]
    cases += [(n, r, ["--train.device=cuda", *o], a.emu) for n, r, o in EMU] if a.emu else []
    total = hashlib.sha256()
    print("| case | metrics | checkpoints (files) |\n| --- | --- | --- |")
    for name, ranks, overrides, binary in cases:
        if a.only not in name:
            continue
        case_dir = os.path.join(work, name)
        shutil.rmtree(case_dir, ignore_errors=True)
        os.makedirs(case_dir)
        # A resume case trains 3 steps, then resumes from that checkpoint and goes on to 6.
        for steps, extra in ([(3, []), (6, ["--checkpoint.resume=auto"])] if "resume" in name
                             else [(6, [])]):
            train(os.path.abspath(binary), ranks, case_dir, data, steps, overrides + extra)
        m = metrics_digest(case_dir)
        c, files = checkpoint_digest(case_dir)
        print(f"| {name} | {m} | {c} ({files}) |", flush=True)
        total.update(f"{name} {m} {c}\n".encode())
    print(f"\nall: {total.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
