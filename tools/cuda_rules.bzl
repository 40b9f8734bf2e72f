"""cuda_library: .cu sources compiled by nvcc in a genrule, as a cc_library.

With the toolkit present (@cuda//:defs.bzl CUDA_AVAILABLE), each .cu file is
compiled with nvcc for sm_80 and sm_90 (-fPIC, C++17, -O3), archived with
`ar`, and wrapped in a cc_library (alwayslink) that depends on cudart.
Without the toolkit, the library is built from `fallback_srcs` instead (plain
C++ that reports the absence of CUDA), so dependents still build and CPU
tests still run.
"""

load("@cuda//:defs.bzl", "CUDA_AVAILABLE", "CUDA_PATH")
load("@rules_cc//cc:defs.bzl", "cc_library")

CUDA_ARCHS = ["80", "90"]

def cuda_library(name, srcs, hdrs = [], deps = [], fallback_srcs = [], copts = [], visibility = None):
    if not CUDA_AVAILABLE:
        cc_library(
            name = name,
            srcs = fallback_srcs,
            hdrs = hdrs,
            deps = deps,
            visibility = visibility,
        )
        return
    gencode = " ".join(["-gencode arch=compute_%s,code=sm_%s" % (a, a) for a in CUDA_ARCHS])
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs + ["//common:headers", "//kernels:headers"],
            outs = [obj],
            # A private TMPDIR per action: in Bazel's sandboxes every nvcc runs
            # as pid 2, so concurrent ones would share /tmp/tmpxft_00000002-*.
            cmd = ("tmp=$$(mktemp -d) && TMPDIR=$$tmp %s/bin/nvcc -c -std=c++17 -O3 " +
                   "-Xcompiler -fPIC %s -I. -I$(GENDIR) %s -o $@ $(location %s); " +
                   "status=$$?; rm -rf $$tmp; exit $$status") % (
                CUDA_PATH,
                gencode,
                " ".join(copts),
                src,
            ),
        )
        objs.append(obj)
    native.genrule(
        name = name + "_archive",
        srcs = objs,
        outs = ["lib" + name + "_cuda.a"],
        cmd = "ar rcs $@ $(SRCS)",
    )
    cc_library(
        name = name,
        srcs = ["lib" + name + "_cuda.a"],
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        alwayslink = True,
        visibility = visibility,
    )
