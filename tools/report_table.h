// The two-column text layout of //tools:env's report: a section title, then "  key   value" rows
// with the values aligned at column 26.
#ifndef TOOLS_REPORT_TABLE_H_
#define TOOLS_REPORT_TABLE_H_

#include <sstream>
#include <string>

namespace fabric::tools {

class ReportTable {
 public:
  void section(const std::string& title) { out_ << title << "\n"; }
  void row(const std::string& key, const std::string& value) {
    out_ << "  " << key << std::string(key.size() < 24 ? 24 - key.size() : 1, ' ') << value << "\n";
  }
  // A free-form line inside the current section ("  note: ...").
  void line(const std::string& text) { out_ << "  " << text << "\n"; }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

}  // namespace fabric::tools

#endif  // TOOLS_REPORT_TABLE_H_
