// How a backward op stores an activation gradient it produces.
//
// Gradients flowing into one buffer from several consumers (a depth source
// read by many Mix ops, the normalised input u read by the q/k/v projections)
// must add up, so the ops accumulate by default. When an op is the only
// producer of a buffer, Store::Set lets it write instead: the caller skips
// zeroing the buffer (a full write pass) and the op skips reading it (a full
// read pass). Both give the same numbers as zeroing first and adding (x + 0
// == x); with Set the old contents, NaN included, are never read.
//
// Parameter gradients always accumulate (over microbatches).
#pragma once

namespace attnres::kernels {

enum class Store { Add, Set };

}  // namespace attnres::kernels
