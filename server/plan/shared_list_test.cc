#include "server/plan/shared_list.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace hsap::plan {
namespace {

TEST(SharedListTest, CopiesShareTheArray) {
  SharedList<int> a = std::vector<int>{1, 2, 3};
  SharedList<int> b = a;
  EXPECT_TRUE(a.SharesWith(b));
  EXPECT_EQ(a.begin(), b.begin());
  EXPECT_EQ(a, b);
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(b[1], 2);
  EXPECT_EQ(b.front(), 1);
  EXPECT_EQ(b.back(), 3);
}

TEST(SharedListTest, WritingASharedListCopiesItFirst) {
  SharedList<int> a = std::vector<int>{1, 2};
  SharedList<int> b = a;
  b.push_back(3);
  EXPECT_FALSE(a.SharesWith(b));
  EXPECT_EQ(a.ToVector(), (std::vector<int>{1, 2}));
  EXPECT_EQ(b.ToVector(), (std::vector<int>{1, 2, 3}));
  EXPECT_NE(a, b);
  // An unshared list is written in place.
  const int* before = b.begin();
  b.Mutable()[0] = 7;
  EXPECT_EQ(b.begin(), before);
  EXPECT_EQ(b[0], 7);
  EXPECT_EQ(a[0], 1);
}

TEST(SharedListTest, EmptyListsAreEqualAndShareNothing) {
  SharedList<int> a, b;
  SharedList<int> c = std::vector<int>{};
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.begin(), a.end());
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  EXPECT_FALSE(a.SharesWith(b));
  EXPECT_EQ(a.Identity(), nullptr);
  a.push_back(5);
  EXPECT_EQ(a.size(), 1u);
  EXPECT_TRUE(b.empty());
}

TEST(SharedListTest, ViewsReadTheirRunOfAGrowingPool) {
  auto pool = std::make_shared<std::vector<int>>();
  pool->push_back(1);
  pool->push_back(2);
  SharedList<int> first = SharedList<int>::View(pool, 0, 2);
  for (int i = 3; i <= 1000; ++i) pool->push_back(i);  // reallocates
  SharedList<int> second = SharedList<int>::View(pool, 2, 3);
  EXPECT_EQ(first.ToVector(), (std::vector<int>{1, 2}));
  EXPECT_EQ(second.ToVector(), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(first.Identity(), second.Identity());
  EXPECT_FALSE(first.SharesWith(second));
  EXPECT_TRUE(SharedList<int>::View(pool, 5, 0).empty());
  // Equal contents compare equal whatever the storage.
  EXPECT_EQ(second, (SharedList<int>{3, 4, 5}));
  // Writing a view copies its run out; the pool is untouched.
  second.push_back(9);
  EXPECT_EQ(second.ToVector(), (std::vector<int>{3, 4, 5, 9}));
  EXPECT_EQ((*pool)[5], 6);
  EXPECT_NE(second.Identity(), first.Identity());
}

TEST(SharedListTest, ClearDropsTheShare) {
  SharedList<int> a = std::vector<int>{1};
  SharedList<int> b = a;
  b.clear();
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(a.size(), 1u);
}

}  // namespace
}  // namespace hsap::plan
