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

def _proto_path(src):
    # "//proto:hsap/v1/x.proto" -> "hsap/v1/x.proto":
    # the path below the proto root, which is where protoc puts the output.
    return src.split(":")[-1]

def hsap_py_proto(name, srcs, packages = [], visibility = None):
    """Python message modules and gRPC stubs for `srcs`, generated at build time.

    Runs /usr/bin/protoc --python_out and /usr/bin/grpc_python_plugin from the
    proto root, so `//proto:hsap/v1/x.proto` yields `hsap/v1/x_pb2.py` and
    `hsap/v1/x_pb2_grpc.py` under the calling package (import them as
    `from hsap.v1 import x_pb2` with that package's directory on sys.path),
    and an empty `__init__.py` in each folder of `packages` (e.g. "hsap/v1";
    leave out folders that have a source __init__.py). `srcs` must list
    every .proto the modules import (protoc reads them from the proto root;
    each one also gets its modules here). Needs Debian's python3-protobuf
    (4.21, the runtime of protoc 3.21) and python3-grpcio at run time.
    """
    paths = [_proto_path(s) for s in srcs]
    outs = []
    for p in paths:
        base = _strip(p)
        outs += [base + "_pb2.py", base + "_pb2_grpc.py"]
    inits = [d + "/__init__.py" for d in packages]
    cmd = ("/usr/bin/protoc -I$$(dirname $(location //proto:root_marker)) --python_out=$(RULEDIR)" +
           " --grpc_python_out=$(RULEDIR) --plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin " +
           " ".join(["$(location %s)" % s for s in srcs]))
    for i in inits:
        cmd += " && touch $(RULEDIR)/" + i
    native.genrule(
        name = name,
        srcs = srcs + ["//proto:root_marker"],
        outs = outs + inits,
        cmd = cmd,
        visibility = visibility,
    )
