"""C++ (and Python) code generation for HSAP's .proto files with Debian's protoc.

hsap_cc_proto(name, srcs, deps, grpc) runs /usr/bin/protoc (and
/usr/bin/grpc_cpp_plugin when grpc = True) from the proto root `proto/`, so
`proto/hsap/v1/x.proto` yields `#include "hsap/v1/x.pb.h"`, and wraps the
generated files in a cc_library named `name`.
"""

load("@rules_cc//cc:defs.bzl", "cc_library")

def _strip(src):
    # "hsap/v1/x.proto" -> "hsap/v1/x"
    return src[:-len(".proto")]

def hsap_cc_proto(name, srcs, deps = [], grpc = False, visibility = None):
    outs = []
    for s in srcs:
        base = _strip(s)
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    dep_protos = [d + "_srcs" for d in deps]
    native.filegroup(name = name + "_srcs", srcs = srcs + dep_protos)
    cmd = "/usr/bin/protoc -I$$(dirname $(location //proto:root_marker)) --cpp_out=$(RULEDIR)"
    if grpc:
        cmd += " --grpc_out=$(RULEDIR) --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin"
    cmd += " " + " ".join(["$(location %s)" % s for s in srcs])
    native.genrule(
        name = name + "_gen",
        srcs = srcs + dep_protos + ["//proto:root_marker"],
        outs = outs,
        cmd = cmd,
    )
    cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        includes = ["."],
        deps = deps + ["@sys//:protobuf"] + (["@sys//:grpc"] if grpc else []),
        visibility = visibility,
    )

def hsap_py_proto(name, srcs, deps = [], visibility = None):
    """Python modules (message and gRPC stubs) generated with grpc_tools-free protoc.

    Uses /usr/bin/protoc --python_out and /usr/bin/grpc_python_plugin.
    """
    outs = []
    for s in srcs:
        base = _strip(s)
        outs += [base + "_pb2.py", base + "_pb2_grpc.py"]
    dep_protos = [d + "_srcs" for d in deps]
    native.genrule(
        name = name,
        srcs = srcs + dep_protos + ["//proto:root_marker"],
        outs = outs,
        cmd = ("/usr/bin/protoc -I$$(dirname $(location //proto:root_marker)) --python_out=$(RULEDIR)" +
               " --grpc_python_out=$(RULEDIR) --plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin " +
               " ".join(["$(location %s)" % s for s in srcs])),
        visibility = visibility,
    )
