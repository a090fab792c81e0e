#!/usr/bin/env python3
"""Checks the layout of the sources: who may include whom, and how long a file may run.

  scripts/check_layout.py [--root DIR] [--check all|includes|sizes]

Both rules are written once, in DESIGN.md, and read from there:

- the layer order, the line `Layer order: ...` of DESIGN.md ("Layout of the repository"), e.g.
  `kernels < core < data < model, optim, comm < config < train < main`: each name is a module
  (kernels/ is one, src/NAME/ each other, main is src/main.cpp), `<` separates the ranks, low
  to high, and `,` the modules of one rank. A file may include its own module and any module of
  a lower rank, never a higher one (ctest `layering_include_edges`). Modules of one rank include
  each other only along the edges the line `Sibling includes: ...` names (`optim -> comm`), and
  those edges, like the whole module graph, must be acyclic: a cycle is reported with every
  edge it takes and a file:line that makes each;
- the size of a source file (`.cpp`, `.h`, `.cu`, `.cuh` under src/ and kernels/): at most 600
  lines, unless DESIGN.md names the file, with its reason, on a line of the form
  `- over 600 lines: PATH: REASON` ("Style we follow"; ctest `source_file_sizes`). A named file
  that no longer needs it, or that does not exist, is an error too, so the list stays true.

The include rules that are not a matter of rank live here as well:
  - kernels/cpu includes nothing of the CUDA backend, CUDA, NCCL or cuBLAS; kernels/cuda nothing
    of the CPU backend (shared code: kernels/common; kernels/backends.cpp names both);
  - src/model, src/optim and src/train reach devices only through kernels/backend.h: no CUDA,
    NCCL or backend header, no PACKBERT_HAVE_CUDA, no CUDA or NCCL call (src/comm owns NCCL);
  - src/model includes nothing of the data pipeline (train/batching.h lays samples out), though
    data is the lower rank;
  - src/comm includes nothing of kernels/cuda (its mutation switch: kernels/mutants.h);
  - the two include roots, src/ ("model/bert.h") and the repository root ("kernels/backend.h"),
    never both hold a quoted include's path (src/, kernels/ and tests/), and no include is
    spelled through "src/".

Every failure names the file and line. Exit status 1 on any failure.
"""
import argparse
import os
import re
import sys

MAX_LINES = 600
SOURCE_EXTENSIONS = (".cpp", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
ORDER_LINE = re.compile(r"Layer order:\s*`([^`]+)`")
SIBLING_LINE = re.compile(r"Sibling includes:(.*)$", re.M)
SIBLING_EDGE = re.compile(r"`\s*(\w+)\s*->\s*(\w+)\s*`")
EXCEPTION_LINE = re.compile(r"^\s*[-*]\s+over %d lines:\s+`?([\w./-]+)`?:\s*(.*)$" % MAX_LINES)

# (folder, regex an include's path must not start with, what that is): the rank-free include
# rules. Kernel headers are included from the repository root ("kernels/cuda/..."), toolkit
# headers bare (<cuda_runtime.h>).
DEVICE = r"(kernels/)?(cuda|cpu/)|nccl|cublas|cub/"
FORBIDDEN_INCLUDES = [
    ("kernels/cpu", r"(kernels/)?(cuda/|cuda_|cuda\.h)|nccl|cublas|cub/",
     "the CUDA backend, CUDA, NCCL or cuBLAS"),
    ("kernels/cuda", r"(kernels/)?cpu/", "the CPU backend"),
    ("src/model", DEVICE, "a backend, CUDA, NCCL or cuBLAS"),
    ("src/optim", DEVICE, "a backend, CUDA, NCCL or cuBLAS"),
    ("src/train", DEVICE, "a backend, CUDA, NCCL or cuBLAS"),
    ("src/model", r"data/", "the data pipeline (src/data)"),
    ("src/comm", r"kernels/cuda/",
     "the CUDA backend's files (kernels/mutants.h holds PB_MUTANT)"),
]
# Folders whose every line must not use CUDA or NCCL (only kernels/backend.h).
DEVICE_FREE = ("src/model", "src/optim", "src/train")
DEVICE_USE = re.compile(r"PACKBERT_HAVE_CUDA|\b(cuda|nccl|cublas)[A-Z][A-Za-z]*\s*\(|"
                        r"\bcuda_(alloc|free|stream|synchronize)\b")


class Failures:
    def __init__(self):
        self.lines = []

    def add(self, text):
        self.lines.append(text)


def rel(root, path):
    return os.path.relpath(path, root).replace(os.sep, "/")


def files_under(root, folder):
    """Every regular file under root/folder, repository-relative, sorted."""
    out = []
    for base, dirs, names in os.walk(os.path.join(root, folder)):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(base, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append(rel(root, path))
    return out


def read_lines(root, path):
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        return f.read().splitlines()


def shown(quote, spelled):
    """An include as written: "model/bert.h" or <mpi.h>."""
    return f'"{spelled}"' if quote == '"' else f"<{spelled}>"


def includes(root, path):
    """(line number, '"' or '<', included path) of each #include of a file."""
    out = []
    for number, line in enumerate(read_lines(root, path), 1):
        m = INCLUDE.match(line)
        if m:
            out.append((number, m.group(1), m.group(2)))
    return out


class Order:
    """The layer order and the sibling edges DESIGN.md states."""

    def __init__(self, root, failures):
        self.rank = {}       # module -> rank
        self.siblings = {}   # (from, to) -> DESIGN.md line
        self.ok = False
        design = os.path.join(root, "DESIGN.md")
        try:
            with open(design, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            failures.add(f"DESIGN.md: cannot read it: {e}")
            return
        orders = [(text.count("\n", 0, m.start()) + 1, m.group(1))
                  for m in ORDER_LINE.finditer(text)]
        if len(orders) != 1:
            failures.add(f"DESIGN.md: {len(orders)} lines state the layer order "
                         "(`Layer order: `a < b, c < ...``); there must be one")
            return
        line, spec = orders[0]
        for i, group in enumerate(spec.split("<")):
            for name in group.split(","):
                name = name.strip()
                if not re.fullmatch(r"\w+", name) or name in self.rank:
                    failures.add(f"DESIGN.md:{line}: the layer order `{spec}` names "
                                 f"'{name}' {'twice' if name in self.rank else 'badly'}")
                    return
                self.rank[name] = i
        for m in SIBLING_LINE.finditer(text):
            number = text.count("\n", 0, m.start()) + 1
            for a, b in SIBLING_EDGE.findall(m.group(1)):
                if a not in self.rank or b not in self.rank or self.rank[a] != self.rank[b]:
                    failures.add(f"DESIGN.md:{number}: the sibling include `{a} -> {b}` is not "
                                 "between two modules of one rank of the layer order")
                    continue
                self.siblings[(a, b)] = number
        cycle = find_cycle({k: [f"DESIGN.md:{v}"] for k, v in self.siblings.items()})
        if cycle:
            failures.add("DESIGN.md: the sibling includes form a cycle: " +
                         ", ".join(f"{a} -> {b}" for a, b, _ in cycle))
        self.ok = True

    def module_of(self, path):
        """The module a repository-relative path belongs to; None outside src/ and kernels/."""
        parts = path.split("/")
        if parts[0] == "kernels":
            return "kernels"
        if parts[0] != "src" or len(parts) < 2:
            return None
        if len(parts) == 2:  # main.cpp; any other source file here is in no module
            if parts[1] == "main.cpp":
                return "main"
            return parts[1] if parts[1].endswith(SOURCE_EXTENSIONS) else None
        return parts[1]


def included_module(root, order, path, spelled):
    """The module an include of `path` names, or None for a header of no module (a library's)."""
    local = os.path.normpath(os.path.join(os.path.dirname(path), spelled)).replace(os.sep, "/")
    if os.path.isfile(os.path.join(root, local)):
        return order.module_of(local)
    first = spelled.split("/")[0]
    if "/" in spelled and first == "kernels":
        return "kernels"
    if "/" in spelled and (first in order.rank or os.path.isdir(os.path.join(root, "src", first))):
        return first
    return None


def find_cycle(edges):
    """One cycle of the directed graph {(a, b): [witness, ...]} as [(a, b, witness)], or []."""
    succ = {}
    for a, b in sorted(edges):
        succ.setdefault(a, []).append(b)
    state = {}
    stack = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in succ.get(node, []):
            if state.get(nxt) == 1:
                nodes = stack[stack.index(nxt):] + [nxt]
                return [(x, y, edges[(x, y)][0]) for x, y in zip(nodes, nodes[1:])]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(succ):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def check_order(root, order, failures):
    """The layer order and the module graph over every include of src/ and kernels/."""
    graph = {}
    for path in files_under(root, "src") + files_under(root, "kernels"):
        module = order.module_of(path)
        if module is None:
            continue
        if module not in order.rank:
            failures.add(f"{path}: its module '{module}' is not in DESIGN.md's layer order")
            continue
        for number, quote, spelled in includes(root, path):
            target = included_module(root, order, path, spelled)
            if target is None or target == module:
                continue
            where = f"{path}:{number}: #include {shown(quote, spelled)}"
            graph.setdefault((module, target), []).append(where)
            if target not in order.rank:
                failures.add(f"{where}: module '{target}' is not in DESIGN.md's layer order")
            elif order.rank[target] > order.rank[module]:
                failures.add(f"{where}: {module} includes {target}, a higher layer "
                             "(DESIGN.md, layer order)")
            elif order.rank[target] == order.rank[module] and \
                    (module, target) not in order.siblings:
                failures.add(f"{where}: {module} includes its sibling {target}, an edge "
                             "DESIGN.md's sibling includes do not name")
    cycle = find_cycle(graph)
    if cycle:
        failures.add("the modules include each other in a cycle: " +
                     "; ".join(f"{a} -> {b} ({w})" for a, b, w in cycle))


def check_rules(root, failures):
    """The rank-free include rules, and the two include roots."""
    for folder, pattern, what in FORBIDDEN_INCLUDES:
        regex = re.compile(pattern)
        for path in files_under(root, folder):
            for number, quote, spelled in includes(root, path):
                if regex.match(spelled):
                    failures.add(f"{path}:{number}: #include {shown(quote, spelled)}: {folder} "
                                 f"must not include {what}")
    for folder in DEVICE_FREE:
        for path in files_under(root, folder):
            for number, line in enumerate(read_lines(root, path), 1):
                if DEVICE_USE.search(line):
                    failures.add(f"{path}:{number}: {folder} must not use CUDA or NCCL (only "
                                 f"kernels/backend.h): {line.strip()}")
    both = {}  # a path under both roots -> where it is included
    for folder in ("src", "kernels", "tests"):
        for path in files_under(root, folder):
            for number, quote, spelled in includes(root, path):
                if quote != '"':
                    continue
                if os.path.exists(os.path.join(root, "src", spelled)) and \
                        os.path.exists(os.path.join(root, spelled)):
                    both.setdefault(spelled, []).append(f"{path}:{number}")
                if spelled.startswith("src/"):
                    failures.add(f'{path}:{number}: "{spelled}" is spelled through src/: '
                                 f'include it as "{spelled[4:]}"')
    for spelled, where in sorted(both.items()):
        more = f" (and {len(where) - 1} more)" if len(where) > 1 else ""
        failures.add(f'{where[0]}: "{spelled}" resolves under both include roots (src/ and the '
                     f"repository root){more}")


def check_sizes(root, failures):
    """Source files at most MAX_LINES lines, but for DESIGN.md's named exceptions."""
    exceptions = {}
    try:
        design = read_lines(root, "DESIGN.md")
    except OSError as e:
        failures.add(f"DESIGN.md: cannot read it: {e}")
        return
    for number, line in enumerate(design, 1):
        m = EXCEPTION_LINE.match(line)
        if not m:
            continue
        path, reason = m.group(1), m.group(2).strip()
        if not reason:
            failures.add(f"DESIGN.md:{number}: the exception {path} gives no reason")
        exceptions[path] = number
    for path in files_under(root, "src") + files_under(root, "kernels"):
        if not path.endswith(SOURCE_EXTENSIONS):
            continue
        n = len(read_lines(root, path))
        if n > MAX_LINES and path not in exceptions:
            failures.add(f"{path}:{MAX_LINES + 1}: {n} lines, over {MAX_LINES}, and DESIGN.md "
                         "names no exception for it (split it by job, or name it there: "
                         f"`- over {MAX_LINES} lines: {path}: REASON`)")
    for path, number in sorted(exceptions.items()):
        full = os.path.join(root, path)
        if not os.path.isfile(full):
            failures.add(f"DESIGN.md:{number}: the exception {path} names no file")
        elif len(read_lines(root, path)) <= MAX_LINES:
            failures.add(f"DESIGN.md:{number}: the exception {path} has "
                         f"{len(read_lines(root, path))} lines, no more than {MAX_LINES}: "
                         "remove it")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."),
                        help="the repository root (default: this script's)")
    parser.add_argument("--check", choices=("all", "includes", "sizes"), default="all")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    failures = Failures()
    if args.check in ("all", "includes"):
        order = Order(root, failures)
        if order.ok:
            check_order(root, order, failures)
        check_rules(root, failures)
    if args.check in ("all", "sizes"):
        check_sizes(root, failures)
    for line in failures.lines:
        print(line)
    if failures.lines:
        print(f"check_layout: {len(failures.lines)} failure(s)")
        return 1
    print({"all": "the include order and rules hold, and every source file is at most "
                  f"{MAX_LINES} lines or named in DESIGN.md",
           "includes": "the include order and rules hold",
           "sizes": f"every source file is at most {MAX_LINES} lines or named in DESIGN.md"}
          [args.check])
    return 0


if __name__ == "__main__":
    sys.exit(main())
