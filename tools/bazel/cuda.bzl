"""cuda_kernels(): a .cu file compiled by nvcc into a cc_library, when the build can.

Bazel 4.2.3 has no CUDA rules offline, so nvcc runs in a genrule and its object file becomes the
library's source. The kernels are built when LibTorch is a CUDA build, nvcc was found
(@libtorch//:info.bzl's NVCC: CUDA_HOME/bin/nvcc, FABRIC_NVCC, the nvidia wheels or PATH) and the
build is not --config=cpu_only; the library then exports the define FABRIC_WITH_CUDA_KERNELS.
Otherwise it is empty and callers take their ATen path (guard every call with the define).

Architectures: SASS for sm_80 (A100; runs on sm_86/sm_89), sm_90 (H100/H200), sm_100 (B200) and
sm_120, plus PTX of compute_120 for newer GPUs (the driver compiles it on first use).
"""

load("@libtorch//:info.bzl", "LIBTORCH_CUDA", "NVCC")
load("//tools/bazel:cc.bzl", "cc_library", "cc_test")

_GENCODE = " ".join([
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_100,code=sm_100",
    "-gencode arch=compute_120,code=[sm_120,compute_120]",
])

def cuda_kernels(name, src, hdrs = [], visibility = None):
    """Compiles `src` (a .cu file including only `hdrs` and CUDA headers) when the build can.

    Args:
      name: the cc_library's name.
      src: the .cu file.
      hdrs: headers with the kernels' C++ interface (no CUDA types in them).
      visibility: the cc_library's visibility.
    """
    if not NVCC:
        cc_library(name = name, hdrs = hdrs, visibility = visibility)
        return
    native.genrule(
        name = name + "_nvcc",
        srcs = [src] + hdrs,
        outs = [name + "_nvcc.o"],
        cmd = ("%s -c -O3 -std=c++17 -I. -Xcompiler -fPIC -Xcompiler -Wall %s $(location %s) -o $@" %
               (NVCC, _GENCODE, src)),
        message = "nvcc " + src,
    )
    cc_library(
        name = name,
        srcs = select({
            "@libtorch//:cpu_only": [],
            "//conditions:default": [name + "_nvcc.o"],
        }),
        hdrs = hdrs,
        defines = select({
            "@libtorch//:cpu_only": [],
            "//conditions:default": ["FABRIC_WITH_CUDA_KERNELS"],
        }),
        visibility = visibility,
        alwayslink = True,
    )

def cuda_emulated_test(name, src, hdrs = [], size = "small"):
    """A GoogleTest test `name`.cc that runs `src`'s kernels on the CPU (tools/cuda_emu).

    tools/cuda_emu/launches.py rewrites `src` (its launches become host calls, its CUDA runtime
    include tools/cuda_emu/shim.h) into a library built against the CUDA headers LibTorch's CUDA
    build ships (their host float8/bf16/fp16 conversions); the test calls the kernels through
    their C interface (`hdrs`). nvcc is not needed. Without a CUDA LibTorch there are no CUDA
    headers: nothing is defined.

    Args:
      name: the test, and its source file's stem.
      src: the .cu file.
      hdrs: headers `src` includes (its C interface among them).
      size: the test's size.
    """
    if not LIBTORCH_CUDA:
        return
    native.genrule(
        name = name + "_rewrite",
        srcs = [src],
        tools = ["//tools/cuda_emu:launches.py"],
        outs = [name + "_kernels.cc"],
        cmd = "python3 $(location //tools/cuda_emu:launches.py) $(location %s) > $@" % src,
        message = "rewriting " + src + " for the CPU",
        testonly = True,
    )
    cc_library(
        name = name + "_kernels",
        srcs = [name + "_kernels.cc"],
        hdrs = hdrs,
        # Kernels reinterpret memory as vector types (float4, uint4), as CUDA code does and nvcc
        # allows; a host compiler's strict-aliasing optimizations would read stale values.
        copts = ["-Wno-unknown-pragmas", "-fno-strict-aliasing"],
        deps = [
            "//tools/cuda_emu:shim",
            "@libtorch//:cuda_headers",
        ],
        testonly = True,
    )
    cc_test(
        name = name,
        srcs = [name + ".cc"],
        size = size,
        deps = [
            name + "_kernels",
            "@gtest//:gtest_main",
            "@libtorch//:cuda_headers",
        ],
    )
