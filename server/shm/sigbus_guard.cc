#include "server/shm/sigbus_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace hsap::shm {
namespace {

// One mapping. begin == 0: free (or being cleared). All fields are read by
// the signal handler, so they are lock-free atomics.
struct Slot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<uint32_t> busy{0};  // handlers inside this slot now
  std::atomic<uint64_t> first_fault{SigbusGuard::kNoFault};
};
static_assert(std::atomic<uintptr_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

Slot g_slots[SigbusGuard::kSlots];
// Slots [0, g_high_water) may be in use: the handler scans only those.
std::atomic<int> g_high_water{0};
std::atomic<int> g_live{0};
struct sigaction g_previous;  // written once, before the handler is live
uintptr_t g_page_size = 4096;  // sysconf is not async-signal-safe: read once

// Allocation of slots (never touched by the handler).
absl::Mutex g_alloc_mu;
std::vector<int>* FreeSlots() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_alloc_mu) {
  static auto* free_slots = new std::vector<int>();
  return free_slots;
}

void PassOn(int sig, siginfo_t* info, void* context) {
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN &&
      g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  // The default action: die with SIGBUS (a fault re-executes and faults
  // again; a raised one is delivered when the handler returns).
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGBUS, &dfl, nullptr);
  if (info == nullptr || info->si_code <= 0) raise(SIGBUS);
}

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  // si_code > 0: sent by the kernel for a fault (not kill/raise/sigqueue).
  if (info != nullptr && info->si_code > 0) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
    const int high = g_high_water.load(std::memory_order_seq_cst);
    for (int i = 0; i < high; ++i) {
      Slot& s = g_slots[i];
      s.busy.fetch_add(1, std::memory_order_seq_cst);
      const uintptr_t begin = s.begin.load(std::memory_order_seq_cst);
      const uintptr_t end = s.end.load(std::memory_order_seq_cst);
      if (begin != 0 && addr >= begin && addr < end) {
        const uintptr_t page = addr & ~(g_page_size - 1);
        // A raw syscall: no interceptor (sanitizers) runs inside the handler.
        const long mapped = syscall(SYS_mmap, page, end - page, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        const uint64_t offset = page - begin;
        uint64_t seen = s.first_fault.load(std::memory_order_relaxed);
        while (offset < seen &&
               !s.first_fault.compare_exchange_weak(seen, offset, std::memory_order_seq_cst)) {
        }
        s.busy.fetch_sub(1, std::memory_order_seq_cst);
        if (mapped == static_cast<long>(page)) {
          errno = saved_errno;
          return;  // the faulting access resumes on zero pages
        }
        break;
      }
      s.busy.fetch_sub(1, std::memory_order_seq_cst);
    }
  }
  errno = saved_errno;
  PassOn(sig, info, context);
}

}  // namespace

void SigbusGuard::Install() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_page_size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    struct sigaction action = {};
    action.sa_sigaction = &OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &g_previous);
  });
}

absl::StatusOr<std::unique_ptr<SigbusGuard::Registration>> SigbusGuard::Register(void* begin,
                                                                                uint64_t size) {
  Install();
  int slot;
  {
    absl::MutexLock lock(&g_alloc_mu);
    std::vector<int>* free_slots = FreeSlots();
    if (!free_slots->empty()) {
      slot = free_slots->back();
      free_slots->pop_back();
    } else if (g_high_water.load() < kSlots) {
      slot = g_high_water.load();
      g_high_water.store(slot + 1, std::memory_order_seq_cst);
    } else {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the daemon already holds ", kSlots, " client mappings, the most it can guard"));
    }
  }
  Slot& s = g_slots[slot];
  s.first_fault.store(kNoFault, std::memory_order_seq_cst);
  s.end.store(reinterpret_cast<uintptr_t>(begin) + size, std::memory_order_seq_cst);
  s.begin.store(reinterpret_cast<uintptr_t>(begin), std::memory_order_seq_cst);
  g_live.fetch_add(1, std::memory_order_relaxed);
  return std::unique_ptr<Registration>(new Registration(slot));
}

SigbusGuard::Registration::~Registration() {
  Slot& s = g_slots[slot_];
  s.begin.store(0, std::memory_order_seq_cst);
  // A handler that read the old range before the store above is counted in
  // busy (it increments before reading): wait for it to leave.
  while (s.busy.load(std::memory_order_seq_cst) != 0) sched_yield();
  s.end.store(0, std::memory_order_seq_cst);
  g_live.fetch_sub(1, std::memory_order_relaxed);
  absl::MutexLock lock(&g_alloc_mu);
  FreeSlots()->push_back(slot_);
}

uint64_t SigbusGuard::Registration::first_fault_offset() const {
  return g_slots[slot_].first_fault.load(std::memory_order_seq_cst);
}

int SigbusGuard::live() { return g_live.load(std::memory_order_relaxed); }

}  // namespace hsap::shm
