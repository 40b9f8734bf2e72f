#include "client/hsapctl/plan_html.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/flags/flag.h"
#include "server/viewer/page_text.h"

ABSL_FLAG(std::string, html, "",
          "plan, plans show: write the plan's page (self-contained HTML: layout, load, traffic, "
          "stage timeline) to this file instead of printing the plan");

namespace hsap::hsapctl {

std::string HtmlPath() { return absl::GetFlag(FLAGS_html); }

int WritePlanHtml(const plan::Plan& plan, const viewer::PageInfo& info, const std::string& path,
                  const char* command) {
  const std::string html = viewer::PlanPageHtml(plan, info);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(html.data(), static_cast<std::streamsize>(html.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "%s: --html=%s: cannot write: %s\n", command, path.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::printf("wrote plan page %s (%s)\n", path.c_str(),
              viewer::FormatBytes(static_cast<double>(html.size())).c_str());
  return 0;
}

}  // namespace hsap::hsapctl
