"""cc_library, cc_binary and cc_test for this repository's BUILD files: the rules of @rules_cc,
plus the precompiled `<torch/types.h>` (pch.bzl) for every target that lists @libtorch//:torch
among its deps. Nothing else differs; a target without LibTorch is passed through unchanged."""

load(
    "@rules_cc//cc:defs.bzl",
    _cc_binary = "cc_binary",
    _cc_library = "cc_library",
    _cc_test = "cc_test",
)

_TORCH = "@libtorch//:torch"
_PCH = "//tools/bazel:torch_pch"
_PCH_HEADER = "tools/bazel/pch/torch_pch.h"

def _with_torch_pch(kwargs):
    deps = kwargs.get("deps", [])
    if type(deps) == "list" and _TORCH in deps and kwargs.get("srcs"):
        kwargs["deps"] = deps + [_PCH]
        kwargs["copts"] = ["-include", _PCH_HEADER, "-Winvalid-pch"] + kwargs.get("copts", [])
    return kwargs

def cc_library(**kwargs):
    _cc_library(**_with_torch_pch(kwargs))

def cc_binary(**kwargs):
    _cc_binary(**_with_torch_pch(kwargs))

def cc_test(**kwargs):
    _cc_test(**_with_torch_pch(kwargs))
