// Spec hooks a run asks in-process (dtrain/model_spec.h):
// - Hugging Face model directories through a spec's adapter
//   (ModelSpec::hugging_face, dtrain/hugging_face.h): a config.json picks the
//   registered model that reads it, and a model of one's own with an adapter
//   exports to a directory and loads back from it, its names and layouts
//   mapped (a transposed weight included);
// - the closing samples through ModelSpec::sample.
#include <dtrain/checkpoint.h>
#include <dtrain/comm.h>
#include <dtrain/hugging_face.h>
#include <dtrain/model_spec.h>
#include <dtrain/safetensors.h>
#include <dtrain/train.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;

std::string write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
  return path.string();
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("dtrain-hf-adapter-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string gpt2_config(const std::string& activation) {
  return R"({"model_type": "gpt2", "vocab_size": 64, "n_positions": 32, "n_embd": 16, "n_layer": 1, "n_head": 2,
             "activation_function": ")" + activation + "\"}";
}

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

TEST(HuggingFaceAdapter, TheConfigPicksTheRegisteredModelThatDescribesIt) {
  EXPECT_EQ(dtrain::model_for_hugging_face(dtrain::hf::Config::parse(gpt2_config("gelu_new"), "a")), "gpt2");
  EXPECT_EQ(dtrain::model_for_hugging_face(dtrain::hf::Config::parse(gpt2_config("gelu"), "b")), "gpt");
  EXPECT_EQ(dtrain::model_for_hugging_face(dtrain::hf::Config::parse(R"({"model_type": "llama"})", "c")), "llama");
  const std::string unknown =
      error_of([] { dtrain::model_for_hugging_face(dtrain::hf::Config::parse(R"({"model_type": "bert"})", "d.json")); });
  EXPECT_NE(unknown.find("d.json: model_type \"bert\" is not one a registered model reads"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("\"llama\""), std::string::npos) << unknown;

  // An activation neither GPT computes: the first reader of gpt2 names it.
  const fs::path dir = fresh_dir("relu");
  dtrain::TrainConfig config;
  config.model_config = write_file(dir / "config.json", gpt2_config("relu"));
  const std::string relu = error_of([&] { dtrain::apply_model_config(config); });
  EXPECT_NE(relu.find("\"activation_function\": \"relu\" is not supported"), std::string::npos) << relu;

  // The file decides the model, and a different one given is refused.
  config.model_config = write_file(dir / "config.json", gpt2_config("gelu"));
  config.model = "gpt2";
  const std::string other = error_of([&] { dtrain::apply_model_config(config); });
  EXPECT_NE(other.find("describes --model gpt ("), std::string::npos) << other;
  config.model = dtrain::TrainConfig{}.model;
  dtrain::apply_model_config(config);
  EXPECT_EQ(config.model, "gpt");
  EXPECT_EQ(config.gpt_dim, 16);
  EXPECT_EQ(config.positions, 32);
}

// A model of one's own: "proj" is stored transposed under "net.", as a
// Conv1D-style file would hold it.
dtrain::hf::Layout own_layout() {
  dtrain::hf::Layout layout;
  layout.name = [](const std::string& name, bool* transposed) {
    if (transposed) *transposed = name == "proj.weight";
    return "net." + name;
  };
  layout.skipped = [](const std::string& name) { return name == "net.masks"; };
  return layout;
}

struct OwnNetImpl : torch::nn::Module {
  OwnNetImpl() {
    proj = register_module("proj", torch::nn::Linear(6, 4));
    head = register_module("head", torch::nn::Linear(4, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head->forward(torch::relu(proj->forward(x))); }
  torch::nn::Linear proj{nullptr}, head{nullptr};
};
TORCH_MODULE(OwnNet);

TEST(HuggingFaceAdapter, AModelOfOnesOwnExportsAndLoadsBack) {
  dtrain::ModelSpec spec;
  spec.build = [](const dtrain::TrainConfig&) { return dtrain::built_model(OwnNet()); };
  dtrain::HuggingFaceAdapter adapter;
  adapter.model_type = "own-net";
  adapter.architecture = "OwnNetModel";
  adapter.read_config = [](const dtrain::hf::Config& file, dtrain::TrainConfig& c) {
    c.vocab_size = file.integer("width");
  };
  adapter.write_config = [](const dtrain::TrainConfig&, const std::string&) {
    return std::string(R"({"model_type": "own-net", "width": 7})");
  };
  adapter.layout = own_layout;
  spec.hugging_face = adapter;
  dtrain::register_model("own_net_hf", spec);

  torch::manual_seed(3);
  OwnNet trained;
  const fs::path dir = fresh_dir("export");
  dtrain::save_checkpoint((dir / "checkpoint").string(), *trained, nullptr, 5);
  dtrain::hf::export_checkpoint((dir / "checkpoint").string(), (dir / "hf").string(), own_layout(),
                                adapter.write_config({}, ""), 1 << 20);

  // Hugging Face's names and layout in the file.
  const auto file = dtrain::load_safetensors((dir / "hf" / "model.safetensors").string());
  ASSERT_NE(file.find("net.proj.weight"), nullptr);
  EXPECT_TRUE(torch::equal(file.at("net.proj.weight"), trained->proj->weight.t()));
  EXPECT_TRUE(torch::equal(file.at("net.head.bias"), trained->head->bias));

  // The directory picks the model and loads into a fresh one.
  dtrain::TrainConfig config;
  config.init_from = (dir / "hf").string();
  dtrain::apply_model_config(config);
  EXPECT_EQ(config.model, "own_net_hf");
  EXPECT_EQ(config.vocab_size, 7);
  OwnNet loaded;
  dtrain::HeldModel held;
  for (const auto& item : loaded->named_parameters(true)) {
    const auto& p = item.value();
    held.tensors.push_back({item.key(), p.sizes().vec(), 0, p.numel(), p.detach().view(-1), 1, 0, p, {}});
  }
  dtrain::hf::load_into(held, own_layout(), (dir / "hf").string());
  for (const auto& item : trained->named_parameters(true))
    EXPECT_TRUE(torch::equal(item.value(), loaded->named_parameters(true)[item.key()])) << item.key();

  // Without the layout a directory is not read as a plain safetensors file.
  const std::string plain = error_of([&] { dtrain::load_safetensors_into(held, (dir / "hf").string()); });
  EXPECT_NE(plain.find("hf::Layout"), std::string::npos) << plain;
  fs::remove_all(dir);
}

// A spec's sampler writes the closing samples: here the built-in GPT with a
// sampler that asks the model once and then repeats the prompt's last byte.
TEST(SampleHook, TheSpecsSamplerWritesTheClosingSamples) {
  dtrain::ModelSpec spec = dtrain::find_model("gpt");
  int calls = 0;
  spec.sample = [&calls](const torch::Tensor& prompts, int64_t new_tokens, const dtrain::TrainConfig& config,
                         at::Generator, const std::function<torch::Tensor(const torch::Tensor&)>& logits) {
    ++calls;
    EXPECT_EQ(logits(prompts).size(2), config.vocab_size);  // the whole vocabulary
    const auto last = prompts.narrow(1, prompts.size(1) - 1, 1);
    return torch::cat({prompts, last.expand({prompts.size(0), new_tokens})}, 1);
  };
  dtrain::register_model("gpt_repeating_sampler", spec);
  const fs::path dir = fresh_dir("sampler");
  dtrain::TrainConfig config;
  config.model = "gpt_repeating_sampler";
  config.data = "text:" + write_file(dir / "text.txt", std::string(4000, 'a') + std::string(4000, 'b'));
  config.gpt_layers = 1;
  config.gpt_dim = 16;
  config.gpt_heads = 2;
  config.seq_len = 16;
  config.batch_size = 4;
  config.steps = 1;
  config.samples = 2;
  config.sample_bytes = 5;
  config.sample_prompt = "Hi!";
  config.optimizer = "adamw";
  config.strategy = "single";
  config.print = false;
  const auto result = dtrain::run_training(config, dtrain::init(dtrain::InitOptions{.backend = "self"}));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(result.samples, (std::vector<std::string>{"Hi!!!!!!", "Hi!!!!!!"}));
  fs::remove_all(dir);
}

}  // namespace
