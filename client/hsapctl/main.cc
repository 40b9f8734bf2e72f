// hsapctl entry point: picks the subcommand, parses its flags, runs it.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "client/hsapctl/subcommands.h"

namespace {

// Every subcommand, once (each in its own file).
const hsap::hsapctl::Subcommand kSubcommands[] = {
    {"plan", "compile a plan offline and print it or its statistics",
     hsap::hsapctl::RunPlanCommand},
    {"plans", "list|show <key>|stats|evict <key>...|evict --all: a daemon's plan cache",
     hsap::hsapctl::RunPlansCommand},
    {"cluster", "a daemon's view of its cluster: nodes, states, devices",
     hsap::hsapctl::RunClusterCommand},
    {"regions", "registered regions (every session's over --target with the token)",
     hsap::hsapctl::RunRegionsCommand},
};

void PrintUsage() {
  std::fprintf(stderr, "usage: hsapctl <subcommand> [--flags]\n\nsubcommands:\n");
  for (const auto& s : kSubcommands) std::fprintf(stderr, "  %-10s %s\n", s.name, s.summary);
  std::fprintf(stderr,
               "\nplans, cluster and regions ask a running hsapd: --socket=/run/hsap/hsapd.sock "
               "(default)\nor --target=host:port --token_file=FILE; --format=table|json.\n"
               "`hsapctl <subcommand> --help` lists the flags.\n");
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "hsapctl <subcommand> [--flags]; subcommands: plan, plans, cluster, regions");
  if (argc < 2 || argv[1][0] == '-') {
    if (argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
      PrintUsage();
      return 0;
    }
    PrintUsage();
    return 2;
  }
  const char* name = argv[1];
  for (const auto& s : kSubcommands) {
    if (std::strcmp(s.name, name) != 0) continue;
    // Parse the flags after the subcommand word as if it were not there.
    std::vector<char*> rest = {argv[0]};
    for (int i = 2; i < argc; ++i) rest.push_back(argv[i]);
    std::vector<char*> positional =
        absl::ParseCommandLine(static_cast<int>(rest.size()), rest.data());
    std::vector<std::string> args(positional.begin() + 1, positional.end());
    return s.run(args);
  }
  std::fprintf(stderr, "hsapctl: unknown subcommand \"%s\"\n\n", name);
  PrintUsage();
  return 2;
}
