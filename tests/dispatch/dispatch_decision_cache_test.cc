// The lock-free decision cache (dispatch/decision_cache.h).
#include "dispatch/decision_cache.h"

#include <atomic>
#include <thread>
#include <vector>

#include "dispatch/problem.h"
#include "gtest/gtest.h"

namespace cubist {
namespace {

MoeProblem ProblemWithTokens(int64_t tokens) {
  MoeProblem p;
  p.experts = 8;
  p.tokens = tokens;
  p.n = 1024;
  p.k = 512;
  return p;
}

TEST(DecisionCacheTest, FindAfterInsert) {
  DecisionCache<MoeProblem, int> cache(16);
  EXPECT_EQ(cache.Find(ProblemWithTokens(1)), nullptr);
  const int* v = cache.Insert(ProblemWithTokens(1), 42);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(*v, 42);
  EXPECT_EQ(cache.Find(ProblemWithTokens(1)), v);
  EXPECT_EQ(cache.Find(ProblemWithTokens(2)), nullptr);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(DecisionCacheTest, EveryKeyFieldDistinguishes) {
  DecisionCache<MoeProblem, int> cache(64);
  MoeProblem base = ProblemWithTokens(64);
  std::vector<MoeProblem> variants(9, base);
  variants[1].weight_format = DataFormat::kMxfp4;
  variants[2].activation_format = DataFormat::kFp8;
  variants[3].activation = Activation::kSwiglu;
  variants[4].experts = 9;
  variants[5].n = 2048;
  variants[6].k = 256;
  variants[7].sm = {10, 0};
  variants[8].sm_count = 114;
  for (size_t i = 0; i < variants.size(); ++i) {
    ASSERT_NE(cache.Insert(variants[i], static_cast<int>(i)), nullptr);
  }
  for (size_t i = 0; i < variants.size(); ++i) {
    const int* v = cache.Find(variants[i]);
    ASSERT_NE(v, nullptr) << i;
    EXPECT_EQ(*v, static_cast<int>(i));
  }
}

TEST(DecisionCacheTest, FirstWriterWinsAndReplaceOverrides) {
  DecisionCache<MoeProblem, int> cache(16);
  const int* first = cache.Insert(ProblemWithTokens(5), 1);
  const int* second = cache.Insert(ProblemWithTokens(5), 2);
  EXPECT_EQ(first, second);
  EXPECT_EQ(*cache.Find(ProblemWithTokens(5)), 1);
  const int* replaced = cache.Replace(ProblemWithTokens(5), 3);
  ASSERT_NE(replaced, nullptr);
  EXPECT_EQ(*cache.Find(ProblemWithTokens(5)), 3);
  EXPECT_EQ(*first, 1);  // the old decision stays valid for readers that hold it
  EXPECT_EQ(cache.size(), 1u);
}

TEST(DecisionCacheTest, FullCacheRefusesNewKeysButKeepsOld) {
  DecisionCache<MoeProblem, int> cache(4);
  for (int i = 0; i < 4; ++i) ASSERT_NE(cache.Insert(ProblemWithTokens(i), i), nullptr);
  EXPECT_EQ(cache.Insert(ProblemWithTokens(99), 99), nullptr);
  EXPECT_EQ(cache.Replace(ProblemWithTokens(98), 98), nullptr);
  EXPECT_EQ(cache.Find(ProblemWithTokens(99)), nullptr);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(*cache.Find(ProblemWithTokens(i)), i);
  EXPECT_NE(cache.Replace(ProblemWithTokens(2), 20), nullptr);  // existing key: allowed
  EXPECT_EQ(*cache.Find(ProblemWithTokens(2)), 20);
  EXPECT_EQ(cache.size(), 4u);
}

TEST(DecisionCacheTest, ReadersRaceWritersSafely) {
  // Readers run while writers fill the table; every value a reader sees must be the
  // one written for its key (a torn or misplaced node would show up here, and under
  // the thread sanitizer build as a race).
  constexpr int kKeys = 2000;
  DecisionCache<MoeProblem, int64_t> cache(kKeys);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> hits{0};
  std::atomic<int64_t> wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      int64_t i = t;
      while (!stop.load(std::memory_order_relaxed)) {
        const int64_t key = i++ % kKeys;
        if (const int64_t* v = cache.Find(ProblemWithTokens(key))) {
          hits.fetch_add(1, std::memory_order_relaxed);
          if (*v != key * 7) wrong.fetch_add(1, std::memory_order_relaxed);
        }
      }
    });
  }
  std::vector<std::thread> writers;
  for (int t = 0; t < 2; ++t) {
    writers.emplace_back([&, t] {
      for (int64_t key = t; key < kKeys; key += 2) cache.Insert(ProblemWithTokens(key), key * 7);
    });
  }
  for (auto& w : writers) w.join();
  stop = true;
  for (auto& r : readers) r.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(cache.size(), static_cast<size_t>(kKeys));
  for (int64_t key = 0; key < kKeys; ++key) {
    const int64_t* v = cache.Find(ProblemWithTokens(key));
    ASSERT_NE(v, nullptr) << key;
    EXPECT_EQ(*v, key * 7);
  }
}

}  // namespace
}  // namespace cubist
