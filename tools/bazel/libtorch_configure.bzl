"""`libtorch_configure`: finds LibTorch on this machine and exposes it as `@libtorch//:torch`.

Configure-style (like TensorFlow's cuda_configure): nothing is downloaded; the rule looks for an
installed LibTorch, checks it, and writes a BUILD file describing it.

Search order (the first hit wins; a set variable that points nowhere is an error, never skipped):
  1. `LIBTORCH_HOME`: a LibTorch folder (the zip from pytorch.org) or a `site-packages/torch` folder;
     either must hold `include/torch/` and `lib/libtorch_cpu.so`.
  2. `python3 -c "import torch"` (the interpreter named by `PYTHON_BIN_PATH`, else `python3` on PATH);
     tools/setup.sh installs the pinned wheel there.

Environment variables read (changing any of them re-runs this rule):
  LIBTORCH_HOME    LibTorch folder, see above.
  PYTHON_BIN_PATH  Python interpreter used to `import torch` when LIBTORCH_HOME is unset.
  CUDA_HOME        CUDA toolkit used for CUDA/NCCL headers when the nvidia wheels have none
                   (default /usr/local/cuda); its bin/nvcc compiles Fabric++'s CUDA kernels.
  FABRIC_NVCC      nvcc to use instead (else CUDA_HOME's, the nvidia wheels', then PATH's).
  PATH             Where `python3` is looked up.

Targets of the generated repository:
  @libtorch//:torch         headers, defines and link flags for LibTorch (+ CUDA parts when present).
  @libtorch//:cuda_headers  CUDA runtime and NCCL headers (empty on a CPU-only LibTorch).
  @libtorch//:info.bzl      LIBTORCH_PATH, LIBTORCH_CUDA (bool), LIBTORCH_VERSION, RUNTIME_LIB_DIRS,
                            LIBTORCH_CXX11_ABI ('0' or '1'),
                            TORCH_PYTHON (the interpreter with that torch; '' with LIBTORCH_HOME),
                            NVCC (path of nvcc on a CUDA build, '' when none was found).

Defines exported to dependents:
  FABRIC_WITH_CUDA   set when LibTorch has CUDA and the build is not `--config=cpu_only`
                     (`--define=fabric_cuda=off`). Guard every CUDA-only line with it.
  USE_DISTRIBUTED USE_C10D_GLOO (+ USE_C10D_NCCL with CUDA): needed by the c10d headers.
  _GLIBCXX_USE_CXX11_ABI=0|1  as detected from libc10.so's symbols.
"""

_ENV_VARS = ["LIBTORCH_HOME", "PYTHON_BIN_PATH", "CUDA_HOME", "FABRIC_NVCC", "PATH"]

_FIX = "run tools/setup.sh or set LIBTORCH_HOME"

def _is_libtorch(rctx, path):
    """True when `path` has LibTorch's headers and its core library."""
    return (rctx.path(path + "/include/torch").exists and
            rctx.path(path + "/lib/libtorch_cpu.so").exists and
            rctx.path(path + "/lib/libc10.so").exists)

def _find_libtorch(rctx):
    """Returns the LibTorch folder, or fails with one line saying what was looked for."""
    home = rctx.os.environ.get("LIBTORCH_HOME", "")
    if home:
        if _is_libtorch(rctx, home):
            return str(rctx.path(home).realpath)
        fail("LibTorch not found: LIBTORCH_HOME=%s has no include/torch/ and lib/libtorch_cpu.so; %s" %
             (home, _FIX))

    python = rctx.os.environ.get("PYTHON_BIN_PATH", "") or rctx.which("python3")
    if not python:
        fail("LibTorch not found: LIBTORCH_HOME is unset and no python3 is on PATH; " + _FIX)
    result = rctx.execute([
        python,
        "-c",
        "import importlib.util, os; s = importlib.util.find_spec('torch'); " +
        "print(os.path.dirname(s.origin) if s and s.origin else '')",
    ])
    path = result.stdout.strip()
    if result.return_code != 0 or not path:
        fail("LibTorch not found: LIBTORCH_HOME is unset and `%s -c \"import torch\"` finds no torch; %s" %
             (python, _FIX))
    if not _is_libtorch(rctx, path):
        fail("LibTorch not found: the torch package at %s has no include/torch/ and lib/libtorch_cpu.so; %s" %
             (path, _FIX))
    return str(rctx.path(path).realpath)

def _torch_python(rctx):
    """The Python interpreter (sys.executable) that imports this torch; '' with LIBTORCH_HOME."""
    if rctx.os.environ.get("LIBTORCH_HOME", ""):
        return ""
    python = rctx.os.environ.get("PYTHON_BIN_PATH", "") or rctx.which("python3")
    result = rctx.execute([python, "-c", "import sys; print(sys.executable)"])
    return result.stdout.strip() if result.return_code == 0 else ""

def _read_version(rctx, torch):
    """'2.11.0' from the headers (present in every LibTorch since 2.x)."""
    header = rctx.path(torch + "/include/torch/headeronly/version.h")
    if not header.exists:
        header = rctx.path(torch + "/include/torch/csrc/api/include/torch/version.h")
    parts = {}
    for line in rctx.read(header).splitlines():
        fields = [f for f in line.replace("\t", " ").split(" ") if f]
        if len(fields) == 3 and fields[0] == "#define" and fields[1] in (
            "TORCH_VERSION_MAJOR",
            "TORCH_VERSION_MINOR",
            "TORCH_VERSION_PATCH",
        ):
            parts[fields[1]] = fields[2]
    if len(parts) != 3:
        return "unknown"
    return "%s.%s.%s" % (parts["TORCH_VERSION_MAJOR"], parts["TORCH_VERSION_MINOR"], parts["TORCH_VERSION_PATCH"])

def _cxx11_abi(rctx, torch):
    """1 when libc10.so exports new-ABI (`__cxx11`) std::string symbols, else 0."""
    result = rctx.execute(["sh", "-c", "nm -D --defined-only '%s/lib/libc10.so' | grep -c __cxx11" % torch])
    if result.return_code not in (0, 1):
        fail("cannot read symbols of %s/lib/libc10.so (is binutils installed?): %s" % (torch, result.stderr))
    return "1" if result.stdout.strip() not in ("", "0") else "0"

def _first_existing(rctx, candidates):
    for c in candidates:
        if c and rctx.path(c).exists:
            return str(rctx.path(c).realpath)
    return None

def _impl(rctx):
    torch = _find_libtorch(rctx)
    site = torch + "/.."
    version = _read_version(rctx, torch)
    abi = _cxx11_abi(rctx, torch)
    has_cuda = rctx.path(torch + "/lib/libtorch_cuda.so").exists

    rctx.symlink(torch + "/include", "include")
    rpath_dirs = [torch + "/lib"]

    cuda_include = None
    nccl_include = None
    nvcc = ""
    if has_cuda:
        cuda_home = rctx.os.environ.get("CUDA_HOME", "") or "/usr/local/cuda"
        cuda_include = _first_existing(rctx, [
            site + "/nvidia/cu13/include/cuda_runtime_api.h",
            site + "/nvidia/cuda_runtime/include/cuda_runtime_api.h",
            cuda_home + "/include/cuda_runtime_api.h",
        ])
        nccl_include = _first_existing(rctx, [
            site + "/nvidia/nccl/include/nccl.h",
            cuda_home + "/include/nccl.h",
            "/usr/include/nccl.h",
        ])
        if not cuda_include or not nccl_include:
            fail(("LibTorch at %s is a CUDA build but cuda_runtime_api.h or nccl.h was not found " +
                  "(looked in the nvidia wheels beside it and CUDA_HOME=%s); reinstall the torch wheel " +
                  "(tools/setup.sh), set CUDA_HOME, or build with --config=cpu_only") % (torch, cuda_home))
        cudart = None
        for d in [site + "/nvidia/cu13/lib", site + "/nvidia/cuda_runtime/lib", cuda_home + "/lib64"]:
            p = rctx.path(d)
            if not p.exists:
                continue
            names = sorted([f.basename for f in p.readdir() if f.basename.startswith("libcudart.so")])
            if names:
                cudart = (str(p.realpath), names[0])
                break
        if not cudart:
            fail(("LibTorch at %s is a CUDA build but libcudart.so was not found beside it or in " +
                  "CUDA_HOME=%s; reinstall the torch wheel (tools/setup.sh) or build with --config=cpu_only") %
                 (torch, cuda_home))
        # nvcc for Fabric++'s own kernels (tools/bazel/cuda.bzl); without one they fall back to ATen.
        nvcc = _first_existing(rctx, [
            rctx.os.environ.get("FABRIC_NVCC", ""),
            cuda_home + "/bin/nvcc",
            site + "/nvidia/cu13/bin/nvcc",
            site + "/nvidia/cuda_nvcc/bin/nvcc",
        ]) or ""
        if not nvcc and rctx.which("nvcc"):
            nvcc = str(rctx.which("nvcc"))
        rctx.symlink(cuda_include.rpartition("/")[0], "cuda_include")
        rctx.symlink(nccl_include.rpartition("/")[0], "nccl_include")
        nvidia = rctx.path(site + "/nvidia")
        if nvidia.exists:
            for pkg in sorted([str(p) for p in nvidia.readdir()]):
                if rctx.path(pkg + "/lib").exists:
                    rpath_dirs.append(str(rctx.path(pkg + "/lib").realpath))

    rpaths = ["-Wl,-rpath," + d for d in rpath_dirs]
    common_linkopts = ["-L" + torch + "/lib", "-Wl,--enable-new-dtags"] + rpaths
    cpu_libs = ["-ltorch_cpu", "-lc10"]

    # libtorch_cuda is referenced by no symbol of ours; without --no-as-needed the linker may drop
    # it and CUDA kernels and the NCCL backend are never registered.
    cuda_libs = ["-Wl,--push-state,--no-as-needed", "-ltorch_cuda", "-Wl,--pop-state", "-lc10_cuda"]
    if has_cuda:
        # Header-only CUDA helpers (at::cuda::CUDAEvent, ...) call the runtime directly; this is the
        # same libcudart LibTorch itself loads.
        cuda_libs = cuda_libs + ["-L" + cudart[0], "-l:" + cudart[1]]
    cuda_defines = ["FABRIC_WITH_CUDA", "USE_C10D_NCCL"]

    rctx.file("BUILD.bazel", """\
# Generated by //tools/bazel:libtorch_configure.bzl. Do not edit.
# LibTorch {version} at {torch} (CUDA build: {has_cuda}, _GLIBCXX_USE_CXX11_ABI={abi}).
load("@rules_cc//cc:defs.bzl", "cc_library")

package(default_visibility = ["//visibility:public"])

exports_files(["info.bzl"])

# --config=cpu_only: build against the CPU part of LibTorch only.
config_setting(
    name = "cpu_only",
    define_values = {{"fabric_cuda": "off"}},
)

cc_library(
    name = "cuda_headers",
    hdrs = {cuda_hdrs},
    includes = {cuda_includes},
)

cc_library(
    name = "torch",
    hdrs = glob(["include/**"], exclude = ["include/pybind11/**"]),
    defines = [
        "_GLIBCXX_USE_CXX11_ABI={abi}",
        "USE_DISTRIBUTED",
        "USE_C10D_GLOO",
    ] + select({{
        ":cpu_only": [],
        "//conditions:default": {cuda_defines},
    }}),
    includes = [
        "include",
        "include/torch/csrc/api/include",
    ],
    linkopts = {common_linkopts} + select({{
        ":cpu_only": {cpu_libs},
        "//conditions:default": {cuda_libs} + {cpu_libs},
    }}) + ["-lpthread", "-ldl"],
    deps = select({{
        ":cpu_only": [],
        "//conditions:default": [":cuda_headers"],
    }}),
)
""".format(
        version = version,
        torch = torch,
        has_cuda = has_cuda,
        abi = abi,
        cuda_hdrs = 'glob(["cuda_include/**", "nccl_include/**"])' if has_cuda else "[]",
        cuda_includes = repr(["cuda_include", "nccl_include"] if has_cuda else []),
        cuda_defines = repr(cuda_defines if has_cuda else []),
        common_linkopts = repr(common_linkopts),
        cpu_libs = repr(cpu_libs),
        cuda_libs = repr(cuda_libs if has_cuda else []),
    ))

    rctx.file("info.bzl", """\
# Generated by //tools/bazel:libtorch_configure.bzl.
LIBTORCH_PATH = {torch}
LIBTORCH_VERSION = {version}
LIBTORCH_CUDA = {has_cuda}
LIBTORCH_CXX11_ABI = {abi}
RUNTIME_LIB_DIRS = {dirs}
TORCH_PYTHON = {python}
NVCC = {nvcc}
""".format(nvcc = repr(nvcc), torch = repr(torch), version = repr(version), has_cuda = has_cuda, abi = repr(abi), dirs = repr(rpath_dirs),
           python = repr(_torch_python(rctx))))

libtorch_configure = repository_rule(
    implementation = _impl,
    environ = _ENV_VARS,
    local = True,
    doc = "Finds an installed LibTorch; see the module docstring.",
)
