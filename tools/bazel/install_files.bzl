"""Rules behind `bazel run //tools:install` (tools/packaging/install.sh).

project_headers: this workspace's headers among everything a cc target compiles with, and a manifest
    listing them (one workspace-relative path per line). The installer copies only those that the
    public umbrella header reaches, so internal headers stay out of the install tree.
install_facts: a shell-sourceable file with what the installed CMake and pkg-config files must
    repeat about this build (version, LibTorch path and version, CUDA or cpu_only, C++ ABI).
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@libtorch//:info.bzl", "LIBTORCH_CXX11_ABI", "LIBTORCH_PATH", "LIBTORCH_VERSION", "RUNTIME_LIB_DIRS")
load("//tools/bazel:version.bzl", "FABRIC_SOVERSION", "FABRIC_VERSION")

def _project_headers_impl(ctx):
    headers = [
        f
        for f in ctx.attr.dep[CcInfo].compilation_context.headers.to_list()
        if f.is_source and f.owner.workspace_name == ctx.label.workspace_name
    ]
    manifest = ctx.actions.declare_file(ctx.label.name + ".txt")
    ctx.actions.write(manifest, "".join([f.short_path + "\n" for f in headers]))
    return [DefaultInfo(files = depset([manifest]), runfiles = ctx.runfiles(files = [manifest] + headers))]

project_headers = rule(
    implementation = _project_headers_impl,
    attrs = {"dep": attr.label(providers = [CcInfo], mandatory = True)},
)

def _install_facts_impl(ctx):
    out = ctx.actions.declare_file(ctx.label.name + ".sh")
    with_cuda = ctx.attr.with_cuda
    defines = ["_GLIBCXX_USE_CXX11_ABI=" + str(LIBTORCH_CXX11_ABI), "USE_DISTRIBUTED", "USE_C10D_GLOO"]
    if with_cuda:
        defines += ["FABRIC_WITH_CUDA", "USE_C10D_NCCL"]
    facts = {
        "FABRIC_VERSION": FABRIC_VERSION,
        "FABRIC_SOVERSION": FABRIC_SOVERSION,
        "LIBTORCH_PATH": LIBTORCH_PATH,
        "LIBTORCH_VERSION": LIBTORCH_VERSION,
        "WITH_CUDA": "1" if with_cuda else "0",
        "DEFINES": " ".join(defines),
        "RUNTIME_LIB_DIRS": ":".join(RUNTIME_LIB_DIRS),
    }
    ctx.actions.write(out, "".join(["%s='%s'\n" % (k, v) for k, v in facts.items()]))
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

install_facts = rule(
    implementation = _install_facts_impl,
    attrs = {"with_cuda": attr.bool(mandatory = True)},
)

def _whole_shared_library_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    feature_configuration = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    libraries = []
    flags = []
    for linker_input in ctx.attr.dep[CcInfo].linking_context.linker_inputs.to_list():
        flags.extend(linker_input.user_link_flags)
        for lib in linker_input.libraries:
            archive = lib.pic_static_library or lib.static_library
            if archive == None:
                continue

            # Every object of every archive: nothing in a library is "unreferenced" to its users.
            libraries.append(cc_common.create_library_to_link(
                actions = ctx.actions,
                feature_configuration = feature_configuration,
                cc_toolchain = cc_toolchain,
                pic_static_library = archive,
                alwayslink = True,
            ))
    linking_context = cc_common.create_linking_context(linker_inputs = depset([
        cc_common.create_linker_input(
            owner = ctx.label,
            libraries = depset(libraries),
            user_link_flags = depset(flags),
        ),
    ]))
    output = cc_common.link(
        name = ctx.label.name,
        actions = ctx.actions,
        feature_configuration = feature_configuration,
        cc_toolchain = cc_toolchain,
        linking_contexts = [linking_context],
        user_link_flags = ctx.attr.linkopts,
        output_type = "dynamic_library",
    )
    so = output.library_to_link.resolved_symlink_dynamic_library or output.library_to_link.dynamic_library
    return [DefaultInfo(files = depset([so]), runfiles = ctx.runfiles(files = [so]))]

# whole_shared_library: one shared object holding every object file of a cc target's own archives
# (cc_binary(linkshared) keeps only the referenced ones, i.e. none). Libraries that the target links
# by flags (LibTorch, the Debian libraries) stay shared dependencies.
whole_shared_library = rule(
    implementation = _whole_shared_library_impl,
    attrs = {
        "dep": attr.label(providers = [CcInfo], mandatory = True),
        "linkopts": attr.string_list(),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)
