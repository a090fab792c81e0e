#include "train/train_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/philox.h"
#include "core/error.h"
#include "device.h"

namespace packbert {

// ---- equality ----------------------------------------------------------------------------------

bool TrainConfig::Model::operator==(const Model& o) const {
  return preset == o.preset && layers == o.layers && hidden == o.hidden && heads == o.heads &&
         intermediate == o.intermediate && max_position_embeddings == o.max_position_embeddings &&
         hidden_dropout == o.hidden_dropout && attention_dropout == o.attention_dropout &&
         mlm_chunk_rows == o.mlm_chunk_rows && mst_chunks == o.mst_chunks &&
         activation_budget_mb == o.activation_budget_mb && recompute == o.recompute &&
         hidden_act == o.hidden_act;
}
bool TrainConfig::Train::operator==(const Train& o) const {
  return max_steps == o.max_steps && global_batch_size == o.global_batch_size &&
         gradient_accumulation_steps == o.gradient_accumulation_steps && seed == o.seed &&
         layout == o.layout && max_seq_len == o.max_seq_len &&
         max_seqs_per_pack == o.max_seqs_per_pack &&
         max_predictions_per_seq == o.max_predictions_per_seq && last_step == o.last_step &&
         dropout == o.dropout && max_nonfinite_steps == o.max_nonfinite_steps &&
         device == o.device && precision == o.precision && gpu_allreduce == o.gpu_allreduce &&
         loss_scale_init == o.loss_scale_init &&
         loss_scale_growth_interval == o.loss_scale_growth_interval &&
         collective_timeout_s == o.collective_timeout_s;
}
bool TrainConfig::Optim::operator==(const Optim& o) const {
  return lr == o.lr && end_lr == o.end_lr && warmup_steps == o.warmup_steps &&
         warmup_proportion == o.warmup_proportion && start_warmup_step == o.start_warmup_step &&
         poly_power == o.poly_power && beta1 == o.beta1 && beta2 == o.beta2 &&
         epsilon == o.epsilon && weight_decay == o.weight_decay &&
         max_grad_norm == o.max_grad_norm && sharded == o.sharded;
}
bool TrainConfig::Data::operator==(const Data& o) const {
  return train_dir == o.train_dir && eval_dir == o.eval_dir && vocab == o.vocab &&
         prefetch_steps == o.prefetch_steps && shuffle_block_rows == o.shuffle_block_rows &&
         shuffle_window_blocks == o.shuffle_window_blocks &&
         read_ahead_windows == o.read_ahead_windows;
}
bool TrainConfig::Checkpoint::operator==(const Checkpoint& o) const {
  return dir == o.dir && every_steps == o.every_steps && keep == o.keep && resume == o.resume &&
         init_checkpoint == o.init_checkpoint;
}
bool TrainConfig::Eval::operator==(const Eval& o) const {
  return every_samples == o.every_samples && max_samples == o.max_samples &&
         batch_size == o.batch_size && target_accuracy == o.target_accuracy &&
         at_end == o.at_end;
}
bool TrainConfig::Log::operator==(const Log& o) const {
  return every_steps == o.every_steps && metrics_file == o.metrics_file &&
         mllog_file == o.mllog_file && submission_org == o.submission_org &&
         submission_platform == o.submission_platform &&
         submission_division == o.submission_division &&
         submission_status == o.submission_status;
}
bool TrainConfig::operator==(const TrainConfig& o) const {
  return model == o.model && train == o.train && optim == o.optim && data == o.data &&
         checkpoint == o.checkpoint && eval == o.eval && log == o.log;
}

bool TrainConfig::eval_enabled() const {
  return eval.every_samples > 0 || eval.at_end || eval.target_accuracy > 0;
}

namespace {

// ---- TOML values -------------------------------------------------------------------------------

struct Value {
  enum Kind { kString, kInt, kFloat, kBool } kind = kString;
  std::string s;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string text;  // as written (for messages)
};

const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::kString: return "a string";
    case Value::kInt: return "an integer";
    case Value::kFloat: return "a float";
    case Value::kBool: return "a boolean";
  }
  return "?";
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// Parses a TOML value starting at text[pos]; on success sets v and pos just past the value.
// Returns "" or what is wrong.
std::string parse_value(const std::string& text, size_t& pos, Value& v) {
  if (pos >= text.size()) return "missing value";
  char c = text[pos];
  if (c == '"') {
    std::string out;
    size_t i = pos + 1;
    for (;; ++i) {
      if (i >= text.size()) return "unterminated string";
      char ch = text[i];
      if (ch == '"') break;
      if (ch == '\\') {
        if (++i >= text.size()) return "unterminated string";
        switch (text[i]) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          default: return fmt::format("unsupported escape '\\{}' in string", text[i]);
        }
        continue;
      }
      out += ch;
    }
    v.kind = Value::kString;
    v.s = out;
    v.text = text.substr(pos, i + 1 - pos);
    pos = i + 1;
    return "";
  }
  if (c == '\'') {
    size_t e = text.find('\'', pos + 1);
    if (e == std::string::npos) return "unterminated string";
    v.kind = Value::kString;
    v.s = text.substr(pos + 1, e - pos - 1);
    v.text = text.substr(pos, e + 1 - pos);
    pos = e + 1;
    return "";
  }
  // A bare token: up to whitespace or a comment.
  size_t e = pos;
  while (e < text.size() && text[e] != ' ' && text[e] != '\t' && text[e] != '#' &&
         text[e] != '\r')
    ++e;
  std::string tok = text.substr(pos, e - pos);
  v.text = tok;
  if (tok == "true" || tok == "false") {
    v.kind = Value::kBool;
    v.b = tok == "true";
    pos = e;
    return "";
  }
  std::string body = tok;
  std::string sign;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    sign = body.substr(0, 1);
    body = body.substr(1);
  }
  if (body == "inf" || body == "nan") {
    v.kind = Value::kFloat;
    v.f = body == "inf" ? std::numeric_limits<double>::infinity()
                        : std::numeric_limits<double>::quiet_NaN();
    if (sign == "-") v.f = -v.f;
    pos = e;
    return "";
  }
  // Digits, underscores between digits, '.', exponent.
  bool ok = !body.empty() && std::isdigit(static_cast<unsigned char>(body[0]));
  bool is_float = false;
  std::string clean;
  for (size_t k = 0; ok && k < body.size(); ++k) {
    char ch = body[k];
    if (ch == '_') {
      ok = k > 0 && k + 1 < body.size() && std::isdigit(static_cast<unsigned char>(body[k - 1])) &&
           std::isdigit(static_cast<unsigned char>(body[k + 1]));
      continue;
    }
    if (ch == '.' || ch == 'e' || ch == 'E') is_float = true;
    if (!(std::isdigit(static_cast<unsigned char>(ch)) || ch == '.' || ch == 'e' || ch == 'E' ||
          ((ch == '+' || ch == '-') && k > 0 && (body[k - 1] == 'e' || body[k - 1] == 'E'))))
      ok = false;
    clean += ch;
  }
  if (!ok) {
    if (tok.empty()) return "missing value";
    return fmt::format("malformed value '{}' (strings must be quoted)", tok);
  }
  clean = sign + clean;
  errno = 0;
  char* end = nullptr;
  if (is_float) {
    v.kind = Value::kFloat;
    v.f = std::strtod(clean.c_str(), &end);
    if (end != clean.c_str() + clean.size()) return fmt::format("malformed float '{}'", tok);
    if (errno == ERANGE && std::isinf(v.f)) return fmt::format("float '{}' out of range", tok);
  } else {
    v.kind = Value::kInt;
    v.i = std::strtoll(clean.c_str(), &end, 10);
    if (end != clean.c_str() + clean.size()) return fmt::format("malformed integer '{}'", tok);
    if (errno == ERANGE) return fmt::format("integer '{}' out of range", tok);
  }
  pos = e;
  return "";
}

// The rest of a line after a value or header: whitespace, then nothing or a comment.
bool rest_is_empty(const std::string& text, size_t pos) {
  while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\r')) ++pos;
  return pos >= text.size() || text[pos] == '#';
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default: out += c;
    }
  }
  return out + "\"";
}

std::string toml_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", f);  // shortest representation that round-trips
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

// ---- the key registry --------------------------------------------------------------------------

struct KeyDef {
  ConfigKeyInfo info;
  bool preset_override = false;  // a model key whose default is the preset's
  // Sets the field from a value; returns "" or what is wrong (the caller adds where and key).
  std::function<std::string(TrainConfig&, const Value&)> set;
  std::function<std::string(const TrainConfig&)> get;  // TOML literal
  bool string_like = false;  // string or enum: an override may give it bare
};

template <class T>
std::string set_int(T& field, const Value& v) {
  if (v.kind != Value::kInt) return fmt::format("expected an integer, got {} ({})", kind_name(v.kind), v.text);
  if constexpr (std::is_unsigned_v<T>) {
    if (v.i < 0) return fmt::format("must be >= 0, got {}", v.i);
  } else {
    if (v.i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        v.i > static_cast<int64_t>(std::numeric_limits<T>::max()))
      return fmt::format("{} is out of range", v.i);
  }
  field = static_cast<T>(v.i);
  return "";
}

std::string set_float(double& field, const Value& v) {
  if (v.kind == Value::kInt) {
    field = static_cast<double>(v.i);
    return "";
  }
  if (v.kind != Value::kFloat) return fmt::format("expected a float, got {} ({})", kind_name(v.kind), v.text);
  field = v.f;
  return "";
}

std::string set_bool(bool& field, const Value& v) {
  if (v.kind != Value::kBool)
    return fmt::format("expected a boolean (true or false), got {} ({})", kind_name(v.kind), v.text);
  field = v.b;
  return "";
}

std::string set_string(std::string& field, const Value& v) {
  if (v.kind != Value::kString) return fmt::format("expected a string, got {} ({})", kind_name(v.kind), v.text);
  field = v.s;
  return "";
}

std::string set_choice(std::string& field, const Value& v, const std::vector<std::string>& choices) {
  if (v.kind != Value::kString)
    return fmt::format("expected one of {}, got {} ({})", fmt::join(choices, " | "),
                       kind_name(v.kind), v.text);
  if (std::find(choices.begin(), choices.end(), v.s) == choices.end())
    return fmt::format("unknown value '{}' (expected one of {})", v.s, fmt::join(choices, " | "));
  field = v.s;
  return "";
}

const std::vector<std::string>& layout_names() {
  static const std::vector<std::string> n = {"unpadded", "packed", "padded"};
  return n;
}
const std::vector<std::string>& device_names() {
  static const std::vector<std::string> n = {"cpu", "cuda"};
  return n;
}
const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> n = {"fp32", "bf16", "fp16"};
  return n;
}
const std::vector<std::string>& gpu_allreduce_names() {
  static const std::vector<std::string> n = {"nccl", "host"};
  return n;
}
const std::vector<std::string>& last_step_names() {
  static const std::vector<std::string> n = {"partial", "drop"};
  return n;
}
const std::vector<std::string>& hidden_act_names() {
  static const std::vector<std::string> n = {"gelu", "gelu_tanh"};
  return n;
}

const std::vector<std::string>& recompute_names() {
  static const std::vector<std::string> n = {"none", "mlp", "layer"};
  return n;
}
const std::vector<std::string>& division_names() {
  static const std::vector<std::string> n = {"closed", "open"};
  return n;
}
const std::vector<std::string>& status_names() {
  static const std::vector<std::string> n = {"onprem", "cloud", "research"};
  return n;
}

std::string enum_type(const std::vector<std::string>& names) {
  return fmt::format("enum({})", fmt::join(names, "|"));
}

using C = TrainConfig;

// Builders: section member, field member.
template <class S, class T>
KeyDef int_key(const std::string& name, S C::*sec, T S::*field, const std::string& doc,
               bool preset_override = false) {
  KeyDef k;
  k.info = {name, "int", "", doc};
  k.preset_override = preset_override;
  k.set = [=](C& c, const Value& v) { return set_int(c.*sec.*field, v); };
  k.get = [=](const C& c) { return fmt::format("{}", c.*sec.*field); };
  return k;
}
template <class S>
KeyDef float_key(const std::string& name, S C::*sec, double S::*field, const std::string& doc,
                 bool preset_override = false) {
  KeyDef k;
  k.info = {name, "float", "", doc};
  k.preset_override = preset_override;
  k.set = [=](C& c, const Value& v) { return set_float(c.*sec.*field, v); };
  k.get = [=](const C& c) { return toml_float(c.*sec.*field); };
  return k;
}
template <class S>
KeyDef bool_key(const std::string& name, S C::*sec, bool S::*field, const std::string& doc) {
  KeyDef k;
  k.info = {name, "bool", "", doc};
  k.set = [=](C& c, const Value& v) { return set_bool(c.*sec.*field, v); };
  k.get = [=](const C& c) { return std::string((c.*sec.*field) ? "true" : "false"); };
  return k;
}
template <class S>
KeyDef string_key(const std::string& name, S C::*sec, std::string S::*field,
                  const std::string& doc) {
  KeyDef k;
  k.info = {name, "string", "", doc};
  k.string_like = true;
  k.set = [=](C& c, const Value& v) { return set_string(c.*sec.*field, v); };
  k.get = [=](const C& c) { return toml_string(c.*sec.*field); };
  return k;
}
template <class S>
KeyDef choice_key(const std::string& name, S C::*sec, std::string S::*field,
                  const std::vector<std::string>& choices, const std::string& doc) {
  KeyDef k;
  k.info = {name, enum_type(choices), "", doc};
  k.string_like = true;
  k.set = [=](C& c, const Value& v) { return set_choice(c.*sec.*field, v, choices); };
  k.get = [=](const C& c) { return toml_string(c.*sec.*field); };
  return k;
}

std::vector<KeyDef> make_keys() {
  std::vector<KeyDef> k;
  using M = C::Model;
  using T = C::Train;
  using O = C::Optim;
  using D = C::Data;
  using K = C::Checkpoint;
  using E = C::Eval;
  using L = C::Log;
  // [model]
  k.push_back(choice_key("model.preset", &C::model, &M::preset, bert_preset_names(),
                         "model shape: tiny (L2 H128), mini (L4 H256), base (L12 H768), large "
                         "(L24 H1024); the keys below override single values"));
  k.push_back(int_key("model.layers", &C::model, &M::layers, "encoder layers", true));
  k.push_back(int_key("model.hidden", &C::model, &M::hidden, "hidden size", true));
  k.push_back(int_key("model.heads", &C::model, &M::heads, "attention heads (divide hidden)", true));
  k.push_back(int_key("model.intermediate", &C::model, &M::intermediate, "feed-forward size", true));
  k.push_back(int_key("model.max_position_embeddings", &C::model, &M::max_position_embeddings,
                      "position embedding rows (>= train.max_seq_len)", true));
  k.push_back(float_key("model.hidden_dropout", &C::model, &M::hidden_dropout,
                        "dropout after embeddings, attention output and FFN, in [0, 1)", true));
  k.push_back(float_key("model.attention_dropout", &C::model, &M::attention_dropout,
                        "dropout on attention probabilities, in [0, 1)", true));
  k.push_back(choice_key("model.hidden_act", &C::model, &M::hidden_act, hidden_act_names(),
                         "GELU of the MLP and MLM transform: gelu (exact, erf; Hugging Face "
                         "\"gelu\") or gelu_tanh (the tanh approximation of Google's BERT and "
                         "NVIDIA's MLPerf BERT; Hugging Face \"gelu_new\"; fused into cuBLASLt's "
                         "GELU epilogues on CUDA)"));
  k.push_back(int_key("model.mlm_chunk_rows", &C::model, &M::mlm_chunk_rows,
                      "masked tokens per MLM-head chunk (mini-sequence, saves memory); 0 = all at once"));
  k.push_back(int_key("model.mst_chunks", &C::model, &M::mst_chunks,
                      "mini-sequence chunks M: the MLP runs over M token chunks (its intermediate "
                      "recomputed in backward), the MLM head over M masked-token chunks "
                      "(model.mlm_chunk_rows wins if set); 1 = off; 0 = auto: the smallest of "
                      "1, 2, 4, .., 64 that fits model.activation_budget_mb"));
  k.push_back(int_key("model.activation_budget_mb", &C::model, &M::activation_budget_mb,
                      "activation arena budget in MiB per rank for model.mst_chunks = 0"));
  k.push_back(choice_key("model.recompute", &C::model, &M::recompute, recompute_names(),
                         "activation recomputation: none; mlp (MLP intermediate recomputed in "
                         "backward, implied by mst_chunks > 1); layer (only layer inputs kept, "
                         "each layer recomputed before its backward)"));
  // [train]
  k.push_back(int_key("train.max_steps", &C::train, &T::max_steps,
                      "optimizer steps of the run (also where the LR reaches end_lr)"));
  k.push_back(int_key("train.global_batch_size", &C::train, &T::global_batch_size,
                      "samples per optimizer step, all ranks and micro-steps together"));
  k.push_back(int_key("train.gradient_accumulation_steps", &C::train,
                      &T::gradient_accumulation_steps, "micro-steps per optimizer step (>= 1)"));
  k.push_back(int_key("train.seed", &C::train, &T::seed,
                      "seed of parameter init, data order and dropout (>= 0)"));
  {
    KeyDef d;
    d.info = {"train.layout", enum_type(layout_names()), "",
              "batch layout: unpadded (cu_seqlens), packed (several sequences per row) or padded"};
    d.string_like = true;
    d.set = [](C& c, const Value& v) {
      std::string s;
      std::string err = set_choice(s, v, layout_names());
      if (err.empty()) c.train.layout = parse_batch_layout(s);
      return err;
    };
    d.get = [](const C& c) { return toml_string(batch_layout_name(c.train.layout)); };
    k.push_back(d);
  }
  k.push_back(int_key("train.max_seq_len", &C::train, &T::max_seq_len,
                      "longest sample; row length of the packed and padded layouts"));
  k.push_back(int_key("train.max_seqs_per_pack", &C::train, &T::max_seqs_per_pack,
                      "sequences per pack (packed layout, planning); 0 = no limit"));
  k.push_back(int_key("train.max_predictions_per_seq", &C::train, &T::max_predictions_per_seq,
                      "masked positions a sample may hold (MLPerf: 20 at seq 128, 76 at 512)"));
  {
    KeyDef d;
    d.info = {"train.last_step", enum_type(last_step_names()), "",
              "epoch remainder: partial (a smaller last step) or drop (every step full, as MLPerf)"};
    d.string_like = true;
    d.set = [](C& c, const Value& v) {
      std::string s;
      std::string err = set_choice(s, v, last_step_names());
      if (err.empty()) c.train.last_step = parse_last_step_policy(s);
      return err;
    };
    d.get = [](const C& c) { return toml_string(last_step_policy_name(c.train.last_step)); };
    k.push_back(d);
  }
  k.push_back(bool_key("train.dropout", &C::train, &T::dropout,
                       "apply dropout (false: deterministic training, for checks)"));
  k.push_back(int_key("train.max_nonfinite_steps", &C::train, &T::max_nonfinite_steps,
                      "non-finite steps are skipped; abort after this many in a row"));
  {
    KeyDef d;
    d.info = {"train.device", enum_type(device_names()), "",
              "where the step runs: cpu, or cuda (one GPU per rank: local rank r takes GPU r "
              "of those it sees; launch scripts show each rank only its own)"};
    d.string_like = true;
    d.set = [](C& c, const Value& v) { return set_choice(c.train.device, v, device_names()); };
    d.get = [](const C& c) { return toml_string(c.train.device); };
    k.push_back(d);
  }
  k.push_back(choice_key("train.precision", &C::train, &T::precision, precision_names(),
                         "storage of activations and of the GEMMs' weight copy: fp32; bf16 or "
                         "fp16 with fp32 master weights, LayerNorm statistics, losses and "
                         "gradient sums (fp16 adds dynamic loss scaling; on the CPU backend the "
                         "low precision is emulated, for testing)"));
  k.push_back(choice_key("train.gpu_allreduce", &C::train, &T::gpu_allreduce,
                         gpu_allreduce_names(),
                         "device = cuda, several ranks: nccl (gradient buckets all-reduced on a "
                         "communication stream during the backward) or host (each bucket staged "
                         "through host memory and summed by MPI: slower, a fallback)"));
  k.push_back(float_key("train.loss_scale_init", &C::train, &T::loss_scale_init,
                        "precision = fp16: the first loss scale, a power of two in [1, 2^24]"));
  k.push_back(int_key("train.loss_scale_growth_interval", &C::train,
                      &T::loss_scale_growth_interval,
                      "precision = fp16: finite steps in a row before the loss scale doubles "
                      "(an overflow skips the step and halves it)"));
  k.push_back(float_key("train.collective_timeout_s", &C::train, &T::collective_timeout_s,
                        "seconds a rank may wait in a collective (gradient all-reduce, loader "
                        "exchange, checkpoint barrier, evaluation) before the job aborts with "
                        "an error naming it and the step; 0 = off; the default outlasts a "
                        "checkpoint write the others wait for (DESIGN.md, Distribution)"));
  // [optim]
  k.push_back(float_key("optim.lr", &C::optim, &O::lr, "peak learning rate (LAMB)"));
  k.push_back(float_key("optim.end_lr", &C::optim, &O::end_lr, "learning rate at train.max_steps"));
  k.push_back(int_key("optim.warmup_steps", &C::optim, &O::warmup_steps,
                      "linear warmup steps; 0 = use warmup_proportion"));
  k.push_back(float_key("optim.warmup_proportion", &C::optim, &O::warmup_proportion,
                        "warmup as a fraction of max_steps (when warmup_steps is 0), in [0, 1]"));
  k.push_back(int_key("optim.start_warmup_step", &C::optim, &O::start_warmup_step,
                      "MLPerf start_warmup_step: warmup offset (may be negative; needs warmup_steps)"));
  k.push_back(float_key("optim.poly_power", &C::optim, &O::poly_power,
                        "power of the polynomial decay after warmup"));
  k.push_back(float_key("optim.beta1", &C::optim, &O::beta1, "LAMB first-moment decay"));
  k.push_back(float_key("optim.beta2", &C::optim, &O::beta2, "LAMB second-moment decay"));
  k.push_back(float_key("optim.epsilon", &C::optim, &O::epsilon, "LAMB epsilon"));
  k.push_back(float_key("optim.weight_decay", &C::optim, &O::weight_decay,
                        "decoupled weight decay (not on biases and LayerNorm)"));
  k.push_back(float_key("optim.max_grad_norm", &C::optim, &O::max_grad_norm,
                        "clip the global gradient norm to this"));
  k.push_back(bool_key("optim.sharded", &C::optim, &O::sharded,
                       "sharded LAMB: each rank keeps the moments of, and updates, the tensors "
                       "of its 1/N range; gradients reduce-scattered, weights all-gathered (one "
                       "rank: no-op)"));
  // [data]
  k.push_back(string_key("data.train_dir", &C::data, &D::train_dir,
                         "training shards: a directory of .h5 files or one file"));
  k.push_back(string_key("data.eval_dir", &C::data, &D::eval_dir,
                         "evaluation shards: a directory of .h5 files or one file"));
  k.push_back(string_key("data.vocab", &C::data, &D::vocab, "vocab.txt of the shards' tokenizer"));
  k.push_back(int_key("data.prefetch_steps", &C::data, &D::prefetch_steps,
                      "steps the loader prepares ahead (>= 1)"));
  k.push_back(int_key("data.shuffle_block_rows", &C::data, &D::shuffle_block_rows,
                      "contiguous rows read at once (the shards' HDF5 chunk: 4096)"));
  k.push_back(int_key("data.shuffle_window_blocks", &C::data, &D::shuffle_window_blocks,
                      "blocks shuffled together"));
  k.push_back(int_key("data.read_ahead_windows", &C::data, &D::read_ahead_windows,
                      "shuffle windows read ahead of need (>= 0)"));
  // [checkpoint]
  k.push_back(string_key("checkpoint.dir", &C::checkpoint, &K::dir,
                         "where checkpoints are written; \"\" = none"));
  k.push_back(int_key("checkpoint.every_steps", &C::checkpoint, &K::every_steps,
                      "checkpoint interval; 0 = only at the end and on SIGTERM"));
  k.push_back(int_key("checkpoint.keep", &C::checkpoint, &K::keep,
                      "newest complete checkpoints kept (>= 1)"));
  k.push_back(string_key("checkpoint.resume", &C::checkpoint, &K::resume,
                         "\"\" = fresh run, \"auto\" = newest complete under dir, or a checkpoint path"));
  k.push_back(string_key("checkpoint.init_checkpoint", &C::checkpoint, &K::init_checkpoint,
                         "initial model weights only (fresh optimizer and data order); \"\" = random init"));
  // [eval]
  k.push_back(int_key("eval.every_samples", &C::eval, &E::every_samples,
                      "evaluate every this many training samples; 0 = only at the end"));
  k.push_back(int_key("eval.max_samples", &C::eval, &E::max_samples,
                      "eval samples per evaluation; 0 = the whole eval set"));
  k.push_back(int_key("eval.batch_size", &C::eval, &E::batch_size,
                      "eval samples per rank per forward"));
  k.push_back(float_key("eval.target_accuracy", &C::eval, &E::target_accuracy,
                        "stop when the eval MLM accuracy reaches this; 0 = no target"));
  k.push_back(bool_key("eval.at_end", &C::eval, &E::at_end, "evaluate after the last step"));
  // [log]
  k.push_back(int_key("log.every_steps", &C::log, &L::every_steps,
                      "progress line and metrics record interval, steps"));
  k.push_back(string_key("log.metrics_file", &C::log, &L::metrics_file,
                         "JSONL metrics (scripts/plot_metrics.py); \"\" = none"));
  k.push_back(string_key("log.mllog_file", &C::log, &L::mllog_file,
                         "MLPerf log (:::MLLOG lines); \"\" = none"));
  k.push_back(string_key("log.submission_org", &C::log, &L::submission_org, "MLPerf submission_org"));
  k.push_back(string_key("log.submission_platform", &C::log, &L::submission_platform,
                         "MLPerf submission_platform; \"\" = \"<ranks>xCPU\""));
  k.push_back(choice_key("log.submission_division", &C::log, &L::submission_division,
                         division_names(), "MLPerf submission_division"));
  k.push_back(choice_key("log.submission_status", &C::log, &L::submission_status, status_names(),
                         "MLPerf submission_status"));

  const TrainConfig defaults;
  for (KeyDef& d : k) d.info.default_value = d.preset_override ? "(preset)" : d.get(defaults);
  return k;
}

const std::vector<KeyDef>& keys() {
  static const std::vector<KeyDef> k = make_keys();
  return k;
}

const KeyDef* find_key(const std::string& name) {
  for (const KeyDef& k : keys())
    if (k.info.name == name) return &k;
  return nullptr;
}

const std::vector<std::string>& section_names() {
  static const std::vector<std::string> s = {"model", "train", "optim", "data",
                                             "checkpoint", "eval", "log"};
  return s;
}

std::vector<std::string> keys_of(const std::string& section) {
  std::vector<std::string> out;
  for (const KeyDef& k : keys())
    if (k.info.name.compare(0, section.size() + 1, section + ".") == 0)
      out.push_back(k.info.name.substr(section.size() + 1));
  return out;
}

// Where an assignment came from.
struct Assignment {
  const KeyDef* key;
  Value value;
  std::string where;
};

[[noreturn]] void fail_unknown_key(const std::string& where, const std::string& section,
                                   const std::string& key) {
  PB_THROW("{}: unknown key '{}' in section [{}] (known: {})", where, key, section,
           fmt::join(keys_of(section), ", "));
}
[[noreturn]] void fail_unknown_section(const std::string& where, const std::string& section) {
  PB_THROW("{}: unknown section [{}] (known: {})", where, section,
           fmt::join(section_names(), ", "));
}

bool valid_bare_key(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

void parse_file(const std::string& path, std::vector<Assignment>& out) {
  std::ifstream in(path);
  PB_REQUIRE(in.good(), "{}: cannot open the config file", path);
  std::string line;
  int lineno = 0;
  std::string section;
  std::set<std::string> seen_sections;
  std::map<std::string, int> seen_keys;
  while (std::getline(in, line)) {
    ++lineno;
    const std::string where = fmt::format("{}:{}", path, lineno);
    std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    if (t[0] == '[') {
      PB_REQUIRE(t.size() < 2 || t[1] != '[', "{}: arrays of tables ({}) are not supported", where,
                 t);
      size_t close = t.find(']');
      PB_REQUIRE(close != std::string::npos, "{}: malformed section header '{}'", where, t);
      PB_REQUIRE(rest_is_empty(t, close + 1), "{}: unexpected text after section header '{}'",
                 where, t);
      std::string name = trim(t.substr(1, close - 1));
      if (std::find(section_names().begin(), section_names().end(), name) ==
          section_names().end())
        fail_unknown_section(where, name);
      PB_REQUIRE(seen_sections.insert(name).second, "{}: section [{}] appears twice", where, name);
      section = name;
      continue;
    }
    size_t eq = t.find('=');
    PB_REQUIRE(eq != std::string::npos, "{}: expected 'key = value' or '[section]', got '{}'",
               where, t);
    std::string key = trim(t.substr(0, eq));
    PB_REQUIRE(valid_bare_key(key), "{}: malformed key '{}' (bare keys only: letters, digits, _ -)",
               where, key);
    PB_REQUIRE(!section.empty(), "{}: key '{}' is outside any section (start with e.g. [train])",
               where, key);
    const std::string full = section + "." + key;
    const KeyDef* def = find_key(full);
    if (!def) fail_unknown_key(where, section, key);
    auto [it, fresh] = seen_keys.emplace(full, lineno);
    PB_REQUIRE(fresh, "{}: {}: duplicate key (first set on line {})", where, full, it->second);
    size_t pos = eq + 1;
    while (pos < t.size() && (t[pos] == ' ' || t[pos] == '\t')) ++pos;
    Value v;
    std::string err = parse_value(t, pos, v);
    PB_REQUIRE(err.empty(), "{}: {}: {}", where, full, err);
    PB_REQUIRE(rest_is_empty(t, pos), "{}: {}: unexpected text after the value: '{}'", where, full,
               trim(t.substr(pos)));
    out.push_back({def, v, where});
  }
}

void parse_override(const std::string& text, std::vector<Assignment>& out) {
  const std::string where = fmt::format("override '{}'", text);
  std::string s = text;
  if (s.compare(0, 2, "--") == 0) s = s.substr(2);
  size_t eq = s.find('=');
  PB_REQUIRE(eq != std::string::npos, "{}: expected section.key=value", where);
  std::string name = trim(s.substr(0, eq));
  std::string raw = trim(s.substr(eq + 1));
  size_t dot = name.find('.');
  PB_REQUIRE(dot != std::string::npos, "{}: expected section.key=value (e.g. train.max_steps=100)",
             where);
  std::string section = name.substr(0, dot);
  if (std::find(section_names().begin(), section_names().end(), section) == section_names().end())
    fail_unknown_section(where, section);
  const KeyDef* def = find_key(name);
  if (!def) fail_unknown_key(where, section, name.substr(dot + 1));
  Value v;
  if (def->string_like && (raw.empty() || (raw[0] != '"' && raw[0] != '\''))) {
    v.kind = Value::kString;
    v.s = raw;
    v.text = raw;
  } else {
    size_t pos = 0;
    std::string err = parse_value(raw, pos, v);
    PB_REQUIRE(err.empty(), "{}: {}: {}", where, name, err);
    PB_REQUIRE(rest_is_empty(raw, pos), "{}: {}: unexpected text after the value: '{}'", where,
               name, trim(raw.substr(pos)));
  }
  out.push_back({def, v, where});
}

void apply_preset(TrainConfig& c) {
  BertConfig p = bert_preset(c.model.preset);
  c.model.layers = p.layers;
  c.model.hidden = p.hidden;
  c.model.heads = p.heads;
  c.model.intermediate = p.intermediate;
  c.model.max_position_embeddings = p.max_position_embeddings;
  // The preset's float rates as the decimal they were written as (0.1f -> 0.1, not
  // 0.10000000149), so a preset config equals one that spells the rates out.
  auto decimal = [](float f) { return std::stod(fmt::format("{}", f)); };
  c.model.hidden_dropout = decimal(p.hidden_dropout);
  c.model.attention_dropout = decimal(p.attention_dropout);
}

bool path_exists(const std::string& p) {
  std::error_code ec;
  return !p.empty() && std::filesystem::exists(p, ec);
}

}  // namespace

TrainConfig load_train_config(const std::string& toml_path,
                              const std::vector<std::string>& overrides) {
  std::vector<Assignment> assignments;
  if (!toml_path.empty()) parse_file(toml_path, assignments);
  for (const std::string& o : overrides) parse_override(o, assignments);

  TrainConfig c;
  // The preset first (the last assignment wins), so explicit model keys override its values
  // whatever their order.
  for (const Assignment& a : assignments) {
    if (a.key->info.name != "model.preset") continue;
    std::string err = a.key->set(c, a.value);
    PB_REQUIRE(err.empty(), "{}: model.preset: {}", a.where, err);
  }
  apply_preset(c);
  for (const Assignment& a : assignments) {
    std::string err = a.key->set(c, a.value);
    PB_REQUIRE(err.empty(), "{}: {}: {}", a.where, a.key->info.name, err);
  }
  return c;
}

void validate_train_config(const TrainConfig& c, int world_size, ConfigPurpose purpose,
                           bool check_paths) {
  PB_REQUIRE(world_size >= 1, "world size {} must be >= 1", world_size);
  PB_REQUIRE(!check_paths || c.train.device != "cuda" || cuda_built(),
             "train.device = \"cuda\", but this build has no CUDA backend (configure with "
             "-DPACKBERT_CUDA=ON)");
  const auto& m = c.model;
  PB_REQUIRE(m.layers >= 1, "model.layers ({}) must be >= 1", m.layers);
  PB_REQUIRE(m.hidden >= 1, "model.hidden ({}) must be >= 1", m.hidden);
  PB_REQUIRE(m.heads >= 1, "model.heads ({}) must be >= 1", m.heads);
  PB_REQUIRE(m.hidden % m.heads == 0, "model.hidden ({}) must be divisible by model.heads ({})",
             m.hidden, m.heads);
  PB_REQUIRE(m.intermediate >= 1, "model.intermediate ({}) must be >= 1", m.intermediate);
  PB_REQUIRE(m.max_position_embeddings >= 1, "model.max_position_embeddings ({}) must be >= 1",
             m.max_position_embeddings);
  PB_REQUIRE(m.hidden_dropout >= 0 && m.hidden_dropout < 1,
             "model.hidden_dropout ({}) must be in [0, 1)", m.hidden_dropout);
  PB_REQUIRE(m.attention_dropout >= 0 && m.attention_dropout < 1,
             "model.attention_dropout ({}) must be in [0, 1)", m.attention_dropout);
  PB_REQUIRE(m.mlm_chunk_rows >= 0, "model.mlm_chunk_rows ({}) must be >= 0 (0 = all at once)",
             m.mlm_chunk_rows);
  PB_REQUIRE(m.mst_chunks >= 0, "model.mst_chunks ({}) must be >= 1, or 0 for auto",
             m.mst_chunks);
  PB_REQUIRE(m.activation_budget_mb >= 0, "model.activation_budget_mb ({}) must be >= 0",
             m.activation_budget_mb);
  PB_REQUIRE(m.mst_chunks != 0 || m.activation_budget_mb > 0,
             "model.mst_chunks = 0 (auto) needs model.activation_budget_mb > 0");
  try {
    validate(model_config(c));
  } catch (const Error& e) {
    PB_THROW("[model]: {}", e.what());
  }

  const auto& t = c.train;
  PB_REQUIRE(t.max_steps >= 1, "train.max_steps ({}) must be >= 1", t.max_steps);
  PB_REQUIRE(t.max_steps < int64_t{kDropoutMaxStep},
             "train.max_steps ({}) must be < {} (the dropout key's step range)", t.max_steps,
             kDropoutMaxStep);
  PB_REQUIRE(t.global_batch_size >= 1, "train.global_batch_size ({}) must be >= 1",
             t.global_batch_size);
  PB_REQUIRE(t.gradient_accumulation_steps >= 1,
             "train.gradient_accumulation_steps ({}) must be >= 1", t.gradient_accumulation_steps);
  PB_REQUIRE(t.global_batch_size >= t.gradient_accumulation_steps,
             "train.global_batch_size ({}) must be >= train.gradient_accumulation_steps ({})",
             t.global_batch_size, t.gradient_accumulation_steps);
  if (purpose == ConfigPurpose::train)
    PB_REQUIRE(t.global_batch_size >= int64_t{world_size} * t.gradient_accumulation_steps,
               "train.global_batch_size ({}) must be >= world size ({}) x "
               "train.gradient_accumulation_steps ({}) = {}: every micro-step of every rank "
               "needs a sample",
               t.global_batch_size, world_size, t.gradient_accumulation_steps,
               int64_t{world_size} * t.gradient_accumulation_steps);
  PB_REQUIRE(t.max_seq_len >= 2, "train.max_seq_len ({}) must be >= 2", t.max_seq_len);
  PB_REQUIRE(t.max_seq_len <= m.max_position_embeddings,
             "train.max_seq_len ({}) must be <= model.max_position_embeddings ({})", t.max_seq_len,
             m.max_position_embeddings);
  PB_REQUIRE(t.max_seqs_per_pack >= 0, "train.max_seqs_per_pack ({}) must be >= 0 (0 = no limit)",
             t.max_seqs_per_pack);
  PB_REQUIRE(t.max_predictions_per_seq >= 1 && t.max_predictions_per_seq <= t.max_seq_len,
             "train.max_predictions_per_seq ({}) must be in [1, train.max_seq_len ({})]",
             t.max_predictions_per_seq, t.max_seq_len);
  {
    const double li = t.loss_scale_init;
    PB_REQUIRE(li >= 1.0 && li <= 16777216.0 && std::exp2(std::round(std::log2(li))) == li,
               "train.loss_scale_init ({}) must be a power of two in [1, 16777216]", li);
    PB_REQUIRE(t.loss_scale_growth_interval >= 1,
               "train.loss_scale_growth_interval ({}) must be >= 1", t.loss_scale_growth_interval);
  }
  PB_REQUIRE(t.max_nonfinite_steps >= 0, "train.max_nonfinite_steps ({}) must be >= 0",
             t.max_nonfinite_steps);
  PB_REQUIRE(std::isfinite(t.collective_timeout_s) && t.collective_timeout_s >= 0,
             "train.collective_timeout_s ({}) must be finite and >= 0 (0 = off)",
             t.collective_timeout_s);

  const auto& o = c.optim;
  auto finite_nonneg = [](double x) { return std::isfinite(x) && x >= 0; };
  PB_REQUIRE(finite_nonneg(o.lr), "optim.lr ({}) must be finite and >= 0", o.lr);
  PB_REQUIRE(finite_nonneg(o.end_lr), "optim.end_lr ({}) must be finite and >= 0", o.end_lr);
  PB_REQUIRE(o.warmup_steps >= 0, "optim.warmup_steps ({}) must be >= 0", o.warmup_steps);
  PB_REQUIRE(o.warmup_proportion >= 0 && o.warmup_proportion <= 1,
             "optim.warmup_proportion ({}) must be in [0, 1]", o.warmup_proportion);
  PB_REQUIRE(o.warmup_steps == 0 || o.warmup_proportion == 0,
             "optim.warmup_steps ({}) and optim.warmup_proportion ({}) are both set; give one",
             o.warmup_steps, o.warmup_proportion);
  PB_REQUIRE(o.start_warmup_step == 0 || o.warmup_steps > 0,
             "optim.start_warmup_step ({}) needs optim.warmup_steps > 0", o.start_warmup_step);
  PB_REQUIRE(finite_nonneg(o.poly_power), "optim.poly_power ({}) must be finite and >= 0",
             o.poly_power);
  PB_REQUIRE(o.beta1 >= 0 && o.beta1 < 1, "optim.beta1 ({}) must be in [0, 1)", o.beta1);
  PB_REQUIRE(o.beta2 >= 0 && o.beta2 < 1, "optim.beta2 ({}) must be in [0, 1)", o.beta2);
  PB_REQUIRE(std::isfinite(o.epsilon) && o.epsilon > 0, "optim.epsilon ({}) must be > 0",
             o.epsilon);
  PB_REQUIRE(finite_nonneg(o.weight_decay), "optim.weight_decay ({}) must be finite and >= 0",
             o.weight_decay);
  PB_REQUIRE(finite_nonneg(o.max_grad_norm), "optim.max_grad_norm ({}) must be finite and >= 0",
             o.max_grad_norm);
  try {
    LrSchedule schedule(lr_schedule_config(c));
  } catch (const Error& e) {
    PB_THROW("[optim] learning-rate schedule: {}", e.what());
  }

  const auto& d = c.data;
  PB_REQUIRE(d.prefetch_steps >= 1, "data.prefetch_steps ({}) must be >= 1", d.prefetch_steps);
  PB_REQUIRE(d.shuffle_block_rows >= 1, "data.shuffle_block_rows ({}) must be >= 1",
             d.shuffle_block_rows);
  PB_REQUIRE(d.shuffle_window_blocks >= 1, "data.shuffle_window_blocks ({}) must be >= 1",
             d.shuffle_window_blocks);
  PB_REQUIRE(d.read_ahead_windows >= 0, "data.read_ahead_windows ({}) must be >= 0",
             d.read_ahead_windows);

  const auto& k = c.checkpoint;
  PB_REQUIRE(k.every_steps >= 0, "checkpoint.every_steps ({}) must be >= 0", k.every_steps);
  PB_REQUIRE(k.keep >= 1, "checkpoint.keep ({}) must be >= 1", k.keep);
  PB_REQUIRE(k.resume != "auto" || !k.dir.empty(),
             "checkpoint.resume = \"auto\" needs checkpoint.dir");
  PB_REQUIRE(k.every_steps == 0 || !k.dir.empty(),
             "checkpoint.every_steps ({}) needs checkpoint.dir", k.every_steps);

  const auto& e = c.eval;
  PB_REQUIRE(e.every_samples >= 0, "eval.every_samples ({}) must be >= 0", e.every_samples);
  PB_REQUIRE(e.max_samples >= 0, "eval.max_samples ({}) must be >= 0 (0 = all)", e.max_samples);
  PB_REQUIRE(e.batch_size >= 1, "eval.batch_size ({}) must be >= 1", e.batch_size);
  PB_REQUIRE(e.target_accuracy >= 0 && e.target_accuracy <= 1,
             "eval.target_accuracy ({}) must be in [0, 1] (0 = no target)", e.target_accuracy);

  const auto& l = c.log;
  PB_REQUIRE(l.every_steps >= 1, "log.every_steps ({}) must be >= 1", l.every_steps);
  PB_REQUIRE(std::find(division_names().begin(), division_names().end(), l.submission_division) !=
                 division_names().end(),
             "log.submission_division: unknown value '{}' (expected one of {})",
             l.submission_division, fmt::join(division_names(), " | "));
  PB_REQUIRE(std::find(status_names().begin(), status_names().end(), l.submission_status) !=
                 status_names().end(),
             "log.submission_status: unknown value '{}' (expected one of {})",
             l.submission_status, fmt::join(status_names(), " | "));
  PB_REQUIRE(std::find(bert_preset_names().begin(), bert_preset_names().end(), m.preset) !=
                 bert_preset_names().end(),
             "model.preset: unknown value '{}' (expected one of {})", m.preset,
             fmt::join(bert_preset_names(), " | "));

  if (!check_paths) return;
  auto need = [](const std::string& key, const std::string& p, const char* why) {
    PB_REQUIRE(!p.empty(), "{} is not set ({})", key, why);
    PB_REQUIRE(path_exists(p), "{} = \"{}\" does not exist ({})", key, p, why);
  };
  if (purpose == ConfigPurpose::train) {
    need("data.train_dir", d.train_dir, "training shards");
    need("data.vocab", d.vocab, "vocabulary");
    if (c.eval_enabled())
      need("data.eval_dir", d.eval_dir,
           "evaluation is on; switch it off with eval.at_end=false, eval.every_samples=0 and "
           "eval.target_accuracy=0");
    if (!k.init_checkpoint.empty())
      need("checkpoint.init_checkpoint", k.init_checkpoint, "initial weights");
    if (!k.resume.empty() && k.resume != "auto")
      need("checkpoint.resume", k.resume, "checkpoint to resume from");
  } else {
    need("data.eval_dir", d.eval_dir, "evaluation shards");
    if (!k.init_checkpoint.empty())
      need("checkpoint.init_checkpoint", k.init_checkpoint, "weights to evaluate");
    if (!k.resume.empty() && k.resume != "auto")
      need("checkpoint.resume", k.resume, "checkpoint to evaluate");
  }
}

std::string train_config_to_toml(const TrainConfig& c) {
  std::string out;
  std::string section;
  for (const KeyDef& k : keys()) {
    const std::string& name = k.info.name;
    size_t dot = name.find('.');
    std::string s = name.substr(0, dot);
    if (s != section) {
      if (!section.empty()) out += "\n";
      out += fmt::format("[{}]\n", s);
      section = s;
    }
    out += fmt::format("{} = {}\n", name.substr(dot + 1), k.get(c));
  }
  return out;
}

BertConfig model_config(const TrainConfig& c) {
  BertConfig b = bert_preset(c.model.preset);
  b.layers = c.model.layers;
  b.hidden = c.model.hidden;
  b.heads = c.model.heads;
  b.intermediate = c.model.intermediate;
  b.max_position_embeddings = c.model.max_position_embeddings;
  b.hidden_dropout = static_cast<float>(c.model.hidden_dropout);
  b.attention_dropout = static_cast<float>(c.model.attention_dropout);
  b.hidden_act = c.model.hidden_act == "gelu_tanh" ? Gelu::tanh : Gelu::erf;
  return b;
}

LrScheduleConfig lr_schedule_config(const TrainConfig& c) {
  LrScheduleConfig s;
  s.base_lr = c.optim.lr;
  s.max_steps = c.train.max_steps;
  s.num_warmup_steps = c.optim.warmup_steps;
  s.warmup_proportion = c.optim.warmup_proportion;
  s.start_warmup_step = c.optim.start_warmup_step;
  s.poly_power = c.optim.poly_power;
  s.end_lr = c.optim.end_lr;
  return s;
}

LambOptions lamb_options(const TrainConfig& c) {
  LambOptions o;
  o.beta1 = static_cast<float>(c.optim.beta1);
  o.beta2 = static_cast<float>(c.optim.beta2);
  o.eps = static_cast<float>(c.optim.epsilon);
  o.weight_decay = static_cast<float>(c.optim.weight_decay);
  o.max_grad_norm = static_cast<float>(c.optim.max_grad_norm);
  // train.max_nonfinite_steps > 0: skip a non-finite step (the trainer counts them in a row and
  // aborts at the limit); 0: the first one is an Error.
  o.check_finite = true;
  o.skip_nonfinite = c.train.max_nonfinite_steps > 0;
  return o;
}

LoaderOptions loader_options(const TrainConfig& c) {
  LoaderOptions o;
  o.global_batch_size = c.train.global_batch_size;
  o.micro_steps = c.train.gradient_accumulation_steps;
  o.max_seq_len = c.train.max_seq_len;
  o.max_seqs_per_pack = c.train.max_seqs_per_pack;
  o.seed = c.train.seed;
  o.prefetch_steps = c.data.prefetch_steps;
  o.shuffle_block_rows = c.data.shuffle_block_rows;
  o.shuffle_window_blocks = c.data.shuffle_window_blocks;
  o.read_ahead_windows = c.data.read_ahead_windows;
  o.last_step = c.train.last_step;
  o.rules.max_seq_len = c.train.max_seq_len;
  o.rules.vocab_size = model_config(c).real_vocab_size;
  return o;
}

const std::vector<ConfigKeyInfo>& train_config_keys() {
  static const std::vector<ConfigKeyInfo> infos = [] {
    std::vector<ConfigKeyInfo> v;
    for (const KeyDef& k : keys()) v.push_back(k.info);
    return v;
  }();
  return infos;
}

std::string config_keys_markdown() {
  auto cell = [](const std::string& s) {
    std::string out;
    for (char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return out;
  };
  std::string out =
      "| key | type | default | meaning |\n"
      "|---|---|---|---|\n";
  for (const ConfigKeyInfo& k : train_config_keys())
    out += fmt::format("| `{}` | {} | {} | {} |\n", k.name, cell(k.type),
                       k.default_value == "(preset)" ? std::string("preset's")
                                                     : "`" + cell(k.default_value) + "`",
                       cell(k.doc));
  return out;
}

}  // namespace packbert
