#!/usr/bin/env bash
# Regenerates the wire-format seeds of tests/fuzz/corpus/ from the text
# protos below (protoc --encode), each prefixed with the fuzzer's mode byte.
# The FuzzedDataProvider targets' seeds are plain bytes, kept as committed.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=tests/fuzz/corpus
seed() {  # seed <target> <name> <mode byte (octal)> <message type> <text proto>
  mkdir -p "$C/$1"
  { printf "\\$3"; printf '%s' "$5" | protoc -Iproto --encode="$4" proto/hsap/v1/*.proto; } > "$C/$1/$2"
}
T='shape: [24, 4, 64]'
F="call { group: \"train\" group_size: 1 call_seq: 1 }
  mask { cu_seqlens { inline_values { values: [0, 10, 24] } } causal: true }
  q { region_id: 1 offset: 0 $T dtype: DTYPE_FLOAT32 }
  k { region_id: 1 offset: 1048576 shape: [24, 2, 64] dtype: DTYPE_FLOAT32 }
  v { region_id: 1 offset: 2097152 shape: [24, 2, 64] dtype: DTYPE_FLOAT32 }
  o { region_id: 1 offset: 3145728 $T dtype: DTYPE_FLOAT32 }
  lse { region_id: 1 offset: 4194304 shape: [4, 24] dtype: DTYPE_FLOAT32 }"
seed attention_validation_fuzzer forward_cu_seqlens 000 hsap.v1.AttentionForwardRequest "$F"
SLICES='slices { total_tokens: 24 slices { q_begin: 0 q_end: 24 k_begin: 0 k_end: 24 type: MASK_TYPE_CAUSAL window: 3 } }'
CU_INLINE='cu_seqlens { inline_values { values: [0, 10, 24] } }'
CU_TENSOR='cu_seqlens { tensor { region_id: 3 shape: [4] dtype: DTYPE_INT64 } }'
seed attention_validation_fuzzer forward_slices 000 hsap.v1.AttentionForwardRequest "${F/"$CU_INLINE"/$SLICES}"
seed attention_validation_fuzzer forward_cu_tensor 000 hsap.v1.AttentionForwardRequest "${F/"$CU_INLINE"/$CU_TENSOR}"
# Regression: window_left past 2^48 on a cu_seqlens mask (issue 7 finding).
seed attention_validation_fuzzer regression_window_left_int64_max 000 hsap.v1.AttentionForwardRequest \
  "${F/causal: true/causal: true window_left: 9223372036854775807}"
seed attention_validation_fuzzer backward 001 hsap.v1.AttentionBackwardRequest "$F
  d_o { region_id: 1 offset: 5242880 $T dtype: DTYPE_FLOAT32 }
  dq { region_id: 1 offset: 6291456 $T dtype: DTYPE_FLOAT32 }
  dk { region_id: 1 offset: 7340032 shape: [24, 2, 64] dtype: DTYPE_FLOAT32 }
  dv { region_id: 1 offset: 8388608 shape: [24, 2, 64] dtype: DTYPE_FLOAT32 }"

S='topology { num_nodes: 2 devices_per_node: 2 } shape { num_heads_q: 4 num_heads_kv: 2 head_dim: 64 dtype: DTYPE_BFLOAT16 }'
seed plan_spec_fuzzer documents 000 hsap.v1.PlanSpec "cu_seqlens: [0, 100, 350, 1000] causal: true window: -1 total_tokens: 1000 $S"
seed plan_spec_fuzzer window_ring 000 hsap.v1.PlanSpec "cu_seqlens: [0, 7, 40] causal: true window: 5 total_tokens: 40 strategy: STRATEGY_RING $S"
seed plan_spec_fuzzer slices_hsap 000 hsap.v1.PlanSpec "slices { q_begin: 0 q_end: 64 k_begin: 0 k_end: 64 type: MASK_TYPE_CAUSAL } slices { q_begin: 64 q_end: 96 k_begin: 0 k_end: 96 } total_tokens: 96 strategy: STRATEGY_HSAP assignment: ASSIGNMENT_ZIGZAG profile: \"cpu-loopback\" $S"
# Regression: one 2^40-token document (area 2^80) passed ValidatePlanSpec.
seed plan_spec_fuzzer huge_document 000 hsap.v1.PlanSpec "cu_seqlens: [0, 1099511627776] causal: false window: -1 total_tokens: 1099511627776 $S"

seed peer_protocol_fuzzer join 000 hsap.v1.JoinRequest 'node_rank: 1 devices_per_node: 1 incarnation: 7'
seed peer_protocol_fuzzer heartbeat 001 hsap.v1.HeartbeatRequest 'node_rank: 1 incarnation: 7'
seed peer_protocol_fuzzer agree 002 hsap.v1.AgreePlanRequest 'node_rank: 1 group: "g" call_seq: 1 plan_key: "k"'
seed peer_protocol_fuzzer abort 003 hsap.v1.AbortCallRequest 'node_rank: 1 group: "g" call_seq: 1'
S1='topology { num_nodes: 2 devices_per_node: 2 } shape { num_heads_q: 1 num_heads_kv: 1 head_dim: 64 dtype: DTYPE_BFLOAT16 }'
seed plan_spec_fuzzer document_2to31 000 hsap.v1.PlanSpec "cu_seqlens: [0, 1, 2147483648] causal: false window: -1 total_tokens: 2147483648 $S1"
seed plan_spec_fuzzer window_2to31 000 hsap.v1.PlanSpec "cu_seqlens: [0, 2147483647, 2147483648] causal: true window: 2147483648 total_tokens: 2147483648 strategy: STRATEGY_AUTO $S1"

# Raw-bytes modes of the trust targets (first byte 3): "r" and "p" name the
# live group of the input.
seed group_join_fuzzer raw_join_group 003 hsap.v1.JoinGroupRequest 'group: "r" nodes: ["127.0.0.1:7", "127.0.0.1:9"] node_index: 1 address: "127.0.0.1:9" incarnation: 1 version: "fuzz" nonce: "0123456789abcdef"'
seed group_join_fuzzer raw_confirm_member 003 hsap.v1.ConfirmMemberRequest 'group: "j1" root: "127.0.0.1:9" root_incarnation: 1 nonce: "0123456789abcdef"'
seed group_profile_fuzzer raw_group_profile 003 hsap.v1.GroupProfileRequest 'group: "p" declared: true dtype: DTYPE_BFLOAT16 head_dim: 128 address: "127.0.0.1:9" incarnation: 1'
seed link_probe_fuzzer raw_probe_link 003 hsap.v1.ProbeLinkRequest 'payload: "probe"'
