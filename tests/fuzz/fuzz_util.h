// Helpers shared by the fuzz targets of tests/fuzz/.
#ifndef HSAP_TESTS_FUZZ_FUZZ_UTIL_H_
#define HSAP_TESTS_FUZZ_FUZZ_UTIL_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <vector>

// A property of the code under test failed: report and crash, so libFuzzer
// saves the input.
#define FUZZ_CHECK(cond)                                                           \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                \
    }                                                                              \
  } while (0)

namespace hsap::fuzz {

// Usually in [-2, small_max]; sometimes any int64, in [-big_max, big_max],
// or big_max itself (the edges validation must handle).
inline int64_t Value(FuzzedDataProvider& in, int64_t small_max, int64_t big_max) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return in.ConsumeIntegral<int64_t>();
    case 1: return in.ConsumeIntegralInRange<int64_t>(-big_max, big_max);
    case 2: return big_max;
    default: return in.ConsumeIntegralInRange<int64_t>(-2, small_max);
  }
}

// Inputs per mode of a target, printed when the run ends (libFuzzer exits
// through exit()): how a run's executions divided among its modes.
//   static ModeCounts& counts = *new ModeCounts("peer_tls_fuzzer", {"certificate", ...});
//   counts.Add(mode);
// REQUIRES: never destroyed (it is read at exit, after static destructors
// registered later have run): allocate it with new.
class ModeCounts {
 public:
  ModeCounts(const char* target, std::initializer_list<const char*> names)
      : target_(target), names_(names), counts_(names_.size()) {
    Registry().push_back(this);
    if (Registry().size() == 1) std::atexit([] {
      for (ModeCounts* m : Registry()) m->Print();
    });
  }
  void Add(size_t mode) { ++counts_[mode]; }

 private:
  static std::vector<ModeCounts*>& Registry() {
    static std::vector<ModeCounts*>* r = new std::vector<ModeCounts*>;
    return *r;
  }
  void Print() const {
    std::fprintf(stderr, "%s inputs by mode:", target_);
    for (size_t i = 0; i < names_.size(); ++i) {
      std::fprintf(stderr, " %s %llu", names_[i], static_cast<unsigned long long>(counts_[i]));
    }
    std::fprintf(stderr, "\n");
  }
  const char* target_;
  std::vector<const char*> names_;
  std::vector<uint64_t> counts_;
};

// At most one expensive path (a sleep, a re-measured link, 65 calls) per
// `every` inputs. A corpus keeps the inputs that take such paths (they add
// coverage), so without a budget they would fill a run's time; past the
// budget the input runs its cheap path. Consume the input's choice first,
// then ask, so that the bytes mean the same either way.
//   static Budget slow(64);  slow.Tick();  ...  if (wants_slow && slow.Take()) ...
class Budget {
 public:
  explicit Budget(uint64_t every) : every_(every) {}
  void Tick() { ++inputs_; }
  bool Take() {
    if (taken_ && inputs_ - last_ < every_) return false;
    taken_ = true;
    last_ = inputs_;
    return true;
  }

 private:
  uint64_t every_, inputs_ = 0, last_ = 0;
  bool taken_ = false;
};

// a + b saturated to the int64 range.
inline int64_t AddSat(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? (b > 0 ? INT64_MAX : INT64_MIN) : r;
}

}  // namespace hsap::fuzz

#endif  // HSAP_TESTS_FUZZ_FUZZ_UTIL_H_
