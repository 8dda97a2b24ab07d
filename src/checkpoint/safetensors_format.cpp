// The safetensors format without LibTorch (see Note [safetensors layout] in
// safetensors_format.h). The header is read with nlohmann-json's SAX parser:
// a small state machine takes the events and builds the entries directly,
// which catches what a parsed DOM would hide (duplicate keys, which a DOM
// silently collapses) and stops at the first value of the wrong kind
// without building the rest of a hostile document.
#include "checkpoint/safetensors_format.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <limits>
#include <numeric>
#include <set>
#include <unordered_set>
#include <utility>

namespace dtrain::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; dtrain reads and writes it as the host's bytes");

namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  uint64_t size;
};
constexpr std::array<DTypeInfo, 15> kDTypes{{
    {DType::BOOL, "BOOL", 1},
    {DType::U8, "U8", 1},
    {DType::I8, "I8", 1},
    {DType::I16, "I16", 2},
    {DType::U16, "U16", 2},
    {DType::I32, "I32", 4},
    {DType::U32, "U32", 4},
    {DType::I64, "I64", 8},
    {DType::U64, "U64", 8},
    {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},
    {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},
}};

const DTypeInfo& info(DType dtype) {
  for (const auto& entry : kDTypes)
    if (entry.dtype == dtype) return entry;
  throw FormatError("unknown dtype enumerator " + std::to_string(static_cast<int>(dtype)));
}

[[noreturn]] void fail(const std::string& message) { throw FormatError(message); }

// A name for messages: quoted, cut short, control bytes shown as '?'. Names
// come from the file and may be anything up to the header's length.
std::string show(std::string_view name) {
  constexpr size_t kShown = 60;
  std::string text = "'";
  for (size_t i = 0; i < name.size() && i < kShown; ++i) {
    const auto byte = static_cast<unsigned char>(name[i]);
    text += byte < 0x20 || byte == 0x7f ? '?' : static_cast<char>(byte);
  }
  if (name.size() > kShown) text += "...";
  return text + "'";
}

std::string format_shape(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// ------------------------------------------------------------ header reader

// Receives the parser's events for one header. Each handler returns false
// (stopping the parse) with `error` set when the event is not what the
// layout allows at that point.
class HeaderReader : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::vector<TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
  std::string error;

  bool null() override { return unexpected("null"); }
  bool boolean(bool) override { return unexpected("a boolean"); }
  bool number_integer(number_integer_t value) override {
    // The parser reports non-negative integers through number_unsigned.
    if (state_ == State::ShapeItem) return stop(in_tensor() + "shape has a negative dimension " + std::to_string(value));
    if (state_ == State::OffsetsItem) return stop(in_tensor() + "data_offsets has a negative offset " + std::to_string(value));
    return unexpected("a number");
  }
  bool number_unsigned(number_unsigned_t value) override {
    if (state_ == State::ShapeItem) {
      if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return stop(in_tensor() + "shape has a dimension " + std::to_string(value) + " above 2^63 - 1");
      current_.shape.push_back(static_cast<int64_t>(value));
      return true;
    }
    if (state_ == State::OffsetsItem) {
      if (offsets_seen_ == 2) return stop(in_tensor() + "data_offsets must be [BEGIN, END], got more than two numbers");
      (offsets_seen_++ == 0 ? current_.begin : current_.end) = value;
      return true;
    }
    return unexpected("a number");
  }
  bool number_float(number_float_t, const string_t& text) override {
    if (state_ == State::ShapeItem || state_ == State::OffsetsItem)
      return stop(in_tensor() + (state_ == State::ShapeItem ? "shape" : "data_offsets") + " holds " + show(text) +
                  ", not an integer from 0 to 2^64 - 1");
    return unexpected("a number");
  }
  bool string(string_t& value) override {
    if (state_ == State::TensorValue && field_ == Field::DType) {
      const auto dtype = dtype_from_name(value);
      if (!dtype) return stop(in_tensor() + "unknown dtype " + show(value) + " (known: " + dtype_names() + ")");
      current_.dtype = *dtype;
      state_ = State::TensorKey;
      return true;
    }
    if (state_ == State::MetadataValue) {
      metadata.emplace(std::move(metadata_key_), std::move(value));
      state_ = State::MetadataKey;
      return true;
    }
    return unexpected("a string");
  }
  bool binary(binary_t&) override { return unexpected("binary data"); }

  bool start_object(std::size_t) override {
    switch (state_) {
      case State::Start:
        state_ = State::RootKey;
        return true;
      case State::RootValue:
        if (in_metadata_) {
          state_ = State::MetadataKey;
        } else {
          state_ = State::TensorKey;
          fields_seen_ = 0;
        }
        return true;
      default:
        return unexpected("an object");
    }
  }
  bool key(string_t& name) override {
    switch (state_) {
      case State::RootKey:
        if (name == "__metadata__") {
          if (seen_metadata_) return stop("the header has \"__metadata__\" twice");
          seen_metadata_ = in_metadata_ = true;
        } else {
          if (!names_.insert(name).second) return stop("the header names tensor " + show(name) + " twice");
          in_metadata_ = false;
          current_ = TensorEntry{};
          current_.name = std::move(name);
          offsets_seen_ = 0;
        }
        state_ = State::RootValue;
        return true;
      case State::TensorKey: {
        if (name == "dtype") field_ = Field::DType;
        else if (name == "shape") field_ = Field::Shape;
        else if (name == "data_offsets") field_ = Field::Offsets;
        else return stop(in_tensor() + "unknown field " + show(name) + " (a tensor has dtype, shape and data_offsets)");
        const unsigned bit = 1u << static_cast<unsigned>(field_);
        if (fields_seen_ & bit) return stop(in_tensor() + "field " + show(name) + " appears twice");
        fields_seen_ |= bit;
        state_ = State::TensorValue;
        return true;
      }
      case State::MetadataKey:
        if (metadata.count(name)) return stop("\"__metadata__\" has the key " + show(name) + " twice");
        metadata_key_ = std::move(name);
        state_ = State::MetadataValue;
        return true;
      default:
        return unexpected("a key");  // not reachable: the parser only reports keys inside objects
    }
  }
  bool end_object() override {
    switch (state_) {
      case State::RootKey:
        state_ = State::Done;
        return true;
      case State::TensorKey:
        for (auto [field, name] : {std::pair{Field::DType, "dtype"}, {Field::Shape, "shape"}, {Field::Offsets, "data_offsets"}})
          if (!(fields_seen_ & (1u << static_cast<unsigned>(field))))
            return stop(in_tensor() + "the field \"" + name + "\" is missing");
        tensors.push_back(std::move(current_));
        state_ = State::RootKey;
        return true;
      case State::MetadataKey:
        state_ = State::RootKey;
        return true;
      default:
        return unexpected("the end of an object");  // not reachable
    }
  }
  bool start_array(std::size_t) override {
    if (state_ == State::TensorValue && field_ == Field::Shape) {
      state_ = State::ShapeItem;
      return true;
    }
    if (state_ == State::TensorValue && field_ == Field::Offsets) {
      state_ = State::OffsetsItem;
      return true;
    }
    return unexpected("an array");
  }
  bool end_array() override {
    if (state_ == State::OffsetsItem && offsets_seen_ != 2)
      return stop(in_tensor() + "data_offsets must be [BEGIN, END], got " + std::to_string(offsets_seen_) +
                  (offsets_seen_ == 1 ? " number" : " numbers"));
    if (state_ == State::ShapeItem || state_ == State::OffsetsItem) {
      state_ = State::TensorKey;
      return true;
    }
    return unexpected("the end of an array");  // not reachable
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& exception) override {
    // what() is "[json.exception.parse_error.101] parse error at line 1, column 7: ..."
    std::string text = exception.what();
    const size_t bracket = text.find("] ");
    if (text.rfind("[json.exception.", 0) == 0 && bracket != std::string::npos) text.erase(0, bracket + 2);
    return stop("the header is not valid JSON: " + text);
  }

 private:
  enum class State { Start, RootKey, RootValue, TensorKey, TensorValue, ShapeItem, OffsetsItem, MetadataKey, MetadataValue, Done };
  enum class Field : unsigned { DType, Shape, Offsets };

  bool stop(std::string message) {
    error = std::move(message);
    return false;
  }
  std::string in_tensor() const { return "tensor " + show(current_.name) + ": "; }
  // A value the layout does not allow where it stands.
  bool unexpected(const std::string& what) {
    switch (state_) {
      case State::Start:
        return stop("the header must be a JSON object, but it is " + what);
      case State::RootValue:
        if (in_metadata_) return stop("\"__metadata__\" must be an object of strings, but it is " + what);
        return stop(in_tensor() + "its value must be an object {dtype, shape, data_offsets}, but it is " + what);
      case State::TensorValue:
        if (field_ == Field::DType) return stop(in_tensor() + "dtype must be a string such as \"F32\", but it is " + what);
        return stop(in_tensor() + (field_ == Field::Shape ? "shape" : "data_offsets") +
                    " must be an array of integers, but it is " + what);
      case State::ShapeItem:
        return stop(in_tensor() + "shape must hold only integers, but it holds " + what);
      case State::OffsetsItem:
        return stop(in_tensor() + "data_offsets must hold only integers, but it holds " + what);
      case State::MetadataValue:
        return stop("\"__metadata__\" values must be strings, but " + show(metadata_key_) + " is " + what);
      default:
        return stop("unexpected " + what + " in the header");
    }
  }

  State state_ = State::Start;
  Field field_ = Field::DType;
  unsigned fields_seen_ = 0;
  int offsets_seen_ = 0;
  bool in_metadata_ = false;
  bool seen_metadata_ = false;
  TensorEntry current_;
  std::string metadata_key_;
  std::set<std::string, std::less<>> names_;
};

// The bytes a tensor's shape and dtype need, or nullopt when that overflows 64 bits.
std::optional<uint64_t> needed_bytes(const TensorEntry& entry) {
  uint64_t count = 1;
  for (int64_t dim : entry.shape)
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(dim), &count)) return std::nullopt;
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(count, dtype_size(entry.dtype), &bytes)) return std::nullopt;
  return bytes;
}

// Row-major strides (in elements) fit in int64, as tensor libraries store
// them: the outermost is the product of the other dimensions, each counted as
// at least 1. Only an empty tensor can fail this once the bytes are checked.
bool strides_fit(const std::vector<int64_t>& shape) {
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 1;)
    if (__builtin_mul_overflow(stride, std::max<int64_t>(shape[i], 1), &stride)) return false;
  return true;
}

void check_entries(const std::vector<TensorEntry>& tensors, uint64_t data_size) {
  for (const auto& t : tensors) {
    const std::string where = "tensor " + show(t.name) + ": ";
    const auto needed = needed_bytes(t);
    if (!needed)
      fail(where + "shape " + format_shape(t.shape) + " of " + dtype_name(t.dtype) + " needs more than 2^64 bytes");
    if (!strides_fit(t.shape))
      fail(where + "shape " + format_shape(t.shape) + " has row-major strides beyond 2^63 - 1 (an empty tensor " +
           "whose other dimensions are huge)");
    if (t.begin > t.end)
      fail(where + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] begin after they end");
    if (t.end > data_size)
      fail(where + "data_offsets end at byte " + std::to_string(t.end) + " but the data holds only " +
           std::to_string(data_size) + " bytes (a truncated file?)");
    if (t.nbytes() != *needed)
      fail(where + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] hold " +
           std::to_string(t.nbytes()) + " bytes but shape " + format_shape(t.shape) + " of " + dtype_name(t.dtype) +
           " needs " + std::to_string(*needed));
  }
  // The ranges must tile [0, data_size): sorted by (begin, end), each starts
  // where the previous one ended.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::pair{tensors[a].begin, tensors[a].end} < std::pair{tensors[b].begin, tensors[b].end};
  });
  uint64_t covered = 0;
  const TensorEntry* previous = nullptr;
  for (size_t index : order) {
    const TensorEntry& t = tensors[index];
    if (t.begin < covered)
      fail("tensors " + show(previous->name) + " and " + show(t.name) + " overlap: bytes " + std::to_string(t.begin) +
           " to " + std::to_string(covered) + " of the data belong to both");
    if (t.begin > covered)
      fail("bytes " + std::to_string(covered) + " to " + std::to_string(t.begin) +
           " of the data belong to no tensor (a hole before tensor " + show(t.name) +
           "; the tensors must cover the data exactly)");
    covered = t.end;
    previous = &t;
  }
  if (covered != data_size)
    fail("the last " + std::to_string(data_size - covered) + " bytes of the data belong to no tensor " +
         "(the tensors must cover the data exactly)");
}

}  // namespace

const char* dtype_name(DType dtype) { return info(dtype).name; }
uint64_t dtype_size(DType dtype) { return info(dtype).size; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& entry : kDTypes)
    if (name == entry.name) return entry.dtype;
  return std::nullopt;
}

std::string dtype_names() {
  std::string text;
  for (const auto& entry : kDTypes) text += (text.empty() ? "" : ", ") + std::string(entry.name);
  return text;
}

uint64_t TensorEntry::numel() const {
  uint64_t count = 1;
  for (int64_t dim : shape) count *= static_cast<uint64_t>(dim);
  return count;
}

uint64_t parse_header_length(const uint8_t* prefix, uint64_t file_size) {
  if (file_size < kLengthBytes)
    fail("the file is " + std::to_string(file_size) + " bytes, too short for the 8-byte header length");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | prefix[i];
  if (length > file_size - kLengthBytes)
    fail("the header length " + std::to_string(length) + " is larger than the " + std::to_string(file_size - kLengthBytes) +
         " bytes after it");
  if (length > kMaxHeaderBytes)
    fail("the header length " + std::to_string(length) + " is larger than the " + std::to_string(kMaxHeaderBytes) +
         "-byte limit for a safetensors header");
  if (length < 2) fail("the header length " + std::to_string(length) + " is too short for a JSON object");
  return length;
}

Header parse_header(const char* json, size_t json_size, uint64_t data_size) {
  if (json_size == 0 || json[0] != '{')
    fail("the header must start with '{' (a JSON object), but it starts with " +
         (json_size == 0 ? std::string("nothing") : show(std::string_view(json, 1))));
  HeaderReader reader;
  if (!nlohmann::json::sax_parse(json, json + json_size, &reader)) fail(reader.error);
  check_entries(reader.tensors, data_size);
  Header header;
  header.tensors = std::move(reader.tensors);
  header.metadata = std::move(reader.metadata);
  header.data_size = data_size;
  return header;
}

Header parse_safetensors_header(const uint8_t* data, size_t size) {
  const uint64_t length = parse_header_length(data, size);
  Header header = parse_header(reinterpret_cast<const char*>(data + kLengthBytes), length, size - kLengthBytes - length);
  header.data_offset = kLengthBytes + length;
  return header;
}

std::string serialize_header(const std::vector<TensorEntry>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  // Built as text (nlohmann-json only quotes the strings): an ordered_json
  // object finds keys by linear search, quadratic in the number of tensors.
  auto quote = [](const std::string& text) {
    try {
      return nlohmann::json(text).dump();
    } catch (const nlohmann::json::type_error&) {
      fail("the name or metadata string " + show(text) + " is not valid UTF-8");
    }
  };
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    for (const auto& [key, value] : metadata) json += (json.back() == '{' ? "" : ",") + quote(key) + ":" + quote(value);
    json += "}";
  }
  std::unordered_set<std::string_view> names;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__") fail("a tensor cannot be named \"__metadata__\" (the key is reserved for metadata)");
    if (!names.insert(t.name).second) fail("the tensor name " + show(t.name) + " is given twice");
    json += (json.back() == '{' ? "" : ",") + quote(t.name) + ":{\"dtype\":\"" + dtype_name(t.dtype) + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) json += (i ? "," : "") + std::to_string(t.shape[i]);
    json += "],\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.end) + "]}";
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string bytes(kLengthBytes, '\0');
  const uint64_t length = json.size();
  for (size_t i = 0; i < kLengthBytes; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return bytes + json;
}

}  // namespace dtrain::safetensors
