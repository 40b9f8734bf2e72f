// `hsapctl plan`: compiles a plan offline (no daemon needed) and prints it
// or its statistics.
//
//   hsapctl plan --cu_seqlens_file=docs.txt --ranks=16 --nodes=2
//       --heads=32 --kv_heads=8 --head_dim=128 --strategy=hsap --format=json
// (one command line); --html=plan.html writes the plan's page instead.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/hsapctl/plan_format.h"
#include "client/hsapctl/plan_html.h"
#include "client/hsapctl/subcommands.h"
#include "common/status_macros.h"
#include "server/plan/compiler.h"

ABSL_FLAG(std::string, cu_seqlens_file, "",
          "file of document boundaries [0, l1, l1+l2, ..., T], separated by commas or newlines");
ABSL_FLAG(std::string, cu_seqlens, "", "document boundaries inline, e.g. 0,100,250");
ABSL_FLAG(std::string, lengths_file, "",
          "file of document lengths, one per line (as workloads/*.tokens of the repository); "
          "alternative to --cu_seqlens_file");
ABSL_FLAG(int64_t, total_tokens, -1, "tokens T; default: the last boundary");
ABSL_FLAG(bool, causal, true, "documents attend causally (false: bidirectionally)");
ABSL_FLAG(int64_t, window, -1, "sliding window of causal documents, in keys; -1: none");
ABSL_FLAG(int32_t, ranks, 8, "ranks of the sequence-parallel group (nodes x devices)");
ABSL_FLAG(int32_t, nodes, 1, "nodes; --ranks must be a multiple");
ABSL_FLAG(int32_t, heads, 32, "query heads Hq");
ABSL_FLAG(int32_t, kv_heads, 8, "key/value heads Hkv (Hq % Hkv == 0)");
ABSL_FLAG(int32_t, head_dim, 128, "head dimension D");
ABSL_FLAG(std::string, dtype, "bf16", "fp32, bf16 or fp16");
ABSL_FLAG(std::string, strategy, "auto", "ring, allgather, ulysses, usp, sap, hsap or auto");
ABSL_FLAG(std::string, assignment, "balanced", "contiguous, zigzag or balanced");
ABSL_FLAG(std::string, profile, "h100", "cost model profile: h100, h200, cpu-loopback, or custom:flops=F,inter_bytes_per_s=B,"
          "intra_bytes_per_s=B[,inter_latency_us=L,intra_latency_us=L,backward_factor=X]");
ABSL_FLAG(int64_t, recv_buffer_mb, 256, "receive-buffer budget per stage, MiB");
ABSL_FLAG(std::string, format, "text", "json or text");
ABSL_FLAG(bool, stages, false, "text: also print every rank's forward stages");
ABSL_FLAG(bool, full_plan, false, "json: also include the whole plan (proto JSON)");

namespace hsap::hsapctl {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": cannot open"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<plan::PlanSpec> SpecFromFlags() {
  plan::PlanSpec spec;
  const std::string cu_file = absl::GetFlag(FLAGS_cu_seqlens_file);
  const std::string cu_inline = absl::GetFlag(FLAGS_cu_seqlens);
  const std::string lengths_file = absl::GetFlag(FLAGS_lengths_file);
  const int given = !cu_file.empty() + !cu_inline.empty() + !lengths_file.empty();
  if (given != 1) {
    return absl::InvalidArgumentError(
        "give exactly one of --cu_seqlens_file, --cu_seqlens, --lengths_file");
  }
  if (!lengths_file.empty()) {
    HSAP_ASSIGN_OR_RETURN(std::string text, ReadFile(lengths_file, "lengths_file"));
    HSAP_ASSIGN_OR_RETURN(std::vector<int64_t> lengths, ParseIntList(text, "lengths_file"));
    HSAP_ASSIGN_OR_RETURN(spec.cu_seqlens, LengthsToCuSeqlens(lengths));
  } else if (!cu_file.empty()) {
    HSAP_ASSIGN_OR_RETURN(std::string text, ReadFile(cu_file, "cu_seqlens_file"));
    HSAP_ASSIGN_OR_RETURN(spec.cu_seqlens, ParseIntList(text, "cu_seqlens"));
  } else {
    HSAP_ASSIGN_OR_RETURN(spec.cu_seqlens, ParseIntList(cu_inline, "cu_seqlens"));
  }
  spec.total_tokens = absl::GetFlag(FLAGS_total_tokens) >= 0 ? absl::GetFlag(FLAGS_total_tokens)
                                                              : spec.cu_seqlens.back();
  spec.causal = absl::GetFlag(FLAGS_causal);
  spec.window = absl::GetFlag(FLAGS_window);
  const int32_t ranks = absl::GetFlag(FLAGS_ranks), nodes = absl::GetFlag(FLAGS_nodes);
  if (ranks < 1 || nodes < 1 || ranks % nodes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--ranks (", ranks,
                                                   ") must be a positive multiple of --nodes (",
                                                   nodes, ")"));
  }
  spec.topology = {nodes, ranks / nodes};
  spec.shape.num_heads_q = absl::GetFlag(FLAGS_heads);
  spec.shape.num_heads_kv = absl::GetFlag(FLAGS_kv_heads);
  spec.shape.head_dim = absl::GetFlag(FLAGS_head_dim);
  if (!ParseDType(absl::GetFlag(FLAGS_dtype), &spec.shape.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype=", absl::GetFlag(FLAGS_dtype), " is not fp32, bf16 or fp16"));
  }
  if (!plan::ParseStrategy(absl::GetFlag(FLAGS_strategy), &spec.strategy)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--strategy=", absl::GetFlag(FLAGS_strategy),
        " is not one of ring, allgather, ulysses, usp, sap, hsap, auto"));
  }
  if (!plan::ParseAssignment(absl::GetFlag(FLAGS_assignment), &spec.assignment)) {
    return absl::InvalidArgumentError(absl::StrCat("--assignment=",
                                                   absl::GetFlag(FLAGS_assignment),
                                                   " is not one of contiguous, zigzag, balanced"));
  }
  spec.profile = absl::GetFlag(FLAGS_profile);
  const int64_t mb = absl::GetFlag(FLAGS_recv_buffer_mb);
  if (mb < 1 || mb > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--recv_buffer_mb (", mb, ") must be in [1, 2^30]"));
  }
  spec.recv_buffer_bytes = mb << 20;
  return spec;
}

}  // namespace

int RunPlanCommand(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "hsapctl plan: unexpected argument \"%s\"\n", args[0].c_str());
    return 2;
  }
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "json" && format != "text") {
    std::fprintf(stderr, "hsapctl plan: --format=%s is not json or text\n", format.c_str());
    return 2;
  }
  absl::StatusOr<plan::PlanSpec> spec = SpecFromFlags();
  if (!spec.ok()) {
    std::fprintf(stderr, "hsapctl plan: %s\n", spec.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<plan::Plan> compiled = plan::CompilePlan(*spec);
  if (!compiled.ok()) {
    std::fprintf(stderr, "hsapctl plan: %s\n", compiled.status().ToString().c_str());
    return 1;
  }
  if (!HtmlPath().empty()) {
    return WritePlanHtml(*compiled, {.origin = "hsapctl plan (compiled offline)"}, HtmlPath(),
                         "hsapctl plan");
  }
  const std::string out = format == "json"
                              ? PlanToJson(*compiled, absl::GetFlag(FLAGS_full_plan))
                              : PlanToText(*compiled, absl::GetFlag(FLAGS_stages));
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace hsap::hsapctl
