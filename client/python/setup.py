"""Build step of `pip install ./client/python` (metadata: pyproject.toml):
build_py also generates hsap/v1/*_pb2.py and *_pb2_grpc.py into the build
tree from the .proto files, with protoc and grpc_python_plugin (Debian's
protobuf-compiler and protobuf-compiler-grpc), so no generated code is kept
in the repository and no Bazel is needed.

The .proto root is $HSAP_PROTO_DIR, else ./proto beside this file (an
unpacked source tree that carries it), else ../../proto (the repository).
"""

import glob
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def proto_root():
    candidates = [os.environ.get("HSAP_PROTO_DIR"), os.path.join(HERE, "proto"),
                  os.path.join(HERE, "..", "..", "proto")]
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, "hsap", "v1", "attention.proto")):
            return os.path.abspath(c)
    raise SystemExit("hsap: no proto/hsap/v1/*.proto found (looked in $HSAP_PROTO_DIR, "
                     f"{candidates[1]}, {candidates[2]}); install from the repository: "
                     "pip install ./client/python")


def tool(name):
    path = shutil.which(name) or os.path.join("/usr/bin", name)
    if not os.access(path, os.X_OK):
        package = "protobuf-compiler" if name == "protoc" else "protobuf-compiler-grpc"
        raise SystemExit(f"hsap: {name} not found; install Debian's {package} "
                         "(scripts/install_deps.sh)")
    return path


class BuildPyWithProtos(build_py):
    """build_py, then protoc --python_out / --grpc_python_out into build_lib."""

    def run(self):
        super().run()
        root = proto_root()
        protos = sorted(glob.glob(os.path.join(root, "hsap", "v1", "*.proto")))
        os.makedirs(self.build_lib, exist_ok=True)
        subprocess.check_call([
            tool("protoc"), f"-I{root}", f"--python_out={self.build_lib}",
            f"--grpc_python_out={self.build_lib}",
            f"--plugin=protoc-gen-grpc_python={tool('grpc_python_plugin')}", *protos])
        init = os.path.join(self.build_lib, "hsap", "v1", "__init__.py")
        with open(init, "w") as f:
            f.write('"""Generated at install time from proto/hsap/v1 (setup.py)."""\n')


setup(cmdclass={"build_py": BuildPyWithProtos})
