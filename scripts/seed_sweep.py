#!/usr/bin/env python3
"""Runs a randomized test over fresh seeds and reports, per measure, the worst error against its
tolerance: the evidence a tolerance needs (docs/testing.md, "Tolerances").

  scripts/seed_sweep.py [--seeds N] [--jobs J] [--budget SECONDS] [--json FILE] -- COMMAND...
  scripts/seed_sweep.py --table FILE.json... [--detail] # the margin table of earlier sweeps
  scripts/seed_sweep.py --plan tests/seed_sweeps.txt --out DIR [--jobs J]
                                                        # every sweep of a plan, then its table

COMMAND is a test binary with its arguments, e.g.
  scripts/seed_sweep.py --seeds 1000 --jobs 2 -- build/tests/test_ops_reference
  scripts/seed_sweep.py --seeds 200 -- build-emu/tests/emulation/test_backend_ops \\
      --gtest_filter=BackendOpsLowp.NspLoss
Each run gets PACKBERT_TEST_SEED=<a fresh 64-bit seed> (tests/common/test_util.h) and is read for
the lines every randomized comparison prints (tests/common/measure.h):
  [measure] NAME ERROR <= TOLERANCE
keyed by the gtest test they appear in ("[ RUN      ] Suite.Test") and NAME. A run that fails
(non-zero exit, "[  FAILED  ]") is listed with its seed and the failed tests, so it can be
reproduced with PACKBERT_TEST_SEED=<seed>. A measure printed several times in one run counts
each time.

Per measure it prints: the runs it was seen in, the worst error and its seed, the tolerance, and
the margin tolerance / worst (>= 3 is the rule for a tolerance justified by a sweep; a measure
printed with "(bound)" has a derived bound instead, and its margin is only informative). --budget
stops starting new runs after that many seconds; the report says how many ran. --json keeps the
raw per-measure results, and --table makes a markdown table with a row per command (its
tightest measure) from any number of such files, and with --detail every measure of each.
--plan runs the sweeps a file lists, one per line ("SEEDS [KEY=VALUE...] COMMAND ARGS...", #
comments; KEY=VALUE the run's environment, COMMAND relative to the repository root), writes DIR/NN.json for each and prints the table of all.
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import subprocess
import tempfile
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

# ctest -V prefixes each line of a test's output with the test's number ("12: ").
PREFIX = r"^(?:\d+: )?"
MEASURE = re.compile(PREFIX + r"\[measure\] (.+) (\S+) <= (\S+)( \(bound\))?\s*$")
RUN = re.compile(PREFIX + r"\[ RUN      \] (\S+)")
FAILED = re.compile(PREFIX + r"\[  FAILED  \] (\S+\.\S+)")


def parse_float(s):
    try:
        return float(s)
    except ValueError:
        return math.nan


def run_once(cmd, seed, timeout, env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    env["PACKBERT_TEST_SEED"] = str(seed)
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, errors="replace", timeout=timeout)
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc = "timeout"
    except OSError as e:
        out, rc = f"could not run {cmd[0]}: {e}", "not run"
    secs = time.monotonic() - t0
    measures, failed, test = [], [], ""
    for line in out.splitlines():
        m = RUN.match(line)
        if m:
            test = m.group(1)
            continue
        m = MEASURE.match(line)
        if m:
            measures.append((test, m.group(1).strip(), parse_float(m.group(2)),
                             parse_float(m.group(3)), bool(m.group(4))))
            continue
        m = FAILED.match(line)
        if m and m.group(1).rstrip(",") not in failed:  # "Suite.Test/param, where GetParam()..."
            failed.append(m.group(1).rstrip(","))
    return {"seed": seed, "rc": rc, "secs": secs, "measures": measures, "failed": failed,
            "tail": out[-3000:] if rc != 0 else ""}


def margin(tol, worst):
    if math.isnan(worst):
        return 0.0
    if worst <= 0:
        return math.inf
    return tol / worst


def aggregate(runs):
    agg = {}
    for r in runs:
        for test, name, err, tol, bound in r["measures"]:
            a = agg.setdefault((test, name), {"test": test, "name": name, "count": 0,
                                              "worst": -math.inf, "seed": None, "tol": tol,
                                              "bound": bound, "tol_varies": False,
                                              "runs": set()})
            a["count"] += 1
            a["runs"].add(r["seed"])
            if a["tol"] != tol:
                a["tol_varies"] = True
                a["tol"] = min(a["tol"], tol)
            bad = math.isnan(err)
            if bad or (not math.isnan(a["worst"]) and err > a["worst"]):
                a["worst"], a["seed"] = err, r["seed"]
    for a in agg.values():
        a["runs"] = len(a["runs"])
        a["margin"] = margin(a["tol"], a["worst"])
    return sorted(agg.values(), key=lambda a: (a["margin"], a["test"], a["name"]))


def fmt_margin(m):
    if m is None:
        return "NaN"
    return "inf" if m >= 1e299 else f"{m:.1f}"


def print_report(cmd, runs, measures, budget_hit, planned):
    secs = [r["secs"] for r in runs]
    fails = [r for r in runs if r["rc"] != 0]
    print(f"seed_sweep: {' '.join(cmd)}")
    print(f"  runs: {len(runs)} of {planned}{' (time budget reached)' if budget_hit else ''}; "
          f"{sum(secs) / max(len(secs), 1):.1f} s per run; failed runs: {len(fails)}")
    if measures:
        w = max(len(f"{a['test']} | {a['name']}") for a in measures)
        w = min(w, 110)
        print(f"  {'measure':<{w}}  {'runs':>5}  {'worst':>9}  {'tolerance':>9}  {'margin':>7}  seed")
        for a in measures:
            label = f"{a['test']} | {a['name']}"
            if len(label) > w:
                label = label[:w - 3] + "..."
            flag = " (tolerance varies: smallest shown)" if a["tol_varies"] else ""
            flag += " (a derived bound)" if a.get("bound") else ""
            print(f"  {label:<{w}}  {a['runs']:>5}  {a['worst']:>9.2e}  {a['tol']:>9.2e}  "
                  f"{fmt_margin(a['margin']):>7}  {a['seed']}{flag}")
    else:
        print("  no [measure] lines seen")
    for r in fails:
        print(f"  FAILED with PACKBERT_TEST_SEED={r['seed']} (exit {r['rc']}): "
              f"{', '.join(r['failed']) or 'no gtest failure line'}")
    if fails:
        print("  last output of the first failed run:")
        print("    " + fails[0]["tail"].replace("\n", "\n    "))


def load(path):
    with open(path) as f:
        d = json.load(f)
    for a in d["measures"]:
        if a["margin"] is None:  # a NaN worst
            a["margin"] = 0.0
    return d


def command_label(d):
    """The binary's name and what its filter selects, without the build folder."""
    cmd = d["command"]
    words = [os.path.basename(cmd[0])] + [w for w in cmd[1:] if not w.startswith("--gtest_filter")]
    filt = [w.split("=", 1)[1] for w in cmd[1:] if w.startswith("--gtest_filter=")]
    if not filt:
        return " ".join(words)
    tests = filt[0].split(":")
    return " ".join(words) + (f" ({tests[0]})" if len(tests) == 1 else f" ({len(tests)} tests)")


def table(files, detail):
    """Markdown: one row per sweep with its tightest measure of those a sweep justifies, and the
    largest share of its bound any derived bound reached; with detail, every measure."""
    ds = [load(p) for p in files]
    out = ["| test binary | seeds | s / seed | measures | failed runs | tightest swept measure | "
           "worst | tolerance | margin | derived bounds: worst / bound |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for d in ds:
        ms = d["measures"]
        swept = [a for a in ms if not a.get("bound")]
        bounds = [a for a in ms if a.get("bound")]
        t = swept[0] if swept else None
        share = max((a["worst"] / a["tol"] for a in bounds if a["tol"]), default=None)
        out.append(f"| {command_label(d)} | {d['runs']} | {d['secs_per_run']:.1f} | {len(ms)} | "
                   f"{d['failed_runs']} | " +
                   (f"{t['test']}: {t['name']} | {t['worst']:.2e} | {t['tol']:.2e} | "
                    f"{fmt_margin(t['margin'])} | " if t else "none | | | | ") +
                   (f"{share:.2f} ({len(bounds)}) |" if share is not None else "none |"))
    out.append("")
    if detail:
        for d in ds:
            out.append(f"### {command_label(d)}\n")
            out.append(f"{d['runs']} seeds: `{' '.join(d['command'])}`\n")
            out.append("| test | measure | worst | tolerance | margin |")
            out.append("| --- | --- | --- | --- | --- |")
            for a in d["measures"]:
                kind = " (bound)" if a.get("bound") else ""
                out.append(f"| {a['test']} | {a['name']} | {a['worst']:.2e} | {a['tol']:.2e}{kind} "
                           f"| {fmt_margin(a['margin'])} |")
            out.append("")
    print("\n".join(out))


def sweep(cmd, seeds, jobs, budget, timeout, env_extra, no_copy):
    """Runs cmd over `seeds` fresh seeds; returns (runs, budget_hit)."""
    # The binary is copied first, so that rebuilding it during a long sweep does not change or
    # break the runs (it finds its test data by absolute paths compiled in).
    tmp = None
    if os.path.isfile(cmd[0]) and os.access(cmd[0], os.X_OK) and not no_copy:
        tmp = tempfile.mkdtemp(prefix="seed_sweep.")
        copy = os.path.join(tmp, os.path.basename(cmd[0]))
        shutil.copy2(cmd[0], copy)
        run_cmd = [copy] + cmd[1:]
    else:
        run_cmd = cmd
    rng = random.SystemRandom()
    runs, t0, budget_hit = [], time.monotonic(), False
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        pending, it = set(), iter([rng.getrandbits(64) for _ in range(seeds)])
        while True:
            while len(pending) < jobs:
                if budget and time.monotonic() - t0 > budget:
                    budget_hit = True
                    break
                s = next(it, None)
                if s is None:
                    break
                pending.add(pool.submit(run_once, run_cmd, s, timeout, env_extra))
            if not pending:
                break
            done = next(as_completed(pending))
            pending.remove(done)
            r = done.result()
            runs.append(r)
            if r["rc"] != 0:
                print(f"seed_sweep: run {len(runs)} FAILED: PACKBERT_TEST_SEED={r['seed']} "
                      f"({', '.join(r['failed']) or 'exit ' + str(r['rc'])})", file=sys.stderr,
                      flush=True)
            elif len(runs) % 50 == 0:
                print(f"seed_sweep: {len(runs)} runs, {time.monotonic() - t0:.0f} s",
                      file=sys.stderr, flush=True)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return runs, budget_hit


def write_json(path, cmd, runs, measures):
    def clean(x):
        return None if isinstance(x, float) and (math.isnan(x) or math.isinf(x)) else x
    with open(path, "w") as f:
        json.dump({"command": cmd, "runs": len(runs),
                   "secs_per_run": sum(r["secs"] for r in runs) / max(len(runs), 1),
                   "failed_runs": sum(r["rc"] != 0 for r in runs),
                   "failed_seeds": [r["seed"] for r in runs if r["rc"] != 0],
                   "measures": [{k: (clean(v) if k != "margin" else
                                     (1e300 if math.isinf(v) else v))
                                 for k, v in m.items()} for m in measures]},
                  f, indent=1)


def run_plan(a, env_extra):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.makedirs(a.out, exist_ok=True)
    files, failed = [], False
    with open(a.plan) as f:
        lines = [ln.split("#", 1)[0].split() for ln in f]
    for n, words in enumerate(w for w in lines if w):
        seeds, shown = int(words[0]), words[1:]
        env = dict(env_extra)
        while shown and re.match(r"^[A-Z_][A-Z0-9_]*=", shown[0]):
            k, v = shown[0].split("=", 1)
            env[k] = v
            shown = shown[1:]
        cmd = [os.path.join(root, shown[0])] + shown[1:]
        runs, hit = sweep(cmd, seeds, a.jobs, a.budget, a.timeout, env, a.no_copy)
        measures = aggregate(runs)
        print_report(shown, runs, measures, hit, seeds)
        path = os.path.join(a.out, f"{n:02d}.json")
        write_json(path, shown, runs, measures)
        files.append(path)
        failed = failed or any(r["rc"] != 0 for r in runs)
    table(files, a.detail)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--seeds", type=int, default=100, help="runs, each with a fresh seed")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once")
    ap.add_argument("--budget", type=float, default=0, help="seconds; 0: no limit")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for the runs")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--no-copy", action="store_true",
                    help="run COMMAND's binary where it is (by default a copy is run)")
    ap.add_argument("--table", nargs="+", metavar="FILE.json",
                    help="print the markdown margin table of these results and exit")
    ap.add_argument("--plan", help="a file of sweeps, one per line: SEEDS COMMAND ARGS...")
    ap.add_argument("--out", help="with --plan: the folder for the sweeps' JSON files")
    ap.add_argument("--detail", action="store_true",
                    help="with --table: every measure of every sweep, not only the tightest")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    a = ap.parse_args()
    if a.table:
        table(a.table, a.detail)
        return 0
    env_extra = dict(kv.split("=", 1) for kv in a.env)
    if a.plan:
        if not a.out:
            ap.error("--plan needs --out DIR")
        return run_plan(a, env_extra)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command (give it after --)")
    runs, budget_hit = sweep(cmd, a.seeds, a.jobs, a.budget, a.timeout, env_extra, a.no_copy)
    measures = aggregate(runs)
    print_report(cmd, runs, measures, budget_hit, a.seeds)
    if a.json:
        write_json(a.json, cmd, runs, measures)
    return 1 if any(r["rc"] != 0 for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
