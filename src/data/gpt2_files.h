// Byte-level BPE vocabularies in the files other tools write:
//   GPT-2's pair   encoder.json (token -> id) + vocab.bpe ("#version" line,
//                  then one merge "left right" per line, rank order)
//   Hugging Face   tokenizer.json with model.type "BPE" and the ByteLevel
//                  pre-tokenizer (model.vocab, model.merges, added_tokens)
// Both spell a token's bytes as printable characters: byte b is the character
// byte_char(b) (GPT-2's bytes_to_unicode table), so "Ġthe" is " the".
// Special tokens (<|endoftext|>) are spelled literally.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "data/bpe.h"

namespace attnres::data {

// The code point that stands for byte `b` in GPT-2's files: the printable
// Latin-1 bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for
// themselves; the other 68 bytes, in increasing order, get U+0100, U+0101, ...
uint32_t byte_char(unsigned char b);

// GPT-2's two files: encoder.json already parsed from `encoder_path`, and the
// vocab.bpe at `vocab_bpe_path`. Errors name the file (and the line or token)
// and the reason.
BpeVocabulary read_gpt2_vocabulary(const nlohmann::json& encoder, const std::string& encoder_path,
                                   const std::string& vocab_bpe_path);

// A Hugging Face tokenizer.json already parsed from `path` (named in errors).
// Refused, with the reason: other models (WordPiece, Unigram), pre-tokenizers
// other than GPT-2's ByteLevel regex, a normalizer, prefix spaces, subword
// prefixes/suffixes, ignore_merges and dropout.
BpeVocabulary read_hf_vocabulary(const nlohmann::json& j, const std::string& path);

// `v` as a Hugging Face tokenizer.json (byte-level BPE with GPT-2's regex):
// what read_hf_vocabulary reads back (laid out as Hugging Face writes it).
std::string hf_tokenizer_json(const BpeVocabulary& v);

}  // namespace attnres::data
