// What the checkpoint checksums cost at BERT-Large size (335M parameters: model.safetensors
// 1.3 GB, optimizer.safetensors 2.7 GB): write_checkpoint and read_checkpoint with and without
// checksums, and the checksum's throughput beside the memory bandwidth (memcpy of the same
// bytes) and two other checksums (XXH64, zlib's CRC-32) for comparison. Prints a table; never a
// timed assertion.
//
//   bench_checkpoint [--preset large] [--dir DIR] [--repeat 3]
//
// DIR (default: a temporary directory) receives two checkpoints (about 8 GB at BERT-Large).
// Reads come from the page cache when the machine has room for the files (they were just
// written), which is the case that shows the checksum's share most: a cold read from a disk or
// a shared file system only adds I/O time to both columns.
#include <xxhash.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "model/config.h"
#include "model/params.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/safetensors.h"

namespace {

using namespace packbert;
using Clock = std::chrono::steady_clock;

// The fastest of `repeat` runs, in seconds.
double best_of(int repeat, const std::function<void()>& f) {
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

volatile uint64_t g_sink = 0;  // keeps the hashes from being optimised away

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "large", dir_arg;
  int repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--preset")
      preset = argv[i + 1];
    else if (a == "--dir")
      dir_arg = argv[i + 1];
    else if (a == "--repeat")
      repeat = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: bench_checkpoint [--preset large] [--dir DIR] [--repeat N]\n");
      return 2;
    }
  }
  test::TempDir tmp;
  const std::string root = dir_arg.empty() ? tmp.path() : dir_arg;
  const ParamTable table(bert_preset(preset));
  const size_t n = static_cast<size_t>(table.total());
  std::vector<float> params(n), m(n), v(n);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0.f, 0.02f);
  for (size_t i = 0; i < n; ++i) {
    params[i] = nd(rng);
    m[i] = nd(rng) * 1e-2f;
    v[i] = std::abs(nd(rng)) * 1e-4f;
  }
  const double bytes = 3.0 * static_cast<double>(n) * sizeof(float);
  const double gb = bytes / 1e9;
  std::printf(
      "bench_checkpoint: preset %s, %.1fM parameters, model + optimizer %.2f GB, "
      "files under %s, best of %d\n",
      preset.c_str(), static_cast<double>(n) / 1e6, gb, root.c_str(), repeat);

  // Throughput over the same bytes the checkpoint holds, tensor by tensor as the writer does.
  auto over_tensors = [&](const std::function<void(const void*, size_t)>& f) {
    for (const float* buf : {params.data(), m.data(), v.data()})
      for (const ParamTensor& t : table.tensors())
        f(buf + t.offset, static_cast<size_t>(t.size) * sizeof(float));
  };
  std::vector<char> dst(size_t{256} << 20);
  const double t_memcpy = best_of(repeat, [&] {
    over_tensors([&](const void* p, size_t b) {
      for (size_t off = 0; off < b; off += dst.size())
        std::memcpy(dst.data(), static_cast<const char*>(p) + off, std::min(dst.size(), b - off));
    });
    g_sink = g_sink + static_cast<uint64_t>(dst[12345]);
  });
  const double t_xxh3 = best_of(repeat, [&] {
    over_tensors([&](const void* p, size_t b) { g_sink = g_sink + XXH3_64bits(p, b); });
  });
  const double t_xxh64 = best_of(repeat, [&] {
    over_tensors([&](const void* p, size_t b) { g_sink = g_sink + XXH64(p, b, 0); });
  });
  const double t_crc = best_of(1, [&] {
    over_tensors([&](const void* p, size_t b) {
      uLong c = crc32(0L, Z_NULL, 0);
      for (size_t off = 0; off < b; off += 1u << 30)
        c = crc32(c, static_cast<const Bytef*>(p) + off,
                  static_cast<uInt>(std::min<size_t>(size_t{1} << 30, b - off)));
      g_sink = g_sink + c;
    });
  });

  // Whole checkpoints: written (every file fsynced) and read back, with and without checksums.
  const std::string with_root = root + "/with", without_root = root + "/without";
  CheckpointWrite w{&table, params.data(), m.data(), v.data(), 1000, 1000, "{\"step\": 1000}"};
  std::string with_dir, without_dir;
  const double t_write_with = best_of(repeat, [&] {
    w.checksums = true;
    with_dir = write_checkpoint(with_root, w, 1);
  });
  const double t_write_without = best_of(repeat, [&] {
    w.checksums = false;
    without_dir = write_checkpoint(without_root, w, 1);
  });
  // Read back into the same buffers (the values are no longer needed).
  const double t_read_with =
      best_of(repeat, [&] { read_checkpoint(with_dir, table, params.data(), m.data(), v.data()); });
  const double t_read_without = best_of(
      repeat, [&] { read_checkpoint(without_dir, table, params.data(), m.data(), v.data()); });
  std::error_code ec;
  if (dir_arg.empty()) std::filesystem::remove_all(root, ec);

  auto share = [](double with, double without) { return 100.0 * (with - without) / with; };
  std::printf("\n| operation (%.2f GB) | with checksums | without | checksum share |\n", gb);
  std::printf("| --- | --- | --- | --- |\n");
  std::printf("| write_checkpoint (fsynced) | %.2f s | %.2f s | %.1f%% |\n", t_write_with,
              t_write_without, share(t_write_with, t_write_without));
  std::printf("| read_checkpoint (page cache) | %.2f s | %.2f s | %.1f%% |\n", t_read_with,
              t_read_without, share(t_read_with, t_read_without));
  std::printf("\n| over the same bytes, one core | time | GB/s |\n| --- | --- | --- |\n");
  std::printf("| memcpy (memory bandwidth) | %.3f s | %.1f |\n", t_memcpy, gb / t_memcpy);
  std::printf("| XXH3-64 (the checksum) | %.3f s | %.1f |\n", t_xxh3, gb / t_xxh3);
  std::printf("| XXH64 | %.3f s | %.1f |\n", t_xxh64, gb / t_xxh64);
  std::printf("| zlib crc32 (CRC-32, IEEE) | %.3f s | %.1f |\n", t_crc, gb / t_crc);
  return g_sink == 42 ? 1 : 0;
}
