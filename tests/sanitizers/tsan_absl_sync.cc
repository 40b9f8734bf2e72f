// ThreadSanitizer support for the uninstrumented system abseil.
//
// Debian's libabsl_synchronization.so is not built with -fsanitize=thread, so
// TSan cannot see that absl::Mutex, absl::CondVar and absl::Notification
// order memory: without help every ABSL_GUARDED_BY member would be reported
// as a data race. This file, linked into every binary of --config=tsan
// (.bazelrc: --custom_malloc), defines the synchronization entry points in
// the executable, where they take precedence over the shared library's
// (ELF interposition). Each one tells TSan what happens, the way abseil's own
// TSan build does (ABSL_TSAN_MUTEX_* in mutex.cc), then calls the library's
// definition found with dlsym(RTLD_NEXT):
//
//   lock:    __tsan_mutex_pre_lock, real call, __tsan_mutex_post_lock
//   unlock:  __tsan_mutex_pre_unlock, real call, __tsan_mutex_post_unlock
//   waits:   Await / CondVar::Wait release and reacquire the mutex
//   Notify:  release on the notified flag; a successful wait acquires it
//            (HasBeenNotified is inline: an instrumented acquire load).
//
// The real calls run with TSan's memory tracking ignored: abseil evaluates
// absl::Condition predicates (project code) inside Unlock on behalf of other
// threads, a read TSan would otherwise misattribute.
//
// It also embeds tests/sanitizers/tsan.supp as __tsan_default_suppressions,
// so the suppressions apply wherever the test runs (no path in TSAN_OPTIONS).
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

// In libtsan but not declared by gcc 12's <sanitizer/tsan_interface.h>.
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();

#ifndef ABSL_HAVE_THREAD_SANITIZER
#error "tsan_absl_sync.cc is for --config=tsan builds only"
#endif

namespace {

void* Real(const char* mangled) {
  void* f = dlsym(RTLD_NEXT, mangled);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found after the executable: %s\n", mangled,
                 dlerror());
    std::abort();
  }
  return f;
}

// Runs the library's code with memory accesses ignored (see the banner).
struct IgnoreAccesses {
  IgnoreAccesses() { __tsan_ignore_thread_begin(); }
  ~IgnoreAccesses() { __tsan_ignore_thread_end(); }
};

// abseil calls its own entry points through the PLT too (WaitWithTimeout
// calls WaitWithDeadline, Notify calls Mutex::Lock), which lands in these
// wrappers again: only the outermost one on a thread annotates.
thread_local int wrapper_depth = 0;
struct Outermost {
  const bool outer = wrapper_depth++ == 0;
  ~Outermost() { --wrapper_depth; }
};

// `real` is the library's definition; inner calls go straight to it.
#define HSAP_REAL(type, mangled, ...)                                      \
  static const auto real = reinterpret_cast<type>(Real(mangled));          \
  Outermost outermost;                                                     \
  if (!outermost.outer) return real(__VA_ARGS__)

constexpr unsigned kRead = __tsan_mutex_read_lock;

void Released(void* mu, unsigned flags) {
  __tsan_mutex_pre_unlock(mu, flags);
  __tsan_mutex_post_unlock(mu, flags);
}
void Acquired(void* mu, unsigned flags) {
  __tsan_mutex_pre_lock(mu, flags);
  __tsan_mutex_post_lock(mu, flags, 0);
}

// Notification's flag follows its mutex (absl/synchronization/notification.h).
void* NotifiedFlag(const absl::Notification* n) {
  static_assert(sizeof(absl::Notification) == 2 * sizeof(absl::Mutex), "layout changed");
  return const_cast<char*>(reinterpret_cast<const char*>(n) + sizeof(absl::Mutex));
}

}  // namespace

extern "C" const char* __tsan_default_suppressions() {
  return
#include "tests/sanitizers/tsan_supp.inc"
      ;
}

namespace absl {
ABSL_NAMESPACE_BEGIN

Mutex::~Mutex() {
  static const auto real = reinterpret_cast<void (*)(Mutex*)>(Real("_ZN4absl7debian35MutexD1Ev"));
  Outermost outermost;
  if (outermost.outer) __tsan_mutex_destroy(this, 0);
  IgnoreAccesses ignore;
  real(this);
}

void Mutex::Lock() {
  HSAP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv", this);
  __tsan_mutex_pre_lock(this, 0);
  { IgnoreAccesses ignore; real(this); }
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::ReaderLock() {
  HSAP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv", this);
  __tsan_mutex_pre_lock(this, kRead);
  { IgnoreAccesses ignore; real(this); }
  __tsan_mutex_post_lock(this, kRead, 0);
}

bool Mutex::TryLock() {
  HSAP_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv", this);
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  bool ok;
  { IgnoreAccesses ignore; ok = real(this); }
  __tsan_mutex_post_lock(this, __tsan_mutex_try_lock | (ok ? 0 : __tsan_mutex_try_lock_failed), 0);
  return ok;
}

bool Mutex::ReaderTryLock() {
  HSAP_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv", this);
  const unsigned f = kRead | __tsan_mutex_try_lock;
  __tsan_mutex_pre_lock(this, f);
  bool ok;
  { IgnoreAccesses ignore; ok = real(this); }
  __tsan_mutex_post_lock(this, f | (ok ? 0 : __tsan_mutex_try_lock_failed), 0);
  return ok;
}

void Mutex::Unlock() {
  HSAP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv", this);
  __tsan_mutex_pre_unlock(this, 0);
  { IgnoreAccesses ignore; real(this); }
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() {
  HSAP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv", this);
  __tsan_mutex_pre_unlock(this, kRead);
  { IgnoreAccesses ignore; real(this); }
  __tsan_mutex_post_unlock(this, kRead);
}

void Mutex::LockWhen(const Condition& cond) {
  HSAP_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE", this, cond);
  __tsan_mutex_pre_lock(this, 0);
  { IgnoreAccesses ignore; real(this, cond); }
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  HSAP_REAL(void (*)(Mutex*, const Condition&),
            "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE", this, cond);
  __tsan_mutex_pre_lock(this, kRead);
  { IgnoreAccesses ignore; real(this, cond); }
  __tsan_mutex_post_lock(this, kRead, 0);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  HSAP_REAL(bool (*)(Mutex*, const Condition&, Duration),
            "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE", this, cond, timeout);
  __tsan_mutex_pre_lock(this, 0);
  bool ok;
  { IgnoreAccesses ignore; ok = real(this, cond, timeout); }
  __tsan_mutex_post_lock(this, 0, 0);  // held whether or not cond became true
  return ok;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  HSAP_REAL(bool (*)(Mutex*, const Condition&, Time),
            "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE", this, cond, deadline);
  __tsan_mutex_pre_lock(this, 0);
  bool ok;
  { IgnoreAccesses ignore; ok = real(this, cond, deadline); }
  __tsan_mutex_post_lock(this, 0, 0);
  return ok;
}

void Mutex::Await(const Condition& cond) {
  HSAP_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE", this, cond);
  Released(this, 0);
  { IgnoreAccesses ignore; real(this, cond); }
  Acquired(this, 0);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  HSAP_REAL(bool (*)(Mutex*, const Condition&, Duration),
            "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE", this, cond, timeout);
  Released(this, 0);
  bool ok;
  { IgnoreAccesses ignore; ok = real(this, cond, timeout); }
  Acquired(this, 0);
  return ok;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  HSAP_REAL(bool (*)(Mutex*, const Condition&, Time),
            "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE", this, cond, deadline);
  Released(this, 0);
  bool ok;
  { IgnoreAccesses ignore; ok = real(this, cond, deadline); }
  Acquired(this, 0);
  return ok;
}

void CondVar::Wait(Mutex* mu) {
  HSAP_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE", this, mu);
  Released(mu, 0);
  { IgnoreAccesses ignore; real(this, mu); }
  Acquired(mu, 0);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  HSAP_REAL(bool (*)(CondVar*, Mutex*, Duration),
            "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE", this, mu, timeout);
  Released(mu, 0);
  bool timed_out;
  { IgnoreAccesses ignore; timed_out = real(this, mu, timeout); }
  Acquired(mu, 0);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  HSAP_REAL(bool (*)(CondVar*, Mutex*, Time),
            "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE", this, mu, deadline);
  Released(mu, 0);
  bool timed_out;
  { IgnoreAccesses ignore; timed_out = real(this, mu, deadline); }
  Acquired(mu, 0);
  return timed_out;
}

void Notification::Notify() {
  HSAP_REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv", this);
  __tsan_release(NotifiedFlag(this));
  IgnoreAccesses ignore;
  real(this);
}

void Notification::WaitForNotification() const {
  HSAP_REAL(void (*)(const Notification*),
            "_ZNK4absl7debian312Notification19WaitForNotificationEv", this);
  { IgnoreAccesses ignore; real(this); }
  __tsan_acquire(NotifiedFlag(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  HSAP_REAL(bool (*)(const Notification*, Duration),
            "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE", this, timeout);
  bool notified;
  { IgnoreAccesses ignore; notified = real(this, timeout); }
  if (notified) __tsan_acquire(NotifiedFlag(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  HSAP_REAL(bool (*)(const Notification*, Time),
            "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE", this, deadline);
  bool notified;
  { IgnoreAccesses ignore; notified = real(this, deadline); }
  if (notified) __tsan_acquire(NotifiedFlag(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
