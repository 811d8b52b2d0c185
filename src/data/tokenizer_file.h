// The one place where the commands (generate, score, eval, export) and the
// trainer (eval.tasks) open a tokenizer and find a checkpoint's tokenizer
// files. BpeTokenizer::load (data/bpe.h) reads every form: attnres-bpe JSON,
// a Hugging Face tokenizer.json of byte-level BPE, GPT-2's encoder.json +
// vocab.bpe.
#pragma once
#include <string>
#include <vector>

#include "data/bpe.h"

namespace attnres::data {

// The tokenizer stored at `path`. `what` says who needs it, for the error
// when the file is missing (e.g. "generate: --tokenizer", "config key
// data.tokenizer"); a damaged file is reported by the loader, naming it.
BpeTokenizer open_tokenizer(const std::string& path, const std::string& what);

// The files of checkpoint directory `dir` that make up its tokenizer (the
// trainer copies data.tokenizer there as tokenizer.json), as paths; empty
// when the checkpoint carries none.
std::vector<std::string> checkpoint_tokenizer_files(const std::string& dir);

// The format of the tokenizer file at `path`, as the HF export's config names
// it: "attnres-bpe" (our own vocabulary and pre-tokenizer, read by attnres),
// or "gpt2-byte-level-bpe" (GPT-2's regex: a Hugging Face tokenizer.json that
// the tokenizers library loads too); an error naming the file otherwise.
std::string tokenizer_format(const std::string& path);

}  // namespace attnres::data
