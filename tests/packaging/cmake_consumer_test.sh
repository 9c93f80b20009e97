#!/usr/bin/env bash
# examples/cmake_consumer, a plain CMake project, builds against a fresh install prefix with
# find_package(FabricPP) and trains with DDP in two CPU processes whose replicas end identical; a
# LibTorch of another version found by CMake is a configure-time error naming both versions.
source tests/packaging/testing.sh
src=examples/cmake_consumer
build="$TEST_TMPDIR/build"

if cmake -S "$src" -B "$build" -DCMAKE_PREFIX_PATH="$PREFIX;$TORCH_CMAKE" >"$TEST_TMPDIR/configure.log" 2>&1 &&
   cmake --build "$build" -j2 >"$TEST_TMPDIR/build.log" 2>&1; then
  echo "ok: cmake configure + build"
  out=$("$build/ddp_train" fabric.strategy=ddp fabric.devices=2 fabric.accelerator=cpu trainer.max_epochs=20 2>&1)
  rc=$?
  check "ddp_train over 2 processes exits 0 (got $rc: $(tail -n 3 <<<"$out"))" test $rc -eq 0
  check "2 ranks, identical replicas" grep -q '^ranks 2: replicas identical, accuracy' <<<"$out"
else
  tail -n 30 "$TEST_TMPDIR/configure.log" "$TEST_TMPDIR/build.log" 2>/dev/null >&2
  fail "examples/cmake_consumer does not configure and build against the install prefix"
fi

# A CMake package that says it is LibTorch 2.0.0, first on the prefix path.
fake="$TEST_TMPDIR/fake_torch"
mkdir -p "$fake/Torch"
echo 'set(TORCH_LIBRARIES "")' >"$fake/Torch/TorchConfig.cmake"
printf 'set(PACKAGE_VERSION "2.0.0")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n' >"$fake/Torch/TorchConfigVersion.cmake"
out=$(cmake -S "$src" -B "$TEST_TMPDIR/build_mismatch" -DCMAKE_PREFIX_PATH="$PREFIX;$fake;$TORCH_CMAKE" 2>&1)
rc=$?
check "a LibTorch 2.0.0 found by CMake fails the configure (exit $rc)" test $rc -ne 0
check "the error names both LibTorch versions" \
  grep -q "built against LibTorch $LIBTORCH_VERSION but CMake found LibTorch 2.0.0" <<<"$(tr '\n' ' ' <<<"$out" | tr -s ' ')"

# find_package(FabricPP 9.0) against this version: not found, with the version named.
sed 's/find_package(FabricPP 0.1 REQUIRED)/find_package(FabricPP 9.0 REQUIRED)/' "$src/CMakeLists.txt" >"$TEST_TMPDIR/CMakeLists.txt"
mkdir -p "$TEST_TMPDIR/v9" && cp "$TEST_TMPDIR/CMakeLists.txt" "$src/ddp_train.cc" "$TEST_TMPDIR/v9/"
out=$(cmake -S "$TEST_TMPDIR/v9" -B "$TEST_TMPDIR/build_v9" -DCMAKE_PREFIX_PATH="$PREFIX;$TORCH_CMAKE" 2>&1)
rc=$?
check "find_package(FabricPP 9.0) fails against $FABRIC_VERSION, naming it (exit $rc)" \
  test $rc -ne 0 -a -n "$(grep -F "$FABRIC_VERSION" <<<"$out")"
finish
