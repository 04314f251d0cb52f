// The store on a filesystem that fills up while the controller holds it open (a tmpfs of the test's
// own; needs root to mount, else skips saying so, and `make test` fails on a skip it does not
// expect: tests/expected-skips.txt).
#include <gmock/gmock.h>
#include <sys/mount.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "controller/store/store_test_support.h"

namespace llmctl::store {
namespace {

using test_support::CreateTrials;
using test_support::kNow;
using test_support::StepEvent;

class StoreDiskTest : public test_support::StoreTest {
 protected:
  void SetUp() override {
    StoreTest::SetUp();
    mount_ = (dir_ / "data").string();
    std::filesystem::create_directories(mount_);
    if (::mount("tmpfs", mount_.c_str(), "tmpfs", 0, "size=4m,mode=0700") != 0) {
      mount_.clear();
      GTEST_SKIP() << "cannot mount a tmpfs (needs root: CAP_SYS_ADMIN)";
    }
  }
  void TearDown() override {
    if (!mount_.empty()) ::umount2(mount_.c_str(), MNT_DETACH);
    StoreTest::TearDown();
  }
  // Takes every byte the store's filesystem has left, with a file of the test's own.
  void FillFilesystem() {
    std::ofstream filler(FillerPath(), std::ios::binary);
    const std::string block(4096, 'x');
    while (filler.write(block.data(), static_cast<std::streamsize>(block.size()))) {
    }
  }
  std::string FillerPath() const { return mount_ + "/filler"; }

  std::string mount_;
};

// A trial's end that finds the disk full is refused whole, naming the database file and the
// system's reason (it said only "database or disk is full"), and is stored once there is room
// again, on the same connection: the daemon recovers without a restart.
TEST_F(StoreDiskTest, AnEndOnAFullDiskNamesTheFileAndIsStoredOnceThereIsRoom) {
  // No room kept free: the commit itself meets the full disk, as it does when another process
  // takes the room between the store's check and its write.
  std::unique_ptr<Store> store = OpenStore(/*keep_free_bytes=*/0);
  ASSERT_NE(store, nullptr);
  const int64_t trial = CreateTrials(*store, "exp", {"a"}).at(0);
  ASSERT_EQ(*store->StartAttempt(trial, "node-1", kNow), 1);
  const std::vector<Event> events = {StepEvent(1, 1)};
  ASSERT_TRUE(store->AppendEvents(trial, 1, events).ok());
  FillFilesystem();

  const Status full = store->FinishAttempt(trial, 1, TrialState::kOk, 0, "", kNow);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.ToString();
  EXPECT_THAT(full.message(), testing::HasSubstr(path_ + ": No space left on device"));
  EXPECT_EQ(store->GetTrial(trial)->state, TrialState::kRunning);

  std::filesystem::remove(FillerPath());
  const Status stored = store->FinishAttempt(trial, 1, TrialState::kOk, 0, "", kNow);
  EXPECT_TRUE(stored.ok()) << stored.ToString();
  EXPECT_EQ(store->GetTrial(trial)->state, TrialState::kOk);
  EXPECT_EQ(*store->LastSeq(trial, 1), 1);
}

}  // namespace
}  // namespace llmctl::store
