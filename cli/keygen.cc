// PENDING: replaced by the real subcommand before commit.
#include "cli/command.h"
namespace cubist::cli {
void RegisterKeygen(CLI::App& app, Globals& g) {
  app.add_subcommand("keygen", "(pending)");
}
}  // namespace cubist::cli
