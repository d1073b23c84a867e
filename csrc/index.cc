#include "index.h"

#include <algorithm>
#include <atomic>
#include <sstream>

#include "sais.h"

namespace histospec {

#define CHECK_OR_RETURN(cond)                                                        \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::ostringstream os_;                                                        \
      os_ << "index integrity check failed at " << __FILE__ << ":" << __LINE__ << ": " #cond; \
      return os_.str();                                                              \
    }                                                                                \
  } while (0)

namespace {

constexpr int32_t kDirectMapLimit = 1 << 22;  // token ids below this are ranked with a direct table

// Maps tokens to dense ranks 1..k preserving their order (0 is SEP), so that the suffix array of the dense
// string is the suffix array of the tokens. Returns k + 1, the alphabet size.
int32_t dense_ranks(const std::vector<int32_t>& text, std::vector<int32_t>& dense) {
  int32_t max_token = -1;
  for (int32_t t : text) max_token = std::max(max_token, t);
  dense.resize(text.size());
  if (max_token < kDirectMapLimit) {
    std::vector<int32_t> rank(static_cast<size_t>(max_token) + 1, 0);
    for (int32_t t : text)
      if (t >= 0) rank[t] = 1;
    int32_t k = 0;
    for (auto& r : rank)
      if (r) r = ++k;
    for (size_t i = 0; i < text.size(); ++i) dense[i] = text[i] < 0 ? 0 : rank[text[i]];
    return k + 1;
  }
  std::vector<int32_t> distinct;
  for (int32_t t : text)
    if (t >= 0) distinct.push_back(t);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  for (size_t i = 0; i < text.size(); ++i)
    dense[i] = text[i] < 0 ? 0
                           : static_cast<int32_t>(std::lower_bound(distinct.begin(), distinct.end(), text[i]) -
                                                  distinct.begin()) + 1;
  return static_cast<int32_t>(distinct.size()) + 1;
}

}  // namespace

std::shared_ptr<const Index> Index::build(const std::vector<Span>& seqs, const std::vector<int64_t>& weights,
                                          bool with_max) {
  static std::atomic<uint64_t> next_id{1};
  auto index = std::make_shared<Index>();
  Index& x = *index;
  x.id_ = next_id.fetch_add(1);
  int64_t total = 0;
  for (const Span& s : seqs) total += s.size + 1;
  x.text_.reserve(total);
  x.seq_start_.reserve(seqs.size() + 1);
  for (const Span& s : seqs) {
    x.seq_start_.push_back(static_cast<int64_t>(x.text_.size()));
    x.text_.insert(x.text_.end(), s.data, s.data + s.size);
    x.text_.push_back(SEP);
  }
  x.seq_start_.push_back(static_cast<int64_t>(x.text_.size()));
  x.seq_weight_ = weights;

  const int32_t n = static_cast<int32_t>(x.text_.size());
  const int32_t num_seqs = static_cast<int32_t>(seqs.size());
  x.sa_.resize(n);
  {
    std::vector<int32_t> dense;
    const int32_t alphabet = dense_ranks(x.text_, dense);
    suffix_array(dense.data(), n, alphabet, x.sa_.data());
  }
  // The first num_seqs rows are the suffixes that start at a SEP (the smallest character): drop them.
  x.sa_.erase(x.sa_.begin(), x.sa_.begin() + num_seqs);
  const int32_t rows = static_cast<int32_t>(x.sa_.size());
  x.isa_.assign(n, -1);
  for (int32_t i = 0; i < rows; ++i) x.isa_[x.sa_[i]] = i;
  x.wsum_.resize(static_cast<size_t>(rows) + 1);
  x.wsum_[0] = 0;
  if (std::all_of(weights.begin(), weights.end(), [&](int64_t w) { return w == weights[0]; })) {
    for (int32_t i = 0; i < rows; ++i) x.wsum_[i + 1] = x.wsum_[i] + weights[0];
  } else {
    // Prefix sums of the weight of each row's sequence (the sequence of each text position in a scratch array).
    std::vector<int32_t> seq_of(n);
    for (int32_t s = 0; s < num_seqs; ++s)
      std::fill(seq_of.begin() + x.seq_start_[s], seq_of.begin() + x.seq_start_[s + 1], s);
    for (int32_t i = 0; i < rows; ++i) x.wsum_[i + 1] = x.wsum_[i] + weights[seq_of[x.sa_[i]]];
  }
  // First-token table: open addressing, token -> rows of the suffixes that start with it.
  {
    int32_t groups = 0;
    for (int32_t i = 0; i < rows; ++i) groups += (i == 0 || x.token_at(i, 0) != x.token_at(i - 1, 0));
    uint32_t cap = 8;
    while (cap < 2u * static_cast<uint32_t>(groups)) cap <<= 1;
    x.first_.assign(cap, FirstEntry{SEP, 0, 0});
    x.first_mask_ = cap - 1;
    for (int32_t i = 0; i < rows;) {
      const int32_t t = x.token_at(i, 0);
      const int32_t end = x.group_end(i, rows, 0);
      uint32_t h = hash_token(t) & x.first_mask_;
      while (x.first_[h].token != SEP) h = (h + 1) & x.first_mask_;
      x.first_[h] = {t, i, end};
      i = end;
    }
  }
  if (with_max && rows > 0) {
    const int32_t nb = (rows + kBlock - 1) / kBlock;
    int32_t levels = 1;
    while ((1 << levels) <= nb) ++levels;
    x.num_blocks_ = nb;
    x.block_max_.assign(static_cast<size_t>(levels) * nb, 0);
    for (int32_t i = 0; i < rows; ++i) {
      int64_t& b = x.block_max_[i / kBlock];
      b = std::max(b, x.row_weight(i));
    }
    for (int32_t l = 1; l < levels; ++l)
      for (int32_t b = 0; b + (1 << l) <= nb; ++b)
        x.block_max_[static_cast<size_t>(l) * nb + b] =
            std::max(x.block_max_[static_cast<size_t>(l - 1) * nb + b],
                     x.block_max_[static_cast<size_t>(l - 1) * nb + b + (1 << (l - 1))]);
  }
  return index;
}

int64_t Index::max_weight(Range r) const {
  int64_t best = 0;
  int32_t lo = r.lo;
  const int32_t hi = r.hi;
  while (lo < hi && lo % kBlock != 0) best = std::max(best, row_weight(lo++));
  int32_t bhi = hi;
  while (bhi > lo && bhi % kBlock != 0) best = std::max(best, row_weight(--bhi));
  if (lo < bhi) {
    const int32_t b0 = lo / kBlock, b1 = bhi / kBlock;  // blocks [b0, b1)
    int32_t l = 0;
    while ((2 << l) <= b1 - b0) ++l;
    best = std::max({best, block_max_[static_cast<size_t>(l) * num_blocks_ + b0],
                     block_max_[static_cast<size_t>(l) * num_blocks_ + b1 - (1 << l)]});
  }
  return best;
}

int32_t Index::group_end(int32_t row, int32_t hi, int32_t depth) const {
  const int32_t t = token_at(row, depth);
  int32_t step = 1, a = row + 1;  // invariant: rows before a have token t
  while (a + step <= hi && token_at(a + step - 1, depth) == t) {
    a += step;
    step <<= 1;
  }
  int32_t b = std::min(hi, a + step);  // the end lies in [a, b]
  while (a < b) {
    const int32_t mid = a + (b - a) / 2;
    if (token_at(mid, depth) == t) a = mid + 1; else b = mid;
  }
  return a;
}

int32_t Index::row_at_weight(int32_t lo, int32_t hi, int64_t offset) const {
  const int64_t target = wsum_[lo] + offset;
  // first row r in (lo, hi] with wsum[r] > target, minus one
  auto it = std::upper_bound(wsum_.begin() + lo + 1, wsum_.begin() + hi + 1, target);
  return static_cast<int32_t>(it - wsum_.begin()) - 1;
}

Range Index::child(Range r, int32_t depth, int32_t token) const {
  int32_t lo = r.lo, hi = r.hi;
  if (hi - lo <= 32) {  // small ranges: a linear scan (independent loads) beats two binary searches
    while (lo < hi && token_at(lo, depth) < token) ++lo;
    int32_t end = lo;
    while (end < hi && token_at(end, depth) == token) ++end;
    return {lo, end};
  }
  // lower bound of token
  int32_t a = lo, b = hi;
  while (a < b) {
    const int32_t mid = a + (b - a) / 2;
    if (token_at(mid, depth) < token) a = mid + 1; else b = mid;
  }
  const int32_t first = a;
  b = hi;
  while (a < b) {
    const int32_t mid = a + (b - a) / 2;
    if (token_at(mid, depth) <= token) a = mid + 1; else b = mid;
  }
  return {first, a};
}

Range Index::first(int32_t token) const {
  for (uint32_t h = hash_token(token) & first_mask_;; h = (h + 1) & first_mask_) {
    const FirstEntry& e = first_[h];
    if (e.token == token) return {e.lo, e.hi};
    if (e.token == SEP) return {0, 0};
  }
}

Range Index::widen(int64_t pos, int32_t m) const {
  const int32_t* want = text_.data() + pos;
  auto shares = [&](int32_t row) {
    const int32_t* have = text_.data() + sa_[row];
    for (int32_t k = 0; k < m; ++k)
      if (have[k] != want[k]) return false;  // a SEP in `have` differs from every token of `want`
    return true;
  };
  const int32_t r = isa_[pos];
  // Rows sharing the prefix are contiguous around r: gallop to each side, then binary search the boundary.
  int32_t lo = r, step = 1;
  while (lo - step >= 0 && shares(lo - step)) {
    lo -= step;
    step <<= 1;
  }
  for (int32_t a = std::max(0, lo - step + 1), b = lo; a < b;) {  // smallest sharing row in [a, b]
    const int32_t mid = a + (b - a) / 2;
    if (shares(mid)) b = mid; else a = mid + 1;
    lo = b;
  }
  const int32_t rows = num_rows();
  int32_t hi = r;  // last sharing row
  step = 1;
  while (hi + step < rows && shares(hi + step)) {
    hi += step;
    step <<= 1;
  }
  for (int32_t a = hi, b = std::min(rows - 1, hi + step - 1); a < b;) {  // largest sharing row in [a, b]
    const int32_t mid = a + (b - a + 1) / 2;
    if (shares(mid)) a = mid; else b = mid - 1;
    hi = a;
  }
  return {lo, hi + 1};
}

Range Index::find(const int32_t* pattern, int32_t m) const {
  if (m == 0) return all();
  Range r = first(pattern[0]);
  for (int32_t j = 1; j < m && !r.empty(); ++j) r = child(r, j, pattern[j]);
  return r;
}

size_t Index::memory_bytes() const {
  return sizeof(Index) + text_.capacity() * sizeof(int32_t) + sa_.capacity() * sizeof(int32_t) +
         isa_.capacity() * sizeof(int32_t) +
         wsum_.capacity() * sizeof(int64_t) + seq_start_.capacity() * sizeof(int64_t) +
         seq_weight_.capacity() * sizeof(int64_t) + block_max_.capacity() * sizeof(int64_t) +
         first_.capacity() * sizeof(FirstEntry);
}

std::string Index::check_integrity() const {
  const int64_t n = static_cast<int64_t>(text_.size());
  const int32_t num_seqs = static_cast<int32_t>(seq_weight_.size());
  CHECK_OR_RETURN(static_cast<int32_t>(seq_start_.size()) == num_seqs + 1);
  CHECK_OR_RETURN(seq_start_.front() == 0 && seq_start_.back() == n);
  for (int32_t s = 0; s < num_seqs; ++s) {
    CHECK_OR_RETURN(seq_start_[s] < seq_start_[s + 1]);
    CHECK_OR_RETURN(text_[seq_start_[s + 1] - 1] == SEP);
    CHECK_OR_RETURN(seq_weight_[s] >= 1);
    for (int64_t p = seq_start_[s]; p + 1 < seq_start_[s + 1]; ++p) CHECK_OR_RETURN(text_[p] >= 0);
  }
  CHECK_OR_RETURN(static_cast<int64_t>(sa_.size()) == n - num_seqs);
  CHECK_OR_RETURN(static_cast<int64_t>(isa_.size()) == n);
  for (int64_t p = 0; p < n; ++p) CHECK_OR_RETURN((text_[p] == SEP) == (isa_[p] < 0));
  CHECK_OR_RETURN(wsum_.size() == sa_.size() + 1 && wsum_[0] == 0);
  std::vector<uint8_t> seen(n, 0);
  for (size_t i = 0; i < sa_.size(); ++i) {
    const int32_t p = sa_[i];
    CHECK_OR_RETURN(p >= 0 && p < n && text_[p] != SEP && !seen[p]);
    CHECK_OR_RETURN(isa_[p] == static_cast<int32_t>(i));
    seen[p] = 1;
    CHECK_OR_RETURN(wsum_[i + 1] > wsum_[i]);
    {
      const auto it = std::upper_bound(seq_start_.begin(), seq_start_.end(), static_cast<int64_t>(p));
      CHECK_OR_RETURN(row_weight(static_cast<int32_t>(i)) == seq_weight_[it - seq_start_.begin() - 1]);
    }
    if (!block_max_.empty() && i % kBlock == 0) {
      const Range blk{static_cast<int32_t>(i), std::min(num_rows(), static_cast<int32_t>(i) + kBlock)};
      int64_t m = 0;
      for (int32_t r = blk.lo; r < blk.hi; ++r) m = std::max(m, row_weight(r));
      CHECK_OR_RETURN(block_max_[i / kBlock] == m);
    }
    if (i > 0) {  // rows in strictly increasing suffix order (a SEP ends the comparison: it is unique per row)
      const int32_t q = sa_[i - 1];
      int64_t k = 0;
      while (text_[q + k] == text_[p + k] && text_[p + k] != SEP) ++k;
      CHECK_OR_RETURN(text_[q + k] <= text_[p + k]);
    }
  }
  int32_t groups = 0;
  for (int32_t i = 0; i < num_rows(); ++i) {
    if (i > 0 && token_at(i, 0) == token_at(i - 1, 0)) continue;
    ++groups;
    const Range r = first(token_at(i, 0));
    CHECK_OR_RETURN(r.lo == i && r.hi == group_end(i, num_rows(), 0));
  }
  int32_t used = 0;
  for (const FirstEntry& e : first_) used += e.token != SEP;
  CHECK_OR_RETURN(used == groups);
  return "";
}

}  // namespace histospec
