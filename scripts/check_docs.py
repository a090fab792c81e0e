#!/usr/bin/env python3
"""Checks that the documentation still describes this tree (ctest `docs_check`).

  scripts/check_docs.py [--root DIR] [--packbert BIN [--update]]

- README.md stays short (at most 200 lines) and keeps the test command between its markers;
- every relative link in README.md, DESIGN.md and docs/*.md names a file that exists, and a
  `#fragment` names a heading of that file (GitHub's anchors);
- every repository path quoted in backticks (`src/...`, `kernels/...`, `scripts/...`, `tests/...`,
  `configs/...`, `docs/...`, `data/...`) exists, or matches a file when it holds a wildcard, and
  so does every source path written without them (`src/train/trainer.h`);
- a name given with its file ("`largest_micro_batch` in src/train/train_options.h", or "`name`
  ([src/...](...)") occurs in that file, and every part of a qualified name in backticks
  (`SeqLayout::fixed_launch`) occurs in the sources (src/, kernels/, tests/, scripts/);
- the source paths in the comments of src/ and kernels/ ("model/bert.h", "kernels/backend.h")
  exist, and a name given after one ("train/batching.h make_batch") occurs in it.

With --packbert (ctest `docs_plan_check`): every block of command output in docs/*.md, a line
`<!-- packbert plan ARGS -->` and the fenced block after it, is what `BIN plan ARGS` prints
now (run in the repository root); --update rewrites the blocks instead.

A file moved or renamed without its documentation fails here, naming the page, the line and
the path. Exit status 1 on any failure.
"""
import argparse
import glob
import os
import re
import shlex
import subprocess
import sys

README_MAX_LINES = 200
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^(?:src|kernels|scripts|tests|configs|docs|data|\.ci)/[A-Za-z0-9_.*/-]*$")
BARE_PATH = re.compile(r"(?<![\w/.-])((?:src|kernels|scripts|tests|configs)/[\w/.-]*\w\."
                       r"(?:h|cpp|cu|cuh|py|sh))\b")
NAME_IN = re.compile(r"`([A-Za-z_][\w:]*)(?:\(\))?`,? (?:in |\(|\[)\[?((?:src|kernels|scripts|"
                     r"tests)/[\w/.-]*\w\.(?:h|cpp|cu|cuh|py|sh))")
QUALIFIED = re.compile(r"^([A-Z]\w*(?:::[A-Za-z_]\w*)+)(?:\(\))?$")
# A path in a source comment: a module's file (src/) or a kernel's (the repository root).
COMMENT_PATH = re.compile(r"(?<![\w/.-])((?:core|model|train|optim|comm|data|config)/[\w/]*\w"
                          r"\.(?:h|cpp)|kernels/[\w/]*\w\.(?:h|cuh|cpp|cu))\b")
# "model/bert.h forward_groups" in a comment: the name (with an underscore) is that file's.
COMMENT_NAME = re.compile(r"((?:core|model|train|optim|comm|data|config)/[\w/]*\w\.h|kernels/"
                          r"[\w/]*\w\.(?:h|cuh))[ ,:]+([a-z][a-z0-9]*_[a-z0-9_]+)\b")
# Paths the documentation names as outputs of commands: made at run time, never committed.
GENERATED = ("data/mlperf", "data/seq512", "tests/data/generated")


def anchors(path):
    """GitHub's heading anchors of a Markdown file."""
    out, seen, in_code = set(), {}, False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower().replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def source_words(root):
    """Every identifier of the sources, for the qualified names the pages give."""
    words = set()
    for top in ("src", "kernels", "tests", "scripts"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith((".h", ".cpp", ".cu", ".cuh", ".py", ".sh")):
                    text = open(os.path.join(dirpath, f), encoding="utf-8", errors="replace").read()
                    words.update(re.findall(r"[A-Za-z_]\w*", text))
    return words


def check_page(root, page, errors, words):
    base = os.path.dirname(page)
    in_code = False
    for number, line in enumerate(open(page, encoding="utf-8"), 1):
        where = f"{os.path.relpath(page, root)}:{number}"
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            file, _, fragment = target.partition("#")
            dest = os.path.normpath(os.path.join(base, file)) if file else page
            if not os.path.exists(dest):
                errors.append(f"{where}: link to a missing file: {target}")
            elif fragment and dest.endswith(".md") and fragment not in anchors(dest):
                errors.append(f"{where}: no heading for #{fragment} in {os.path.relpath(dest, root)}")
        for quoted in CODE.findall(line):
            path = quoted.rstrip("/.,")
            qualified = QUALIFIED.match(quoted)
            if qualified:
                missing = [p for p in qualified.group(1).split("::") if p not in words]
                if missing:
                    errors.append(f"{where}: `{quoted}`: {', '.join(missing)} occurs nowhere in "
                                  "the sources")
            if not PATH.match(path) or path.startswith(GENERATED):
                continue
            full = os.path.join(root, path)
            if not (glob.glob(full) if "*" in path else os.path.exists(full)):
                errors.append(f"{where}: `{quoted}` names no file of the repository")
        for path in BARE_PATH.findall(CODE.sub("", LINK.sub("", line))):
            if not path.startswith(GENERATED) and not os.path.exists(os.path.join(root, path)):
                errors.append(f"{where}: {path} names no file of the repository")
        for name, path in NAME_IN.findall(line):
            full = os.path.join(root, path)
            last = name.split("::")[-1]
            if os.path.exists(full) and not re.search(rf"\b{re.escape(last)}\b",
                                                      open(full, encoding="utf-8").read()):
                errors.append(f"{where}: `{name}` does not occur in {path}")


def check_source_comments(root, errors):
    """Paths named in the comments of src/ and kernels/ exist."""
    for top in ("src", "kernels"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                full = os.path.join(dirpath, f)
                for number, line in enumerate(open(full, encoding="utf-8"), 1):
                    at = line.find("//")
                    if at < 0:
                        continue
                    where = f"{os.path.relpath(full, root)}:{number}"
                    base_of = lambda p: root if p.startswith("kernels/") else os.path.join(root, "src")
                    for path in COMMENT_PATH.findall(line[at:]):
                        if not os.path.exists(os.path.join(base_of(path), path)):
                            errors.append(f"{where}: comment names {path}, which does not exist")
                    for path, name in COMMENT_NAME.findall(line[at:]):
                        target = os.path.join(base_of(path), path)
                        if os.path.exists(target) and not re.search(
                                rf"\b{name}\b", open(target, encoding="utf-8").read()):
                            errors.append(f"{where}: comment names {name} in {path}, where it "
                                          "does not occur")


OUTPUT_MARK = re.compile(r"^<!-- packbert (plan .*) -->$")


def check_outputs(root, packbert, update, errors):
    """The `<!-- packbert plan ARGS -->` blocks against what the command prints now."""
    for page in sorted(glob.glob(os.path.join(root, "docs", "*.md"))):
        lines = open(page, encoding="utf-8").read().split("\n")
        changed = False
        i = 0
        while i < len(lines):
            m = OUTPUT_MARK.match(lines[i])
            if not m:
                i += 1
                continue
            where = f"{os.path.relpath(page, root)}:{i + 1}"
            if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
                errors.append(f"{where}: no fenced block after the marker")
                i += 1
                continue
            end = i + 2
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            r = subprocess.run([packbert] + shlex.split(m.group(1)), cwd=root,
                               capture_output=True, text=True)
            if r.returncode != 0:
                errors.append(f"{where}: `packbert {m.group(1)}` failed: {r.stderr.strip()}")
                i = end + 1
                continue
            want = r.stdout.rstrip("\n").split("\n")
            if lines[i + 2:end] != want:
                if update:
                    lines[i + 2:end] = want
                    changed = True
                    end = i + 2 + len(want)
                else:
                    errors.append(f"{where}: the block is not what `packbert {m.group(1)}` prints "
                                  "now (scripts/check_docs.py --packbert BIN --update rewrites it)")
            i = end + 1
        if changed:
            open(page, "w", encoding="utf-8").write("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--packbert", help="check the docs' command output blocks with this binary")
    ap.add_argument("--update", action="store_true", help="rewrite those blocks instead")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    errors = []
    if args.packbert:
        check_outputs(root, os.path.abspath(args.packbert), args.update, errors)
        for e in errors:
            print(e, file=sys.stderr)
        print(f"check_docs: command output blocks, {len(errors)} problems")
        return 1 if errors else 0
    readme = os.path.join(root, "README.md")
    lines = open(readme, encoding="utf-8").read().splitlines()
    if len(lines) > README_MAX_LINES:
        errors.append(f"README.md: {len(lines)} lines, more than {README_MAX_LINES}: move detail "
                      "to docs/")
    if "<!-- test-command -->" not in lines or "<!-- /test-command -->" not in lines:
        errors.append("README.md: the test-command markers that .ci/run reads are missing")
    pages = [readme, os.path.join(root, "DESIGN.md")]
    pages += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    words = source_words(root)
    for page in pages:
        check_page(root, page, errors, words)
    check_source_comments(root, errors)
    for e in errors:
        print(e, file=sys.stderr)
    print(f"check_docs: {len(pages)} pages, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
