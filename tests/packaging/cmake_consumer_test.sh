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

# Sharded checkpoints rotated (fsdp over 2 ranks, a checkpoint every 4 steps, 2 kept): the CMake
# build links libtorch.so ahead of libstdc++, and libtorch.so's copy of
# std::filesystem::remove_all jumps to address 0 (SIGSEGV at the 3rd checkpoint before
# fabric::remove_tree).
if [ -x "$work/build/ddp_train" ]; then
  out=$(cd "$work" && build/ddp_train fabric.strategy=fsdp fabric.devices=2 fabric.accelerator=cpu \
    trainer.max_epochs=2 checkpoint.every_n_steps=4 checkpoint.keep_last=2 \
    logging.run_dir=fsdp_run 2>&1); rc=$?
  # 2 epochs train to ~0.55 accuracy (exit 1 says below 0.9); a crash is 128 + its signal.
  check "fsdp with rotated sharded checkpoints ends without a crash (got $rc: $(tail -n 3 <<<"$out"))" \
    test $rc -le 1
  check "and its replicas are identical" grep -q '^ranks 2: replicas identical' <<<"$out"
  kept=$(ls -d "$work"/fsdp_run/checkpoints/step-*.ckpt 2>/dev/null | wc -l)
  check "2 sharded checkpoints kept of 8 (found $kept)" test "$kept" -eq 2
  sharded=$(ls -d "$work"/fsdp_run/checkpoints/step-*.ckpt/ 2>/dev/null | wc -l)
  check "they are folders (sharded)" test "$sharded" -eq 2
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
