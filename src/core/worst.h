// The largest of a set of errors, where a NaN is larger than every number.
//
// A comparison reduces many element errors to the worst one and checks it
// against a tolerance; a NaN anywhere must make that check fail. The obvious
// folds lose it: `if (!(e <= worst)) worst = e` keeps a NaN only until the
// next finite e replaces it (!(0.1 <= NaN) is true), and std::max(worst, e)
// drops a NaN e outright, so a NaN survived only as the last element. Every
// such fold in the tests and in `attnres inspect compare` goes through here.
// (Header-only, in core: the tests and the tools both use it, and neither may
// depend on the other.)
#pragma once

#include <cmath>

namespace attnres {

// Whether error `e` replaces `worst`, the largest seen so far: when it is
// larger or NaN, unless `worst` is already NaN (a NaN, once seen, stays).
inline bool worse(double e, double worst) { return !std::isnan(worst) && !(e <= worst); }

// max(worst, e) with NaN above every number: fold with worst = nan_max(worst, e).
inline double nan_max(double worst, double e) { return worse(e, worst) ? e : worst; }

}  // namespace attnres
