// The subcommands that ask a running hsapd (connection.h says how):
//
//   hsapctl plans list [--limit=N]     cached plans, most recently used first
//   hsapctl plans show <plan_key>      one plan (--format=json: the whole plan;
//                                      --html=FILE: its page, plan_html.h)
//   hsapctl plans stats                plan cache counters
//   hsapctl plans evict <key>... | --all
//   hsapctl cluster                    peers (address, incarnation, state, refs),
//                                      heartbeats, links, devices, the cost
//                                      profile, groups (uid, state, members,
//                                      ranks per node, calls)
//   hsapctl regions                    registered regions (all sessions over
//                                      --target with the token; over the Unix
//                                      socket only hsapctl's own session)
//
// Every one prints --format=table (default) or json (proto JSON of the
// response, field names as in proto/hsap/v1).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/cpp/hsap_client.h"
#include "client/hsapctl/connection.h"
#include "client/hsapctl/plan_html.h"
#include "client/hsapctl/subcommands.h"
#include "hsap/v1/cluster.grpc.pb.h"
#include "hsap/v1/plans.grpc.pb.h"
#include "hsap/v1/regions.grpc.pb.h"
#include "server/plan/plan_proto.h"

ABSL_FLAG(bool, all, false, "plans evict: evict every cached plan");
ABSL_FLAG(int32_t, limit, 0, "plans list: at most this many plans, most recently used first; 0 = all");

namespace hsap::hsapctl {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// "STRATEGY_HSAP" -> "hsap".
std::string EnumWord(const std::string& name, absl::string_view prefix) {
  absl::string_view rest = name;
  absl::ConsumePrefix(&rest, prefix);
  return absl::AsciiStrToLower(rest);
}

std::string Bytes(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return absl::StrFormat("%.1f GiB", bytes / double(1ull << 30));
  if (bytes >= (1ull << 20)) return absl::StrFormat("%.1f MiB", bytes / double(1ull << 20));
  if (bytes >= (1ull << 10)) return absl::StrFormat("%.1f KiB", bytes / double(1ull << 10));
  return absl::StrCat(bytes, " B");
}

// Prints rows under a header, each column as wide as its widest cell.
void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  auto print = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&line, row[c]);
      if (c + 1 < row.size()) line.append(width[c] - row[c].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  };
  print(header);
  for (const auto& row : rows) print(row);
}

std::vector<std::string> SummaryRow(const hsap::v1::PlanSummary& p) {
  return {p.plan_key(),
          EnumWord(hsap::v1::Strategy_Name(p.strategy()), "STRATEGY_"),
          EnumWord(hsap::v1::AssignmentPolicy_Name(p.assignment()), "ASSIGNMENT_"),
          absl::StrCat(p.ranks()),
          absl::StrCat(p.total_tokens()),
          absl::StrCat(p.documents()),
          Bytes(p.size_bytes()),
          absl::StrCat(p.hits()),
          absl::StrFormat("%.2f", p.compile_seconds() * 1e3),
          absl::StrFormat("%.1f", p.idle_seconds()),
          absl::StrFormat("%.1f", p.modeled_us())};
}
const std::vector<std::string> kSummaryHeader = {
    "PLAN_KEY", "STRATEGY", "ASSIGNMENT", "RANKS", "TOKENS", "DOCS",
    "SIZE",     "HITS",     "COMPILE_MS", "IDLE_S", "MODELED_US"};

int PlansList(const Connection& c, bool json) {
  auto stub = hsap::v1::Plans::NewStub(c.channel);
  grpc::ClientContext context;
  SetDeadline(&context);
  hsap::v1::ListPlansRequest request;
  request.set_limit(absl::GetFlag(FLAGS_limit));
  hsap::v1::ListPlansResponse response;
  absl::Status st = FromGrpc(stub->ListPlans(&context, request, &response));
  if (!st.ok()) return Fail("plans list via " + c.description, st);
  if (json) {
    std::printf("%s", ToJson(response).c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& p : response.plans()) rows.push_back(SummaryRow(p));
  PrintTable(kSummaryHeader, rows);
  return 0;
}

int PlansShow(const Connection& c, bool json, const std::vector<std::string>& args) {
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: hsapctl plans show <plan_key>\n");
    return 2;
  }
  auto stub = hsap::v1::Plans::NewStub(c.channel);
  grpc::ClientContext context;
  SetDeadline(&context);
  hsap::v1::ShowPlanRequest request;
  request.set_plan_key(args[1]);
  hsap::v1::ShowPlanResponse response;
  absl::Status st = FromGrpc(stub->ShowPlan(&context, request, &response));
  if (!st.ok()) return Fail("plans show " + args[1] + " via " + c.description, st);
  if (!HtmlPath().empty()) {
    absl::StatusOr<plan::Plan> plan = plan::PlanFromProto(response.plan());
    if (!plan.ok()) return Fail("plans show " + args[1] + ": the daemon's plan", plan.status());
    return WritePlanHtml(*plan,
                         {.origin = "hsapd plan cache via " + c.description,
                          .cache_hits = static_cast<int64_t>(response.summary().hits())},
                         HtmlPath(), "hsapctl plans show");
  }
  if (json) {
    std::printf("%s", ToJson(response).c_str());
    return 0;
  }
  PrintTable(kSummaryHeader, {SummaryRow(response.summary())});
  const auto& plan = response.plan();
  std::printf("\n%d ranks; per rank: forward stages, backward stages, forward work items\n",
              plan.ranks_size());
  for (int r = 0; r < plan.ranks_size(); ++r) {
    const auto& rank = plan.ranks(r);
    int items = 0;
    for (const auto& stage : rank.forward()) items += stage.items_size() + stage.overlap_items_size();
    std::printf("  rank %d: %d, %d, %d\n", r, rank.forward_size(), rank.backward_size(), items);
  }
  std::printf("(--format=json prints the whole plan)\n");
  return 0;
}

int PlansStats(const Connection& c, bool json) {
  auto stub = hsap::v1::Plans::NewStub(c.channel);
  grpc::ClientContext context;
  SetDeadline(&context);
  hsap::v1::GetPlanCacheStatsResponse response;
  absl::Status st = FromGrpc(stub->GetPlanCacheStats(&context, {}, &response));
  if (!st.ok()) return Fail("plans stats via " + c.description, st);
  if (json) {
    std::printf("%s", ToJson(response).c_str());
    return 0;
  }
  const auto& s = response.stats();
  const uint64_t lookups = s.hits() + s.misses();
  PrintTable({"HITS", "MISSES", "HIT_RATIO", "EVICTIONS", "ENTRIES", "SIZE", "CAPACITY",
              "COMPILE_S_TOTAL", "COMPILE_S_MAX"},
             {{absl::StrCat(s.hits()), absl::StrCat(s.misses()),
               lookups > 0 ? absl::StrFormat("%.3f", double(s.hits()) / lookups) : "-",
               absl::StrCat(s.evictions()), absl::StrCat(s.entries()), Bytes(s.size_bytes()),
               Bytes(s.capacity_bytes()), absl::StrFormat("%.3f", s.compile_seconds_total()),
               absl::StrFormat("%.3f", s.compile_seconds_max())}});
  return 0;
}

int PlansEvict(const Connection& c, bool json, const std::vector<std::string>& args) {
  hsap::v1::EvictPlansRequest request;
  const bool all = absl::GetFlag(FLAGS_all);
  if (all == (args.size() > 1)) {
    std::fprintf(stderr, "usage: hsapctl plans evict <plan_key>... | --all\n");
    return 2;
  }
  request.set_all(all);
  for (size_t i = 1; i < args.size(); ++i) request.add_plan_keys(args[i]);
  auto stub = hsap::v1::Plans::NewStub(c.channel);
  grpc::ClientContext context;
  SetDeadline(&context);
  hsap::v1::EvictPlansResponse response;
  absl::Status st = FromGrpc(stub->EvictPlans(&context, request, &response));
  if (!st.ok()) return Fail("plans evict via " + c.description, st);
  if (json) {
    std::printf("%s", ToJson(response).c_str());
  } else {
    std::printf("evicted %u plan(s)\n", response.evicted());
  }
  return 0;
}

}  // namespace

int RunPlansCommand(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fprintf(stderr, "usage: hsapctl plans list|show <key>|stats|evict <key>...|evict --all\n");
    return 2;
  }
  absl::StatusOr<bool> json = JsonFormatFromFlags();
  if (!json.ok()) return Fail("plans", json.status()) + 1;
  absl::StatusOr<Connection> c = ConnectFromFlags();
  if (!c.ok()) return Fail("plans", c.status());
  const std::string& verb = args[0];
  if (verb == "list" && args.size() == 1) return PlansList(*c, *json);
  if (verb == "show") return PlansShow(*c, *json, args);
  if (verb == "stats" && args.size() == 1) return PlansStats(*c, *json);
  if (verb == "evict") return PlansEvict(*c, *json, args);
  std::fprintf(stderr, "hsapctl plans: unknown or malformed \"%s\"; "
                       "use list, show <key>, stats, evict <key>... or evict --all\n",
               absl::StrJoin(args, " ").c_str());
  return 2;
}

int RunClusterCommand(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "usage: hsapctl cluster [--format=table|json]\n");
    return 2;
  }
  absl::StatusOr<bool> json = JsonFormatFromFlags();
  if (!json.ok()) return Fail("cluster", json.status()) + 1;
  absl::StatusOr<Connection> c = ConnectFromFlags();
  if (!c.ok()) return Fail("cluster", c.status());
  auto stub = hsap::v1::Cluster::NewStub(c->channel);
  grpc::ClientContext context;
  SetDeadline(&context);
  hsap::v1::GetClusterStatusResponse response;
  absl::Status st = FromGrpc(stub->GetClusterStatus(&context, {}, &response));
  if (!st.ok()) return Fail("cluster via " + c->description, st);
  if (*json) {
    std::printf("%s", ToJson(response).c_str());
    return 0;
  }
  std::printf("node %d of %d answered: %s, epoch %llu, %u call(s) in flight, %u session(s)\n\n",
              response.self_node_rank(), response.nodes_size(),
              response.formed() ? "formed" : "NOT FORMED",
              static_cast<unsigned long long>(response.epoch()), response.active_calls(),
              response.sessions());
  std::vector<std::vector<std::string>> rows;
  for (const auto& n : response.nodes()) {
    std::vector<std::string> devices;
    for (const auto& d : n.devices()) {
      devices.push_back(absl::StrFormat("%s(%u active, %.1fs busy)", d.name(), d.active_calls(),
                                        d.busy_seconds_total()));
    }
    const std::string link =
        n.link_bytes_per_s() > 0
            ? absl::StrFormat("%.3g B/s %.0fus", n.link_bytes_per_s(), n.link_latency_us())
            : "-";
    const bool self = n.node_rank() == response.self_node_rank();
    rows.push_back({absl::StrCat(n.node_rank()), n.address(),
                    n.incarnation() == 0 ? "-" : absl::StrCat(n.incarnation()),
                    EnumWord(hsap::v1::NodeState_Name(n.state()), "NODE_STATE_"),
                    self ? "self" : n.pinned() ? "pinned" : absl::StrCat(n.references()),
                    absl::StrFormat("%.2f", n.heartbeat_age_seconds()), n.version(), link,
                    absl::StrJoin(devices, " ")});
  }
  // This daemon and its peers: the static --peers (pinned) and the members
  // of its live groups (REFS: the groups and calls that hold the peer).
  PrintTable({"NODE", "ADDRESS", "INCARNATION", "STATE", "REFS", "HEARTBEAT_AGE_S", "VERSION",
              "LINK", "DEVICES"},
             rows);
  // The cost profile: the setting, and what this daemon measured so far.
  std::printf("\ncost profile: %s\n", response.profile().c_str());
  if (response.intra_bytes_per_s() > 0) {
    std::printf("  intra-node: %.3g B/s, %.3g us\n", response.intra_bytes_per_s(),
                response.intra_latency_us());
  }
  for (const auto& m : response.measured_compute()) {
    std::printf("  %s d%d: %.3g FLOP/s forward, backward %.3gx, interleaved KV heads %.3gx "
                "per doubling\n",
                EnumWord(hsap::v1::DType_Name(m.dtype()), "DTYPE_").c_str(), m.head_dim(),
                m.forward_flops(), m.backward_factor(), m.kv_interleave_factor());
  }
  for (const std::string& p : response.static_profiles()) {
    std::printf("  static cluster: %s\n", p.c_str());
  }
  if (response.groups_size() > 0) {
    std::vector<std::vector<std::string>> groups;
    for (const auto& g : response.groups()) {
      groups.push_back({g.name(), absl::StrCat(g.uid()), g.state(), absl::StrJoin(g.nodes(), ","),
                        g.ranks_per_node() > 0 ? absl::StrCat(g.ranks_per_node()) : "-",
                        absl::StrCat(g.calls()),
                        g.profiles().empty() ? "-" : absl::StrJoin(g.profiles(), "; ")});
    }
    std::printf("\n");
    PrintTable({"GROUP", "UID", "STATE", "MEMBERS", "RANKS_PER_NODE", "CALLS", "PROFILES"}, groups);
  }
  return 0;
}

int RunRegionsCommand(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "usage: hsapctl regions [--format=table|json]\n");
    return 2;
  }
  absl::StatusOr<bool> json = JsonFormatFromFlags();
  if (!json.ok()) return Fail("regions", json.status()) + 1;
  absl::StatusOr<Connection> c = ConnectFromFlags();
  if (!c.ok()) return Fail("regions", c.status());
  hsap::v1::ListRegionsResponse response;
  if (c->over_tcp) {
    auto stub = hsap::v1::Regions::NewStub(c->channel);
    grpc::ClientContext context;
    SetDeadline(&context);
    absl::Status st = FromGrpc(stub->ListRegions(&context, {}, &response));
    if (!st.ok()) return Fail("regions via " + c->description, st);
  } else {
    // Regions are per session: over the Unix socket hsapctl opens its own
    // and so sees only that session's (none). The operator view is TCP.
    absl::StatusOr<std::unique_ptr<client::Client>> session =
        client::Client::Connect(c->socket_path);
    if (!session.ok()) return Fail("regions via " + c->description, session.status());
    absl::StatusOr<hsap::v1::ListRegionsResponse> r = (*session)->ListRegions();
    if (!r.ok()) return Fail("regions via " + c->description, r.status());
    response = std::move(r).value();
    std::fprintf(stderr,
                 "hsapctl: over the Unix socket a session sees only its own regions; for every "
                 "session's, use --target=host:port --token_file=...\n");
  }
  if (*json) {
    std::printf("%s", ToJson(response).c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : response.regions()) {
    rows.push_back({absl::StrCat(r.region_id()), r.name(),
                    EnumWord(hsap::v1::RegionKind_Name(r.kind()), "REGION_KIND_"),
                    Bytes(r.size_bytes()), absl::StrCat(r.session_id()),
                    absl::StrCat(r.pin_count()), absl::StrCat(r.device())});
  }
  PrintTable({"REGION", "NAME", "KIND", "SIZE", "SESSION", "PINS", "DEVICE"}, rows);
  std::printf("\n%d region(s), %s, %u session(s)\n", response.regions_size(),
              Bytes(response.total_bytes()).c_str(), response.sessions());
  return 0;
}

}  // namespace hsap::hsapctl
