// The trainer options the trainer tests start from (header-only: only tests that already link
// the trainer include it).
#pragma once

#include <cstdint>
#include <random>

#include "model/config.h"
#include "train/trainer.h"

namespace packbert::test {

// The tiny model, sequences up to max_seq_len, init and dropout seeds drawn from rng (in that
// order), this peak learning rate and schedule length; everything else the defaults.
inline TrainerOptions tiny_trainer_options(std::mt19937_64& rng, int max_seq_len, double base_lr,
                                           int64_t max_steps) {
  TrainerOptions o;
  o.config = bert_preset("tiny");
  o.max_seq_len = max_seq_len;
  o.init_seed = rng();
  o.dropout_seed = rng();
  o.lr.base_lr = base_lr;
  o.lr.max_steps = max_steps;
  return o;
}

}  // namespace packbert::test
