"""fabric_dependencies(): every external repository Fabric++ needs, for this workspace and for
users who depend on Fabric++ from their own Bazel workspace:

    # WORKSPACE of your project
    local_repository(name = "fabricpp", path = "third_party/fabricpp")
    load("@fabricpp//tools/bazel:deps.bzl", "fabric_dependencies")
    fabric_dependencies(fabric_path = "third_party/fabricpp")

    # BUILD
    cc_binary(name = "train", srcs = ["train.cc"], deps = ["@fabricpp//:fabric"])

Repositories already declared (e.g. your own @gtest) are left alone.
"""

load("//tools/bazel:libtorch_configure.bzl", "libtorch_configure")
load("//tools/bazel:system_library.bzl", "system_library")

def _maybe(rule, name, **kwargs):
    if not native.existing_rule(name):
        rule(name = name, **kwargs)

# System libraries from Debian -dev packages (installed by tools/setup.sh), by repository name;
# fabric_dependencies() (WORKSPACE) and the module extension (MODULE.bazel) both declare these.
SYSTEM_LIBRARIES = {
    "yaml_cpp": dict(
        debian_package = "libyaml-cpp-dev",
        headers = ["yaml-cpp"],
        linkopts = ["-lyaml-cpp"],
        target_name = "yaml_cpp",
    ),
    "gflags": dict(
        debian_package = "libgflags-dev",
        headers = ["gflags"],
        linkopts = ["-lgflags"],
        target_name = "gflags",
    ),
    "glog": dict(
        debian_package = "libgoogle-glog-dev",
        headers = ["glog"],
        linkopts = ["-lglog"],
        target_name = "glog",
        deps = ["@gflags"],
    ),
    "gtest": dict(
        debian_package = "libgtest-dev",
        extra_targets = {"gtest_main": "-l:libgtest_main.a"},
        headers = ["gtest"],
        linkopts = ["-l:libgtest.a", "-lpthread"],
        target_name = "gtest",
    ),
    "gmock": dict(
        debian_package = "libgmock-dev",
        headers = ["gmock"],
        linkopts = ["-l:libgmock.a"],
        target_name = "gmock",
        deps = ["@gtest"],
    ),
    "benchmark": dict(
        debian_package = "libbenchmark-dev",
        extra_targets = {"benchmark_main": "-l:libbenchmark_main.a"},
        headers = ["benchmark"],
        linkopts = ["-lbenchmark", "-lpthread"],
        target_name = "benchmark",
    ),
    "zlib": dict(
        debian_package = "zlib1g-dev",
        headers = ["zlib.h", "zconf.h"],
        linkopts = ["-lz"],
        target_name = "zlib",
    ),
    "libjpeg": dict(
        debian_package = "libjpeg62-turbo-dev",
        headers = ["jpeglib.h", "jmorecfg.h", "jerror.h"],  # jconfig.h: the multiarch folder
        linkopts = ["-ljpeg"],
        target_name = "libjpeg",
    ),
    "libpng": dict(
        debian_package = "libpng-dev",
        headers = ["png.h", "pngconf.h", "pnglibconf.h"],
        linkopts = ["-lpng16"],
        target_name = "libpng",
        deps = ["@zlib"],
    ),
    "nlohmann_json": dict(
        debian_package = "nlohmann-json3-dev",
        headers = ["nlohmann"],
        target_name = "nlohmann_json",
    ),
}

def fabric_dependencies(fabric_path = "."):
    """Declares the offline stand-ins, LibTorch and the Debian system libraries.

    Args:
      fabric_path: path of the Fabric++ checkout relative to the main workspace root.
    """

    # Bazel's own tool packages load these three; offline they cannot be downloaded, so they point
    # at minimal stand-ins (tools/bazel/README.md).
    for name in ["rules_cc", "rules_java", "remote_coverage_tools"]:
        _maybe(native.local_repository, name, path = fabric_path + "/tools/bazel/" + name)

    # LibTorch from LIBTORCH_HOME or the python3 `torch` package.
    _maybe(libtorch_configure, "libtorch")

    # System libraries from Debian -dev packages (installed by tools/setup.sh).
    for name, attrs in SYSTEM_LIBRARIES.items():
        _maybe(system_library, name, **attrs)
