"""Targets that exist only when the CUDA toolkit does (@cuda//:defs.bzl).

server/gpu wraps CUDA and NCCL handles, so without the toolkit it has nothing
to build; these macros define their target only when CUDA_AVAILABLE, which
keeps `HSAP_DISABLE_CUDA=1 bazel build //...` green. Code that must build
either way (server/transport:nccl) chooses its sources in its own BUILD.
"""

load("@cuda//:defs.bzl", "CUDA_AVAILABLE")
load("@rules_cc//cc:defs.bzl", "cc_library", "cc_test")

def cuda_only_cc_library(**kwargs):
    if CUDA_AVAILABLE:
        cc_library(**kwargs)

def cuda_only_cc_test(**kwargs):
    if CUDA_AVAILABLE:
        cc_test(**kwargs)
