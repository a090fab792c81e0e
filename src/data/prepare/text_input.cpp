#include "data/prepare/text_input.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kernels/base/error.h"

namespace packbert {

namespace {

gzFile as_gz(void* f) { return static_cast<gzFile>(f); }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// zlib prefixes its messages with the path, which our messages already start with.
std::string zlib_message(const char* msg, const std::string& path) {
  std::string m = msg ? msg : "unknown zlib error";
  if (m.rfind(path + ": ", 0) == 0) m.erase(0, path.size() + 2);
  return m;
}

bool is_blank(std::string_view line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\v' && c != '\f') return false;
  return true;
}

}  // namespace

void check_input_file(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st)) PB_THROW("input {}: no such file", path);
  PB_REQUIRE(std::filesystem::is_regular_file(st), "input {}: not a regular file", path);
  std::ifstream f(path, std::ios::binary);
  PB_REQUIRE(f.good(), "input {}: cannot be opened for reading: {}", path, std::strerror(errno));
}

TextReader::TextReader(const std::string& path) : path_(path) {
  check_input_file(path);
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) PB_THROW("input {}: cannot open: {}", path, std::strerror(errno));
  file_ = f;
  gzbuffer(f, 1 << 18);
  // zlib reads a file without a gzip header as plain text; for a file named .gz that means it
  // is damaged or mislabelled, and tokenizing its bytes would only produce garbage samples.
  if (ends_with(path, ".gz") && gzdirect(f)) {
    gzclose(f);
    file_ = nullptr;
    PB_THROW("input {}: not a gzip file (no gzip header) although its name ends in .gz", path);
  }
}

TextReader::~TextReader() {
  if (file_) gzclose(as_gz(file_));
}

bool TextReader::next_chunk(std::string& out, size_t max_bytes) {
  out.clear();
  out.swap(pending_);
  max_bytes = std::max<size_t>(max_bytes, 1);
  while (!eof_) {
    const size_t old = out.size();
    const size_t want = std::min<size_t>(max_bytes, INT_MAX);
    out.resize(old + want);
    const int n = gzread(as_gz(file_), out.data() + old, static_cast<unsigned>(want));
    if (n < 0) {
      int code = 0;
      const char* msg = gzerror(as_gz(file_), &code);
      if (code == Z_ERRNO) PB_THROW("input {}: read error: {}", path_, std::strerror(errno));
      PB_THROW("input {}: corrupt gzip data after {} bytes of text: {}", path_, bytes_,
               zlib_message(msg, path_));
    }
    out.resize(old + static_cast<size_t>(n));
    bytes_ += n;
    if (n == 0) {
      // A truncated gzip stream ends with Z_BUF_ERROR ("unexpected end of file"), not with an
      // error return from gzread; without this check a cut download would pass silently.
      int code = 0;
      const char* msg = gzerror(as_gz(file_), &code);
      PB_REQUIRE(code == Z_OK || code == Z_STREAM_END,
                 "input {}: corrupt gzip data after {} bytes of text: {}", path_, bytes_,
                 zlib_message(msg, path_));
      eof_ = true;
      break;
    }
    // Keep whole lines: cut after the last '\n'. Only the new bytes are searched (those before
    // `old` hold none: pending_ starts after a '\n', and we read again only when none was
    // found), so a very long line costs linear, not quadratic, time.
    size_t nl = std::string_view(out).substr(old).rfind('\n');
    if (nl != std::string_view::npos) {
      nl += old;
      pending_.assign(out, nl + 1, std::string::npos);
      out.resize(nl + 1);
      return true;
    }
  }
  return !out.empty();
}

void tokenize_lines(const CorpusTokenizer& tokenizer, std::string_view text, TokenizedLines& out) {
  out.tokens.clear();
  out.line_tokens.clear();
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (is_blank(line)) {
      out.line_tokens.push_back(TokenizedLines::kBlankLine);
      continue;
    }
    thread_local std::vector<int32_t> ids;
    ids.clear();
    tokenizer.encode(line, ids);
    for (int32_t id : ids) out.tokens.push_back(static_cast<uint16_t>(id));
    out.line_tokens.push_back(static_cast<int32_t>(ids.size()));
  }
}

}  // namespace packbert
