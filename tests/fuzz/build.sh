#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang, outside Bazel.
#
# Why not Bazel: Bazel 4's auto-configured C++ toolchain is fixed by CC when
# the @local_config_cc repository is fetched; a --config=fuzz with
# --action_env=CC=clang re-runs that repository rule on every switch and
# rebuilds everything for whoever builds next in the shared tree. Clang is
# only needed here, so this script compiles the project sources it needs
# with clang++ -fsanitize=fuzzer-no-link,address,undefined against the same
# system libraries (pkg-config) and links each target with -fsanitize=fuzzer.
#
# Usage: tests/fuzz/build.sh [target...]   (default: every target)
# Output: $HSAP_FUZZ_OUT (default /tmp/hsap-fuzz)/bin/<target>.
# Objects are rebuilt only when their source or a project header changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${HSAP_FUZZ_OUT:-/tmp/hsap-fuzz}
CXX=${CXX_FUZZ:-clang++}
JOBS=${JOBS:-2}
mkdir -p "$OUT/gen" "$OUT/obj" "$OUT/bin"

PKGS="protobuf grpc++ absl_status absl_statusor absl_strings absl_str_format absl_synchronization
      absl_time absl_hash absl_flat_hash_map absl_flat_hash_set absl_span absl_optional
      absl_random_random absl_cleanup absl_inlined_vector absl_node_hash_map ucx openssl"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
CXXFLAGS="-std=c++17 -O1 -g -gline-tables-only -fsanitize=fuzzer-no-link $SAN \
  -I$ROOT -I$OUT/gen $(pkg-config --cflags $PKGS) -Wno-unused-command-line-argument"
LIBS="$(pkg-config --libs $PKGS) -lcivetweb -lpthread -ldl"

# 1. Protos (same protoc and plugin as tools/proto.bzl).
stamp="$OUT/gen/.stamp"
if [ ! -f "$stamp" ] || [ -n "$(find proto -name '*.proto' -newer "$stamp")" ]; then
  (cd proto && protoc -I. --cpp_out="$OUT/gen" --grpc_out="$OUT/gen" \
     --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin $(find hsap -name '*.proto'))
  touch "$stamp"
fi

# 2. Sources shared by the targets.
COMMON="common/dtype.cc common/mask.cc common/workload.cc"
PROTO=$(cd "$OUT/gen" && find hsap -name '*.pb.cc' | sed "s|^|$OUT/gen/|")
SHM="server/shm/region.cc server/shm/region_registry.cc server/shm/sigbus_guard.cc"
SESSIONS="$SHM server/shm/session_manager.cc server/shm/session_socket.cc"
PLAN=$(ls server/plan/*.cc | grep -v _test.cc)
CLUSTER="server/cluster/cluster.cc server/cluster/cluster_calls.cc server/cluster/cluster_groups.cc
         server/cluster/cluster_formation.cc server/cluster/cluster_profiles.cc server/cluster/peer_tls.cc server/cluster/link_probe.cc
         server/cluster/peer_table.cc server/cluster/group_table.cc server/cluster/node_address.cc
         server/cluster/peer_service.cc server/cluster/plan_agreement.cc
         server/cluster/peer_validation.cc server/transport/ucx_address.cc
         server/transport/ucx_worker.cc server/transport/ucx_status.cc
         $(ls common/auth_token.cc 2>/dev/null)"  # peer tokens (//common:auth_token)
METRICS=$(ls server/metrics/*.cc | grep -v _test.cc | grep -v hsap_metrics)

declare -A SOURCES=(
  [mask_fuzzer]="$COMMON"
  [attention_validation_fuzzer]="$COMMON $PROTO $SHM $PLAN common/thread_pool.cc server/grpc/attention_validation.cc server/grpc/call_nodes.cc server/cluster/node_address.cc"
  [register_region_fuzzer]="$COMMON $PROTO $SHM"
  [plan_spec_fuzzer]="$COMMON $PROTO $PLAN"
  [plan_compiler_fuzzer]="$COMMON $PROTO $PLAN"
  [peer_protocol_fuzzer]="$COMMON $PROTO $CLUSTER $PLAN common/thread_pool.cc"
  [group_join_fuzzer]="$COMMON $PROTO $CLUSTER $PLAN common/thread_pool.cc"
  [group_profile_fuzzer]="$COMMON $PROTO $CLUSTER $PLAN common/thread_pool.cc"
  [link_probe_fuzzer]="$COMMON $PROTO $CLUSTER $PLAN common/thread_pool.cc"
  [peer_tls_fuzzer]="$COMMON $PROTO $CLUSTER $PLAN common/thread_pool.cc"
  [metrics_http_fuzzer]="$COMMON $METRICS"
  [session_socket_fuzzer]="$COMMON $PROTO $SESSIONS"
)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(mask_fuzzer attention_validation_fuzzer register_region_fuzzer
  plan_spec_fuzzer plan_compiler_fuzzer peer_protocol_fuzzer metrics_http_fuzzer session_socket_fuzzer
  group_join_fuzzer group_profile_fuzzer link_probe_fuzzer peer_tls_fuzzer)

newest_header=$(find common server kernels "$OUT/gen" -name '*.h' -printf '%T@\n' | sort -n | tail -1)
obj_of() { local s=${1#$ROOT/}; s=${s#$OUT/}; echo "$OUT/obj/${s//\//_}.o"; }
compile() {  # source -> object, when stale
  local src=$1 obj; obj=$(obj_of "$src")
  if [ -f "$obj" ] && [ "$obj" -nt "$src" ] &&
     awk -v a="$(stat -c %Y "$obj")" -v b="$newest_header" 'BEGIN{exit !(a >= b)}'; then
    return 0
  fi
  echo "  CXX $src"
  $CXX $CXXFLAGS -c "$src" -o "$obj"
}
export -f compile obj_of
export CXX CXXFLAGS OUT ROOT newest_header

srcs=""
for t in "${TARGETS[@]}"; do srcs="$srcs ${SOURCES[$t]} tests/fuzz/$t.cc"; done
echo "$srcs" | tr ' ' '\n' | grep . | sort -u | xargs -P "$JOBS" -I{} bash -c 'compile {}'

for t in "${TARGETS[@]}"; do
  objs=""
  for s in ${SOURCES[$t]} tests/fuzz/$t.cc; do objs="$objs $(obj_of "$s")"; done
  echo "  LINK $t"
  $CXX -fsanitize=fuzzer $SAN $objs $LIBS -o "$OUT/bin/$t"
done
