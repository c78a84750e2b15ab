// PENDING: replaced by the real subcommand before commit.
#include "cli/command.h"
namespace cubist::cli {
void RegisterDoctor(CLI::App& app, Globals& g) {
  app.add_subcommand("doctor", "(pending)");
}
}  // namespace cubist::cli
