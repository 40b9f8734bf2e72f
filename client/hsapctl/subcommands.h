// hsapctl: the operator CLI. Each subcommand lives in its own file and is
// listed once in main.cc; the subcommand word comes first and its flags
// follow (`hsapctl plan --ranks=8 --cu_seqlens_file=docs.txt`).
//
// A subcommand gets the positional arguments left after flag parsing and
// returns the process exit code: 0 on success, 1 when the request failed
// (the message is printed on stderr), 2 for usage errors.
#ifndef HSAP_CLIENT_HSAPCTL_SUBCOMMANDS_H_
#define HSAP_CLIENT_HSAPCTL_SUBCOMMANDS_H_

#include <string>
#include <vector>

namespace hsap::hsapctl {

struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

// `hsapctl plan`: compiles a plan offline (plan_command.cc).
int RunPlanCommand(const std::vector<std::string>& args);

// Ask a running hsapd (daemon_commands.cc; connection.h: --socket, or
// --target with --token_file; --format=table|json):
// `hsapctl plans list|show <key>|stats|evict <key>...|evict --all`.
int RunPlansCommand(const std::vector<std::string>& args);
// `hsapctl cluster`: every node's state, heartbeat age and devices.
int RunClusterCommand(const std::vector<std::string>& args);
// `hsapctl regions`: registered regions (all sessions' over --target).
int RunRegionsCommand(const std::vector<std::string>& args);

}  // namespace hsap::hsapctl

#endif  // HSAP_CLIENT_HSAPCTL_SUBCOMMANDS_H_
