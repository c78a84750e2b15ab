// PENDING: replaced by the real subcommand before commit.
#include "cli/command.h"
namespace cubist::cli {
void RegisterFetch(CLI::App& app, Globals& g) {
  app.add_subcommand("fetch", "(pending)");
}
}  // namespace cubist::cli
