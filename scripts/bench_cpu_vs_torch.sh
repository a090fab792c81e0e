#!/usr/bin/env bash
# packbert CPU vs PyTorch CPU, side by side in one run: BERT-mini forward + backward tokens/s of
# build/tests/bench_model_cpu (padded / packed / unpadded layouts) against the same step in
# PyTorch (Debian's python3-torch) in the padded layout users run today, on the same batches,
# with the same thread count. Prints both programs' own output, then a table:
#
#   L  layout  packbert tok/s  torch padded tok/s  packbert/torch  target
#
# Targets: packbert padded >= 1.0x torch padded (so all of the unpadding gain is a gain over
# torch), and packbert unpadded / packbert padded >= 1.8x at 512 (bench_model_cpu's own target).
# Measurements only: nothing here fails on a time, the verdicts are printed, not asserted.
# With several rounds every row is its best round, so the table's unpadded/padded can differ
# from the one bench_model_cpu prints for a single round.
#
# Usage (from anywhere; the repository must be built: cmake --build build):
#   scripts/bench_cpu_vs_torch.sh [--threads 2] [--rounds 1] [--reps 2] [--tokens 4096]
#                                 [--max-len 128|512|both] [--build build] [--optimizer]
#   --threads N   OMP_NUM_THREADS for both programs, torch.set_num_threads(N) for torch (2)
#   --rounds R    run the pair R times alternately (packbert, torch, packbert, ...) and keep
#                 each program's best per row: on a shared, noisy machine R = 2..3 helps (1)
#   --reps K      timed steps per configuration in each program, best taken (2; 1 warm-up)
#   --tokens T    real tokens per batch (4096)
#   --max-len     which sequence length(s) to run (both)
#   --build DIR   the build folder holding tests/bench_model_cpu, relative to the repository
#                 root or absolute (build)
#   --optimizer   torch also times AdamW.step() alone (printed in torch's output only)
#   --table LOG   run nothing: rebuild the table from LOG, a saved stdout of this script
#   env PYTHON    the interpreter with torch (/usr/bin/python3)
#
# Same batches: `bench_model_cpu --print-lengths` prints the sample lengths and masked counts it
# times, and torch_bert_step.py times those. The table's "batch" column checks the samples /
# tokens / masked counts of the two programs; if that fails torch draws its own batch from the
# same histogram (same distribution, not the same batch) and the column says "own draw".
set -euo pipefail

threads=2 rounds=1 reps=2 tokens=4096 max_len=both build=build optimizer=() table_from=
while (($#)); do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --max-len) max_len=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --optimizer) optimizer=(--optimizer); shift ;;
    --table) table_from=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_cpu_vs_torch.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# The table, from bench_model_cpu's rows (file 1) and torch_bert_step.py's "torch" rows (file 2),
# best tokens/s per row over all rounds. Both may be the same file (this script's log): the row
# patterns tell the two programs apart.
print_table() {
  awk '
  FNR == 1 { file++ }
  # bench_model_cpu rows: max_len layout samples rows tokens masked ms tokens/s arena vs
  file == 1 && $1 ~ /^(128|512)$/ && $2 ~ /^(padded|packed|unpadded)$/ && $3 ~ /^[0-9]+$/ &&
      $8 ~ /^[0-9.]+$/ {
    k = $1 " " $2
    if (!(k in pb) || $8 + 0 > pb[k]) pb[k] = $8 + 0
    pbb[$1] = $3 "/" $5 "/" $6
    seen[$1] = 1
  }
  # torch rows: torch max_len layout what threads samples rows tokens masked ms tokens/s
  file == 2 && $1 == "torch" && $4 == "fwd+bwd" && $11 ~ /^[0-9.]+$/ {
    if (!($2 in tp) || $11 + 0 > tp[$2]) tp[$2] = $11 + 0
    tb[$2] = $6 "/" $8 "/" $9
  }
  file == 2 && /^lengths: .*\(own draw\)/ { own = 1 }
  END {
    printf "%4s  %-8s  %14s  %18s  %14s  %-38s  %s\n", "L", "layout", "packbert tok/s",
           "torch padded tok/s", "packbert/torch", "target", "batch (samples/tokens/masked)"
    n = split("128 512", Ls, " "); m = split("padded packed unpadded", lay, " ")
    for (i = 1; i <= n; ++i) {
      L = Ls[i]
      if (!(L in seen)) continue
      batch = own ? "own draw: packbert " pbb[L] ", torch " tb[L] \
                  : (pbb[L] == tb[L] ? "same " pbb[L] : "DIFFERS: packbert " pbb[L] ", torch " tb[L])
      for (j = 1; j <= m; ++j) {
        k = L " " lay[j]
        if (!(k in pb)) continue
        has_tp = (L in tp) && tp[L] > 0
        ratio = has_tp ? sprintf("%.2fx", pb[k] / tp[L]) : "-"
        target = ""
        if (lay[j] == "padded")
          target = !has_tp ? "(no torch row)" \
                 : sprintf("padded >= 1.00x torch: %s", pb[k] >= tp[L] ? "met" : "NOT met")
        if (lay[j] == "unpadded" && (L " padded") in pb) {
          up = pb[k] / pb[L " padded"]
          target = L == 512 ? sprintf("unpadded/padded %.2fx (>= 1.8x: %s)", up,
                                      up >= 1.8 ? "met" : "NOT met") \
                            : sprintf("unpadded/padded %.2fx", up)
        }
        printf "%4s  %-8s  %14.0f  %18s  %14s  %-38s  %s\n", L, lay[j], pb[k],
               has_tp ? sprintf("%.0f", tp[L]) : "-", ratio, target, j == 1 ? batch : ""
      }
    }
  }' "$1" "$2"
}

if [[ -n $table_from ]]; then
  [[ -r $table_from ]] || { echo "bench_cpu_vs_torch.sh: cannot read $table_from" >&2; exit 1; }
  echo "== table rebuilt from $table_from (best over its rounds)"
  print_table "$table_from" "$table_from"
  exit 0
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
python=${PYTHON:-/usr/bin/python3}
bench=$build/tests/bench_model_cpu
hist=tests/data/wikipedia-seqlen-histogram-512.txt
[[ -x $bench ]] || { echo "bench_cpu_vs_torch.sh: no $bench (build first)" >&2; exit 1; }
"$python" -c 'import torch' 2>/dev/null ||
  { echo "bench_cpu_vs_torch.sh: $python cannot import torch (apt-get install python3-torch)" >&2
    exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
lengths=()
if "$bench" --tokens "$tokens" --print-lengths >"$tmp/lengths.txt"; then
  lengths=(--lengths "$tmp/lengths.txt")
else
  echo "note: $bench --print-lengths failed; torch draws its own batch from the same histogram" >&2
fi

# BERT-mini, forward + backward only: what torch_bert_step.py times (bench_model_cpu's default
# table also runs BERT-base and adds the LAMB update to every step).
pb_args=(--model mini --no-lamb --tokens "$tokens" --reps "$reps")
[[ $max_len == both ]] || pb_args+=(--max-len "$max_len")
export OMP_NUM_THREADS=$threads
echo "== $(date -u +%FT%TZ), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)," \
     "OMP_NUM_THREADS=$threads, $rounds round(s)"
for ((r = 1; r <= rounds; ++r)); do
  echo; echo "== round $r: $bench ${pb_args[*]}"
  "$bench" "${pb_args[@]}" | tee -a "$tmp/pb.txt"
  echo; echo "== round $r: $python tests/bench/torch_bert_step.py (threads $threads)"
  "$python" tests/bench/torch_bert_step.py --threads "$threads" --reps "$reps" \
    --tokens "$tokens" --max-len "$max_len" "${lengths[@]}" "${optimizer[@]}" |
    tee -a "$tmp/torch.txt"
done

echo
echo "== packbert (best of $rounds round(s)) vs PyTorch" \
     "$("$python" -c 'import torch; print(torch.__version__)') padded, $threads threads," \
     "load average now $(cut -d' ' -f1-3 /proc/loadavg); tokens/s counts real tokens"
print_table "$tmp/pb.txt" "$tmp/torch.txt"
