#!/usr/bin/env bash
# bazel run //tools:plot -- PATH... [--out=FILE.png] [--size=WxH] [--metrics=a,b]
# Runs tools/plot_metrics.py (see its docstring) with $PYTHON (default python3; tools/setup.sh
# installs matplotlib there). Relative paths are taken from where the command was run.
set -euo pipefail
self="${BASH_SOURCE[0]}"
script=""
for candidate in "${RUNFILES_DIR:-/nonexistent}/fabricpp/tools/plot_metrics.py" \
                 "$self.runfiles/fabricpp/tools/plot_metrics.py" \
                 "$(dirname "$self")/plot_metrics.py"; do
  if [ -f "$candidate" ]; then script="$(cd "$(dirname "$candidate")" && pwd)/plot_metrics.py"; break; fi
done
[ -n "$script" ] || { echo "plot: cannot find plot_metrics.py next to $self" >&2; exit 1; }
cd "${BUILD_WORKING_DIRECTORY:-.}"
exec "${PYTHON:-python3}" "$script" "$@"
