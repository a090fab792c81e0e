// The data loader needs MPI_THREAD_MULTIPLE (its threads call MPI while the trainer does): MPI
// initialised with a lower level is an Error that names the level it got and the one it needs,
// before any collective. Its own binary, because the level is fixed once per process.
#include <gtest/gtest.h>

#include <mpi.h>

#include <string>

#include "kernels/base/error.h"
#include "data/loader/exchange.h"

namespace packbert {
namespace {

TEST(LoaderThreadLevel, BelowMultipleIsAnErrorNamingTheLevels) {
  int provided = 0;
  ASSERT_EQ(MPI_Query_thread(&provided), MPI_SUCCESS);
  ASSERT_EQ(provided, MPI_THREAD_SERIALIZED) << "main() asked for MPI_THREAD_SERIALIZED";
  try {
    LoaderComm comm(MPI_COMM_WORLD, nullptr);
    FAIL() << "the loader's communicator was made at MPI_THREAD_SERIALIZED";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("MPI was initialised with MPI_THREAD_SERIALIZED"), std::string::npos)
        << what;
    EXPECT_NE(what.find("needs MPI_THREAD_MULTIPLE"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace packbert

// gtest_main is not used: MPI is initialised at a level below the loader's.
int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
