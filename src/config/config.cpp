#include "config/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace packbert::config {

namespace {

// "an integer (1.5)": the kind of a value and its text, for messages.
std::string describe(const toml::node& n) {
  std::ostringstream text;
  n.visit([&](const auto& v) { text << v; });
  std::string kind;
  switch (n.type()) {
    case toml::node_type::string: kind = "a string"; break;
    case toml::node_type::integer: kind = "an integer"; break;
    case toml::node_type::floating_point: kind = "a float"; break;
    case toml::node_type::boolean: kind = "a boolean"; break;
    case toml::node_type::array: kind = "a list"; break;
    case toml::node_type::table: kind = "a table"; break;
    default: kind = "a date or time"; break;
  }
  std::string t = text.str();
  if (t.size() > 60) t = t.substr(0, 57) + "...";
  return kind + " (" + t + ")";
}

std::string section_of(const std::string& key) { return key.substr(0, key.find('.')); }

std::vector<std::string> sections_of(const std::vector<KeySpec>& keys) {
  std::vector<std::string> out;
  for (const KeySpec& k : keys) {
    const std::string s = section_of(k.name);
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

const KeySpec* find_spec(const std::vector<KeySpec>& keys, const std::string& name) {
  for (const KeySpec& k : keys)
    if (k.name == name) return &k;
  return nullptr;
}

std::string snake(std::string s) {
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

std::string bracketed(const std::vector<std::string>& sections) {
  std::vector<std::string> out;
  for (const std::string& s : sections) out.push_back("[" + s + "]");
  return fmt::format("{}", fmt::join(out, ", "));
}

// An Error for a section name that is not one of `command`'s.
[[noreturn]] void fail_section(const std::string& where, const std::string& section,
                               const std::vector<std::string>& sections,
                               const std::string& command) {
  const std::string s = snake(section);
  PB_REQUIRE(s == section || std::find(sections.begin(), sections.end(), s) == sections.end(),
             "{}: section [{}] is kebab-case; config sections and keys are snake_case: [{}]", where,
             section, s);
  PB_THROW("{}: unknown section [{}] for {} (known: {})", where, section, command,
           bracketed(sections));
}

// An Error for a key of a known section that is not known.
[[noreturn]] void fail_key(const std::string& where, const std::string& section,
                           const std::string& key, const std::vector<KeySpec>& keys) {
  PB_REQUIRE(snake(key) == key || !find_spec(keys, section + "." + snake(key)),
             "{}: key '{}' is kebab-case; config keys are snake_case: {}.{}", where, key, section,
             snake(key));
  std::vector<std::string> known;
  for (const KeySpec& k : keys)
    if (section_of(k.name) == section) known.push_back(k.name.substr(section.size() + 1));
  PB_THROW("{}: unknown key '{}' in section [{}] (known: {})", where, key, section,
           fmt::join(known, ", "));
}

// " (at key train.max_steps)" for a syntax error on a line that assigns a key; "" otherwise.
std::string key_on_line(const std::string& path, int64_t line) {
  std::ifstream in(path);
  std::string text, section;
  for (int64_t i = 1; std::getline(in, text) && i <= line; ++i) {
    const size_t b = text.find_first_not_of(" \t");
    if (b == std::string::npos || text[b] == '#') continue;
    if (text[b] == '[') {
      const size_t e = text.find(']', b);
      if (e != std::string::npos) section = text.substr(b + 1, e - b - 1);
      continue;
    }
    if (i != line) continue;
    const size_t eq = text.find('=', b);
    if (eq == std::string::npos) return "";
    std::string key = text.substr(b, eq - b);
    key.erase(key.find_last_not_of(" \t") + 1);
    return " (at key " + (section.empty() ? key : section + "." + key) + ")";
  }
  return "";
}

}  // namespace

std::string read_int(const toml::node& n, int64_t min, int64_t max, int64_t& out) {
  const auto* v = n.as_integer();
  if (!v) return "expected an integer, got " + describe(n);
  if (v->get() < min || v->get() > max)
    return fmt::format("{} is out of range [{}, {}]", v->get(), min, max);
  out = v->get();
  return "";
}

std::string read_float(const toml::node& n, double& out) {
  if (const auto* i = n.as_integer()) {
    out = static_cast<double>(i->get());
    return "";
  }
  const auto* v = n.as_floating_point();
  if (!v) return "expected a float, got " + describe(n);
  out = v->get();
  return "";
}

std::string read_bool(const toml::node& n, bool& out) {
  const auto* v = n.as_boolean();
  if (!v) return "expected a boolean (true or false), got " + describe(n);
  out = v->get();
  return "";
}

std::string read_string(const toml::node& n, std::string& out) {
  const auto* v = n.as_string();
  if (!v) return "expected a string, got " + describe(n);
  out = v->get();
  return "";
}

std::string read_string_list(const toml::node& n, std::vector<std::string>& out) {
  const auto* a = n.as_array();
  if (!a) return "expected a list of strings ([\"a\", \"b\"]), got " + describe(n);
  std::vector<std::string> v;
  for (const toml::node& e : *a) {
    if (!e.is_string()) return "expected a list of strings, got an element that is " + describe(e);
    v.push_back(e.as_string()->get());
  }
  out = std::move(v);
  return "";
}

std::string read_choice(const toml::node& n, const std::vector<std::string>& names,
                        std::string& out) {
  const auto* v = n.as_string();
  if (!v) return fmt::format("expected one of {}, got {}", fmt::join(names, " | "), describe(n));
  if (std::find(names.begin(), names.end(), v->get()) == names.end())
    return fmt::format("unknown value '{}' (expected one of {})", v->get(),
                       fmt::join(names, " | "));
  out = v->get();
  return "";
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
  std::string s = fmt::format("{}", f);  // the shortest text that round-trips
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string toml_string_list(const std::vector<std::string>& v) {
  std::vector<std::string> items;
  for (const std::string& s : v) items.push_back(toml_string(s));
  return fmt::format("[{}]", fmt::join(items, ", "));
}

std::vector<Setting> read_file(const std::string& path, const std::vector<KeySpec>& keys,
                               const std::string& command) {
  std::error_code ec;
  PB_REQUIRE(std::filesystem::is_regular_file(path, ec), "{}: cannot open the config file", path);
  std::shared_ptr<toml::table> doc;
  try {
    doc = std::make_shared<toml::table>(toml::parse_file(path));
  } catch (const toml::parse_error& e) {
    const auto& at = e.source().begin;
    PB_THROW("{}:{}:{}: {}{}", path, at.line, at.column, e.description(),
             key_on_line(path, at.line));
  }
  auto where = [&](const toml::source_region& r) {
    return fmt::format("{}:{}:{}", path, r.begin.line, r.begin.column);
  };
  const std::vector<std::string> sections = sections_of(keys);
  // toml++ keeps a table's keys sorted; check and apply them in file order, so the first
  // mistake in the file is the one reported.
  struct Entry {
    toml::source_position at;
    std::string section, key;
    const toml::node* value;
  };
  std::vector<Entry> entries;
  for (auto&& [name, node] : *doc) {
    const std::string s(name.str());
    const std::string at = where(name.source());
    if (!node.is_table()) {
      PB_REQUIRE(s != "log-level" && s != "log_level",
                 "{}: '{}': the log level is not a config key; give --log-level LEVEL before "
                 "the subcommand",
                 at, s);
      PB_THROW("{}: key '{}' is outside any section; {} reads the sections {}", at, s, command,
               bracketed(sections));
    }
    if (std::find(sections.begin(), sections.end(), s) == sections.end())
      fail_section(at, s, sections, command);
    for (auto&& [k, v] : *node.as_table())
      entries.push_back({k.source().begin, s, std::string(k.str()), &v});
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.at.line, a.at.column) < std::tie(b.at.line, b.at.column);
  });
  std::vector<Setting> out;
  for (const Entry& e : entries) {
    const std::string at = fmt::format("{}:{}:{}", path, e.at.line, e.at.column);
    if (!find_spec(keys, e.section + "." + e.key)) fail_key(at, e.section, e.key, keys);
    out.push_back({e.section + "." + e.key, at, doc, e.value});
  }
  return out;
}

Setting read_override(const std::string& text, const std::vector<KeySpec>& keys,
                      const std::string& command, const std::string& where) {
  const std::string at = where.empty() ? fmt::format("override '{}'", text) : where;
  std::string s = text.compare(0, 2, "--") == 0 ? text.substr(2) : text;
  const size_t eq = s.find('=');
  PB_REQUIRE(eq != std::string::npos, "{}: expected section.key=VALUE", at);
  auto trim = [](std::string t) {
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t") + 1);
    return t;
  };
  const std::string name = trim(s.substr(0, eq));
  const std::string raw = trim(s.substr(eq + 1));
  const size_t dot = name.find('.');
  PB_REQUIRE(dot != std::string::npos, "{}: expected section.key=VALUE (e.g. --{}=VALUE)", at,
             keys.front().name);
  const std::string section = name.substr(0, dot);
  const std::vector<std::string> sections = sections_of(keys);
  if (std::find(sections.begin(), sections.end(), section) == sections.end())
    fail_section(at, section, sections, command);
  const KeySpec* spec = find_spec(keys, name);
  if (!spec) fail_key(at, section, name.substr(dot + 1), keys);

  auto doc = std::make_shared<toml::table>();
  const bool quoted = !raw.empty() && (raw[0] == '"' || raw[0] == '\'' || raw[0] == '[');
  if (spec->bare_string && !quoted) {
    if (spec->list) {
      toml::array a;
      a.push_back(raw);
      doc->insert("v", std::move(a));
    } else {
      doc->insert("v", raw);
    }
  } else {
    try {
      *doc = toml::parse("v = " + raw, std::string_view{});
    } catch (const toml::parse_error& e) {
      PB_THROW("{}: {}: malformed value '{}' ({})", at, name, raw, e.description());
    }
    PB_REQUIRE(doc->size() == 1, "{}: {}: malformed value '{}'", at, name, raw);
  }
  return {name, at, doc, doc->get("v")};
}

KeyLocations locations(const std::vector<Setting>& settings) {
  KeyLocations out;
  for (const Setting& s : settings) out[s.key] = s.where;
  return out;
}

void check_located(const KeyLocations& where, const std::function<void()>& check) {
  try {
    check();
  } catch (const Error& e) {
    const std::string message = e.what();
    const size_t end = message.find_first_of(" :(=");
    const auto it = where.find(message.substr(0, end));
    if (it == where.end()) throw;
    PB_THROW("{}: {}", it->second, message);
  }
}

std::string keys_markdown(const std::vector<KeyDoc>& keys) {
  auto cell = [](const std::string& s) {
    std::string out;
    for (char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return out;
  };
  std::string out =
      "| key | type | default | meaning |\n"
      "|---|---|---|---|\n";
  for (const KeyDoc& k : keys)
    out += fmt::format("| `{}` | {} | {} | {} |\n", k.name, cell(k.type), cell(k.default_value),
                       cell(k.doc));
  return out;
}

std::string keys_text(const std::vector<KeyDoc>& keys, size_t width) {
  constexpr size_t kIndent = 6;
  // The docs table's defaults are markdown (`1000`); words ("preset's") stay as they are.
  auto plain = [](const std::string& v) {
    return v.size() >= 2 && v.front() == '`' && v.back() == '`' ? v.substr(1, v.size() - 2) : v;
  };
  std::string out, section;
  for (const KeyDoc& k : keys) {
    const std::string s = k.name.substr(0, k.name.find('.'));
    if (s != section) {
      out += (section.empty() ? "[" : "\n[") + s + "]\n";
      section = s;
    }
    out += fmt::format("  {}  {}, default: {}\n", k.name, k.type, plain(k.default_value));
    // The doc, word-wrapped under the key (a word longer than a line gets a line of its own).
    std::string line;
    size_t at = 0;
    while (at < k.doc.size()) {
      const size_t end = std::min(k.doc.find(' ', at), k.doc.size());
      const std::string word = k.doc.substr(at, end - at);
      at = end + 1;
      if (word.empty()) continue;
      if (!line.empty() && kIndent + line.size() + 1 + word.size() > width) {
        out += std::string(kIndent, ' ') + line + "\n";
        line.clear();
      }
      line += (line.empty() ? "" : " ") + word;
    }
    if (!line.empty()) out += std::string(kIndent, ' ') + line + "\n";
  }
  return out;
}

}  // namespace packbert::config
