// Prometheus naming rules, checked where names enter the registry.
//
//   metric name: [a-zA-Z_:][a-zA-Z0-9_:]*
//   label name:  [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (reserved
//                for Prometheus' internal labels)
//   label value: any valid UTF-8
//   help text:   any valid UTF-8
//
// (https://prometheus.io/docs/concepts/data_model/ and the text exposition
// format 0.0.4.)
#ifndef HSAP_SERVER_METRICS_NAMES_H_
#define HSAP_SERVER_METRICS_NAMES_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/metrics/metric_family.h"

namespace hsap::metrics {

bool IsValidMetricName(absl::string_view name);
bool IsValidLabelName(absl::string_view name);
bool IsValidUtf8(absl::string_view text);

// OK, or INVALID_ARGUMENT naming the offending label and the rule. Checks
// every name and value of `labels`; for a histogram family also refuses the
// label "le", which the exposition adds to its buckets.
absl::Status ValidateLabels(const Labels& labels, MetricType type);

}  // namespace hsap::metrics

#endif  // HSAP_SERVER_METRICS_NAMES_H_
