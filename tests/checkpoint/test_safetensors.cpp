// safetensors files (include/dtrain/checkpoint.h, src/checkpoint/): round
// trips of every dtype, the exact bytes of a small file, every kind of
// malformed file, atomic writes, and loading into modules. Single-process.
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors_format.h"
#include "dtrain/checkpoint.h"
#include "dtrain/models.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace st = dtrain::safetensors;
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// A fresh folder per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "dtrain-safetensors-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ignored);
    fs::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::string le64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

// A file from a header text and data bytes, exactly as given (no padding).
std::string make_file(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto x = a.contiguous(), y = b.contiguous();
  return x.nbytes() == y.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// Values that every dtype holds exactly: -2..3 scaled, or 0/1 for bool.
torch::Tensor sample(torch::ScalarType dtype, std::vector<int64_t> shape) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  auto values = torch::arange(count, torch::kFloat32);
  if (dtype == torch::kBool) return values.remainder(2).to(dtype).reshape(shape);
  if (dtype == torch::kUInt8 || dtype == torch::kUInt16 || dtype == torch::kUInt32 || dtype == torch::kUInt64)
    return (values * 3).to(dtype).reshape(shape);
  return ((values - 2) * 1.5).floor().to(dtype).reshape(shape);
}

const std::vector<torch::ScalarType> kAllDTypes = {
    torch::kFloat32, torch::kBFloat16, torch::kFloat16, torch::kFloat64,     torch::kInt64,
    torch::kInt32,   torch::kInt16,    torch::kInt8,    torch::kUInt8,       torch::kBool,
    torch::kUInt16,  torch::kUInt32,   torch::kUInt64,  torch::kFloat8_e4m3fn, torch::kFloat8_e5m2};

// ------------------------------------------------------------- round trips

TEST(SafetensorsRoundTrip, EveryDTypeWithScalarsAndEmptyTensors) {
  TempDir dir;
  NamedTensors tensors;
  for (auto dtype : kAllDTypes) {
    const std::string name = c10::toString(dtype);
    tensors.emplace_back(name + ".matrix", sample(dtype, {2, 3}));
    tensors.emplace_back(name + ".scalar", sample(dtype, {}).reshape({}));
    tensors.emplace_back(name + ".empty", sample(dtype, {0, 4}));
  }
  const std::string path = dir.file("all.safetensors");
  dtrain::save_safetensors(path, tensors);
  const auto file = dtrain::load_safetensors(path);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file.tensors[i].first, tensors[i].first);
    EXPECT_TRUE(same_bytes(file.tensors[i].second, tensors[i].second)) << tensors[i].first;
    EXPECT_TRUE(file.tensors[i].second.is_contiguous());
    EXPECT_EQ(file.tensors[i].second.device(), torch::kCPU);
  }
  EXPECT_EQ(file.at("Float.scalar").dim(), 0);
  EXPECT_EQ(file.at("Float.empty").numel(), 0);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(SafetensorsRoundTrip, MetadataNamesInOrderAndNonContiguousInput) {
  TempDir dir;
  const auto matrix = torch::arange(12, torch::kFloat32).reshape({3, 4});
  NamedTensors tensors = {{"zeta", matrix.t()}, {"alpha", matrix.slice(1, 1, 3)}, {"mid.dle", torch::ones({1})}};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "42"}, {"note", "ünïcode"}};
  const std::string path = dir.file("m.safetensors");
  dtrain::save_safetensors(path, tensors, metadata);
  const auto file = dtrain::load_safetensors(path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"zeta", "alpha", "mid.dle"}));
  EXPECT_EQ(file.metadata, metadata);
  EXPECT_EQ(file.path, path);
  EXPECT_TRUE(torch::equal(file.at("zeta"), matrix.t()));
  EXPECT_TRUE(torch::equal(file.at("alpha"), matrix.slice(1, 1, 3)));
  EXPECT_EQ(file.find("nope"), nullptr);
  EXPECT_THROW(file.at("nope"), std::out_of_range);
}

TEST(SafetensorsRoundTrip, LoadedTensorsOwnTheirMemory) {
  TempDir dir;
  const std::string path = dir.file("own.safetensors");
  dtrain::save_safetensors(path, {{"a", torch::ones({4})}, {"b", torch::zeros({4})}});
  const auto file = dtrain::load_safetensors(path);
  fs::remove(path);
  EXPECT_NE(file.at("a").data_ptr(), file.at("b").data_ptr());
  EXPECT_EQ(file.at("a").sum().item<float>(), 4.0f);
}

TEST(SafetensorsRoundTrip, EmptyFileHasNoTensors) {
  TempDir dir;
  const std::string path = dir.file("none.safetensors");
  dtrain::save_safetensors(path, {});
  EXPECT_EQ(read_bytes(path), le64(8) + "{}      ");
  EXPECT_TRUE(dtrain::load_safetensors(path).tensors.empty());
}

// ----------------------------------------------------------------- layout

// The published layout, byte by byte (Note [safetensors layout]).
TEST(SafetensorsLayout, ExactBytesOfASmallFile) {
  TempDir dir;
  const std::string path = dir.file("tiny.safetensors");
  dtrain::save_safetensors(path, {{"w", torch::tensor({1.0f, -2.0f})}, {"n", torch::tensor(int64_t{258})}},
                           {{"format", "pt"}});
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("n":{"dtype":"I64","shape":[],"data_offsets":[8,16]}})";
  const std::string padding((8 - json.size() % 8) % 8, ' ');
  const std::string data = std::string("\x00\x00\x80\x3f", 4) + std::string("\x00\x00\x00\xc0", 4) +  // 1.0f, -2.0f
                           std::string("\x02\x01\x00\x00\x00\x00\x00\x00", 8);                        // 258
  const std::string expected = le64(json.size() + padding.size()) + json + padding + data;
  EXPECT_EQ(read_bytes(path), expected);
  EXPECT_EQ((8 + json.size() + padding.size()) % 8, 0u);  // the data starts 8-byte aligned
}

// Another writer's choices: no padding, offsets in a different order than
// the names, whitespace, escapes in names.
TEST(SafetensorsLayout, ReadsAHandMadeFile) {
  TempDir dir;
  const std::string path = dir.file("hand.safetensors");
  const std::string header =
      R"({ "b\u00e9" : {"shape": [1], "dtype": "I32", "data_offsets": [4, 8]},)"
      R"( "a": {"dtype": "U8", "shape": [2, 2], "data_offsets": [0, 4]}, "__metadata__": {}})";
  write_bytes(path, make_file(header, std::string("\x01\x02\x03\x04\x07\x00\x00\x00", 8)));
  const auto file = dtrain::load_safetensors(path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"b\xc3\xa9", "a"}));
  EXPECT_TRUE(torch::equal(file.at("a"), torch::tensor({1, 2, 3, 4}, torch::kUInt8).reshape({2, 2})));
  EXPECT_TRUE(torch::equal(file.at("b\xc3\xa9"), torch::tensor({7}, torch::kInt32)));
  EXPECT_TRUE(file.metadata.empty());
}

// ------------------------------------------------------------- malformed

struct Malformed {
  const char* label;
  std::string bytes;
  const char* phrase;  // the error must contain it
};

std::vector<Malformed> malformed_files() {
  const std::string u8 = R"({"dtype":"U8","shape":[2],"data_offsets":[0,2]})";
  return {
      {"short", std::string("\x02\x00\x00", 3), "too short for the 8-byte header length"},
      {"length beyond file", le64(1000) + "{}", "header length 1000 is larger than the 2 bytes after it"},
      {"length zero", le64(0), "too short for a JSON object"},
      {"not json", make_file("{hello}"), "the header is not valid JSON"},
      {"not an object", make_file("[1, 2]"), "must start with '{'"},
      {"leading space", make_file(" {}"), "must start with '{'"},
      {"trailing garbage", make_file("{} x"), "not valid JSON"},
      {"bad utf-8", make_file("{\"\xff\":" + u8 + "}", "ab"), "not valid JSON"},
      {"tensor not object", make_file(R"({"a": [1]})"), "tensor 'a': its value must be an object"},
      {"unknown dtype", make_file(R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", std::string(16, 'x')),
       "unknown dtype 'F128'"},
      {"dtype not string", make_file(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", "abcd"),
       "dtype must be a string"},
      {"negative dim", make_file(R"({"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,0]}})"),
       "shape has a negative dimension -2"},
      {"float dim", make_file(R"({"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}})", "ab"),
       "shape holds '2.0', not an integer"},
      {"dim above int64", make_file(R"({"a":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})"),
       "above 2^63 - 1"},
      {"element count overflow",
       make_file(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"),
       "needs more than 2^64 bytes"},
      {"byte count overflow", make_file(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})"),
       "needs more than 2^64 bytes"},
      {"empty tensor with huge strides",
       make_file(R"({"a":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})"),
       "has row-major strides beyond 2^63 - 1"},
      {"float offset", make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2.5]}})", "ab"),
       "data_offsets holds '2.5', not an integer"},
      {"string offset", make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,"2"]}})", "ab"),
       "data_offsets must hold only integers"},
      {"negative offset", make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[-1,1]}})", "ab"),
       "negative offset"},
      {"huge offset", make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,18446744073709551616]}})", "ab"),
       "not an integer from 0 to 2^64 - 1"},
      {"three offsets", make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2,4]}})", "ab"),
       "got more than two numbers"},
      {"one offset", make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", "ab"), "got 1 number"},
      {"begin after end", make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}})", "ab"),
       "data_offsets [2, 1] begin after they end"},
      {"end beyond data", make_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", "ab"),
       "end at byte 4 but the data holds only 2 bytes"},
      {"size mismatch", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "abcd"),
       "hold 4 bytes but shape [2] of F32 needs 8"},
      {"overlap", make_file(R"({"a":)" + u8 + R"(,"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", "abc"),
       "tensors 'a' and 'b' overlap"},
      {"empty tensor inside another",
       make_file(R"({"a":)" + u8 + R"(,"e":{"dtype":"U8","shape":[0],"data_offsets":[1,1]}})", "ab"), "overlap"},
      {"hole", make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", "ab"),
       "bytes 0 to 1 of the data belong to no tensor"},
      {"trailing data", make_file(R"({"a":)" + u8 + "}", "abcde"), "the last 3 bytes of the data belong to no tensor"},
      {"data without tensors", make_file("{}", "x"), "the last 1 bytes"},
      {"duplicate name", make_file(R"({"a":)" + u8 + R"(,"a":)" + u8 + "}", "ab"), "names tensor 'a' twice"},
      {"duplicate field",
       make_file(R"({"a":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "ab"),
       "field 'dtype' appears twice"},
      {"missing field", make_file(R"({"a":{"dtype":"U8","shape":[2]}})", "ab"), "the field \"data_offsets\" is missing"},
      {"unknown field", make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1}})", "ab"),
       "unknown field 'x'"},
      {"metadata not strings", make_file(R"({"__metadata__":{"step":3}})"), "values must be strings, but 'step' is a number"},
      {"metadata not object", make_file(R"({"__metadata__":"x"})"), "\"__metadata__\" must be an object of strings"},
      {"metadata twice", make_file(R"({"__metadata__":{},"__metadata__":{}})"), "\"__metadata__\" twice"},
      {"bool byte", make_file(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", std::string("\x01\x00\x02", 3)),
       "tensor 'm' (BOOL) holds the byte 2 at element 2"},
  };
}

TEST(SafetensorsMalformed, EachProblemIsNamed) {
  TempDir dir;
  for (const auto& c : malformed_files()) {
    const std::string path = dir.file("bad.safetensors");
    write_bytes(path, c.bytes);
    std::string message;
    try {
      dtrain::load_safetensors(path);
    } catch (const std::runtime_error& error) {
      message = error.what();
    }
    EXPECT_NE(message.find(path), std::string::npos) << c.label << ": " << message;
    EXPECT_NE(message.find(c.phrase), std::string::npos) << c.label << ": '" << message << "' lacks '" << c.phrase << "'";
  }
}

// The in-memory parser the fuzzer drives agrees with the file reader
// (except for the BOOL values, which it does not read).
TEST(SafetensorsMalformed, InMemoryParserRejectsTheSame) {
  for (const auto& c : malformed_files()) {
    if (std::string(c.label) == "bool byte") continue;
    const auto* data = reinterpret_cast<const uint8_t*>(c.bytes.data());
    EXPECT_THROW(st::parse_safetensors_header(data, c.bytes.size()), st::FormatError) << c.label;
  }
}

TEST(SafetensorsMalformed, AbsurdHeaderLength) {
  const std::string prefix = le64(150'000'000);
  try {
    st::parse_header_length(reinterpret_cast<const uint8_t*>(prefix.data()), 200'000'000);
    FAIL() << "no error";
  } catch (const st::FormatError& error) {
    EXPECT_NE(std::string(error.what()).find("larger than the 100000000-byte limit"), std::string::npos) << error.what();
  }
}

TEST(SafetensorsMalformed, MissingFileAndFolder) {
  TempDir dir;
  const std::string missing = dir.file("missing.safetensors");
  try {
    dtrain::load_safetensors(missing);
    FAIL() << "no error";
  } catch (const std::runtime_error& error) {
    EXPECT_EQ(std::string(error.what()), "cannot read " + missing + ": No such file or directory");
  }
  const std::string folder = dir.file("folder.safetensors");
  fs::create_directory(folder);
  try {
    dtrain::load_safetensors(folder);
    FAIL() << "no error";
  } catch (const std::runtime_error& error) {
    EXPECT_EQ(std::string(error.what()), "cannot read " + folder + ": it is a folder");
  }
}

// Every file in the fuzzer's corpus parses or fails with FormatError (the
// crashes the fuzzer once found stay fixed; the fuzzer itself runs in `make fuzz`).
TEST(SafetensorsMalformed, FuzzCorpusParsesOrFailsCleanly) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(DTRAIN_FUZZ_CORPUS)) {
    const std::string bytes = read_bytes(entry.path().string());
    try {
      const auto header = st::parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      EXPECT_EQ(header.data_offset + header.data_size, bytes.size()) << entry.path();
    } catch (const st::FormatError&) {
    }
    ++files;
  }
  EXPECT_GE(files, 10);
}

// ------------------------------------------------------------ atomic writes

TEST(SafetensorsAtomicWrite, BadTensorsAreRejectedBeforeTouchingTheFile) {
  TempDir dir;
  const std::string path = dir.file("keep.safetensors");
  dtrain::save_safetensors(path, {{"old", torch::ones({3})}});
  const std::string before = read_bytes(path);
  const std::vector<std::pair<NamedTensors, std::string>> cases = {
      {{{"c", torch::ones({2}, torch::kComplexFloat)}}, "tensor 'c' has dtype ComplexFloat, which safetensors cannot hold"},
      {{{"u", torch::Tensor()}}, "tensor 'u' is undefined"},
      {{{"a", torch::ones({1})}, {"a", torch::ones({1})}}, "the tensor name 'a' is given twice"},
      {{{"__metadata__", torch::ones({1})}}, "cannot be named \"__metadata__\""},
      {{{"\xff", torch::ones({1})}}, "not valid UTF-8"},
  };
  for (const auto& [tensors, phrase] : cases) {
    try {
      dtrain::save_safetensors(path, tensors);
      ADD_FAILURE() << "no error for " << phrase;
    } catch (const std::runtime_error& error) {
      EXPECT_NE(std::string(error.what()).find("cannot write " + path), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(phrase), std::string::npos) << error.what();
    }
    EXPECT_EQ(read_bytes(path), before);
    EXPECT_FALSE(fs::exists(path + ".tmp"));
  }
}

TEST(SafetensorsAtomicWrite, ParentIsAFile) {
  TempDir dir;
  write_bytes(dir.file("plain"), "x");
  const std::string path = dir.file("plain/w.safetensors");
  try {
    dtrain::save_safetensors(path, {{"w", torch::ones({2})}});
    FAIL() << "no error";
  } catch (const std::runtime_error& error) {
    EXPECT_EQ(std::string(error.what()), "cannot write " + path + ": cannot create the temporary file " + path +
                                             ".tmp: Not a directory");
  }
}

// The rename fails (a folder is in the way): the temporary file goes away.
TEST(SafetensorsAtomicWrite, FailedRenameRemovesTheTemporaryFile) {
  TempDir dir;
  const std::string path = dir.file("taken");
  fs::create_directories(path + "/inside");
  try {
    dtrain::save_safetensors(path, {{"w", torch::ones({2})}});
    FAIL() << "no error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("renaming " + path + ".tmp to it: Is a directory"), std::string::npos)
        << error.what();
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_TRUE(fs::is_directory(path + "/inside"));
}

// The temporary file cannot be created: the old file stays as it was.
TEST(SafetensorsAtomicWrite, OldFileSurvivesAFailedWrite) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  dtrain::save_safetensors(path, {{"old", torch::ones({3})}});
  const std::string before = read_bytes(path);
  fs::create_directory(path + ".tmp");  // in the way of the temporary file
  EXPECT_THROW(dtrain::save_safetensors(path, {{"new", torch::zeros({5})}}), std::runtime_error);
  EXPECT_EQ(read_bytes(path), before);
  fs::remove(path + ".tmp");

  // An unwritable folder (root writes there anyway, so only as another user).
  if (::geteuid() != 0) {
    fs::permissions(dir.file(""), fs::perms::owner_read | fs::perms::owner_exec);
    try {
      dtrain::save_safetensors(path, {{"new", torch::zeros({5})}});
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& error) {
      EXPECT_NE(std::string(error.what()).find("Permission denied"), std::string::npos) << error.what();
    }
    fs::permissions(dir.file(""), fs::perms::owner_all);
    EXPECT_EQ(read_bytes(path), before);
  }
  dtrain::save_safetensors(path, {{"new", torch::zeros({5})}});
  EXPECT_EQ(dtrain::load_safetensors(path).names(), std::vector<std::string>{"new"});
}

// ------------------------------------------------------------------ modules

TEST(SafetensorsModule, RoundTripIntoAFreshModel) {
  TempDir dir;
  torch::manual_seed(1);
  dtrain::models::MLP source(std::vector<int64_t>{32, 16});
  torch::manual_seed(2);
  dtrain::models::MLP target(std::vector<int64_t>{32, 16});
  const std::string path = dir.file("mlp.safetensors");
  dtrain::save_module_safetensors(*source, path, {{"model", "mlp"}});
  const auto file = dtrain::load_safetensors(path);
  EXPECT_EQ(file.metadata.at("model"), "mlp");
  EXPECT_EQ(file.tensors.size(), source->named_parameters().size());
  dtrain::load_state_into(*target, file);
  for (const auto& item : source->named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), target->named_parameters()[item.key()])) << item.key();
  EXPECT_TRUE(target->named_parameters()[file.tensors[0].first].requires_grad());
}

TEST(SafetensorsModule, BuffersToo) {
  TempDir dir;
  torch::nn::BatchNorm1d source(4), target(4);
  source->running_mean.fill_(0.5);
  source->num_batches_tracked.fill_(7);
  const std::string path = dir.file("bn.safetensors");
  dtrain::save_module_safetensors(*source, path);
  const auto file = dtrain::load_safetensors(path);
  EXPECT_EQ(file.at("num_batches_tracked").scalar_type(), torch::kInt64);
  dtrain::load_state_into(*target, file);
  EXPECT_EQ(target->num_batches_tracked.item<int64_t>(), 7);
  EXPECT_TRUE(torch::allclose(target->running_mean, torch::full({4}, 0.5)));
}

std::string load_error(torch::nn::Module& module, const dtrain::SafetensorsFile& file) {
  try {
    dtrain::load_state_into(module, file);
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  return "";
}

TEST(SafetensorsModule, WrongNamesAndShapesLeaveTheModelAlone) {
  TempDir dir;
  dtrain::models::MLP small(std::vector<int64_t>{32});
  const std::string path = dir.file("small.safetensors");
  dtrain::save_module_safetensors(*small, path);
  const auto file = dtrain::load_safetensors(path);

  dtrain::models::MLP deeper(std::vector<int64_t>{32, 16});
  const auto before = deeper->parameters()[0].clone();
  const std::string names = load_error(*deeper, file);
  EXPECT_NE(names.find(path + " does not fit the model: the model's"), std::string::npos) << names;
  EXPECT_NE(names.find("missing from the file"), std::string::npos) << names;
  EXPECT_TRUE(torch::equal(deeper->parameters()[0], before));

  dtrain::models::MLP wider(std::vector<int64_t>{64});
  const auto wider_before = wider->parameters()[0].clone();
  const std::string shapes = load_error(*wider, file);
  EXPECT_NE(shapes.find("has shape [32, 784] in the file but [64, 784] in the model"), std::string::npos) << shapes;
  EXPECT_TRUE(torch::equal(wider->parameters()[0], wider_before));

  dtrain::SafetensorsFile extra = file;
  extra.tensors.emplace_back("stray.weight", torch::ones({1}));
  const std::string stray = load_error(*small, extra);
  EXPECT_NE(stray.find("the file's 'stray.weight' is not in the model"), std::string::npos) << stray;
}

TEST(SafetensorsModule, WideningIsExactNarrowingIsAnError) {
  TempDir dir;
  torch::nn::Linear f32(3, 2);
  const std::string half_path = dir.file("half.safetensors");
  NamedTensors half;
  for (const auto& item : f32->named_parameters()) half.emplace_back(item.key(), torch::randn(item.value().sizes()).to(torch::kBFloat16));
  dtrain::save_safetensors(half_path, half);
  dtrain::load_state_into(*f32, dtrain::load_safetensors(half_path));
  EXPECT_TRUE(torch::equal(f32->weight, half[0].second.to(torch::kFloat32)));

  torch::nn::Linear bf16(3, 2);
  bf16->to(torch::kBFloat16);
  const std::string full_path = dir.file("full.safetensors");
  dtrain::save_module_safetensors(*torch::nn::Linear(3, 2), full_path);
  const std::string message = load_error(*bf16, dtrain::load_safetensors(full_path));
  EXPECT_NE(message.find("tensor 'weight' is F32 in the file but BF16 in the model"), std::string::npos) << message;
}

}  // namespace

// ------------------------------------------------- checkpoint manifest parser

namespace {

// Why manifest_from_json refuses `text` (a test failure, and "", when it accepts it).
std::string manifest_rejection(const std::string& text) {
  try {
    dtrain::detail::manifest_from_json(text, "m");
    ADD_FAILURE() << "accepted: " << text;
    return "";
  } catch (const std::runtime_error& error) {
    return error.what();
  }
}

}  // namespace

// What make fuzz found: integers that are floats or too large for int64 (a
// conversion with undefined behaviour in nlohmann's get), and shapes whose
// element count overflows, are rejected with a message.
TEST(CheckpointManifest, OutOfRangeNumbersAreRejected) {
  const std::string good_files = R"("files":[{"name":"rank-00000-of-00001.safetensors","bytes":8,"xxh64":"0123456789abcdef","pieces":[["w",0,2]]}])";
  auto manifest = [&](const std::string& step, const std::string& shape) {
    return R"({"format":"dtrain-sharded-checkpoint","format_version":1,"step":)" + step +
           R"(,"world_size":1,"strategy":"ddp","optimizer":"none","extra":{},"tensors":{"w":{"dtype":"float32","shape":)" +
           shape + "}}," + good_files + "}";
  };
  EXPECT_NO_THROW(dtrain::detail::manifest_from_json(manifest("3", "[2]"), "m"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {manifest("5.5e54", "[2]"), "expected an integer, found number"},
      {manifest("18446744073709551615", "[2]"), "is too large"},
      {manifest("\"3\"", "[2]"), "expected an integer, found string"},
      {manifest("3", "[4294967296, 4294967296, 4294967296]"), "more elements than fit in 64 bits"},
      {manifest("3", "[2.5]"), "expected an integer"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string error = manifest_rejection(text);
    EXPECT_NE(error.find(expected), std::string::npos) << error;
    EXPECT_NE(error.find("not a complete checkpoint manifest"), std::string::npos) << error;
  }
}

// Issue 16: pieces must cover each tensor's elements exactly once. An
// overlap used to pass the coverage count while another range stayed
// unwritten; a tensor without pieces and an absurd shape skipped the checks.
TEST(CheckpointManifest, PiecesCoverEachTensorExactlyOnce) {
  auto manifest = [](const std::string& shape, const std::string& pieces) {
    return R"({"format":"dtrain-sharded-checkpoint","format_version":1,"step":3,"world_size":2,"strategy":"full",)"
           R"("optimizer":"none","extra":{},"tensors":{"w":{"dtype":"float32","shape":)" + shape +
           R"(}},"files":[{"name":"rank-00000-of-00002.safetensors","bytes":8,"xxh64":"0123456789abcdef","pieces":[)" +
           pieces + R"(]},{"name":"rank-00001-of-00002.safetensors","bytes":8,"xxh64":"0123456789abcdef","pieces":[]}]})";
  };
  EXPECT_NO_THROW(dtrain::detail::manifest_from_json(manifest("[4]", R"(["w",0,2],["w",2,4,2,0,1])"), "m"));
  EXPECT_NO_THROW(dtrain::detail::manifest_from_json(manifest("[0]", ""), "m"));
  // Format 2 (tensor parallelism): strided pieces, [name, begin, end, offset,
  // stride, count]: columns 0-1 of a [2, 4] weight, then columns 2-3.
  EXPECT_NO_THROW(dtrain::detail::manifest_from_json(manifest("[2, 4]", R"(["w",0,2,0,4,2],["w",2,4,4,4,2])"), "m"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {manifest("[4]", R"(["w",0,2],["w",1,4])"), "elements [1, 2) of 'w' are in more than one piece"},
      {manifest("[4]", R"(["w",0,2],["w",0,2],["w",2,4])"), "elements [0, 2) of 'w' are in more than one piece"},
      {manifest("[4]", R"(["w",0,1],["w",2,4])"), "elements [1, 2) of 'w' are in no piece"},
      {manifest("[4]", R"(["w",0,2])"), "elements [2, 4) of 'w' are in no piece"},
      {manifest("[4]", R"(["w",0,6])"), "pieces of 'w' run beyond its 4 elements"},
      {manifest("[2147483648, 2147483648]", ""), "elements [0, 4611686018427387904) of 'w' are in no piece"},
      {manifest("[4]", R"(["v",0,4])"), "holds unknown tensor 'v'"},
      // Two pieces of one tensor in a file lie one after another in its entry.
      {manifest("[4]", R"(["w",0,2],["w",2,4])"), "a piece of 'w' starts at element 0 of its entry, not 2"},
      {manifest("[4]", R"(["w",0,2],["w",2,4,3,0,1])"), "a piece of 'w' starts at element 3 of its entry, not 2"},
      {manifest("[2, 4]", R"(["w",0,2,0,4,2],["w",2,4,4,3,2])"), "elements [5, 6) of 'w' are in more than one piece"},
      {manifest("[2, 4]", R"(["w",0,2,0,1,2])"), "piece of 'w' has a bad offset, stride or count"},
      {manifest("[2, 4]", R"(["w",0,2,0,4,0])"), "piece of 'w' has a bad offset, stride or count"},
      {manifest("[2, 4]", R"(["w",0,2,0,9223372036854775807,3])"), "piece of 'w' has a bad offset, stride or count"},
      {manifest("[2, 4]", R"(["w",0,2,0])"), "a piece is [name, begin, end] or [name, begin, end, offset, stride, count]"},
      {manifest("[1073741824, 1024]", R"(["w",0,1,0,2,1073741824])"), "list more than 4194304 ranges"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string error = manifest_rejection(text);
    EXPECT_NE(error.find(expected), std::string::npos) << error;
  }
}

// Issue 16, item 1: the fields a saver writes together must agree: file
// names with ranks and world size, strategy with world size, optimizer
// state with the optimizer and with the tensors it belongs to.
TEST(CheckpointManifest, FieldsAgreeWithEachOther) {
  struct Fields {
    // "full": what saves before the strategy table wrote for fsdp, which still loads.
    std::string strategy = "full", optimizer = "adamw", second_file = "rank-00001-of-00002.safetensors";
    std::string state = R"("optim/w/exp_avg":{"dtype":"float32","shape":[4]},"optim/w/step":{"dtype":"int64","shape":[1]})";
    std::string state_pieces = R"(,["optim/w/exp_avg",0,4],["optim/w/step",0,1])";
  };
  auto manifest = [](const Fields& f) {
    return R"({"format":"dtrain-sharded-checkpoint","format_version":1,"step":3,"world_size":2,"strategy":")" +
           f.strategy + R"(","optimizer":")" + f.optimizer +
           R"(","extra":{},"tensors":{"w":{"dtype":"float32","shape":[4]})" + (f.state.empty() ? "" : "," + f.state) +
           R"(},"files":[{"name":"rank-00000-of-00002.safetensors","bytes":8,"xxh64":"0123456789abcdef","pieces":[["w",0,4])" +
           f.state_pieces + R"(]},{"name":")" + f.second_file + R"(","bytes":8,"xxh64":"0123456789abcdef","pieces":[]}]})";
  };
  EXPECT_NO_THROW(dtrain::detail::manifest_from_json(manifest({}), "m"));
  std::vector<std::pair<Fields, std::string>> cases;
  auto add = [&](auto edit, const std::string& expected) {
    Fields f;
    edit(f);
    cases.emplace_back(f, expected);
  };
  add([](Fields& f) { f.second_file = "rank-00001-of-00003.safetensors"; },
      "file 1 is named 'rank-00001-of-00003.safetensors', not 'rank-00001-of-00002.safetensors'");
  add([](Fields& f) { f.second_file = "rank-00000-of-00002.safetensors"; }, "file 1 is named");
  add([](Fields& f) { f.strategy = "zero9"; }, "unknown strategy 'zero9'");
  add([](Fields& f) { f.strategy = "single"; }, "strategy 'single' at world size 2");
  add([](Fields& f) { f.optimizer = "lamb"; }, "unknown optimizer 'lamb'");
  add([](Fields& f) { f.optimizer = "none"; }, "'optim/w/exp_avg' is no none state");
  add([](Fields& f) { f.optimizer = "sgd"; }, "'optim/w/exp_avg' is no sgd state");
  add([](Fields& f) {
    f.state = R"("optim/v/exp_avg":{"dtype":"float32","shape":[4]})";
    f.state_pieces = R"(,["optim/v/exp_avg",0,4])";
  }, "'optim/v/exp_avg' is state of a tensor it does not list");
  add([](Fields& f) {
    f.state = R"("optim/w/exp_avg":{"dtype":"float64","shape":[4]})";
    f.state_pieces = R"(,["optim/w/exp_avg",0,4])";
  }, "'optim/w/exp_avg' has another shape or dtype than exp_avg of 'w' must have");
  add([](Fields& f) {
    f.state = R"("optim/w/step":{"dtype":"float32","shape":[1]})";
    f.state_pieces = R"(,["optim/w/step",0,1])";
  }, "'optim/w/step' has another shape or dtype");
  add([](Fields& f) {
    f.state = R"("optim/w":{"dtype":"float32","shape":[4]})";
    f.state_pieces = R"(,["optim/w",0,4])";
  }, "'optim/w' is no adamw state");
  for (const auto& [fields, expected] : cases) {
    const std::string error = manifest_rejection(manifest(fields));
    EXPECT_NE(error.find(expected), std::string::npos) << error;
  }
}

// The committed fuzz corpus (make fuzz): every input parses or is rejected
// with std::runtime_error, never anything else.
TEST(CheckpointManifest, FuzzCorpusParsesOrIsRejected) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(DTRAIN_MANIFEST_FUZZ_CORPUS)) {
    const std::string text = read_bytes(entry.path().string());
    try {
      const auto manifest = dtrain::detail::manifest_from_json(text, entry.path().string());
      EXPECT_EQ(manifest.files.size(), static_cast<size_t>(manifest.world_size)) << entry.path();
    } catch (const std::runtime_error&) {
    }
    ++files;
  }
  EXPECT_GE(files, 1);
}
