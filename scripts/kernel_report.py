#!/usr/bin/env python3
"""Static resource report of CUDA kernels, without a GPU: per kernel and architecture the
registers, spills, static shared memory and the blocks per SM they allow, and the SASS counts of
the instructions that say how a kernel feeds its tensor cores (LDSM: ldmatrix, LDS: other
shared loads, HMMA: mma.sync, LDGSTS: cp.async, BAR: barriers).

  scripts/kernel_report.py [--root TREE] [--source GLOB ...] [--arch sm_80 --arch sm_90]
                           [--filter RE]

It compiles each file of TREE (default this checkout) that a --source pattern matches (relative
to TREE; repeatable; default kernels/cuda/fmha*.cu: the attention kernels, whichever files of
that name hold them in TREE, and in a tree from the time the kernels lived in src/kernels
src/kernels/cuda/fmha*.cu) to a cubin per architecture with nvcc (-Xptxas -v gives registers,
spills and shared memory), then counts instructions in `cuobjdump -sass`. Compare two versions
of a kernel by running it on two trees, e.g. `git archive COMMIT kernels src | tar -x -C
/tmp/old && scripts/kernel_report.py --root /tmp/old` (`git archive COMMIT src` for a tree of
the src/kernels days).

cuobjdump is not part of every CUDA installation (a bare /usr/local/cuda/bin may lack it). It is
on PyPI, and installs nowhere but a scratch folder:
  pip download --no-deps -d /tmp/cutools nvidia-cuda-cuobjdump
  (cd /tmp/cutools && python3 -m zipfile -e nvidia_cuda_cuobjdump-*.whl x)
  export CUOBJDUMP=$(echo /tmp/cutools/x/nvidia/cu*/bin/cuobjdump); chmod +x "$CUOBJDUMP"
The script looks for $CUOBJDUMP, then cuobjdump on PATH, then next to nvcc.

Blocks per SM is the occupancy arithmetic of the CUDA occupancy calculator: registers are
allocated per warp in units of 256, a block's shared memory is rounded up to 128 bytes plus 1 KiB
the driver reserves per block, and the SM limits are those of the A100 (sm_80: 64K registers,
164 KiB shared memory, 2048 threads, 32 blocks) and the H100 / H200 (sm_90: 64K registers,
228 KiB, 2048 threads, 32 blocks). The threads per block are the kernel's __launch_bounds__
(read from the PTX's .maxntid), else --threads. These are upper bounds from static resources,
not measurements.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

SM = {  # registers, shared bytes usable per SM, max threads, max blocks
    "sm_80": (65536, 164 * 1024, 2048, 32),
    "sm_90": (65536, 228 * 1024, 2048, 32),
}
COUNTED = ["LDSM", "LDS", "HMMA", "LDGSTS", "BAR"]
# The attention kernels' files, today's layout first; the first pattern that matches in a tree
# is taken.
DEFAULT_SOURCES = ["kernels/cuda/fmha*.cu", "src/kernels/cuda/fmha*.cu"]


def find_tool(name, env):
    for cand in (os.environ.get(env), shutil.which(name),
                 os.path.join(os.path.dirname(shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"),
                              name)):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    sys.exit(f"kernel_report: {name} not found: set ${env} (see --help for how to get it)")


def find_sources(root, patterns):
    """The files under root that the patterns match, sorted; with the default patterns, those of
    the first that matches any."""
    def matches(pattern):
        return sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, pattern)))
    if patterns is DEFAULT_SOURCES:
        for pattern in patterns:
            if matches(pattern):
                return matches(pattern)
        sys.exit(f"kernel_report: no {' or '.join(patterns)} under {root}")
    found = []
    for pattern in patterns:
        got = matches(pattern)
        if not got:
            sys.exit(f"kernel_report: {pattern} matches nothing under {root}")
        found += [f for f in got if f not in found]
    return found


def short_name(mangled):
    out = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip()
    out = re.sub(r"\(anonymous namespace\)", "anon", out)
    out = re.sub(r"\([^()]*\)$", "", out)  # the parameters
    out = re.sub(r"^.*::", "", out.split("<")[0]) + (
        "<" + out.split("<", 1)[1] if "<" in out else "")
    return out.replace("__nv_bfloat16", "bf16").replace("__half", "f16").replace(
        "unsigned short", "u16").replace("unsigned int", "u32")


def compile_cubin(nvcc, root, source, arch, tmp):
    keep = os.path.join(tmp, arch, source.replace(os.sep, "_"))
    os.makedirs(keep)
    cubin = os.path.join(keep, "out.cubin")
    # src/ and the tree's root are the include roots ("model/bert.h", "kernels/backend.h"); the
    # oldest trees included kernel headers from kernels/ itself ("backend.h"), which today's
    # sources never do, so that root is harmless for them.
    includes = ["-I", os.path.join(root, "src"), "-I", root]
    if os.path.isdir(os.path.join(root, "kernels")):
        includes += ["-I", os.path.join(root, "kernels")]
    cmd = [nvcc, "-cubin", f"-arch={arch}", "-O3", "-DNDEBUG", "-std=c++17", *includes,
           "-Xptxas", "-v", "-keep", "-keep-dir", keep, "-o", cubin, os.path.join(root, source)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"kernel_report: nvcc failed:\n{' '.join(cmd)}\n{r.stderr}")
    ptx = ""
    for f in os.listdir(keep):
        if f.endswith(".ptx"):
            with open(os.path.join(keep, f)) as h:
                ptx += h.read()
    return cubin, r.stderr, ptx


def ptxas_resources(log):
    res, cur = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1)
            res[cur] = {"spill_st": 0, "spill_ld": 0, "smem": 0, "regs": 0}
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            res[cur]["spill_st"], res[cur]["spill_ld"] = int(m.group(1)), int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            res[cur]["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            res[cur]["smem"] = int(s.group(1)) if s else 0
    return res


def max_threads(ptx):
    out, cur = {}, None
    for line in ptx.splitlines():
        m = re.match(r"\.visible \.entry (\S+)\(|\.entry (\S+)\(", line.strip())
        if m:
            cur = m.group(1) or m.group(2)
        m = re.search(r"\.maxntid (\d+), (\d+), (\d+)", line)
        if m and cur:
            out[cur] = int(m.group(1)) * int(m.group(2)) * int(m.group(3))
    return out


def sass_counts(cuobjdump, cubin):
    sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True).stdout
    counts, cur = {}, None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            counts[cur] = {k: 0 for k in COUNTED}
            continue
        if "@!PT " in line:  # never executed (padding the compiler puts around shuffles)
            continue
        m = re.search(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9]+)[.\s]", line)
        if m and cur:
            op = m.group(1)
            if op in counts[cur]:
                counts[cur][op] += 1
    return counts


def blocks_per_sm(arch, regs, smem, threads):
    reg_sm, smem_sm, thr_sm, blk_sm = SM[arch]
    warps = (threads + 31) // 32
    per_warp = ((max(regs, 1) * 32 + 255) // 256) * 256
    lim = {"regs": (reg_sm // per_warp) // warps, "threads": thr_sm // threads, "blocks": blk_sm}
    if smem:
        lim["smem"] = smem_sm // (((smem + 127) // 128) * 128 + 1024)
    by = min(lim, key=lim.get)
    return lim[by], by


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--source", action="append",
                    help="a file or glob relative to the root (repeatable)")
    ap.add_argument("--arch", action="append")
    ap.add_argument("--threads", type=int, default=128, help="when a kernel has no bounds")
    ap.add_argument("--filter", default="fmha_|zero_padding", help="regex on the kernel names")
    a = ap.parse_args()
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cuobjdump = find_tool("cuobjdump", "CUOBJDUMP")
    root = os.path.abspath(a.root)
    sources = find_sources(root, a.source or DEFAULT_SOURCES)
    for source in sources:
        print(f"{root}/{source}")
    hdr = (f"{'arch':6} {'kernel':30} {'regs':>4} {'spill st/ld':>11} {'smem':>6} "
           f"{'blocks/SM':>13} " + " ".join(f"{k:>6}" for k in COUNTED))
    print(hdr)
    print("-" * len(hdr))
    with tempfile.TemporaryDirectory() as tmp:
        for arch in a.arch or ["sm_80", "sm_90"]:
            res, bounds, counts = {}, {}, {}
            for source in sources:
                cubin, log, ptx = compile_cubin(nvcc, root, source, arch, tmp)
                res.update(ptxas_resources(log))
                bounds.update(max_threads(ptx))
                counts.update(sass_counts(cuobjdump, cubin))
            for fn in sorted(res, key=short_name):
                name = short_name(fn)
                if not re.search(a.filter, name):
                    continue
                r, c = res[fn], counts.get(fn, {k: 0 for k in COUNTED})
                threads = bounds.get(fn, a.threads)
                n, by = blocks_per_sm(arch, r["regs"], r["smem"], threads)
                print(f"{arch:6} {name:30} {r['regs']:>4} {r['spill_st']:>5}/{r['spill_ld']:<5} "
                      f"{r['smem']:>6} {n:>3} ({by:7}) " + " ".join(f"{c[k]:>6}" for k in COUNTED))


if __name__ == "__main__":
    main()
