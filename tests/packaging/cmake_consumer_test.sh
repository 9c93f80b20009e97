#!/usr/bin/env bash
# The README's CMake snippet, run verbatim: install into a fresh prefix, configure and build
# examples/cmake_consumer with find_package(FabricPP), train with DDP in two CPU processes whose
# replicas end identical. A LibTorch of another version found by CMake is a configure-time error
# naming both versions; a FabricPP version request this install cannot meet is refused.
source tests/packaging/testing.sh
work="$TEST_TMPDIR/cmake"
out=$(run_readme_snippet cmake "$work" 2>&1); rc=$?
check "README's CMake snippet exits 0 (got $rc: $(tail -n 5 <<<"$out"))" test $rc -eq 0
check "it trained on 2 ranks with identical replicas" grep -q '^ranks 2: replicas identical, accuracy' <<<"$out"
PREFIX="$work/fabricpp"
src="$work/examples/cmake_consumer"

# The torch wheel's libtorch.so exports copies of standard-library functions, and its
# std::filesystem::remove_all jumps to address 0. None of the program's or libfabricpp's
# standard-library symbols may bind there (FabricPPConfig.cmake links stdc++ ahead of LibTorch).
# Sharded checkpoints rotated by a CMake build (once SIGSEGV at the 3rd): mnist_port_test.
if [ -x "$work/build/ddp_train" ]; then
  (cd "$work" && LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT="$TEST_TMPDIR/bindings" \
    build/ddp_train trainer.max_epochs=1 fabric.devices=1 fabric.accelerator=cpu logging.run_dir=bind_run >/dev/null 2>&1)
  into_torch=$(cat "$TEST_TMPDIR"/bindings.* 2>/dev/null |
    grep -E "binding file [^ ]*(ddp_train|libfabricpp)[^ ]* .* to [^ ]*libtorch[^ /]*\.so.*symbol \`_ZN?St" |
    sed -E "s/.*symbol \`([^']*)'.*/\1/" | sort -u)
  check "the loader's bindings were recorded" test -n "$(cat "$TEST_TMPDIR"/bindings.* 2>/dev/null | head -c 1)"
  check "no standard-library symbol of the program binds into libtorch*.so ($(head -n 3 <<<"$into_torch" | tr '\n' ' '))" \
    test -z "$into_torch"
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
sed -i 's/find_package(FabricPP 0.1 REQUIRED)/find_package(FabricPP 9.0 REQUIRED)/' "$src/CMakeLists.txt"
out=$(cmake -S "$src" -B "$TEST_TMPDIR/build_v9" -DCMAKE_PREFIX_PATH="$PREFIX;$TORCH_CMAKE" 2>&1)
rc=$?
check "find_package(FabricPP 9.0) fails against $FABRIC_VERSION, naming it (exit $rc)" \
  test $rc -ne 0 -a -n "$(grep -F "$FABRIC_VERSION" <<<"$out")"
finish
