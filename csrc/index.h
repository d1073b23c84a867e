// An immutable, weighted index over a few token sequences: a suffix array plus prefix sums of weights.
//
// Memory: text (4 B) + suffix array (4 B) + its inverse (4 B) + weight prefix sums (8 B): 20 bytes per history token.
// A string x that occurs in the sequences has a contiguous range of the suffix array (the suffixes that start
// with x); the weight of x is the sum of the weights of the sequences of those occurrences, which the prefix
// sums give in O(1). Extending x by one token narrows the range by two binary searches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace histospec {

constexpr int32_t SEP = -1;  // ends every sequence in the text; sorts before every token

struct Range {
  int32_t lo = 0, hi = 0;  // suffix-array rows [lo, hi)
  bool empty() const { return lo >= hi; }
  int32_t size() const { return hi - lo; }
};

struct Span {
  const int32_t* data = nullptr;
  int64_t size = 0;
};

class Index {
 public:
  static constexpr int32_t kBlock = 32;
  // Builds the index of `seqs` (tokens >= 0), each with an integer weight >= 1. `with_max` also builds the
  // block range-maximum table that max_weight() needs.
  static std::shared_ptr<const Index> build(const std::vector<Span>& seqs, const std::vector<int64_t>& weights,
                                            bool with_max);

  int32_t num_rows() const { return static_cast<int32_t>(sa_.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(seq_weight_.size()); }
  int64_t num_tokens() const { return static_cast<int64_t>(text_.size()) - num_seqs(); }
  Range all() const { return {0, num_rows()}; }

  // Token at offset `depth` of the suffix in row i (SEP past the end of its sequence).
  int32_t token_at(int32_t row, int32_t depth) const { return text_[sa_[row] + depth]; }
  int64_t weight(Range r) const { return wsum_[r.hi] - wsum_[r.lo]; }
  int64_t row_weight(int32_t row) const { return wsum_[row + 1] - wsum_[row]; }
  // Largest row weight in r (needs with_max); 0 for an empty range.
  int64_t max_weight(Range r) const;
  // First row in [row, hi) whose token at `depth` differs from the token of `row` (rows are sorted).
  int32_t group_end(int32_t row, int32_t hi, int32_t depth) const;
  // Last row r in [lo, hi) with wsum[r] - wsum[lo] <= offset (offset < weight of [lo, hi)).
  int32_t row_at_weight(int32_t lo, int32_t hi, int64_t offset) const;
  int64_t wsum(int32_t row) const { return wsum_[row]; }
  uint64_t id() const { return id_; }
  // Rows of r (all sharing their first `depth` tokens) whose next token is `token`.
  Range child(Range r, int32_t depth, int32_t token) const;
  // Rows whose suffix starts with `token` (first-token hash table, no binary search).
  Range first(int32_t token) const;
  // Rows whose suffix shares its first m tokens with the suffix at text position `pos` (which must have m tokens
  // before its SEP): found from that suffix's own row by galloping outwards, no search from the top.
  Range widen(int64_t pos, int32_t m) const;
  // Text position of the suffix in `row`.
  int32_t position(int32_t row) const { return sa_[row]; }
  // Rows whose suffix starts with pattern[0..m); empty range when the pattern does not occur.
  Range find(const int32_t* pattern, int32_t m) const;

  // Sequence s without its SEP, and its weight.
  Span sequence(int32_t s) const {
    return {text_.data() + seq_start_[s], seq_start_[s + 1] - seq_start_[s] - 1};
  }
  int64_t seq_weight(int32_t s) const { return seq_weight_[s]; }

  size_t memory_bytes() const;
  // Debug only: a description of the first broken invariant, or "" when the index is consistent.
  std::string check_integrity() const;

 private:
  std::vector<int32_t> text_;        // [tokens + seqs] every sequence followed by SEP
  std::vector<int32_t> sa_;          // [rows] start positions of non-SEP suffixes, in sorted order
  std::vector<int32_t> isa_;         // [tokens + seqs] row of each text position, -1 at SEPs
  std::vector<int64_t> wsum_;        // [rows + 1] prefix sums of the row weights in suffix-array order
  std::vector<int64_t> seq_start_;   // [seqs + 1] start of each sequence in text_
  std::vector<int64_t> seq_weight_;  // [seqs]
  std::vector<int64_t> block_max_;   // [levels * blocks] sparse table of maxima over blocks of kBlock rows
  int32_t num_blocks_ = 0;
  struct FirstEntry {
    int32_t token, lo, hi;  // token SEP = empty slot
  };
  std::vector<FirstEntry> first_;    // open-addressing table: first token -> rows
  uint32_t first_mask_ = 0;
  static uint32_t hash_token(int32_t t) { return static_cast<uint32_t>(t) * 2654435761u >> 7; }
  uint64_t id_ = 0;                  // unique per built index (match caches compare it)
};

using IndexPtr = std::shared_ptr<const Index>;

}  // namespace histospec
