#!/usr/bin/env python3
"""scripts/check_layout.py catches what it is for (ctest `check_layout_mutants`).

  check_layout_mutants.py SOURCE_DIR

Copies the tree it reads (src/, kernels/, DESIGN.md) into a temporary directory, requires the
clean copy to pass, then plants one mistake at a time in the copy, each undone before the next,
and requires check_layout.py to fail naming the planted file and line (ctests
layering_include_edges and source_file_sizes check the tree itself).

The mistakes:

  - back-edges against the layer order: src/data including train/, kernels/ including
    core/ (a file picked at random each run, the include put after its last one);
  - a sibling include DESIGN.md does not name, comm -> optim, which closes the cycle
    optim -> comm -> optim: the failure names the edge and the cycle with both edges;
  - a rank-free rule: src/model including data/ (lower, but the model lays out no samples);
  - a 601-line source file (and, as controls, a 600-line one and a 601-line one that
    DESIGN.md names as an exception, neither of which fails).
"""
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    source = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "../.."))
    script = os.path.join(source, "scripts", "check_layout.py")
    seed = int(os.environ.get("PACKBERT_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
    rng = random.Random(seed)
    print(f"seed {seed} (PACKBERT_TEST_SEED={seed} repeats this run)")
    failures = []

    with tempfile.TemporaryDirectory(prefix="check_layout_") as root:
        for folder in ("src", "kernels"):
            shutil.copytree(os.path.join(source, folder), os.path.join(root, folder),
                            symlinks=True)
        shutil.copy2(os.path.join(source, "DESIGN.md"), os.path.join(root, "DESIGN.md"))

        def run():
            p = subprocess.run([sys.executable, script, "--root", root], capture_output=True,
                               text=True)
            return p.returncode, p.stdout + p.stderr

        def sources(folder, ext=(".cpp", ".h")):
            out = []
            for base, dirs, names in os.walk(os.path.join(root, folder)):
                dirs.sort()
                out += [os.path.relpath(os.path.join(base, n), root) for n in sorted(names)
                        if n.endswith(ext)]
            return out

        rc, out = run()
        if rc != 0:
            failures.append(f"the clean copy fails check_layout.py:\n{out}")

        def plant_include(folder, include, expect):
            """Puts `include` after the last #include of a random file of `folder`."""
            candidates = [p for p in sources(folder) if "#include" in open(
                os.path.join(root, p), encoding="utf-8", errors="replace").read()]
            path = rng.choice(candidates)
            full = os.path.join(root, path)
            with open(full, encoding="utf-8") as f:
                original = f.read()
            lines = original.split("\n")
            last = max(i for i, l in enumerate(lines) if re.match(r"\s*#\s*include", l))
            lines.insert(last + 1, include)
            with open(full, "w", encoding="utf-8") as f:
                f.write("\n".join(lines))
            try:
                rc, out = run()
                where = f"{path}:{last + 2}: #include {include.split(None, 1)[1]}"
                if rc == 0:
                    failures.append(f"{where} planted, check_layout.py passes:\n{out}")
                for text in [where] + expect:
                    if text not in out:
                        failures.append(f"{where} planted: check_layout.py does not say "
                                        f"'{text}':\n{out}")
                print(f"planted {where}: caught")
            finally:
                with open(full, "w", encoding="utf-8") as f:
                    f.write(original)

        plant_include("src/data", '#include "train/trainer.h"',
                      ["data includes train, a higher layer"])
        plant_include("kernels", '#include "core/log.h"',
                      ["kernels includes core, a higher layer"])
        plant_include("src/comm", '#include "optim/lamb.h"',
                      ["comm includes its sibling optim",
                       "the modules include each other in a cycle: comm -> optim",
                       "optim -> comm (src/optim/"])
        plant_include("src/model", '#include "data/shards/sample.h"',
                      ["src/model must not include the data pipeline"])

        def plant_file(lines, named, should_fail):
            path = "src/core/planted_long.cpp"
            full = os.path.join(root, path)
            with open(full, "w", encoding="utf-8") as f:
                f.write("".join(f"// line {i + 1}\n" for i in range(lines)))
            design = os.path.join(root, "DESIGN.md")
            with open(design, encoding="utf-8") as f:
                original = f.read()
            if named:
                with open(design, "a", encoding="utf-8") as f:
                    f.write(f"\n- over 600 lines: {path}: planted by the test\n")
            try:
                rc, out = run()
                said = f"{path}:601: {lines} lines, over 600" in out
                what = f"a {lines}-line {path}{' named in DESIGN.md' if named else ''}"
                if should_fail and (rc == 0 or not said):
                    failures.append(f"{what} planted: check_layout.py does not name it:\n{out}")
                if not should_fail and path in out:
                    failures.append(f"{what} planted: check_layout.py names it:\n{out}")
                print(f"planted {what}: {'caught' if said else 'passed'}")
            finally:
                os.remove(full)
                with open(design, "w", encoding="utf-8") as f:
                    f.write(original)

        plant_file(601, named=False, should_fail=True)
        plant_file(600, named=False, should_fail=False)
        plant_file(601, named=True, should_fail=False)

    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
