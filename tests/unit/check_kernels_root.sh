#!/usr/bin/env bash
# kernels/ stands on its own (ctest kernels_see_only_their_root): built as a kernels file is, with
# only what packbert_kernels gives a user, a source that includes the kernels' headers compiles
# (tests/unit/kernels_root/ok.cpp) and one that includes "model/bert.h" fails because the header
# is not found (bad.cpp). The two targets are left out of the build; this builds them.
#   check_kernels_root.sh CMAKE BUILD_DIR
set -uo pipefail
cmake=${1:?usage: check_kernels_root.sh CMAKE BUILD_DIR} build=${2:?}
if ! out=$("$cmake" --build "$build" --target kernels_root_ok 2>&1); then
  echo "the control probe (kernels/backend.h, kernels/base/error.h) does not compile:"
  echo "$out"
  exit 1
fi
if out=$("$cmake" --build "$build" --target kernels_root_bad 2>&1); then
  echo "a kernels file that includes \"model/bert.h\" compiled: src/ is on the kernels' include path"
  exit 1
fi
if ! grep -q 'model/bert.h: No such file' <<< "$out"; then
  echo "the probe of \"model/bert.h\" failed, but not because the header is missing:"
  echo "$out"
  exit 1
fi
echo "kernels see only the repository root: kernels/backend.h resolves, model/bert.h does not"
