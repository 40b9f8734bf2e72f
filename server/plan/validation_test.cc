// Every PlanSpec field is checked; messages name the field and the values.
#include "gtest/gtest.h"
#include "server/plan/compiler.h"

namespace hsap::plan {
namespace {

PlanSpec Good() {
  PlanSpec spec;
  spec.cu_seqlens = {0, 10, 10, 32};
  spec.total_tokens = 32;
  spec.topology = {2, 2};
  spec.shape = {8, 2, 64, DType::kBFloat16};
  spec.strategy = Strategy::kSap;
  return spec;
}

void ExpectError(const PlanSpec& spec, const std::string& text) {
  absl::StatusOr<Plan> plan = CompilePlan(spec);
  ASSERT_FALSE(plan.ok()) << "expected: " << text;
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find(text), std::string::npos)
      << plan.status() << "\nexpected: " << text;
}

TEST(ValidationTest, GoodSpecCompiles) { EXPECT_TRUE(CompilePlan(Good()).ok()); }

TEST(ValidationTest, EveryFieldIsChecked) {
  PlanSpec s = Good();
  s.total_tokens = -1;
  ExpectError(s, "total_tokens (-1)");
  s = Good();
  s.topology.num_nodes = 0;
  ExpectError(s, "topology.num_nodes (0)");
  s = Good();
  s.topology.devices_per_node = -3;
  ExpectError(s, "topology.devices_per_node (-3)");
  s = Good();
  s.topology = {1024, 1024};
  ExpectError(s, "topology has 1048576 ranks");
  s = Good();
  s.shape.num_heads_q = 0;
  ExpectError(s, "shape.num_heads_q (0)");
  s = Good();
  s.shape.num_heads_q = 5;
  ExpectError(s, "shape.num_heads_q (5) is not a multiple of shape.num_heads_kv (2)");
  s = Good();
  s.shape.num_heads_kv = 9;
  ExpectError(s, "shape.num_heads_kv (9)");
  s = Good();
  s.shape.head_dim = 0;
  ExpectError(s, "shape.head_dim (0)");
  s = Good();
  s.shape.dtype = static_cast<DType>(9);
  ExpectError(s, "shape.dtype (9)");
  s = Good();
  s.cu_seqlens = {0, 10, 5, 32};
  ExpectError(s, "cu_seqlens decreases at index 2: 10 then 5");
  s = Good();
  s.cu_seqlens = {1, 32};
  ExpectError(s, "cu_seqlens[0] is 1");
  s = Good();
  s.cu_seqlens = {0, 31};
  ExpectError(s, "cu_seqlens ends at 31 but the tensors hold 32 tokens");
  s = Good();
  s.cu_seqlens.clear();
  ExpectError(s, "neither cu_seqlens nor slices");
  s = Good();
  s.slices = {{0, 4, 0, 4, MaskType::kCausal, 0, -1}};
  ExpectError(s, "both cu_seqlens (4 entries) and slices (1 entries)");
  s = Good();
  s.causal = false;
  s.window = 4;
  ExpectError(s, "window (4) is set but causal is false");
  s = Good();
  s.cu_seqlens.clear();
  s.slices = {{0, 40, 0, 4, MaskType::kFull, 0, -1}};
  ExpectError(s, "slices[0] query range [0, 40) is not within [0, 32)");
  s.slices = {{0, 8, 0, 8, MaskType::kCausal, 0, -1}, {4, 12, 6, 10, MaskType::kFull, 0, -1}};
  ExpectError(s, "slices[1]");
  ExpectError(s, "overlaps slices[0]");
  s.slices = {{0, 8, 0, 8, MaskType::kCausal, 0, -1}, {4, 12, 8, 10, MaskType::kFull, 0, -1}};
  EXPECT_TRUE(CompilePlan(s).ok());
  s = Good();
  s.profile = "tpu";
  ExpectError(s, "profile \"tpu\" is unknown; known: h100, h200, cpu-loopback");
  s = Good();
  s.strategy = static_cast<Strategy>(0);
  ExpectError(s, "strategy (0)");
  s = Good();
  s.assignment = static_cast<AssignmentPolicy>(42);
  ExpectError(s, "assignment (42)");
  s = Good();
  s.recv_buffer_bytes = 100;
  ExpectError(s, "recv_buffer_bytes (100) is smaller than one token's K and V rows (512 bytes)");
}

TEST(ValidationTest, OverflowIsCaughtBeforeArithmetic) {
  PlanSpec s = Good();
  s.total_tokens = int64_t{1} << 40;
  s.cu_seqlens = {0, s.total_tokens};
  s.shape = {4096, 4096, 4096, DType::kFloat32};
  ExpectError(s, "overflows 2^62 bytes");
  s.total_tokens = (int64_t{1} << 40) + 1;
  ExpectError(s, "total_tokens (1099511627777) must be in [0, 2^40]");
}

// Found by tests/fuzz/plan_spec_fuzzer: one 2^40-token document passed
// validation and SliceArea overflowed int64 (2^80 pairs) while compiling.
TEST(ValidationTest, MaskAreaMustFitInt64) {
  PlanSpec s = Good();
  s.total_tokens = int64_t{1} << 40;
  s.cu_seqlens = {0, s.total_tokens};
  s.causal = false;
  s.window = -1;
  ExpectError(s, "mask: the slices up to q[0,1099511627776) k[0,1099511627776) FULL span more "
                 "than 2^62 / num_heads_q (576460752303423488) (query, key) pairs");
  // 2^40 tokens as 2^18 documents of 2^22 with one head: 2^62 pairs exactly
  // (and a receive budget that holds them in 2^11 stages of 2^29 rows).
  s.shape = {1, 1, 64, DType::kBFloat16};
  s.recv_buffer_bytes = int64_t{1} << 37;
  s.cu_seqlens.clear();
  for (int64_t x = 0; x <= s.total_tokens; x += int64_t{1} << 22) s.cu_seqlens.push_back(x);
  EXPECT_TRUE(ValidatePlanSpec(s).ok()) << ValidatePlanSpec(s);
  s.slices = {{0, int64_t{1} << 31, 0, int64_t{1} << 31, MaskType::kFull, 0, -1}};
  s.cu_seqlens.clear();
  s.total_tokens = int64_t{1} << 31;
  EXPECT_TRUE(ValidatePlanSpec(s).ok()) << ValidatePlanSpec(s);
}

// A budget of a few rows would turn a long document into thousands of
// collective steps (found by tests/fuzz/plan_compiler_fuzzer: a 1-row
// budget over 10^8 tokens packed ~10^8 stages until memory ran out).
TEST(ValidationTest, StagesAreBounded) {
  PlanSpec s = Good();  // kv row: 2 x 2 heads x 64 x 2 bytes = 512
  s.cu_seqlens = {0, kMaxStages + 1};
  s.total_tokens = kMaxStages + 1;
  s.recv_buffer_bytes = 512;
  ExpectError(s, "recv_buffer_bytes (512) holds 1 token rows of K and V (512 bytes each): 4097 "
                 "tokens could need 4097 stages, more than 4096; raise recv_buffer_bytes to at "
                 "least 1024");
  s.recv_buffer_bytes = 1024;
  absl::StatusOr<Plan> plan = CompilePlan(s);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_LE(plan->stats.num_fwd_stages, kMaxStages);
  // A ring over more than kMaxStages + 1 ranks takes too many steps
  // whatever the budget.
  s = Good();
  s.topology = {2, 2049};
  s.cu_seqlens = {0, 4098};
  s.total_tokens = 4098;
  s.strategy = Strategy::kRing;
  ExpectError(s, "strategy: a ring over 4098 groups takes 4097 stages, more than 4096");
}

TEST(ValidationTest, DispatchMustMatchTheSpec) {
  PlanSpec s = Good();
  Dispatch d;
  d.total_tokens = 32;
  d.ranges = {{{0, 32}}};
  absl::StatusOr<Plan> p = CompilePlanForDispatch(s, d);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("dispatch has 1 ranks"), std::string::npos);
  d.ranges = {{{0, 8}}, {{8, 16}}, {{16, 24}}, {{24, 31}}};
  p = CompilePlanForDispatch(s, d);
  EXPECT_NE(p.status().message().find("dispatch covers [0, 31) but 32 tokens exist"),
            std::string::npos)
      << p.status();
  d.ranges = {{{24, 32}}, {{0, 8}}, {{8, 16}}, {{16, 24}}};
  EXPECT_TRUE(CompilePlanForDispatch(s, d).ok());
}

}  // namespace
}  // namespace hsap::plan
