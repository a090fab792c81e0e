// Where each key of a config was set, so that a rule checked after reading (a range, a rule
// between keys, a path) names the line too. No toml++ here: the config types' headers use it.
#pragma once

#include <functional>
#include <map>
#include <string>

namespace packbert::config {

// "section.key" -> where it was last set: "FILE:LINE:COLUMN", "override '...'", "option --x".
using KeyLocations = std::map<std::string, std::string>;

// Runs `check`; an Error whose message begins with a key of `where` ("model.layers (0) must be
// >= 1") is thrown again with that key's location in front ("FILE:3:1: model.layers (0) ...").
void check_located(const KeyLocations& where, const std::function<void()>& check);

}  // namespace packbert::config
