// Reading the text inputs of `packbert prepare`: plain or gzip files, in chunks of whole lines,
// and tokenizing a chunk line by line (chunks are tokenized in parallel).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/prepare/corpus_tokenizer.h"

namespace packbert {

// Throws packbert::Error naming the path unless it is a readable regular file.
void check_input_file(const std::string& path);

// Streams a text file, gzip-compressed or not (zlib reads both). Every error (missing file,
// corrupt or truncated gzip data, a ".gz" name on a file that is not gzip) is a packbert::Error
// that names the file.
class TextReader {
 public:
  explicit TextReader(const std::string& path);
  ~TextReader();
  TextReader(const TextReader&) = delete;
  TextReader& operator=(const TextReader&) = delete;

  // Replaces out with the next whole lines, about max_bytes of them (more when one line is
  // longer); the last line of the file may lack its '\n'. Returns false at the end of the file.
  bool next_chunk(std::string& out, size_t max_bytes);
  int64_t bytes_read() const { return bytes_; }  // uncompressed bytes so far
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* file_ = nullptr;  // gzFile (zlib.h stays out of this header)
  std::string pending_;   // bytes after the last '\n' of the previous chunk
  bool eof_ = false;
  int64_t bytes_ = 0;
};

// Token ids of a chunk of lines. A blank line (only whitespace) separates documents; any other
// line is a sentence, skipped when it gives no token (as Google's script does).
struct TokenizedLines {
  static constexpr int32_t kBlankLine = -1;
  std::vector<uint16_t> tokens;      // the ids of all sentences, concatenated
  std::vector<int32_t> line_tokens;  // per line: its number of ids, or kBlankLine
};

// Requires vocab ids < 65536 (checked by the caller once for the vocabulary).
void tokenize_lines(const CorpusTokenizer& tokenizer, std::string_view text, TokenizedLines& out);

}  // namespace packbert
