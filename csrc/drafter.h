// The native drafting backend: per-prompt history indexes, sibling and global indexes, per-request contexts with
// incremental match state, and best-first tree expansion. Semantics: docs/drafting.md (sections 1, 3-6, 9).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "index.h"
#include "pool.h"

namespace histospec {

// kRunning (the prompt's other running requests) belongs to the anchor scorer; the counts Drafter rejects it.
enum SourceId : int32_t { kHistory = 0, kSiblings = 1, kSelf = 2, kGlobal = 3, kRunning = 4, kNumSources = 5 };
constexpr int32_t kMixed = 5;  // DraftOut::source of a union of several sources' drafts

struct Config {
  int32_t min_match = 1;
  int32_t max_match = 32;
  bool tree = true;
  double min_prob = 0.1;
  bool use_frequency = true;
  std::array<bool, kNumSources> sources{true, true, true, true, false};
  int32_t draft_threads = 1;  // threads a draft_batch spreads its requests over (the caller among them)
};

struct DraftOut {
  std::vector<int32_t> tokens;   // [k]
  std::vector<int32_t> parents;  // [k] output index of the parent, -1 for children of the root
  std::vector<double> probs;     // [k] path probability
  int32_t match_len = 0;
  int32_t source = -1;           // SourceId of the only source, kMixed for a union, -1 when empty
};

// Longest suffix of a request's context that occurs in one index, advanced by appended tokens.
struct TreeNode {
  int32_t parent;  // index in the tree, -1 for the root
  int32_t token;
  Range range;     // rows of the root's string extended by the path to this node
};

struct MatchCache {
  uint64_t index_id = 0;  // 0 = invalid
  int64_t ctx_len = 0;    // context length the state refers to
  int32_t len = 0;        // longest occurring suffix length, capped at max_match
  Range range;            // its rows
  // Nodes pushed by the last expansion when it started from (len, range) (tree[0] = that root), so that the
  // accepted tokens of the next extend advance the state without searching the suffix array again.
  std::vector<TreeNode> tree;
};

struct Request {
  std::mutex mu;
  std::string prompt_id;
  bool has_prompt = false;
  std::vector<int32_t> ctx;                                        // prompt tokens + generated
  std::unordered_map<int32_t, std::vector<int32_t>> positions;     // token -> positions in ctx (self source)
  std::array<std::vector<MatchCache>, kNumSources> cache{};  // per source: one per index part
};

struct PromptEntry {
  IndexPtr history;  // null = no history
  // Siblings finished in the open step, as immutable parts holding 2^k sequences each, k strictly decreasing
  // (a binary counter: adding a sibling builds a one-sequence part and merges equal-sized neighbours, so every
  // sibling token is re-indexed O(log n) times, and a draft aggregates over O(log n) parts).
  std::vector<IndexPtr> sibling_parts;
};

class Drafter {
 public:
  explicit Drafter(const Config& cfg) : cfg_(cfg), pool_(cfg.draft_threads) {}

  void set_history(const std::string& prompt_id, const std::vector<Span>& seqs, const std::vector<int64_t>& weights);
  void add_sibling(const std::string& prompt_id, Span seq, int64_t weight);
  void clear_siblings();
  void add_global(int64_t key, const std::vector<Span>& seqs, const std::vector<int64_t>& weights);
  void remove_global(int64_t key);

  void start(const std::string& req_id, const std::string* prompt_id, Span prompt_tokens);
  void extend(const std::string& req_id, Span tokens);
  void remove_request(const std::string& req_id);
  bool has_request(const std::string& req_id) const;
  // One draft per request, spread over up to `threads` threads (0: cfg.draft_threads); call without the GIL.
  // The drafts do not depend on the threads. Unknown request ids raise std::out_of_range.
  // `ns`, when given, receives the wall time of each request's draft in nanoseconds (benchmarks).
  std::vector<DraftOut> draft_batch(const std::vector<std::string>& req_ids, const std::vector<int32_t>& budgets,
                                    std::vector<int64_t>* ns = nullptr, int32_t threads = 0);

  int32_t draft_threads() const { return pool_.threads(); }
  size_t memory_bytes() const;
  int64_t history_tokens() const;
  int64_t num_prompts() const;
  int64_t num_requests() const;
  std::string check_integrity() const;

 private:
  std::shared_ptr<Request> find_request(const std::string& req_id) const;
  IndexPtr global_index();
  void draft_one(Request& req, int32_t budget, DraftOut& out);
  void longest_match(const Index& index, const std::vector<int32_t>& c, MatchCache& cache) const;
  bool draft_from_parts(const std::vector<IndexPtr>& parts, Request& req, std::vector<MatchCache>& caches,
                        int32_t budget, DraftOut& out);
  bool draft_from_self(const Request& req, int32_t budget, DraftOut& out);

  Config cfg_;
  mutable std::shared_mutex prompts_mu_;  // guards prompts_ (the map and each entry's fields)
  std::mutex sibling_write_mu_;           // serialises sibling writers (merges run outside prompts_mu_)
  std::unordered_map<std::string, PromptEntry> prompts_;
  mutable std::shared_mutex requests_mu_;
  std::unordered_map<std::string, std::shared_ptr<Request>> requests_;
  mutable std::mutex global_mu_;  // guards the global groups and the lazily rebuilt global index
  std::unordered_map<int64_t, std::pair<std::vector<std::vector<int32_t>>, std::vector<int64_t>>> global_groups_;
  std::vector<int64_t> global_order_;  // keys in insertion order (deterministic index layout)
  IndexPtr global_index_;
  bool global_dirty_ = false;
  DraftPool pool_;
};

}  // namespace histospec
