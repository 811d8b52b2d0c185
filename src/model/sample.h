// The next token `attnres generate` draws from one decoding step's logits.
#pragma once
#include <cstdint>
#include <vector>

namespace attnres::model {

// A draw from softmax(logits / temperature) restricted to the top_k largest
// logits and renormalised over them (top_k <= 0 or >= V: all V logits), by
// inverting the cumulative sum at u: the kept ids in order of decreasing logit,
// the first whose running sum of probabilities reaches u (the last kept id if
// rounding leaves the total just under u). u is uniform in (0, 1].
// temperature <= 0 is greedy: the argmax, the lowest id among equal maxima
// (u and top_k are then unused).
// Equal logits at the k-th place: exactly top_k ids are kept, every id with a
// larger logit and some of the tied ones; which of the tied ones (and the order
// of equal logits inside the kept set) is std::partial_sort's, which the
// standard leaves unspecified (the same for the same logits in one build).
int32_t sample_token(const std::vector<float>& logits, double temperature, int64_t top_k, double u);

// The uniform number that `attnres generate --seed seed` draws for its i-th
// generated token (counter-based, core/rng.h: no state, the same on every
// machine).
double sample_uniform(uint64_t seed, uint64_t i);

// generate's i-th token under `seed`: sample_token(..., sample_uniform(seed, i)).
int32_t sample_token(const std::vector<float>& logits, double temperature, int64_t top_k,
                     uint64_t seed, uint64_t i);

}  // namespace attnres::model
