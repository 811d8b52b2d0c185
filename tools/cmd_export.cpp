// attnres export hf --checkpoint DIR --out DIR [--dtype fp32|bf16]
//                   [--max-shard-size 5GB] [--force]
// A checkpoint as a Hugging Face model directory: the weights in safetensors
// (sharded with an index past --max-shard-size, as save_pretrained does),
// config.json with model_type "attnres" and auto_map, the PyTorch
// implementation (configuration_attnres.py, modeling_attnres.py: plain torch,
// transformers optional), generation_config.json, the checkpoint's tokenizer
// files as they are, and a README saying what each file is.
//
// The Python files are compiled into the binary (tools/embed_files.cmake,
// from python/attnres_hf/): an export needs nothing but the binary, and its
// code is always the model function of the binary that wrote the weights.
#include <cctype>
#include <cstring>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/fileio.h"
#include "core/log.h"
#include "core/safetensors.h"
#include "data/bpe.h"
#include "data/tokenizer_file.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/hf_python_files.h"
#include "train/checkpoint.h"

namespace attnres::tools {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kHelp =
    "usage: attnres export hf --checkpoint DIR --out DIR [--dtype fp32|bf16]\n"
    "                         [--max-shard-size 5GB] [--special text|allow] [--force]\n"
    "  Writes a Hugging Face model directory: model.safetensors (or model-0000i-of-0000n\n"
    "  shards + model.safetensors.index.json past --max-shard-size), config.json\n"
    "  (model_type \"attnres\", auto_map), configuration_attnres.py, modeling_attnres.py,\n"
    "  generation_config.json, the checkpoint's tokenizer files and README.md.\n"
    "  bf16 rounds the fp32 weights to nearest even. --special: what transformers'\n"
    "  tokenizer does with the text <|endoftext|> inside a text, as `attnres tokenize\n"
    "  --special` does: text (default: encoded byte by byte, tokenizer_config.json's\n"
    "  split_special_tokens true) or allow (the token's id). --force replaces an earlier export in\n"
    "  --out. Load with torch alone (AttnResForCausalLM.from_pretrained) or with\n"
    "  transformers (AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)).";

// "5GB", "500MB", "2GiB", "1000000" -> bytes (decimal units as Hugging Face's
// max_shard_size, binary with an i).
int64_t parse_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i), unit = text.substr(i);
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(number, &used);
    if (used != number.size()) value = -1;
  } catch (...) {
    value = -1;
  }
  static const std::pair<const char*, double> units[] = {
      {"", 1},     {"B", 1},      {"KB", 1e3},          {"MB", 1e6},          {"GB", 1e9},
      {"KiB", 1024}, {"MiB", 1048576}, {"GiB", 1073741824}};
  for (const auto& [name, scale] : units)
    if (unit == name && value > 0) return static_cast<int64_t>(value * scale);
  fail("export: --max-shard-size needs a size such as 5GB, 500MB or 2GiB, got '", text, "'");
}

// A MoE layer's tensors under Kimi Linear's names (its modeling_kimi.py):
// block_sparse_moe.{gate, shared_experts} for mlp.{gate, shared_experts}, and
// a routed expert's w1 / w3 / w2 for its gate / up / down projections. A
// dense layer's mlp.* and every other name are unchanged.
std::string kimi_moe_name(const std::string& name) {
  const std::string mlp = ".mlp.";
  const size_t at = name.find(mlp);
  if (at == std::string::npos) return name;
  std::string rest = name.substr(at + mlp.size());
  const bool routed = rest.rfind("experts.", 0) == 0;
  if (!routed && rest.rfind("gate.", 0) != 0 && rest.rfind("shared_experts.", 0) != 0) return name;
  if (routed)
    for (const auto& [ours, kimi] : {std::pair<const char*, const char*>{"gate_proj.", "w1."},
                                     {"up_proj.", "w3."}, {"down_proj.", "w2."}}) {
      const size_t p = rest.find(ours);
      if (p != std::string::npos) rest.replace(p, std::strlen(ours), kimi);
    }
  return name.substr(0, at) + ".block_sparse_moe." + rest;
}

// The weights in files of at most `max_bytes` each (a larger tensor gets a
// file of its own); one file is model.safetensors, several are
// model-0000i-of-0000n.safetensors plus the index Hugging Face reads.
void write_weights(const fs::path& out, const std::vector<NamedTensor>& tensors, int64_t max_bytes) {
  std::vector<std::vector<NamedTensor>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const NamedTensor& t : tensors) {
    const auto bytes = static_cast<int64_t>(t.tensor.nbytes());
    if (!shards.back().empty() && in_shard + bytes > max_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += bytes;
    total += bytes;
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (shards.size() == 1) {
    write_safetensors((out / "model.safetensors").string(), tensors, meta);
    return;
  }
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_safetensors((out / name).string(), shards[i], meta);
    for (const NamedTensor& t : shards[i]) weight_map[t.name] = name;
  }
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_text_file_atomic((out / "model.safetensors.index.json").string(), index.dump(2) + "\n");
}

// The output directory: new, empty, or (with --force) an earlier export,
// whose weight files go first so no stale shard survives.
void prepare_out(const fs::path& out, const fs::path& checkpoint, bool force) {
  if (fs::exists(out)) {
    if (!fs::is_directory(out)) fail("export: --out '", out.string(), "' is not a directory");
    if (fs::equivalent(out, checkpoint))
      fail("export: --out is the checkpoint itself; choose another directory");
    if (!fs::is_empty(out)) {
      if (!force)
        fail("export: --out '", out.string(), "' is not empty (pass --force to replace an "
             "earlier export there)");
      // What this export may not write again: weight shards of another
      // count, tokenizer files of another format.
      for (const auto& e : fs::directory_iterator(out)) {
        const std::string n = e.path().filename().string();
        if ((n.rfind("model", 0) == 0 && n.find(".safetensors") != std::string::npos) ||
            n == "tokenizer.json" || n == "attnres_tokenizer.json" || n == "tokenizer_config.json")
          fs::remove(e.path());
      }
    }
  }
  fs::create_directories(out);
}

std::string readme(const json& config, const std::vector<std::string>& tokenizer_files,
                   const std::string& tokenizer_format) {
  std::string tok;
  if (tokenizer_files.empty()) {
    tok = "No tokenizer: the checkpoint carried none (set data.tokenizer when training).\n";
  } else {
    tok = "Tokenizer: ";
    for (const auto& f : tokenizer_files) tok += "`" + f + "` ";
    tok += "in the `" + tokenizer_format + "` format, copied from the checkpoint as it was. ";
    if (tokenizer_format == "attnres-bpe")
      tok += "attnres-bpe is attnres's own byte-level BPE JSON (`type`, `vocab_size`, `merges`, "
             "`special`; see the attnres repository's src/data/bpe.h), not a Hugging Face "
             "tokenizers file (hence not named tokenizer.json): encode text with `attnres "
             "tokenize` or `attnres score`. Token ids "
             "0-255 are the bytes, id 256+i joins the two ids of merge i, the last id is "
             "<|endoftext|>.\n";
    else
      tok += "It is Hugging Face's tokenizer.json form of a byte-level BPE with GPT-2's "
             "pre-tokenizer regex (GPT-2's own vocabulary when the model was trained on GPT-2 "
             "tokens); <|endoftext|> is its end-of-text token. The text <|endoftext|> inside a "
             "text is encoded " +
             std::string(config["attnres"]["tokenizer"]["special"] == "text"
                             ? "as ordinary text (tokenizer_config.json's split_special_tokens "
                               "true; `attnres tokenize --special text`, tiktoken's "
                               "encode_ordinary). The tokenizers library alone "
                               "(Tokenizer.from_file) does not read tokenizer_config.json: set "
                               "its encode_special_tokens = True for the same ids"
                             : "as the token (split_special_tokens false; `attnres tokenize "
                               "--special allow`, tiktoken's allowed_special=\"all\")") +
             ".\n";
  }
  return "# attnres model (Hugging Face export)\n\n"
         "A language model trained by attnres with Attention Residuals (residual mode `" +
         config["attn_res"]["mode"].get<std::string>() +
         "`). Files:\n\n"
         "- `config.json`: the model's hyper-parameters (Llama field names), `attn_res` (residual "
         "mode and block size) and `auto_map`.\n"
         "- `model.safetensors` (or `model-0000i-of-0000n.safetensors` with "
         "`model.safetensors.index.json`): the weights, dtype `" +
         config["torch_dtype"].get<std::string>() +
         "`.\n"
         "- `configuration_attnres.py`, `modeling_attnres.py`: the model in plain PyTorch, "
         "with a KV cache for generation; transformers is optional.\n"
         "- `generation_config.json`: the end-of-text token.\n\n" +
         tok +
         "\nLoading, with torch alone:\n\n"
         "    import sys; sys.path.insert(0, \"THIS_DIR\")\n"
         "    from modeling_attnres import AttnResForCausalLM\n"
         "    model = AttnResForCausalLM.from_pretrained(\"THIS_DIR\")\n\n"
         "or with transformers:\n\n"
         "    from transformers import AutoModelForCausalLM\n"
         "    model = AutoModelForCausalLM.from_pretrained(\"THIS_DIR\", trust_remote_code=True)\n\n"
         "The model was trained on documents that start with <|endoftext|> (id `bos_token_id`): "
         "start a prompt with it. `model.generate_tokens(ids, max_new_tokens)` decodes greedily "
         "with the KV cache (temperature / top_k sample).\n";
}

// What Kimi Linear's own modeling code (modeling_kimi.py) would compute
// differently from these weights: the README says it, so that nobody loads
// them there and takes the result for this model.
std::string kimi_differences(const model::ModelConfig& m) {
  if (!m.has_kda() && !m.has_mla()) return "";
  std::string s =
      "\n## Kimi Linear\n\n`config.json` has Kimi Linear's fields (`model_type` `kimi_linear`, "
      "`linear_attn_config`, the MLA dims, Kimi's MoE names, the MoE tensors under "
      "`block_sparse_moe.`), and `auto_map` loads this directory's modeling code, which computes "
      "what attnres trained. Kimi's own `modeling_kimi.py` would compute another function:\n\n";
  if (m.attnres())
    s += "- the residual connections: this model reads Attention Residuals (`attn_res`), Kimi's "
         "code adds every sublayer into one stream and has no `attn_res.query` tensors;\n";
  if (m.has_mla())
    s += "- the MLA latent norm `kv_a_layernorm`: epsilon `rms_norm_eps` here, Kimi's code builds "
         "it with its RMSNorm's default 1e-6;\n";
  if (m.has_mla() && m.mla.rope)
    s += "- RoPE on the dr dims (`mla_use_nope` false) is attnres's rotate-half convention;\n";
  if (!m.has_mla())
    s += "- the softmax layers are grouped-query attention with RoPE (`q_proj`, `k_proj`, "
         "`v_proj`, `o_proj`), where Kimi's are MLA;\n";
  if (m.has_moe())
    s += "- the router: attnres's choice (`topk_method`, `moe_capacity_factor`) and its "
         "renormalised weights as `modeling_attnres.py` writes them out;\n";
  return s;
}

}  // namespace

int cmd_export(const Args& args) {
  if (args.empty()) {
    std::fprintf(stderr, "%s\n", kHelp);
    return 2;
  }
  if (args[0] == "--help" || args[0] == "-h") {
    std::puts(kHelp);
    return 0;
  }
  if (args[0] != "hf") fail("export: unknown format '", args[0], "' (known: hf)");
  Flags f(Args(args.begin() + 1, args.end()), "export",
          {"checkpoint", "out", "dtype", "max-shard-size", "special"}, {"help", "force"});
  if (f.has("help")) {
    std::puts(kHelp);
    return 0;
  }
  if (!f.positional().empty()) fail("export: unexpected argument '", f.positional()[0], "'");
  const fs::path dir = f.required("checkpoint", "export");
  const fs::path out = f.required("out", "export");
  const std::string dtype_name = f.get("dtype", "fp32");
  if (dtype_name != "fp32" && dtype_name != "bf16")
    fail("export: --dtype must be fp32 or bf16, got '", dtype_name, "'");
  const bool bf16 = dtype_name == "bf16";
  const int64_t max_shard = parse_size(f.get("max-shard-size", "5GB"));
  const std::string special = f.get("special", "text");
  // Hugging Face's tokenizers either split the special token's text or turn it
  // into the token; nothing there refuses it as tiktoken's encode() does.
  if (data::parse_specials(special, "export: --special") == data::Specials::Refuse)
    fail("export: --special refuse has no Hugging Face equivalent (its tokenizers encode the "
         "text <|endoftext|> as text or as the token, never refuse it): choose text or allow");

  // The weights, through the loader every command uses (it verifies the
  // checkpoint's manifest first), in the checkpoint's parameter order.
  const train::Config cfg = train::config_from_checkpoint(dir.string());
  model::Model model(cfg.model, DType::F32);
  train::load_weights(dir.string(), model);
  const json state = json::parse(read_text_file((dir / "state.json").string()));
  std::vector<NamedTensor> tensors;
  const bool kimi = cfg.model.has_kda() || cfg.model.has_mla();
  auto name_of = [&](const std::string& n) { return kimi ? kimi_moe_name(n) : n; };
  for (const auto& p : model.params().all())
    tensors.push_back({name_of(p.name), bf16 ? p.weights().to(DType::BF16) : p.weights()});
  // Model state (a MoE router's e_score_correction_bias): fp32 in either
  // dtype, since it decides the choice of experts and bf16 would move ties.
  for (const auto& p : model.state().all()) tensors.push_back({name_of(p.name), p.weights()});

  std::vector<std::string> tok_files, tok_names;
  std::string tok_format;
  int64_t tok_vocab = 0;
  int32_t eot = -1;
  tok_files = data::checkpoint_tokenizer_files(dir.string());
  if (!tok_files.empty()) {
    tok_format = data::tokenizer_format(tok_files[0]);
    const auto tok = data::open_tokenizer(tok_files[0], "export");
    eot = tok.eot();
    tok_vocab = tok.vocab_size();
    if (tok_vocab > cfg.model.vocab_size)
      fail("export: the checkpoint's tokenizer has ", tok_vocab, " tokens but the model's "
           "vocab_size is ", cfg.model.vocab_size);
  } else {
    spdlog::warn("export: the checkpoint carries no tokenizer (data.tokenizer was not set): the "
                 "export has none, and no bos/eos token ids");
  }
  // Our own BPE format is not a Hugging Face tokenizers file: under the name
  // tokenizer.json, transformers would try to load it and fail ("Tokenizer
  // must contain a \"model\" property"), so it gets a name of its own.
  for (const auto& p : tok_files)
    tok_names.push_back(tok_format == "attnres-bpe" && fs::path(p).filename() == "tokenizer.json"
                            ? "attnres_tokenizer.json"
                            : fs::path(p).filename().string());

  json config = train::hf_config(cfg.model);
  config["architectures"] = {"AttnResForCausalLM"};
  // A Kimi Linear hybrid keeps Kimi's model_type (hf_config); its code is
  // ours all the same (auto_map), since Kimi's computes another function.
  if (!kimi) config["model_type"] = "attnres";
  config["auto_map"] = {{"AutoConfig", "configuration_attnres.AttnResConfig"},
                        {"AutoModelForCausalLM", "modeling_attnres.AttnResForCausalLM"}};
  config["torch_dtype"] = bf16 ? "bfloat16" : "float32";
  config["max_position_embeddings"] = cfg.training.seq_len;  // trained length (RoPE has no limit)
  config["use_cache"] = true;
  json generation = json::object();
  if (eot >= 0) {
    config["bos_token_id"] = eot;
    config["eos_token_id"] = eot;
    generation["bos_token_id"] = eot;
    generation["eos_token_id"] = eot;
    // Ids past the tokenizer's (a vocabulary padded for speed) decode to
    // nothing: never generated, as by `attnres generate`.
    if (tok_vocab < cfg.model.vocab_size) {
      json ids = json::array();
      for (int64_t i = tok_vocab; i < cfg.model.vocab_size; ++i) ids.push_back(i);
      generation["suppress_tokens"] = ids;
    }
  }
  config["attnres"] = {{"checkpoint_step", state.value("step", int64_t{0})},
                       {"tokenizer", {{"files", tok_names}, {"format", tok_format},
                                      {"vocab_size", tok_vocab}, {"special", special}}}};
  // transformers' settings for a Hugging Face tokenizer.json (our own format
  // has none): the end-of-text token, exact decoding, and what the text
  // <|endoftext|> becomes: split_special_tokens = true encodes it as text
  // (PreTrainedTokenizerFast sets the tokenizers library's
  // encode_special_tokens from it), false as the token.
  const bool hf_tokenizer = !tok_files.empty() && tok_format != "attnres-bpe";
  json tok_config;
  if (hf_tokenizer) {
    const std::string eot_text = data::BpeTokenizer::kEotText;
    tok_config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                  {"bos_token", eot_text},
                  {"eos_token", eot_text},
                  {"add_bos_token", false},
                  {"add_eos_token", false},
                  {"clean_up_tokenization_spaces", false},
                  {"model_max_length", cfg.training.seq_len},
                  {"split_special_tokens", special == "text"}};
  }

  prepare_out(out, dir, f.has("force"));
  write_weights(out, tensors, max_shard);
  write_text_file_atomic((out / "config.json").string(), config.dump(2) + "\n");
  write_text_file_atomic((out / "generation_config.json").string(), generation.dump(2) + "\n");
  for (const EmbeddedFile& e : kHfPythonFiles)
    write_file_atomic((out / e.name).string(), e.data, e.size);
  for (size_t i = 0; i < tok_files.size(); ++i)
    fs::copy_file(tok_files[i], out / tok_names[i], fs::copy_options::overwrite_existing);
  if (hf_tokenizer)
    write_text_file_atomic((out / "tokenizer_config.json").string(), tok_config.dump(2) + "\n");
  write_text_file_atomic((out / "README.md").string(),
                         readme(config, tok_names, tok_format) + kimi_differences(cfg.model));
  spdlog::info("exported {} ({} tensors, {}) to {}", dir.string(), tensors.size(), dtype_name,
               out.string());
  return 0;
}

}  // namespace attnres::tools
