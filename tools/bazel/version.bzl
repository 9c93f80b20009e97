"""Fabric++'s version: the installed library's file name and soname, FabricPPConfigVersion.cmake,
fabricpp.pc and MODULE.bazel (which cannot load this file; //tests/install:install_tree_test keeps
the two equal)."""

FABRIC_VERSION = "0.1.0"

# The soname's number (libfabricpp.so.0): the major version, raised when the ABI changes.
FABRIC_SOVERSION = FABRIC_VERSION.split(".")[0]
