// TrainConfig's key table (train_config_keys.cpp), for the files of the config that read,
// write and document it. Not in train_config.h, so that its includers do not see toml++.
#pragma once

#include "config/config.h"
#include "config/train_config.h"

namespace packbert {

const config::Schema<TrainConfig>& train_config_schema();

}  // namespace packbert
