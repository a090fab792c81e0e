#include "data/prepare/jsonl_input.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "kernels/base/error.h"

namespace packbert {
namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const std::string x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
  });
}

}  // namespace

const char* input_format_name(InputFormat f) {
  switch (f) {
    case InputFormat::auto_detect: return "auto";
    case InputFormat::lines: return "lines";
    case InputFormat::jsonl: return "jsonl";
  }
  return "?";
}

bool reads_as_jsonl(InputFormat format, const std::string& path) {
  if (format != InputFormat::auto_detect) return format == InputFormat::jsonl;
  return ends_with(path, ".jsonl") || ends_with(path, ".jsonl.gz");
}

int64_t jsonl_to_lines(std::string_view chunk, const std::string& path, int64_t first_line,
                       const JsonlOptions& options, std::string& out) {
  int64_t bad = 0, line_no = first_line;
  for (size_t pos = 0; pos < chunk.size(); ++line_no) {
    size_t nl = chunk.find('\n', pos);
    if (nl == std::string_view::npos) nl = chunk.size();
    const std::string_view line = chunk.substr(pos, nl - pos);
    pos = nl + 1;
    if (is_blank(line)) continue;
    std::string problem;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      problem = "not valid JSON (or not UTF-8)";
    } else if (!j.is_object()) {
      problem = "not a JSON object";
    } else if (!j.contains(options.field)) {
      problem = "no \"" + options.field + "\" field (prepare.text_field)";
    } else if (!j[options.field].is_string()) {
      problem = "its \"" + options.field + "\" field is not a string";
    }
    if (!problem.empty()) {
      PB_REQUIRE(options.skip_bad_lines,
                 "input {}:{}: {}; fix the line or pass --skip-bad-lines to count and skip it",
                 path, line_no, problem);
      ++bad;
      continue;
    }
    const std::string& text = j[options.field].get_ref<const std::string&>();
    bool any = false;
    for (size_t p = 0; p < text.size();) {
      size_t e = text.find('\n', p);
      if (e == std::string::npos) e = text.size();
      const std::string_view sentence = std::string_view(text).substr(p, e - p);
      p = e + 1;
      if (is_blank(sentence)) continue;
      out.append(sentence);
      out.push_back('\n');
      any = true;
    }
    if (any) out.push_back('\n');  // the document ends
  }
  return bad;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  for (const std::string& in : inputs) {
    std::vector<std::string> files;
    std::error_code ec;
    if (in.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      const int rc = glob(in.c_str(), 0, nullptr, &g);
      std::unique_ptr<glob_t, void (*)(glob_t*)> free_g(&g, globfree);
      PB_REQUIRE(rc == 0 || rc == GLOB_NOMATCH, "input {}: the pattern cannot be read", in);
      for (size_t i = 0; i < g.gl_pathc; ++i)
        if (fs::is_regular_file(g.gl_pathv[i], ec)) files.emplace_back(g.gl_pathv[i]);
      PB_REQUIRE(!files.empty(), "input {}: the pattern matches no file", in);
    } else if (fs::is_directory(in, ec)) {
      for (const auto& e : fs::directory_iterator(in, ec))
        if (e.is_regular_file()) files.push_back(e.path().string());
      PB_REQUIRE(!ec, "input {}: cannot list the directory: {}", in, ec.message());
      PB_REQUIRE(!files.empty(), "input {}: the directory holds no file", in);
    } else {
      files.push_back(in);
    }
    std::sort(files.begin(), files.end());
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

}  // namespace packbert
