// What a train config says the model is and how the learning rate moves, as the model's and
// the optimizer's own types. The config's validation checks them (train_config_validate.cpp);
// train/train_options.h hands them on with the options of everything else a run drives.
#pragma once

#include "config/train_config.h"
#include "data/loader/batch_warmup.h"
#include "model/config.h"
#include "optim/lr_schedule.h"

namespace packbert {

BertConfig model_config(const TrainConfig& c);              // vocabulary: BertConfig's default
LrScheduleConfig lr_schedule_config(const TrainConfig& c);  // base_lr = lr, max_steps, warmup..
// The batch warmup at world_size ranks (its multiple resolved: 0 = ranks x micro-steps).
BatchWarmup batch_warmup_config(const TrainConfig& c, int world_size);

}  // namespace packbert
