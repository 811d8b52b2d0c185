#include <catch2/catch.hpp>
#include <algorithm>
#include <cstring>

#include "core/rng.h"
#include "data/bpe.h"
#include "temp_dir.h"

using namespace attnres;
using namespace attnres::data;
using namespace attnres::testing;
using Catch::Contains;

namespace {

// A few KB of plain English for training and compression checks.
const char* kEnglish = R"(The village stood at the edge of a wide valley, where the river turned slowly
toward the sea. In the spring the fields were green and the orchards were full of white blossom, and
in the autumn the farmers brought their apples and their grain to the market in the square. The
market opened early in the morning and closed late in the evening, and on market days the whole
village seemed to be awake before the sun.

The children of the village went to a small school near the church. Their teacher was a patient
woman who had lived in the valley all her life. She taught them to read and to write, to count and
to measure, and she told them stories about the mountains, the river and the people who had lived
there long before them. "Remember," she would say, "that every road you walk was made by someone
who walked it first." The children did not always understand her, but they remembered her words.

Every year, when the harvest was over, the village held a festival. There was music in the square
and dancing in the streets, and the long tables were covered with bread, cheese, fruit and wine.
The old men played cards under the trees, the women talked about the weather and the prices at the
market, and the young people danced until the stars came out. It was the happiest time of the year,
and nobody wanted it to end.

But the valley was changing. A new road had been built across the hills, and trucks now carried
the apples to the city in a few hours instead of a few days. Some of the young people left to find
work in the factories and the offices of the city, and they did not come back. The school had fewer
children every year, and the teacher wondered how long it would remain open. She wrote letters to
the government, and she spoke to the mayor, but nobody could tell her what would happen.

One evening in the late summer, a stranger arrived in the village. He was a tall man with a grey
coat and a small leather bag, and he asked at the inn for a room. He said that he was a painter and
that he had come to paint the valley before it changed forever. The innkeeper gave him the room at
the top of the stairs, with a window that looked over the orchards toward the river. Every morning
the painter walked out into the fields with his bag, and every evening he came back with his hands
covered in paint. He did not talk much, but he smiled at the children and he listened to the old
men when they told him about the valley as it had been when they were young.

When the painter left, at the end of the autumn, he gave the school one of his paintings. It showed
the village in the morning light, with the market in the square and the river shining in the
distance. The teacher hung it on the wall of the classroom, and the children looked at it every day.
Many years later, when the school had closed and the children had grown up and gone away, people
still came to the village to see the painting, and to walk the roads that someone had walked first.
)";

// Reference encoder: apply every merge in order to the whole chunk, left to
// right -- exactly what training does. Slow and obviously correct.
std::vector<int32_t> reference_encode(const BpeTokenizer& tok, std::string_view text) {
  std::vector<int32_t> out;
  for (std::string_view chunk : split_chunks(text)) {
    std::vector<int32_t> s;
    for (unsigned char c : chunk) s.push_back(c);
    for (size_t r = 0; r < tok.merges().size(); ++r) {
      const auto [a, b] = tok.merges()[r];
      std::vector<int32_t> next;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          next.push_back(256 + static_cast<int32_t>(r));
          i += 2;
        } else {
          next.push_back(s[i++]);
        }
      }
      s.swap(next);
    }
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

std::string random_bytes(uint64_t seed, size_t n, bool ascii_heavy) {
  std::string s(n, '\0');
  const char* alphabet = "  aaeeiioouu tnsrhld'\n\t.,!?0123456789-sSTREV";
  const size_t alen = std::strlen(alphabet);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = random_u64(seed, 3, i);
    s[i] = ascii_heavy && (r & 3) ? alphabet[(r >> 8) % alen] : static_cast<char>(r >> 16);
  }
  return s;
}

std::vector<std::string> to_strings(const std::vector<std::string_view>& v) {
  return std::vector<std::string>(v.begin(), v.end());
}

}  // namespace

TEST_CASE("split_chunks follows the GPT-2 pre-tokenization rule", "[data]") {
  using V = std::vector<std::string>;
  CHECK(to_strings(split_chunks("Hello world")) == V{"Hello", " world"});
  CHECK(to_strings(split_chunks("it's they'll we're I'd")) == V{"it", "'s", " they", "'ll", " we", "'re", " I", "'d"});
  CHECK(to_strings(split_chunks("a  b")) == V{"a", " ", " b"});
  CHECK(to_strings(split_chunks("a\n\nb")) == V{"a", "\n", "\n", "b"});
  CHECK(to_strings(split_chunks("a \n b")) == V{"a", " \n", " b"});
  CHECK(to_strings(split_chunks("x   ")) == V{"x", "   "});
  CHECK(to_strings(split_chunks("in 1999, $5!")) == V{"in", " 1999", ",", " $", "5", "!"});
  CHECK(to_strings(split_chunks("caf\xc3\xa9 na\xc3\xafve")) == V{"caf\xc3\xa9", " na\xc3\xafve"});
  CHECK(to_strings(split_chunks("?!'s")) == V{"?!'", "s"});
  CHECK(split_chunks("").empty());
  // Chunks always concatenate back to the input.
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::string s = random_bytes(seed, 300, seed % 2 == 0);
    std::string joined;
    for (auto c : split_chunks(s)) {
      CHECK_FALSE(c.empty());
      joined += c;
    }
    CHECK(joined == s);
  }
}

TEST_CASE("BPE training gives the requested vocabulary and is deterministic", "[data]") {
  const std::vector<std::string> docs = {kEnglish, "A second, much shorter document."};
  int progress_calls = 0, last_done = 0;
  const BpeTokenizer tok = BpeTokenizer::train(docs, 400, [&](int done, int total) {
    ++progress_calls;
    CHECK(total == 400 - 257);
    CHECK(done == last_done + 1);
    last_done = done;
  });
  CHECK(tok.vocab_size() == 400);
  CHECK(tok.num_merges() == 400 - 257);
  CHECK(tok.eot() == 399);
  CHECK(tok.token_bytes(399) == "<|endoftext|>");
  CHECK(tok.token_bytes('a') == "a");
  CHECK(progress_calls == 143);
  // The first merge is the most frequent pair of the text.
  CHECK(tok.token_bytes(256).size() == 2);
  // Every merged token is the concatenation of its parts.
  for (int r = 0; r < tok.num_merges(); ++r) {
    const auto [a, b] = tok.merges()[r];
    CHECK(a < 256 + r);
    CHECK(b < 256 + r);
    CHECK(tok.token_bytes(256 + r) == tok.token_bytes(a) + tok.token_bytes(b));
  }
  const BpeTokenizer again = BpeTokenizer::train(docs, 400);
  CHECK(again.merges() == tok.merges());

  REQUIRE_THROWS_WITH(BpeTokenizer::train(docs, 256), Contains("at least 257"));
  REQUIRE_THROWS_WITH(tok.token_bytes(400), Contains("400"));
}

TEST_CASE("BPE training stops early when the text runs out of pairs", "[data]") {
  const BpeTokenizer tok = BpeTokenizer::train({"abab ab"}, 1000);
  // "abab" -> (a,b) then (ab,ab); " ab" -> ( ,a)... a handful of merges at most.
  CHECK(tok.num_merges() < 10);
  CHECK(tok.vocab_size() == 257 + tok.num_merges());
  CHECK(tok.decode(tok.encode("abab ab")) == "abab ab");
  CHECK(tok.encode("abab").size() == 1);
}

TEST_CASE("BPE round trips any bytes and matches the reference encoder", "[data]") {
  const BpeTokenizer tok = BpeTokenizer::train({kEnglish}, 600);
  for (uint64_t seed = 0; seed < 30; ++seed) {
    // Half mostly-ASCII text, half arbitrary bytes (invalid UTF-8, NULs).
    const std::string s = random_bytes(seed, 1 + seed * 37, seed % 2 == 0);
    const std::vector<int32_t> ids = tok.encode(s);
    CHECK(tok.decode(ids) == s);
    CHECK(ids == reference_encode(tok, s));
  }
  const std::string text(kEnglish);
  CHECK(tok.decode(tok.encode(text)) == text);
  CHECK(tok.encode(text) == reference_encode(tok, text));
  // Long chunks (no cache, heap merge path) and repeated pairs.
  const std::string longword(5000, 'e');
  CHECK(tok.decode(tok.encode(longword)) == longword);
  CHECK(tok.encode(longword) == reference_encode(tok, longword));
  const std::string letters = "thethethethethethethethethethethethethethethethethethethethethethethethethe"
                              "thethethethethethethethethethethethethethethethethethethethethe";
  CHECK(tok.encode(letters) == reference_encode(tok, letters));
  CHECK(tok.encode("").empty());
  CHECK(tok.decode(std::vector<int32_t>{}).empty());
  // The text "<|endoftext|>" is ordinary text; only callers insert EOT.
  const auto special = tok.encode("<|endoftext|>");
  CHECK(std::find(special.begin(), special.end(), tok.eot()) == special.end());
  CHECK(tok.decode(std::vector<int32_t>{tok.eot()}) == "<|endoftext|>");
  REQUIRE_THROWS_WITH(tok.decode(std::vector<int32_t>{1, 600}), Contains("600"));
  REQUIRE_THROWS(tok.decode(std::vector<int32_t>{-1}));
}

TEST_CASE("BPE compresses English", "[data]") {
  const BpeTokenizer tok = BpeTokenizer::train({kEnglish}, 512);
  const std::string text(kEnglish);
  const size_t n = tok.encode(text).size();
  INFO("bytes " << text.size() << " tokens " << n);
  CHECK(n < text.size() / 2);
}

TEST_CASE("BPE save/load round trip and rejection of bad files", "[data]") {
  TempDir dir;
  const BpeTokenizer tok = BpeTokenizer::train({kEnglish}, 450);
  const std::string path = dir.file("tok.json");
  tok.save(path);
  const BpeTokenizer loaded = BpeTokenizer::load(path);
  CHECK(loaded.vocab_size() == tok.vocab_size());
  CHECK(loaded.eot() == tok.eot());
  CHECK(loaded.merges() == tok.merges());
  const std::string text = std::string(kEnglish) + random_bytes(5, 500, false);
  CHECK(loaded.encode(text) == tok.encode(text));
  for (int32_t id = 0; id < tok.vocab_size(); ++id) CHECK(loaded.token_bytes(id) == tok.token_bytes(id));

  const std::string good = read_bytes(path);
  const std::string bad = dir.file("bad.json");
  auto rejects = [&](const std::string& content, const char* why) {
    write_bytes(bad, content);
    REQUIRE_THROWS_WITH(BpeTokenizer::load(bad), Contains(bad) && Contains(why));
  };
  rejects("this is not json at all", "not valid JSON");
  rejects(good.substr(0, good.size() / 2), "not valid JSON");  // truncated
  rejects("", "not valid JSON");
  rejects("[1, 2]", "JSON object");
  rejects(R"({"type":"other","version":1,"vocab_size":257,"merges":[],"special":{"<|endoftext|>":256}})", "type");
  rejects(R"({"type":"attnres-bpe","version":2,"vocab_size":257,"merges":[],"special":{"<|endoftext|>":256}})",
          "version");
  rejects(R"({"type":"attnres-bpe","version":1,"vocab_size":258,"merges":[[1,300]],"special":{"<|endoftext|>":257}})",
          "merge 0");
  rejects(R"({"type":"attnres-bpe","version":1,"vocab_size":259,"merges":[[1,2],[1,2]],"special":{"<|endoftext|>":258}})",
          "repeats");
  rejects(R"({"type":"attnres-bpe","version":1,"vocab_size":300,"merges":[[1,2]],"special":{"<|endoftext|>":257}})",
          "vocab_size");
  rejects(R"({"type":"attnres-bpe","version":1,"vocab_size":258,"merges":[[1,2]],"special":{"<|endoftext|>":3}})",
          "special");
  rejects(R"({"type":"attnres-bpe","version":1,"vocab_size":258,"merges":[[1,"x"]],"special":{"<|endoftext|>":257}})",
          "merge 0");
  REQUIRE_THROWS_WITH(BpeTokenizer::load(dir.file("missing.json")), Contains("missing.json"));

  // The smallest valid file: no merges.
  write_bytes(bad, R"({"type":"attnres-bpe","version":1,"vocab_size":257,"merges":[],"special":{"<|endoftext|>":256}})");
  CHECK(BpeTokenizer::load(bad).vocab_size() == 257);
}
