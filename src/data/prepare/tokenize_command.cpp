#include "data/prepare/tokenize_command.h"

#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "data/prepare/hf_tokenizer.h"
#include "data/prepare/tokenizer.h"
#include "kernels/base/error.h"

namespace packbert {

void run_tokenize(const std::string& tokenizer, const std::string& input, bool special,
                  std::ostream& out) {
  std::function<std::vector<int32_t>(const std::string&)> encode;
  std::optional<HfTokenizer> hf;
  std::optional<Vocab> vocab;
  std::optional<BertTokenizer> bert;
  if (tokenizer.size() >= 5 && tokenizer.compare(tokenizer.size() - 5, 5, ".json") == 0) {
    hf.emplace(HfTokenizer::load(tokenizer));
    encode = [&](const std::string& line) { return hf->encode(line, special); };
  } else {
    vocab.emplace(Vocab::load(tokenizer));
    bert.emplace(*vocab);
    encode = [&](const std::string& line) {
      std::vector<int32_t> ids = bert->encode(line);
      if (special) {
        ids.insert(ids.begin(), vocab->cls_id());
        ids.push_back(vocab->sep_id());
      }
      return ids;
    };
  }
  std::ifstream file;
  if (!input.empty() && input != "-") {
    file.open(input, std::ios::binary);
    PB_REQUIRE(file.good(), "tokenize: cannot open the input {}", input);
  }
  std::istream& in = file.is_open() ? static_cast<std::istream&>(file) : std::cin;
  std::string line, text;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    text.clear();
    const std::vector<int32_t> ids = encode(line);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) text.push_back(' ');
      text += std::to_string(ids[i]);
    }
    text.push_back('\n');
    out << text;
  }
  PB_REQUIRE(in.eof(), "tokenize: reading {} failed", input.empty() ? "standard input" : input);
  out.flush();
}

}  // namespace packbert
