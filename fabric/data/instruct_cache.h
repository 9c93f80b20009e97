// The token cache of fabric::InstructDataset (internal to //fabric/data:instruct): tokenized
// examples kept between runs, one file per JSONL file under a name that changes with everything
// the ids depend on.
#ifndef FABRIC_DATA_INSTRUCT_CACHE_H_
#define FABRIC_DATA_INSTRUCT_CACHE_H_

#include <filesystem>
#include <string>
#include <vector>

#include "fabric/data/bpe.h"
#include "fabric/data/chat_template.h"
#include "fabric/data/instruct.h"

namespace fabric::instruct_cache {

// The file name for `jsonl` tokenized under `o` (and `chat`, its template when it has one).
std::string cache_name(const std::filesystem::path& jsonl, const InstructDataset::Options& o,
                       const BpeTokenizer& tokenizer, const ChatTemplate* chat);
// The examples in the cache file `path` into `out`; false when absent or not in this format.
bool read_cache(const std::filesystem::path& path, std::vector<InstructDataset::Example>& out);
// `examples` to `path`, atomically; fabric::Error when it cannot be written.
void write_cache(const std::filesystem::path& path,
                 const std::vector<InstructDataset::Example>& examples);

}  // namespace fabric::instruct_cache

#endif  // FABRIC_DATA_INSTRUCT_CACHE_H_
