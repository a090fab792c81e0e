// The safetensors reader/writer (src/train/safetensors.h): round trips of every dtype and of
// scalar / empty shapes, the byte layout the reference uses, damaged files, each an Error
// naming the file (and the tensor at fault), and the checksums catching every flipped bit.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/base/error.h"
#include "test_util.h"
#include "train/safetensors.h"

namespace packbert {
namespace {

using test::error_of;
using test::TempDir;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file made by hand: header JSON text, then `data_bytes` bytes.
std::string handmade(const std::string& header, size_t data_bytes, uint64_t n_override = 0) {
  const uint64_t n = n_override ? n_override : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  out += header;
  out.append(data_bytes, '\x01');
  return out;
}

TEST(Safetensors, RoundTripEveryDtypeAndShape) {
  std::mt19937_64 rng(test::test_seed());
  const std::vector<StDType> dtypes = {StDType::f64, StDType::f32,    StDType::f16, StDType::bf16,
                                       StDType::i64, StDType::i32,    StDType::i16, StDType::i8,
                                       StDType::u8,  StDType::boolean};
  const std::vector<std::vector<int64_t>> shapes = {{},     {0},       {1},         {7},
                                                    {3, 5}, {2, 0, 4}, {2, 3, 1, 5}};
  std::vector<StTensor> tensors;
  std::vector<std::vector<unsigned char>> data;
  for (StDType dt : dtypes)
    for (const auto& shape : shapes) {
      std::vector<unsigned char> bytes(static_cast<size_t>(st_numel(shape)) * st_dtype_size(dt));
      for (auto& b : bytes) b = static_cast<unsigned char>(rng());
      if (dt == StDType::boolean)
        for (auto& b : bytes) b &= 1;
      data.push_back(std::move(bytes));
    }
  size_t k = 0;
  for (StDType dt : dtypes)
    for (const auto& shape : shapes) {
      tensors.push_back({fmt::format("t{}.{}.{}", k, st_dtype_name(dt), shape.size()), dt, shape,
                         data[k].empty() ? nullptr : data[k].data()});
      ++k;
    }
  std::shuffle(tensors.begin(), tensors.end(), rng);  // any order
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  const std::map<std::string, std::string> md = {{"format", "pt"}, {"note", "x \"y\" \xc3\xa9"}};
  write_safetensors(path, tensors, md);

  // The layout: 8-byte length, a header padded with spaces to a multiple of 8.
  const std::string raw = test::read_file(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(raw[static_cast<size_t>(i)])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw[8], '{');
  const auto header = nlohmann::json::parse(raw.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");

  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata(), md);
  EXPECT_EQ(f.names().size(), tensors.size());
  // Data in the given order.
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_EQ(f.names()[i], tensors[i].name);
  for (const StTensor& t : tensors) {
    const StTensorInfo& info = f.info(t.name);
    EXPECT_EQ(info.dtype, t.dtype);
    EXPECT_EQ(info.shape, t.shape);
    const size_t bytes = static_cast<size_t>(st_numel(t.shape)) * st_dtype_size(t.dtype);
    std::vector<unsigned char> back(bytes + 1, 0xAB);
    f.read(t.name, back.data(), t.dtype, t.shape);
    if (bytes) {
      EXPECT_EQ(std::memcmp(back.data(), t.data, bytes), 0) << t.name;
    }
    EXPECT_EQ(back[bytes], 0xAB) << t.name;  // nothing beyond the tensor
  }
  // No tensors at all, no metadata.
  write_safetensors(dir.file("empty.safetensors"), {});
  SafetensorsFile e(dir.file("empty.safetensors"));
  EXPECT_TRUE(e.names().empty());
  EXPECT_TRUE(e.metadata().empty());
}

TEST(Safetensors, WrongExpectationsNameTheTensor) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  std::vector<float> a(6, 1.5f);
  write_safetensors(path, {{"layer.weight", StDType::f32, {2, 3}, a.data()}});
  SafetensorsFile f(path);
  std::vector<float> out(6);
  std::string msg = error_of([&] { f.read("layer.weight", out.data(), StDType::f32, {3, 2}); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
  msg = error_of([&] { f.read("layer.weight", out.data(), StDType::i32, {2, 3}); });
  EXPECT_NE(msg.find("layer.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("F32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("I32"), std::string::npos) << msg;
  msg = error_of([&] { f.read("layer.bias", out.data(), StDType::f32, {2, 3}); });
  EXPECT_NE(msg.find("layer.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  // Refused on writing: duplicate names, the reserved name, a null pointer with data.
  EXPECT_THROW(write_safetensors(dir.file("d"), {{"a", StDType::f32, {1}, a.data()},
                                                 {"a", StDType::f32, {1}, a.data()}}),
               Error);
  EXPECT_THROW(write_safetensors(dir.file("d"), {{"__metadata__", StDType::f32, {1}, a.data()}}),
               Error);
  EXPECT_THROW(write_safetensors(dir.file("d"), {{"a", StDType::f32, {1}, nullptr}}), Error);
}

struct Damage {
  const char* what;
  std::string bytes;
  const char* expect;  // a piece of the message besides the path
};

TEST(Safetensors, DamagedFilesNameTheFile) {
  TempDir dir;
  // A good file to damage.
  const std::string good_path = dir.file("good.safetensors");
  std::vector<float> a(12, 2.f), b(5, 3.f);
  write_safetensors(
      good_path, {{"alpha", StDType::f32, {3, 4}, a.data()}, {"beta", StDType::f32, {5}, b.data()}},
      {{"format", "pt"}});
  const std::string good = test::read_file(good_path);
  SafetensorsFile ok(good_path);

  const std::string two = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  std::vector<Damage> cases = {
      {"truncated data", good.substr(0, good.size() - 4), "beta"},
      {"trailing bytes", good + "xxxx", "data section"},
      {"shorter than 8 bytes", good.substr(0, 5), "8-byte"},
      {"header length beyond the file", handmade("{}", 0, 4096), "past the end of the file"},
      {"bad JSON", handmade(R"({"a": {"dtype": "F32", )", 0), "not valid JSON"},
      {"not an object", handmade("[1, 2]", 0), "not a JSON object"},
      {"offsets out of range",
       handmade(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "'a'"},
      {"offsets reversed", handmade(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
       "'a'"},
      {"overlapping tensors",
       handmade(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                12),
       "overlaps"},
      {"gap between tensors",
       handmade(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                16),
       "'b'"},
      {"shape/size mismatch",
       handmade(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "'a'"},
      {"dtype/size mismatch",
       handmade(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})", 8), "'a'"},
      {"unknown dtype", handmade(R"({"a":{"dtype":"F8_E9","shape":[2],"data_offsets":[0,2]}})", 2),
       "F8_E9"},
      {"negative dim", handmade(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       "'a'"},
      {"missing offsets", handmade(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "'a'"},
      {"metadata not strings", handmade(R"({"__metadata__":{"n":3}})", 0), "__metadata__"},
      {"overflowing shape",
       handmade(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
       "'a'"},
      {"good header, data short", handmade(two, 12), "'b'"},
  };
  for (const Damage& d : cases) {
    const std::string path = dir.file(std::string("bad-") + std::to_string(&d - cases.data()));
    write_bytes(path, d.bytes);
    const std::string msg = error_of([&] { SafetensorsFile f(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << d.what << ": " << msg;
    EXPECT_NE(msg.find(d.expect), std::string::npos) << d.what << ": " << msg;
  }
  // The two-tensor handmade header itself is valid.
  write_bytes(dir.file("two"), handmade(two, 16));
  EXPECT_EQ(SafetensorsFile(dir.file("two")).names(), (std::vector<std::string>{"a", "b"}));
  // A missing file.
  const std::string msg = error_of([&] { SafetensorsFile f(dir.file("nope")); });
  EXPECT_NE(msg.find(dir.file("nope")), std::string::npos) << msg;
}

// Every single-bit change of a checksummed file, in the length, the header, its padding or the
// data, is a DamagedFileError naming the file (and, in the data, the tensor that holds the bit).
TEST(Safetensors, ChecksumsCatchEveryFlippedBit) {
  TempDir dir;
  std::mt19937_64 rng(test::test_seed());
  std::vector<float> a(6), b(3);
  for (float& x : a) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (float& x : b) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  const std::string path = dir.file("sum.safetensors");
  write_safetensors(
      path, {{"alpha", StDType::f32, {2, 3}, a.data()}, {"beta", StDType::f32, {3}, b.data()}},
      {{"format", "pt"}, {"steps_done", "12"}});
  SafetensorsFile good(path);
  EXPECT_TRUE(good.has_checksums());
  EXPECT_EQ(good.metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"steps_done", "12"}}));
  const std::string bytes = test::read_file(path);
  const size_t data_start = bytes.size() - (a.size() + b.size()) * sizeof(float);
  const std::string damaged = dir.file("flipped.safetensors");
  int caught = 0;
  for (size_t at = 0; at < bytes.size(); ++at)
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = bytes;
      flipped[at] = static_cast<char>(flipped[at] ^ (1 << bit));
      write_bytes(damaged, flipped);
      std::string msg;
      bool damage = false;
      try {
        SafetensorsFile f(damaged);
        std::vector<float> back(a.size());
        f.read("alpha", back.data(), StDType::f32, {2, 3});
        f.verify("beta");
      } catch (const DamagedFileError& e) {
        damage = true;
        msg = e.what();
      } catch (const std::exception& e) {
        msg = e.what();
      }
      ASSERT_TRUE(damage) << "byte " << at << " bit " << bit << ": " << msg;
      ASSERT_NE(msg.find(damaged), std::string::npos) << msg;
      if (at >= data_start) {
        const char* tensor = at < data_start + a.size() * sizeof(float) ? "'alpha'" : "'beta'";
        ASSERT_NE(msg.find(tensor), std::string::npos) << "byte " << at << ": " << msg;
        ASSERT_NE(msg.find("checksum"), std::string::npos) << msg;
      }
      ++caught;
    }
  EXPECT_EQ(caught, static_cast<int>(bytes.size() * 8));

  // Without checksums (as written before they existed): readable, unverified.
  const std::string plain = dir.file("plain.safetensors");
  write_safetensors(plain, {{"alpha", StDType::f32, {2, 3}, a.data()}}, {{"format", "pt"}},
                    /*checksums=*/false);
  std::string raw = test::read_file(plain);
  EXPECT_EQ(raw.find("checksum"), std::string::npos);
  raw[raw.size() - 1] = static_cast<char>(raw[raw.size() - 1] ^ 1);
  write_bytes(plain, raw);
  SafetensorsFile p(plain);
  EXPECT_FALSE(p.has_checksums());
  std::vector<float> back(a.size());
  p.read("alpha", back.data(), StDType::f32, {2, 3});  // the flip goes unseen, as before
  p.verify("alpha");
  // The checksum keys are the writer's own.
  EXPECT_THROW(write_safetensors(dir.file("x"), {}, {{"checksum.alpha", "0"}}), Error);
  EXPECT_THROW(write_safetensors(dir.file("x"), {{"__header__", StDType::f32, {1}, a.data()}}),
               Error);
  // Python's xxhash.xxh3_64(b"").hexdigest(), the canonical form.
  EXPECT_EQ(st_checksum_hex(nullptr, 0), "2d06800538d394c2");
}

TEST(Safetensors, WriteFailuresNameThePath) {
  TempDir dir;
  std::vector<float> a(4, 1.f);
  const std::string path = dir.file("no/such/dir/x.safetensors");
  const std::string msg = error_of([&] {
    write_safetensors(path, {{"a", StDType::f32, {4}, a.data()}});
  });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(ENOENT)), std::string::npos) << msg;
}

}  // namespace
}  // namespace packbert
