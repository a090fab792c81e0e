// The inputs of `packbert prepare` besides Google's one-sentence-per-line text: JSONL (one
// document per line, a JSON object whose text field holds it: Hugging Face datasets, the Pile,
// FineWeb, Dolma), and directories or globs that name several files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace packbert {

enum class InputFormat { auto_detect, lines, jsonl };
const char* input_format_name(InputFormat f);  // "auto", "lines", "jsonl"

// Whether `path` is read as JSONL: format jsonl, or auto and a name ending in .jsonl or
// .jsonl.gz.
bool reads_as_jsonl(InputFormat format, const std::string& path);

struct JsonlOptions {
  std::string field = "text";   // the string field holding the document
  bool skip_bad_lines = false;  // count and skip a malformed line instead of failing
};

// Turns `chunk` (whole JSONL lines; its first is line `first_line` of `path`, 1-based) into the
// lines format the text path reads, appended to `out`: each non-blank line of a document's text
// a sentence line, then one blank line ending the document (a blank line inside a text does not
// split it). Whitespace-only JSONL lines are skipped. A line that is not a JSON object with a
// string `field` is an Error naming path:line and what is wrong, or with skip_bad_lines is
// skipped and counted: the return value.
int64_t jsonl_to_lines(std::string_view chunk, const std::string& path, int64_t first_line,
                       const JsonlOptions& options, std::string& out);

// The input files named by `inputs`, in order: a directory gives its regular files (not
// recursively), a pattern with * ? or [ the files it matches (glob(3)), each sorted by name;
// anything else is itself. A directory or pattern that names no file is an Error naming it.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs);

}  // namespace packbert
