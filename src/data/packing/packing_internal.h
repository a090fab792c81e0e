// Helpers shared by the packing algorithms' source files (not part of the public interface).
#pragma once

#include <chrono>
#include <vector>

#include "data/packing/packing.h"

namespace packbert::packing_detail {

// Sorts each strategy's lengths longest first, merges equal strategies, drops zero repeats and
// orders strategies by their lengths (descending, lexicographic): one canonical form whatever
// order an algorithm produced them in.
std::vector<PackStrategy> canonical(std::vector<PackStrategy> strategies);

// Throws Error unless 1 <= L and the histogram's lengths fit in L (shared input validation).
void require_packable(const LengthHistogram& h, const PackingLimits& limits);

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace packbert::packing_detail
