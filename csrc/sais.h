// Suffix array construction by induced sorting (SA-IS), linear time over an integer alphabet.
#pragma once

#include <cstdint>
#include <vector>

namespace histospec {

// Sorts the suffixes of s[0..n) (characters in [0, alphabet)) into sa[0..n). A virtual sentinel smaller than
// every character ends the string, so a suffix that is a prefix of another sorts first.
// Example: s = {2, 1, 2, 1, 0} ("baba" + a smaller char) gives sa = {4, 3, 1, 2, 0}.
void suffix_array(const int32_t* s, int32_t n, int32_t alphabet, int32_t* sa);

}  // namespace histospec
