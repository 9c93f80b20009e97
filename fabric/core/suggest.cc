#include "fabric/core/suggest.h"

#include <algorithm>
#include <numeric>

namespace fabric {

int edit_distance(std::string_view a, std::string_view b) {
  std::vector<int> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates) {
  const int limit = std::max<int>(1, static_cast<int>(word.size()) / 3);
  std::optional<std::string> best;
  int best_distance = limit + 1;
  for (const auto& c : candidates) {
    int d = edit_distance(word, c);
    if (d > limit && !word.empty() && c.rfind(word, 0) == 0) d = limit;  // a prefix is plausible
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  auto match = closest_match(word, candidates);
  return match ? "; did you mean '" + *match + "'?" : "";
}

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
}

std::string join_cut(const std::vector<std::string>& items, size_t limit,
                     std::string_view separator) {
  if (items.size() <= limit + 1) return join(items, separator);
  std::vector<std::string> head(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(limit));
  return join(head, separator) + std::string(separator) + "... (" +
         std::to_string(items.size() - limit) + " more)";
}

}  // namespace fabric
