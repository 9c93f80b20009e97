#include "fabric/core/json_object.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "fabric/core/error.h"

namespace fabric {

nlohmann::json parse_json_object(const std::string& text, const std::string& where,
                                 const std::string& fix) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 3, column 1: ..." without its prefix.
    std::string why = e.what();
    const size_t at = why.find(" at line ");
    why = at == std::string::npos ? why : why.substr(at + 4);
    // One line of text (a JSONL line): its column alone.
    if (text.find('\n') == std::string::npos && why.rfind("line 1, ", 0) == 0) why = why.substr(8);
    throw Error(where + ": not JSON (" + one_line(why, 160) + ")" + fix);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": not JSON (" + one_line(e.what(), 160) + ")" + fix);
  }
  if (!json.is_object())
    throw Error(where + ": a JSON " + (json.is_null() ? std::string("null") : json.type_name()) +
                ", not an object" + fix);
  return json;
}

nlohmann::json read_json_object(const std::string& path, const std::string& fix) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(path + ": is a folder, not a file" + fix);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (!in) throw Error(path + ": cannot read" + fix);
  text << in.rdbuf();  // an empty file copies nothing: the parser says "unexpected end of input"
  return parse_json_object(text.str(), path, fix);
}

}  // namespace fabric
