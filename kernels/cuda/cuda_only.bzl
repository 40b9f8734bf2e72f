"""Targets that exist only when the CUDA toolkit does (@cuda//:defs.bzl).

For code that needs the toolkit's headers or cudart directly (tests/gpu, the
CPU emulation of the kernels): without the toolkit there is nothing to
build, and `HSAP_DISABLE_CUDA=1 bazel build //...` skips these targets.
"""

load("@cuda//:defs.bzl", "CUDA_AVAILABLE")
load("@rules_cc//cc:defs.bzl", "cc_binary", "cc_library", "cc_test")

def cuda_only_cc_library(**kwargs):
    if CUDA_AVAILABLE:
        cc_library(**kwargs)

def cuda_only_cc_test(**kwargs):
    if CUDA_AVAILABLE:
        cc_test(**kwargs)

def cuda_only_cc_binary(**kwargs):
    if CUDA_AVAILABLE:
        cc_binary(**kwargs)
