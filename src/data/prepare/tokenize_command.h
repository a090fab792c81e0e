// `packbert tokenize`: each input line's token ids, one line of space-separated ids per input
// line (lines end at '\n'; a last line without one counts too), with the tokenizer's special
// tokens around them only with `special`. The tokenizer is a Hugging Face tokenizer.json
// (data/prepare/hf_tokenizer.h) or a BERT vocab.txt (data/prepare/tokenizer.h: [CLS] ... [SEP]).
#pragma once

#include <iosfwd>
#include <string>

namespace packbert {

// input "" or "-": standard input. Errors name the file.
void run_tokenize(const std::string& tokenizer, const std::string& input, bool special,
                  std::ostream& out);

}  // namespace packbert
