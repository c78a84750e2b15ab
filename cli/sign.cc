// PENDING: replaced by the real subcommand before commit.
#include "cli/command.h"
namespace cubist::cli {
void RegisterSign(CLI::App& app, Globals& g) {
  app.add_subcommand("sign", "(pending)");
}
}  // namespace cubist::cli
