// ThreadSanitizer annotations for Debian's abseil, linked into every executable of a
// CUBIST_SANITIZE=thread build (tests/sanitizers/CMakeLists.txt). Never part of a normal build.
//
// Why: Debian builds libabsl_synchronization without TSan, and absl::Mutex synchronises
// with its own atomics and futex calls, which TSan cannot see. Without help every
// access guarded by an absl::Mutex is reported as a data race. These definitions
// interpose the library's exported Mutex, Condition and Barrier functions (the
// executable's definitions win over the shared library's), call the real ones through
// dlsym(RTLD_NEXT), and tell TSan about the happens-before edges they create.
//
// Condition functions run inside the library while another thread may have just
// unlocked, so every lock and unlock also synchronises on one global address, and
// condition evaluation acquires and releases it. This over-approximates (it can hide a
// race between critical sections of two different absl::Mutexes); std::mutex and
// atomics are untouched and still checked precisely.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "absl/base/options.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/mutex.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

#define CUBIST_TSAN_STR2(x) #x
#define CUBIST_TSAN_STR(x) CUBIST_TSAN_STR2(x)

namespace {

#if ABSL_OPTION_USE_INLINE_NAMESPACE
constexpr char kNs[] = CUBIST_TSAN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
#else
constexpr char kNs[] = "";
#endif

char g_all_absl_mutexes;

// The real function, by its mangled name: "_ZN[K]4absl<len><ns><tail>". `tail` starts
// with 'K' for const member functions.
template <typename Fn>
Fn Real(const char* tail) {
  char name[256];
  bool is_const = tail[0] == 'K';
  if (sizeof(kNs) > 1) {
    std::snprintf(name, sizeof(name), "_ZN%s4absl%zu%s%s", is_const ? "K" : "",
                  sizeof(kNs) - 1, kNs, tail + (is_const ? 1 : 0));
  } else {
    std::snprintf(name, sizeof(name), "_ZN%s4absl%s", is_const ? "K" : "",
                  tail + (is_const ? 1 : 0));
  }
  void* p = ::dlsym(RTLD_NEXT, name);
  if (p == nullptr) {
    std::fprintf(stderr, "tsan_absl_mutex: %s not found in the abseil libraries\n", name);
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

void Acquired(void* mu) {
  __tsan_acquire(mu);
  __tsan_acquire(&g_all_absl_mutexes);
}
void Releasing(void* mu) {
  __tsan_release(mu);
  __tsan_release(&g_all_absl_mutexes);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex4LockEv");
  real(this);
  Acquired(this);
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex6UnlockEv");
  Releasing(this);
  real(this);
}

void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  real(this);
  Acquired(this);
}

void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  Releasing(this);
  real(this);
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  bool ok = real(this);
  if (ok) Acquired(this);
  return ok;
}

bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  bool ok = real(this);
  if (ok) Acquired(this);
  return ok;
}

void Mutex::LockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(
      "5Mutex8LockWhenERKNS0_9ConditionE");
  real(this, cond);
  Acquired(this);
}

void Mutex::Await(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(
      "5Mutex5AwaitERKNS0_9ConditionE");
  Releasing(this);
  real(this, cond);
  Acquired(this);
}

bool Condition::Eval() const {
  static auto real = Real<bool (*)(const Condition*)>("K9Condition4EvalEv");
  __tsan_acquire(&g_all_absl_mutexes);
  bool r = real(this);
  __tsan_release(&g_all_absl_mutexes);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  Releasing(mu);
  real(this, mu);
  Acquired(mu);
}

bool Barrier::Block() {
  static auto real = Real<bool (*)(Barrier*)>("7Barrier5BlockEv");
  __tsan_release(this);
  bool last = real(this);
  __tsan_acquire(this);
  return last;
}

ABSL_NAMESPACE_END
}  // namespace absl
