// config.json (include/dtrain/hugging_face.h): its fields read with checks
// that name the file and the field. Which fields a model reads is its
// spec's business (ModelSpec::hugging_face).
#include "dtrain/hugging_face.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace dtrain::hf {

struct Config::Fields {
  nlohmann::json json;
};

Config::Config(std::shared_ptr<const Fields> fields, std::string text, std::string where)
    : fields_(std::move(fields)), text_(std::move(text)), where_(std::move(where)) {}

Config Config::read(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::invalid_argument(path + ": cannot be read");
  std::stringstream text;
  text << file.rdbuf();
  return parse(text.str(), path);
}

Config Config::parse(const std::string& text, const std::string& where) {
  auto fields = std::make_shared<Fields>();
  fields->json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!fields->json.is_object()) throw std::invalid_argument(where + ": is not a JSON object (a Hugging Face config.json)");
  return Config(std::move(fields), text, where);
}

void Config::fail(const std::string& what) const { throw std::invalid_argument(where_ + ": " + what); }

bool Config::has(const std::string& key) const {
  return fields_->json.contains(key) && !fields_->json[key].is_null();
}

int64_t Config::integer(const std::string& key) const {
  if (!has(key)) fail("\"" + key + "\" is missing");
  const nlohmann::json& value = fields_->json[key];
  if (!value.is_number_integer() || value.get<int64_t>() < 1)
    fail("\"" + key + "\" must be a positive integer, got " + value.dump());
  return value.get<int64_t>();
}

int64_t Config::integer(const std::string& key, int64_t otherwise) const { return has(key) ? integer(key) : otherwise; }

double Config::number(const std::string& key, double otherwise) const {
  if (!has(key)) return otherwise;
  if (!fields_->json[key].is_number()) fail("\"" + key + "\" must be a number, got " + fields_->json[key].dump());
  return fields_->json[key].get<double>();
}

bool Config::boolean(const std::string& key, bool otherwise) const {
  if (!has(key)) return otherwise;
  if (!fields_->json[key].is_boolean()) fail("\"" + key + "\" must be true or false, got " + fields_->json[key].dump());
  return fields_->json[key].get<bool>();
}

std::string Config::string(const std::string& key, const std::string& otherwise) const {
  if (!has(key)) return otherwise;
  if (!fields_->json[key].is_string()) fail("\"" + key + "\" must be a string, got " + fields_->json[key].dump());
  return fields_->json[key].get<std::string>();
}

Config Config::object(const std::string& key) const {
  if (!has(key) || !fields_->json[key].is_object()) fail("\"" + key + "\" must be an object");
  auto fields = std::make_shared<Fields>();
  fields->json = fields_->json[key];
  std::string text = fields->json.dump();
  return Config(std::move(fields), std::move(text), where_ + ": \"" + key + "\"");
}

void Config::require_value(const std::string& key, const Fields& supported, const std::string& why) const {
  if (has(key) && fields_->json[key] != supported.json)
    fail("\"" + key + "\": " + fields_->json[key].dump() + " is not supported (" + why + ")");
}

void Config::require(const std::string& key, bool supported, const std::string& why) const {
  require_value(key, Fields{supported}, why);
}

void Config::require(const std::string& key, const std::string& supported, const std::string& why) const {
  require_value(key, Fields{supported}, why);
}

bool is_model_directory(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_directory(path, error) &&
         std::filesystem::is_regular_file(std::filesystem::path(path) / "config.json", error);
}

}  // namespace dtrain::hf
