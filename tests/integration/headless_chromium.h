// Test helper: Debian's `chromium` in headless mode, as a bounded child
// process (its own process group, killed and reaped at the deadline or when
// it exits), with a fresh empty profile per run and no network of its own
// (background networking, component updates, sync and QUIC off).
//
// Example:
//   absl::StatusOr<ChromiumRun> run = DumpDom("http://127.0.0.1:9464/plans");
//   ASSERT_TRUE(run.ok()) << run.status();
//   EXPECT_EQ(ErrorsElement(run->dom), "");
#ifndef HSAP_TESTS_INTEGRATION_HEADLESS_CHROMIUM_H_
#define HSAP_TESTS_INTEGRATION_HEADLESS_CHROMIUM_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hsap::testing {

// The chromium binary: $HSAP_CHROMIUM, else /usr/bin/chromium. NOT_FOUND
// when it is not executable (scripts/install_deps.sh installs it; tests fail
// on that, never skip).
absl::StatusOr<std::string> ChromiumBinary();

struct ChromiumRun {
  std::string dom;     // --dump-dom output (stdout); empty for screenshots
  std::string log;     // stderr (--enable-logging=stderr --v=0)
  double seconds = 0;  // wall time of the process
  // The page's console messages: the log's "CONSOLE" lines (chromium logs
  // every console.log/error and every uncaught exception there).
  std::vector<std::string> console;
};

// Loads `url` and prints the DOM after the load event. DEADLINE_EXCEEDED
// when chromium runs past `timeout` (it is killed), INTERNAL when it exits
// non-zero (with the end of its log).
absl::StatusOr<ChromiumRun> DumpDom(const std::string& url,
                                    absl::Duration timeout = absl::Seconds(60));

// Loads `url` in a `width` x `height` window and writes a PNG of it to
// `png_path`. Errors as DumpDom's, and NOT_FOUND when no PNG was written.
absl::StatusOr<ChromiumRun> Screenshot(const std::string& url, const std::string& png_path,
                                       int width, int height,
                                       absl::Duration timeout = absl::Seconds(60));

// The text inside <pre id="errors" ...>...</pre> of a dumped DOM, or
// "<no errors element>" when there is none.
std::string ErrorsElement(const std::string& dom);

// The text of the first element with id `id` in a dumped DOM ("" if none).
std::string ElementTextById(const std::string& dom, const std::string& id);

}  // namespace hsap::testing

#endif  // HSAP_TESTS_INTEGRATION_HEADLESS_CHROMIUM_H_
