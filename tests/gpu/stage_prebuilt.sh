#!/bin/bash
# Stages the GPU test binaries for a machine without bazel (the lent H200
# machines have CUDA and PyTorch but no bazel, abseil or gtest):
#
#   tests/gpu/stage_prebuilt.sh [DIR]        # default DIR: .device_prebuilt
#
# builds //tests/gpu:kernel_test and :kernel_bench here, and copies them with
# every shared library they load except glibc's and the CUDA driver's into
# DIR (libraries under DIR/lib). Then, on the GPU machine (DIR carried with
# the working tree; add it to .git/info/exclude first):
#
#   HSAP_PREBUILT=DIR tests/gpu/device_check.sh
set -eu
cd "$(dirname "$0")/../.."
DIR=${1:-.device_prebuilt}
bazel build //tests/gpu:kernel_test //tests/gpu:kernel_bench
rm -rf "$DIR"
mkdir -p "$DIR/lib"
for bin in kernel_test kernel_bench; do
  cp -L "bazel-bin/tests/gpu/$bin" "$DIR/$bin"
  chmod u+w "$DIR/$bin"
  ldd "bazel-bin/tests/gpu/$bin" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*) ;;
      *) cp -Ln "$lib" "$DIR/lib/" ;;
    esac
  done
done
du -sh "$DIR"
