#!/usr/bin/env bash
# Installs what HSAP needs from Debian 12's packages (root, only apt
# reachable). Does nothing when everything is already there.
set -euo pipefail

PACKAGES=(
  build-essential pkg-config bazel-bootstrap
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libucx-dev ucx-utils libcivetweb-dev
  libgtest-dev libgmock-dev libhwy-dev libopenblas-dev libsystemd-dev
  # Mutual TLS between daemons (server/cluster/peer_tls.cc) and
  # deploy/tls/make_certs.sh.
  libssl-dev openssl
  # tests/integration:peer_tls_test decodes the HTTP/2 headers a daemon
  # sends (HPACK).
  python3-hpack
  prometheus
  python3-torch python3-grpcio python3-numpy python3-protobuf
  # `pip install ./client/python` into a venv (setup.py runs protoc and
  # grpc_python_plugin, from protobuf-compiler and protobuf-compiler-grpc).
  python3-venv python3-pip python3-setuptools python3-wheel
  # The fresh-clone test of command one (scripts/fresh_clone_test.sh).
  git
  # tests/fuzz: clang with libFuzzer and its sanitizer runtimes. (gcc's
  # libasan8, libubsan1 and libtsan2 for --config=asan/tsan come with gcc.)
  clang libclang-rt-14-dev
  # The fibers of the CUDA kernels' CPU emulation (kernels/cuda/emulation.h).
  libboost-context-dev
  # llvm-symbolizer for sanitizer stack traces (.bazelrc).
  llvm
  # bench/scale_sim/plot.py (the scale simulator's figures).
  python3-matplotlib
  # //deploy:kubernetes_manifest_test reads the Kubernetes manifests.
  python3-yaml
  # tests/integration:plan_viewer_test opens the plan viewer's pages in
  # headless chromium.
  chromium
)

missing=()
for p in "${PACKAGES[@]}"; do
  # No pipe into "grep -q": under pipefail its early exit can fail the test.
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$st" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "install_deps: run as root (apt-get install is needed)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
