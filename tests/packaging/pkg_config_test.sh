#!/usr/bin/env bash
# The README's pkg-config snippet, run verbatim after the CMake snippet's install line: one g++
# command compiles and links examples/cmake_consumer/ddp_train.cc, which trains with DDP in two CPU
# processes (replicas identical); the same program on one process, and under fsdp and ZeRO-1 with
# rotated checkpoints; it needs the library's soname.
source tests/packaging/testing.sh
work="$TEST_TMPDIR/pc"
mkdir -p "$work"
(cd "$work" && HOME=$work "$RUNFILES_ROOT/tools/install" "$work/fabricpp" >"$TEST_TMPDIR/install.log" 2>&1) ||
  { cat "$TEST_TMPDIR/install.log" >&2; fail "install into $work/fabricpp failed"; finish; }
out=$(run_readme_snippet pkg-config "$work" 2>&1); rc=$?
check "README's pkg-config snippet exits 0 (got $rc: $(tail -n 5 <<<"$out"))" test $rc -eq 0
check "it trained on 2 ranks with identical replicas" grep -q '^ranks 2: replicas identical' <<<"$out"
if [ -x "$work/ddp_train" ]; then
  out=$(cd "$work" && ./ddp_train trainer.max_epochs=20 2>&1); rc=$?
  check "one process: exit 0 and 1 rank (got $rc: $(tail -n 2 <<<"$out"))" \
    grep -q '^ranks 1: replicas identical' <<<"$out"
  check_rotated_checkpoints "$work" ./ddp_train
  needed=$(readelf -d "$work/ddp_train" | grep -c "libfabricpp.so.$FABRIC_SOVERSION")
  check "the program needs libfabricpp.so.$FABRIC_SOVERSION (the soname)" test "$needed" -eq 1
fi
finish
