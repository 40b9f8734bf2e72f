// `--html=FILE` of `hsapctl plan` and `hsapctl plans show`: writes the
// plan's page (server/viewer/plan_page.h), a self-contained HTML file that
// opens in any browser without a network.
#ifndef HSAP_CLIENT_HSAPCTL_PLAN_HTML_H_
#define HSAP_CLIENT_HSAPCTL_PLAN_HTML_H_

#include <string>

#include "server/plan/plan.h"
#include "server/viewer/plan_page.h"

namespace hsap::hsapctl {

// The --html flag: "" when not given.
std::string HtmlPath();

// Writes the page of `plan` to `path` and prints "wrote plan page PATH
// (SIZE)" on stdout. Returns the exit code: 0, or 1 when the file cannot be
// written (the message on stderr, prefixed with `command`).
int WritePlanHtml(const plan::Plan& plan, const viewer::PageInfo& info, const std::string& path,
                  const char* command);

}  // namespace hsap::hsapctl

#endif  // HSAP_CLIENT_HSAPCTL_PLAN_HTML_H_
