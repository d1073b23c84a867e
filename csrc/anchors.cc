#include "anchors.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <stdexcept>

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

int32_t score_bin(double raw) {  // how many score edges lie below raw
  int32_t c = 0;
  for (double e : kScoreEdges) c += e < raw;
  return c;
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
  return (((source * 2 + kind) * kNumLengthClasses + length_class(length)) * 4 + ham) * kNumExtra + extra;
}

Learnt::Learnt()
    : tries(static_cast<size_t>(kNumClasses) * kDepthMax, 0),
      hits(static_cast<size_t>(kNumClasses) * kDepthMax, 0),
      bin_nodes(kNumBins, 0),
      bin_hits(kNumBins, 0),
      rates(static_cast<size_t>(kNumClasses) * kDepthMax, 0.0) {
  for (int32_t c = 0; c < kNumClasses; ++c) update_rates(c);
}

void Learnt::update_rates(int32_t cls) {
  // raw[d] = (hits + RATE_PRIOR_NODES * prior[d]) / (tries + RATE_PRIOR_NODES), then a running minimum over d.
  const auto& p = prior();
  const size_t base = static_cast<size_t>(cls) * kDepthMax;
  for (int32_t d = 0; d < kDepthMax; ++d) {
    const double num = static_cast<double>(hits[base + d]) + static_cast<double>(kRatePriorNodes) * p[d];
    const double raw = num / static_cast<double>(tries[base + d] + kRatePriorNodes);
    rates[base + d] = d == 0 ? raw : std::min(rates[base + d - 1], raw);
  }
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
  return c;
}

std::pair<const Posting*, const Posting*> Corpus::postings(int32_t token) const {
  const TokenTable::Slot* e = table_.find(token);
  if (!e) return {nullptr, nullptr};
  return {postings_.data() + e->lo, postings_.data() + e->hi};
}

size_t Corpus::memory_bytes() const {
  return sizeof(Corpus) + tokens_.capacity() * sizeof(int32_t) + starts_.capacity() * sizeof(int64_t) +
         wclass_.capacity() + postings_.capacity() * sizeof(Posting) +
         table_.slots().capacity() * sizeof(TokenTable::Slot);
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
      const Posting& q = postings_[k > e.lo ? k - 1 : k];
      if (k > e.lo && (p.seq < q.seq || (p.seq == q.seq && p.j <= q.j)))
        return "postings of token " + std::to_string(e.token) + " are not oldest first";
    }
    grouped += e.hi - e.lo;
  }
  return grouped == expected ? "" : "the token table misses postings";
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

struct Found {  // a kept anchor: it drafts seq[j, seq_len)
  double rate0;  // learnt first-token rate of its class (the selection key)
  int32_t cls;
  int32_t source, kind, rank;
  const int32_t* seq;
  int64_t seq_len, j;
  int32_t length;
};

bool selected_before(const Found& a, const Found& b) {  // the reference's key (-rate0, source, kind, rank)
  if (a.rate0 != b.rate0) return a.rate0 > b.rate0;
  if (a.source != b.source) return a.source < b.source;
  if (a.kind != b.kind) return a.kind < b.kind;
  return a.rank < b.rank;
}

// What every candidate of one draft shares.
struct Scan {
  const Config& cfg;
  const int32_t* ctx;  // [n] the request's context
  int64_t n;
  int64_t own;         // the request's offset in a stored sequence
  const double* rates;  // [kNumClasses * kDepthMax]
  std::vector<Found>& found;

  void keep(int32_t s, int32_t kind, int32_t& rank, const int32_t* seq, int64_t seq_len, int64_t j, int32_t length,
            int32_t agree, int32_t extra) {
    const int32_t cls = anchor_class(s, kind, length, ham_class(agree), extra);
    found.push_back({rates[static_cast<size_t>(cls) * kDepthMax], cls, s, kind, rank++, seq, seq_len, j, length});
  }
};

// One source and kind over corpora [first, last), newest (last) first: of the kScan newest positions after
// ctx[n - 1 - kind], those matching at least the source's minimum length.
void scan_corpora(Scan& sc, int32_t s, int32_t kind, const CorpusPtr* first, const CorpusPtr* last) {
  const int64_t n = sc.n;
  if (n < 1 + kind) return;
  const int32_t key = sc.ctx[n - 1 - kind];
  const int32_t lmin = kind ? kSubMinMatch : s == kGlobal ? kGlobalMinMatch : sc.cfg.min_match;
  int32_t seen = 0, rank = 0;
  for (const CorpusPtr* it = last; it != first;) {
    const Corpus& corpus = **--it;
    const auto [lo, hi] = corpus.postings(key);
    for (const Posting* p = hi; p != lo;) {
      --p;
      if (seen == kScan) return;
      ++seen;
      const Span seq = corpus.sequence(p->seq);
      int64_t j = p->j;
      if (kind) {
        ++j;
        if (j >= seq.size || seq.data[j - 1] == sc.ctx[n - 1]) continue;
      }
      const int32_t length = match_length(seq.data, j - kind, sc.ctx, n - kind, sc.cfg.max_match);
      if (length < lmin) continue;
      int32_t extra = 0;
      if (s != kGlobal) extra = offset_class(std::abs(j - sc.own)) + (s == kHistory ? 4 * corpus.wclass(p->seq) : 0);
      sc.keep(s, kind, rank, seq.data, seq.size, j, length, agreement(seq.data, j, sc.ctx, n, length + kind), extra);
    }
  }
}

// The request's own context, newest first, never the trivial match at its end (positions: ctx[p] == token).
void scan_self(Scan& sc, int32_t kind, const std::unordered_map<int32_t, std::vector<int32_t>>& positions) {
  const int64_t n = sc.n;
  if (n < 2 + kind) return;
  const int32_t key = sc.ctx[n - 1 - kind];
  const int32_t lmin = kind ? kSubMinMatch : sc.cfg.min_match;
  const auto it = positions.find(key);
  if (it == positions.end()) return;
  const std::vector<int32_t>& pos = it->second;
  int32_t seen = 0, rank = 0;
  for (size_t k = pos.size(); k-- > 0;) {
    const int64_t jj = static_cast<int64_t>(pos[k]) + 1;  // ctx[jj - 1] == key
    if (jj > n - 1 - kind) continue;
    if (seen == kScan) break;
    ++seen;
    const int64_t j = jj + kind;
    if (kind && sc.ctx[j - 1] == sc.ctx[n - 1]) continue;
    const int32_t length = match_length(sc.ctx, j - kind, sc.ctx, n - kind, sc.cfg.max_match);
    if (length < lmin) continue;
    const int32_t extra = std::min(rank, 3);
    sc.keep(kSelf, kind, rank, sc.ctx, n, j, length, agreement(sc.ctx, j, sc.ctx, n, length + kind), extra);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The trie of the chosen anchors' continuations (anchors.py: _draft)

struct Trie {
  std::vector<int32_t> token, parent, depth, first_child, next_sibling;  // [nodes] node 0 is the root
  std::vector<double> miss, score;                                        // [nodes]
  std::vector<uint8_t> bin;                                               // [nodes]

  int32_t size() const { return static_cast<int32_t>(token.size()); }

  void reset() {
    for (auto* v : {&token, &parent, &depth, &first_child, &next_sibling}) v->assign(1, -1);
    depth[0] = 0;
    miss.assign(1, 1.0);
  }

  int32_t child(int32_t v, int32_t t) {  // the child of v for token t, created when missing
    for (int32_t c = first_child[v]; c >= 0; c = next_sibling[c])
      if (token[c] == t) return c;
    const int32_t c = size();
    token.push_back(t);
    parent.push_back(v);
    depth.push_back(depth[v] + 1);
    first_child.push_back(-1);
    next_sibling.push_back(first_child[v]);
    first_child[v] = c;
    miss.push_back(1.0);
    return c;
  }

  // Recalibrated, monotone node scores: q = (bin_hits + 2 raw) / (bin_nodes + 2), at most the parent's.
  void score_nodes(const Learnt& learnt) {
    score.assign(size(), 1.0);
    bin.assign(size(), 0);
    for (int32_t v = 1; v < size(); ++v) {
      const double raw = 1.0 - miss[v];
      const int32_t b = length_class(depth[v]) * kNumScoreBins + score_bin(raw);
      const double q = (static_cast<double>(learnt.bin_hits[b]) + static_cast<double>(kRecalPriorNodes) * raw) /
                       static_cast<double>(learnt.bin_nodes[b] + kRecalPriorNodes);
      score[v] = std::min(q, score[parent[v]]);
      bin[v] = static_cast<uint8_t>(b);
    }
  }
};

// Nodes [1, nodes) by (-score, depth, id): the first `budget`, then in output order (depth, id).
void select_top(const Trie& trie, int32_t budget, std::vector<int32_t>& top) {
  top.resize(trie.size() - 1);
  for (int32_t v = 1; v < trie.size(); ++v) top[v - 1] = v;
  auto better = [&](int32_t a, int32_t b) {
    if (trie.score[a] != trie.score[b]) return trie.score[a] > trie.score[b];
    if (trie.depth[a] != trie.depth[b]) return trie.depth[a] < trie.depth[b];
    return a < b;
  };
  if (budget < static_cast<int32_t>(top.size())) {
    std::nth_element(top.begin(), top.begin() + budget, top.end(), better);
    top.resize(budget);
  }
  std::sort(top.begin(), top.end(), [&](int32_t a, int32_t b) {
    return trie.depth[a] != trie.depth[b] ? trie.depth[a] < trie.depth[b] : a < b;
  });
}

void fill_output(const Trie& trie, const std::vector<int32_t>& top, int32_t match_len, DraftOut& out) {
  static thread_local std::vector<int32_t> out_index;
  out_index.assign(trie.size(), -1);
  const size_t k = top.size();
  out.tokens.resize(k);
  out.parents.resize(k);
  out.probs.resize(k);
  for (size_t i = 0; i < k; ++i) {
    const int32_t v = top[i];
    out_index[v] = static_cast<int32_t>(i);
    out.tokens[i] = trie.token[v];
    out.parents[i] = trie.parent[v] == 0 ? -1 : out_index[trie.parent[v]];  // parents come first (smaller depth)
    out.probs[i] = trie.score[v];
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
  PromptSources& entry = prompts_[prompt_id];
  auto next = entry.siblings ? std::make_shared<std::vector<CorpusPtr>>(*entry.siblings)
                             : std::make_shared<std::vector<CorpusPtr>>();
  next->push_back(std::move(corpus));
  entry.siblings = std::move(next);
}

void AnchorDrafter::clear_siblings() {
  std::unique_lock lock(sources_mu_);
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
  auto list = std::make_shared<std::vector<CorpusPtr>>();
  for (const auto& g : global_) list->push_back(g.second);
  global_list_ = std::move(list);
}

AnchorDrafter::Sources AnchorDrafter::sources_of(const Request& req) const {
  Sources src;
  std::shared_lock lock(sources_mu_);
  if (req.has_prompt && (cfg_.sources[kHistory] || cfg_.sources[kSiblings])) {
    auto it = prompts_.find(req.prompt_id);
    if (it != prompts_.end()) {
      if (cfg_.sources[kHistory]) src.history = it->second.history;
      if (cfg_.sources[kSiblings]) src.siblings = it->second.siblings;
    }
  }
  if (cfg_.sources[kGlobal]) src.global = global_list_;
  return src;
}

// ---------------------------------------------------------------------------------------------------------------
// Requests

void AnchorDrafter::start(const std::string& req_id, const std::string* prompt_id, Span prompt_tokens) {
  auto req = std::make_shared<Request>();
  req->has_prompt = prompt_id != nullptr;
  if (prompt_id) req->prompt_id = *prompt_id;
  req->ctx.assign(prompt_tokens.data, prompt_tokens.data + prompt_tokens.size);
  req->prompt_len = prompt_tokens.size;
  if (cfg_.sources[kSelf])
    for (int32_t i = 0; i < static_cast<int32_t>(req->ctx.size()); ++i) req->positions[req->ctx[i]].push_back(i);
  std::unique_lock lock(requests_mu_);
  requests_[req_id] = std::move(req);  // a restarted id drops its pending drafts unlearnt, as the reference does
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
  for (int64_t i = 0; i < tokens.size; ++i) {
    if (cfg_.sources[kSelf]) req->positions[tokens.data[i]].push_back(static_cast<int32_t>(req->ctx.size()));
    req->ctx.push_back(tokens.data[i]);
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
  }
  std::lock_guard lock(req->mu);
  resolve(*req, true);
}

// ---------------------------------------------------------------------------------------------------------------
// Learning (anchors.py: _resolve): every pending draft whose next kDepthMax tokens are known (all when final).

void AnchorDrafter::resolve(Request& req, bool final) {
  const int64_t n = static_cast<int64_t>(req.ctx.size());
  auto due = [&](const Pending& p) { return final || n - p.pos >= kDepthMax; };
  if (std::none_of(req.pending.begin(), req.pending.end(), due)) return;
  static thread_local std::vector<uint8_t> hit;  // [nodes] on the path of the realised tokens (root included)
  static thread_local std::vector<int32_t> touched;
  touched.clear();
  std::unique_lock lock(stats_mu_);
  Learnt& L = learnt_;
  size_t kept = 0;
  for (size_t i = 0; i < req.pending.size(); ++i) {
    Pending& p = req.pending[i];
    if (!due(p)) {
      if (kept != i) std::swap(req.pending[kept], p);
      ++kept;
      continue;
    }
    const int64_t avail = std::min<int64_t>(n - p.pos, kDepthMax);
    const int32_t* actual = req.ctx.data() + p.pos;  // [avail]
    hit.assign(p.nodes.size(), 1);
    for (size_t u = 1; u < p.nodes.size(); ++u) {  // parents come before their children
      const PendingNode& nd = p.nodes[u];
      hit[u] = nd.depth <= avail && hit[nd.parent] && nd.token == actual[nd.depth - 1];
    }
    for (const PendingAnchor& a : p.anchors) {
      int32_t u = a.leaf;
      while (!hit[u]) u = p.nodes[u].parent;  // the deepest realised node of the anchor's path
      const int32_t m = p.nodes[u].depth;
      int64_t* tries = L.tries.data() + static_cast<size_t>(a.cls) * kDepthMax;
      int64_t* hits = L.hits.data() + static_cast<size_t>(a.cls) * kDepthMax;
      for (int64_t d = 0; d < avail; ++d) ++tries[d];
      for (int32_t d = 0; d < m; ++d) ++hits[d];
      touched.push_back(a.cls);
    }
    for (size_t u = 1; u < p.nodes.size(); ++u) {
      if (p.nodes[u].depth > avail) continue;
      ++L.bin_nodes[p.nodes[u].bin];
      L.bin_hits[p.nodes[u].bin] += hit[u];
    }
  }
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (int32_t cls : touched) L.update_rates(cls);
  lock.unlock();
  for (size_t i = kept; i < req.pending.size(); ++i) req.spare.push_back(std::move(req.pending[i]));
  req.pending.resize(kept);
}

// ---------------------------------------------------------------------------------------------------------------
// Drafting (anchors.py: _anchors, _draft)

void AnchorDrafter::draft_one(Request& req, int32_t budget, DraftOut& out) {
  out = DraftOut();
  if (budget <= 0) return;
  const Sources src = sources_of(req);
  static thread_local std::vector<Found> found;
  static thread_local Trie trie;
  static thread_local std::vector<int32_t> top;
  found.clear();
  std::shared_lock lock(stats_mu_);
  const int64_t n = static_cast<int64_t>(req.ctx.size());
  const int64_t own = n - req.prompt_len + std::min<int64_t>(cfg_.prompt_tail, req.prompt_len);
  Scan sc{cfg_, req.ctx.data(), n, own, learnt_.rates.data(), found};
  auto scan_list = [&](int32_t s, const CorpusList& list) {
    if (!list || list->empty()) return;
    for (int32_t kind = 0; kind < 2; ++kind) scan_corpora(sc, s, kind, list->data(), list->data() + list->size());
  };
  if (src.history)
    for (int32_t kind = 0; kind < 2; ++kind) scan_corpora(sc, kHistory, kind, &src.history, &src.history + 1);
  scan_list(kSiblings, src.siblings);
  scan_list(kGlobal, src.global);
  if (cfg_.sources[kSelf])
    for (int32_t kind = 0; kind < 2; ++kind) scan_self(sc, kind, req.positions);
  if (found.empty()) return;

  // The best kMaxAnchors by learnt first-token rate, then their continuations' trie with noisy-OR misses.
  const size_t num = std::min<size_t>(found.size(), kMaxAnchors);
  std::partial_sort(found.begin(), found.begin() + num, found.end(), selected_before);
  const int64_t reach = std::min<int32_t>(budget, kDepthMax);
  Pending p;
  if (!req.spare.empty()) {
    p = std::move(req.spare.back());
    req.spare.pop_back();
  }
  p.pos = n;
  p.anchors.clear();
  trie.reset();
  for (size_t a = 0; a < num; ++a) {
    const Found& f = found[a];
    const double* rate = learnt_.rates.data() + static_cast<size_t>(f.cls) * kDepthMax;
    const int64_t len = std::min(reach, f.seq_len - f.j);
    int32_t v = 0;
    for (int64_t d = 0; d < len; ++d) {
      v = trie.child(v, f.seq[f.j + d]);
      trie.miss[v] *= 1.0 - rate[d];
    }
    p.anchors.push_back({f.cls, static_cast<uint16_t>(v)});
  }
  trie.score_nodes(learnt_);
  lock.unlock();
  p.nodes.resize(trie.size());
  p.nodes[0] = {0, 0, 0, 0};
  for (int32_t v = 1; v < trie.size(); ++v)
    p.nodes[v] = {trie.token[v], static_cast<uint16_t>(trie.parent[v]), static_cast<uint8_t>(trie.depth[v]),
                  trie.bin[v]};
  req.pending.push_back(std::move(p));
  select_top(trie, budget, top);
  fill_output(trie, top, found[0].length, out);
}

std::vector<DraftOut> AnchorDrafter::draft_batch(const std::vector<std::string>& req_ids,
                                                 const std::vector<int32_t>& budgets, std::vector<int64_t>* ns) {
  std::vector<std::shared_ptr<Request>> reqs;
  reqs.reserve(req_ids.size());
  for (const auto& id : req_ids) reqs.push_back(find_request(id));
  std::vector<DraftOut> out(req_ids.size());
  if (ns) ns->assign(reqs.size(), 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(reqs[i]->mu);
      draft_one(*reqs[i], budgets[i], out[i]);
    }
    if (ns)
      (*ns)[i] = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Introspection

std::array<std::vector<int64_t>, 4> AnchorDrafter::learnt_counts() const {
  std::shared_lock lock(stats_mu_);
  return {learnt_.tries, learnt_.hits, learnt_.bin_nodes, learnt_.bin_hits};
}

size_t AnchorDrafter::memory_bytes() const {
  size_t total = sizeof(AnchorDrafter) + 2 * learnt_.tries.size() * sizeof(int64_t) +
                 learnt_.rates.size() * sizeof(double) + 2 * kNumBins * sizeof(int64_t);
  {
    std::shared_lock lock(sources_mu_);
    for (const auto& [id, e] : prompts_) {
      total += id.capacity() + sizeof(PromptSources);
      if (e.history) total += e.history->memory_bytes();
      if (e.siblings)
        for (const auto& c : *e.siblings) total += c->memory_bytes();
    }
    for (const auto& g : global_) total += g.second->memory_bytes();
  }
  std::shared_lock lock(requests_mu_);
  for (const auto& [id, r] : requests_) {
    std::lock_guard rl(r->mu);
    total += id.capacity() + sizeof(Request) + r->ctx.capacity() * sizeof(int32_t);
    for (const auto& [t, v] : r->positions) total += sizeof(t) + v.capacity() * sizeof(int32_t) + 16;
    for (const auto* list : {&r->pending, &r->spare})
      for (const Pending& p : *list)
        total += sizeof(Pending) + p.nodes.capacity() * sizeof(PendingNode) +
                 p.anchors.capacity() * sizeof(PendingAnchor);
  }
  return total;
}

namespace {

std::string check_pending(const Pending& p, int64_t ctx_len) {
  if (p.pos < 0 || p.pos > ctx_len) return "a pending draft lies beyond the context";
  if (p.nodes.empty() || p.anchors.empty()) return "a pending draft without nodes or anchors";
  for (size_t u = 1; u < p.nodes.size(); ++u) {
    const PendingNode& nd = p.nodes[u];
    if (nd.parent >= u || nd.depth != p.nodes[nd.parent].depth + 1 || nd.depth > kDepthMax || nd.bin >= kNumBins ||
        nd.bin / kNumScoreBins != length_class(nd.depth))
      return "a pending trie node is inconsistent";
  }
  for (const PendingAnchor& a : p.anchors)
    if (a.cls < 0 || a.cls >= kNumClasses || a.leaf == 0 || a.leaf >= p.nodes.size())
      return "a pending anchor is out of range";
  return "";
}

}  // namespace

std::string AnchorDrafter::check_integrity() const {
  {
    std::shared_lock lock(stats_mu_);
    const Learnt& L = learnt_;
    for (size_t i = 0; i < L.tries.size(); ++i)
      if (L.hits[i] > L.tries[i] || L.hits[i] < 0) return "a learnt hit count exceeds its tries";
    for (int32_t b = 0; b < kNumBins; ++b)
      if (L.bin_hits[b] > L.bin_nodes[b] || L.bin_hits[b] < 0) return "a learnt hit count exceeds its tries";
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
  for (const auto& [id, r] : requests_) {
    std::lock_guard rl(r->mu);
    for (const Pending& p : r->pending) {
      const std::string h = check_pending(p, static_cast<int64_t>(r->ctx.size()));
      if (!h.empty()) return "request " + id + ": " + h;
      if (static_cast<int64_t>(r->ctx.size()) - p.pos >= kDepthMax) return "request " + id + ": a due draft is pending";
    }
  }
  return "";
}

}  // namespace anchors
}  // namespace histospec
