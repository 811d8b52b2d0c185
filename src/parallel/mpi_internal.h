// Private to src/parallel: the raw MPI handles behind Comm, and the bounded
// wait every MPI request goes through. Included only by MPI-aware sources.
#pragma once
#if ATTNRES_HAVE_MPI
#include <mpi.h>

#include <string>

#include "parallel/mpi.h"

namespace attnres::parallel {

struct Comm::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;  // MPI_Comm_free on destruction
};

inline MPI_Comm raw(const Comm& c) { return c.impl() ? c.impl()->comm : MPI_COMM_NULL; }

// Throws attnres::Error naming `what` and the MPI error string.
void mpi_check(int rc, const char* what);

// Poll `req` until it completes. Spins briefly, then sleeps between polls so
// that ranks sharing cores with compute don't burn them; throws
// attnres::Error naming `what` after comm_timeout_seconds().
void wait_bounded(MPI_Request& req, const std::string& what, MPI_Status* status = nullptr);

}  // namespace attnres::parallel
#endif
