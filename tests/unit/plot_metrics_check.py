#!/usr/bin/python3
"""ctest plot_metrics: scripts/plot_metrics.py on a small synthetic metrics file writes a PNG;
a missing, an empty and a train-less file are clear errors.

    /usr/bin/python3 tests/unit/plot_metrics_check.py scripts/plot_metrics.py WORKDIR
"""
import json
import os
import random
import subprocess
import sys


def run(script, *args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True)


def main():
    script, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = random.Random()
    metrics = os.path.join(work, "metrics.jsonl")
    with open(metrics, "w") as f:
        samples = 0
        for step in range(1, 41):
            samples += 32
            rec = {"event": "train", "step": step, "samples": samples, "tokens": samples * 100,
                   "loss": 10.0 / (1 + 0.1 * step) + rng.random() * 0.1,
                   "mlm_loss": 9.0 / (1 + 0.1 * step), "mlm_accuracy": min(0.9, 0.02 * step),
                   "samples_per_s": 100 + rng.random() * 10, "tokens_per_s": 1e4 + rng.random() * 1e3}
            if step == 7:
                rec["loss"] = None  # a NaN loss written by nlohmann as null: skipped
            f.write(json.dumps(rec) + "\n")
            if step % 10 == 0:
                f.write(json.dumps({"event": "eval", "step": step, "samples": samples,
                                    "eval_accuracy": 0.015 * step, "eval_loss": 8.0 / step}) + "\n")
    png = os.path.join(work, "metrics.png")
    if os.path.exists(png):
        os.remove(png)
    r = run(script, metrics, png)
    assert r.returncode == 0, f"plot failed: {r.stdout}\n{r.stderr}"
    with open(png, "rb") as f:
        magic = f.read(8)
    assert magic == b"\x89PNG\r\n\x1a\n", f"not a PNG: {magic!r}"

    missing = os.path.join(work, "missing.jsonl")
    r = run(script, missing, os.path.join(work, "x.png"))
    assert r.returncode != 0 and missing in r.stderr, r.stderr

    empty = os.path.join(work, "empty.jsonl")
    open(empty, "w").close()
    r = run(script, empty, os.path.join(work, "x.png"))
    assert r.returncode != 0 and "no records" in r.stderr, r.stderr

    evals_only = os.path.join(work, "evals.jsonl")
    with open(evals_only, "w") as f:
        f.write(json.dumps({"event": "eval", "samples": 10, "eval_accuracy": 0.1}) + "\n")
    r = run(script, evals_only, os.path.join(work, "x.png"))
    assert r.returncode != 0 and "no training records" in r.stderr, r.stderr

    garbage = os.path.join(work, "garbage.jsonl")
    with open(garbage, "w") as f:
        f.write("{not json\n")
    r = run(script, garbage, os.path.join(work, "x.png"))
    assert r.returncode != 0 and garbage + ":1" in r.stderr, r.stderr
    print("plot_metrics: ok")


if __name__ == "__main__":
    main()
