// What time it is, and waiting: behind an interface so that retry and backoff logic
// can be tested in microseconds with a clock that only pretends to sleep.
//
// Thread safety: Clock::Real() is safe to use from any thread. Fakes in tests decide
// for themselves.
#ifndef CUBIST_BASE_CLOCK_H_
#define CUBIST_BASE_CLOCK_H_

#include "absl/time/time.h"

namespace cubist {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  virtual void SleepFor(absl::Duration duration) = 0;

  // The system clock (absl::Now, absl::SleepFor). Never destroyed.
  static Clock& Real();
};

}  // namespace cubist

#endif  // CUBIST_BASE_CLOCK_H_
