#include "server/cluster/link_probe.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/plan/cost_model.h"

namespace hsap::cluster {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

absl::StatusOr<LinkFigures> MeasureLink(const ProbeCall& call, const std::string& peer,
                                        absl::Time deadline) {
  auto once = [&](int64_t bytes) -> absl::StatusOr<double> {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("the link probe of ", peer, " did not finish by the call's deadline"));
    }
    const absl::Time t0 = absl::Now();
    const absl::Status st = call(bytes, deadline);
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    if (!st.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the link probe of ", peer, " failed (", bytes, " bytes): ", st.message()));
    }
    return s;
  };
  std::vector<double> empty;
  for (int i = 0; i < 7; ++i) {
    absl::StatusOr<double> t = once(0);
    if (!t.ok()) return t.status();
    empty.push_back(*t);
  }
  const double rtt = Median(empty);
  constexpr int64_t kFirst = int64_t{64} << 10, kLast = int64_t{3} << 20;  // under gRPC's default 4 MiB message limit
  int64_t size = kFirst;
  while (true) {
    absl::StatusOr<double> t = once(size);
    if (!t.ok()) return t.status();
    if (*t - rtt >= 0.020 || size >= kLast) break;
    size = std::min(size * 4, kLast);
  }
  std::vector<double> full;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<double> t = once(size);
    if (!t.ok()) return t.status();
    full.push_back(*t);
  }
  LinkFigures f;
  f.bytes_per_s =
      std::clamp(plan::RoundToThreeDigits(static_cast<double>(size) / std::max(Median(full) - rtt, 1e-6)), 1.0,
                 1e15);
  f.latency_s = std::clamp(plan::RoundToThreeDigits(rtt / 2), 0.0, 1e3);
  return f;
}

}  // namespace hsap::cluster
