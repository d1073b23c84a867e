// SA-IS (Nong, Zhang and Chan 2009), written from the published description. The string ends in a virtual
// sentinel that is smaller than every character; it is never stored.
#include "sais.h"

#include <algorithm>

namespace histospec {
namespace {

// Induced sorting: LMS suffixes given in `lms` (sorted, or in text order for the first pass) are placed at the
// tails of their buckets, then L-type suffixes are induced left to right and S-type ones right to left.
void induce(const int32_t* s, int32_t n, const uint8_t* is_s, const std::vector<int32_t>& bucket,
            const int32_t* lms, int32_t num_lms, int32_t* sa, std::vector<int32_t>& ptr) {
  const size_t k = bucket.size() - 1;
  std::fill(sa, sa + n, -1);
  for (size_t c = 0; c < k; ++c) ptr[c] = bucket[c + 1];
  for (int32_t i = num_lms - 1; i >= 0; --i) sa[--ptr[s[lms[i]]]] = lms[i];
  for (size_t c = 0; c < k; ++c) ptr[c] = bucket[c];
  sa[ptr[s[n - 1]]++] = n - 1;  // induced by the virtual sentinel: the last suffix is L-type
  for (int32_t i = 0; i < n; ++i) {
    const int32_t j = sa[i] - 1;
    if (j >= 0 && !is_s[j]) sa[ptr[s[j]]++] = j;
  }
  for (size_t c = 0; c < k; ++c) ptr[c] = bucket[c + 1];
  for (int32_t i = n - 1; i >= 0; --i) {
    const int32_t j = sa[i] - 1;
    if (j >= 0 && is_s[j]) sa[--ptr[s[j]]] = j;
  }
}

}  // namespace

void suffix_array(const int32_t* s, int32_t n, int32_t alphabet, int32_t* sa) {
  if (n <= 0) return;
  if (n == 1) {
    sa[0] = 0;
    return;
  }
  std::vector<uint8_t> is_s(n, 0);
  for (int32_t i = n - 2; i >= 0; --i) is_s[i] = s[i] < s[i + 1] || (s[i] == s[i + 1] && is_s[i + 1]);
  std::vector<int32_t> bucket(alphabet + 1, 0), ptr(alphabet, 0);
  for (int32_t i = 0; i < n; ++i) ++bucket[s[i] + 1];
  for (int32_t c = 0; c < alphabet; ++c) bucket[c + 1] += bucket[c];

  std::vector<int32_t> lms;
  for (int32_t i = 1; i < n; ++i)
    if (is_s[i] && !is_s[i - 1]) lms.push_back(i);
  const int32_t m = static_cast<int32_t>(lms.size());
  induce(s, n, is_s.data(), bucket, lms.data(), m, sa, ptr);
  if (m == 0) return;

  // Name the LMS substrings in sorted order; equal substrings share a name. LMS positions are at least two
  // apart, so m <= n / 2: the sorted LMS go to sa[0, m) and the name of position p to sa[m + p / 2].
  auto is_lms = [&](int32_t p) { return p > 0 && is_s[p] && !is_s[p - 1]; };
  int32_t k = 0;
  for (int32_t i = 0; i < n; ++i)
    if (is_lms(sa[i])) sa[k++] = sa[i];
  std::fill(sa + m, sa + n, -1);
  int32_t names = 0, prev = -1;
  for (int32_t r = 0; r < m; ++r) {
    const int32_t p = sa[r];
    bool diff = true;
    if (prev >= 0) {
      for (int32_t d = 0;; ++d) {
        if (p + d == n || prev + d == n) break;  // the sentinel is unique
        if (s[p + d] != s[prev + d] || is_s[p + d] != is_s[prev + d]) break;
        if (d > 0 && (is_lms(p + d) || is_lms(prev + d))) {
          diff = !(is_lms(p + d) && is_lms(prev + d));
          break;
        }
      }
    }
    if (diff) {
      ++names;
      prev = p;
    }
    sa[m + p / 2] = names - 1;
  }
  std::vector<int32_t> sorted_lms(m);
  if (names < m) {
    std::vector<int32_t> reduced(m);
    k = 0;
    for (int32_t j = m; j < n; ++j)
      if (sa[j] >= 0) reduced[k++] = sa[j];
    suffix_array(reduced.data(), m, names, sa);  // sorts the reduced string into sa[0, m)
    for (int32_t r = 0; r < m; ++r) sorted_lms[r] = lms[sa[r]];
  } else {
    std::copy(sa, sa + m, sorted_lms.begin());
  }
  induce(s, n, is_s.data(), bucket, sorted_lms.data(), m, sa, ptr);
}

}  // namespace histospec
