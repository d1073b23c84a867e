#include "pool.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace histospec {

DraftPool::DraftPool(int32_t threads) {
  if (threads < 1) throw std::invalid_argument("draft_threads=" + std::to_string(threads) + ": expected >= 1");
  workers_.reserve(threads - 1);
  for (int32_t t = 1; t < threads; ++t) workers_.emplace_back([this, t] { work(t); });
}

DraftPool::~DraftPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void DraftPool::run(size_t n, int32_t use, const Task& task) {
  use = std::min(use, threads());
  std::unique_lock run_lock(run_mu_, std::defer_lock);
  if (use <= 1 || n <= 1 || !run_lock.try_lock()) {  // alone (or the pool is busy with another batch)
    for (size_t i = 0; i < n; ++i) task(i, 0);
    return;
  }
  {
    std::lock_guard lock(mu_);
    task_ = &task;
    n_ = n;
    next_ = 0;
    use_ = use;
    error_ = nullptr;
    ++job_;
  }
  wake_.notify_all();
  take(0);
  std::unique_lock lock(mu_);
  done_.wait(lock, [this] { return busy_ == 0; });  // every item is taken: no worker joins this job any more
  task_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void DraftPool::take(int32_t t) {
  for (size_t i = next_++; i < n_; i = next_++) {
    try {
      (*task_)(i, t);
    } catch (...) {
      std::lock_guard lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void DraftPool::work(int32_t t) {
  uint64_t seen = 0;  // the last job this worker joined
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || (job_ != seen && t < use_ && next_ < n_); });
    if (stop_) return;
    seen = job_;
    ++busy_;
    lock.unlock();
    take(t);
    lock.lock();
    if (--busy_ == 0) done_.notify_one();
  }
}

}  // namespace histospec
