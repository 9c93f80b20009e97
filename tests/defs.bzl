"""Test rules: a test is one source file named like its target, beside its BUILD file."""

load("//tools/bazel:cc.bzl", "cc_binary", "cc_test")

def fabric_cc_test(name, srcs = None, deps = [], size = "small", **kwargs):
    """A GoogleTest test `name` built from `name`.cc (unless `srcs` says otherwise), with main.

    Args:
      name: the target, and the source file's stem.
      srcs: the sources when they are not just `name`.cc.
      deps: what the test uses (gtest_main is added).
      size: Bazel's test size; "small" unless given.
      **kwargs: any other cc_test attribute (data, env, tags, local_defines, ...).
    """
    cc_test(
        name = name,
        srcs = srcs or [name + ".cc"],
        size = size,
        deps = deps + ["@gtest//:gtest_main"],
        **kwargs
    )

def test_helper(name, srcs = None, **kwargs):
    """A program that a multi-process test starts (tests find it with helper_binary()).

    Args:
      name: the target, and the source file's stem.
      srcs: the sources when they are not just `name`.cc.
      **kwargs: any other cc_binary attribute (deps, ...).
    """
    cc_binary(
        name = name,
        srcs = srcs or [name + ".cc"],
        testonly = True,
        **kwargs
    )

def simd_twin(name, test, gtest_filter, size = "medium"):
    """`test` (a fabric_cc_test) run again with the CPU kernels held to AVX2 (tests/simd_twin.sh).

    For parity tests: a bitwise parity or a bound that holds at one SIMD width only (AVX-512 with
    or without AMX, AVX2) fails here on every machine, not just on the CI machine of one kind.

    Args:
      name: the twin's target.
      test: the test target (its data come along).
      gtest_filter: the tests of `test` to run (--gtest_filter).
      size: Bazel's test size.
    """
    native.sh_test(
        name = name,
        srcs = ["//tests:simd_twin.sh"],
        data = [test],
        args = ["$(location %s)" % test, "--gtest_filter=" + gtest_filter],
        size = size,
    )
