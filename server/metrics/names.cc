#include "server/metrics/names.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hsap::metrics {
namespace {

bool IsNameChar(char c, bool allow_colon) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
         (allow_colon && c == ':');
}

bool IsValidName(absl::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  if (absl::ascii_isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!IsNameChar(c, allow_colon)) return false;
  }
  return true;
}

}  // namespace

bool IsValidMetricName(absl::string_view name) { return IsValidName(name, /*allow_colon=*/true); }

bool IsValidLabelName(absl::string_view name) {
  return IsValidName(name, /*allow_colon=*/false) && !absl::StartsWith(name, "__");
}

bool IsValidUtf8(absl::string_view text) {
  // RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF.
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i < static_cast<size_t>(len)) return false;
    for (int k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    static constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

absl::Status ValidateLabels(const Labels& labels, MetricType type) {
  for (const auto& [name, value] : labels) {
    if (!IsValidLabelName(name)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "label name \"%s\" is invalid: must match [a-zA-Z_][a-zA-Z0-9_]* and not start "
          "with \"__\"",
          absl::CHexEscape(name)));
    }
    if (type == MetricType::kHistogram && name == "le") {
      return absl::InvalidArgumentError(
          "label name \"le\" is reserved in a histogram (the exposition adds it to buckets)");
    }
    if (!IsValidUtf8(value)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "value of label \"%s\" is not valid UTF-8: \"%s\"", name, absl::CHexEscape(value)));
    }
  }
  return absl::OkStatus();
}

}  // namespace hsap::metrics
