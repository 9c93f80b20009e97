// Did-you-mean suggestions for error messages ("did you mean '16-mixed'?").
#ifndef FABRIC_CORE_SUGGEST_H_
#define FABRIC_CORE_SUGGEST_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fabric {

// Levenshtein distance (insertions, deletions, substitutions; case-sensitive).
int edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` when it is close enough to be a plausible typo (distance at most
// max(1, |word| / 3), or `word` is a prefix of it); ties go to the first candidate.
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates);

// "; did you mean 'x'?" or "" when nothing is close.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

// "a, b, c".
std::string join(const std::vector<std::string>& items, std::string_view separator = ", ");

// The first `limit` items joined, then "... (N more)" for the rest: lists in one-line errors.
std::string join_cut(const std::vector<std::string>& items, size_t limit = 8,
                     std::string_view separator = ", ");

}  // namespace fabric

#endif  // FABRIC_CORE_SUGGEST_H_
