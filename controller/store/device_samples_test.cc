// Store's device samples: idempotent ingestion on (trial, attempt, seq), the fence of stale
// attempts, and downsampling: the last kDeviceSampleWindow one reading per row, older readings
// merged into kDeviceSampleBucket rows, the same however the readings arrive.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>

#include "controller/store/store.h"

namespace llmctl::store {
namespace {

// A bucket boundary, so that the expected buckets are easy to count.
const Time kStart = Time(std::chrono::milliseconds(1'700'000'000'000));
const Time kNow = kStart;

class DeviceSamplesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "llmctl-samples-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A store with experiment "e" of trials "a" and "b", "a" running its first attempt.
  std::unique_ptr<Store> OpenWithRunningTrial(const std::string& name) {
    auto store = Store::Open((dir_ / name).string());
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    if (!store.ok()) return nullptr;
    NewExperiment experiment;
    experiment.name = "e";
    experiment.filename = "e.yaml";
    experiment.yaml_text = "model: tiny\n";
    for (const char* name : {"a", "b"}) {
      NewTrial trial;
      trial.name = name;
      trial.config_json = R"({"model":"tiny"})";
      trial.device_type = "cuda";
      experiment.trials.push_back(trial);
    }
    auto id = (*store)->CreateExperiment(experiment, kNow);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    experiment_id_ = *id;
    trial_id_ = (*(*store)->ListTrials(*id))[0].id;
    EXPECT_EQ(*(*store)->StartAttempt(trial_id_, "n", kNow, {0}), 1);
    return std::move(*store);
  }

  std::filesystem::path dir_;
  int64_t experiment_id_ = 0;
  int64_t trial_id_ = 0;
};

// Reading `seq` of a GPU, one a second from kStart: utilisation 40 and 60 in turn (a mean of 50),
// memory growing by 1 MiB a second, 300 W or 320 W, the temperature rising a degree a minute.
NewDeviceSample GpuReading(int64_t seq, std::string device = "cuda:0") {
  DeviceSample sample;
  sample.device = std::move(device);
  sample.time = kStart + std::chrono::seconds(seq - 1);
  sample.utilization_percent = seq % 2 == 0 ? 60.0 : 40.0;
  sample.memory_used_bytes = seq << 20;
  sample.memory_total_bytes = int64_t{80} << 30;
  sample.power_watts = seq % 2 == 0 ? 320.0 : 300.0;
  sample.temperature_celsius = 40.0 + static_cast<double>(seq / 60);
  return NewDeviceSample{.seq = seq, .sample = sample};
}

std::vector<NewDeviceSample> GpuReadings(int64_t first, int64_t last) {
  std::vector<NewDeviceSample> readings;
  for (int64_t seq = first; seq <= last; ++seq) readings.push_back(GpuReading(seq));
  return readings;
}

// An attempt of `trial` on two nodes, n1 and n2, each on its cuda:0.
StatusOr<int64_t> StartTwoNodeAttempt(Store& store, int64_t trial) {
  return store.StartMultiNodeAttempt(
      trial,
      {{.node_rank = 0, .node = "n1", .device_indices = {0}, .ended = false},
       {.node_rank = 1, .node = "n2", .device_indices = {0}, .ended = false}},
      kNow);
}

// A multi-node attempt's nodes each number their own readings of their own cuda:0: each node's
// are kept apart, from its own cursor, and merged per node.
TEST_F(DeviceSamplesTest, EachNodeOfAMultiNodeAttemptKeepsItsOwnReadings) {
  std::unique_ptr<Store> store = OpenWithRunningTrial("db");
  ASSERT_NE(store, nullptr);
  const int64_t trial = (*store->ListTrials(experiment_id_))[1].id;
  auto attempt = StartTwoNodeAttempt(*store, trial);
  ASSERT_TRUE(attempt.ok()) << attempt.status().ToString();
  // Past the window on both nodes, so that older readings are merged.
  constexpr int64_t kReadings = 700;
  EXPECT_EQ(*store->AppendDeviceSamples(trial, *attempt, GpuReadings(1, kReadings - 2), 0),
            kReadings - 2);
  EXPECT_EQ(*store->AppendDeviceSamples(trial, *attempt, GpuReadings(1, kReadings), 1), kReadings);
  EXPECT_EQ(*store->AppendDeviceSamples(trial, *attempt, GpuReadings(1, kReadings), 1), 0);
  EXPECT_EQ(*store->LastDeviceSampleSeq(trial, *attempt, 0), kReadings - 2);
  EXPECT_EQ(*store->LastDeviceSampleSeq(trial, *attempt, 1), kReadings);
  EXPECT_EQ(store->AppendDeviceSamples(trial, *attempt, GpuReadings(1, 1), 2).status().code(),
            StatusCode::kInvalidArgument);

  const std::vector<DeviceSample> latest = *store->LatestDeviceSamples(trial, *attempt);
  ASSERT_EQ(latest.size(), 2u);
  EXPECT_EQ(latest[0].node_rank, 0);
  EXPECT_EQ(latest[0].memory_used_bytes, (kReadings - 2) << 20);
  EXPECT_EQ(latest[1].node_rank, 1);
  EXPECT_EQ(latest[1].memory_used_bytes, kReadings << 20);
  std::map<int64_t, int64_t> readings;  // node rank -> readings over its rows
  const std::vector<DeviceSample> rows = *store->DeviceSamples(experiment_id_, "b");
  for (const DeviceSample& row : rows) {
    readings[row.node_rank] += row.count;
  }
  EXPECT_EQ(readings[0], kReadings - 2);
  EXPECT_EQ(readings[1], kReadings);
}

TEST_F(DeviceSamplesTest, IngestionIsIdempotentOnTrialAttemptAndSeq) {
  std::unique_ptr<Store> store = OpenWithRunningTrial("db");
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->LastDeviceSampleSeq(trial_id_, 1), 0);
  EXPECT_EQ(*store->AppendDeviceSamples(trial_id_, 1, GpuReadings(1, 3)), 3);
  EXPECT_EQ(*store->AppendDeviceSamples(trial_id_, 1, GpuReadings(1, 3)), 0);
  // A stream resumed from an older position.
  EXPECT_EQ(*store->AppendDeviceSamples(trial_id_, 1, GpuReadings(2, 5)), 2);
  EXPECT_EQ(*store->LastDeviceSampleSeq(trial_id_, 1), 5);

  StatusOr<std::vector<DeviceSample>> samples = store->DeviceSamples(experiment_id_, "a");
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  ASSERT_EQ(samples->size(), 5u);
  for (int64_t seq = 1; seq <= 5; ++seq) {
    DeviceSample expected = GpuReading(seq).sample;
    expected.attempt = 1;
    EXPECT_EQ((*samples)[seq - 1], expected) << "reading " << seq;
  }
  EXPECT_TRUE(store->DeviceSamples(experiment_id_, "b")->empty());
  EXPECT_EQ(store->DeviceSamples(experiment_id_, "c").status().code(), StatusCode::kNotFound);
}

TEST_F(DeviceSamplesTest, StaleAttemptsAndBadReadingsAreRefusedWhole) {
  std::unique_ptr<Store> store = OpenWithRunningTrial("db");
  ASSERT_NE(store, nullptr);
  std::vector<NewDeviceSample> readings = GpuReadings(1, 3);
  readings[2].sample.memory_used_bytes = readings[2].sample.memory_total_bytes + 1;
  StatusOr<int64_t> refused = store->AppendDeviceSamples(trial_id_, 1, readings);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("device sample 3 "), std::string::npos)
      << refused.status().ToString();
  readings[2] = GpuReading(3);
  readings[1].sample.utilization_percent = std::nan("");
  EXPECT_EQ(store->AppendDeviceSamples(trial_id_, 1, readings).status().code(),
            StatusCode::kInvalidArgument);
  readings[1] = GpuReading(2);
  readings[0].sample.device = "";
  EXPECT_EQ(store->AppendDeviceSamples(trial_id_, 1, readings).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(store->DeviceSamples(experiment_id_, "a")->empty());
  EXPECT_EQ(*store->LastDeviceSampleSeq(trial_id_, 1), 0);

  ASSERT_TRUE(store->MarkAttemptLost(trial_id_, 1, kNow).ok());
  EXPECT_EQ(store->AppendDeviceSamples(trial_id_, 1, GpuReadings(1, 3)).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_EQ(*store->StartAttempt(trial_id_, "m", kNow, {1}), 2);
  EXPECT_EQ(store->AppendDeviceSamples(trial_id_, 1, GpuReadings(1, 3)).status().code(),
            StatusCode::kFailedPrecondition);
  // The new attempt counts its readings from 1 again, in its own samples file.
  EXPECT_EQ(*store->AppendDeviceSamples(trial_id_, 2, GpuReadings(1, 3)), 3);
  EXPECT_EQ(*store->LastDeviceSampleSeq(trial_id_, 2), 3);
}

// A utilisation or power past any device's is refused, finite as it is: a bucket's merged row is
// its readings' mean, and two readings near a double's limit summed to an infinite one.
TEST_F(DeviceSamplesTest, AFigurePastAnyDevicesIsRefusedAndNoMergedRowIsInfinite) {
  std::unique_ptr<Store> store = OpenWithRunningTrial("db");
  ASSERT_NE(store, nullptr);
  std::vector<NewDeviceSample> readings = GpuReadings(1, 700);
  for (NewDeviceSample& reading : readings) {
    reading.sample.utilization_percent = std::numeric_limits<double>::max();
  }
  StatusOr<int64_t> refused = store->AppendDeviceSamples(trial_id_, 1, readings);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
  readings = GpuReadings(1, 700);
  readings[5].sample.power_watts = kMaxDeviceSampleFigure * 2;
  EXPECT_EQ(store->AppendDeviceSamples(trial_id_, 1, readings).status().code(),
            StatusCode::kInvalidArgument);
  const StatusOr<std::vector<DeviceSample>> stored = store->DeviceSamples(experiment_id_, "a");
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  for (const DeviceSample& sample : *stored) {
    EXPECT_TRUE(std::isfinite(*sample.utilization_percent));
    EXPECT_TRUE(std::isfinite(*sample.power_watts));
  }

  // The bound itself is a reading like any other, and merges to itself.
  for (NewDeviceSample& reading : readings) {
    reading.sample.utilization_percent = kMaxDeviceSampleFigure;
    reading.sample.power_watts = kMaxDeviceSampleFigure;
  }
  ASSERT_EQ(*store->AppendDeviceSamples(trial_id_, 1, readings), 700);
  const DeviceSample first_bucket = store->DeviceSamples(experiment_id_, "a")->front();
  EXPECT_EQ(first_bucket.count, 10);
  EXPECT_EQ(*first_bucket.utilization_percent, kMaxDeviceSampleFigure);
  EXPECT_EQ(*first_bucket.power_watts, kMaxDeviceSampleFigure);
}

TEST_F(DeviceSamplesTest, ReadingsOlderThanTheWindowAreMergedIntoBuckets) {
  std::unique_ptr<Store> store = OpenWithRunningTrial("db");
  ASSERT_NE(store, nullptr);
  // 15 minutes and 5 seconds of readings: the newest at 904 s, so the window starts at 304 s and
  // the whole buckets before it, [0, 300 s), are merged: 30 buckets of 10 readings.
  constexpr int64_t kReadings = 905;
  ASSERT_EQ(*store->AppendDeviceSamples(trial_id_, 1, GpuReadings(1, kReadings)), kReadings);

  StatusOr<std::vector<DeviceSample>> samples = store->DeviceSamples(experiment_id_, "a");
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  ASSERT_EQ(samples->size(), 30u + (kReadings - 300));
  for (int bucket = 0; bucket < 30; ++bucket) {
    const DeviceSample& merged = (*samples)[bucket];
    SCOPED_TRACE("bucket " + std::to_string(bucket));
    EXPECT_EQ(merged.time, kStart + std::chrono::seconds(10 * bucket));
    EXPECT_EQ(merged.count, 10);
    EXPECT_DOUBLE_EQ(*merged.utilization_percent, 50.0);
    EXPECT_DOUBLE_EQ(*merged.power_watts, 310.0);
    // The highest memory and temperature: the bucket's last reading's (seq 10 * bucket + 10).
    EXPECT_EQ(merged.memory_used_bytes, GpuReading(10 * bucket + 10).sample.memory_used_bytes);
    EXPECT_EQ(*merged.temperature_celsius,
              *GpuReading(10 * bucket + 10).sample.temperature_celsius);
  }
  for (size_t i = 30; i < samples->size(); ++i) {
    EXPECT_EQ((*samples)[i].count, 1);
    EXPECT_EQ((*samples)[i].time, kStart + std::chrono::seconds(300 + (i - 30)));
  }
  const int64_t readings =
      std::accumulate(samples->begin(), samples->end(), int64_t{0},
                      [](int64_t sum, const DeviceSample& s) { return sum + s.count; });
  EXPECT_EQ(readings, kReadings);  // none lost, none counted twice

  // Arriving a few at a time (merging as the run goes on) gives the same rows.
  std::unique_ptr<Store> incremental = OpenWithRunningTrial("incremental-db");
  ASSERT_NE(incremental, nullptr);
  for (int64_t first = 1; first <= kReadings; first += 7) {
    ASSERT_TRUE(
        incremental
            ->AppendDeviceSamples(trial_id_, 1, GpuReadings(first, std::min(first + 6, kReadings)))
            .ok());
  }
  EXPECT_EQ(*incremental->DeviceSamples(experiment_id_, "a"), *samples);
}

TEST_F(DeviceSamplesTest, MergedUtilisationIsTheMeanOfTheReadingsThatHaveOne) {
  std::unique_ptr<Store> store = OpenWithRunningTrial("db");
  ASSERT_NE(store, nullptr);
  std::vector<NewDeviceSample> readings = GpuReadings(1, 700);
  // A CPU's first reading has no utilisation (there is no earlier one to measure against).
  readings[0].sample.utilization_percent.reset();
  readings[0].sample.power_watts.reset();
  ASSERT_TRUE(store->AppendDeviceSamples(trial_id_, 1, readings).ok());
  const DeviceSample first_bucket = store->DeviceSamples(experiment_id_, "a")->front();
  EXPECT_EQ(first_bucket.count, 10);
  // Readings 2..10: five of 60 (even) and four of 40.
  EXPECT_DOUBLE_EQ(*first_bucket.utilization_percent, (5 * 60.0 + 4 * 40.0) / 9);
  EXPECT_DOUBLE_EQ(*first_bucket.power_watts, (5 * 320.0 + 4 * 300.0) / 9);
}

TEST_F(DeviceSamplesTest, LatestSamplesAreEachDevicesNewestRow) {
  std::unique_ptr<Store> store = OpenWithRunningTrial("db");
  ASSERT_NE(store, nullptr);
  std::vector<NewDeviceSample> readings;
  for (int64_t tick = 1; tick <= 3; ++tick) {
    for (int device = 0; device < 2; ++device) {
      NewDeviceSample reading = GpuReading(tick, "cuda:" + std::to_string(device));
      reading.seq = static_cast<int64_t>(readings.size()) + 1;
      reading.sample.memory_used_bytes += device;
      readings.push_back(reading);
    }
  }
  ASSERT_TRUE(store->AppendDeviceSamples(trial_id_, 1, readings).ok());
  StatusOr<std::vector<DeviceSample>> latest = store->LatestDeviceSamples(trial_id_, 1);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  ASSERT_EQ(latest->size(), 2u);
  EXPECT_EQ((*latest)[0].device, "cuda:0");
  EXPECT_EQ((*latest)[0].memory_used_bytes, 3 << 20);
  EXPECT_EQ((*latest)[1].device, "cuda:1");
  EXPECT_EQ((*latest)[1].memory_used_bytes, (3 << 20) + 1);
  EXPECT_EQ((*latest)[1].time, kStart + std::chrono::seconds(2));
  EXPECT_TRUE(store->LatestDeviceSamples(trial_id_, 2)->empty());
}

// An agent dates its readings by its node's clock, which NTP may step back: the latest reading is
// the last one taken (the highest seq), and the readings after the step stay one per row, the
// window ending at the last one taken.
TEST_F(DeviceSamplesTest, TheLatestReadingIsTheLastTakenThoughTheClockSteppedBack) {
  std::unique_ptr<Store> store = OpenWithRunningTrial("db");
  ASSERT_NE(store, nullptr);
  std::vector<NewDeviceSample> readings = GpuReadings(1, 8);
  for (int64_t seq = 4; seq <= 8; ++seq) {  // the clock stepped back 20 minutes after reading 3
    readings[seq - 1].sample.time = kStart - std::chrono::minutes(20) + std::chrono::seconds(seq);
  }
  ASSERT_EQ(*store->AppendDeviceSamples(trial_id_, 1, readings), 8);
  StatusOr<std::vector<DeviceSample>> latest = store->LatestDeviceSamples(trial_id_, 1);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  ASSERT_EQ(latest->size(), 1u);
  EXPECT_EQ((*latest)[0].memory_used_bytes, GpuReading(8).sample.memory_used_bytes);
  EXPECT_EQ((*latest)[0].time, readings[7].sample.time);
  const std::vector<DeviceSample> rows = *store->DeviceSamples(experiment_id_, "a");
  EXPECT_EQ(rows.size(), 8u);
  for (const DeviceSample& row : rows) EXPECT_EQ(row.count, 1);
}

// Each node's readings are dated by its own clock: a node whose clock is 15 minutes ahead does not
// make another's readings older than the window.
TEST_F(DeviceSamplesTest, EachNodesWindowEndsAtItsOwnLastReading) {
  std::unique_ptr<Store> store = OpenWithRunningTrial("db");
  ASSERT_NE(store, nullptr);
  const int64_t trial = (*store->ListTrials(experiment_id_))[1].id;
  auto attempt = StartTwoNodeAttempt(*store, trial);
  ASSERT_TRUE(attempt.ok()) << attempt.status().ToString();
  ASSERT_EQ(*store->AppendDeviceSamples(trial, *attempt, GpuReadings(1, 120), 0), 120);
  NewDeviceSample ahead = GpuReading(1);
  ahead.sample.time += std::chrono::minutes(15);
  ASSERT_EQ(*store->AppendDeviceSamples(trial, *attempt, std::vector{ahead}, 1), 1);
  ASSERT_EQ(*store->AppendDeviceSamples(trial, *attempt, GpuReadings(121, 121), 0), 1);
  const std::vector<DeviceSample> stored = *store->DeviceSamples(experiment_id_, "b");
  std::map<int64_t, int64_t> rows;  // node rank -> rows
  for (const DeviceSample& row : stored) {
    EXPECT_EQ(row.count, 1);
    ++rows[row.node_rank];
  }
  EXPECT_EQ(rows[0], 121);
  EXPECT_EQ(rows[1], 1);
}

// A store written before rows kept their reading's seq: its rows' dates decide which is latest
// until the attempt's next readings, which carry their seq, arrive.
TEST_F(DeviceSamplesTest, RowsOfAnEarlierSchemaAreOrderedByDateAndNewReadingsComeAfterThem) {
  const std::filesystem::path path = dir_ / "db";
  {
    std::unique_ptr<Store> store = OpenWithRunningTrial("db");
    ASSERT_NE(store, nullptr);
    ASSERT_EQ(*store->AppendDeviceSamples(trial_id_, 1, GpuReadings(1, 3)), 3);
  }
  // Back to the schema before the seq column (migration 15, followed by lost_runs' 16), reading 1
  // dated last.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const std::string sql =
      "DROP TABLE lost_runs; ALTER TABLE device_samples DROP COLUMN seq; "
      "UPDATE device_samples SET sampled_at = sampled_at + 60000 "
      "WHERE memory_used_bytes = " +
      std::to_string(GpuReading(1).sample.memory_used_bytes) + "; PRAGMA user_version = 14";
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);

  auto store = Store::Open(path.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::vector<DeviceSample> latest = *(*store)->LatestDeviceSamples(trial_id_, 1);
  ASSERT_EQ(latest.size(), 1u);
  EXPECT_EQ(latest[0].memory_used_bytes, GpuReading(1).sample.memory_used_bytes);
  NewDeviceSample next = GpuReading(4);
  next.sample.time = kStart;  // dated before every stored row
  ASSERT_EQ(*(*store)->AppendDeviceSamples(trial_id_, 1, std::vector{next}), 1);
  latest = *(*store)->LatestDeviceSamples(trial_id_, 1);
  ASSERT_EQ(latest.size(), 1u);
  EXPECT_EQ(latest[0].memory_used_bytes, GpuReading(4).sample.memory_used_bytes);
}

}  // namespace
}  // namespace llmctl::store
