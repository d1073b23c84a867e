#include "drafter.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <stdexcept>
#include <type_traits>

namespace histospec {

constexpr int64_t kWeightOne = 65536;

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Best-first expansion (docs/drafting.md section 5), generic over how a source enumerates children.
// A source type provides `Node` (with an int64_t `w` field) and
//   void children(const Node& node, int64_t min_w, Emit&& emit)  -> emit(token, Node) in ascending token order,
// where children whose weight is below min_w may be skipped (they cannot reach min_prob).

struct Cand {
  double p;
  int64_t seq;
  int32_t parent_sel;  // pop rank of the parent, -1 for the root
  int32_t token;
  int32_t node;        // index into the node store
};

struct CandLess {  // max-heap on p, ties: the smallest seq first
  bool operator()(const Cand& a, const Cand& b) const { return a.p < b.p || (a.p == b.p && a.seq > b.seq); }
};

struct Selected {
  int32_t token;
  int32_t parent_sel;
  double p;
};

int64_t min_weight_for(double min_prob, double p_parent, int64_t w_parent) {
  if (min_prob <= 0.0) return 1;
  const double need = min_prob / p_parent * static_cast<double>(w_parent) * (1.0 - 1e-9);
  if (need <= 1.0) return 1;
  if (need >= 9.0e18) return INT64_MAX;
  return static_cast<int64_t>(need);
}

struct IndexSource;

template <class Src>
bool expand(Src& src, const typename Src::Node& root, int32_t budget, const Config& cfg, DraftOut& out,
            std::vector<TreeNode>* record = nullptr) {
  using Node = typename Src::Node;
  // Per-thread scratch, reused across calls (expand is not re-entered): no allocation per draft.
  static thread_local std::vector<Node> nodes;
  static thread_local std::vector<Cand> heap;
  static thread_local std::vector<Selected> sel;
  static thread_local std::vector<int32_t> first_child, next_sibling, last_child, order, out_index;
  nodes.clear();
  heap.clear();
  sel.clear();
  nodes.push_back(root);
  int64_t seq = 0;
  auto push_children = [&](int32_t ni, double p_parent, int32_t parent_sel) {
    const int64_t w_parent = nodes[ni].w;
    const int64_t min_w = min_weight_for(cfg.min_prob, p_parent, w_parent);
    src.children(nodes[ni], min_w, [&](int32_t token, Node&& child) {
      const double q = static_cast<double>(child.w) / static_cast<double>(w_parent);
      const double p = p_parent * q;
      if (p < cfg.min_prob) return;
      if constexpr (std::is_same_v<Src, IndexSource>) {
        if (record) record->push_back({ni, token, child.r});
      }
      nodes.push_back(std::move(child));
      heap.push_back({p, seq++, parent_sel, token, static_cast<int32_t>(nodes.size() - 1)});
      std::push_heap(heap.begin(), heap.end(), CandLess());
    });
  };
  if constexpr (std::is_same_v<Src, IndexSource>) {
    if (record) record->assign(1, {-1, -1, root.r});
  }
  push_children(0, 1.0, -1);
  while (static_cast<int32_t>(sel.size()) < budget && !heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), CandLess());
    const Cand c = heap.back();
    heap.pop_back();
    if (c.p < cfg.min_prob) break;
    sel.push_back({c.token, c.parent_sel, c.p});
    if (!cfg.tree) heap.clear();
    if (static_cast<int32_t>(sel.size()) < budget) push_children(c.node, c.p, static_cast<int32_t>(sel.size()) - 1);
  }
  if (sel.empty()) return false;
  // BFS output: children lists in pop order, traversed breadth-first from the root.
  const int32_t k = static_cast<int32_t>(sel.size());
  first_child.assign(k + 1, -1);
  next_sibling.assign(k, -1);
  last_child.assign(k + 1, -1);
  for (int32_t i = 0; i < k; ++i) {
    const int32_t par = sel[i].parent_sel + 1;  // 0 = root
    if (last_child[par] < 0) first_child[par] = i; else next_sibling[last_child[par]] = i;
    last_child[par] = i;
  }
  order.clear();
  out_index.assign(k, -1);
  for (int32_t c = first_child[0]; c >= 0; c = next_sibling[c]) order.push_back(c);
  for (size_t h = 0; h < order.size(); ++h)
    for (int32_t c = first_child[order[h] + 1]; c >= 0; c = next_sibling[c]) order.push_back(c);
  out.tokens.resize(k);
  out.parents.resize(k);
  out.probs.resize(k);
  for (int32_t o = 0; o < k; ++o) {
    const Selected& s = sel[order[o]];
    out_index[order[o]] = o;
    out.tokens[o] = s.token;
    out.parents[o] = s.parent_sel < 0 ? -1 : out_index[s.parent_sel];
    out.probs[o] = s.p;
  }
  return true;
}

// Children of suffix-array ranges of an Index.
struct IndexSource {
  static constexpr int32_t kSmallRange = 64;
  struct Node {
    Range r;
    int32_t depth;  // length of the node's string
    int64_t w;
  };
  const Index& x;
  bool use_frequency;

  int64_t weight(Range r) const { return use_frequency ? x.weight(r) : x.max_weight(r); }

  template <class Emit>
  void children(const Node& nd, int64_t min_w, Emit&& emit) const {
    const int32_t d = nd.depth, hi = nd.r.hi;
    int32_t lo = nd.r.lo;
    if (lo < hi && x.token_at(lo, d) == SEP) lo = x.group_end(lo, hi, d);  // occurrences ending here
    if (lo >= hi) return;
    const int64_t total = x.wsum(hi) - x.wsum(lo);
    if (use_frequency && min_w > 1 && total / min_w < (hi - lo) / 4) {
      // Every child of weight >= min_w contains a weight offset k * min_w: probe only those rows.
      int64_t offset = 0;
      while (offset < total) {
        const int32_t row = x.row_at_weight(lo, hi, offset);
        const int32_t t = x.token_at(row, d);
        const Range g = x.child({lo, row + 1}, d, t);  // start of the group (ends after row)
        const int32_t end = x.group_end(row, hi, d);
        const Range grp{g.lo, end};
        const int64_t w = x.weight(grp);
        if (w >= min_w) emit(t, Node{grp, d + 1, w});
        const int64_t next = x.wsum(end) - x.wsum(lo);  // first offset after the group, rounded up to the grid
        offset = (next + min_w - 1) / min_w * min_w;
      }
      return;
    }
    if (hi - lo <= kSmallRange) {  // gather the tokens first: independent loads instead of dependent probes
      int32_t tok[kSmallRange];
      for (int32_t i = lo; i < hi; ++i) tok[i - lo] = x.token_at(i, d);
      for (int32_t i = lo; i < hi;) {
        int32_t end = i + 1;
        while (end < hi && tok[end - lo] == tok[i - lo]) ++end;
        const Range grp{i, end};
        const int64_t w = weight(grp);
        if (w >= min_w) emit(tok[i - lo], Node{grp, d + 1, w});
        i = end;
      }
      return;
    }
    for (int32_t i = lo; i < hi;) {
      const int32_t end = x.group_end(i, hi, d);
      const Range grp{i, end};
      const int64_t w = weight(grp);
      if (w >= min_w) emit(x.token_at(i, d), Node{grp, d + 1, w});
      i = end;
    }
  }
};

// Children for the self source: explicit occurrence end positions in the request's context.
struct SelfSource {
  struct Node {
    std::vector<int32_t> ends;  // end position of each occurrence of the node's string
    int64_t w;
  };
  const std::vector<int32_t>& ctx;
  bool use_frequency;

  template <class Emit>
  void children(const Node& nd, int64_t min_w, Emit&& emit) const {
    const int32_t n = static_cast<int32_t>(ctx.size());
    static thread_local std::vector<std::pair<int32_t, int32_t>> next;  // (token, end + 1)
    next.clear();
    for (int32_t j : nd.ends)
      if (j + 1 < n) next.emplace_back(ctx[j + 1], j + 1);
    std::sort(next.begin(), next.end());
    for (size_t i = 0; i < next.size();) {
      size_t e = i;
      while (e < next.size() && next[e].first == next[i].first) ++e;
      const int64_t w = use_frequency ? static_cast<int64_t>(e - i) * kWeightOne : kWeightOne;
      if (w >= min_w) {
        Node child{{}, w};
        child.ends.reserve(e - i);
        for (size_t k = i; k < e; ++k) child.ends.push_back(next[k].second);
        emit(next[i].first, std::move(child));
      }
      i = e;
    }
  }
};

// Children over several index parts of one source: counts add up (or take the max) across parts.
struct MultiSource {
  using Parts = std::vector<std::pair<int32_t, Range>>;  // (part, rows in that part)
  struct Node {
    Parts parts;
    int32_t depth;
    int64_t w;
  };
  const std::vector<IndexPtr>& xs;
  bool use_frequency;

  int64_t weight(const Parts& parts) const {
    int64_t w = 0;
    for (const auto& [i, r] : parts) w = use_frequency ? w + xs[i]->weight(r) : std::max(w, xs[i]->max_weight(r));
    return w;
  }

  template <class Emit>
  void children(const Node& nd, int64_t min_w, Emit&& emit) const {
    const int32_t d = nd.depth;
    struct Cursor {
      int32_t part, row, hi, token;
    };
    std::vector<Cursor> cur;
    for (const auto& [i, r] : nd.parts) {
      const Index& x = *xs[i];
      int32_t lo = r.lo;
      if (lo < r.hi && x.token_at(lo, d) == SEP) lo = x.group_end(lo, r.hi, d);
      if (lo < r.hi) cur.push_back({i, lo, r.hi, x.token_at(lo, d)});
    }
    while (!cur.empty()) {  // k-way merge of the parts' child groups, ascending token
      int32_t t = cur[0].token;
      for (const Cursor& k : cur) t = std::min(t, k.token);
      Node child{{}, d + 1, 0};
      for (Cursor& k : cur) {
        if (k.token != t) continue;
        const Index& x = *xs[k.part];
        const int32_t end = x.group_end(k.row, k.hi, d);
        child.parts.emplace_back(k.part, Range{k.row, end});
        k.row = end;
        k.token = end < k.hi ? x.token_at(end, d) : -2;
      }
      cur.erase(std::remove_if(cur.begin(), cur.end(), [](const Cursor& k) { return k.row >= k.hi; }), cur.end());
      child.w = weight(child.parts);
      if (child.w >= min_w) emit(t, std::move(child));
    }
  }
};

// Union of several sources' drafts (docs/drafting.md section 6): one trie keyed by token path, path probabilities
// summed in source order and divided by k, then expanded best-first (ties: push order) and output in BFS order.
void merge_drafts(const DraftOut* cands, int32_t k, int32_t budget, DraftOut& out) {
  struct UNode {
    int32_t token, parent, depth;
    double p;
    int32_t first_child, next_sibling;  // children kept in ascending token order
  };
  static thread_local std::vector<UNode> nodes;
  static thread_local std::vector<int32_t> ids, sel, pop_rank, out_index, order;
  static thread_local std::vector<Cand> heap;
  nodes.clear();
  heap.clear();
  sel.clear();
  int32_t root_first = -1;
  int32_t match_len = 0;
  size_t total = 0;
  for (int32_t c = 0; c < k; ++c) total += cands[c].tokens.size();
  nodes.reserve(total);  // no reallocation below: `link` points into nodes
  for (int32_t c = 0; c < k; ++c) {
    const DraftOut& d = cands[c];
    match_len = std::max(match_len, d.match_len);
    ids.assign(d.tokens.size(), -1);
    for (size_t i = 0; i < d.tokens.size(); ++i) {
      const int32_t par = d.parents[i] < 0 ? -1 : ids[d.parents[i]];
      int32_t* link = par < 0 ? &root_first : &nodes[par].first_child;
      const int32_t t = d.tokens[i];
      while (*link >= 0 && nodes[*link].token < t) link = &nodes[*link].next_sibling;
      int32_t v = *link;
      if (v < 0 || nodes[v].token != t) {
        v = static_cast<int32_t>(nodes.size());
        const int32_t depth = par < 0 ? 0 : nodes[par].depth + 1;
        nodes.push_back(UNode{t, par, depth, 0.0, -1, *link});
        *link = v;
      }
      nodes[v].p += d.probs[i];
      ids[i] = v;
    }
  }
  const double kf = static_cast<double>(k);
  int64_t seq = 0;
  auto push = [&](int32_t first, int32_t parent_rank) {
    for (int32_t v = first; v >= 0; v = nodes[v].next_sibling) {
      heap.push_back(Cand{nodes[v].p / kf, seq++, parent_rank, nodes[v].token, v});
      std::push_heap(heap.begin(), heap.end(), CandLess());
    }
  };
  push(root_first, -1);
  pop_rank.assign(nodes.size(), -1);
  while (!heap.empty() && static_cast<int32_t>(sel.size()) < budget) {
    std::pop_heap(heap.begin(), heap.end(), CandLess());
    const Cand c = heap.back();
    heap.pop_back();
    pop_rank[c.node] = static_cast<int32_t>(sel.size());
    sel.push_back(c.node);
    push(nodes[c.node].first_child, pop_rank[c.node]);
  }
  // BFS output: by depth, then the parent's output index, then pop rank
  order = sel;
  out_index.assign(nodes.size(), -1);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return nodes[a].depth < nodes[b].depth; });
  size_t lo = 0;
  while (lo < order.size()) {
    size_t hi = lo;
    while (hi < order.size() && nodes[order[hi]].depth == nodes[order[lo]].depth) ++hi;
    std::sort(order.begin() + lo, order.begin() + hi, [&](int32_t a, int32_t b) {
      const int32_t pa = nodes[a].parent < 0 ? -1 : out_index[nodes[a].parent];
      const int32_t pb = nodes[b].parent < 0 ? -1 : out_index[nodes[b].parent];
      return pa != pb ? pa < pb : pop_rank[a] < pop_rank[b];
    });
    for (size_t i = lo; i < hi; ++i) out_index[order[i]] = static_cast<int32_t>(i);
    lo = hi;
  }
  out = DraftOut();
  out.tokens.reserve(order.size());
  for (int32_t v : order) {
    out.tokens.push_back(nodes[v].token);
    out.parents.push_back(nodes[v].parent < 0 ? -1 : out_index[nodes[v].parent]);
    out.probs.push_back(nodes[v].p / kf);
  }
  out.match_len = match_len;
  out.source = kMixed;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Mutations

void Drafter::set_history(const std::string& prompt_id, const std::vector<Span>& seqs,
                          const std::vector<int64_t>& weights) {
  IndexPtr built;
  if (!seqs.empty()) built = Index::build(seqs, weights, !cfg_.use_frequency);  // outside the lock
  std::unique_lock lock(prompts_mu_);
  if (built) {
    prompts_[prompt_id].history = std::move(built);  // readers holding the old pointer keep it alive
  } else {
    auto it = prompts_.find(prompt_id);
    if (it == prompts_.end()) return;
    it->second.history.reset();
    if (it->second.sibling_parts.empty()) prompts_.erase(it);
  }
}

void Drafter::add_sibling(const std::string& prompt_id, Span seq, int64_t weight) {
  std::lock_guard writer(sibling_write_mu_);
  std::vector<IndexPtr> parts;
  {
    std::shared_lock lock(prompts_mu_);
    auto it = prompts_.find(prompt_id);
    if (it != prompts_.end()) parts = it->second.sibling_parts;
  }
  // Binary counter, built without holding prompts_mu_ (readers keep drafting from the old parts).
  parts.push_back(Index::build({seq}, {weight}, !cfg_.use_frequency));
  while (parts.size() >= 2 && parts[parts.size() - 2]->num_seqs() == parts.back()->num_seqs()) {
    std::vector<Span> spans;
    std::vector<int64_t> weights;
    for (size_t k = parts.size() - 2; k < parts.size(); ++k)
      for (int32_t q = 0; q < parts[k]->num_seqs(); ++q) {
        spans.push_back(parts[k]->sequence(q));
        weights.push_back(parts[k]->seq_weight(q));
      }
    IndexPtr merged = Index::build(spans, weights, !cfg_.use_frequency);
    parts.pop_back();
    parts.back() = std::move(merged);
  }
  std::unique_lock lock(prompts_mu_);
  prompts_[prompt_id].sibling_parts = std::move(parts);
}

void Drafter::clear_siblings() {
  std::lock_guard writer(sibling_write_mu_);
  std::unique_lock lock(prompts_mu_);
  for (auto it = prompts_.begin(); it != prompts_.end();) {
    it->second.sibling_parts.clear();
    if (!it->second.history) it = prompts_.erase(it); else ++it;
  }
}

void Drafter::add_global(int64_t key, const std::vector<Span>& seqs, const std::vector<int64_t>& weights) {
  std::lock_guard lock(global_mu_);
  auto& g = global_groups_[key];
  if (g.first.empty() && g.second.empty())
    global_order_.push_back(key);
  g.first.clear();
  for (const Span& s : seqs) g.first.emplace_back(s.data, s.data + s.size);
  g.second = weights;
  global_dirty_ = true;
}

void Drafter::remove_global(int64_t key) {
  std::lock_guard lock(global_mu_);
  if (global_groups_.erase(key)) {
    global_order_.erase(std::find(global_order_.begin(), global_order_.end(), key));
    global_dirty_ = true;
  }
}

IndexPtr Drafter::global_index() {
  std::lock_guard lock(global_mu_);
  if (global_dirty_) {
    std::vector<Span> spans;
    std::vector<int64_t> weights;
    for (int64_t key : global_order_) {
      const auto& g = global_groups_.at(key);
      for (size_t i = 0; i < g.first.size(); ++i) {
        spans.push_back({g.first[i].data(), static_cast<int64_t>(g.first[i].size())});
        weights.push_back(g.second[i]);
      }
    }
    global_index_ = spans.empty() ? nullptr : Index::build(spans, weights, !cfg_.use_frequency);
    global_dirty_ = false;
  }
  return global_index_;
}

void Drafter::start(const std::string& req_id, const std::string* prompt_id, Span prompt_tokens) {
  auto req = std::make_shared<Request>();
  req->has_prompt = prompt_id != nullptr;
  if (prompt_id) req->prompt_id = *prompt_id;
  req->ctx.assign(prompt_tokens.data, prompt_tokens.data + prompt_tokens.size);
  if (cfg_.sources[kSelf])
    for (int32_t i = 0; i < static_cast<int32_t>(req->ctx.size()); ++i) req->positions[req->ctx[i]].push_back(i);
  std::unique_lock lock(requests_mu_);
  requests_[req_id] = std::move(req);
}

std::shared_ptr<Request> Drafter::find_request(const std::string& req_id) const {
  std::shared_lock lock(requests_mu_);
  auto it = requests_.find(req_id);
  if (it == requests_.end()) throw std::out_of_range(req_id);
  return it->second;
}

bool Drafter::has_request(const std::string& req_id) const {
  std::shared_lock lock(requests_mu_);
  return requests_.count(req_id) > 0;
}

void Drafter::extend(const std::string& req_id, Span tokens) {
  auto req = find_request(req_id);
  std::lock_guard lock(req->mu);
  for (int64_t i = 0; i < tokens.size; ++i) {
    if (cfg_.sources[kSelf]) req->positions[tokens.data[i]].push_back(static_cast<int32_t>(req->ctx.size()));
    req->ctx.push_back(tokens.data[i]);
  }
}

void Drafter::remove_request(const std::string& req_id) {
  std::unique_lock lock(requests_mu_);
  requests_.erase(req_id);
}

// ---------------------------------------------------------------------------------------------------------------
// Drafting

void Drafter::longest_match(const Index& index, const std::vector<int32_t>& c, MatchCache& cache) const {
  const int64_t n = static_cast<int64_t>(c.size());
  const int32_t cap = static_cast<int32_t>(std::min<int64_t>(cfg_.max_match, n));
  auto find_suffix = [&](int32_t len) { return index.find(c.data() + (n - len), len); };

  // 1. The longest suffix (<= cap) that occurs: advance the cached state by the new tokens when possible.
  int32_t len = -1;
  Range range;
  int32_t upper = cap;    // the longest occurring suffix is at most this
  bool mismatch = false;  // the cached match was lost: the new longest match is usually short
  if (cache.index_id == index.id() && cache.ctx_len <= n) {
    len = cache.len;
    range = cache.range;
    int32_t cursor = cache.tree.empty() ? -1 : 0;  // node of the last draft tree matching the state
    for (int64_t k = cache.ctx_len; k < n; ++k) {
      Range next;
      int32_t found = -1;
      if (cursor >= 0) {
        for (int32_t j = cursor + 1; j < static_cast<int32_t>(cache.tree.size()); ++j)
          if (cache.tree[j].parent == cursor && cache.tree[j].token == c[k]) {
            found = j;
            break;
          }
      }
      if (found >= 0) {
        next = cache.tree[found].range;
      } else {
        next = len == 0 ? index.first(c[k]) : index.child(range, len, c[k]);
      }
      cursor = found;
      if (next.empty()) {
        mismatch = true;
        upper = static_cast<int32_t>(std::min<int64_t>(cap, len + (n - k - 1)));
        len = -1;
        break;
      }
      range = next;
      ++len;
    }
    if (len > cfg_.max_match) {
      // Slide the window once: the last max_match tokens of the longer match start (len - max_match) positions
      // later in any of its occurrences; their rows surround that suffix's own row.
      range = index.widen(static_cast<int64_t>(index.position(range.lo)) + (len - cfg_.max_match), cfg_.max_match);
      len = cfg_.max_match;
    }
  }
  if (len < 0) {
    // Occurrence is monotone in the length. Invariant: length lo occurs (rows lo_range), lengths > hi do not.
    int32_t lo = 0, hi = upper;
    Range lo_range = index.all();
    if (mismatch) {  // exponential search upwards from length 1
      for (int32_t probe = 1; probe <= hi; probe *= 2) {
        const Range r = find_suffix(probe);
        if (r.empty()) {
          hi = probe - 1;
          break;
        }
        lo = probe;
        lo_range = r;
      }
    } else if (hi > 0) {  // sliding window at max_match, or a fresh state: the longest length usually occurs
      const Range top = find_suffix(hi);
      if (top.empty()) {
        --hi;
      } else {
        lo = hi;
        lo_range = top;
      }
    }
    while (lo < hi) {
      const int32_t mid = lo + (hi - lo + 1) / 2;
      const Range r = find_suffix(mid);
      if (r.empty()) {
        hi = mid - 1;
      } else {
        lo = mid;
        lo_range = r;
      }
    }
    len = lo;
    range = lo_range;
  }
  cache.index_id = index.id();
  cache.ctx_len = n;
  cache.len = len;
  cache.range = range;
  cache.tree.clear();  // keeps its capacity
}

bool Drafter::draft_from_parts(const std::vector<IndexPtr>& parts, Request& req, std::vector<MatchCache>& caches,
                               int32_t budget, DraftOut& out) {
  const std::vector<int32_t>& c = req.ctx;
  const int64_t n = static_cast<int64_t>(c.size());
  // 1. Per part, the longest occurring suffix, advanced from the cached state of the same part.
  int32_t longest = 0;
  const bool aligned = caches.size() == parts.size() &&
                       std::equal(parts.begin(), parts.end(), caches.begin(),
                                  [](const IndexPtr& x, const MatchCache& mc) { return x->id() == mc.index_id; });
  if (!aligned) {  // parts changed (new history, sibling merges): keep the states of the parts still present
    std::vector<MatchCache> next(parts.size());
    for (size_t i = 0; i < parts.size(); ++i)
      for (MatchCache& mc : caches)
        if (mc.index_id == parts[i]->id()) next[i] = std::move(mc);
    caches.swap(next);
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    longest_match(*parts[i], c, caches[i]);
    longest = std::max(longest, caches[i].len);
  }

  // 2. Back off from the longest match to min_match until an expansion is non-empty.
  if (parts.size() == 1) {
    const Index& index = *parts[0];
    const MatchCache& mc = caches[0];
    IndexSource src{index, cfg_.use_frequency};
    for (int32_t l = mc.len; l >= cfg_.min_match; --l) {
      const Range r = l == mc.len ? mc.range : index.find(c.data() + (n - l), l);
      const int64_t w = src.weight(r);
      if (w <= 0) continue;
      std::vector<TreeNode>* record = l == mc.len ? &caches[0].tree : nullptr;
      if (expand(src, IndexSource::Node{r, l, w}, budget, cfg_, out, record)) {
        out.match_len = l;
        return true;
      }
      if (record) record->clear();
    }
    return false;
  }
  MultiSource src{parts, cfg_.use_frequency};
  for (int32_t l = longest; l >= cfg_.min_match; --l) {
    MultiSource::Node node{{}, l, 0};
    for (size_t i = 0; i < parts.size(); ++i) {
      if (caches[i].len < l) continue;
      const Range r = l == caches[i].len ? caches[i].range : parts[i]->find(c.data() + (n - l), l);
      if (!r.empty()) node.parts.emplace_back(static_cast<int32_t>(i), r);
    }
    node.w = src.weight(node.parts);
    if (node.w <= 0) continue;
    if (expand(src, node, budget, cfg_, out)) {
      out.match_len = l;
      return true;
    }
  }
  return false;
}

bool Drafter::draft_from_self(const Request& req, int32_t budget, DraftOut& out) {
  const std::vector<int32_t>& c = req.ctx;
  const int32_t n = static_cast<int32_t>(c.size());
  if (n == 0) return false;
  const int32_t cap = std::min(cfg_.max_match, n);
  // Earlier occurrences of the last token, with the length of their common suffix with the context (capped),
  // bucketed by that length (counting sort, longest first).
  static thread_local std::vector<std::pair<int32_t, int32_t>> cands, raw;  // (common suffix length, end)
  static thread_local std::vector<int32_t> count, ends;
  cands.clear();
  auto it = req.positions.find(c[n - 1]);
  if (it != req.positions.end()) {
    count.assign(cap + 2, 0);
    raw.clear();
    for (int32_t j : it->second) {
      if (j >= n - 1) break;
      int32_t l = 1;
      while (l < cap && l <= j && c[j - l] == c[n - 1 - l]) ++l;
      raw.emplace_back(l, j);
      ++count[cap - l + 1];
    }
    for (int32_t b = 1; b <= cap + 1; ++b) count[b] += count[b - 1];
    cands.resize(raw.size());
    for (const auto& e : raw) cands[count[cap - e.first]++] = e;
  }
  SelfSource src{c, cfg_.use_frequency};
  // The occurrence set only changes at the distinct common-suffix lengths: try them longest first.
  size_t taken = 0;
  ends.clear();
  for (int32_t l = cap; l >= std::max(cfg_.min_match, 1); --l) {
    while (taken < cands.size() && cands[taken].first >= l) ends.push_back(cands[taken++].second);
    if (ends.empty()) {
      if (taken == cands.size()) break;
      l = cands[taken].first + 1;  // jump to the next candidate length
      continue;
    }
    const int64_t w = cfg_.use_frequency ? static_cast<int64_t>(ends.size()) * kWeightOne : kWeightOne;
    if (expand(src, SelfSource::Node{ends, w}, budget, cfg_, out)) {
      out.match_len = l;
      return true;
    }
    // The same set fails for every length down to the next candidate length.
    if (taken < cands.size()) l = cands[taken].first + 1; else break;
  }
  if (cfg_.min_match == 0) {
    // Empty pattern: every position except the end is an occurrence (positions -1 .. n-2 as ends).
    std::vector<int32_t> all_ends;
    for (int32_t j = -1; j < n - 1; ++j) all_ends.push_back(j);
    const int64_t w = cfg_.use_frequency ? static_cast<int64_t>(all_ends.size()) * kWeightOne : kWeightOne;
    if (expand(src, SelfSource::Node{std::move(all_ends), w}, budget, cfg_, out)) {
      out.match_len = 0;
      return true;
    }
  }
  return false;
}

void Drafter::draft_one(Request& req, int32_t budget, DraftOut& out) {
  out = DraftOut();
  if (budget <= 0) return;
  std::vector<IndexPtr> parts[kNumSources];
  if (req.has_prompt && (cfg_.sources[kHistory] || cfg_.sources[kSiblings])) {
    std::shared_lock lock(prompts_mu_);
    auto it = prompts_.find(req.prompt_id);
    if (it != prompts_.end()) {
      if (cfg_.sources[kHistory] && it->second.history) parts[kHistory].push_back(it->second.history);
      if (cfg_.sources[kSiblings]) parts[kSiblings] = it->second.sibling_parts;
    }
  }
  if (cfg_.sources[kGlobal]) {
    IndexPtr g = global_index();
    if (g) parts[kGlobal].push_back(std::move(g));
  }
  DraftOut cands[kNumSources];
  int32_t k = 0;
  for (int32_t s = 0; s < kNumSources; ++s) {
    if (!cfg_.sources[s]) continue;
    DraftOut& cand = cands[k];
    cand = DraftOut();
    bool ok;
    if (s == kSelf) {
      ok = draft_from_self(req, budget, cand);
    } else {
      if (parts[s].empty()) continue;
      ok = draft_from_parts(parts[s], req, req.cache[s], budget, cand);
    }
    if (!ok || cand.tokens.empty()) continue;
    cand.source = s;
    ++k;
  }
  if (k == 1) out = std::move(cands[0]);
  if (k >= 2) merge_drafts(cands, k, budget, out);
}

std::vector<DraftOut> Drafter::draft_batch(const std::vector<std::string>& req_ids,
                                           const std::vector<int32_t>& budgets, std::vector<int64_t>* ns,
                                           int32_t threads) {
  std::vector<std::shared_ptr<Request>> reqs;
  reqs.reserve(req_ids.size());
  for (const auto& id : req_ids) reqs.push_back(find_request(id));
  std::vector<DraftOut> out(req_ids.size());
  if (ns) ns->assign(reqs.size(), 0);
  const int32_t use = std::min<int32_t>(threads > 0 ? threads : pool_.threads(), pool_.threads());
  pool_.run(reqs.size(), use, [&](size_t i, int32_t) {  // each request under its own mutex
    const auto t0 = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(reqs[i]->mu);
      draft_one(*reqs[i], budgets[i], out[i]);
    }
    if (ns) (*ns)[i] = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  });
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Introspection

size_t Drafter::memory_bytes() const {
  size_t total = sizeof(Drafter);
  {
    std::shared_lock lock(prompts_mu_);
    for (const auto& [id, e] : prompts_) {
      total += id.capacity() + sizeof(PromptEntry);
      if (e.history) total += e.history->memory_bytes();
      for (const auto& part : e.sibling_parts) total += part->memory_bytes();
    }
  }
  {
    std::shared_lock lock(requests_mu_);
    for (const auto& [id, r] : requests_) {
      std::lock_guard rl(r->mu);
      total += id.capacity() + sizeof(Request) + r->ctx.capacity() * sizeof(int32_t);
      for (const auto& [t, v] : r->positions) total += sizeof(t) + v.capacity() * sizeof(int32_t) + 16;
    }
  }
  {
    std::lock_guard lock(global_mu_);
    if (global_index_) total += global_index_->memory_bytes();
    for (const auto& [k, g] : global_groups_)
      for (const auto& s : g.first) total += s.capacity() * sizeof(int32_t);
  }
  return total;
}

int64_t Drafter::history_tokens() const {
  std::shared_lock lock(prompts_mu_);
  int64_t total = 0;
  for (const auto& [id, e] : prompts_)
    if (e.history) total += e.history->num_tokens();
  return total;
}

int64_t Drafter::num_prompts() const {
  std::shared_lock lock(prompts_mu_);
  int64_t total = 0;
  for (const auto& [id, e] : prompts_) total += e.history ? 1 : 0;
  return total;
}

int64_t Drafter::num_requests() const {
  std::shared_lock lock(requests_mu_);
  return static_cast<int64_t>(requests_.size());
}

std::string Drafter::check_integrity() const {
  {
    std::shared_lock lock(prompts_mu_);
    for (const auto& [id, e] : prompts_) {
      if (!e.history && e.sibling_parts.empty()) return "prompt " + id + " has neither history nor siblings";
      if (e.history) {
        const std::string h = e.history->check_integrity();
        if (!h.empty()) return "history of " + id + ": " + h;
      }
      for (size_t k = 0; k < e.sibling_parts.size(); ++k) {
        const Index& part = *e.sibling_parts[k];
        const std::string h = part.check_integrity();
        if (!h.empty()) return "siblings of " + id + ": " + h;
        const int32_t size = part.num_seqs();
        if (size <= 0 || (size & (size - 1)) != 0) return "siblings of " + id + ": part size is not a power of two";
        if (k > 0 && size >= e.sibling_parts[k - 1]->num_seqs())
          return "siblings of " + id + ": part sizes are not strictly decreasing";
      }
    }
  }
  {
    std::shared_lock lock(requests_mu_);
    for (const auto& [id, r] : requests_) {
      std::lock_guard rl(r->mu);
      if (cfg_.sources[kSelf]) {
        size_t count = 0;
        for (const auto& [t, v] : r->positions) {
          for (size_t i = 0; i < v.size(); ++i) {
            if (v[i] < 0 || v[i] >= static_cast<int32_t>(r->ctx.size()) || r->ctx[v[i]] != t)
              return "request " + id + ": position list of token " + std::to_string(t) + " is wrong";
            if (i > 0 && v[i] <= v[i - 1]) return "request " + id + ": position list not increasing";
          }
          count += v.size();
        }
        if (count != r->ctx.size()) return "request " + id + ": positions do not cover the context";
      }
      for (const auto& caches : r->cache) {
        for (const MatchCache& mc : caches) {
          if (mc.index_id == 0) continue;
          if (mc.len < 0 || mc.len > cfg_.max_match || mc.ctx_len > static_cast<int64_t>(r->ctx.size()) ||
              mc.len > mc.ctx_len || (mc.len > 0 && mc.range.empty()))
            return "request " + id + ": match cache out of bounds";
          for (size_t j = 0; j < mc.tree.size(); ++j) {
            const TreeNode& t = mc.tree[j];
            if (j == 0 ? (t.parent != -1 || t.range.lo != mc.range.lo || t.range.hi != mc.range.hi)
                       : (t.parent < 0 || t.parent >= static_cast<int32_t>(j) || t.range.empty() ||
                          t.range.lo < mc.tree[t.parent].range.lo || t.range.hi > mc.tree[t.parent].range.hi))
              return "request " + id + ": cached draft tree is inconsistent";
          }
        }
      }
    }
  }
  {
    std::lock_guard lock(global_mu_);
    if (global_order_.size() != global_groups_.size()) return "global order and groups disagree";
    if (global_index_ && !global_dirty_) {
      const std::string h = global_index_->check_integrity();
      if (!h.empty()) return "global index: " + h;
    }
  }
  return "";
}

}  // namespace histospec
