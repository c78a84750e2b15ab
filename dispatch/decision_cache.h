// An in-process cache from a problem to the decision made for it, built so that a hit
// costs one hash and a few loads: lookups take no lock and allocate nothing.
//
// Layout: a fixed open-addressing table of atomic pointers to immutable nodes. Readers
// hash the key, probe linearly and compare; writers serialise on a mutex, publish a
// fully built node with a release store, and never free a node while the cache lives
// (a replaced decision stays allocated, so a reader holding it is never left dangling).
// When `capacity` decisions are stored, further inserts are refused (Insert returns
// nullptr) and the caller decides without caching: memory stays bounded however many
// distinct shapes an engine sends.
//
// Thread safety: Find is wait-free and may run concurrently with Insert/Replace from
// any number of threads. Returned pointers stay valid until the cache is destroyed.
#ifndef CUBIST_DISPATCH_DECISION_CACHE_H_
#define CUBIST_DISPATCH_DECISION_CACHE_H_

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <memory>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/synchronization/mutex.h"

namespace cubist {

template <typename Key, typename Value>
class DecisionCache {
 public:
  // Holds up to `capacity` decisions in a table of at least twice as many slots.
  explicit DecisionCache(size_t capacity = 4096)
      : capacity_(capacity),
        mask_(std::bit_ceil(std::max<size_t>(2 * capacity, 2)) - 1),
        slots_(new std::atomic<Node*>[mask_ + 1]) {
    for (size_t i = 0; i <= mask_; ++i) slots_[i].store(nullptr, std::memory_order_relaxed);
  }
  DecisionCache(const DecisionCache&) = delete;
  DecisionCache& operator=(const DecisionCache&) = delete;

  // The decision stored for `key`, or nullptr. Lock-free.
  const Value* Find(const Key& key) const {
    const size_t h = absl::Hash<Key>{}(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Node* n = slots_[i].load(std::memory_order_acquire);
      if (n == nullptr) return nullptr;
      if (n->hash == h && n->key == key) return &n->value;
    }
  }

  // Stores `value` for `key` unless a decision is already there (then returns the
  // existing one: the first writer wins, so concurrent deciders agree). Returns nullptr
  // when the cache is full.
  const Value* Insert(const Key& key, Value value) { return Put(key, std::move(value), false); }

  // Stores `value` for `key`, replacing an existing decision (autotuning found a better
  // kernel). Readers see the old or the new decision, never a torn one. nullptr when the
  // key is new and the cache is full.
  const Value* Replace(const Key& key, Value value) { return Put(key, std::move(value), true); }

  size_t size() const {
    absl::MutexLock lock(&mu_);
    return count_;
  }
  size_t capacity() const { return capacity_; }

 private:
  struct Node {
    Key key;
    size_t hash;
    Value value;
  };

  const Value* Put(const Key& key, Value value, bool replace) {
    const size_t h = absl::Hash<Key>{}(key);
    absl::MutexLock lock(&mu_);
    size_t i = h & mask_;
    for (;; i = (i + 1) & mask_) {
      Node* n = slots_[i].load(std::memory_order_relaxed);
      if (n == nullptr) break;
      if (n->hash == h && n->key == key) {
        if (!replace) return &n->value;
        nodes_.push_back(std::unique_ptr<Node>(new Node{key, h, std::move(value)}));
        slots_[i].store(nodes_.back().get(), std::memory_order_release);
        return &nodes_.back()->value;
      }
    }
    if (count_ >= capacity_) return nullptr;
    nodes_.push_back(std::unique_ptr<Node>(new Node{key, h, std::move(value)}));
    slots_[i].store(nodes_.back().get(), std::memory_order_release);
    ++count_;
    return &nodes_.back()->value;
  }

  const size_t capacity_;
  const size_t mask_;
  std::unique_ptr<std::atomic<Node*>[]> slots_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Node>> nodes_;  // guarded by mu_; owns every node
  size_t count_ = 0;                          // distinct keys; guarded by mu_
};

}  // namespace cubist

#endif  // CUBIST_DISPATCH_DECISION_CACHE_H_
