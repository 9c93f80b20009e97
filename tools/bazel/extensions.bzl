"""Module extension for Bazel 7+ (MODULE.bazel): the same repositories fabric_dependencies()
declares for WORKSPACE builds, from the same rules and the same table.

UNTESTED: this machine and CI have Bazel 4.2.3 only (no bzlmod); Bazel 4.2.3 never loads this file.
"""

load("//tools/bazel:deps.bzl", "SYSTEM_LIBRARIES")
load("//tools/bazel:libtorch_configure.bzl", "libtorch_configure")
load("//tools/bazel:system_library.bzl", "system_library")

def _fabric_deps_impl(module_ctx):
    libtorch_configure(name = "libtorch")
    for name, attrs in SYSTEM_LIBRARIES.items():
        system_library(name = name, **attrs)

fabric_deps = module_extension(implementation = _fabric_deps_impl)
