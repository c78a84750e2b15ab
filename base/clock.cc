#include "base/clock.h"

#include "absl/time/clock.h"

namespace cubist {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  void SleepFor(absl::Duration duration) override { absl::SleepFor(duration); }
};

}  // namespace

Clock& Clock::Real() {
  static RealClock* const clock = new RealClock();  // no destructor at exit
  return *clock;
}

}  // namespace cubist
