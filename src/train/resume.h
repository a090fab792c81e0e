// --resume auto: the newest checkpoint under checkpoint.dir that reads back whole, the same on
// every rank.
#pragma once

#include <mpi.h>

#include <optional>
#include <string>

#include "model/params.h"
#include "train/checkpoint.h"

namespace packbert {

struct ResumedCheckpoint {
  std::string dir;
  CheckpointRead read;
};

// Collective over comm. Rank 0 lists the step_NNNNNNNN directories under root, newest first,
// and sends the list to all; then, for each in turn, every rank reads it in full with
// read_checkpoint() (every checksum verified) into params, m, v (table.total() floats each) and
// the ranks agree on the outcome with an all-reduce:
//   - all read it: it is the one (returned);
//   - some rank found it damaged (DamagedFileError): the first such rank's message goes to all,
//     rank 0 logs a warning naming it and moves the directory aside (set_checkpoint_aside()),
//     and all go on to the next older one;
//   - some rank failed otherwise (a config that does not fit the model, an I/O error): that
//     message is the Error of every rank (nothing is moved aside).
// Returns nullopt when root holds no checkpoint and none was ever set aside (a fresh start);
// an Error when every checkpoint was damaged, or when only set-aside ones are left (a run
// never starts fresh over damaged checkpoints: the message says how to).
std::optional<ResumedCheckpoint> read_newest_valid_checkpoint(MPI_Comm comm,
                                                              const std::string& root,
                                                              const ParamTable& table,
                                                              float* params, float* m, float* v);

}  // namespace packbert
