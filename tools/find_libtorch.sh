# Sourced by a bundle's run.sh and install.sh (tools/bundle.sh copies it beside them).
# find_libtorch VERSION: finds the node's LibTorch from LIBTORCH_HOME (a LibTorch folder or
# site-packages/torch), else from `python3 -c "import torch"` (PYTHON overrides the interpreter).
# Sets LIBTORCH (the folder) and LIBTORCH_LIB_DIRS (its lib/ and the nvidia wheels' lib/ folders
# beside it, colon-separated); on failure sets LIBTORCH_ERROR (one line naming the fix, VERSION the
# torch to install) and returns 1.
find_libtorch() {
  LIBTORCH_ERROR=""
  if [ -n "${LIBTORCH_HOME:-}" ]; then
    LIBTORCH=$LIBTORCH_HOME
    if [ ! -f "$LIBTORCH/lib/libtorch_cpu.so" ]; then
      LIBTORCH_ERROR="LIBTORCH_HOME=$LIBTORCH has no lib/libtorch_cpu.so"
      return 1
    fi
  else
    local python=${PYTHON:-python3}
    if ! command -v "$python" >/dev/null; then
      LIBTORCH_ERROR="LIBTORCH_HOME is unset and no $python is on PATH"
      return 1
    fi
    LIBTORCH=$("$python" -c "import importlib.util, os; s = importlib.util.find_spec('torch'); print(os.path.dirname(s.origin) if s and s.origin else '')" 2>/dev/null) || true
    if [ -z "$LIBTORCH" ]; then
      LIBTORCH_ERROR="LibTorch not found: set LIBTORCH_HOME or install torch==$1 for $python"
      return 1
    fi
  fi
  LIBTORCH_LIB_DIRS="$LIBTORCH/lib"
  local d
  for d in "$LIBTORCH"/../nvidia/*/lib; do
    [ -d "$d" ] && LIBTORCH_LIB_DIRS="$LIBTORCH_LIB_DIRS:$d"
  done
  return 0
}
