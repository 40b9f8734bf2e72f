#include "server/metrics/text_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace hsap::metrics {
namespace {

std::string Escape(absl::string_view text, bool escape_quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '"':
        out += escape_quote ? "\\\"" : "\"";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Appends `{a="x",b="y"}`, plus le="<bound>" last when `le` is given; nothing
// when there are no labels at all.
void AppendLabels(const Labels& labels, const std::string* le, std::string* out) {
  if (labels.empty() && le == nullptr) return;
  out->push_back('{');
  bool first = true;
  for (const auto& [name, value] : labels) {
    if (!first) out->push_back(',');
    first = false;
    absl::StrAppend(out, name, "=\"", EscapeLabelValue(value), "\"");
  }
  if (le != nullptr) {
    if (!first) out->push_back(',');
    absl::StrAppend(out, "le=\"", *le, "\"");
  }
  out->push_back('}');
}

void AppendSample(absl::string_view name, const Labels& labels, const std::string* le,
                  absl::string_view value, std::string* out) {
  out->append(name.data(), name.size());
  AppendLabels(labels, le, out);
  absl::StrAppend(out, " ", value, "\n");
}

}  // namespace

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Shortest digits that parse back to the same double, in scientific form
  // ("-1.5e+06"), then laid out as Go's strconv.FormatFloat(v, 'g', -1, 64)
  // does, which is what client_golang writes: exponent form when the decimal
  // exponent is < -4 or >= 6 ("1e-05", "1.048576e+06"), plain otherwise
  // ("0.0001", "123456"). Matching it byte for byte keeps le="..." label
  // values identical to those of Go exporters.
  char buf[64];
  const std::to_chars_result result =
      std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  absl::string_view sci(buf, result.ptr - buf);
  std::string out;
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits(sci.substr(0, e));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exponent = 0;
  std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exponent);
  if (exponent < -4 || exponent >= 6) {
    out.push_back(digits[0]);
    if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
    const int magnitude = exponent < 0 ? -exponent : exponent;
    absl::StrAppend(&out, "e", exponent < 0 ? "-" : "+", magnitude < 10 ? "0" : "", magnitude);
  } else if (exponent >= 0) {
    const size_t integer_digits = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= integer_digits) {
      absl::StrAppend(&out, digits, std::string(integer_digits - digits.size(), '0'));
    } else {
      absl::StrAppend(&out, digits.substr(0, integer_digits), ".", digits.substr(integer_digits));
    }
  } else {
    absl::StrAppend(&out, "0.", std::string(-exponent - 1, '0'), digits);
  }
  return out;
}

std::string EscapeLabelValue(absl::string_view value) { return Escape(value, true); }

std::string EscapeHelp(absl::string_view help) { return Escape(help, false); }

void AppendFamilyText(const MetricFamily& family, std::string* out) {
  absl::StrAppend(out, "# HELP ", family.name, " ", EscapeHelp(family.help), "\n");
  absl::StrAppend(out, "# TYPE ", family.name, " ", MetricTypeName(family.type), "\n");
  for (const ClientMetric& metric : family.metrics) {
    if (family.type != MetricType::kHistogram) {
      AppendSample(family.name, metric.labels, nullptr, FormatValue(metric.value), out);
      continue;
    }
    const std::string bucket_name = family.name + "_bucket";
    for (const BucketSample& bucket : metric.buckets) {
      const std::string le = FormatValue(bucket.upper_bound);
      AppendSample(bucket_name, metric.labels, &le, absl::StrCat(bucket.cumulative_count), out);
    }
    AppendSample(family.name + "_sum", metric.labels, nullptr, FormatValue(metric.sample_sum), out);
    AppendSample(family.name + "_count", metric.labels, nullptr, absl::StrCat(metric.sample_count),
                 out);
  }
}

std::string SerializeText(const std::vector<MetricFamily>& families) {
  std::string out;
  for (const MetricFamily& family : families) AppendFamilyText(family, &out);
  return out;
}

}  // namespace hsap::metrics
