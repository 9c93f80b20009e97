"""Offline stand-in for @rules_java//java:defs.bzl: re-exports Bazel's native Java rules.

Bazel's own registered JDK toolchains load this file; the project has no Java code.
"""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_plugin = native.java_plugin
java_runtime = native.java_runtime
java_test = native.java_test
java_toolchain = native.java_toolchain
