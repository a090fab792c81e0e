// How an op is declared: once, in its family's list (kernels/ops/<family>.h), from which the
// Backend's pure virtuals (kernels/backend.h), every backend's override list (kernels/cpu,
// kernels/cuda) and any wrapper that forwards the ops (tests/bench/op_timer.h) are expanded.
//
// A family's list is a macro PACKBERT_<FAMILY>_OPS(OP) with one entry per op, its contract in a
// block comment above it (inside the macro: every line but the last ends in a backslash, and a
// contract never holds the characters that end a block comment):
//   OP(name, (parameters), (arguments))
// parameters: the op's parameter list as the Backend declares it, default arguments included
// (every expansion carries them, so a call through a backend's own type takes the same
// defaults); arguments: the parameters' names in order, for a wrapper that passes the call on.
// Every op returns void. kernels/backend.h's PACKBERT_BACKEND_OPS strings the families together.
//
// The expansions (an entry's arguments are unused but by a forwarder):
//   class Backend     { PACKBERT_BACKEND_OPS(PACKBERT_OP_PURE_VIRTUAL) };
//   class CpuBackend  { PACKBERT_BACKEND_OPS(PACKBERT_OP_OVERRIDE) };  (and CudaBackend)
// Why a macro list, and what a new op touches: docs/testing.md, Adding an op.
#pragma once

#define PACKBERT_OP_PURE_VIRTUAL(name, params, args) virtual void name params = 0;
#define PACKBERT_OP_OVERRIDE(name, params, args) void name params override;
