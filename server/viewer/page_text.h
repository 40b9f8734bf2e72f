// Small text helpers of the plan pages: HTML escaping, a JSON writer whose
// output can sit inside a <script> element, human-readable numbers, and the
// pages' colours.
#ifndef HSAP_SERVER_VIEWER_PAGE_TEXT_H_
#define HSAP_SERVER_VIEWER_PAGE_TEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace hsap::viewer {

// `text` with & < > " ' replaced by character references: safe inside an
// element or a quoted attribute.
std::string EscapeHtml(absl::string_view text);

// Builds JSON text. Strings escape '<', '>' and '&' as \u003c, \u003e,
// \u0026, so the text never contains "</script" and can be embedded as is.
// Doubles print with the fewest digits that read back exactly (non-finite
// ones as null). Commas and nesting are tracked; closing what is not open is a CHECK failure.
//
// Example:
//   JsonWriter j;
//   j.BeginObject();
//   j.Key("ranks").Int(8);
//   j.Key("imbalance").Double(1.03);
//   j.EndObject();
//   std::string text = j.Take();  // {"ranks":8,"imbalance":1.03}
class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(absl::string_view key);
  JsonWriter& String(absl::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Double(double value);
  // `value` with `digits` significant digits (smaller output, not exact).
  JsonWriter& Rounded(double value, int digits);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();
  std::string Take() { return std::move(out_); }

 private:
  void BeforeValue();
  std::string out_;
  // Per open container: whether it has a member yet.
  std::vector<bool> has_member_;
  bool after_key_ = false;
};

// "0 B", "512 B", "1.50 KiB", "12.3 MiB", "4.00 GiB" (three significant digits).
std::string FormatBytes(double bytes);
// Microseconds as "850 us", "12.3 ms", "1.25 s".
std::string FormatUs(double us);
// An integer with thousands separators: 1048576 -> "1,048,576".
std::string FormatCount(int64_t n);
// A large count in three significant digits: 7644499362 -> "7.64 G".
std::string FormatShort(double n);

// Colours as "#rrggbb". A rank's colour: its node's hue (golden-angle
// spaced) and a lightness by its slot on the node; on one node, a hue per
// rank.
std::string RankColour(int32_t rank, int32_t devices_per_node, int32_t num_nodes);
// A node's colour (the hue of its ranks, darker).
std::string NodeColour(int32_t node);
// Heatmap colours for t in [0, 1]: blues for intra-node, oranges for
// inter-node cells.
std::string IntraHeat(double t);
std::string InterHeat(double t);

}  // namespace hsap::viewer

#endif  // HSAP_SERVER_VIEWER_PAGE_TEXT_H_
