// A JSON object read from a file or a line, with what is wrong said in one line: where the text
// stops being JSON (line, column and the parser's reason) or which JSON type it is instead of an
// object. For the JSON files users hand over (config.json, the weights' index, adapter_config.json,
// a JSONL line), whose "not a JSON object" alone sends them searching the file.
#ifndef FABRIC_CORE_JSON_OBJECT_H_
#define FABRIC_CORE_JSON_OBJECT_H_

#include <nlohmann/json.hpp>

#include <string>

namespace fabric {

// The object `text` holds; fabric::Error "WHERE: not JSON (line 3, column 1: syntax error while
// parsing object - unexpected end of input; expected '}')FIX" or "WHERE: a JSON array, not an
// object FIX" (FIX as given, e.g. "; give a Hugging Face model's config.json").
nlohmann::json parse_json_object(const std::string& text, const std::string& where,
                                 const std::string& fix = "");

// The same for the file at `path` (fabric::Error "PATH: cannot read FIX" when it cannot be read).
nlohmann::json read_json_object(const std::string& path, const std::string& fix = "");

}  // namespace fabric

#endif  // FABRIC_CORE_JSON_OBJECT_H_
