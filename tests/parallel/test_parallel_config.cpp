// Validation of the parallel.* keys (train/config.cpp) and what the trainer
// refuses before any work when the job does not match the layout.
#include <catch2/catch.hpp>

#include "config_testing.h"
#include "core/error.h"
#include "parallel/mpi.h"
#include "temp_dir.h"
#include "train/config.h"
#include "train/trainer.h"

using namespace attnres;
using train::Config;
using train::json;

using testing::config_error;

namespace {

// 8 layers and 4 microbatches per step: room for the pipeline layouts below.
json base() {
  json j = testing::small_config(8, 3);
  j["training"]["grad_accum"] = 4;
  return j;
}

}  // namespace

TEST_CASE("parallel keys: valid layouts pass, impossible ones name the key", "[config]") {
  json j = base();
  j["parallel"] = {{"pipeline", 4}, {"virtual_stages", 2}, {"data", 2}, {"cache_blocks", false}};
  CHECK(config_error(j).empty());
  j["parallel"] = {{"pipeline", 4}, {"virtual_stages", 3}};  // 12 chunks > 8 layers
  CHECK_THAT(config_error(j), Catch::Contains("exceed model.n_layers"));
  j["parallel"] = {{"pipeline", 3}, {"virtual_stages", 2}};  // 4 microbatches % 3
  CHECK_THAT(config_error(j), Catch::Contains("training.grad_accum"));
  j["parallel"] = {{"pipeline", 1}, {"virtual_stages", 2}};
  CHECK_THAT(config_error(j), Catch::Contains("parallel.virtual_stages"));
  j["parallel"] = {{"data", 0}};
  CHECK_THAT(config_error(j), Catch::Contains("parallel.data"));
  j["parallel"] = {{"transport", "gloo"}};
  CHECK_THAT(config_error(j), Catch::Contains("parallel.transport"));
  j["parallel"] = {{"transport", "nccl"}};  // on the cpu
  CHECK_THAT(config_error(j), Catch::Contains("training.device"));
  j["parallel"] = {{"transport", "mpi"}, {"pipeline", 2}};
  CHECK(config_error(j).empty());
  // The resolved config carries the key and round-trips.
  Config c = Config::from_json(j, "cfg");
  CHECK(c.to_json()["parallel"]["transport"] == "mpi");
  CHECK(Config::from_json(c.to_json(), "again").to_json() == c.to_json());
}

TEST_CASE("P*D > 1 without mpirun is refused before any work", "[config]") {
  if (parallel::launcher_world_size() > 1) return;  // this binary runs alone in ctest
  testing::TempDir dir;
  json j = base();
  j["parallel"] = {{"pipeline", 2}, {"data", 2}};
  j["checkpoint"] = {{"dir", dir / "ck"}};
  j["run"] = {{"dir", dir / "run"}};
  Config c = Config::from_json(j, "cfg");
  c.validate();
  CHECK_THROWS_WITH(train::train(c), Catch::Contains("mpirun -np 4"));
  CHECK(dir.entries() == 0);  // nothing written
}
