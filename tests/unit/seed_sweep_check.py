#!/usr/bin/env python3
"""scripts/seed_sweep.py against a stand-in test whose errors are a known function of the seed:
the worst error and its seed, the margin, the failed runs with their seeds, a measure printed
twice in one run, ctest -V's "N: " prefix, and the markdown table.

  seed_sweep_check.py REPO_ROOT
"""
import json
import os
import subprocess
import sys
import tempfile

FAKE = r'''#!/usr/bin/env python3
import os, sys
seed = int(os.environ["PACKBERT_TEST_SEED"])
e = (seed % 1000) / 1e6                # 0 .. 9.99e-4, a function of the seed only
print("[ RUN      ] Suite.First")
print(f"[measure] op f32 n=7 {e:.3e} <= 1.000e-02")
print(f"[measure] op f32 n=7 {e / 2:.3e} <= 1.000e-02")   # the same name twice in one run
print("[ RUN      ] Suite.Second")
print(f"3: [measure] loss (rel) {2 * e:.3e} <= 1.000e-03")  # ctest -V's prefix
print(f"[measure] loss / its bound {e:.3e} <= 1.000e+00 (bound)")  # a derived bound
failed = 2 * e > 1e-3
if failed:
    print("[  FAILED  ] Suite.Second (0 ms)")
sys.exit(1 if failed else 0)
'''


def main():
    root = sys.argv[1]
    sweep = os.path.join(root, "scripts", "seed_sweep.py")
    with tempfile.TemporaryDirectory() as tmp:
        fake = os.path.join(tmp, "fake_test")
        with open(fake, "w") as f:
            f.write(FAKE)
        os.chmod(fake, 0o755)
        out_json = os.path.join(tmp, "r.json")
        p = subprocess.run([sys.executable, sweep, "--seeds", "60", "--jobs", "2", "--json",
                            out_json, "--", fake], capture_output=True, text=True)
        print(p.stdout)
        d = json.load(open(out_json))
        seeds_failed = set(d["failed_seeds"])
        problems = []
        if d["runs"] != 60:
            problems.append(f"runs {d['runs']}, expected 60")
        ms = {(m["test"], m["name"]): m for m in d["measures"]}
        first = ms.get(("Suite.First", "op f32 n=7"))
        second = ms.get(("Suite.Second", "loss (rel)"))
        bound = ms.get(("Suite.Second", "loss / its bound"))
        if not bound or not bound.get("bound") or (first and first.get("bound")):
            problems.append("the derived bound is not told apart from the swept measures")
        if not first or not second:
            problems.append(f"measures not found: {sorted(ms)}")
        else:
            if first["count"] != 120:
                problems.append(f"Suite.First's measure counted {first['count']} times, not 120")
            if first["runs"] != 60:
                problems.append(f"Suite.First's measure seen in {first['runs']} runs, not 60")
            want = (first["seed"] % 1000) / 1e6
            if abs(first["worst"] - float(f"{want:.3e}")) > 1e-12:
                problems.append(f"worst {first['worst']} is not its seed's error {want}")
            if abs(second["worst"] - 2 * first["worst"]) > 1e-9:
                problems.append("Suite.Second's worst is not twice Suite.First's")
            if abs(first["margin"] - 1e-2 / first["worst"]) > 1e-6 * first["margin"]:
                problems.append(f"margin {first['margin']} is not tolerance / worst")
            # Every seed whose error exceeds the bar, and only those, failed.
            if second["worst"] > 1e-3 and second["seed"] not in seeds_failed:
                problems.append("the worst seed failed but is not listed as failed")
        if (p.returncode != 0) != bool(seeds_failed):
            problems.append(f"exit status {p.returncode} with {len(seeds_failed)} failed runs")
        for s in seeds_failed:
            if 2 * (s % 1000) / 1e6 <= 1e-3:
                problems.append(f"seed {s} listed as failed, but its error is within the bar")
            if f"PACKBERT_TEST_SEED={s}" not in p.stdout:
                problems.append(f"failed seed {s} not printed for reproduction")
        t = subprocess.run([sys.executable, sweep, "--table", out_json, "--detail"],
                           capture_output=True, text=True, check=True).stdout
        print(t)
        if "| fake_test | 60 |" not in t or "| Suite.First | op f32 n=7 |" not in t:
            problems.append("the markdown table lacks the sweep's row or its measures")
        if "Suite.Second: loss (rel) |" not in t or "(1) |" not in t:
            problems.append("the table's row does not keep the bound apart from the swept measures")
    for m in problems:
        print("FAIL:", m, file=sys.stderr)
    if not problems:
        print("seed_sweep_check: the sweep's report matches the stand-in's known errors")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
