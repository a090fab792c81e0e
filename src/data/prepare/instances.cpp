#include "data/prepare/instances.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/base/error.h"

namespace packbert {

void DocumentStore::add_sentence(const uint16_t* ids, size_t n) {
  PB_CHECK(n > 0, "empty sentence");
  PB_REQUIRE(sentence_begin.size() < 0xFFFFFFFFull,
             "more than 4 billion sentences in one input file; split the file");
  tokens.insert(tokens.end(), ids, ids + n);
  sentence_begin.push_back(tokens.size());
}

void DocumentStore::end_document() {
  if (num_sentences() > doc_begin.back()) doc_begin.push_back(num_sentences());
}

size_t DocumentStore::memory_bytes() const {
  return tokens.capacity() * sizeof(uint16_t) + sentence_begin.capacity() * sizeof(uint64_t) +
         doc_begin.capacity() * sizeof(uint32_t);
}

namespace {

// A document's tokens [first, last) in the store.
std::pair<uint64_t, uint64_t> document_tokens(const DocumentStore& docs, uint32_t doc) {
  return {docs.sentence_begin[docs.doc_begin[doc]], docs.sentence_begin[docs.doc_begin[doc + 1]]};
}

size_t plan_chunks(const DocumentStore& docs, uint32_t doc, const InstanceConfig& cfg,
                   std::vector<InstancePlan>* out) {
  const auto [first, last] = document_tokens(docs, doc);
  const uint64_t chunk = static_cast<uint64_t>(cfg.max_seq_len - 2);
  const auto count = static_cast<uint32_t>((last - first + chunk - 1) / chunk);
  if (out)
    for (uint32_t k = 0; k < count; ++k) out->push_back({doc, k, 0, 0, kDocumentChunk});
  return count;
}

void clear_masks(Sample& out) {
  out.masked_lm_positions.clear();
  out.masked_lm_ids.clear();
}

bool is_special(const InstanceConfig& cfg, int32_t id) {
  return cfg.mask_vocab.is_special[static_cast<size_t>(id)] != 0;
}

// [CLS] chunk [SEP] of a chunk plan.
void materialize_chunk(const DocumentStore& docs, const InstancePlan& plan,
                       const InstanceConfig& cfg, Sample& out) {
  const auto [first, last] = document_tokens(docs, plan.a_begin);
  const uint64_t chunk = static_cast<uint64_t>(cfg.max_seq_len - 2);
  const uint64_t a0 = first + plan.a_end * chunk, a1 = std::min(last, a0 + chunk);
  PB_CHECK(a0 < a1, "document {} has no chunk {}", plan.a_begin, plan.a_end);
  const int len = static_cast<int>(a1 - a0) + 2;
  out.id = -1;
  out.input_ids.resize(len);
  out.segment_ids.assign(len, 0);
  out.input_ids[0] = cfg.cls_id;
  std::copy(docs.tokens.begin() + a0, docs.tokens.begin() + a1, out.input_ids.begin() + 1);
  out.input_ids[len - 1] = cfg.sep_id;
  out.next_sentence_label = 0;
}

}  // namespace

size_t plan_document(const DocumentStore& docs, uint32_t doc, const uint32_t* pool,
                     size_t pool_size, const InstanceConfig& cfg, Rng structure, Rng random_doc,
                     std::vector<InstancePlan>* out) {
  if (cfg.documents) return plan_chunks(docs, doc, cfg, out);
  // Google: "We *usually* want to fill up the entire sequence since we are padding to
  // max_seq_length anyways", but with short_seq_prob a shorter target, drawn once per document.
  const int64_t max_num_tokens = cfg.max_seq_len - 3;
  int64_t target = max_num_tokens;
  if (structure.uniform() < cfg.short_seq_prob) target = structure.between(2, max_num_tokens);

  const uint32_t first = docs.doc_begin[doc];
  const uint32_t last = docs.doc_begin[doc + 1];  // one past the document's last sentence
  size_t count = 0;
  uint32_t chunk_begin = first;
  int64_t chunk_tokens = 0;
  for (uint32_t i = first; i < last; ++i) {
    chunk_tokens += static_cast<int64_t>(docs.sentence_length(i));
    if (i + 1 != last && chunk_tokens < target) continue;
    // The chunk is sentences [chunk_begin, i]; A is its first a_end - chunk_begin of them.
    const uint32_t chunk_size = i + 1 - chunk_begin;
    uint32_t a_end = chunk_begin + 1;
    if (chunk_size >= 2)
      a_end = chunk_begin + static_cast<uint32_t>(structure.between(1, chunk_size - 1));
    const bool random_next = chunk_size == 1 || structure.uniform() < 0.5;
    if (random_next) {
      if (out) {
        const int64_t len_a =
            static_cast<int64_t>(docs.sentence_begin[a_end] - docs.sentence_begin[chunk_begin]);
        const int64_t target_b = target - len_a;
        // Up to 10 tries for a document other than this one, as Google does (with a pool of
        // one document, B comes from the same document, still labelled random).
        uint32_t rd = doc;
        for (int tries = 0; tries < 10; ++tries) {
          rd = pool[random_doc.below(pool_size)];
          if (rd != doc) break;
        }
        const uint32_t r_first = docs.doc_begin[rd], r_last = docs.doc_begin[rd + 1];
        const uint32_t b_begin =
            r_first + static_cast<uint32_t>(random_doc.below(r_last - r_first));
        uint32_t b_end = b_begin;
        int64_t len_b = 0;
        while (b_end < r_last) {
          len_b += static_cast<int64_t>(docs.sentence_length(b_end++));
          if (len_b >= target_b) break;
        }
        out->push_back({chunk_begin, a_end, b_begin, b_end, 1});
      }
      // "We didn't actually use these segments so we 'put them back' so they don't go to
      // waste": the next chunk starts right after A.
      i = a_end - 1;
    } else if (out) {
      out->push_back({chunk_begin, a_end, a_end, i + 1, 0});
    }
    ++count;
    chunk_begin = i + 1;
    chunk_tokens = 0;
  }
  return count;
}

void materialize(const DocumentStore& docs, const InstancePlan& plan, const InstanceConfig& cfg,
                 Rng rng, Sample& out, MaskScratch& scratch) {
  if (plan.random_next == kDocumentChunk) {
    materialize_chunk(docs, plan, cfg, out);
    if (!cfg.masks) return clear_masks(out);
    auto& cand = scratch.candidates;
    cand.clear();
    for (int i = 1; i + 1 < static_cast<int>(out.input_ids.size()); ++i)
      if (!is_special(cfg, out.input_ids[i])) cand.push_back(i);
    MaskRule rule;
    rule.probability = cfg.masked_lm_prob;
    rule.max_predictions = cfg.max_predictions;
    rule.whole_word = cfg.whole_word_masking;
    mask_positions(rule, cfg.mask_vocab, static_cast<int>(out.input_ids.size()), rng, out, scratch);
    return;
  }
  // truncate_seq_pair: trim the longer of A and B (B on a tie), one token at a time from the
  // front or the back with probability 0.5 each, so truncation does not favour either end.
  const uint64_t max_num_tokens = static_cast<uint64_t>(cfg.max_seq_len - 3);
  uint64_t a0 = docs.sentence_begin[plan.a_begin], a1 = docs.sentence_begin[plan.a_end];
  uint64_t b0 = docs.sentence_begin[plan.b_begin], b1 = docs.sentence_begin[plan.b_end];
  while ((a1 - a0) + (b1 - b0) > max_num_tokens) {
    const bool trim_a = (a1 - a0) > (b1 - b0);
    uint64_t& front = trim_a ? a0 : b0;
    uint64_t& back = trim_a ? a1 : b1;
    if (rng.coin())
      ++front;
    else
      --back;
  }
  const int len_a = static_cast<int>(a1 - a0), len_b = static_cast<int>(b1 - b0);
  PB_CHECK(len_a >= 1 && len_b >= 1, "empty segment after truncation (A {}, B {})", len_a, len_b);

  // [CLS] A [SEP] B [SEP]; segment 0 up to the first [SEP], 1 after it.
  const int len = len_a + len_b + 3;
  out.id = -1;
  out.input_ids.resize(len);
  out.segment_ids.assign(len, 0);
  out.input_ids[0] = cfg.cls_id;
  std::copy(docs.tokens.begin() + a0, docs.tokens.begin() + a1, out.input_ids.begin() + 1);
  out.input_ids[len_a + 1] = cfg.sep_id;
  std::copy(docs.tokens.begin() + b0, docs.tokens.begin() + b1, out.input_ids.begin() + len_a + 2);
  out.input_ids[len - 1] = cfg.sep_id;
  std::fill(out.segment_ids.begin() + len_a + 2, out.segment_ids.end(), int8_t{1});
  out.next_sentence_label = static_cast<int8_t>(plan.random_next ? 1 : 0);

  // create_masked_lm_predictions. Candidates are all positions but [CLS] and the two [SEP]s
  // (and special tokens of the text: a tokenizer.json matches its added tokens in the text).
  if (!cfg.masks) return clear_masks(out);
  auto& cand = scratch.candidates;
  cand.clear();
  for (int i = 1; i < len - 1; ++i)
    if (i != len_a + 1 && !is_special(cfg, out.input_ids[i])) cand.push_back(i);
  MaskRule rule;
  rule.probability = cfg.masked_lm_prob;
  rule.max_predictions = cfg.max_predictions;
  rule.whole_word = cfg.whole_word_masking;
  mask_positions(rule, cfg.mask_vocab, len, rng, out, scratch);
}

}  // namespace packbert
