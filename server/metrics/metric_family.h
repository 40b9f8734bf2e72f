// Plain data records of one scrape: what a Collectable returns and what the
// text format serializes. No behaviour here (LevelDB's VersionEdit habit):
// the registry fills these in, text_format.h writes them out.
//
// Example:
//   MetricFamily family{.name = "hsap_sessions", .help = "Open sessions.",
//                       .type = MetricType::kGauge};
//   family.metrics.push_back({.labels = {}, .value = 3});
#ifndef HSAP_SERVER_METRICS_METRIC_FAMILY_H_
#define HSAP_SERVER_METRICS_METRIC_FAMILY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hsap::metrics {

// Label name -> value. An ordered map, so that a label set has one spelling
// and series sort deterministically.
using Labels = std::map<std::string, std::string>;

enum class MetricType { kCounter, kGauge, kHistogram };

// "counter", "gauge", "histogram": the words of the `# TYPE` line.
const char* MetricTypeName(MetricType type);

// One histogram bucket: the count of observations <= upper_bound,
// cumulative (every bucket includes the ones before it).
struct BucketSample {
  double upper_bound = 0;  // +Inf for the last bucket
  uint64_t cumulative_count = 0;
};

// One series of a family.
struct ClientMetric {
  Labels labels;
  // Counter and gauge: the value.
  double value = 0;
  // Histogram: buckets in increasing upper_bound order, the last one +Inf
  // (so buckets.back().cumulative_count == sample_count), and the sum.
  std::vector<BucketSample> buckets;
  uint64_t sample_count = 0;
  double sample_sum = 0;
};

// A family: one name, help text and type, and its series, sorted by labels.
struct MetricFamily {
  std::string name;
  std::string help;
  MetricType type = MetricType::kCounter;
  std::vector<ClientMetric> metrics;
};

// Something that can be scraped (prometheus-cpp's Collectable; Envoy's habit
// of an interface apart from its implementations). The Registry is one; a
// test double is another.
class Collectable {
 public:
  virtual ~Collectable() = default;
  // A consistent-enough snapshot: each value is read atomically, the set as
  // a whole is not (a counter may move between two series). Families are
  // returned sorted by name. Thread-safe.
  virtual std::vector<MetricFamily> Collect() const = 0;
};

}  // namespace hsap::metrics

#endif  // HSAP_SERVER_METRICS_METRIC_FAMILY_H_
