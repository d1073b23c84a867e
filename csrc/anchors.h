// The native backend of the anchor scorer (DrafterConfig.scorer="anchors"): the same drafts, bit for bit, and the
// same learnt statistics as the pure-Python reference sglang_histospec/drafting/anchors.py, which is the
// specification (its constants and every formula are mirrored here; doubles are computed in the same order).
//
// An anchor is a position in a source whose preceding tokens match the end of a request's context, exactly or up
// to one substituted last token. Its class's per-depth hit rates are learnt online; a trie of the best anchors'
// continuations scores each node by the noisy-OR of its anchors' rates, re-ranked by a logistic model over the node's
// feature classes (depth, score, best rate, how many anchors and of which kinds pass through it), learnt online.
//
// Locking (no snapshots of whole structures): sources are immutable corpora held by shared_ptr and swapped under
// sources_mu_ (each change bumps a generation; a request re-reads its corpora only when it moved), so a draft
// keeps reading the ones it took; each request has its own mutex; the learnt tables are read under a shared lock
// of stats_mu_ while drafting and written under its unique lock when drafts resolve (in extend, remove_request).
// The running source reads the prompt's other running requests in place (their prev chains are the postings):
// a draft holds its request's mutex and shared locks of the contexts it reads (its own and those), in address
// order; extend changes a context under its unique lock, so drafts of sibling requests run side by side.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "drafter.h"
#include "index.h"
#include "pool.h"

namespace histospec {
namespace anchors {

constexpr int32_t kDepthMax = 32;       // DEPTH_MAX: deepest drafted node, and tokens after a draft it learns from
constexpr int32_t kScan = 256;          // SCAN: candidate positions examined per source and kind
constexpr int32_t kPairMin = 32;  // a token gets pair postings only with more postings than this (fewer: walked)
constexpr int32_t kMaxAnchors = 48;     // MAX_ANCHORS: anchors per draft
constexpr int32_t kHamWindow = 16;      // HAM_WINDOW: aligned tokens compared for the agreement feature
constexpr int32_t kSubMinMatch = 2;     // SUB_MIN_MATCH
constexpr int32_t kGlobalMinMatch = 3;  // GLOBAL_MIN_MATCH
constexpr std::array<int32_t, 7> kLengthEdges{2, 3, 4, 6, 9, 13, 21};
constexpr std::array<double, 14> kScoreEdges{0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99};
constexpr double kRatePrior = 0.6;
constexpr int64_t kRatePriorNodes = 4;
constexpr std::array<int32_t, 5> kCountEdges{2, 3, 5, 9, 17};  // COUNT_EDGES: anchors through a node
constexpr double kRerankLr = 0.002;   // RERANK_LR
constexpr double kLogitClip = 1e-4;   // LOGIT_CLIP
constexpr double kLogitMax = 30.0;    // LOGIT_MAX
constexpr int32_t kNumExtra = 12;
constexpr int32_t kNumLengthClasses = static_cast<int32_t>(kLengthEdges.size()) + 1;  // 8
constexpr int32_t kNumScoreBins = static_cast<int32_t>(kScoreEdges.size()) + 1;       // 15
constexpr int32_t kNumKinds = 4;   // NUM_KINDS: exact, substitution, and their rewritten copies
constexpr int32_t kRewritten = 2;  // REWRITTEN: a rewritten copy's kind is the original's plus this
constexpr double kCopyPrior = 0.5;  // COPY_PRIOR: a rewritten copy's prior rates are this times an original's
constexpr int32_t kNumClasses = kNumSources * kNumKinds * kNumLengthClasses * 4 * kNumExtra;  // 6144
// FEATURE_SIZES: depth, raw score, best rate, anchors through the node, their share of the parent's, longest match,
// best agreement, thirds of substitutions, rewritten copies, history, self and running anchors.
constexpr int32_t kNumFeatures = 12;
constexpr std::array<int32_t, kNumFeatures> kFeatureSizes{
    kNumLengthClasses, kNumScoreBins, kNumScoreBins, static_cast<int32_t>(kCountEdges.size()) + 1, 6,
    kNumLengthClasses, 4, 3, 3, 3, 3, 3};
constexpr std::array<int32_t, kNumFeatures> kFeatureOffsets = [] {
  std::array<int32_t, kNumFeatures> out{};
  for (int32_t k = 1; k < kNumFeatures; ++k) out[k] = out[k - 1] + kFeatureSizes[k - 1];
  return out;
}();
// NUM_WEIGHTS: one per feature class, then the bias and the slope.
constexpr int32_t kNumWeights = kFeatureOffsets[kNumFeatures - 1] + kFeatureSizes[kNumFeatures - 1] + 2;
constexpr int32_t kMaxNodes = 1 + kMaxAnchors * kDepthMax;                             // a trie's nodes, at most
constexpr int32_t kAnchorSource = kMixed + 1;  // DraftOut::source of an anchor draft ("anchors")

int32_t length_class(int64_t n);
int32_t anchor_class(int32_t source, int32_t kind, int64_t length, int32_t ham, int32_t extra);
constexpr int32_t class_of(int32_t source, int32_t kind, int32_t lc, int32_t ham, int32_t extra) {
  return (((source * kNumKinds + kind) * kNumLengthClasses + lc) * 4 + ham) * kNumExtra + extra;
}
constexpr int32_t kCopyShift = kRewritten * kNumLengthClasses * 4 * kNumExtra;  // kind + kRewritten in a class
// Learnt::bound's index: (source, kind 0 or 1, length class, extra); its rewritten copies share the bound.
constexpr int32_t kNumBounds = kNumSources * kRewritten * kNumLengthClasses * kNumExtra;
constexpr int32_t bound_index(int32_t source, int32_t kind, int32_t lc, int32_t extra) {
  return ((source * kRewritten + kind) * kNumLengthClasses + lc) * kNumExtra + extra;
}

// A hint to load addr's cache line. GCC 12 drops __builtin_prefetch calls in the scan loop at -O1 and above
// (checked with objdump), so x86 gets the instruction itself.
inline void prefetch_line(const void* addr) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(addr)));
#else
  __builtin_prefetch(addr);
#endif
}

struct Posting {
  int32_t seq;  // sequence index (oldest first)
  int32_t j;    // seqs[seq][j - 1] is the posting's token, j < len(seqs[seq])
};

// Open-addressing hash table token -> a range [lo, hi) of int32 (at most half full; grows by doubling).
class TokenTable {
 public:
  struct Slot {
    int32_t token;  // -1 = empty
    int32_t lo, hi;
  };
  const Slot* find(int32_t token) const;
  Slot& insert(int32_t token);  // the token's slot, added with lo = hi = 0 when missing
  std::vector<Slot>& slots() { return slots_; }
  const std::vector<Slot>& slots() const { return slots_; }

 private:
  uint32_t probe(int32_t token) const;  // the token's slot, or the empty one where it would go
  static uint32_t hash(int32_t t) {
    const uint32_t h = static_cast<uint32_t>(t) * 2654435761u;
    return h ^ (h >> 15);
  }
  std::vector<Slot> slots_ = std::vector<Slot>(16, Slot{-1, 0, 0});
  int64_t used_ = 0;
};

// Open-addressing hash table token pair (a, b) -> a range [lo, hi) of an array (at most half full; grows).
class PairTable {
 public:
  struct Slot {
    int32_t a, b;  // a = -1: empty
    int32_t lo, hi;
  };
  const Slot* find(int32_t a, int32_t b) const;
  Slot& insert(int32_t a, int32_t b);  // the pair's slot, added with lo = hi = 0 when missing
  std::vector<Slot>& slots() { return slots_; }
  const std::vector<Slot>& slots() const { return slots_; }

 private:
  uint32_t probe(int32_t a, int32_t b) const;  // the pair's slot, or the empty one where it would go
  static uint32_t hash(int32_t a, int32_t b) {
    const uint64_t k = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b));
    const uint64_t h = k * 0x9e3779b97f4a7c15ull;
    return static_cast<uint32_t>(h >> 32);
  }
  std::vector<Slot> slots_ = std::vector<Slot>(16, Slot{-1, 0, 0, 0});
  int64_t used_ = 0;
};

// Immutable sequences (oldest first) with weight classes and postings token -> [(seq, j)], oldest first.
class Corpus {
 public:
  static std::shared_ptr<const Corpus> build(const std::vector<Span>& seqs, const std::vector<int64_t>& weights);

  int32_t num_seqs() const { return static_cast<int32_t>(wclass_.size()); }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  Span sequence(int32_t s) const { return {tokens_.data() + starts_[s], starts_[s + 1] - starts_[s]}; }
  int32_t wclass(int32_t s) const { return wclass_[s]; }
  // Asks the CPU for the cache lines a scan reads at posting p (its token and the kHamWindow before it).
  void prefetch(const Posting& p) const {
    const int64_t at = starts_[p.seq] + p.j - 1;
    prefetch_line(tokens_.data() + at + 1);
    prefetch_line(tokens_.data() + std::max<int64_t>(at - kHamWindow, 0));
  }
  // Postings of `token`, oldest first (empty when it never precedes a token).
  std::pair<const Posting*, const Posting*> postings(int32_t token) const;
  struct RankedPosting {
    Posting posting;
    int32_t rank;  // among the postings of its token, newest first (0: the newest)
  };
  // Of the kScan newest postings of b, those that a precedes (seqs[seq][j - 2] == a), newest first: a scan whose
  // candidates match at least two tokens reads only these. Only for a b of more than kPairMin postings (a scan
  // walks the others whole).
  std::pair<const RankedPosting*, const RankedPosting*> pair_postings(int32_t a, int32_t b) const;
  const TokenTable& table() const { return table_; }
  const Posting* posting_data() const { return postings_.data(); }

  size_t memory_bytes() const;
  std::string check_integrity() const;  // debug: "" when every posting (and pair posting) points at its token

 private:
  std::vector<int32_t> tokens_;    // [tokens] the sequences concatenated
  std::vector<int64_t> starts_;    // [seqs + 1] start of each sequence in tokens_
  std::vector<int8_t> wclass_;     // [seqs] 0 if 2w > wmax, 1 if 4w > wmax, else 2
  std::vector<Posting> postings_;  // [tokens - nonempty seqs] grouped by token, oldest first within a group
  TokenTable table_;               // token -> its group postings_[lo, hi)
  std::vector<RankedPosting> pairs_;  // grouped by pair, newest first within a group
  PairTable pair_table_;           // (a, b) -> its group pairs_[lo, hi)
  void build_pairs();
  std::string check_pairs() const;
};

using CorpusPtr = std::shared_ptr<const Corpus>;
using CorpusList = std::shared_ptr<const std::vector<CorpusPtr>>;  // oldest first, replaced whole (copy on write)

struct PostingRun {  // one corpus's postings of a token
  const Corpus* corpus;
  const Posting *lo, *hi;
};

// The postings of a list of corpora by token, newest corpus first: a draft probes one table per kind instead of one
// per corpus (the global source holds one corpus per prompt and step: hundreds). Immutable; keeps its list alive.
class CorpusDirectory {
 public:
  static std::shared_ptr<const CorpusDirectory> build(CorpusList list);

  const CorpusList& list() const { return list_; }
  // The runs of `token`, newest corpus first (empty when no corpus has it).
  std::pair<const PostingRun*, const PostingRun*> runs(int32_t token) const;
  struct PairRef {  // one posting of a pair
    const Corpus* corpus;
    Posting posting;
  };
  // Of the kScan first postings of b in runs(b)'s order, those that a precedes, in that order; only for a b of
  // more than kPairMin postings over all corpora (has_pairs).
  std::pair<const PairRef*, const PairRef*> pair_postings(int32_t a, int32_t b) const;
  bool has_pairs(int32_t b) const;  // whether b has more than kPairMin postings over all corpora
  size_t memory_bytes() const;

 private:
  CorpusList list_;
  std::vector<PostingRun> runs_;  // grouped by token, newest corpus first within a group
  TokenTable table_;              // token -> its group runs_[lo, hi)
  std::vector<PairRef> pairs_;    // grouped by pair, in scan order within a group
  PairTable pair_table_;          // (a, b) -> its group pairs_[lo, hi)
  void build_pairs();
};

using DirectoryPtr = std::shared_ptr<const CorpusDirectory>;

struct DraftSources {  // the corpora one draft reads (null: none), each list oldest first
  CorpusPtr history;
  CorpusList siblings;
  DirectoryPtr global_dir;  // the global corpora's postings by token (it holds their list); null: none
};

// A draft's trie as kept until its outcome is known: enough to replay the reference's learning step.
struct PendingNode {
  int32_t token;
  uint16_t parent;  // node index (0 = root); a trie has at most kMaxNodes nodes
  uint8_t depth;
  std::array<uint8_t, kNumFeatures> features;  // the re-ranker's feature classes (anchors.py node_features)
  double raw;                                    // the node's noisy-OR score
};

struct PendingAnchor {
  int32_t cls;
  uint16_t leaf;  // trie node of the anchor's last continuation token
};

struct Pending {
  int64_t pos = 0;                     // context length when drafted
  int32_t reach = kDepthMax;           // deepest depth the draft's budget let it reach: min(budget, kDepthMax)
  std::vector<PendingNode> nodes;      // [nodes] node 0 is the root
  std::vector<PendingAnchor> anchors;  // [chosen anchors] in anchor order
};

struct Request {
  std::mutex mu;  // guards pending, spare and sources (a draft of this request, extend, remove_request)
  // Guards ctx, prev, last and running: unique to change them, shared to read them. Every draft of a sibling
  // takes it, so it has a cache line of its own: the fields that drafts read stay shared in every core's cache.
  alignas(64) std::shared_mutex ctx_mu;
  alignas(64) bool has_prompt = false;
  std::string prompt_id;
  std::vector<int32_t> ctx;  // [n] prompt tokens + generated
  int64_t prompt_len = 0;
  int64_t base = 0;              // where its running-sibling sequence (prompt tail + generated) starts in ctx
  bool running = false;          // in its prompt's running group (false once removed or restarted)
  bool track = false;            // the self or running source is on: keep prev and last
  std::vector<int32_t> prev;     // [n] previous position of ctx[i]'s token, -1 for its first
  TokenTable last;               // token -> lo = 1 + its last position in ctx (hi unused)
  alignas(64) std::vector<Pending> pending;  // unresolved drafts, oldest first (written by this request's drafts)
  std::vector<Pending> spare;    // resolved ones, kept for their capacity
  uint64_t sources_gen = 0;      // AnchorDrafter's sources generation `sources` was read at (0: never)
  DraftSources sources;          // the corpora of the last draft (kept alive until the next refresh)

  void append(Span tokens);
  std::string check_integrity() const;  // debug: "" when prev, last and the pending drafts are consistent
};

struct Scratch;  // the buffers of one draft (anchors.cc)

struct Config {
  int32_t min_match = 1;
  int32_t max_match = 32;
  int32_t prompt_tail = 4;
  std::array<bool, kNumSources> sources{true, true, true, true, true};
  int32_t draft_threads = 1;  // threads a draft_batch spreads its requests over (the caller among them)
};

using RunningGroup = std::shared_ptr<const std::vector<std::shared_ptr<Request>>>;  // start order, copy on write

// Learnt counts (int64, as the reference's numpy tables) and the rates derived from them.
struct Learnt {
  std::vector<int64_t> tries, hits;          // [kNumClasses * kDepthMax]
  std::vector<double> weights;               // [kNumWeights] the re-ranker: feature classes, bias, slope
  std::vector<double> rates;                 // [kNumClasses * kDepthMax] shrunk to the prior, running minimum
  std::vector<double> rate0;                 // [kNumClasses] rates at depth 0 (the anchors' selection key)
  std::vector<double> bound;                 // [kNumBounds] the largest rate0 of a bound_index's classes
  Learnt();
  void update_rates(int32_t cls);
};

class AnchorDrafter {
 public:
  explicit AnchorDrafter(const Config& cfg);
  ~AnchorDrafter();

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
  // The drafts do not depend on the threads. Unknown request ids raise std::out_of_range. `ns`, when given,
  // receives each request's draft wall time in nanoseconds (benchmarks).
  std::vector<DraftOut> draft_batch(const std::vector<std::string>& req_ids, const std::vector<int32_t>& budgets,
                                    std::vector<int64_t>* ns = nullptr, int32_t threads = 0);

  // Debug: copies of the learnt counts (tries, hits [kNumClasses * kDepthMax]) and the re-ranker's weights.
  std::array<std::vector<int64_t>, 2> learnt_counts() const;
  std::vector<double> learnt_weights() const;
  int32_t draft_threads() const { return pool_.threads(); }
  size_t memory_bytes() const;
  std::string check_integrity() const;

 private:
  struct PromptSources {
    CorpusPtr history;                        // null = none
    CorpusList siblings;                      // null = none
  };

  std::shared_ptr<Request> find_request(const std::string& req_id) const;
  RunningGroup running_group(const Request& req) const;  // the running requests of req's prompt (null: none)
  void leave_group(const std::shared_ptr<Request>& req);  // under a unique lock of requests_mu_
  void refresh_sources(Request& req) const;  // req.sources := the current corpora, unless they did not change
  void draft_one(Request& req, const RunningGroup& group, int32_t budget, Scratch& s, DraftOut& out);
  void resolve(Request& req, bool final);
  void publish_global();  // global_list_ := global_'s corpora (under a unique lock of sources_mu_)

  Config cfg_;
  mutable std::shared_mutex sources_mu_;  // guards prompts_, global_ and global_list_ (not the corpora: immutable)
  std::atomic<uint64_t> sources_gen_{1};   // bumped (under sources_mu_) by every change of the sources
  std::unordered_map<std::string, PromptSources> prompts_;
  std::vector<std::pair<int64_t, CorpusPtr>> global_;  // insertion order
  CorpusList global_list_;                              // global_'s corpora, oldest first
  mutable std::mutex global_dir_mu_;                    // guards global_dir_
  mutable DirectoryPtr global_dir_;  // built for global_list_ by the first draft that reads it after a change
  DirectoryPtr global_directory(const CorpusList& list) const;
  mutable std::shared_mutex requests_mu_;  // guards requests_ and running_
  std::unordered_map<std::string, std::shared_ptr<Request>> requests_;
  std::unordered_map<std::string, RunningGroup> running_;  // prompt id -> its running requests (running source on)
  mutable std::shared_mutex stats_mu_;
  Learnt learnt_;
  std::mutex scratch_mu_;
  std::vector<std::unique_ptr<Scratch>> scratch_pool_;  // one per draft running at a time
  DraftPool pool_;
};

}  // namespace anchors
}  // namespace histospec
