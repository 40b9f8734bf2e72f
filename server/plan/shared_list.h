// SharedList<T>: an immutable list with value semantics whose copies share
// one heap array. A plan repeats the same lists many times: the ranks of a
// head group (ulysses, usp, hsap) run the same work items on their own
// heads, every backward stage repeats its forward stage's items and
// segments, and the dK/dV returns mirror the K/V transfers' segments. Shared,
// a T = 1M, P = 512 hsap plan holds its ~3 M work items once instead of
// sixteen times (docs/planner.md, "Plan memory").
//
// A list may also be a view of a run of a larger shared array (View()): the
// compiler keeps each rank's segments, transfers and work items in a few
// arrays (pools) instead of one heap array per transfer or per stage list.
//
// Reading is that of a const std::vector<T> (iteration, size, indexing).
// Writing (push_back, Mutable())
// first copies the array when another list shares it (copy on write), so a
// list never changes under another. Not synchronized for writing: a plan is
// built by one thread and immutable once published; concurrent readers and
// copies are safe (std::shared_ptr's count is atomic).
//
// Example:
//   SharedList<int> a = std::vector<int>{1, 2};
//   SharedList<int> b = a;  // shares a's array
//   b.push_back(3);         // b copies first: a is still {1, 2}
#ifndef HSAP_SERVER_PLAN_SHARED_LIST_H_
#define HSAP_SERVER_PLAN_SHARED_LIST_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

namespace hsap::plan {

template <typename T>
class SharedList {
 public:
  using value_type = T;
  using const_iterator = const T*;
  using iterator = const T*;

  SharedList() = default;
  SharedList(std::vector<T> v)  // NOLINT: implicit, a list is built as a vector
      : p_(v.empty() ? nullptr : std::make_shared<std::vector<T>>(std::move(v))) {}
  SharedList(std::initializer_list<T> init) : SharedList(std::vector<T>(init)) {}

  // Elements [begin, begin + size) of `pool`, which may grow later (the view
  // keeps offsets) but must not otherwise change.
  static SharedList View(std::shared_ptr<std::vector<T>> pool, size_t begin, size_t size) {
    SharedList l;
    if (size == 0) return l;
    if (begin + size >= kWhole) {  // past a view's 32-bit reach: a copy of its own
      return SharedList(std::vector<T>(pool->begin() + begin, pool->begin() + begin + size));
    }
    l.p_ = std::move(pool);
    l.begin_ = static_cast<uint32_t>(begin);
    l.size_ = static_cast<uint32_t>(size);
    return l;
  }

  const T* begin() const { return p_ ? p_->data() + begin_ : nullptr; }
  const T* end() const { return p_ ? p_->data() + begin_ + size() : nullptr; }
  size_t size() const { return !p_ ? 0 : whole() ? p_->size() : size_; }
  bool empty() const { return size() == 0; }
  const T& operator[](size_t i) const { return begin()[i]; }
  const T& front() const { return *begin(); }
  const T& back() const { return end()[-1]; }
  // As a vector (a view is copied out once per call: readers that need a
  // vector of a view pay a copy).
  std::vector<T> ToVector() const { return std::vector<T>(begin(), end()); }

  // The array to write into: copied first if another list shares it or
  // this list is a view.
  std::vector<T>& Mutable() {
    if (!p_) {
      p_ = std::make_shared<std::vector<T>>();
    } else if (!whole() || p_.use_count() > 1) {
      p_ = std::make_shared<std::vector<T>>(begin(), end());
      begin_ = 0;
      size_ = kWhole;
    }
    return *p_;
  }
  void push_back(const T& x) { Mutable().push_back(x); }
  void push_back(T&& x) { Mutable().push_back(std::move(x)); }
  void reserve(size_t n) { Mutable().reserve(n); }
  void clear() { *this = SharedList(); }

  // Elements [begin, begin + size) of this list, sharing its array.
  // REQUIRES: begin + size <= size().
  SharedList Sub(size_t begin, size_t size) const {
    if (size == 0) return SharedList();
    if (begin == 0 && size == this->size()) return *this;
    return View(p_, offset() + begin, size);
  }

  // Index of the first element in the array (0 unless a view).
  size_t offset() const { return begin_; }

  // Whether both lists read the same elements of the same array.
  bool SharesWith(const SharedList& o) const {
    return p_ != nullptr && p_ == o.p_ && begin_ == o.begin_ && size() == o.size();
  }
  // The array behind the list (nullptr when empty) and the bytes it holds,
  // to count shared arrays once.
  const void* Identity() const { return p_.get(); }
  size_t ArrayBytes() const { return p_ ? p_->capacity() * sizeof(T) : 0; }

  bool operator==(const SharedList& o) const {
    return SharesWith(o) || std::equal(begin(), end(), o.begin(), o.end());
  }
  bool operator!=(const SharedList& o) const { return !(*this == o); }

 private:
  // Views keep 32-bit offsets (a list is 24 bytes: plans hold millions).
  static constexpr uint32_t kWhole = UINT32_MAX;
  bool whole() const { return size_ == kWhole; }
  std::shared_ptr<std::vector<T>> p_;
  uint32_t begin_ = 0;
  uint32_t size_ = kWhole;  // kWhole: the whole array
};

}  // namespace hsap::plan

#endif  // HSAP_SERVER_PLAN_SHARED_LIST_H_
