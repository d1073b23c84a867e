#include "anchors.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <unordered_set>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace histospec {
namespace anchors {

// ---------------------------------------------------------------------------------------------------------------
// Classes and rates (anchors.py: length_class, _ham_class, _offset_class, anchor_class, _PRIOR, _rate)

int32_t length_class(int64_t n) {
  int32_t c = 0;
  for (int32_t e : kLengthEdges) c += n >= e;
  return c;
}

namespace {

int32_t ham_class(int32_t extra) { return extra <= 0 ? 0 : extra <= 3 ? 1 : extra <= 7 ? 2 : 3; }

int32_t offset_class(int64_t dist) { return dist <= 2 ? 0 : dist <= 10 ? 1 : dist <= 40 ? 2 : 3; }

int32_t count_class(int32_t n) {  // COUNT_EDGES at or below n
  int32_t c = 0;
  for (int32_t e : kCountEdges) c += n >= e;
  return c;
}

// min(2, 3 * part // whole) and 5 * c // p (5 when c == p) without a division (anchors.py _third, share_class).
int32_t third(int32_t part, int32_t whole) { return (3 * part >= whole) + (3 * part >= 2 * whole); }

int32_t share(int32_t c, int32_t p) {
  if (c == p) return 5;
  return (5 * c >= p) + (5 * c >= 2 * p) + (5 * c >= 3 * p) + (5 * c >= 4 * p);
}

double raw_logit(double raw) {  // anchors.py raw_logit
  const double x = std::min(std::max(raw, kLogitClip), 1.0 - kLogitClip);
  return std::log(x / (1.0 - x));
}

// The re-ranker's logit of a node: bias + slope * logit(raw) + its classes' weights, in this order, bounded.
double rerank_logit(const std::vector<double>& w, const PendingNode& nd, double logit) {
  double z = w[kNumWeights - 2] + w[kNumWeights - 1] * logit;
  for (int32_t k = 0; k < kNumFeatures; ++k) z += w[kFeatureOffsets[k] + nd.features[k]];
  return std::min(std::max(z, -kLogitMax), kLogitMax);
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

int32_t score_bin(double raw) {  // how many score edges lie below raw: 16 sorted slots, compared at once
  static constexpr std::array<double, 16> edges = [] {  // kScoreEdges padded with +inf
    std::array<double, 16> out{};
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = i < kScoreEdges.size() ? kScoreEdges[i] : std::numeric_limits<double>::infinity();
    return out;
  }();
  static_assert(kScoreEdges.size() < 16, "the search covers 16 slots");
#if defined(__SSE2__)
  // Eight compares of two slots, no dependent loads: each true compare (all ones, -1) adds 1 to its lane.
  const __m128d x = _mm_set1_pd(raw);
  __m128i below = _mm_setzero_si128();
  for (size_t i = 0; i < edges.size(); i += 2)
    below = _mm_sub_epi64(below, _mm_castpd_si128(_mm_cmplt_pd(_mm_loadu_pd(edges.data() + i), x)));
  return _mm_cvtsi128_si32(below) + _mm_cvtsi128_si32(_mm_unpackhi_epi64(below, below));
#else
  int32_t c = 0;  // a branchless binary search
  for (int32_t step = 8; step > 0; step /= 2) c += edges[c + step - 1] < raw ? step : 0;
  return c;
#endif
}

// [kDepthMax] RATE_PRIOR ** (d + 1) by repeated products, as np.cumprod computes it.
const std::array<double, kDepthMax>& prior() {
  static const std::array<double, kDepthMax> p = [] {
    std::array<double, kDepthMax> out{};
    out[0] = kRatePrior;
    for (int32_t d = 1; d < kDepthMax; ++d) out[d] = out[d - 1] * kRatePrior;
    return out;
  }();
  return p;
}

}  // namespace

int32_t anchor_class(int32_t source, int32_t kind, int64_t length, int32_t ham, int32_t extra) {
  return class_of(source, kind, length_class(length), ham, extra);
}

Learnt::Learnt()
    : tries(static_cast<size_t>(kNumClasses) * kDepthMax, 0),
      hits(static_cast<size_t>(kNumClasses) * kDepthMax, 0),
      weights(kNumWeights, 0.0),
      rates(static_cast<size_t>(kNumClasses) * kDepthMax, 0.0),
      rate0(kNumClasses, 0.0),
      bound(kNumBounds, 0.0) {
  weights[kNumWeights - 1] = 1.0;  // the slope of the raw score's logit: the re-ranker starts at the raw score
  for (int32_t c = 0; c < kNumClasses; ++c) update_rates(c);
}

void Learnt::update_rates(int32_t cls) {
  // raw[d] = (hits + RATE_PRIOR_NODES * prior[d]) / (tries + RATE_PRIOR_NODES), then a running minimum over d.
  const auto& p = prior();
  const size_t base = static_cast<size_t>(cls) * kDepthMax;
  const bool copy = cls / (kNumExtra * 4 * kNumLengthClasses) % kNumKinds >= kRewritten;
  for (int32_t d = 0; d < kDepthMax; ++d) {
    const double pd = copy ? p[d] * kCopyPrior : p[d];
    const double num = static_cast<double>(hits[base + d]) + static_cast<double>(kRatePriorNodes) * pd;
    const double raw = num / static_cast<double>(tries[base + d] + kRatePriorNodes);
    rates[base + d] = d == 0 ? raw : std::min(rates[base + d - 1], raw);
  }
  rate0[cls] = rates[base];
  // bound of the class's (source, kind without its copy bit, length class, extra): the largest rate0 over the
  // agreement classes, original and rewritten copy alike.
  const int32_t extra = cls % kNumExtra, lc = cls / (kNumExtra * 4) % kNumLengthClasses;
  const int32_t kind = cls / (kNumExtra * 4 * kNumLengthClasses) % kNumKinds % kRewritten;
  const int32_t source = cls / (kNumExtra * 4 * kNumLengthClasses * kNumKinds);
  double b = 0.0;
  for (int32_t k : {kind, kind + kRewritten})
    for (int32_t ham = 0; ham < 4; ++ham) b = std::max(b, rate0[class_of(source, k, lc, ham, extra)]);
  bound[bound_index(source, kind, lc, extra)] = b;
}

// ---------------------------------------------------------------------------------------------------------------
// Corpus (anchors.py: _Corpus)

uint32_t TokenTable::probe(int32_t token) const {
  const uint32_t mask = static_cast<uint32_t>(slots_.size() - 1);
  uint32_t h = hash(token) & mask;
  while (slots_[h].token != token && slots_[h].token != -1) h = (h + 1) & mask;
  return h;
}

const TokenTable::Slot* TokenTable::find(int32_t token) const {
  const Slot& e = slots_[probe(token)];
  return e.token == token ? &e : nullptr;
}

TokenTable::Slot& TokenTable::insert(int32_t token) {
  uint32_t h = probe(token);
  if (slots_[h].token == token) return slots_[h];
  if (2 * (used_ + 1) > static_cast<int64_t>(slots_.size())) {  // grow: re-insert every slot into twice the room
    std::vector<Slot> old(2 * slots_.size(), Slot{-1, 0, 0});
    old.swap(slots_);
    used_ = 0;
    for (const Slot& e : old)
      if (e.token != -1) insert(e.token) = e;
    h = probe(token);
  }
  ++used_;
  return slots_[h] = Slot{token, 0, 0};
}

std::shared_ptr<const Corpus> Corpus::build(const std::vector<Span>& seqs, const std::vector<int64_t>& weights) {
  auto c = std::make_shared<Corpus>();
  int64_t total = 0;
  for (const Span& s : seqs) total += s.size;
  const int64_t wmax = weights.empty() ? 1 : *std::max_element(weights.begin(), weights.end());
  c->tokens_.reserve(total);
  c->starts_.assign(1, 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    c->tokens_.insert(c->tokens_.end(), seqs[i].data, seqs[i].data + seqs[i].size);
    c->starts_.push_back(static_cast<int64_t>(c->tokens_.size()));
    // 2w > wmax and 4w > wmax without overflow: for integers w, wmax >= 0, kw > wmax iff w > floor(wmax / k).
    const int64_t w = weights[i];
    c->wclass_.push_back(w > wmax / 2 ? 0 : w > wmax / 4 ? 1 : 2);
  }
  // Postings grouped by token: count per token (in hi), give each group its offset, then fill in (seq, j) order.
  for (int32_t si = 0; si < c->num_seqs(); ++si) {
    const Span s = c->sequence(si);
    for (int64_t j = 1; j < s.size; ++j) ++c->table_.insert(s.data[j - 1]).hi;
  }
  int32_t offset = 0;
  for (TokenTable::Slot& e : c->table_.slots()) {
    e.lo = offset;
    offset += e.hi;
    e.hi = e.lo;
  }
  c->postings_.resize(offset);
  for (int32_t si = 0; si < c->num_seqs(); ++si) {
    const Span s = c->sequence(si);
    for (int64_t j = 1; j < s.size; ++j)
      c->postings_[c->table_.insert(s.data[j - 1]).hi++] = {si, static_cast<int32_t>(j)};
  }
  c->build_pairs();
  return c;
}

uint32_t PairTable::probe(int32_t a, int32_t b) const {
  const uint32_t mask = static_cast<uint32_t>(slots_.size() - 1);
  uint32_t h = hash(a, b) & mask;
  while (!(slots_[h].a == a && slots_[h].b == b) && slots_[h].a != -1) h = (h + 1) & mask;
  return h;
}

const PairTable::Slot* PairTable::find(int32_t a, int32_t b) const {
  const Slot& e = slots_[probe(a, b)];
  return e.a == a && e.b == b ? &e : nullptr;
}

PairTable::Slot& PairTable::insert(int32_t a, int32_t b) {
  uint32_t h = probe(a, b);
  if (slots_[h].a == a && slots_[h].b == b) return slots_[h];
  if (2 * (used_ + 1) > static_cast<int64_t>(slots_.size())) {  // grow: re-insert every slot into twice the room
    std::vector<Slot> old(2 * slots_.size(), Slot{-1, 0, 0, 0});
    old.swap(slots_);
    used_ = 0;
    for (const Slot& e : old)
      if (e.a != -1) insert(e.a, e.b) = e;
    h = probe(a, b);
  }
  ++used_;
  return slots_[h] = Slot{a, b, 0, 0};
}

namespace {

// Groups items by pair: visit(fn) calls fn(a, b, item) for every item, twice and in the same order; the items of a
// pair end up in out[lo, hi) of its slot, in visiting order.
template <typename Item, typename Visit>
void group_pairs(Visit visit, PairTable& table, std::vector<Item>& out) {
  visit([&](int32_t a, int32_t b, const Item&) { ++table.insert(a, b).hi; });
  int32_t offset = 0;
  for (PairTable::Slot& e : table.slots()) {
    e.lo = offset;
    offset += e.hi;
    e.hi = e.lo;
  }
  out.resize(offset);
  visit([&](int32_t a, int32_t b, const Item& item) { out[table.insert(a, b).hi++] = item; });
}

}  // namespace

void Corpus::build_pairs() {
  auto visit = [&](auto&& fn) {  // each frequent token's kScan newest postings with a token before them, newest first
    for (const TokenTable::Slot& e : table_.slots()) {
      if (e.token == -1 || e.hi - e.lo <= kPairMin) continue;
      for (int32_t k = e.hi - 1; k >= std::max(e.lo, e.hi - kScan); --k) {
        const Posting& p = postings_[k];
        if (p.j >= 2) fn(sequence(p.seq).data[p.j - 2], e.token, RankedPosting{p, e.hi - 1 - k});
      }
    }
  };
  group_pairs<RankedPosting>(visit, pair_table_, pairs_);
}

std::pair<const Corpus::RankedPosting*, const Corpus::RankedPosting*> Corpus::pair_postings(int32_t a,
                                                                                            int32_t b) const {
  const PairTable::Slot* e = pair_table_.find(a, b);
  if (!e) return {nullptr, nullptr};
  return {pairs_.data() + e->lo, pairs_.data() + e->hi};
}

std::pair<const Posting*, const Posting*> Corpus::postings(int32_t token) const {
  const TokenTable::Slot* e = table_.find(token);
  if (!e) return {nullptr, nullptr};
  return {postings_.data() + e->lo, postings_.data() + e->hi};
}

std::shared_ptr<const CorpusDirectory> CorpusDirectory::build(CorpusList list) {
  auto d = std::make_shared<CorpusDirectory>();
  // Count the corpora of each token (in hi), give each group its offset, then fill in newest corpus first.
  for (const CorpusPtr& c : *list)
    for (const TokenTable::Slot& e : c->table().slots())
      if (e.token != -1 && e.hi > e.lo) ++d->table_.insert(e.token).hi;
  int32_t offset = 0;
  for (TokenTable::Slot& e : d->table_.slots()) {
    e.lo = offset;
    offset += e.hi;
    e.hi = e.lo;
  }
  d->runs_.resize(offset);
  for (auto it = list->rbegin(); it != list->rend(); ++it) {
    const Corpus& c = **it;
    for (const TokenTable::Slot& e : c.table().slots())
      if (e.token != -1 && e.hi > e.lo)
        d->runs_[d->table_.insert(e.token).hi++] = {&c, c.posting_data() + e.lo, c.posting_data() + e.hi};
  }
  d->build_pairs();
  d->list_ = std::move(list);
  return d;
}

void CorpusDirectory::build_pairs() {
  auto visit = [&](auto&& fn) {  // each frequent token's kScan first postings in scan order, with a token before them
    for (const TokenTable::Slot& e : table_.slots()) {
      if (e.token == -1 || !has_pairs(e.token)) continue;
      int32_t seen = 0;
      for (int32_t r = e.lo; r < e.hi && seen < kScan; ++r) {
        const PostingRun& run = runs_[r];
        for (const Posting* p = run.hi; p != run.lo && seen < kScan; ++seen) {
          --p;
          if (p->j >= 2) fn(run.corpus->sequence(p->seq).data[p->j - 2], e.token, PairRef{run.corpus, *p});
        }
      }
    }
  };
  group_pairs<PairRef>(visit, pair_table_, pairs_);
}

std::pair<const CorpusDirectory::PairRef*, const CorpusDirectory::PairRef*> CorpusDirectory::pair_postings(
    int32_t a, int32_t b) const {
  const PairTable::Slot* e = pair_table_.find(a, b);
  if (!e) return {nullptr, nullptr};
  return {pairs_.data() + e->lo, pairs_.data() + e->hi};
}

bool CorpusDirectory::has_pairs(int32_t b) const {
  const auto [first, last] = runs(b);
  int64_t count = 0;
  for (const PostingRun* run = first; run != last && count <= kPairMin; ++run) count += run->hi - run->lo;
  return count > kPairMin;
}

std::pair<const PostingRun*, const PostingRun*> CorpusDirectory::runs(int32_t token) const {
  const TokenTable::Slot* e = table_.find(token);
  if (!e) return {nullptr, nullptr};
  return {runs_.data() + e->lo, runs_.data() + e->hi};
}

size_t CorpusDirectory::memory_bytes() const {
  return sizeof(CorpusDirectory) + runs_.capacity() * sizeof(PostingRun) +
         table_.slots().capacity() * sizeof(TokenTable::Slot) + pairs_.capacity() * sizeof(PairRef) +
         pair_table_.slots().capacity() * sizeof(PairTable::Slot);
}

size_t Corpus::memory_bytes() const {
  return sizeof(Corpus) + tokens_.capacity() * sizeof(int32_t) + starts_.capacity() * sizeof(int64_t) +
         wclass_.capacity() + postings_.capacity() * sizeof(Posting) +
         table_.slots().capacity() * sizeof(TokenTable::Slot) + pairs_.capacity() * sizeof(RankedPosting) +
         pair_table_.slots().capacity() * sizeof(PairTable::Slot);
}

std::string Corpus::check_integrity() const {
  if (starts_.size() != wclass_.size() + 1) return "sequences and weight classes disagree";
  int64_t expected = 0;
  for (int32_t s = 0; s < num_seqs(); ++s) expected += std::max<int64_t>(sequence(s).size - 1, 0);
  if (expected != static_cast<int64_t>(postings_.size())) return "postings and tokens disagree";
  int64_t grouped = 0;
  for (const TokenTable::Slot& e : table_.slots()) {
    if (e.token == -1) continue;
    if (table_.find(e.token) != &e) return "the token table loses token " + std::to_string(e.token);
    for (int32_t k = e.lo; k < e.hi; ++k) {
      const Posting& p = postings_[k];
      if (p.seq < 0 || p.seq >= num_seqs()) return "a posting names no sequence";
      const Span s = sequence(p.seq);
      if (p.j <= 0 || p.j >= s.size || s.data[p.j - 1] != e.token)
        return "a posting of token " + std::to_string(e.token) + " points elsewhere";
      const Posting* q = k > e.lo ? &postings_[k - 1] : nullptr;
      if (q && (p.seq < q->seq || (p.seq == q->seq && p.j <= q->j)))
        return "postings of token " + std::to_string(e.token) + " are not oldest first";
    }
    grouped += e.hi - e.lo;
  }
  if (grouped != expected) return "the token table misses postings";
  return check_pairs();
}

std::string Corpus::check_pairs() const {
  int64_t expected = 0;  // each frequent token's kScan newest postings with a token before them
  for (const TokenTable::Slot& e : table_.slots()) {
    if (e.token == -1 || e.hi - e.lo <= kPairMin) continue;
    for (int32_t k = std::max(e.lo, e.hi - kScan); k < e.hi; ++k) expected += postings_[k].j >= 2;
  }
  int64_t grouped = 0;
  for (const PairTable::Slot& e : pair_table_.slots()) {
    if (e.a == -1) continue;
    if (pair_table_.find(e.a, e.b) != &e) return "the pair table loses a pair";
    const TokenTable::Slot* b = table_.find(e.b);
    for (int32_t k = e.lo; k < e.hi; ++k) {
      const RankedPosting& q = pairs_[k];
      if (!b || b->hi - b->lo <= kPairMin) return "a token of few postings has pair postings";
      if (q.rank < 0 || q.rank >= std::min(kScan, b->hi - b->lo)) return "a pair posting has a wrong rank";
      const Posting& p = postings_[b->hi - 1 - q.rank];
      if (p.seq != q.posting.seq || p.j != q.posting.j || p.j < 2 || sequence(p.seq).data[p.j - 2] != e.a)
        return "a pair posting of (" + std::to_string(e.a) + ", " + std::to_string(e.b) + ") points elsewhere";
      if (k > e.lo && pairs_[k - 1].rank >= q.rank) return "pair postings are not newest first";
    }
    grouped += e.hi - e.lo;
  }
  return grouped == expected ? "" : "the pair table misses postings";
}

// ---------------------------------------------------------------------------------------------------------------
// Candidates (anchors.py: _match, _agree, _candidates, _self_candidates, _anchors)

namespace {

// Largest l <= limit with seq[j-l, j) == ctx[n-l, n).
int32_t match_length(const int32_t* seq, int64_t j, const int32_t* ctx, int64_t n, int64_t limit) {
  const int64_t lim = std::min({limit, j, n});
  int64_t l = 0;
  while (l < lim && seq[j - 1 - l] == ctx[n - 1 - l]) ++l;
  return static_cast<int32_t>(l);
}

// Aligned equal tokens seq[j-1-k] == ctx[n-1-k] for k in [start, HAM_WINDOW).
int32_t agreement(const int32_t* seq, int64_t j, const int32_t* ctx, int64_t n, int64_t start) {
  const int64_t stop = std::min<int64_t>({kHamWindow, j, n});
  int32_t count = 0;
  for (int64_t k = start; k < stop; ++k) count += seq[j - 1 - k] == ctx[n - 1 - k];
  return count;
}

struct Found {  // a kept anchor: it drafts seq[j, seq_len), or, rewritten, that with the context's tokens carried over
  int32_t cls;
  int32_t length;
  const int32_t* seq;
  int64_t seq_len, j;
  bool rewritten;
};

struct Ranked {  // a trie node's selection key (-score, depth, id), depth and id packed (id < 2^16)
  double score;
  int32_t depth_id;
};

struct Key {  // the reference's selection key (-rate0, source, kind, rank)
  double rate0;   // learnt first-token rate of the anchor's class
  int32_t index;  // into the found anchors, which are in (source, kind, rank) order
};

bool selected_before(const Key& a, const Key& b) {
  return a.rate0 != b.rate0 ? a.rate0 > b.rate0 : a.index < b.index;
}

// What every candidate of one draft shares, and the pruning that keeps the scan cheap. The draft uses the
// kMaxAnchors best anchors by key (-rate0, index); an original (not rewritten) anchor is always used when its turn
// comes, and a candidate found later has a larger index, so once kMaxAnchors originals are found a later candidate
// whose rate0 is at most the worst of the best originals' can never be used: it is dropped before its agreement is
// counted when no class it could fall in (Learnt::bound) beats that, and never stored. Drafts are unchanged.
struct Scan {
  const Config& cfg;
  const int32_t* ctx;  // [n] the request's context
  int64_t n;
  int64_t own;  // the request's offset in a stored sequence
  const Learnt& learnt;
  std::vector<Found>& found;
  std::vector<Key>& keys;
  std::vector<Found>& copies;  // rewritten copies of the current source's candidates, in their order
  std::vector<double>& originals;  // rate0 of every original kept so far (scratch of the floor)
  size_t since = 0;                // originals kept since the floor was last computed
  double floor = -1.0;             // a lower bound of the worst rate0 among the kMaxAnchors best originals so far

  // Whether a candidate with first-token rate r, found now or later, can still be among the anchors used.
  bool open(double r) const { return r > floor; }

  // A candidate of source s and kind 0 or 1 at j, with its match length and class feature `extra`, and its
  // rewritten copy (kept for add_rewritten).
  void offer(int32_t s, int32_t kind, const int32_t* seq, int64_t seq_len, int64_t j, int32_t length,
             int32_t extra) {
    const int32_t lc = length_class(length);
    if (!open(learnt.bound[bound_index(s, kind, lc, extra)])) return;
    const int32_t ham = ham_class(agreement(seq, j, ctx, n, length + kind));
    const int32_t cls = class_of(s, kind, lc, ham, extra);
    Found f{cls, length, seq, seq_len, j, false};
    if (open(learnt.rate0[cls])) admit(f);
    f.cls += kCopyShift;
    f.rewritten = true;
    if (open(learnt.rate0[f.cls])) copies.push_back(f);
  }

  void admit(const Found& f) {
    const double r = learnt.rate0[f.cls];
    keys.push_back({r, static_cast<int32_t>(found.size())});
    found.push_back(f);
    if (f.rewritten) return;
    originals.push_back(r);
    // Every kMaxAnchors originals: the floor := the kMaxAnchors-th largest rate0 (ties with it rank later, lose).
    if (++since < kMaxAnchors || originals.size() < static_cast<size_t>(kMaxAnchors)) return;
    since = 0;
    floor = kth_best();
    originals.resize(kMaxAnchors);  // the rest can never matter again
  }

  // The kMaxAnchors-th largest rate0 of the originals kept (at least kMaxAnchors of them); puts the best first.
  double kth_best() {
    auto kth = originals.begin() + (kMaxAnchors - 1);
    std::nth_element(originals.begin(), kth, originals.end(), std::greater<double>());
    return *kth;
  }

  // The rewritten copies of the source just scanned, after its originals and in their order (anchors.py:
  // _rewritten); whether a copy's continuation changes is decided lazily, when it is chosen (build_trie).
  void add_rewritten() {
    for (const Found& f : copies)
      if (open(learnt.rate0[f.cls])) admit(f);
    copies.clear();
  }

  // Drops the keys that can never be used: below the kMaxAnchors-th best original's rate0 (ties are kept).
  void prune_keys() {
    if (originals.size() < static_cast<size_t>(kMaxAnchors)) return;
    const double worst = kth_best();
    keys.erase(std::remove_if(keys.begin(), keys.end(), [&](const Key& k) { return k.rate0 < worst; }), keys.end());
  }
};

// seq[j, j + len) with the context's tokens carried over into out (anchors.py: rewritten); false when nothing
// changes. Each aligned mismatch seq[j-1-k] != ctx[n-1-k] (k < kHamWindow, nearest first) is a rule: after
// seq[j-2-k], seq[j-1-k] reads ctx[n-1-k]; a continuation token whose bigram in seq has a rule is replaced.
bool rewrite(const Found& f, const int32_t* ctx, int64_t n, int64_t len, int32_t* out) {
  std::array<int32_t, kHamWindow> before, from, to;  // [rules]
  int32_t rules = 0;
  const int32_t* seq = f.seq;
  const int64_t j = f.j, stop = std::min<int64_t>({kHamWindow, j - 1, n});
  for (int64_t k = 0; k < stop; ++k) {
    const int32_t h = seq[j - 1 - k], c = ctx[n - 1 - k], b = seq[j - 2 - k];
    if (h == c) continue;
    int32_t r = 0;
    while (r < rules && !(before[r] == b && from[r] == h)) ++r;
    if (r == rules) before[rules] = b, from[rules] = h, to[rules++] = c;  // the nearest mismatch keeps its rule
  }
  bool changed = false;
  for (int64_t i = 0; i < len; ++i) {
    const int32_t b = seq[j + i - 1], t = seq[j + i];
    int32_t r = 0;
    while (r < rules && !(before[r] == b && from[r] == t)) ++r;
    out[i] = r < rules ? to[r] : t;
    changed |= r < rules;
  }
  return changed;
}

constexpr int64_t kPrefetch = 8;  // postings a scan reads ahead (their tokens are cache misses, independent ones)

// One posting of source s (seq[j - 1] is the key, j < seq_len), kept when it matches at least lmin tokens; wclass is
// the history sequence's weight class (0 elsewhere).
inline void consider(Scan& sc, int32_t s, int32_t kind, const int32_t* seq, int64_t seq_len, int64_t j, int32_t lmin,
                     int32_t wclass) {
  const int64_t n = sc.n;
  if (kind) {
    ++j;
    if (j >= seq_len || seq[j - 1] == sc.ctx[n - 1]) return;
  }
  const int32_t length = match_length(seq, j - kind, sc.ctx, n - kind, sc.cfg.max_match);
  if (length < lmin) return;
  const int32_t extra = s == kGlobal ? 0 : offset_class(std::abs(j - sc.own)) + 4 * wclass;
  sc.offer(s, kind, seq, seq_len, j, length, extra);
}

// The postings of one run, newest first, until the scan has seen kScan positions; false once it has.
int32_t min_length(const Scan& sc, int32_t s, int32_t kind) {  // a candidate's shortest match
  return kind ? kSubMinMatch : s == kGlobal ? kGlobalMinMatch : sc.cfg.min_match;
}

inline bool scan_run(Scan& sc, int32_t s, int32_t kind, int32_t lmin, const PostingRun& run, int32_t& seen) {
  const Corpus& corpus = *run.corpus;
  for (const Posting* p = run.hi; p != run.lo;) {
    --p;
    if (seen == kScan) return false;
    // Each posting's tokens lie far from the last one's: fetch kPrefetch postings ahead, so misses overlap.
    if (p - run.lo >= kPrefetch) corpus.prefetch(p[-kPrefetch]);
    ++seen;
    const Span seq = corpus.sequence(p->seq);
    consider(sc, s, kind, seq.data, seq.size, p->j, lmin, s == kHistory ? corpus.wclass(p->seq) : 0);
  }
  return true;
}

// scan_corpora where a candidate matches at least two tokens: of the key's postings, only those that the token before
// it in the context precedes (Corpus::pair_postings); `seen` counts the key's postings of the newer corpora.
void scan_corpus_pairs(Scan& sc, int32_t s, int32_t kind, const CorpusPtr* first, const CorpusPtr* last) {
  if (sc.n < 2 + kind) return;
  const int32_t key = sc.ctx[sc.n - 1 - kind], before = sc.ctx[sc.n - 2 - kind], lmin = min_length(sc, s, kind);
  int32_t seen = 0;
  for (const CorpusPtr* it = last; it != first && seen < kScan;) {
    const Corpus& corpus = **--it;
    const auto [lo, hi] = corpus.postings(key);
    if (lo == hi) continue;
    if (hi - lo <= kPairMin) {  // no pair postings: walk them (they are few)
      if (!scan_run(sc, s, kind, lmin, {&corpus, lo, hi}, seen)) return;
      continue;
    }
    const auto [plo, phi] = corpus.pair_postings(before, key);
    for (const Corpus::RankedPosting* q = plo; q != phi && q->rank < kScan - seen; ++q) {
      if (phi - q > kPrefetch) corpus.prefetch(q[kPrefetch].posting);
      const Posting& p = q->posting;
      const Span seq = corpus.sequence(p.seq);
      consider(sc, s, kind, seq.data, seq.size, p.j, lmin, s == kHistory ? corpus.wclass(p.seq) : 0);
    }
    seen += static_cast<int32_t>(hi - lo);
  }
}

// One source and kind over corpora [first, last), newest (last) first: of the kScan newest positions after
// ctx[n - 1 - kind], those matching at least the source's minimum length.
void scan_corpora(Scan& sc, int32_t s, int32_t kind, const CorpusPtr* first, const CorpusPtr* last) {
  if (sc.n < 1 + kind) return;
  const int32_t key = sc.ctx[sc.n - 1 - kind], lmin = min_length(sc, s, kind);
  if (lmin >= 2) return scan_corpus_pairs(sc, s, kind, first, last);
  int32_t seen = 0;
  for (const CorpusPtr* it = last; it != first;) {
    const Corpus& corpus = **--it;
    const auto [lo, hi] = corpus.postings(key);
    if (lo != hi && !scan_run(sc, s, kind, lmin, {&corpus, lo, hi}, seen)) return;
  }
}

// The same over a directory's corpora (newest first): one probe instead of one per corpus.
void scan_directory(Scan& sc, int32_t s, int32_t kind, const CorpusDirectory& dir) {
  if (sc.n < 1 + kind) return;
  const int32_t key = sc.ctx[sc.n - 1 - kind], lmin = min_length(sc, s, kind);
  if (lmin >= 2 && dir.has_pairs(key)) {  // only the key's postings that the token before it in the context precedes
    if (sc.n < 2 + kind) return;
    const auto [lo, hi] = dir.pair_postings(sc.ctx[sc.n - 2 - kind], key);
    for (const CorpusDirectory::PairRef* q = lo; q != hi; ++q) {
      if (hi - q > kPrefetch) q[kPrefetch].corpus->prefetch(q[kPrefetch].posting);
      const Span seq = q->corpus->sequence(q->posting.seq);
      consider(sc, s, kind, seq.data, seq.size, q->posting.j, lmin, 0);
    }
    return;
  }
  int32_t seen = 0;
  const auto [first, last] = dir.runs(key);
  for (const PostingRun* run = first; run != last; ++run)
    if (!scan_run(sc, s, kind, lmin, *run, seen)) return;
}

// The running siblings (group, newest started first, never `self`), each as a corpus of its one sequence ctx[base,
// n): its postings of the key, newest first, are the key's earlier occurrences found by following prev.
void scan_running(Scan& sc, int32_t kind, const std::vector<std::shared_ptr<Request>>& group, const Request& self) {
  const int64_t n = sc.n;
  if (n < 1 + kind) return;
  const int32_t key = sc.ctx[n - 1 - kind];
  const int32_t lmin = min_length(sc, kRunning, kind);
  int32_t seen = 0;
  for (auto it = group.rbegin(); it != group.rend(); ++it) {
    const Request& r = **it;
    const TokenTable::Slot* e = &r == &self || !r.running ? nullptr : r.last.find(key);
    if (!e) continue;
    const int32_t* seq = r.ctx.data() + r.base;
    const int64_t len = static_cast<int64_t>(r.ctx.size()) - r.base;
    for (int64_t p = e->lo - 1; p >= r.base; p = r.prev[p]) {
      if (p - r.base + 1 >= len) continue;  // its last token: nothing follows it yet
      if (seen == kScan) return;
      ++seen;
      consider(sc, kRunning, kind, seq, len, p - r.base + 1, lmin, 0);
    }
  }
}

// The request's own context, newest first, never the trivial match at its end: the earlier occurrences of
// ctx[n - 1 - kind], found by following prev (prev[i]: the previous position of ctx[i]'s token, -1 if none).
void scan_self(Scan& sc, int32_t kind, const int32_t* prev) {
  const int64_t n = sc.n;
  if (n < 2 + kind) return;
  const int32_t lmin = min_length(sc, kSelf, kind);
  int32_t seen = 0, rank = 0;
  for (int64_t p = prev[n - 1 - kind]; p >= 0; p = prev[p]) {  // ctx[p] == ctx[n - 1 - kind], p < n - 1 - kind
    if (seen == kScan) break;
    ++seen;
    const int64_t j = p + 1 + kind;
    if (kind && sc.ctx[j - 1] == sc.ctx[n - 1]) continue;
    const int32_t length = match_length(sc.ctx, j - kind, sc.ctx, n - kind, sc.cfg.max_match);
    if (length < lmin) continue;
    sc.offer(kSelf, kind, sc.ctx, n, j, length, std::min(rank++, 3));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The trie of the chosen anchors' continuations (anchors.py: _draft)

// [kDepthMax + 1] length_class of a node depth.
const std::array<int8_t, kDepthMax + 1>& depth_class() {
  static const std::array<int8_t, kDepthMax + 1> table = [] {
    std::array<int8_t, kDepthMax + 1> out{};
    for (int32_t d = 0; d <= kDepthMax; ++d) out[d] = static_cast<int8_t>(length_class(d));
    return out;
  }();
  return table;
}

// The trie of one draft: its nodes (token, parent, depth, features) are built straight into the pending draft that
// will learn from them; child links, noisy-OR misses, anchor tallies and scores live here.
struct Trie {
  std::vector<PendingNode>* nodes = nullptr;           // [size] node 0 is the root
  std::array<int32_t, kMaxNodes> first_child, next_sibling;  // [size] children lists (-1 ends)
  std::array<double, kMaxNodes> miss, best, score;           // [size] best: its anchors' largest rate; score: ranked only
  std::array<int32_t, kMaxNodes> count;                      // [size] anchors through the node (root: all of them)
  // [size] over its anchors: longest match's length class, best agreement class, substitutions, rewritten copies,
  // history, self and running anchors (anchors.py _Trie.tally)
  std::array<std::array<int32_t, 7>, kMaxNodes> tally;

  int32_t size() const { return static_cast<int32_t>(nodes->size()); }

  void reset(std::vector<PendingNode>& into) {
    nodes = &into;
    into.assign(1, PendingNode{});
    best[0] = 0.0;
    first_child[0] = -1;
  }

  int32_t child(int32_t v, int32_t t) {  // the child of v for token t, created when missing
    std::vector<PendingNode>& nd = *nodes;
    for (int32_t c = first_child[v]; c >= 0; c = next_sibling[c])
      if (nd[c].token == t) return c;
    const int32_t c = size();
    const uint8_t depth = static_cast<uint8_t>(nd[v].depth + 1);
    PendingNode& added = nd.emplace_back();  // filled in place: a pushed temporary costs a store-forwarding stall
    added.token = t;
    added.parent = static_cast<uint16_t>(v);
    added.depth = depth;
    added.features = {};
    added.raw = 0.0;
    first_child[c] = -1;
    next_sibling[c] = first_child[v];
    first_child[v] = c;
    miss[c] = 1.0;
    best[c] = 0.0;
    count[c] = 0;
    tally[c] = {};
    return c;
  }

  // An anchor with rate `rate` at this depth and tally `a` (length class, agreement class, then 1 or 0 for
  // substitution, rewritten copy, history, self, running) passes node v (anchors.py _Trie.add).
  void add(int32_t v, double rate, const std::array<int32_t, 7>& a) {
    miss[v] *= 1.0 - rate;
    best[v] = std::max(best[v], rate);
    ++count[v];
    std::array<int32_t, 7>& t = tally[v];
    t[0] = std::max(t[0], a[0]);
    t[1] = std::max(t[1], a[1]);
    for (int32_t i = 2; i < 7; ++i) t[i] += a[i];
  }

  // Every node's re-ranker features and raw score (anchors.py node_features).
  void assign_features() {
    const auto& dclass = depth_class();
    for (int32_t v = 1; v < size(); ++v) {
      PendingNode& nd = (*nodes)[v];
      const double raw = 1.0 - miss[v];
      const int32_t c = count[v], p = count[nd.parent];
      const std::array<int32_t, 7>& t = tally[v];
      nd.features = {static_cast<uint8_t>(dclass[nd.depth]), static_cast<uint8_t>(score_bin(raw)),
                     static_cast<uint8_t>(score_bin(best[v])), static_cast<uint8_t>(count_class(c)),
                     static_cast<uint8_t>(share(c, p)), static_cast<uint8_t>(t[0]),
                     static_cast<uint8_t>(t[1]), static_cast<uint8_t>(third(t[2], c)),
                     static_cast<uint8_t>(third(t[3], c)), static_cast<uint8_t>(third(t[4], c)),
                     static_cast<uint8_t>(third(t[5], c)), static_cast<uint8_t>(third(t[6], c))};
      nd.raw = raw;
    }
  }

  // The re-ranker's probability, at most the parent's score.
  double score_of(int32_t v, const Learnt& learnt) const {
    const PendingNode& nd = (*nodes)[v];
    return std::min(sigmoid(rerank_logit(learnt.weights, nd, raw_logit(nd.raw))), score[nd.parent]);
  }
};

}  // namespace

// Buffers of one draft, reused from draft to draft (AnchorDrafter keeps a pool: no allocation once warm).
struct Scratch {
  std::vector<Found> found;
  std::vector<Key> keys;
  std::vector<Found> copies;  // a source's rewritten copies until its originals are all found
  std::vector<double> originals;  // the floor's scratch (Scan)
  std::array<int32_t, kMaxAnchors * kDepthMax> rewritten;  // [chosen anchors, kDepthMax] rewritten continuations
  int32_t match_len = 0;                                    // the best chosen anchor's match length
  Trie trie;
  std::vector<Ranked> heap;
  std::vector<int32_t> top, order;
  std::array<int32_t, kDepthMax + 2> depth_start;
  std::vector<std::shared_mutex*> locks;  // the context locks a draft holds
};

namespace {

// A draft's locks: its request's `mu` (its drafts and sources), then shared locks of the contexts it reads (its
// own and its running group's, in address order). Drafts of sibling requests only share the contexts' locks, so
// they run side by side; extend holds one `mu`, then its context's unique lock, and never another: no cycle.
class LockAll {
 public:
  LockAll(Request& req, const RunningGroup& group, std::vector<std::shared_mutex*>& locks)
      : own_(req.mu), locks_(locks) {
    locks_.assign(1, &req.ctx_mu);
    if (group)
      for (const auto& r : *group)
        if (r.get() != &req) locks_.push_back(&r->ctx_mu);
    std::sort(locks_.begin(), locks_.end());
    for (std::shared_mutex* m : locks_) m->lock_shared();
  }
  ~LockAll() {
    for (auto it = locks_.rbegin(); it != locks_.rend(); ++it) (*it)->unlock_shared();
  }
  LockAll(const LockAll&) = delete;
  LockAll& operator=(const LockAll&) = delete;

 private:
  std::lock_guard<std::mutex> own_;
  std::vector<std::shared_mutex*>& locks_;
};

}  // namespace

AnchorDrafter::AnchorDrafter(const Config& cfg) : cfg_(cfg), pool_(cfg.draft_threads) {}
AnchorDrafter::~AnchorDrafter() = default;

namespace {

// The first `budget` nodes by (-score, depth, id), in output order (depth, id). A child's key is always above its
// parent's (its score is at most the parent's, its depth larger), so best-first from the root pops exactly those
// nodes in key order; only the children of popped nodes are ever scored.
void select_top(const Learnt& learnt, Scratch& s, int32_t budget) {
  Trie& t = s.trie;
  auto worse = [](const Ranked& a, const Ranked& b) {
    return a.score != b.score ? a.score < b.score : a.depth_id > b.depth_id;
  };
  auto push_children = [&](int32_t v) {
    for (int32_t c = t.first_child[v]; c >= 0; c = t.next_sibling[c]) {
      t.score[c] = t.score_of(c, learnt);
      s.heap.push_back({t.score[c], (*t.nodes)[c].depth << 16 | c});
      std::push_heap(s.heap.begin(), s.heap.end(), worse);
    }
  };
  s.heap.clear();
  s.top.clear();
  t.score[0] = 1.0;
  push_children(0);
  while (static_cast<int32_t>(s.top.size()) < budget && !s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), worse);
    s.top.push_back(s.heap.back().depth_id & 0xffff);
    s.heap.pop_back();
    if (static_cast<int32_t>(s.top.size()) < budget) push_children(s.top.back());
  }
  // Counting sort by depth; ids ascending within a depth (the selection is sorted by id first).
  std::sort(s.top.begin(), s.top.end());
  s.depth_start.fill(0);
  for (int32_t v : s.top) ++s.depth_start[(*t.nodes)[v].depth + 1];
  for (int32_t d = 1; d <= kDepthMax + 1; ++d) s.depth_start[d] += s.depth_start[d - 1];
  s.order.resize(s.top.size());
  for (int32_t v : s.top) s.order[s.depth_start[(*t.nodes)[v].depth]++] = v;
}

void fill_output(Scratch& s, int32_t match_len, DraftOut& out) {
  const Trie& t = s.trie;
  const size_t k = s.order.size();
  s.top.assign(t.size(), -1);  // reused as node -> output index
  out.tokens.resize(k);
  out.parents.resize(k);
  out.probs.resize(k);
  for (size_t i = 0; i < k; ++i) {
    const int32_t v = s.order[i];
    const PendingNode& nd = (*t.nodes)[v];
    s.top[v] = static_cast<int32_t>(i);
    out.tokens[i] = nd.token;
    out.parents[i] = nd.parent == 0 ? -1 : s.top[nd.parent];  // parents come first (smaller depth)
    out.probs[i] = t.score[v];
  }
  out.match_len = match_len;
  out.source = kAnchorSource;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Sources

void AnchorDrafter::set_history(const std::string& prompt_id, const std::vector<Span>& seqs,
                                const std::vector<int64_t>& weights) {
  // The facade passes newest first; a corpus is oldest first.
  CorpusPtr corpus;
  if (!seqs.empty())
    corpus = Corpus::build(std::vector<Span>(seqs.rbegin(), seqs.rend()),
                           std::vector<int64_t>(weights.rbegin(), weights.rend()));
  std::unique_lock lock(sources_mu_);
  sources_gen_.fetch_add(1, std::memory_order_release);
  if (corpus) {
    prompts_[prompt_id].history = std::move(corpus);
    return;
  }
  auto it = prompts_.find(prompt_id);
  if (it == prompts_.end()) return;
  it->second.history.reset();
  if (!it->second.siblings) prompts_.erase(it);
}

void AnchorDrafter::add_sibling(const std::string& prompt_id, Span seq, int64_t weight) {
  CorpusPtr corpus = Corpus::build({seq}, {weight});
  std::unique_lock lock(sources_mu_);
  sources_gen_.fetch_add(1, std::memory_order_release);
  PromptSources& entry = prompts_[prompt_id];
  auto next = entry.siblings ? std::make_shared<std::vector<CorpusPtr>>(*entry.siblings)
                             : std::make_shared<std::vector<CorpusPtr>>();
  next->push_back(std::move(corpus));
  entry.siblings = std::move(next);
}

void AnchorDrafter::clear_siblings() {
  std::unique_lock lock(sources_mu_);
  sources_gen_.fetch_add(1, std::memory_order_release);
  for (auto it = prompts_.begin(); it != prompts_.end();) {
    it->second.siblings.reset();
    if (!it->second.history) it = prompts_.erase(it); else ++it;
  }
}

void AnchorDrafter::add_global(int64_t key, const std::vector<Span>& seqs, const std::vector<int64_t>& weights) {
  CorpusPtr corpus = Corpus::build(seqs, weights);
  std::unique_lock lock(sources_mu_);
  auto it = std::find_if(global_.begin(), global_.end(), [&](const auto& g) { return g.first == key; });
  if (it != global_.end()) it->second = std::move(corpus); else global_.emplace_back(key, std::move(corpus));  // a dict
  publish_global();
}

void AnchorDrafter::remove_global(int64_t key) {
  std::unique_lock lock(sources_mu_);
  auto it = std::find_if(global_.begin(), global_.end(), [&](const auto& g) { return g.first == key; });
  if (it == global_.end()) return;
  global_.erase(it);
  publish_global();
}

void AnchorDrafter::publish_global() {
  sources_gen_.fetch_add(1, std::memory_order_release);
  auto list = std::make_shared<std::vector<CorpusPtr>>();
  for (const auto& g : global_) list->push_back(g.second);
  global_list_ = std::move(list);
}

DirectoryPtr AnchorDrafter::global_directory(const CorpusList& list) const {
  std::lock_guard lock(global_dir_mu_);
  if (!global_dir_ || global_dir_->list() != list) global_dir_ = CorpusDirectory::build(list);
  return global_dir_;
}

void AnchorDrafter::refresh_sources(Request& req) const {
  if (req.sources_gen == sources_gen_.load(std::memory_order_acquire)) return;
  DraftSources src;
  std::shared_lock lock(sources_mu_);
  if (req.has_prompt && (cfg_.sources[kHistory] || cfg_.sources[kSiblings])) {
    auto it = prompts_.find(req.prompt_id);
    if (it != prompts_.end()) {
      if (cfg_.sources[kHistory]) src.history = it->second.history;
      if (cfg_.sources[kSiblings]) src.siblings = it->second.siblings;
    }
  }
  if (cfg_.sources[kGlobal] && global_list_ && !global_list_->empty()) {
    src.global_dir = global_directory(global_list_);
  }
  req.sources = std::move(src);
  req.sources_gen = sources_gen_.load(std::memory_order_relaxed);  // writers bump it under the unique lock
}

// ---------------------------------------------------------------------------------------------------------------
// Requests

namespace {

std::string check_pending(const Pending& p, int64_t ctx_len) {
  if (p.pos < 0 || p.pos > ctx_len) return "a pending draft lies beyond the context";
  if (p.nodes.empty() || p.anchors.empty()) return "a pending draft without nodes or anchors";
  if (p.reach < 1 || p.reach > kDepthMax) return "a pending draft's reach is out of range";
  for (size_t u = 1; u < p.nodes.size(); ++u) {
    const PendingNode& nd = p.nodes[u];
    if (nd.parent >= u || nd.depth != p.nodes[nd.parent].depth + 1 || nd.depth > p.reach ||
        nd.features[0] != length_class(nd.depth) || !(nd.raw >= 0.0 && nd.raw <= 1.0))
      return "a pending trie node is inconsistent";
    for (int32_t k = 0; k < kNumFeatures; ++k)
      if (nd.features[k] >= kFeatureSizes[k]) return "a pending trie node's feature is out of range";
  }
  for (const PendingAnchor& a : p.anchors)
    if (a.cls < 0 || a.cls >= kNumClasses || a.leaf == 0 || a.leaf >= p.nodes.size())
      return "a pending anchor is out of range";
  return "";
}

}  // namespace

void Request::append(Span tokens) {
  for (int64_t i = 0; i < tokens.size; ++i) {
    const int32_t t = tokens.data[i];
    if (track) {
      TokenTable::Slot& e = last.insert(t);  // a new token's slot has lo = 0: no earlier position
      prev.push_back(e.lo - 1);
      e.lo = static_cast<int32_t>(ctx.size()) + 1;
    }
    ctx.push_back(t);
  }
}

std::string Request::check_integrity() const {
  for (const Pending& p : pending) {
    const std::string h = check_pending(p, static_cast<int64_t>(ctx.size()));
    if (!h.empty()) return h;
    if (static_cast<int64_t>(ctx.size()) - p.pos >= kDepthMax) return "a due draft is pending";
  }
  if (!track) return prev.empty() ? "" : "occurrences kept without the self or running source";
  if (prev.size() != ctx.size()) return "previous occurrences and context disagree";
  std::unordered_map<int32_t, int32_t> seen;  // token -> its last position so far
  for (size_t i = 0; i < ctx.size(); ++i) {
    const auto [it, fresh] = seen.try_emplace(ctx[i], static_cast<int32_t>(i));
    if (prev[i] != (fresh ? -1 : it->second)) return "the previous occurrence at " + std::to_string(i) + " is wrong";
    it->second = static_cast<int32_t>(i);
  }
  size_t tokens = 0;
  for (const TokenTable::Slot& e : last.slots()) {
    if (e.token == -1) continue;
    ++tokens;
    const auto it = seen.find(e.token);
    if (it == seen.end() || it->second != e.lo - 1) return "last occurrence of " + std::to_string(e.token) + " wrong";
  }
  return tokens == seen.size() ? "" : "last occurrences are missing";
}

void AnchorDrafter::start(const std::string& req_id, const std::string* prompt_id, Span prompt_tokens) {
  auto req = std::make_shared<Request>();
  req->has_prompt = prompt_id != nullptr;
  if (prompt_id) req->prompt_id = *prompt_id;
  req->track = cfg_.sources[kSelf] || cfg_.sources[kRunning];
  req->append(prompt_tokens);
  req->prompt_len = prompt_tokens.size;
  req->base = prompt_tokens.size - std::min<int64_t>(cfg_.prompt_tail, prompt_tokens.size);
  req->running = req->has_prompt && cfg_.sources[kRunning];
  std::shared_ptr<Request> old;
  {
    std::unique_lock lock(requests_mu_);
    std::shared_ptr<Request>& slot = requests_[req_id];
    old = std::move(slot);  // a restarted id drops its pending drafts unlearnt, as the reference does
    if (old) leave_group(old);
    if (req->running) {
      RunningGroup& group = running_[req->prompt_id];
      auto next = group ? std::make_shared<std::vector<std::shared_ptr<Request>>>(*group)
                        : std::make_shared<std::vector<std::shared_ptr<Request>>>();
      next->push_back(req);
      group = std::move(next);
    }
    slot = std::move(req);
  }
  if (old) {
    std::lock_guard lock(old->mu);
    std::unique_lock ctx_lock(old->ctx_mu);
    old->running = false;
  }
}

void AnchorDrafter::leave_group(const std::shared_ptr<Request>& req) {
  auto it = req->has_prompt ? running_.find(req->prompt_id) : running_.end();
  if (it == running_.end()) return;
  auto next = std::make_shared<std::vector<std::shared_ptr<Request>>>();
  for (const auto& r : *it->second)
    if (r != req) next->push_back(r);
  if (next->empty()) running_.erase(it); else it->second = std::move(next);
}

RunningGroup AnchorDrafter::running_group(const Request& req) const {
  if (!req.has_prompt || !cfg_.sources[kRunning]) return nullptr;
  std::shared_lock lock(requests_mu_);
  const auto it = running_.find(req.prompt_id);
  return it == running_.end() ? nullptr : it->second;
}

std::shared_ptr<Request> AnchorDrafter::find_request(const std::string& req_id) const {
  std::shared_lock lock(requests_mu_);
  auto it = requests_.find(req_id);
  if (it == requests_.end()) throw std::out_of_range(req_id);
  return it->second;
}

bool AnchorDrafter::has_request(const std::string& req_id) const {
  std::shared_lock lock(requests_mu_);
  return requests_.count(req_id) > 0;
}

void AnchorDrafter::extend(const std::string& req_id, Span tokens) {
  auto req = find_request(req_id);
  std::lock_guard lock(req->mu);
  {
    std::unique_lock ctx_lock(req->ctx_mu);
    req->append(tokens);
  }
  resolve(*req, false);
}

void AnchorDrafter::remove_request(const std::string& req_id) {
  std::shared_ptr<Request> req;
  {
    std::unique_lock lock(requests_mu_);
    auto it = requests_.find(req_id);
    if (it == requests_.end()) return;
    req = std::move(it->second);
    requests_.erase(it);
    leave_group(req);
  }
  std::lock_guard lock(req->mu);
  {
    std::unique_lock ctx_lock(req->ctx_mu);
    req->running = false;
  }
  resolve(*req, true);
}

// ---------------------------------------------------------------------------------------------------------------
// Learning (anchors.py: _resolve): every pending draft whose next kDepthMax tokens are known (all when final).

namespace {

constexpr size_t kMaxSpare = 2 * kDepthMax;  // resolved drafts kept per request for their buffers

// One step of the re-ranker on a draft's known nodes (anchors.py _learn_nodes): all errors first, then each node's
// classes moved by kRerankLr x its error, node by node, then the bias and slope by kRerankLr x the mean error.
void rerank_step(const Pending& p, int64_t avail, const uint8_t* hit, std::vector<double>& w) {
  std::array<double, kMaxNodes> error, logit;
  int32_t n = 0;
  for (size_t u = 1; u < p.nodes.size(); ++u) {
    if (p.nodes[u].depth > avail) continue;
    logit[u] = raw_logit(p.nodes[u].raw);
    error[u] = static_cast<double>(hit[u]) - sigmoid(rerank_logit(w, p.nodes[u], logit[u]));
    ++n;
  }
  if (n == 0) return;
  double total = 0.0, slope = 0.0;
  for (size_t u = 1; u < p.nodes.size(); ++u) {
    if (p.nodes[u].depth > avail) continue;
    const PendingNode& nd = p.nodes[u];
    const double step = kRerankLr * error[u];
    for (int32_t k = 0; k < kNumFeatures; ++k) w[kFeatureOffsets[k] + nd.features[k]] += step;
    total += error[u];
    slope += error[u] * logit[u];
  }
  w[kNumWeights - 2] += kRerankLr * (total / n);
  w[kNumWeights - 1] += kRerankLr * (slope / n);
}

// One draft's outcome: actual[0, avail) are the tokens that followed it (avail <= kDepthMax). An anchor tries each
// depth below avail and the draft's reach (depths beyond its budget are no misses); the re-ranker takes one step.
void learn(const Pending& p, const int32_t* actual, int64_t avail, Learnt& L) {
  const int64_t seen = std::min<int64_t>(avail, p.reach);
  std::array<uint8_t, kMaxNodes> hit;  // [nodes] on the path of the realised tokens (the root included)
  hit[0] = 1;
  for (size_t u = 1; u < p.nodes.size(); ++u) {  // parents come before their children
    const PendingNode& nd = p.nodes[u];
    hit[u] = nd.depth <= avail && hit[nd.parent] && nd.token == actual[nd.depth - 1];
  }
  std::array<int32_t, kMaxAnchors> touched;  // [anchors] their classes
  for (size_t a = 0; a < p.anchors.size(); ++a) {
    const PendingAnchor& anchor = p.anchors[a];
    int32_t u = anchor.leaf;
    while (!hit[u]) u = p.nodes[u].parent;  // the deepest realised node of the anchor's path: its matched length
    int64_t* tries = L.tries.data() + static_cast<size_t>(anchor.cls) * kDepthMax;  // [kDepthMax]
    int64_t* hits = L.hits.data() + static_cast<size_t>(anchor.cls) * kDepthMax;
    for (int64_t d = 0; d < seen; ++d) ++tries[d];
    for (int32_t d = 0; d < p.nodes[u].depth; ++d) ++hits[d];
    touched[a] = anchor.cls;
  }
  rerank_step(p, avail, hit.data(), L.weights);
  auto* end = touched.begin() + p.anchors.size();
  std::sort(touched.begin(), end);
  for (auto* it = touched.begin(); it != end; it = std::upper_bound(it, end, *it)) L.update_rates(*it);
}

}  // namespace

void AnchorDrafter::resolve(Request& req, bool final) {
  const int64_t n = static_cast<int64_t>(req.ctx.size());
  auto due = [&](const Pending& p) { return final || n - p.pos >= kDepthMax; };
  if (std::none_of(req.pending.begin(), req.pending.end(), due)) return;
  // The due drafts learn in (pos, reach) order, whatever order a batch's threads appended a request's drafts in:
  // the re-ranker's steps do not commute (anchors.py _resolve).
  std::vector<uint32_t> order;
  for (size_t i = 0; i < req.pending.size(); ++i)
    if (due(req.pending[i])) order.push_back(static_cast<uint32_t>(i));
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const Pending &pa = req.pending[a], &pb = req.pending[b];
    return pa.pos != pb.pos ? pa.pos < pb.pos : pa.reach < pb.reach;
  });
  {
    std::unique_lock lock(stats_mu_);
    for (uint32_t i : order) {
      const Pending& p = req.pending[i];
      learn(p, req.ctx.data() + p.pos, std::min<int64_t>(n - p.pos, kDepthMax), learnt_);
    }
  }
  size_t kept = 0;
  for (size_t i = 0; i < req.pending.size(); ++i) {
    if (due(req.pending[i])) continue;
    if (kept != i) std::swap(req.pending[kept], req.pending[i]);  // keeps the order of the pending ones
    ++kept;
  }
  for (size_t i = kept; i < req.pending.size() && req.spare.size() < kMaxSpare; ++i)
    req.spare.push_back(std::move(req.pending[i]));
  req.pending.resize(kept);
}

// ---------------------------------------------------------------------------------------------------------------
// Drafting (anchors.py: _anchors, _draft)

namespace {

// Every kept anchor of the request into the scratch (anchors.py: _anchors).
void collect(const Config& cfg, const Learnt& learnt, const Request& req, const RunningGroup& group, Scratch& s) {
  const DraftSources& src = req.sources;
  const int64_t n = static_cast<int64_t>(req.ctx.size());
  const int64_t own = n - req.prompt_len + std::min<int64_t>(cfg.prompt_tail, req.prompt_len);
  s.originals.clear();
  Scan sc{cfg, req.ctx.data(), n, own, learnt, s.found, s.keys, s.copies, s.originals};
  auto scan_list = [&](int32_t source, const CorpusPtr* first, const CorpusPtr* last) {
    if (first == last) return;
    for (int32_t kind = 0; kind < 2; ++kind) scan_corpora(sc, source, kind, first, last);
    sc.add_rewritten();
  };
  // In (source, kind, rank) order, so that a found anchor's index breaks ties of the learnt rate.
  if (src.history) scan_list(kHistory, &src.history, &src.history + 1);
  if (src.siblings) scan_list(kSiblings, src.siblings->data(), src.siblings->data() + src.siblings->size());
  if (cfg.sources[kSelf]) {
    for (int32_t kind = 0; kind < 2; ++kind) scan_self(sc, kind, req.prev.data());
    sc.add_rewritten();
  }
  if (src.global_dir) {
    for (int32_t kind = 0; kind < 2; ++kind) scan_directory(sc, kGlobal, kind, *src.global_dir);
    sc.add_rewritten();
  }
  if (group) {
    for (int32_t kind = 0; kind < 2; ++kind) scan_running(sc, kind, *group, req);
    sc.add_rewritten();
  }
  sc.prune_keys();
}

// The best kMaxAnchors by learnt first-token rate (a rewritten copy whose continuation does not change is no
// anchor); each continuation's nodes multiply their miss by (1 - rate), building the trie into the pending draft p.
void build_trie(const Learnt& learnt, const int32_t* ctx, int64_t n, Scratch& s, int32_t budget, Pending& p) {
  std::sort(s.keys.begin(), s.keys.end(), selected_before);  // best first: the reference's sorted order
  const int64_t reach = std::min(budget, kDepthMax);
  p.reach = static_cast<int32_t>(reach);
  Trie& t = s.trie;
  p.nodes.reserve(1 + std::min<size_t>(s.keys.size(), kMaxAnchors) * reach);  // no reallocation while building
  t.reset(p.nodes);
  p.anchors.clear();
  // The next anchor's rates and continuation are cache misses (a 1.5 MB table, a corpus): ask for them one
  // anchor ahead.
  auto prefetch = [&](const Key& k) {
    const Found& f = s.found[k.index];
    prefetch_line(learnt.rates.data() + static_cast<size_t>(f.cls) * kDepthMax);
    prefetch_line(f.seq + f.j);
  };
  if (!s.keys.empty()) prefetch(s.keys.front());
  for (size_t i = 0; i < s.keys.size() && p.anchors.size() < kMaxAnchors; ++i) {
    if (i + 1 < s.keys.size()) prefetch(s.keys[i + 1]);
    const Found& f = s.found[s.keys[i].index];
    const int64_t len = std::min(reach, f.seq_len - f.j);
    const int32_t* cont = f.seq + f.j;
    if (f.rewritten) {
      int32_t* into = s.rewritten.data() + p.anchors.size() * kDepthMax;
      if (!rewrite(f, ctx, n, len, into)) continue;
      cont = into;
    }
    if (p.anchors.empty()) s.match_len = f.length;
    const double* rate = learnt.rates.data() + static_cast<size_t>(f.cls) * kDepthMax;  // [kDepthMax]
    const int32_t kind = f.cls / (kNumExtra * 4 * kNumLengthClasses) % kNumKinds;
    const int32_t source = f.cls / (kNumExtra * 4 * kNumLengthClasses * kNumKinds);
    const std::array<int32_t, 7> tally{f.cls / (kNumExtra * 4) % kNumLengthClasses, f.cls / kNumExtra % 4, kind == 1,
                                       kind >= kRewritten, source == kHistory, source == kSelf, source == kRunning};
    int32_t v = 0;
    for (int64_t d = 0; d < len; ++d) {
      v = t.child(v, cont[d]);
      t.add(v, rate[d], tally);
    }
    p.anchors.push_back({f.cls, static_cast<uint16_t>(v)});
  }
  t.count[0] = static_cast<int32_t>(p.anchors.size());
  t.assign_features();
}

}  // namespace

void AnchorDrafter::draft_one(Request& req, const RunningGroup& group, int32_t budget, Scratch& s, DraftOut& out) {
  out = DraftOut();
  if (budget <= 0) return;
  refresh_sources(req);
  s.found.clear();
  s.keys.clear();
  Pending p;
  {
    std::shared_lock lock(stats_mu_);
    collect(cfg_, learnt_, req, group, s);
    if (s.found.empty()) return;
    if (!req.spare.empty()) {  // reuse a resolved draft's buffers
      p = std::move(req.spare.back());
      req.spare.pop_back();
    }
    build_trie(learnt_, req.ctx.data(), static_cast<int64_t>(req.ctx.size()), s, budget, p);
    select_top(learnt_, s, budget);
  }
  fill_output(s, s.match_len, out);
  p.pos = static_cast<int64_t>(req.ctx.size());
  req.pending.push_back(std::move(p));  // after fill_output: the trie's nodes are p's
}

std::vector<DraftOut> AnchorDrafter::draft_batch(const std::vector<std::string>& req_ids,
                                                 const std::vector<int32_t>& budgets, std::vector<int64_t>* ns,
                                                 int32_t threads) {
  std::vector<std::shared_ptr<Request>> reqs;
  reqs.reserve(req_ids.size());
  for (const auto& id : req_ids) reqs.push_back(find_request(id));
  std::vector<DraftOut> out(req_ids.size());
  if (ns) ns->assign(reqs.size(), 0);
  const int32_t use = std::min<int32_t>(threads > 0 ? threads : pool_.threads(), pool_.threads());
  std::vector<std::unique_ptr<Scratch>> scratch(use);  // [threads] one per thread of the pool
  {
    std::lock_guard lock(scratch_mu_);
    for (auto& s : scratch) {
      if (scratch_pool_.empty()) break;
      s = std::move(scratch_pool_.back());
      scratch_pool_.pop_back();
    }
  }
  for (auto& s : scratch)
    if (!s) s = std::make_unique<Scratch>();
  pool_.run(reqs.size(), use, [&](size_t i, int32_t t) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      const RunningGroup group = running_group(*reqs[i]);
      LockAll lock(*reqs[i], group, scratch[t]->locks);
      draft_one(*reqs[i], group, budgets[i], *scratch[t], out[i]);
    }
    if (ns)
      (*ns)[i] = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  });
  std::lock_guard lock(scratch_mu_);
  for (auto& s : scratch) scratch_pool_.push_back(std::move(s));
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Introspection

std::array<std::vector<int64_t>, 2> AnchorDrafter::learnt_counts() const {
  std::shared_lock lock(stats_mu_);
  return {learnt_.tries, learnt_.hits};
}

std::vector<double> AnchorDrafter::learnt_weights() const {
  std::shared_lock lock(stats_mu_);
  return learnt_.weights;
}

size_t AnchorDrafter::memory_bytes() const {
  size_t total = sizeof(AnchorDrafter) + 2 * learnt_.tries.size() * sizeof(int64_t) +
                 learnt_.rates.size() * sizeof(double) + kNumWeights * sizeof(double);
  {
    std::shared_lock lock(sources_mu_);
    for (const auto& [id, e] : prompts_) {
      total += id.capacity() + sizeof(PromptSources);
      if (e.history) total += e.history->memory_bytes();
      if (e.siblings)
        for (const auto& c : *e.siblings) total += c->memory_bytes();
    }
    for (const auto& g : global_) total += g.second->memory_bytes();
    std::lock_guard dir_lock(global_dir_mu_);
    if (global_dir_) total += global_dir_->memory_bytes();
  }
  std::shared_lock lock(requests_mu_);
  for (const auto& [id, g] : running_) total += id.capacity() + sizeof(*g) + g->capacity() * sizeof(g->front());
  for (const auto& [id, r] : requests_) {
    std::lock_guard rl(r->mu);
    std::shared_lock cl(r->ctx_mu);
    total += id.capacity() + sizeof(Request) + r->ctx.capacity() * sizeof(int32_t);
    total += r->prev.capacity() * sizeof(int32_t) + r->last.slots().capacity() * sizeof(TokenTable::Slot);
    for (const auto* list : {&r->pending, &r->spare})
      for (const Pending& p : *list)
        total += sizeof(Pending) + p.nodes.capacity() * sizeof(PendingNode) +
                 p.anchors.capacity() * sizeof(PendingAnchor);
  }
  return total;
}


std::string AnchorDrafter::check_integrity() const {
  {
    std::shared_lock lock(stats_mu_);
    const Learnt& L = learnt_;
    for (size_t i = 0; i < L.tries.size(); ++i)
      if (L.hits[i] > L.tries[i] || L.hits[i] < 0) return "a learnt hit count exceeds its tries";
    for (double w : L.weights)
      if (!std::isfinite(w)) return "a re-ranker weight is not finite";
    for (int32_t c = 0; c < kNumClasses; ++c) {
      const size_t base = static_cast<size_t>(c) * kDepthMax;
      for (int32_t d = 1; d < kDepthMax; ++d) {
        if (L.tries[base + d] > L.tries[base + d - 1]) return "tries grow with depth";
        if (L.rates[base + d] > L.rates[base + d - 1]) return "rates grow with depth";
      }
    }
  }
  {
    std::shared_lock lock(sources_mu_);
    for (const auto& [id, e] : prompts_) {
      if (!e.history && !e.siblings) return "prompt " + id + " has neither history nor siblings";
      if (e.history) {
        const std::string h = e.history->check_integrity();
        if (!h.empty()) return "history[" + id + "]: " + h;
      }
      if (e.siblings)
        for (const auto& c : *e.siblings) {
          const std::string h = c->check_integrity();
          if (!h.empty()) return "siblings[" + id + "]: " + h;
        }
    }
    if ((global_list_ ? global_list_->size() : 0) != global_.size()) return "global list and corpora disagree";
    for (const auto& [key, c] : global_) {
      const std::string h = c->check_integrity();
      if (!h.empty()) return "global[" + std::to_string(key) + "]: " + h;
    }
  }
  std::shared_lock lock(requests_mu_);
  std::unordered_set<const Request*> running;  // the requests every running group must hold, once
  for (const auto& [id, r] : requests_) {
    std::lock_guard rl(r->mu);
    std::shared_lock cl(r->ctx_mu);
    const std::string h = r->check_integrity();
    if (!h.empty()) return "request " + id + ": " + h;
    if (r->running != (r->has_prompt && cfg_.sources[kRunning])) return "request " + id + ": wrong running flag";
    if (r->running) running.insert(r.get());
  }
  size_t grouped = 0;
  for (const auto& [id, g] : running_) {
    for (const auto& r : *g)  // prompt ids are immutable once a request is published
      if (!running.count(r.get()) || r->prompt_id != id) return "running group " + id + " holds a stale request";
    grouped += g->size();
  }
  return grouped == running.size() ? "" : "running groups and requests disagree";
}

}  // namespace anchors
}  // namespace histospec
