#!/bin/bash
# Stages the GPU checks for a machine without bazel (the lent H200 machines
# have CUDA and PyTorch but no bazel, abseil or gtest):
#
#   tests/gpu/stage_prebuilt.sh [DIR]        # default DIR: .device_prebuilt
#
# builds, here, the test binaries of //tests/gpu, //kernels/cuda and
# //server/gpu (gpu-tagged ones included) and kernel_bench, and copies them
# into DIR/tests and DIR with every shared library they load except glibc's,
# the CUDA driver's and NCCL (DIR/lib; about 18 MB in all). Then, on the GPU machine (list DIR in
# .git/info/exclude here and name it in the run's carry):
#
#   HSAP_PREBUILT=DIR tests/gpu/device_check.sh
set -eu
cd "$(dirname "$0")/../.."
DIR=${1:-.device_prebuilt}
TESTS="//tests/gpu:kernel_test //kernels/cuda:attention_api_test //kernels/cuda:tiling_test
  //kernels/cuda:fragment_layout_test //kernels/cuda:device_info_test
  //kernels/cuda:device_smoke_test //server/gpu:gpu_test //server/gpu:gpu_device_test"
# shellcheck disable=SC2086
bazel build //tests/gpu:kernel_bench $TESTS
rm -rf "$DIR"
mkdir -p "$DIR/lib" "$DIR/tests"
copy_with_libs() {  # binary destination
  cp -L "$1" "$2"
  chmod u+w "$2"
  ldd "$1" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      # glibc and the driver come from the machine; so does NCCL (218 MB,
      # over the 64 MiB a run carries): device_check.sh finds PyTorch's.
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libnccl.so*) ;;
      *) cp -Ln "$lib" "$DIR/lib/" 2>/dev/null || true ;;
    esac
  done
}
copy_with_libs bazel-bin/tests/gpu/kernel_bench "$DIR/kernel_bench"
for t in $TESTS; do
  path=${t#//}
  path=${path/://}
  copy_with_libs "bazel-bin/$path" "$DIR/tests/$(basename "$path")"
done
du -sh "$DIR"
