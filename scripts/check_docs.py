#!/usr/bin/env python3
"""Checks that the documentation still describes this tree (ctest `docs_check`).

  scripts/check_docs.py [--root DIR]

- README.md stays short (at most 200 lines) and keeps the test command between its markers;
- every relative link in README.md, DESIGN.md and docs/*.md names a file that exists, and a
  `#fragment` names a heading of that file (GitHub's anchors);
- every repository path quoted in backticks (`src/...`, `scripts/...`, `tests/...`, `configs/...`,
  `docs/...`, `data/...`) exists, or matches a file when it holds a wildcard.

A file moved or renamed without its documentation fails here, naming the page, the line and
the path. Exit status 1 on any failure.
"""
import argparse
import glob
import os
import re
import sys

README_MAX_LINES = 200
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^(?:src|scripts|tests|configs|docs|data|\.ci)/[A-Za-z0-9_.*/-]*$")
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


def check_page(root, page, errors):
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
            if not PATH.match(path) or path.startswith(GENERATED):
                continue
            full = os.path.join(root, path)
            if not (glob.glob(full) if "*" in path else os.path.exists(full)):
                errors.append(f"{where}: `{quoted}` names no file of the repository")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    root = os.path.abspath(ap.parse_args().root)
    errors = []
    readme = os.path.join(root, "README.md")
    lines = open(readme, encoding="utf-8").read().splitlines()
    if len(lines) > README_MAX_LINES:
        errors.append(f"README.md: {len(lines)} lines, more than {README_MAX_LINES}: move detail "
                      "to docs/")
    if "<!-- test-command -->" not in lines or "<!-- /test-command -->" not in lines:
        errors.append("README.md: the test-command markers that .ci/run reads are missing")
    pages = [readme, os.path.join(root, "DESIGN.md")]
    pages += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    for page in pages:
        check_page(root, page, errors)
    for e in errors:
        print(e, file=sys.stderr)
    print(f"check_docs: {len(pages)} pages, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
