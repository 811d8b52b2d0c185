// Raw text corpora -> documents -> token shards: the library side of
// `attnres tokenize`, kept here (not in tools/) so that it is unit-tested.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/bpe.h"

namespace attnres::data {

enum class CorpusFormat { Text, Brown };

// "text" or "brown"; anything else throws.
CorpusFormat parse_corpus_format(const std::string& name);

// Expands input paths into document files, in order: a file is itself, a
// directory means the regular files directly inside it, sorted by name.
// Hidden files are skipped; with Brown, so are the corpus' non-text files
// (README, CONTENTS, cats.txt, *.pickle, package.json). Throws if a path does
// not exist or nothing is found.
std::vector<std::string> list_corpus_files(const std::vector<std::string>& inputs, CorpusFormat format);

// One file = one document; Brown files are converted with brown_to_text.
std::string read_document(const std::string& path, CorpusFormat format);

struct EncodeOptions {
  std::string output_dir;
  std::string name = "corpus";
  double val_fraction = 0.1;           // the last fraction of documents, in [0, 1)
  int64_t shard_tokens = 100'000'000;  // tokens per shard at most
  Specials specials = Specials::Text;  // <|endoftext|> in a document: text, as llm.c's shards
};

struct EncodeSummary {
  int64_t documents = 0, train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int token_bytes = 0;
  std::vector<std::string> train_shards, val_shards;
  int64_t text_bytes = 0;       // bytes of text encoded
  double encode_seconds = 0;    // wall time spent encoding (on `threads` threads)
  int threads = 1;              // OpenMP threads that encoded
};

// Encodes `files` (one document each) into llm.c shards under
// opt.output_dir: <name>_val_000000.bin ... and <name>_train_000000.bin ...
// Every document is preceded by EOT (as in llm.c), so documents are separated
// by EOT and a shard may start or end mid-document. The validation split is
// the last round(val_fraction * documents) documents (at least one when
// val_fraction > 0 and there are two or more documents). Token size is 2 bytes
// when the vocabulary fits uint16, else 4. Older shards of the same name that
// this run did not rewrite are removed, so the directory holds exactly this
// corpus.
EncodeSummary encode_corpus(const BpeTokenizer& tokenizer, const std::vector<std::string>& files,
                            CorpusFormat format, const EncodeOptions& opt);

}  // namespace attnres::data
