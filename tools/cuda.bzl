"""The CUDA toolkit as a local repository, or an empty stand-in without it.

With the toolkit at `path` (nvcc, cudart, NCCL), the repository is
`new_local_repository`-like: it symlinks the toolkit and exposes
`:cuda_headers`, `:cudart`, `:nccl` and `:nvcc`. `@cuda//:defs.bzl` exports
CUDA_AVAILABLE so BUILD files can add GPU targets only when they can build.
"""

_BUILD_WITH_CUDA = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["toolkit/include/**/*.h", "toolkit/include/**/*.hpp", "toolkit/include/nv/**",
                 "toolkit/include/cuda/**"], allow_empty = True),
    includes = ["toolkit/include"],
)

cc_library(
    name = "cudart",
    deps = [":cuda_headers"],
    linkopts = ["-L{path}/lib64", "-lcudart", "-Wl,-rpath,{path}/lib64"],
)

cc_library(
    name = "nccl",
    deps = [":cuda_headers"],
    linkopts = ["-L{path}/lib64", "-lnccl", "-Wl,-rpath,{path}/lib64"],
)

filegroup(name = "nvcc", srcs = ["toolkit/bin/nvcc"])
"""

def _impl(ctx):
    path = ctx.attr.path
    nvcc = ctx.path(path + "/bin/nvcc")
    available = nvcc.exists and ctx.os.environ.get("HSAP_DISABLE_CUDA", "") != "1"
    if available:
        ctx.symlink(path, "toolkit")
        ctx.file("BUILD", _BUILD_WITH_CUDA.format(path = path))
    else:
        ctx.file("BUILD", 'package(default_visibility = ["//visibility:public"])\n')
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("defs.bzl", "CUDA_AVAILABLE = %s\nCUDA_PATH = %r\n" % (available, path))

local_cuda = repository_rule(
    implementation = _impl,
    attrs = {"path": attr.string(default = "/usr/local/cuda")},
    local = True,
    environ = ["HSAP_DISABLE_CUDA"],
)
