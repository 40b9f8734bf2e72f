"""Targets that exist only when the CUDA toolkit does (@cuda//:defs.bzl).

For code that needs the toolkit's headers, cudart or NCCL directly
(server/gpu, the NCCL transport's tests, tests/gpu, the CPU emulation of the
CUDA kernels): without the toolkit there is nothing to build, and these
macros define their target only when CUDA_AVAILABLE, which keeps
`HSAP_DISABLE_CUDA=1 bazel build //...` green. Code that must build either
way (server/transport:nccl, kernels/cuda:attention) chooses its sources in
its own BUILD (tools/cuda_rules.bzl's fallback_srcs).
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
