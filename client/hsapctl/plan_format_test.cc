#include "client/hsapctl/plan_format.h"

#include "gtest/gtest.h"
#include "server/plan/compiler.h"

namespace hsap::hsapctl {
namespace {

TEST(PlanFormatTest, ParsesCommasAndNewlines) {
  auto v = ParseIntList("0,100, 250\n300\n\n", "cu_seqlens");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, (std::vector<int64_t>{0, 100, 250, 300}));
  auto bad = ParseIntList("0,1x,3", "cu_seqlens");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "cu_seqlens[1] \"1x\" is not an integer");
  EXPECT_FALSE(ParseIntList(" \n", "cu_seqlens").ok());
  auto cu = LengthsToCuSeqlens({3, 0, 4});
  ASSERT_TRUE(cu.ok());
  EXPECT_EQ(*cu, (std::vector<int64_t>{0, 3, 3, 7}));
  EXPECT_EQ(LengthsToCuSeqlens({3, -1}).status().message(),
            "document length [1] is -1: must be in [0, 2^40]");
}

TEST(PlanFormatTest, JsonHasTheDocumentedFields) {
  plan::PlanSpec spec;
  spec.cu_seqlens = {0, 10, 64};
  spec.total_tokens = 64;
  spec.topology = {1, 4};
  spec.shape = {4, 2, 16, DType::kBFloat16};
  spec.strategy = plan::Strategy::kSap;
  auto p = plan::CompilePlan(spec);
  ASSERT_TRUE(p.ok());
  const std::string json = PlanToJson(*p, true);
  for (const std::string& field :
       std::vector<std::string>{"\"rank\": 3", "\"tokens\": 16", "\"token_ranges\": [[", "\"recv_bytes\"",
        "\"send_bytes\"", "\"area\"", "\"lower_bound_recv_bytes\"", "\"imbalance\"",
        "\"modeled_time_us\"", "\"compile_us\"", "\"plan_key\": \"" + p->key.ToHex() + "\"",
        "\"strategy\": \"sap\"", "\"plan\": {"}) {
    EXPECT_NE(json.find(field), std::string::npos) << field << "\n" << json.substr(0, 2000);
  }
  const std::string text = PlanToText(*p, true);
  EXPECT_NE(text.find("rank 3 forward:"), std::string::npos);
}

}  // namespace
}  // namespace hsap::hsapctl
