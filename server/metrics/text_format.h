// The Prometheus text exposition format, version 0.0.4: what GET /metrics
// returns (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
// For each family, in the order given:
//   # HELP <name> <help, with \ and newline escaped>
//   # TYPE <name> counter|gauge|histogram
//   <name>{<label>="<value, with \ " and newline escaped>",...} <value>
// and for a histogram, per series, cumulative buckets then sum and count:
//   <name>_bucket{<labels>,le="<bound>"} <count>    ... up to le="+Inf"
//   <name>_sum{<labels>} <sum>
//   <name>_count{<labels>} <count>
// A series without labels has no braces. Numbers are written with the
// fewest digits that read back to the same double, laid out as Go's
// strconv.FormatFloat(v, 'g', -1, 64) (what client_golang writes, so le
// values match Go exporters'): "0.1", "3", "0.0001", "1e-05", "123456",
// "1.048576e+06", and "+Inf", "-Inf", "NaN". No timestamps. Output is a pure function of
// the input, so a registry's sorted Collect() serializes deterministically.
#ifndef HSAP_SERVER_METRICS_TEXT_FORMAT_H_
#define HSAP_SERVER_METRICS_TEXT_FORMAT_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/metrics/metric_family.h"

namespace hsap::metrics {

// The Content-Type of the format.
inline constexpr char kTextContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// All families, each as described above.
std::string SerializeText(const std::vector<MetricFamily>& families);

// Appends one family to `out`. REQUIRES: out != nullptr.
void AppendFamilyText(const MetricFamily& family, std::string* out);

// A sample value or bucket bound as the format spells it (see above).
std::string FormatValue(double value);

// A label value between double quotes: \ -> \\, " -> \", newline -> \n.
std::string EscapeLabelValue(absl::string_view value);

// Help text: \ -> \\, newline -> \n (double quotes stay).
std::string EscapeHelp(absl::string_view help);

}  // namespace hsap::metrics

#endif  // HSAP_SERVER_METRICS_TEXT_FORMAT_H_
