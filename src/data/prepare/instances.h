// The instance logic of Google's create_pretraining_data.py, split in two steps so that the
// memory of `packbert prepare` stays near the size of one tokenized input file:
//
//   plan_document  create_instances_from_document without the tokens: which sentences form A
//                  and B (20 bytes per instance instead of the sample itself);
//   materialize    truncate_seq_pair, [CLS] A [SEP] B [SEP], create_masked_lm_predictions.
//
// Every random choice comes from a Rng keyed by what it is for (seed, file, round, document,
// instance), never from a generator shared across threads, so the output cannot depend on how
// work is split between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "data/masking/keyed_rng.h"
#include "data/masking/masking.h"
#include "data/shards/sample.h"

namespace packbert {

// Key domains, the first part of a stream's key: two streams with different tags never coincide
// whatever the other key parts. The other parts of each:
//   kRngDocShuffle   (file): order in which documents are considered for eval
//   kRngStructure    (file, round, doc): target length, chunking, a_end, random-next coin
//   kRngRandomDoc    (file, round, doc): the random document and its start sentence
//   kRngPlanShuffle  (file, split): order of the instances of a file
//   kRngMaterialize  (file, split, index): truncation and masking of one instance
constexpr uint64_t kRngDocShuffle = 1;
constexpr uint64_t kRngStructure = 2;
constexpr uint64_t kRngRandomDoc = 3;
constexpr uint64_t kRngPlanShuffle = 4;
constexpr uint64_t kRngMaterialize = 5;
constexpr uint64_t kEvalRound = ~0ull;  // the round key of held-out (eval) documents
constexpr uint64_t kSplitTrain = 0;     // the split key of training instances
constexpr uint64_t kSplitEval = 1;      // the split key of held-out (eval) instances

// Tokenized documents of one input file, compact: uint16 token ids, sentences and documents as
// ranges (a sentence is a non-empty tokenized line; a document has at least one sentence).
struct DocumentStore {
  std::vector<uint16_t> tokens;
  std::vector<uint64_t> sentence_begin{0};  // token offset of each sentence, then the end
  std::vector<uint32_t> doc_begin{0};       // first sentence of each document, then the end

  uint32_t num_docs() const { return static_cast<uint32_t>(doc_begin.size() - 1); }
  uint32_t num_sentences() const { return static_cast<uint32_t>(sentence_begin.size() - 1); }
  uint64_t sentence_length(uint32_t s) const { return sentence_begin[s + 1] - sentence_begin[s]; }
  // Appends a sentence to the current document (n > 0).
  void add_sentence(const uint16_t* ids, size_t n);
  // Closes the current document; nothing happens when it has no sentence yet.
  void end_document();
  size_t memory_bytes() const;
};

// One instance before tokens are copied: A = sentences [a_begin, a_end) of its document,
// B = sentences [b_begin, b_end) of the same document (actual next) or of another one.
struct InstancePlan {
  uint32_t a_begin, a_end;
  uint32_t b_begin, b_end;
  uint32_t random_next;  // 1: B is a random next (next_sentence_label 1)
};

// InstancePlan::random_next of a document chunk (prepare.samples = documents): a_begin is the
// document, a_end the chunk's index in it, no B.
constexpr uint32_t kDocumentChunk = 2;

struct InstanceConfig {
  // prepare.samples = documents: each document's tokens cut into consecutive chunks of
  // max_seq_len - 2, the last one the shorter tail; [CLS] chunk [SEP], no B, no NSP label.
  bool documents = false;
  int max_seq_len = 128;
  int max_predictions = 20;
  double masked_lm_prob = 0.15;
  double short_seq_prob = 0.1;
  bool whole_word_masking = false;
  bool masks = true;  // false (prepare --masks none): no masked positions, the tokens as they are
  int32_t cls_id = 101, sep_id = 102;
  MaskVocab mask_vocab;  // [MASK], the "##" pieces, the ids a masked token may be replaced with
};

// With cfg.documents: the document's chunks, in order, and nothing drawn from either stream.
// Else create_instances_from_document for document `doc` in one round. `structure` draws the target
// length, chunk ends, a_end and the random-next coin; `random_doc` draws the random document
// (from pool[0, pool_size), up to 10 tries to differ from doc) and its start sentence. Because
// the two are separate streams, the count does not depend on the pool: with out == nullptr the
// instances are only counted (no pool needed), and the count equals the planned one.
size_t plan_document(const DocumentStore& docs, uint32_t doc, const uint32_t* pool,
                     size_t pool_size, const InstanceConfig& cfg, Rng structure, Rng random_doc,
                     std::vector<InstancePlan>* out);

// Plans are shuffled, so materializing them reads the token array at random places: with a
// large file nearly every plan misses the cache twice (its sentence offsets, then its tokens).
// Prefetching the offsets of a plan some iterations ahead, and its tokens a few iterations
// later, overlaps those misses.
inline void prefetch_offsets(const DocumentStore& d, const InstancePlan& p) {
  __builtin_prefetch(d.sentence_begin.data() + p.a_begin);
  __builtin_prefetch(d.sentence_begin.data() + p.b_begin);
}
inline void prefetch_tokens(const DocumentStore& d, const InstancePlan& p) {
  const uint16_t* a = d.tokens.data() + d.sentence_begin[p.a_begin];
  const uint16_t* b = d.tokens.data() + d.sentence_begin[p.b_begin];
  __builtin_prefetch(a);
  __builtin_prefetch(a + 32);
  __builtin_prefetch(b);
  __builtin_prefetch(b + 32);
}

// truncate_seq_pair, [CLS] A [SEP] B [SEP] with segment ids (a document chunk: [CLS] chunk [SEP],
// segment 0, label 0), then create_masked_lm_predictions unless !cfg.masks. Overwrites every field
// of out (out.id = -1).
void materialize(const DocumentStore& docs, const InstancePlan& plan, const InstanceConfig& cfg,
                 Rng rng, Sample& out, MaskScratch& scratch);

}  // namespace packbert
