// trainer_state.json: where training stands beside a checkpoint's weights and moments
// (TrainerState, checkpoint.h), as JSON text and back, every field checked on the way in.
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "kernels/base/error.h"
#include "train/checkpoint.h"

namespace packbert {

std::string trainer_state_to_json(const TrainerState& s) {
  nlohmann::json j;
  j["step"] = s.step;
  j["samples"] = s.samples;
  j["tokens"] = s.tokens;
  j["skipped_steps"] = s.skipped_steps;
  if (s.loss_scale) {
    j["loss_scale"] = {{"scale", s.loss_scale->scale}, {"clean_steps", s.loss_scale->clean_steps}};
  }
  j["loader"] = nlohmann::json::parse(loader_position_to_json(s.loader));
  j["rng"] = {{"train_seed", s.rng.train_seed},
              {"init_seed", s.rng.init_seed},
              {"dropout_seed", s.rng.dropout_seed},
              {"data_seed", s.rng.data_seed}};
  j["world_size"] = s.world_size;
  j["config"] = s.config;
  return j.dump(2);
}

namespace {

// The fields of one object of trainer_state.json; errors name the file and the field, dotted
// below the top level ("loss_scale.scale").
class StateFields {
 public:
  StateFields(const std::string& path, const nlohmann::json& object, std::string prefix = "")
      : path_(path), j_(object), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return j_.contains(key); }
  const nlohmann::json& at(const char* key) const {
    PB_REQUIRE(has(key), "{}: field '{}{}' is missing", path_, prefix_, key);
    return j_.at(key);
  }
  StateFields object(const char* key) const {
    require(key, at(key).is_object(), "an object");
    return StateFields(path_, j_.at(key), prefix_ + key + ".");
  }
  int64_t int64(const char* key) const {
    require(key, at(key).is_number_integer(), "an integer");
    return j_.at(key).get<int64_t>();
  }
  uint64_t uint64(const char* key) const {
    require(key, at(key).is_number_unsigned(), "a non-negative integer");
    return j_.at(key).get<uint64_t>();
  }
  float number(const char* key) const {
    require(key, at(key).is_number(), "a number");
    return j_.at(key).get<float>();
  }
  std::string string(const char* key) const {
    require(key, at(key).is_string(), "a string");
    return j_.at(key).get<std::string>();
  }
  void require(const char* key, bool ok, const char* what) const {
    PB_REQUIRE(ok, "{}: field '{}{}' = {} is not {}", path_, prefix_, key, j_.at(key).dump(), what);
  }
  [[noreturn]] void fail(const char* key, const std::string& why) const {
    PB_THROW("{}: field '{}{}': {}", path_, prefix_, key, why);
  }

 private:
  const std::string& path_;
  const nlohmann::json& j_;
  std::string prefix_;
};

}  // namespace

TrainerState trainer_state_from_json(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    PB_THROW("{}: not valid JSON: {}", path, e.what());
  }
  PB_REQUIRE(j.is_object(), "{}: not a JSON object", path);
  const StateFields f(path, j);
  TrainerState s;
  s.step = f.int64("step");
  s.samples = f.int64("samples");
  s.tokens = f.int64("tokens");
  s.skipped_steps = f.int64("skipped_steps");
  f.require("loader", f.at("loader").is_object(), "an object");
  try {
    s.loader = loader_position_from_json(j.at("loader").dump());
  } catch (const Error& e) {
    f.fail("loader", e.what());
  }
  if (f.has("loss_scale")) {
    const StateFields ls = f.object("loss_scale");
    s.loss_scale = LossScalerState{ls.number("scale"), ls.int64("clean_steps")};
  }
  if (f.has("rng")) {
    const StateFields rng = f.object("rng");
    s.rng.train_seed = rng.uint64("train_seed");
    s.rng.init_seed = rng.uint64("init_seed");
    s.rng.dropout_seed = rng.uint64("dropout_seed");
    s.rng.data_seed = rng.uint64("data_seed");
  }
  if (f.has("world_size")) s.world_size = static_cast<int>(f.int64("world_size"));
  if (f.has("config")) s.config = f.string("config");
  return s;
}

}  // namespace packbert
