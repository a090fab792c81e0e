#!/usr/bin/env python3
"""Host work per training step on the CUDA backend: host synchronisations, launches, graph
launches and pageable copies, as the metrics JSONL reports them (host_syncs_per_step,
launches_per_step, graph_launches_per_step, pageable_copies_per_step; kernels/cuda/counters.h
says what counts; "all launches" adds the kernel and the graph launches). Run
with the emulated build's packbert, where the counts are exact (the emulated runtime checks
them: tests/gpu/test_cuda_trainer.cpp, CudaTrainer.HostWorkCountsAreTheRuntimes); on a GPU
build they are the same calls.

It prepares a small part of the bundled corpus, then trains the demo's tiny model
(configs/demo_tiny_cpu.toml) with train.device = "cuda" for --steps steps at each precision and
log.every_steps (no evaluation, no checkpoints), and prints, per case, the figures of the
records after the first (the first interval holds the arena's and the buffers' first
allocations):

    python3 scripts/step_counts.py --packbert build-emu/src/packbert [--steps 12] [--work DIR]
        [--graphs off,segmented] [--layout padded] [--np 2 [--sharded]] [--check]

--graphs runs each case once per train.cuda_graphs value (segmented replays each encoder
layer's recorded graph for batches of a capacity it has seen, full a micro-step's whole forward
and backward: the padded layout's micro-batches share a few capacities, the unpadded layout's
more, since each capacity is recorded at its second use).

--np N runs N ranks under mpiexec, one emulated GPU each (the figures are rank 0's), and
--sharded shards the optimizer. The emulated device runs a stream's work only when the host
waits for it, so there a collective still waiting for its peer holds back what follows it:
the attention work list's pinned buffers, which the host rewrites once the device has caught
up to within two uploads, then count waits that a GPU, which runs ahead, mostly would not make.

--check (the emulated ctest emu_step_counts) exits 1 unless, in every case, a step waits for the
device at most once per log.every_steps steps (host_syncs_per_step <= 1 / every) and no step
copies from or to pageable memory.

With log.every_steps 1 each record is one step, and a second table says, per case with graphs,
how many steps from --replayed-from on launched no more than --replayed gives for its mode (all
launches: what a replayed step of the padded layout launches), whether every step's loss equals
the same case with graphs off bit for bit (when off is among --graphs), and the padding rows
the graphs' capacities added over the batches' own (graph_padding, the run's last record).
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile


def run(cmd, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.stderr.write(open(log).read()[-4000:])
        sys.exit(f"step_counts: {' '.join(cmd)} failed ({r.returncode}); log {log}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--packbert", required=True, help="the emulated build's packbert binary")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16, help="train.global_batch_size")
    ap.add_argument("--micro-steps", type=int, default=2,
                    help="train.gradient_accumulation_steps")
    ap.add_argument("--work", default=None, help="a directory to keep (default: a temporary one)")
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated")
    ap.add_argument("--every", default="1,4", help="log.every_steps values, comma-separated")
    ap.add_argument("--graphs", default="off", help="train.cuda_graphs values, comma-separated")
    ap.add_argument("--layout", default="unpadded", help="train.layout")
    ap.add_argument("--np", type=int, default=1,
                    help="ranks, one emulated GPU each (mpiexec -np N; the counts are rank 0's)")
    ap.add_argument("--sharded", action="store_true", help="optim.sharded = true")
    ap.add_argument("--mpiexec", default="mpiexec", help="with --np > 1")
    ap.add_argument("--check", action="store_true",
                    help="fail unless syncs/step <= 1 / log.every_steps and no pageable copy")
    ap.add_argument("--replayed", default="segmented=48,full=6",
                    help="all launches of a replayed step, per mode (MODE=N,...)")
    ap.add_argument("--replayed-from", type=int, default=20,
                    help="the first step counted in the replay table")
    ap.add_argument("--reuse", action="store_true",
                    help="keep a case's metrics file from an earlier run in --work when it holds "
                         "all --steps steps (the emulated runs take minutes)")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="step_counts.")
    os.makedirs(work, exist_ok=True)

    # A few hundred documents of the corpus are enough for a few steps.
    corpus = os.path.join(work, "corpus.txt.gz")
    with gzip.open(os.path.join(root, "data", "kjv-bible-docs.txt.gz"), "rt") as src, \
            gzip.open(corpus, "wt") as dst:
        for i, line in enumerate(src):
            if i >= 4000:
                break
            dst.write(line)
    data = os.path.join(work, "data")
    if not os.path.isdir(os.path.join(data, "train")):
        run([a.packbert, "prepare", "--config", os.path.join(root, "configs", "prepare_demo.toml"),
             "--input", corpus, "--output", data, "--prepare.eval_samples=0",
             f"--prepare.vocab={root}/data/vocab.txt"],
            os.path.join(work, "prepare.log"))

    print(f"tiny model, {a.batch} samples per step in {a.micro_steps} micro-steps, {a.layout}, "
          f"max_seq_len 128, {a.np} rank(s){', optimizer sharded' if a.sharded else ''}; "
          f"per step, the mean over the records after the first")
    print()
    print("| precision | cuda_graphs | log.every_steps | host syncs/step | launches/step | "
          "graph launches/step | all launches/step | pageable copies/step |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    failures = []
    per_step = {}  # (precision, graphs, every) -> [(step, all launches, loss)]
    padding = {}
    cases = [(p, g, int(e)) for p in a.precisions.split(",") for g in a.graphs.split(",")
             for e in a.every.split(",")]
    for precision, graphs, every in cases:
        name = f"{precision}_{graphs}_every{every}"
        metrics = os.path.join(work, name + ".jsonl")
        done = False
        if a.reuse and os.path.exists(metrics):
            steps_in = [json.loads(l).get("step") for l in open(metrics) if l.strip()]
            done = a.steps in steps_in
        if os.path.exists(metrics) and not done:
            os.remove(metrics)
        mpi = []
        if a.np > 1:
            mpi = [a.mpiexec, "--oversubscribe", "--mca", "btl", "self,vader", "-x",
                   "OMP_NUM_THREADS=1", "-x", "OPENBLAS_NUM_THREADS=1", "-np", str(a.np)]
            if os.geteuid() == 0:
                mpi.insert(1, "--allow-run-as-root")
        if not done:
            run(mpi + [a.packbert, "train", "--config",
                 os.path.join(root, "configs", "demo_tiny_cpu.toml"),
                 f"--data.train_dir={data}/train", "--data.eval_dir=",
                 f"--data.vocab={root}/data/vocab.txt", "--checkpoint.dir=",
                 "--checkpoint.every_steps=0",
                 "--eval.every_samples=0", "--eval.at_end=false",
                 f"--train.max_steps={a.steps}", f"--train.global_batch_size={a.batch}",
                 f"--train.gradient_accumulation_steps={a.micro_steps}",
                 f"--train.precision={precision}", "--train.device=cuda",
                 f"--train.cuda_graphs={graphs}", f"--train.layout={a.layout}",
                 f"--log.every_steps={every}", f"--log.metrics_file={metrics}",
                 f"--optim.sharded={'true' if a.sharded else 'false'}"],
                os.path.join(work, name + ".log"))
        recs = [json.loads(l) for l in open(metrics) if l.strip()]
        every_record = [r for r in recs if r.get("event") == "train"]
        per_step[(precision, graphs, every)] = [
            (r["step"], r.get("launches_per_step", 0) + r.get("graph_launches_per_step", 0),
             r.get("loss")) for r in every_record]
        padding[(precision, graphs, every)] = every_record[-1].get("graph_padding", 0.0)
        train = every_record[1:]
        if not train:
            sys.exit(f"step_counts: {metrics} has fewer than two train records")
        steps = 0
        sums = {"host_syncs_per_step": 0.0, "launches_per_step": 0.0,
                "graph_launches_per_step": 0.0, "pageable_copies_per_step": 0.0}
        first = [r for r in recs if r.get("event") == "train"][0]["step"]
        prev = first
        for r in train:
            n = r["step"] - prev
            prev = r["step"]
            steps += n
            for k in sums:
                sums[k] += r.get(k, 0.0) * n
        per = {k: v / steps for k, v in sums.items()}
        every_launch = per["launches_per_step"] + per["graph_launches_per_step"]
        print(f"| {precision} | {graphs} | {every} | {per['host_syncs_per_step']:.2f} | "
              f"{per['launches_per_step']:.2f} | {per['graph_launches_per_step']:.2f} | "
              f"{every_launch:.2f} | {per['pageable_copies_per_step']:.2f} |")
        syncs = sums["host_syncs_per_step"] / steps
        pageable = sums["pageable_copies_per_step"] / steps
        if syncs > 1.0 / every + 1e-9 or pageable > 0:
            failures.append(f"{precision}, cuda_graphs {graphs}, log.every_steps {every}: "
                            f"{syncs:.2f} host syncs "
                            f"per step (at most {1.0 / every:.2f}), {pageable:.2f} pageable "
                            f"copies per step (0)")
    limits = dict((m, float(n)) for m, n in (kv.split("=") for kv in a.replayed.split(",")))
    rows = []
    for (precision, graphs, every), steps in per_step.items():
        if every != 1 or graphs == "off":
            continue
        counted = [n for step, n, _ in steps if step >= a.replayed_from]
        limit = limits.get(graphs)
        replayed = sum(1 for n in counted if limit is not None and n <= limit + 1e-9)
        off = per_step.get((precision, "off", every))
        same = "-"
        if off is not None:
            same = "yes" if [l for _, _, l in steps] == [l for _, _, l in off] else "NO"
        rows.append(f"| {precision} | {graphs} | {limit:g} | {replayed}/{len(counted)} "
                    f"({100.0 * replayed / max(1, len(counted)):.0f}%) | {same} | "
                    f"{100.0 * padding[(precision, graphs, every)]:.2f}% |")
    if rows:
        print()
        print(f"Steps from step {a.replayed_from} on (log.every_steps 1) that launched no more "
              f"than a replayed padded step:")
        print()
        print("| precision | cuda_graphs | replayed step's launches | steps at or below | "
              "losses = off, bit for bit | graph padding |")
        print("| --- | --- | ---: | ---: | --- | ---: |")
        for r in rows:
            print(r)
    print()
    print(f"(work directory: {work})")
    if a.check and failures:
        for f in failures:
            print(f"step_counts: {f}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
