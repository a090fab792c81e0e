// Rank 0's TensorBoard logdir (log.tensorboard_dir; docs/tensorboard.md): every metrics record
// (train/metrics.h) as scalars at its step, and the effective config as text, in an event file
// (train/tfevents.h) flushed after every record, so TensorBoard shows the run live.
//
// Tags: "<event>/<field>" for each number of a record ("train/loss", "eval/eval_accuracy"),
// "<event>/<field>/<key>" inside an object ("train/activation_bytes_by_kind/ffn"); each value is
// the record's double rounded to the nearest float32, TensorBoard's scalar type. Non-numbers and
// non-finite numbers (null in the JSONL) are left out. The config is the text "config" at the run's
// first event.
//
// Resume: a resumed run (start_step > 0) cuts every event file of the logdir at its first record
// past start_step (what an interrupted run logged after the checkpoint it resumes from, and a
// record cut short by a kill), then writes a new file that sorts after them, which opens with a
// SessionLog START at start_step + 1 (what a TensorBoard that already read the cut records
// drops). A fresh run refuses a logdir that holds event files. Errors name the path.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace packbert {

class TensorBoardWriter {
 public:
  // Creates `dir`, prepares it as above, and writes the config text.
  TensorBoardWriter(const std::string& dir, int64_t start_step, const std::string& config_toml);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  const std::string& path() const { return path_; }  // the event file this run writes
  // One metrics record (its "step" is the event's step, its "event" the tags' group).
  void write(const nlohmann::json& record);

 private:
  void append(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace packbert
