// The config system of every subcommand: `packbert SUBCOMMAND --config FILE.toml
// [--section.key=VALUE ...]`. A config type (TrainConfig, PrepareConfig, ...) is a struct of
// sections; its Schema lists every key once (name, type, doc, member) and everything else is
// derived from that list: reading a file and overrides, equality, the TOML writer
// (--print-config) and the generated key table of docs/configuration.md.
//
// Files are read with toml++ (Debian's libtomlplusplus-dev 3.3): a maintained, complete TOML
// parser that keeps each value's type (an integer is not a float, "yes" is not a boolean) and
// its source region, so an error names FILE:LINE:COLUMN and the key. It replaced CLI11's TOML
// reader (strings only, no positions) and a reader of our own.
//
// Rules, the same for every subcommand:
// - keys are snake_case and live in a section ([train], [prepare], ...); a key outside any
//   section, an unknown section or key, a kebab-case key, a value of the wrong type or out of
//   the field's range is an Error naming FILE:LINE:COLUMN (or the override) and the key;
// - overrides ("section.key=VALUE") are applied after the file in their order: the command
//   line wins. VALUE is TOML; a string (or enum) may be given bare: data.vocab=data/vocab.txt.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <toml++/toml.h>

#include "config/key_doc.h"
#include "config/locations.h"
#include "kernels/base/error.h"

namespace packbert::config {

// ---- enums: one table per enum, value <-> the name the config spells ---------------------------

template <class E>
struct EnumName {
  E value;
  const char* name;
};
template <class E>
using EnumTable = std::vector<EnumName<E>>;

template <class E>
const char* enum_name(const EnumTable<E>& table, E value) {
  for (const EnumName<E>& e : table)
    if (e.value == value) return e.name;
  return "?";
}
template <class E>
std::optional<E> parse_enum(const EnumTable<E>& table, std::string_view name) {
  for (const EnumName<E>& e : table)
    if (name == e.name) return e.value;
  return std::nullopt;
}
template <class E>
std::vector<std::string> enum_names(const EnumTable<E>& table) {
  std::vector<std::string> out;
  for (const EnumName<E>& e : table) out.emplace_back(e.name);
  return out;
}

// ---- typed reads of one TOML value: "" or what is wrong (the caller adds where and key) --------

std::string read_int(const toml::node& n, int64_t min, int64_t max, int64_t& out);
std::string read_float(const toml::node& n, double& out);  // an integer is fine too
std::string read_bool(const toml::node& n, bool& out);
std::string read_string(const toml::node& n, std::string& out);
std::string read_string_list(const toml::node& n, std::vector<std::string>& out);
// A string that must be one of `names`.
std::string read_choice(const toml::node& n, const std::vector<std::string>& names,
                        std::string& out);

// ---- TOML literals (the writer) ----------------------------------------------------------------

std::string toml_string(const std::string& s);
std::string toml_float(double f);  // shortest text that reads back to the same double
std::string toml_string_list(const std::vector<std::string>& v);

// ---- the reader --------------------------------------------------------------------------------

// What the reader needs to know of a key.
struct KeySpec {
  std::string name;          // "section.key"
  bool bare_string = false;  // a string or enum: an override may give it unquoted
  bool list = false;         // a list of strings: a bare override value is a list of one
};

// One value given to a key, from a file or the command line.
struct Setting {
  std::string key;    // "section.key"
  std::string where;  // "FILE:LINE:COLUMN" or "override '--train.max_steps=3'"
  std::shared_ptr<const toml::table> document;  // owns `value`
  const toml::node* value = nullptr;
};

// Where each key of `settings` was set last.
KeyLocations locations(const std::vector<Setting>& settings);

// Reads a TOML file for `command` ("packbert train"): every top-level entry must be a section
// of `keys`, every key one of them. Errors (syntax included) name FILE:LINE:COLUMN.
std::vector<Setting> read_file(const std::string& path, const std::vector<KeySpec>& keys,
                               const std::string& command);
// Reads one override "section.key=VALUE" (a leading "--" allowed). `where` names it in errors
// ("" = "override 'TEXT'").
Setting read_override(const std::string& text, const std::vector<KeySpec>& keys,
                      const std::string& command, const std::string& where = "");

// ---- the key table of one config type ----------------------------------------------------------

template <class Root>
struct Key {
  std::string name;           // "section.key"
  std::string type;           // int | float | bool | string | list of strings | enum(a|b)
  std::string doc;            // one line
  std::string default_value;  // TOML literal of Root{}'s value (filled by Schema)
  std::string default_doc;    // shown instead of default_value in the docs when set
  KeySpec spec;
  std::function<std::string(Root&, const toml::node&)> set;  // "" or what is wrong
  std::function<std::string(const Root&)> print;             // TOML literal
  std::function<bool(const Root&, const Root&)> equal;
};

// A key for member `field` of section `section`: its type decides how it is read and written
// (integers, floating point, bool, std::string, std::vector<std::string>).
template <class Root, class S, class T>
Key<Root> key(std::string name, S Root::*section, T S::*field, std::string doc) {
  Key<Root> k;
  k.name = name;
  k.doc = std::move(doc);
  k.spec.name = std::move(name);
  k.equal = [=](const Root& a, const Root& b) { return a.*section.*field == b.*section.*field; };
  if constexpr (std::is_same_v<T, bool>) {
    k.type = "bool";
    k.set = [=](Root& r, const toml::node& n) { return read_bool(n, r.*section.*field); };
    k.print = [=](const Root& r) { return std::string(r.*section.*field ? "true" : "false"); };
  } else if constexpr (std::is_integral_v<T>) {
    k.type = "int";
    k.set = [=](Root& r, const toml::node& n) {
      constexpr int64_t lo = static_cast<int64_t>(std::numeric_limits<T>::min());
      constexpr int64_t hi = std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t)
                                 ? std::numeric_limits<int64_t>::max()
                                 : static_cast<int64_t>(std::numeric_limits<T>::max());
      int64_t v = 0;
      std::string err = read_int(n, lo, hi, v);
      if (err.empty()) r.*section.*field = static_cast<T>(v);
      return err;
    };
    k.print = [=](const Root& r) { return std::to_string(r.*section.*field); };
  } else if constexpr (std::is_floating_point_v<T>) {
    k.type = "float";
    k.set = [=](Root& r, const toml::node& n) {
      double v = 0;
      std::string err = read_float(n, v);
      if (err.empty()) r.*section.*field = static_cast<T>(v);
      return err;
    };
    k.print = [=](const Root& r) { return toml_float(r.*section.*field); };
  } else if constexpr (std::is_same_v<T, std::string>) {
    k.type = "string";
    k.spec.bare_string = true;
    k.set = [=](Root& r, const toml::node& n) { return read_string(n, r.*section.*field); };
    k.print = [=](const Root& r) { return toml_string(r.*section.*field); };
  } else {
    static_assert(std::is_same_v<T, std::vector<std::string>>, "no config type for this field");
    k.type = "list of strings";
    k.spec.bare_string = true;
    k.spec.list = true;
    k.set = [=](Root& r, const toml::node& n) { return read_string_list(n, r.*section.*field); };
    k.print = [=](const Root& r) { return toml_string_list(r.*section.*field); };
  }
  return k;
}

// A key whose value is one of a fixed set of names: a C++ enum with its table.
template <class Root, class S, class E>
Key<Root> key(std::string name, S Root::*section, E S::*field, const EnumTable<E>& table,
              std::string doc) {
  Key<Root> k;
  k.name = name;
  k.doc = std::move(doc);
  k.spec.name = std::move(name);
  k.spec.bare_string = true;
  std::string type = "enum(";
  for (const EnumName<E>& e : table) type += std::string(type.back() == '(' ? "" : "|") + e.name;
  k.type = type + ")";
  k.equal = [=](const Root& a, const Root& b) { return a.*section.*field == b.*section.*field; };
  k.set = [=, names = enum_names(table)](Root& r, const toml::node& n) {
    std::string s;
    std::string err = read_choice(n, names, s);
    if (err.empty()) r.*section.*field = *parse_enum(table, s);
    return err;
  };
  k.print = [=](const Root& r) { return toml_string(enum_name(table, r.*section.*field)); };
  return k;
}

// A string key restricted to `names` (a name that selects an entry of a table elsewhere).
template <class Root, class S>
Key<Root> choice_key(std::string name, S Root::*section, std::string S::*field,
                     const std::vector<std::string>& names, std::string doc) {
  Key<Root> k = key(std::move(name), section, field, std::move(doc));
  std::string type = "enum(";
  for (const std::string& n : names) type += (type.back() == '(' ? "" : "|") + n;
  k.type = type + ")";
  k.set = [=](Root& r, const toml::node& n) { return read_choice(n, names, r.*section.*field); };
  return k;
}

template <class Root>
class Schema {
 public:
  // `command` names the subcommand in errors ("packbert train").
  Schema(std::string command, std::vector<Key<Root>> keys)
      : command_(std::move(command)), keys_(std::move(keys)) {
    const Root defaults{};
    for (Key<Root>& k : keys_) {
      k.default_value = k.print(defaults);
      specs_.push_back(k.spec);
    }
  }

  const std::vector<Key<Root>>& keys() const { return keys_; }
  const std::string& command() const { return command_; }
  const Key<Root>* find(const std::string& name) const {
    for (const Key<Root>& k : keys_)
      if (k.name == name) return &k;
    return nullptr;
  }

  // The file ("" = none) and then the overrides, in order.
  std::vector<Setting> read(const std::string& path,
                            const std::vector<std::string>& overrides) const {
    std::vector<Setting> out;
    if (!path.empty()) out = read_file(path, specs_, command_);
    for (const std::string& o : overrides)
      out.push_back(config::read_override(o, specs_, command_));
    return out;
  }
  Setting read_override(const std::string& text, const std::string& where = "") const {
    return config::read_override(text, specs_, command_, where);
  }
  // Sets the settings' keys in order; an Error names where, the key and what is wrong.
  void apply(const Setting& s, Root& r) const {
    const Key<Root>* k = find(s.key);
    PB_REQUIRE(k, "{}: unknown key {}", s.where, s.key);
    const std::string err = k->set(r, *s.value);
    PB_REQUIRE(err.empty(), "{}: {}: {}", s.where, s.key, err);
  }
  void apply(const std::vector<Setting>& settings, Root& r) const {
    for (const Setting& s : settings) apply(s, r);
  }

  bool equal(const Root& a, const Root& b) const {
    for (const Key<Root>& k : keys_)
      if (!k.equal(a, b)) return false;
    return true;
  }
  // Every key, section after section, as TOML that read() gives back equal.
  std::string to_toml(const Root& r) const {
    std::string out, section;
    for (const Key<Root>& k : keys_) {
      const size_t dot = k.name.find('.');
      const std::string s = k.name.substr(0, dot);
      if (s != section) {
        out += (section.empty() ? "[" : "\n[") + s + "]\n";
        section = s;
      }
      out += k.name.substr(dot + 1) + " = " + k.print(r) + "\n";
    }
    return out;
  }
  std::vector<KeyDoc> docs() const {
    std::vector<KeyDoc> out;
    for (const Key<Root>& k : keys_)
      out.push_back({k.name, k.type,
                     k.default_doc.empty() ? "`" + k.default_value + "`" : k.default_doc, k.doc});
    return out;
  }

 private:
  std::string command_;
  std::vector<Key<Root>> keys_;
  std::vector<KeySpec> specs_;
};

}  // namespace packbert::config
