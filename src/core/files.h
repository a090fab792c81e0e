// Small file helpers shared by the writers of logs and metrics and the readers of small inputs.
#pragma once

#include <cstdio>
#include <string>

namespace packbert {

// Opens `path` for appending, creating its parent directories first. Errors name the path,
// `what` the file is ("metrics file", "MLPerf log") and the OS reason.
std::FILE* open_for_append(const std::string& path, const char* what);

// Replaces `path` with `text` so that a reader sees the old file or the whole new one, never a
// part: written beside it, flushed to disk, then renamed over it. Creates parent directories.
// Errors name the path, `what` the file is and the OS reason.
void replace_file(const std::string& path, const std::string& text, const char* what);

// The bytes of a regular file (a vocabulary, a tokenizer.json). Errors name `what` the file is
// and the path: missing or not a regular file, unreadable.
std::string read_whole_file(const std::string& path, const char* what);

}  // namespace packbert
