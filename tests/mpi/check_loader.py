#!/usr/bin/env python3
"""Judges what mpi_loader_driver wrote (tests/CMakeLists.txt, label mpi).

  check_loader.py verify DIR PREFIX...   every run: each epoch it covers trains every sample of
                                         the manifest exactly once, the ranks' samples of a
                                         step add up to its global count, no sample twice in
                                         a step; across runs (any rank counts): step s trains
                                         the same set of samples
  check_loader.py same PREFIX_A PREFIX_B the same per-rank, per-micro-batch samples, step by
                                         step (same rank count: determinism)
  check_loader.py resume FULL PART...    the parts' steps, in order, are FULL's steps (sets of
                                         samples per step; per rank too when the rank counts
                                         agree)
  check_loader.py expect-fail --timeout T --pattern P [--pattern P2 ...] [--absent A ...] -- CMD...
                                         CMD exits non-zero before T seconds and its output
                                         contains every P
"""
import glob
import re
import subprocess
import sys
import time


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def load_run(prefix):
    """{step: {"epoch", "global", "ranks": {rank: [[ids] per micro-batch]}}}, rank count."""
    files = sorted(glob.glob(prefix + ".rank*.txt"))
    if not files:
        fail(f"no files {prefix}.rank*.txt")
    steps = {}
    for path in files:
        rank = int(re.search(r"\.rank(\d+)\.txt$", path).group(1))
        step = None
        with open(path) as f:
            for line in f:
                w = line.split()
                if not w or w[0] == "#":
                    continue
                if w[0] == "step":
                    step = int(w[1])
                    s = steps.setdefault(step, {"epoch": int(w[3]), "global": int(w[9]),
                                                "ranks": {}})
                    if s["epoch"] != int(w[3]) or s["global"] != int(w[9]):
                        fail(f"{path}: step {step} header differs between ranks")
                    s["ranks"][rank] = []
                elif w[0] == "mb":  # "ID" or, with dynamic masking, "ID:HASH"
                    steps[step]["ranks"][rank].append([sample_key(x) for x in w[2:]])
    nranks = len(files)
    for st, s in steps.items():
        if sorted(s["ranks"]) != list(range(nranks)):
            fail(f"{prefix}: step {st} is missing on ranks "
                 f"{sorted(set(range(nranks)) - set(s['ranks']))}")
    return steps, nranks


def sample_key(token):
    """(id, masks' hash or ""): runs compare both, the manifest the ids."""
    sid, _, h = token.partition(":")
    return (int(sid), h)


def step_set(s):
    return sorted(i for mbs in s["ranks"].values() for mb in mbs for i in mb)


def manifest_ids(directory):
    sizes, row_bits = None, None
    with open(directory + "/manifest.txt") as f:
        for line in f:
            if line.startswith("sizes"):
                sizes = [int(x) for x in line.split()[1:]]
            elif line.startswith("row_bits"):
                row_bits = int(line.split()[1])
    # Global sample id = (shard << row_bits) | row, as the driver's loader makes them.
    return sorted((shard << row_bits) | row for shard, n in enumerate(sizes) for row in range(n))


def verify(directory, prefixes):
    expected = manifest_ids(directory)
    runs = {}
    for prefix in prefixes:
        steps, nranks = load_run(prefix)
        by_epoch = {}
        for st in sorted(steps):
            s = steps[st]
            ids = step_set(s)
            if len(ids) != s["global"]:
                fail(f"{prefix}: step {st} has {len(ids)} samples on its ranks, global says "
                     f"{s['global']}")
            if len(set(i for i, _ in ids)) != len(ids):
                fail(f"{prefix}: step {st} trains a sample twice")
            by_epoch.setdefault(s["epoch"], []).extend(i for i, _ in ids)
        for epoch, ids in by_epoch.items():
            if sorted(ids) != expected:
                fail(f"{prefix}: epoch {epoch} trains {len(ids)} samples ({len(set(ids))} "
                     f"distinct), the shards hold {len(expected)}")
        runs[prefix] = steps
        print(f"ok {prefix}: {nranks} ranks, {len(steps)} steps, epochs {sorted(by_epoch)} "
              f"each train all {len(expected)} samples once")
    first = prefixes[0]
    for prefix in prefixes[1:]:
        if sorted(runs[prefix]) != sorted(runs[first]):
            fail(f"{prefix} has steps {sorted(runs[prefix])}, {first} {sorted(runs[first])}")
        for st in runs[first]:
            if step_set(runs[first][st]) != step_set(runs[prefix][st]):
                fail(f"step {st}: {prefix} trains other samples than {first}")
    print(f"ok: every step trains the same samples in {len(prefixes)} runs")


def same(a, b):
    ra, na = load_run(a)
    rb, nb = load_run(b)
    if na != nb or ra != rb:
        fail(f"{a} and {b} differ (ranks {na} vs {nb})")
    print(f"ok: {a} and {b} give identical per-rank batches ({len(ra)} steps, {na} ranks)")


def resume(full, parts):
    rf, nf = load_run(full)
    joined = {}
    for p in parts:
        rp, npp = load_run(p)
        for st, s in rp.items():
            if st in joined:
                fail(f"step {st} appears in two parts")
            joined[st] = (s, npp)
    if sorted(joined) != sorted(rf):
        fail(f"parts cover steps {sorted(joined)}, {full} has {sorted(rf)}")
    for st, (s, npp) in joined.items():
        if step_set(s) != step_set(rf[st]):
            fail(f"step {st}: the resumed run trains other samples")
        if npp == nf and s["ranks"] != rf[st]["ranks"]:
            fail(f"step {st}: the resumed run gives other per-rank batches")
    print(f"ok: {' + '.join(parts)} continue exactly as {full} ({len(rf)} steps)")


def expect_fail(args):
    timeout, patterns, absent = None, [], []
    while args and args[0] != "--":
        if args[0] == "--timeout":
            timeout = float(args[1])
        elif args[0] == "--pattern":
            patterns.append(args[1])
        elif args[0] == "--absent":
            absent.append(args[1])
        args = args[2:]
    cmd = args[1:]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        fail(f"still running after {timeout} s (a rank hangs): {e.output}")
    took = time.time() - t0
    print(p.stdout)
    if p.returncode == 0:
        fail("exited 0, expected a failure")
    for pattern in patterns:
        if pattern not in p.stdout:
            fail(f"the output does not contain {pattern!r}")
    for pattern in absent:
        if pattern in p.stdout:
            fail(f"the output contains {pattern!r}")
    print(f"ok: failed with exit status {p.returncode} after {took:.1f} s, naming "
          f"{', '.join(repr(x) for x in patterns)}")


def main(argv):
    if len(argv) < 2:
        fail(__doc__)
    cmd, rest = argv[1], argv[2:]
    if cmd == "verify":
        verify(rest[0], rest[1:])
    elif cmd == "same":
        same(rest[0], rest[1])
    elif cmd == "resume":
        resume(rest[0], rest[1:])
    elif cmd == "expect-fail":
        expect_fail(rest)
    else:
        fail(__doc__)


if __name__ == "__main__":
    main(sys.argv)
