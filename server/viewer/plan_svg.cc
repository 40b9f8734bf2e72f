// The plan page's four figures as inline SVG (page_model.h). Coordinates
// are in CSS pixels of a 1320-wide page; figures scale down with the
// window (viewBox). Elements that repeat per rank or per stage are drawn as
// one <path> per colour, so a 512-rank plan stays a few hundred kilobytes;
// hover read-outs come from the JSON data block (plan_page_script.cc), not
// from per-element text.
#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/viewer/page_model.h"
#include "server/viewer/page_text.h"

namespace hsap::viewer::internal {
namespace {

constexpr double kWidth = 1320;
constexpr double kLeft = 96;  // row labels
constexpr double kPlotW = kWidth - kLeft - 24;

// Colours of the figures (the legend in plan_page.cc repeats them).
constexpr char kIntraColour[] = "#4a90d9";
constexpr char kInterColour[] = "#e6711c";
constexpr char kComputeColour[] = "#3d8b3d";
constexpr char kOverlapColour[] = "#9fd39f";
constexpr char kReturnColour[] = "#8e5ac8";

std::string N(double v) { return absl::StrFormat("%.1f", v); }

void OpenSvg(std::string* out, absl::string_view id, double height, absl::string_view label) {
  absl::StrAppendFormat(out,
                        "<svg id=\"%s\" class=\"fig\" "
                        "viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" role=\"img\" "
                        "aria-label=\"%s\">\n",
                        id, kWidth, height, kWidth, height, EscapeHtml(label));
}

void Text(std::string* out, double x, double y, absl::string_view text,
          absl::string_view attrs = "") {
  absl::StrAppendFormat(out, "<text x=\"%s\" y=\"%s\"%s%s>%s</text>\n", N(x), N(y),
                        attrs.empty() ? "" : " ", attrs, EscapeHtml(text));
}

// Appends a rectangle to a path's data.
void PathRect(std::string* d, double x, double y, double w, double h) {
  if (w <= 0.05 || h <= 0) return;
  absl::StrAppend(d, "M", N(x), " ", N(y), "h", N(w), "v", N(h), "h", N(-w), "z");
}

void Path(std::string* out, const std::string& d, absl::string_view fill,
          absl::string_view extra = "") {
  if (d.empty()) return;
  absl::StrAppendFormat(out, "<path fill=\"%s\"%s%s d=\"%s\"/>\n", fill, extra.empty() ? "" : " ",
                        extra, d);
}

std::string RowTick(const PageModel& m, size_t i) {
  const Row& row = m.rows.rows[i];
  switch (m.rows.level) {
    case RowLevel::kRank: return absl::StrCat(row.first_rank);
    case RowLevel::kNode: return absl::StrCat("n", row.first_node);
    case RowLevel::kNodeRun: return absl::StrCat("n", row.first_node);
  }
  return "";
}

// Every k-th of n labels, so that about 32 show.
size_t LabelStride(size_t n) { return n <= 32 ? 1 : (n + 31) / 32; }

}  // namespace

// ---------------------------------------------------------------- layout

void AppendLayoutSvg(const PageModel& m, std::string* out) {
  const plan::Plan& p = *m.plan;
  const plan::Topology& topo = p.spec.topology;
  const double T = std::max<int64_t>(1, p.spec.total_tokens);
  auto x = [&](int64_t token) { return kLeft + token / T * kPlotW; };
  constexpr double kDocY = 6, kDocH = 24, kRankY = 34, kRankH = 28, kNodeY = 66, kNodeH = 10;
  const double height = 104;
  OpenSvg(out, "layout-svg", height, "layout strip: documents, ranks and nodes along the sequence");
  absl::StrAppendFormat(out, "<g data-hover=\"layout\" data-x0=\"%s\" data-w=\"%s\">\n",
                        N(kLeft), N(kPlotW));
  absl::StrAppendFormat(out, "<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"#f3f4f6\"/>\n",
                        N(kLeft), N(kDocY), N(kPlotW), N(kNodeY + kNodeH - kDocY));
  // Documents: alternating shades; runs of documents narrower than 0.6 px
  // are drawn as one block in a third shade.
  std::string even, odd, dense;
  for (size_t i = 0; i < m.documents.size();) {
    const Document& d = m.documents[i];
    if (d.end <= d.begin) {
      ++i;
      continue;
    }
    if (x(d.end) - x(d.begin) >= 0.6) {
      PathRect(i % 2 == 0 ? &even : &odd, x(d.begin), kDocY, x(d.end) - x(d.begin), kDocH);
      ++i;
      continue;
    }
    const int64_t begin = d.begin;
    int64_t end = d.end;
    size_t j = i + 1;
    while (j < m.documents.size() &&
           x(m.documents[j].end) - x(m.documents[j].begin) < 0.6) {
      end = std::max(end, m.documents[j].end);
      ++j;
    }
    PathRect(&dense, x(begin), kDocY, std::max(0.6, x(end) - x(begin)), kDocH);
    i = j;
  }
  Path(out, even, "#c3c9d2");
  Path(out, odd, "#7f8b9b");
  Path(out, dense, "#a3abb7");
  // Ranks: each owner segment in its rank's colour; nodes below; each run
  // of tokens held by one node outlined in the node's colour. One path per
  // colour (a 512-rank plan has thousands of segments).
  std::vector<std::string> by_rank(topo.num_ranks()), node_fill(topo.num_nodes),
      node_outline(topo.num_nodes);
  for (const plan::OwnerSegment& s : m.owners) {
    PathRect(&by_rank[s.rank], x(s.begin), kRankY, std::max(0.3, x(s.end) - x(s.begin)), kRankH);
  }
  for (size_t i = 0; i < m.owners.size();) {
    const int32_t node = topo.NodeOf(m.owners[i].rank);
    size_t j = i + 1;
    while (j < m.owners.size() && topo.NodeOf(m.owners[j].rank) == node &&
           m.owners[j].begin == m.owners[j - 1].end) {
      ++j;
    }
    const double x0 = x(m.owners[i].begin), w = std::max(0.3, x(m.owners[j - 1].end) - x0);
    PathRect(&node_fill[node], x0, kNodeY, w, kNodeH);
    if (w > 1.5) PathRect(&node_outline[node], x0 + 0.75, kRankY + 0.75, w - 1.5, kRankH - 1.5);
    i = j;
  }
  for (int32_t r = 0; r < topo.num_ranks(); ++r) {
    Path(out, by_rank[r], RankColour(r, topo.devices_per_node, topo.num_nodes));
  }
  for (int32_t n = 0; n < topo.num_nodes; ++n) {
    Path(out, node_fill[n], NodeColour(n));
    if (topo.num_nodes > 1) {
      absl::StrAppendFormat(out, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" d=\"%s\"/>\n",
                            NodeColour(n), node_outline[n]);
    }
  }
  out->append("</g>\n");
  Text(out, kLeft - 8, kDocY + 16, "documents", "text-anchor=\"end\"");
  Text(out, kLeft - 8, kRankY + 18, "ranks", "text-anchor=\"end\"");
  Text(out, kLeft - 8, kNodeY + 9, "nodes", "text-anchor=\"end\"");
  // Token axis.
  for (int i = 0; i <= 8; ++i) {
    const int64_t token = static_cast<int64_t>(std::llround(T * i / 8));
    const double tx = x(token);
    absl::StrAppendFormat(out, "<line x1=\"%s\" x2=\"%s\" y1=\"%s\" y2=\"%s\" stroke=\"#555\"/>\n",
                          N(tx), N(tx), N(kNodeY + kNodeH), N(kNodeY + kNodeH + 5));
    Text(out, tx, kNodeY + kNodeH + 17, FormatCount(token),
         i == 0 ? "text-anchor=\"start\"" : i == 8 ? "text-anchor=\"end\"" : "text-anchor=\"middle\"");
  }
  out->append("</svg>\n");
}

// ---------------------------------------------------------------- load

void AppendLoadSvg(const PageModel& m, std::string* out) {
  const plan::Plan& p = *m.plan;
  const size_t n = m.rows.rows.size();
  constexpr double kChartH = 110, kChartGap = 52, kTop = 22;
  const double height = kTop + 3 * kChartH + 2 * kChartGap + 30;
  OpenSvg(out, "load-svg", height, "load per rank: compute and received bytes");
  const double slot = kPlotW / std::max<size_t>(1, n);
  const double bar = std::max(1.0, slot * 0.78);
  const std::string level = m.rows.level == RowLevel::kRank ? "rank" : "node";

  struct Chart {
    std::string title;
    std::string right;  // right-aligned note (the imbalance)
    bool bytes = true;
    bool backward = false;
  };
  const Chart charts[3] = {
      {absl::StrCat("compute per ", level, ": allowed (q, k) pairs x q heads"),
       absl::StrCat(ImbalanceLabel(p.stats.imbalance), " (busiest / mean)"), false, false},
      {absl::StrCat("forward bytes received per ", level,
                    " (intra-node | inter-node); tick: exact-need lower bound"),
       "", true, false},
      {absl::StrCat("backward bytes received per ", level, " (K/V again + dK/dV returns)"), "",
       true, true},
  };
  for (int c = 0; c < 3; ++c) {
    const Chart& chart = charts[c];
    const double top = kTop + c * (kChartH + kChartGap), bottom = top + kChartH;
    std::vector<double> intra(n), inter(n), lb(n, -1);
    double vmax = 0, sum = 0;
    for (size_t i = 0; i < n; ++i) {
      const RowLoad& l = m.loads[i];
      if (!chart.bytes) {
        intra[i] = static_cast<double>(l.head_area);
      } else {
        const auto& tiers = chart.backward ? l.bwd_recv : l.fwd_recv;
        intra[i] = static_cast<double>(tiers[0]);
        inter[i] = static_cast<double>(tiers[1]);
        if (!chart.backward) lb[i] = static_cast<double>(l.lower_bound_recv_bytes);
      }
      vmax = std::max({vmax, intra[i] + inter[i], lb[i]});
      sum += intra[i] + inter[i];
    }
    const double mean = n > 0 ? sum / n : 0;
    if (vmax <= 0) vmax = 1;
    vmax *= 1.08;
    auto y = [&](double v) { return bottom - v / vmax * kChartH; };
    Text(out, kLeft, top - 8, chart.title, "class=\"t\"");
    if (!chart.right.empty()) {
      Text(out, kLeft + kPlotW, top - 8, chart.right,
           "class=\"t\" text-anchor=\"end\" id=\"imbalance-label\"");
    }
    absl::StrAppendFormat(out,
                          "<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"#fafafa\" "
                          "stroke=\"#ccc\"/>\n",
                          N(kLeft), N(top), N(kPlotW), N(kChartH));
    auto fmt = [&](double v) { return chart.bytes ? FormatBytes(v) : FormatShort(v); };
    Text(out, kLeft - 6, bottom, "0", "text-anchor=\"end\"");
    Text(out, kLeft - 6, y(vmax / 1.08) + 4, fmt(vmax / 1.08), "text-anchor=\"end\"");
    std::string d_intra, d_inter, d_lb;
    for (size_t i = 0; i < n; ++i) {
      const double bx = kLeft + i * slot + (slot - bar) / 2;
      PathRect(&d_intra, bx, y(intra[i]), bar, bottom - y(intra[i]));
      PathRect(&d_inter, bx, y(intra[i] + inter[i]), bar, y(intra[i]) - y(intra[i] + inter[i]));
      if (lb[i] >= 0) {
        absl::StrAppend(&d_lb, "M", N(bx - 1), " ", N(y(lb[i])), "h", N(bar + 2));
      }
    }
    Path(out, d_intra, chart.bytes ? kIntraColour : kComputeColour);
    Path(out, d_inter, kInterColour);
    if (!d_lb.empty()) {
      absl::StrAppendFormat(out, "<path fill=\"none\" stroke=\"#111\" stroke-width=\"2\" d=\"%s\"/>\n",
                            d_lb);
    }
    absl::StrAppendFormat(out,
                          "<line x1=\"%s\" x2=\"%s\" y1=\"%s\" y2=\"%s\" stroke=\"#c0392b\" "
                          "stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n",
                          N(kLeft), N(kLeft + kPlotW), N(y(mean)), N(y(mean)));
    Text(out, kLeft + kPlotW - 4, y(mean) - 4, absl::StrCat("mean ", fmt(mean)),
         "text-anchor=\"end\" class=\"mean\"");
  }
  // Row labels under the last chart, node boundaries across all three.
  const double last_bottom = kTop + 3 * kChartH + 2 * kChartGap;
  const size_t stride = LabelStride(n);
  for (size_t i = 0; i < n; i += stride) {
    Text(out, kLeft + (i + 0.5) * slot, last_bottom + 14, RowTick(m, i),
         "text-anchor=\"middle\" class=\"small\"");
  }
  if (m.rows.level == RowLevel::kRank && p.spec.topology.num_nodes > 1) {
    std::string d;
    for (int32_t nd = 1; nd < p.spec.topology.num_nodes; ++nd) {
      const double bx = kLeft + nd * p.spec.topology.devices_per_node * slot;
      for (int c = 0; c < 3; ++c) {
        const double top = kTop + c * (kChartH + kChartGap);
        absl::StrAppend(&d, "M", N(bx), " ", N(top), "v", N(kChartH));
      }
    }
    absl::StrAppendFormat(out, "<path stroke=\"#666\" stroke-dasharray=\"2 2\" d=\"%s\"/>\n", d);
  }
  // Hover columns (the read-out comes from the data block).
  absl::StrAppendFormat(out, "<g data-hover=\"load\" data-x0=\"%s\" data-slot=\"%s\">", N(kLeft),
                        N(slot));
  absl::StrAppendFormat(out,
                        "<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"transparent\"/>",
                        N(kLeft), N(kTop), N(kPlotW), N(last_bottom - kTop));
  out->append("</g>\n</svg>\n");
}

// ---------------------------------------------------------------- traffic

namespace {

struct Heatmap {
  const std::vector<int64_t>* values = nullptr;
  int32_t n = 0;
  std::string title;
  std::string key;  // "rows" or "nodes": the data block's matrix
  std::string dir;  // "fwd" or "bwd"
  // For rank matrices: ranks per node (block outlines); 0: none.
  int32_t block = 0;
  // Whether cell (i, j) is inter-node.
  std::function<bool(int32_t, int32_t)> inter;
  std::function<std::string(int32_t)> label;
};

void DrawHeatmap(const Heatmap& h, double x0, double y0, double cell, double lo, double hi,
                 std::string* out) {
  const double size = h.n * cell;
  Text(out, x0, y0 - 30, h.title, "class=\"t\"");
  absl::StrAppendFormat(out, "<g data-hover=\"matrix\" data-key=\"%s\" data-dir=\"%s\" "
                        "data-x0=\"%s\" data-y0=\"%s\" data-cell=\"%s\" data-n=\"%d\">\n",
                        h.key, h.dir, N(x0), N(y0), N(cell), h.n);
  absl::StrAppendFormat(out,
                        "<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"#f4f4f4\" "
                        "stroke=\"#bbb\"/>\n",
                        N(x0), N(y0), N(size), N(size));
  // One path per colour: the scale has kHeatLevels steps per palette.
  constexpr int kHeatLevels = 24;
  const double span = hi > lo ? std::log(hi) - std::log(lo) : 1.0;
  std::vector<std::string> cells(2 * kHeatLevels);
  for (int32_t i = 0; i < h.n; ++i) {
    for (int32_t j = 0; j < h.n; ++j) {
      const int64_t v = (*h.values)[static_cast<size_t>(i) * h.n + j];
      if (v <= 0) continue;
      const double t = hi > lo ? (std::log(static_cast<double>(v)) - std::log(lo)) / span : 1.0;
      const int level = std::clamp(static_cast<int>(std::lround(t * (kHeatLevels - 1))), 0,
                                   kHeatLevels - 1);
      PathRect(&cells[(h.inter(i, j) ? kHeatLevels : 0) + level], x0 + j * cell, y0 + i * cell,
               cell, cell);
    }
  }
  for (int k = 0; k < 2 * kHeatLevels; ++k) {
    const double t = 0.15 + 0.85 * (k % kHeatLevels) / (kHeatLevels - 1.0);
    Path(out, cells[k], k >= kHeatLevels ? InterHeat(t) : IntraHeat(t));
  }
  if (h.block > 0 && h.n > h.block) {
    std::string d;
    for (int32_t b = h.block; b < h.n; b += h.block) {
      absl::StrAppend(&d, "M", N(x0 + b * cell), " ", N(y0), "v", N(size), "M", N(x0), " ",
                      N(y0 + b * cell), "h", N(size));
    }
    absl::StrAppendFormat(out, "<path stroke=\"#333\" stroke-width=\"1\" d=\"%s\"/>\n", d);
  }
  out->append("</g>\n");
  // Labels no closer than a line (rows) or two digits and a gap (columns).
  const int32_t row_stride = static_cast<int32_t>(std::ceil(12.0 / cell));
  const int32_t col_stride = static_cast<int32_t>(std::ceil(18.0 / cell));
  for (int32_t i = 0; i < h.n; i += row_stride) {
    Text(out, x0 - 4, y0 + (i + 0.5) * cell + 4, h.label(i), "text-anchor=\"end\" class=\"small\"");
  }
  for (int32_t i = 0; i < h.n; i += col_stride) {
    Text(out, x0 + (i + 0.5) * cell, y0 - 5, h.label(i), "text-anchor=\"middle\" class=\"small\"");
  }
}

// Smallest positive and largest entry of both matrices.
void Range(const TrafficMatrix& t, double* lo, double* hi) {
  *lo = 0;
  *hi = 0;
  for (const auto* v : {&t.fwd, &t.bwd}) {
    for (int64_t b : *v) {
      if (b <= 0) continue;
      *hi = std::max(*hi, static_cast<double>(b));
      *lo = *lo == 0 ? static_cast<double>(b) : std::min(*lo, static_cast<double>(b));
    }
  }
}

void DrawScale(double x, double y, double lo, double hi, std::string* out) {
  for (int tier = 0; tier < 2; ++tier) {
    const double yy = y + tier * 44;
    Text(out, x, yy - 6, tier == 0 ? "intra-node cells" : "inter-node cells", "class=\"small\"");
    for (int s = 0; s < 10; ++s) {
      const double t = 0.15 + 0.85 * s / 9.0;
      absl::StrAppendFormat(out, "<rect x=\"%s\" y=\"%s\" width=\"14\" height=\"12\" fill=\"%s\"/>",
                            N(x + s * 14), N(yy), tier == 0 ? IntraHeat(t) : InterHeat(t));
    }
    Text(out, x, yy + 24, FormatBytes(lo), "class=\"small\"");
    Text(out, x + 140, yy + 24, FormatBytes(hi), "class=\"small\" text-anchor=\"end\"");
  }
}

}  // namespace

void AppendTrafficSvg(const PageModel& m, std::string* out) {
  const plan::Topology& topo = m.plan->spec.topology;
  const int32_t n = m.traffic.size;
  // Two heatmaps and the colour scales side by side in the page's width.
  const double cell = std::clamp(std::floor(440.0 / std::max(1, n)), 4.0, 40.0);
  const double size = n * cell;
  const bool rank_level = m.rows.level == RowLevel::kRank;
  const int32_t nn = m.has_node_traffic ? m.node_traffic.size : 0;
  const double node_cell = nn > 0 ? std::clamp(std::floor(300.0 / nn), 4.0, 48.0) : 0;
  const double height = 56 + size + 30 + (nn > 0 ? 56 + nn * node_cell + 30 : 0);
  OpenSvg(out, "traffic-svg", height, "traffic matrix: bytes between ranks and nodes");
  const std::string unit = rank_level ? "rank" : m.rows.level == RowLevel::kNode ? "node" : "nodes";
  auto row_label = [&m](int32_t i) {
    const Row& r = m.rows.rows[i];
    return m.rows.level == RowLevel::kRank ? absl::StrCat(r.first_rank)
                                           : absl::StrCat(r.first_node);
  };
  auto row_inter = [&m](int32_t i, int32_t j) {
    const Row &a = m.rows.rows[i], &b = m.rows.rows[j];
    return a.first_node != b.first_node || a.last_node != b.last_node || a.first_node != a.last_node;
  };
  // Heatmap titles are about 250 px wide.
  auto second_x = [](double x0, double width) { return x0 + std::max(width, 250.0) + 90; };
  double lo, hi;
  Range(m.traffic, &lo, &hi);
  const double x0 = kLeft, x1 = second_x(x0, size);
  for (int dir = 0; dir < 2; ++dir) {
    Heatmap h;
    h.values = dir == 0 ? &m.traffic.fwd : &m.traffic.bwd;
    h.n = n;
    h.title = absl::StrCat(dir == 0 ? "forward" : "backward", " bytes, ", unit, " x ", unit);
    h.key = "rows";
    h.dir = dir == 0 ? "fwd" : "bwd";
    h.block = rank_level && topo.num_nodes > 1 ? topo.devices_per_node : 0;
    h.inter = row_inter;
    h.label = row_label;
    DrawHeatmap(h, dir == 0 ? x0 : x1, 56, cell, lo, hi, out);
  }
  DrawScale(x1 + std::max(size, 250.0) + 50, 70, lo, hi, out);
  if (nn > 0) {
    double nlo, nhi;
    Range(m.node_traffic, &nlo, &nhi);
    const double y0 = 56 + size + 30 + 56;
    const double nsize = nn * node_cell, nx1 = second_x(x0, nsize);
    for (int dir = 0; dir < 2; ++dir) {
      Heatmap h;
      h.values = dir == 0 ? &m.node_traffic.fwd : &m.node_traffic.bwd;
      h.n = nn;
      h.title = absl::StrCat(dir == 0 ? "forward" : "backward", " bytes, node x node");
      h.key = "nodes";
      h.dir = dir == 0 ? "fwd" : "bwd";
      h.inter = [](int32_t i, int32_t j) { return i != j; };
      h.label = [](int32_t i) { return absl::StrCat(i); };
      DrawHeatmap(h, dir == 0 ? x0 : nx1, y0, node_cell, nlo, nhi, out);
    }
    DrawScale(nx1 + std::max(nsize, 250.0) + 50, y0 + 14, nlo, nhi, out);
  }
  out->append("</svg>\n");
}

// ---------------------------------------------------------------- timeline

void AppendTimelineSvg(const PageModel& m, bool backward, std::string* out) {
  const BinnedTimeline& bins = backward ? m.bwd_bins : m.fwd_bins;
  const size_t n = m.rows.rows.size();
  const double rh = n <= 16 ? 22 : n <= 32 ? 14 : 9;
  const double lane = rh * 0.42;
  constexpr double kTop = 52;
  const double height = kTop + n * rh + 34;
  const std::string dir = backward ? "bwd" : "fwd";
  OpenSvg(out, absl::StrCat("timeline-", dir, "-svg"), height,
          absl::StrCat(backward ? "backward" : "forward", " stage timeline"));
  double total = 0;
  for (double b : bins.bin_us) total += b;
  const double compute_floor = backward ? m.floors.bwd_compute_us : m.floors.fwd_compute_us;
  const double inter_floor = m.floors.inter_need_us;
  const double xmax = std::max({total, compute_floor, inter_floor, 1e-3}) * 1.02;
  auto x = [&](double us) { return kLeft + us / xmax * kPlotW; };

  // Stage boundaries.
  std::string grid;
  for (double start : bins.bin_start_us) {
    absl::StrAppend(&grid, "M", N(x(start)), " ", N(kTop), "v", N(n * rh));
  }
  absl::StrAppend(&grid, "M", N(x(total)), " ", N(kTop), "v", N(n * rh));
  absl::StrAppendFormat(out, "<path stroke=\"#e1e4e8\" d=\"%s\"/>\n", grid);

  std::string d_intra, d_inter, d_overlap, d_compute, d_return;
  for (size_t i = 0; i < n; ++i) {
    const double ty = kTop + i * rh + 1, cy = ty + lane;
    for (size_t b = 0; b < bins.cells[i].size(); ++b) {
      const auto& c = bins.cells[i][b];
      const double start = bins.bin_start_us[b];
      PathRect(c[4] >= 0.5 ? &d_inter : &d_intra, x(start), ty, x(start + c[0]) - x(start), lane);
      PathRect(&d_overlap, x(start), cy, x(start + c[1]) - x(start), lane);
      const double after = start + std::max(c[0], c[1]);
      PathRect(&d_compute, x(after), cy, x(after + c[2]) - x(after), lane);
      PathRect(&d_return, x(after + c[2]), ty, x(after + c[2] + c[3]) - x(after + c[2]), lane);
      // Home items computed while the returns fly: the overlap colour, on
      // the compute lane.
      PathRect(&d_overlap, x(after + c[2]), cy, x(after + c[2] + c[5]) - x(after + c[2]), lane);
    }
  }
  Path(out, d_intra, kIntraColour);
  Path(out, d_inter, kInterColour);
  Path(out, d_overlap, kOverlapColour);
  Path(out, d_compute, kComputeColour);
  Path(out, d_return, kReturnColour);

  const size_t stride = LabelStride(n);
  for (size_t i = 0; i < n; i += stride) {
    Text(out, kLeft - 6, kTop + i * rh + rh * 0.5 + 4, m.rows.rows[i].label,
         "text-anchor=\"end\" class=\"small\"");
  }
  // The modeled total and the floors, labelled above the rows.
  struct Marker {
    double us;
    std::string label, colour, dash, id;
  };
  std::vector<Marker> markers = {
      {total, absl::StrCat("modeled ", FormatUs(total)), "#111", "", "modeled"},
      {compute_floor, absl::StrCat("compute floor ", FormatUs(compute_floor)), kComputeColour,
       "5 3", "compute-floor"},
  };
  if (m.plan->spec.topology.num_nodes > 1 && m.profile_ok) {
    markers.push_back({inter_floor,
                       absl::StrCat("inter-node exact-need floor ", FormatUs(inter_floor)),
                       kInterColour, "5 3", "inter-floor"});
  }
  for (size_t k = 0; k < markers.size(); ++k) {
    const Marker& mk = markers[k];
    const double mx = x(mk.us);
    absl::StrAppendFormat(out,
                          "<line x1=\"%s\" x2=\"%s\" y1=\"%s\" y2=\"%s\" stroke=\"%s\" "
                          "stroke-width=\"2\"%s/>\n",
                          N(mx), N(mx), N(12 + k * 13), N(kTop + n * rh), mk.colour,
                          mk.dash.empty() ? "" : absl::StrCat(" stroke-dasharray=\"", mk.dash, "\""));
    const bool right = mx > kLeft + kPlotW * 0.7;
    Text(out, right ? mx - 4 : mx + 4, 21 + k * 13, mk.label,
         absl::StrCat("class=\"small halo\" id=\"", dir, "-", mk.id, "\"",
                      right ? " text-anchor=\"end\"" : ""));
  }
  // Time axis.
  const double axis_y = kTop + n * rh;
  for (int i = 0; i <= 5; ++i) {
    const double us = xmax / 1.02 * i / 5;
    absl::StrAppendFormat(out, "<line x1=\"%s\" x2=\"%s\" y1=\"%s\" y2=\"%s\" stroke=\"#555\"/>\n",
                          N(x(us)), N(x(us)), N(axis_y), N(axis_y + 5));
    Text(out, x(us), axis_y + 17, FormatUs(us),
         i == 0 ? "text-anchor=\"start\" class=\"small\"" : "text-anchor=\"middle\" class=\"small\"");
  }
  absl::StrAppendFormat(out,
                        "<g data-hover=\"timeline\" data-dir=\"%s\" data-x0=\"%s\" data-w=\"%s\" "
                        "data-xmax=\"%s\" data-y0=\"%s\" data-rh=\"%s\" data-n=\"%d\">"
                        "<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" "
                        "fill=\"transparent\"/></g>\n",
                        dir, N(kLeft), N(kPlotW), absl::StrFormat("%.6g", xmax), N(kTop), N(rh), n,
                        N(kLeft), N(kTop), N(kPlotW), N(n * rh));
  out->append("</svg>\n");
}

}  // namespace hsap::viewer::internal
