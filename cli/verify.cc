// PENDING: replaced by the real subcommand before commit.
#include "cli/command.h"
namespace cubist::cli {
void RegisterVerify(CLI::App& app, Globals& g) {
  app.add_subcommand("verify", "(pending)");
}
}  // namespace cubist::cli
