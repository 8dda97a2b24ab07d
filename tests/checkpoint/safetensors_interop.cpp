// The C++ side of check_python_interop.py:
//   safetensors_interop write PATH   writes the tensors the script expects
//   safetensors_interop read PATH    prints a file's metadata and tensors as JSON
#include "dtrain/checkpoint.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <iostream>
#include <string>

namespace {

// Values every dtype holds exactly; check_python_interop.py builds the same.
torch::Tensor values(torch::ScalarType dtype) {
  auto steps = torch::arange(6, torch::kFloat32).reshape({2, 3});
  if (dtype == torch::kBool) return steps.remainder(2).to(dtype);
  if (dtype == torch::kUInt8) return (steps * 40).to(dtype);
  return ((steps - 2) * 1.5).to(dtype);
}

int write(const std::string& path) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto [name, dtype] : {std::pair{"f32", torch::kFloat32}, {"bf16", torch::kBFloat16}, {"f16", torch::kFloat16},
                             {"f64", torch::kFloat64}, {"i64", torch::kInt64}, {"i32", torch::kInt32},
                             {"i8", torch::kInt8}, {"u8", torch::kUInt8}, {"bool", torch::kBool}})
    tensors.emplace_back(std::string("t.") + name, values(dtype));
  tensors.emplace_back("scalar", torch::tensor(3.25f).reshape({}));
  tensors.emplace_back("empty", torch::zeros({0, 2}));
  dtrain::save_safetensors(path, tensors, {{"format", "pt"}, {"written_by", "dtrain"}});
  return 0;
}

int read(const std::string& path) {
  const auto file = dtrain::load_safetensors(path);
  nlohmann::ordered_json out;
  out["metadata"] = file.metadata;
  out["tensors"] = nlohmann::ordered_json::array();
  for (const auto& [name, tensor] : file.tensors) {
    const auto flat = tensor.to(torch::kFloat64).flatten().contiguous();
    std::vector<double> numbers(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
    out["tensors"].push_back({{"name", name},
                              {"dtype", c10::toString(tensor.scalar_type())},
                              {"shape", tensor.sizes().vec()},
                              {"values", numbers}});
  }
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[1]) != "write" && std::string(argv[1]) != "read")) {
    std::cerr << "usage: safetensors_interop write|read PATH\n";
    return 2;
  }
  try {
    return std::string(argv[1]) == "write" ? write(argv[2]) : read(argv[2]);
  } catch (const std::exception& error) {
    std::cerr << "safetensors_interop: " << error.what() << "\n";
    return 1;
  }
}
