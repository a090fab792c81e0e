#!/usr/bin/env python3
"""`packbert plan` against `packbert train` (train/memory_plan.h).

  check_plan.py equal   --packbert P --shards DIR --vocab V --work W --device cpu|cuda
      For each configuration of a table (layouts, MST, recomputation, precisions, sharded at
      np 1, 2 and 4), `packbert plan --json --rank 0` and a short `mpirun packbert train` with an
      evaluation in between: every figure the run reports equals the plan's to the byte (rank
      0's device_allocated_bytes = the plan's buffers, the arena's capacity, the largest rank's
      optimizer state), the arena was allocated once, and on CUDA the backend's own workspace
      stays within the plan's estimate of it.
  check_plan.py refuse  ... --device cuda
      An emulated GPU the size of the plan's buffers (less than the plan's total): `train`
      exits non-zero on every rank before any data is loaded, with the plan's table.
  check_plan.py midrun  ... --device cuda
      Rank 1's emulated allocator fails past the plan's buffers and the cuBLASLt workspace
      (PACKBERT_EMU_FAIL_PAST_BYTES): the first op scratch of the first step fails there. The
      job ends non-zero within the timeout (no hang), after the data was loaded, and the error
      names the buffer, the bytes asked, the bytes free and the plan's figure.
"""
import argparse
import json
import os
import re
import subprocess
import sys

# (name, ranks, extra keys): the configurations `equal` checks.
CPU_CASES = [
    ("np1_unpadded_fp32", 1, []),
    ("np1_unpadded_fp32_auto_mst", 1, ["--model.mst_chunks=0", "--model.activation_budget_mb=3"]),
    ("np2_padded_bf16_mst4", 2, ["--train.layout=padded", "--train.precision=bf16",
                                 "--model.mst_chunks=4"]),
    ("np2_packed_fp16_recompute_mlp", 2, ["--train.layout=packed", "--train.precision=fp16",
                                          "--model.recompute=mlp"]),
    ("np2_unpadded_fp8_sharded", 2, ["--train.precision=fp8", "--optim.sharded=true"]),
    ("np4_unpadded_bf16_sharded_recompute_layer", 4, ["--train.precision=bf16",
                                                      "--optim.sharded=true",
                                                      "--model.recompute=layer"]),
    ("np2_unpadded_fp32_accum2", 2, ["--train.gradient_accumulation_steps=2"]),
    # A batch warmup (4, 8, then 16 samples): the plan is the final batch's, the run's peak too.
    ("np2_unpadded_fp32_batch_warmup", 2, ["--train.batch_warmup_start=4",
                                           "--train.batch_warmup_steps=2",
                                           "--train.batch_warmup_multiple=4"]),
    ("np3_padded_bf16_sharded_accum3_mst2", 3, ["--train.layout=padded", "--train.precision=bf16",
                                                 "--optim.sharded=true",
                                                 "--train.gradient_accumulation_steps=3",
                                                 "--model.mst_chunks=2"]),
    # ModernBERT's options: Wi's 2I output, the gated MLP's scratch, no biases, the final norm.
    ("np2_packed_modern_fp8_sharded_mst2", 2, ["--model.preset=modernbert-tiny",
                                               "--train.layout=packed", "--train.precision=fp8",
                                               "--optim.sharded=true", "--model.mst_chunks=2"]),
    ("np1_unpadded_modern_bf16_recompute_layer", 1, ["--model.preset=modernbert-tiny",
                                                     "--train.precision=bf16",
                                                     "--model.recompute=layer"]),
]
CUDA_CASES = [
    ("np1_unpadded_fp32", 1, []),
    ("np2_unpadded_bf16_sharded_graphs_full", 2, ["--train.precision=bf16", "--optim.sharded=true",
                                                  "--train.cuda_graphs=full"]),
    ("np2_padded_fp8_graphs_segmented", 2, ["--train.layout=padded", "--train.precision=fp8",
                                            "--train.cuda_graphs=segmented"]),
    ("np2_unpadded_fp8_mst2", 2, ["--train.precision=fp8", "--model.mst_chunks=2"]),
    ("np4_packed_fp16_sharded_recompute_layer", 4, ["--train.layout=packed",
                                                    "--train.precision=fp16",
                                                    "--optim.sharded=true",
                                                    "--model.recompute=layer"]),
    ("np3_padded_bf16_sharded_accum3_mst2", 3, ["--train.layout=padded", "--train.precision=bf16",
                                                 "--optim.sharded=true",
                                                 "--train.gradient_accumulation_steps=3",
                                                 "--model.mst_chunks=2"]),
    ("np2_padded_modern_fp8_graphs_full_sharded", 2, ["--model.preset=modernbert-tiny",
                                                      "--train.layout=padded",
                                                      "--train.precision=fp8",
                                                      "--train.cuda_graphs=full",
                                                      "--optim.sharded=true"]),
]


def base_keys(a, work, name):
    return ["--model.preset=tiny", f"--train.device={a.device}", "--train.max_steps=4",
            "--train.global_batch_size=16", "--train.max_seq_len=64",
            "--train.max_predictions_per_seq=12", f"--data.train_dir={a.shards}",
            f"--data.eval_dir={a.shards}", "--eval.max_samples=40", "--eval.batch_size=64",
            "--eval.every_samples=32", "--eval.at_end=false", f"--data.vocab={a.vocab}",
            "--log.every_steps=2", f"--log.metrics_file={work}/{name}.jsonl",
            "--checkpoint.dir="]


MPIRUN = ["mpirun", "--oversubscribe"]


def mpirun(ranks):
    return MPIRUN + ["-np", str(ranks)]


def plan(a, keys, ranks, rank=None):
    cmd = [a.packbert, "plan", "--json", "--ranks", str(ranks)] + keys
    if rank is not None:
        cmd += ["--rank", str(rank)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120).stdout
    return json.loads(out)


def item(p, key):
    return sum(i["bytes"] for i in p["items"] if i["key"] == key)


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def run_equal(a):
    os.makedirs(a.work, exist_ok=True)
    cases = CUDA_CASES if a.device == "cuda" else CPU_CASES
    for name, ranks, extra in cases:
        keys = base_keys(a, a.work, name) + extra
        metrics = f"{a.work}/{name}.jsonl"
        if os.path.exists(metrics):
            os.remove(metrics)  # train appends to it: an earlier run's records are not this one's
        p0 = plan(a, keys, ranks, rank=0)
        largest = plan(a, keys, ranks)
        r = subprocess.run(mpirun(ranks) + [a.packbert, "train"] + keys, capture_output=True,
                           text=True, timeout=600)
        if r.returncode != 0:
            fail(f"{name}: train exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        recs = [json.loads(l) for l in open(metrics)]
        train = [j for j in recs if j.get("event") == "train"]
        if not train or not any(j.get("event") == "eval" for j in recs):
            fail(f"{name}: no train or no eval record in the metrics")
        state = item(largest, "optimizer_moments") + item(largest, "optimizer_scalars")
        if largest_state_counts_master(keys):
            state += item(largest, "fp32_master_weights") + item(largest, "fp32_read_weights")
        for j in train:
            got = {"device_allocated_bytes": j["device_allocated_bytes"],
                   "activation_capacity_bytes": j["activation_capacity_bytes"],
                   "optimizer_state_bytes": j["optimizer_state_bytes"],
                   "arena_allocations": j["arena_allocations"]}
            want = {"device_allocated_bytes": p0["buffers_bytes"],
                    "activation_capacity_bytes": item(p0, "activation_arena"),
                    "optimizer_state_bytes": state,
                    "arena_allocations": 1}
            for k in want:
                if got[k] != want[k]:
                    fail(f"{name} step {j['step']}: {k} {got[k]}, the plan {want[k]}")
            if a.device == "cuda":
                budget = item(p0, "gemm_workspace") + item(p0, "op_scratch")
                if j["device_workspace_bytes"] > budget:
                    fail(f"{name} step {j['step']}: workspace {j['device_workspace_bytes']} "
                         f"above the plan's estimate {budget}")
        print(f"[measure] {name}: np {ranks}, buffers {p0['buffers_bytes']} B = run's "
              f"device_allocated_bytes; arena {item(p0, 'activation_arena')} B; workspace "
              f"{train[-1].get('device_workspace_bytes', 0)} B")
    print("PASS")


def largest_state_counts_master(keys):
    # optimizer_state_bytes counts the fp32 master weights in mixed precision
    # (optim/distributed_lamb.h optimizer_state_bytes).
    return any(k.startswith("--train.precision=") and not k.endswith("fp32") for k in keys)


def check_output(name, r, patterns, absent):
    text = r.stdout + r.stderr
    for p in patterns:
        if p not in text:
            fail(f"{name}: '{p}' not in the output\n{text[-4000:]}")
    for p in absent:
        if p in text:
            fail(f"{name}: '{p}' in the output\n{text[-4000:]}")
    if r.returncode == 0:
        fail(f"{name}: exit 0\n{text[-4000:]}")


def run_refuse(a):
    keys = base_keys(a, a.work, "refuse") + ["--train.precision=bf16"]
    p = plan(a, keys, 2)
    env = dict(os.environ, PACKBERT_EMU_DEVICE_BYTES=str(p["buffers_bytes"]))
    r = subprocess.run(mpirun(2) + ["-x", "PACKBERT_EMU_DEVICE_BYTES", a.packbert, "train"] + keys,
                       capture_output=True, text=True, timeout=120, env=env)
    check_output("refuse", r, ["memory: this config needs", "on cuda:0 (rank 0 of 2)",
                               "on cuda:1 (rank 1 of 2)", "SHORT",
                               "model.mst_chunks = ",
                               "largest micro-batch that fits"], ["data:"])
    print(f"[measure] refuse: device {p['buffers_bytes']} B < plan total {p['total_bytes']} B")
    print("PASS")


def run_midrun(a):
    keys = base_keys(a, a.work, "midrun") + ["--train.precision=bf16"]
    p1 = plan(a, keys, 2, rank=1)
    limit = p1["buffers_bytes"] + item(p1, "gemm_workspace")
    cmd = (mpirun(1) + [a.packbert, "train"] + keys + [":", "-np", "1", "-x",
           f"PACKBERT_EMU_FAIL_PAST_BYTES={limit}", a.packbert, "train"] + keys)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    check_output("midrun", r, ["data:", "[rank 1] error:", "out of cuda memory",
                               " bytes (", "MiB free of",
                               f"the plan: {p1['buffers_bytes'] / 2**20:.1f} MiB"],
                 ["memory: this config needs"])
    print(f"[measure] midrun: rank 1 fails past {limit} B")
    print("PASS")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["equal", "refuse", "midrun"])
    ap.add_argument("--packbert", required=True)
    ap.add_argument("--shards", required=True)
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--mpirun", default="mpirun --oversubscribe",
                    help="the launcher and its options, one string")
    a = ap.parse_args()
    MPIRUN[:] = [w for w in re.split(r"[;\s]+", a.mpirun) if w]
    os.makedirs(a.work, exist_ok=True)
    {"equal": run_equal, "refuse": run_refuse, "midrun": run_midrun}[a.mode](a)


if __name__ == "__main__":
    main()
