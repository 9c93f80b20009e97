#!/usr/bin/env bash
# Bazel --workspace_status_command: prints the project revision for stamped targets.
# STABLE_ keys go to stable-status.txt; a change relinks only the targets that read it.
rev=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ "$rev" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  rev="${rev}-dirty"
fi
echo "STABLE_FABRIC_REVISION ${rev}"
