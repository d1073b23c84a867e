// A small persistent thread pool for draft_batch: the requests of one batch are spread over the calling thread and
// `threads - 1` workers started once, each taking the next request index until none is left.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace histospec {

class DraftPool {
 public:
  // Work item `i` of `n`, run by thread `t` in [0, threads) (0: the caller); its own scratch is `t`'s.
  using Task = std::function<void(size_t i, int32_t t)>;

  explicit DraftPool(int32_t threads);  // threads >= 1; 1 starts no worker
  ~DraftPool();
  DraftPool(const DraftPool&) = delete;
  DraftPool& operator=(const DraftPool&) = delete;

  int32_t threads() const { return static_cast<int32_t>(workers_.size()) + 1; }
  // Runs task(i, t) for every i in [0, n) on at most `use` threads (the caller among them) and returns when all
  // ran; rethrows the first exception a task raised. One run at a time: a caller that finds the pool busy runs
  // its items itself (t = 0 with use = 1 never touches the workers).
  void run(size_t n, int32_t use, const Task& task);

 private:
  void work(int32_t t);  // a worker's loop
  void take(int32_t t);  // takes and runs items of the current job until none is left

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // held by the run in progress
  std::mutex mu_;      // guards the fields below
  std::condition_variable wake_, done_;
  const Task* task_ = nullptr;
  size_t n_ = 0;                   // items of the current job
  std::atomic<size_t> next_{0};    // the next item to take (reset under mu_; taken without it)
  int32_t use_ = 0;          // threads the current job may use
  int32_t busy_ = 0;         // workers inside the current job
  uint64_t job_ = 0;         // bumped per job: a worker joins each job once
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace histospec
