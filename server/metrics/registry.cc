#include "server/metrics/registry.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/metrics/names.h"

namespace hsap::metrics {
namespace {

// The names a family's exposition writes: the family name and, for a
// histogram, its three series suffixes.
std::vector<std::string> ExposedNames(const FamilySpec& spec) {
  if (spec.type != MetricType::kHistogram) return {spec.name};
  return {spec.name, spec.name + "_bucket", spec.name + "_sum", spec.name + "_count"};
}

absl::Status ValidateSpec(const FamilySpec& spec) {
  if (!IsValidMetricName(spec.name)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("metric name \"%s\" is invalid: must match [a-zA-Z_:][a-zA-Z0-9_:]*",
                        absl::CHexEscape(spec.name)));
  }
  if (spec.help.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("metric ", spec.name, " has no help text"));
  }
  if (!IsValidUtf8(spec.help)) {
    return absl::InvalidArgumentError(
        absl::StrCat("help text of metric ", spec.name, " is not valid UTF-8"));
  }
  if (spec.type == MetricType::kHistogram) {
    absl::Status buckets = Histogram::ValidateBounds(spec.buckets);
    if (!buckets.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("metric ", spec.name, ": ", buckets.message()));
    }
  } else if (!spec.buckets.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric ", spec.name, " has buckets but is not a histogram"));
  }
  return absl::OkStatus();
}

}  // namespace

Registry::Registry(RegistryOptions options) : options_(options) {
  FamilySpec spec{
      .name = kDroppedSeriesMetric,
      .help = "Label sets refused because a metric family reached its bound on label sets, "
              "or because the label set was invalid.",
      .type = MetricType::kCounter,
      .max_series = options_.max_series_per_family,
  };
  auto family = std::make_unique<Family<Counter>>(spec, nullptr);
  dropped_ = family.get();
  dropped_->set_dropped_counter(&dropped_->Add({{"family", spec.name}}));
  absl::MutexLock lock(&mu_);
  families_[spec.name] = std::move(family);
}

Registry::~Registry() = default;

absl::StatusOr<FamilyBase*> Registry::CheckNewFamily(const FamilySpec& spec) const {
  absl::Status valid = ValidateSpec(spec);
  if (!valid.ok()) return valid;
  auto same_name = families_.find(spec.name);
  if (same_name != families_.end()) {
    const FamilySpec& old = same_name->second->spec();
    if (old.type == spec.type && old.help == spec.help && old.buckets == spec.buckets) {
      return same_name->second.get();
    }
    return absl::AlreadyExistsError(absl::StrFormat(
        "metric %s is already registered as a %s with other help text or buckets", spec.name,
        MetricTypeName(old.type)));
  }
  const std::vector<std::string> wanted = ExposedNames(spec);
  for (const auto& [name, family] : families_) {
    for (const std::string& taken : ExposedNames(family->spec())) {
      for (const std::string& want : wanted) {
        if (want == taken) {
          return absl::AlreadyExistsError(absl::StrFormat(
              "metric %s would write series %s, which %s %s already writes", spec.name, want,
              MetricTypeName(family->spec().type), name));
        }
      }
    }
  }
  return nullptr;
}

std::vector<MetricFamily> Registry::Collect() const {
  std::vector<MetricFamily> out;
  absl::MutexLock lock(&mu_);
  out.reserve(families_.size());
  for (const auto& [name, family] : families_) {
    MetricFamily collected = family->Collect();
    if (!collected.metrics.empty()) out.push_back(std::move(collected));
  }
  return out;
}

}  // namespace hsap::metrics
