#!/usr/bin/env bash
# `g++ ddp_train.cc $(pkg-config --cflags --libs fabricpp)` against a fresh install prefix: the
# program compiles, links, runs on one process and on two DDP processes (replicas identical).
source tests/packaging/testing.sh
exe="$TEST_TMPDIR/ddp_train"
# shellcheck disable=SC2046
if g++ -O1 examples/cmake_consumer/ddp_train.cc -o "$exe" $(pkg-config --cflags --libs fabricpp) \
     >"$TEST_TMPDIR/compile.log" 2>&1; then
  echo "ok: compiled and linked with pkg-config's flags alone"
  out=$("$exe" trainer.max_epochs=20 2>&1); rc=$?
  check "one process: exit 0 (got $rc: $(tail -n 2 <<<"$out"))" test $rc -eq 0
  check "one process: 1 rank" grep -q '^ranks 1: replicas identical' <<<"$out"
  out=$("$exe" fabric.strategy=ddp fabric.devices=2 fabric.accelerator=cpu trainer.max_epochs=20 2>&1); rc=$?
  check "two DDP processes: exit 0 (got $rc: $(tail -n 2 <<<"$out"))" test $rc -eq 0
  check "two DDP processes: identical replicas" grep -q '^ranks 2: replicas identical' <<<"$out"
  needed=$(readelf -d "$exe" | grep -c 'libfabricpp.so.'"$FABRIC_SOVERSION")
  check "the program needs libfabricpp.so.$FABRIC_SOVERSION (the soname)" test "$needed" -eq 1
else
  tail -n 30 "$TEST_TMPDIR/compile.log" >&2
  fail "ddp_train.cc does not compile and link with \$(pkg-config --cflags --libs fabricpp)"
fi
finish
