#include "server/viewer/page_text.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace hsap::viewer {

std::string EscapeHtml(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!has_member_.empty()) {
    if (has_member_.back()) out_ += ',';
    has_member_.back() = true;
  }
}

JsonWriter& JsonWriter::BeginObject() {
  BeforeValue();
  out_ += '{';
  has_member_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::EndObject() {
  HSAP_CHECK(!has_member_.empty());
  has_member_.pop_back();
  out_ += '}';
  return *this;
}

JsonWriter& JsonWriter::BeginArray() {
  BeforeValue();
  out_ += '[';
  has_member_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::EndArray() {
  HSAP_CHECK(!has_member_.empty());
  has_member_.pop_back();
  out_ += ']';
  return *this;
}

JsonWriter& JsonWriter::Key(absl::string_view key) {
  String(key);
  out_ += ':';
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::String(absl::string_view value) {
  BeforeValue();
  out_ += '"';
  for (unsigned char c : value) {
    switch (c) {
      case '"': out_ += "\\\""; break;
      case '\\': out_ += "\\\\"; break;
      case '\n': out_ += "\\n"; break;
      case '\r': out_ += "\\r"; break;
      case '\t': out_ += "\\t"; break;
      case '<': out_ += "\\u003c"; break;
      case '>': out_ += "\\u003e"; break;
      case '&': out_ += "\\u0026"; break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(&out_, "\\u%04x", c);
        } else {
          out_ += static_cast<char>(c);
        }
    }
  }
  out_ += '"';
  return *this;
}

JsonWriter& JsonWriter::Int(int64_t value) {
  BeforeValue();
  absl::StrAppend(&out_, value);
  return *this;
}

JsonWriter& JsonWriter::Double(double value) {
  BeforeValue();
  if (!std::isfinite(value)) {
    out_ += "null";
    return *this;
  }
  for (int precision = 6; precision <= 17; ++precision) {
    const std::string s = absl::StrFormat("%.*g", precision, value);
    if (std::strtod(s.c_str(), nullptr) == value || precision == 17) {
      out_ += s;
      break;
    }
  }
  return *this;
}

JsonWriter& JsonWriter::Rounded(double value, int digits) {
  BeforeValue();
  if (!std::isfinite(value)) {
    out_ += "null";
  } else {
    absl::StrAppendFormat(&out_, "%.*g", digits, value);
  }
  return *this;
}

JsonWriter& JsonWriter::Bool(bool value) {
  BeforeValue();
  out_ += value ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::Null() {
  BeforeValue();
  out_ += "null";
  return *this;
}

namespace {

// Three significant digits of `v` (>= 0) with `unit` appended.
std::string ThreeDigits(double v, absl::string_view unit) {
  if (v >= 100) return absl::StrFormat("%.0f %s", v, unit);
  if (v >= 10) return absl::StrFormat("%.1f %s", v, unit);
  return absl::StrFormat("%.2f %s", v, unit);
}

std::string Hex(double r, double g, double b) {
  auto byte = [](double x) {
    return static_cast<int>(std::lround(std::clamp(x, 0.0, 1.0) * 255));
  };
  return absl::StrFormat("#%02x%02x%02x", byte(r), byte(g), byte(b));
}

// HSL (h in degrees, s and l in [0, 1]) as "#rrggbb".
std::string Hsl(double h, double s, double l) {
  h = std::fmod(std::fmod(h, 360.0) + 360.0, 360.0) / 360.0;
  auto channel = [&](double t) {
    const double q = l < 0.5 ? l * (1 + s) : l + s - l * s;
    const double p = 2 * l - q;
    t = t < 0 ? t + 1 : t > 1 ? t - 1 : t;
    if (t < 1.0 / 6) return p + (q - p) * 6 * t;
    if (t < 0.5) return q;
    if (t < 2.0 / 3) return p + (q - p) * (2.0 / 3 - t) * 6;
    return p;
  };
  return Hex(channel(h + 1.0 / 3), channel(h), channel(h - 1.0 / 3));
}

constexpr double kGoldenAngle = 137.508;

std::string Mix(const double a[3], const double b[3], double t) {
  t = std::clamp(t, 0.0, 1.0);
  return Hex(a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t, a[2] + (b[2] - a[2]) * t);
}

}  // namespace

std::string FormatBytes(double bytes) {
  if (bytes < 1024) return absl::StrFormat("%.0f B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = bytes / 1024;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return ThreeDigits(v, units[u]);
}

std::string FormatUs(double us) {
  if (!std::isfinite(us)) return "-";
  if (us == 0) return "0";
  if (us < 1000) return ThreeDigits(us, "us");
  if (us < 1e6) return ThreeDigits(us / 1e3, "ms");
  return ThreeDigits(us / 1e6, "s");
}

std::string FormatCount(int64_t n) {
  const bool negative = n < 0;
  std::string digits = absl::StrCat(negative ? -static_cast<uint64_t>(n) : n);
  std::string out;
  const int lead = static_cast<int>(digits.size() % 3);
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (static_cast<int>(i) - lead) % 3 == 0) out += ',';
    out += digits[i];
  }
  return negative ? "-" + out : out;
}

std::string FormatShort(double n) {
  if (n < 1000) return absl::StrFormat("%.0f", n);
  const char* units[] = {"K", "M", "G", "T", "P", "E"};
  double v = n / 1000;
  int u = 0;
  while (v >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  return ThreeDigits(v, units[u]);
}

std::string RankColour(int32_t rank, int32_t devices_per_node, int32_t num_nodes) {
  if (num_nodes <= 1) return Hsl(rank * kGoldenAngle + 200, 0.62, 0.55);
  const int32_t node = rank / std::max(1, devices_per_node);
  const int32_t slot = rank % std::max(1, devices_per_node);
  const double l = devices_per_node > 1 ? 0.36 + 0.36 * slot / (devices_per_node - 1) : 0.5;
  return Hsl(node * kGoldenAngle + 200, 0.65, l);
}

std::string NodeColour(int32_t node) { return Hsl(node * kGoldenAngle + 200, 0.7, 0.32); }

std::string IntraHeat(double t) {
  static const double kLight[3] = {0.871, 0.922, 0.969}, kDark[3] = {0.031, 0.271, 0.58};
  return Mix(kLight, kDark, t);
}

std::string InterHeat(double t) {
  static const double kLight[3] = {0.996, 0.851, 0.706}, kDark[3] = {0.651, 0.212, 0.012};
  return Mix(kLight, kDark, t);
}

}  // namespace hsap::viewer
