#include "model/batch.h"

#include "core/error.h"

namespace packbert {

const char* batch_layout_name(BatchLayout l) {
  switch (l) {
    case BatchLayout::unpadded: return "unpadded";
    case BatchLayout::packed: return "packed";
    case BatchLayout::padded: return "padded";
  }
  return "?";
}

BatchLayout parse_batch_layout(const std::string& name) {
  if (name == "unpadded") return BatchLayout::unpadded;
  if (name == "packed") return BatchLayout::packed;
  if (name == "padded") return BatchLayout::padded;
  PB_THROW("unknown batch layout '{}' (known: unpadded, packed, padded)", name);
}

int64_t Batch::num_tokens() const {
  int64_t n = 0;
  for (int32_t l : seq_len) n += l;
  return n;
}

SeqLayout Batch::host_layout() const {
  SeqLayout l;
  l.rows = rows;
  l.num_seqs = static_cast<int32_t>(seq_len.size());
  l.max_len = max_len;
  const int64_t s = l.num_seqs;
  l.seq_start = view(seq_start.data(), {s});
  l.seq_len = view(seq_len.data(), {s});
  l.sample_id = view(sample_id.data(), {s});
  l.token_seq = view(token_seq.data(), {rows});
  l.token_pos = view(token_pos.data(), {rows});
  l.host_seq_len = seq_len.empty() ? nullptr : seq_len.data();
  return l;
}

}  // namespace packbert
