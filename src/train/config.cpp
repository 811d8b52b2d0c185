#include "train/config.h"

#include <fstream>
#include <set>
#include <sstream>

#include "core/device.h"
#include "core/error.h"

namespace attnres::train {

namespace {

const char* json_type(const json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

// Reads the keys of one JSON object section, type-checking each, and rejects
// keys nobody asked for (typos must not be silently ignored).
class Section {
 public:
  Section(const json& j, std::string path, const std::string& source)
      : j_(j), path_(std::move(path)), source_(source) {
    if (!j_.is_object())
      fail(source_, ": config key '", path_, "' must be an object, got ", json_type(j_));
  }
  std::string key(const char* k) const { return path_.empty() ? k : path_ + "." + k; }

  void get(const char* k, int64_t& out) {
    if (const json* v = find(k)) {
      if (!v->is_number_integer()) wrong(k, *v, "an integer");
      out = v->get<int64_t>();
    }
  }
  void get(const char* k, uint64_t& out) {
    if (const json* v = find(k)) {
      if (!v->is_number_integer() || v->get<int64_t>() < 0) wrong(k, *v, "a non-negative integer");
      out = v->get<uint64_t>();
    }
  }
  void get(const char* k, double& out) {
    if (const json* v = find(k)) {
      if (!v->is_number()) wrong(k, *v, "a number");
      out = v->get<double>();
    }
  }
  void get(const char* k, bool& out) {
    if (const json* v = find(k)) {
      if (!v->is_boolean()) wrong(k, *v, "true or false");
      out = v->get<bool>();
    }
  }
  void get(const char* k, std::string& out) {
    if (const json* v = find(k)) {
      if (!v->is_string()) wrong(k, *v, "a string");
      out = v->get<std::string>();
    }
  }
  const json* sub(const char* k) { return find(k); }

  // Every key present must have been read.
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!seen_.count(it.key()))
        fail(source_, ": unknown config key '", key(it.key().c_str()), "'");
  }

 private:
  const json* find(const char* k) {
    seen_.insert(k);
    auto it = j_.find(k);
    return it == j_.end() ? nullptr : &*it;
  }
  [[noreturn]] void wrong(const char* k, const json& v, const char* expected) const {
    fail(source_, ": config key '", key(k), "' must be ", expected, ", got ", json_type(v), " ",
         v.dump());
  }
  const json& j_;
  std::string path_;
  const std::string& source_;
  std::set<std::string> seen_;
};

model::ResidualMode parse_mode(const std::string& s, const std::string& source) {
  if (s == "baseline") return model::ResidualMode::Baseline;
  if (s == "full") return model::ResidualMode::Full;
  if (s == "block") return model::ResidualMode::Block;
  fail(source, ": config key 'model.residual.mode': unknown residual mode \"", s,
       "\" (expected baseline, full or block)");
}

}  // namespace

Config Config::from_json(const json& j, const std::string& source) {
  Config c;
  Section root(j, "", source);
  static const json empty = json::object();
  auto section = [&](const char* name) -> const json& {
    const json* v = root.sub(name);
    return v ? *v : empty;
  };

  {
    Section s(section("model"), "model", source);
    auto& m = c.model;
    s.get("vocab_size", m.vocab_size);
    s.get("d_model", m.d_model);
    s.get("n_layers", m.n_layers);
    s.get("n_heads", m.n_heads);
    m.n_kv_heads = 0;
    s.get("n_kv_heads", m.n_kv_heads);
    if (m.n_kv_heads == 0 && !s.sub("n_kv_heads")) m.n_kv_heads = m.n_heads;  // default: MHA
    s.get("d_ff", m.d_ff);
    s.get("norm_eps", m.norm_eps);
    s.get("rope_theta", m.rope_theta);
    s.get("tie_embeddings", m.tie_embeddings);
    s.get("init_from", m.init_from);
    if (const json* r = s.sub("residual")) {
      Section rs(*r, "model.residual", source);
      std::string mode = "baseline";
      rs.get("mode", mode);
      m.mode = parse_mode(mode, source);
      rs.get("block_size", m.block_size);
      rs.get("n_blocks", m.n_blocks);
      rs.finish();
    }
    s.finish();
  }
  {
    Section s(section("optimizer"), "optimizer", source);
    auto& o = c.optimizer;
    s.get("lr", o.lr);
    s.get("beta1", o.beta1);
    s.get("beta2", o.beta2);
    s.get("eps", o.eps);
    s.get("weight_decay", o.weight_decay);
    s.get("grad_clip", o.grad_clip);
    s.finish();
  }
  {
    Section s(section("schedule"), "schedule", source);
    auto& o = c.schedule;
    s.get("type", o.type);
    s.get("warmup_steps", o.warmup_steps);
    s.get("min_lr_ratio", o.min_lr_ratio);
    s.get("decay_ratio", o.decay_ratio);
    s.finish();
  }
  {
    Section s(section("training"), "training", source);
    auto& t = c.training;
    s.get("steps", t.steps);
    s.get("micro_batch_size", t.micro_batch_size);
    s.get("seq_len", t.seq_len);
    s.get("grad_accum", t.grad_accum);
    s.get("seed", t.seed);
    s.get("device", t.device);
    s.get("precision", t.precision);
    s.get("peak_tflops", t.peak_tflops);
    s.finish();
  }
  {
    Section s(section("data"), "data", source);
    s.get("train", c.data.train);
    s.get("val", c.data.val);
    s.get("tokenizer", c.data.tokenizer);
    s.get("shuffle", c.data.shuffle);
    s.finish();
  }
  {
    Section s(section("parallel"), "parallel", source);
    s.get("pipeline", c.parallel.pipeline);
    s.get("virtual_stages", c.parallel.virtual_stages);
    s.get("data", c.parallel.data);
    s.get("cache_blocks", c.parallel.cache_blocks);
    s.get("transport", c.parallel.transport);
    s.finish();
  }
  {
    Section s(section("checkpoint"), "checkpoint", source);
    s.get("dir", c.checkpoint.dir);
    s.get("every", c.checkpoint.every);
    s.get("keep_last", c.checkpoint.keep_last);
    s.get("resume", c.checkpoint.resume);
    s.get("save_initial", c.checkpoint.save_initial);
    s.finish();
  }
  {
    Section s(section("eval"), "eval", source);
    s.get("every", c.eval.every);
    s.get("batches", c.eval.batches);
    s.finish();
  }
  {
    Section s(section("run"), "run", source);
    s.get("dir", c.run.dir);
    s.get("log_every", c.run.log_every);
    s.get("stop_after", c.run.stop_after);
    s.get("depth_stats_every", c.run.depth_stats_every);
    s.finish();
  }
  root.finish();
  return c;
}

json Config::to_json() const {
  json residual = {{"mode", model::residual_mode_name(model.mode)}};
  if (model.block_size > 0) residual["block_size"] = model.block_size;
  if (model.n_blocks > 0) residual["n_blocks"] = model.n_blocks;
  json m = {{"vocab_size", model.vocab_size}, {"d_model", model.d_model},
            {"n_layers", model.n_layers},     {"n_heads", model.n_heads},
            {"n_kv_heads", model.n_kv_heads}, {"d_ff", model.d_ff},
            {"norm_eps", model.norm_eps},     {"rope_theta", model.rope_theta},
            {"tie_embeddings", model.tie_embeddings}, {"residual", residual}};
  if (!model.init_from.empty()) m["init_from"] = model.init_from;
  return {
      {"model", m},
      {"optimizer", {{"lr", optimizer.lr}, {"beta1", optimizer.beta1}, {"beta2", optimizer.beta2},
                     {"eps", optimizer.eps}, {"weight_decay", optimizer.weight_decay},
                     {"grad_clip", optimizer.grad_clip}}},
      {"schedule", {{"type", schedule.type}, {"warmup_steps", schedule.warmup_steps},
                    {"min_lr_ratio", schedule.min_lr_ratio}, {"decay_ratio", schedule.decay_ratio}}},
      {"training", {{"steps", training.steps}, {"micro_batch_size", training.micro_batch_size},
                    {"seq_len", training.seq_len}, {"grad_accum", training.grad_accum},
                    {"seed", training.seed}, {"device", training.device},
                    {"precision", training.precision}, {"peak_tflops", training.peak_tflops}}},
      {"data", {{"train", data.train}, {"val", data.val}, {"tokenizer", data.tokenizer},
                {"shuffle", data.shuffle}}},
      {"parallel", {{"pipeline", parallel.pipeline}, {"virtual_stages", parallel.virtual_stages},
                    {"data", parallel.data}, {"cache_blocks", parallel.cache_blocks},
                    {"transport", parallel.transport}}},
      {"checkpoint", {{"dir", checkpoint.dir}, {"every", checkpoint.every},
                      {"keep_last", checkpoint.keep_last}, {"resume", checkpoint.resume},
                      {"save_initial", checkpoint.save_initial}}},
      {"eval", {{"every", eval.every}, {"batches", eval.batches}}},
      {"run", {{"dir", run.dir}, {"log_every", run.log_every}, {"stop_after", run.stop_after},
               {"depth_stats_every", run.depth_stats_every}}},
  };
}

void Config::validate() const {
  model.validate();
  auto positive = [](int64_t v, const char* key) {
    if (v <= 0) fail("config key ", key, ": must be a positive integer, got ", v);
  };
  auto non_negative = [](int64_t v, const char* key) {
    if (v < 0) fail("config key ", key, ": must be >= 0, got ", v);
  };
  positive(training.steps, "training.steps");
  positive(training.micro_batch_size, "training.micro_batch_size");
  positive(training.seq_len, "training.seq_len");
  positive(training.grad_accum, "training.grad_accum");
  if (training.device != "cpu" && training.device != "cuda")
    fail("config key training.device: unknown device \"", training.device, "\" (cpu or cuda)");
  if (training.device == "cuda" && !cuda::compiled())
    fail("config key training.device: \"cuda\", but this build has no CUDA backend (nvcc was not "
         "found when it was configured); use \"cpu\" or rebuild with the CUDA toolkit");
  if (training.precision != "fp32" && training.precision != "bf16")
    fail("config key training.precision: unknown precision \"", training.precision,
         "\" (fp32 or bf16)");
  if (training.precision == "bf16" && training.device == "cpu")
    fail("config key training.precision: bf16 is a CUDA precision; the CPU trains in fp32");

  if (!(training.peak_tflops >= 0))
    fail("config key training.peak_tflops: must be >= 0 (0 = from the GPU's name), got ",
         training.peak_tflops);

  if (!(optimizer.lr > 0)) fail("config key optimizer.lr: must be > 0, got ", optimizer.lr);
  if (!(optimizer.beta1 >= 0 && optimizer.beta1 < 1))
    fail("config key optimizer.beta1: must be in [0, 1), got ", optimizer.beta1);
  if (!(optimizer.beta2 >= 0 && optimizer.beta2 < 1))
    fail("config key optimizer.beta2: must be in [0, 1), got ", optimizer.beta2);
  if (!(optimizer.eps > 0)) fail("config key optimizer.eps: must be > 0, got ", optimizer.eps);
  if (!(optimizer.weight_decay >= 0))
    fail("config key optimizer.weight_decay: must be >= 0, got ", optimizer.weight_decay);
  if (!(optimizer.grad_clip >= 0))
    fail("config key optimizer.grad_clip: must be >= 0 (0 disables), got ", optimizer.grad_clip);

  if (schedule.type != "constant" && schedule.type != "cosine" && schedule.type != "wsd")
    fail("config key schedule.type: unknown schedule \"", schedule.type,
         "\" (constant, cosine or wsd)");
  non_negative(schedule.warmup_steps, "schedule.warmup_steps");
  if (!(schedule.min_lr_ratio >= 0 && schedule.min_lr_ratio <= 1))
    fail("config key schedule.min_lr_ratio: must be in [0, 1], got ", schedule.min_lr_ratio);
  if (!(schedule.decay_ratio >= 0 && schedule.decay_ratio <= 1))
    fail("config key schedule.decay_ratio: must be in [0, 1], got ", schedule.decay_ratio);

  if (data.train.empty()) fail("config key data.train: missing (a shard file, directory or glob)");

  positive(parallel.pipeline, "parallel.pipeline");
  positive(parallel.virtual_stages, "parallel.virtual_stages");
  positive(parallel.data, "parallel.data");
  if (parallel.pipeline * parallel.virtual_stages > model.n_layers)
    fail("config key parallel.pipeline: pipeline * virtual_stages = ",
         parallel.pipeline * parallel.virtual_stages, " chunks exceed model.n_layers = ",
         model.n_layers);
  if (parallel.virtual_stages > 1 && parallel.pipeline == 1)
    fail("config key parallel.virtual_stages: ", parallel.virtual_stages,
         " virtual stages need parallel.pipeline > 1 (they interleave chunks across pipeline ranks)");
  if (parallel.transport != "auto" && parallel.transport != "mpi" && parallel.transport != "nccl")
    fail("config key parallel.transport: unknown transport \"", parallel.transport,
         "\" (auto, mpi or nccl)");
  if (parallel.transport == "nccl" && training.device != "cuda")
    fail("config key parallel.transport: \"nccl\" moves device memory and needs "
         "training.device = \"cuda\" (use \"mpi\" or \"auto\" on the cpu)");
  if (parallel.virtual_stages > 1 && training.grad_accum % parallel.pipeline != 0)
    fail("config key training.grad_accum: the interleaved schedule (virtual_stages > 1) needs "
         "grad_accum (microbatches) divisible by parallel.pipeline = ", parallel.pipeline,
         ", got ", training.grad_accum);

  non_negative(checkpoint.every, "checkpoint.every");
  non_negative(checkpoint.keep_last, "checkpoint.keep_last");
  if (checkpoint.resume.empty())
    fail("config key checkpoint.resume: must be \"never\", \"auto\" or a checkpoint directory");
  if (checkpoint.resume == "auto" && checkpoint.dir.empty())
    fail("config key checkpoint.resume: \"auto\" needs checkpoint.dir");
  non_negative(eval.every, "eval.every");
  positive(eval.batches, "eval.batches");
  if (eval.every > 0 && data.val.empty())
    fail("config key data.val: missing, but eval.every = ", eval.every, " asks for evaluation");
  positive(run.log_every, "run.log_every");
  non_negative(run.stop_after, "run.stop_after");
  non_negative(run.depth_stats_every, "run.depth_stats_every");
  if (run.dir.empty()) fail("config key run.dir: must not be empty");
}

void apply_override(json& j, const std::string& arg) {
  std::string a = arg;
  if (a.rfind("--", 0) != 0) fail("override '", arg, "': expected --section.key=value");
  a = a.substr(2);
  auto eq = a.find('=');
  if (eq == std::string::npos || eq == 0)
    fail("override '", arg, "': expected --section.key=value");
  std::string path = a.substr(0, eq), text = a.substr(eq + 1);
  json value;
  try {
    value = json::parse(text);
  } catch (const json::parse_error&) {
    value = text;  // a bare string such as --data.train=foo/*.bin
  }
  json* node = &j;
  std::stringstream ss(path);
  std::string part, walked;
  std::vector<std::string> parts;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) fail("override '", arg, "': empty key component");
    walked += (i ? "." : "") + parts[i];
    if (i + 1 == parts.size()) {
      (*node)[parts[i]] = value;
    } else {
      json& next = (*node)[parts[i]];
      if (next.is_null()) next = json::object();
      if (!next.is_object()) fail("override '", arg, "': config key '", walked, "' is not a section");
      node = &next;
    }
  }
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path);
  if (!f) fail(path, ": cannot open config file");
  json j;
  try {
    j = json::parse(f, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
  for (const auto& o : overrides) apply_override(j, o);
  Config c = Config::from_json(j, path);
  c.validate();
  return c;
}

}  // namespace attnres::train
