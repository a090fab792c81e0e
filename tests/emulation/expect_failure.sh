#!/usr/bin/env bash
# A mutation test (tests/emulation/CMakeLists.txt): runs a test binary with a planted mistake
# (PACKBERT_EMU_MUTANT in the environment) and passes only when the mistake is caught: the binary
# exits non-zero and says why, with a failed test or an emulation fault, or with --need, with
# output matching REGEX (a sanitizer's report). A crash, a timeout or a run that found nothing
# fails.
#   expect_failure.sh [--need REGEX] BINARY [ARGS...]
set -uo pipefail
need=""
if [ "${1:-}" = "--need" ]; then need=$2; shift 2; fi
if [ -z "${PACKBERT_EMU_MUTANT:-}" ]; then
  echo "expect_failure.sh: PACKBERT_EMU_MUTANT is not set" >&2
  exit 2
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" --gtest_color=no > "$log" 2>&1
code=$?
failed=$(grep -c '^\[  FAILED  \] .* ([0-9]* ms)$' "$log")
faults=$(grep -c '^cuda emulation: fault:' "$log")
passed=$(grep -c '^\[       OK \]' "$log")
echo "mutant ${PACKBERT_EMU_MUTANT}: exit $code, $failed tests failed, $passed passed," \
     "$faults emulation faults"
grep -m3 '^cuda emulation: fault:' "$log"
grep '^\[  FAILED  \] .* ([0-9]* ms)$' "$log" | head -5
if [ "$code" -eq 0 ]; then
  echo "NOT CAUGHT: every test passed with the mistake planted"
  exit 1
fi
if [ -n "$need" ]; then
  if grep -E -m1 -A12 "$need" "$log"; then exit 0; fi
  echo "the run failed, but without the report wanted ($need); last lines:"
  tail -20 "$log"
  exit 1
fi
if [ "$code" -gt 128 ] || { [ "$failed" -eq 0 ] && [ "$faults" -eq 0 ]; }; then
  echo "the binary ended without a failed test or a fault (crash?); last lines:"
  tail -20 "$log"
  exit 1
fi
exit 0
