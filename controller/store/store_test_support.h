// What the store's tests (store_test.cc, node_registry_test.cc, report_queries_test.cc,
// report_views_test.cc) share: a fresh
// database per test, experiments and events to fill it with, and reads through a connection of the
// test's own.
#ifndef LLMCTL_CONTROLLER_STORE_STORE_TEST_SUPPORT_H_
#define LLMCTL_CONTROLLER_STORE_STORE_TEST_SUPPORT_H_

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/store/store.h"

namespace llmctl::store::test_support {

using json = nlohmann::json;

inline const Time kNow = Time(std::chrono::milliseconds(1'700'000'000'123));

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "llmctl-store-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    path_ = (dir_ / "data" / "llmctl.db").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Store> OpenStore(int64_t keep_free_bytes = kStoreKeepFreeBytes) {
    StatusOr<std::unique_ptr<Store>> store = Store::Open(path_, keep_free_bytes);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(*store) : nullptr;
  }

  // The one column of a statement's first row as an integer (NULL reads as 0), read through a
  // connection of the test's own (QueryRows).
  int64_t QueryInt(const std::string& sql);

  std::filesystem::path dir_;
  std::string path_;
};

inline NewTrial MakeTrial(std::string name, std::string device_type = "cpu", int64_t count = 1) {
  return NewTrial{.name = std::move(name),
                  .description = "",
                  .config_json = R"({"model":"tiny"})",
                  .expect = std::nullopt,
                  .device_type = std::move(device_type),
                  .device_count = count,
                  .prediction_json = std::nullopt};
}

// A data-parallel trial's config: `devices` ranks on each of its `nodes` nodes, the ranks the
// store takes events of (AppendEvents).
inline std::string DataParallelConfig(int64_t devices, int64_t nodes = 1) {
  return json{{"model", "tiny"}, {"strategy", "ddp"}, {"devices", devices}, {"nodes", nodes}}
      .dump();
}

inline NewExperiment MakeExperiment(std::string name, std::vector<std::string> trial_names) {
  NewExperiment experiment{.name = std::move(name),
                           .filename = "experiments/demo.yaml",
                           .yaml_text = "model: tiny\n",
                           .description = "a test",
                           .target = {{"flavor", "g1.h100.pci.1"}},
                           .trials = {},
                           .inputs = {{"data/train.jsonl", "sha256:abc"}}};
  for (std::string& trial : trial_names) experiment.trials.push_back(MakeTrial(std::move(trial)));
  return experiment;
}

// A snapshot event of `phase` with two categories and `allocated` bytes.
inline json Snapshot(int64_t step, const std::string& phase, int64_t allocated) {
  return {{"type", "snapshot"},
          {"step", step},
          {"micro_batch", 0},
          {"phase", phase},
          {"params_bytes", 10},
          {"grads_bytes", 20},
          {"allocated_bytes", allocated}};
}

// A snapshot event with every memory category, as llm-train writes it.
inline json FullSnapshot(int64_t step, int64_t micro_batch, const std::string& phase,
                         int64_t allocated, int64_t peak) {
  return {{"type", "snapshot"},
          {"step", step},
          {"micro_batch", micro_batch},
          {"phase", phase},
          {"params_bytes", 4000},
          {"grads_bytes", step == 0 && phase == "phase0_before_fwd" ? 0 : 4000},
          {"optim_device_bytes", 8004},
          {"optim_host_bytes", 0},
          {"other_bytes", allocated - 16004},
          {"allocated_bytes", allocated},
          {"peak_bytes", peak},
          {"reserved_bytes", allocated}};
}

inline Event MakeEvent(int64_t seq, const json& line) {
  return Event{.seq = seq, .type = line.at("type").get<std::string>(), .json = line.dump()};
}

inline Event StepEvent(int64_t seq, int64_t step, double loss = 1.0) {
  return MakeEvent(seq, {{"type", "step"}, {"step", step}, {"loss", loss}});
}

// Creates an experiment with the given trials and returns their ids in file order.
inline std::vector<int64_t> CreateTrials(Store& store, const std::string& name,
                                         std::vector<std::string> trial_names) {
  StatusOr<int64_t> id = store.CreateExperiment(MakeExperiment(name, std::move(trial_names)), kNow);
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  std::vector<int64_t> ids;
  if (!id.ok()) return ids;
  StatusOr<std::vector<TrialRecord>> trials = store.ListTrials(*id);
  EXPECT_TRUE(trials.ok()) << trials.status().ToString();
  for (const TrialRecord& trial : *trials) ids.push_back(trial.id);
  return ids;
}

inline NodeRecord RegisteredNode(std::string name) {
  return NodeRecord{.name = std::move(name),
                    .address = "127.0.0.2:7443",
                    .devices_json = "[]",
                    .last_seen = kNow,
                    .state = "connected",
                    .lease = std::nullopt};
}

// The rows of a query as JSON objects (column name → value), through a connection of the test's
// own, as the sqlite3 shell would read them.
inline std::vector<json> QueryRows(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK)
      << sql << ": " << sqlite3_errmsg(db);
  std::vector<json> rows;
  int rc = SQLITE_DONE;
  while (stmt != nullptr && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    json& row = rows.emplace_back(json::object());
    for (int i = 0; i < sqlite3_column_count(stmt); ++i) {
      json& cell = row[sqlite3_column_name(stmt, i)];
      switch (sqlite3_column_type(stmt, i)) {
        case SQLITE_INTEGER:
          cell = sqlite3_column_int64(stmt, i);
          break;
        case SQLITE_FLOAT:
          cell = sqlite3_column_double(stmt, i);
          break;
        case SQLITE_TEXT:
          cell = reinterpret_cast<const char*>(sqlite3_column_text(stmt, i));
          break;
        default:
          cell = nullptr;
      }
    }
  }
  if (stmt != nullptr) {
    EXPECT_EQ(rc, SQLITE_DONE) << sql << ": " << sqlite3_errmsg(db);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return rows;
}

inline int64_t StoreTest::QueryInt(const std::string& sql) {
  const std::vector<json> rows = QueryRows(path_, sql);
  EXPECT_FALSE(rows.empty()) << sql;
  if (rows.empty() || rows[0].empty() || rows[0].begin()->is_null()) return 0;
  return rows[0].begin()->get<int64_t>();
}

inline json ResultEvent(const std::string& outcome, double train_seconds, double tokens_per_second,
                        int64_t peak, json final_loss, json checkpoint = nullptr) {
  json result = {{"type", "result"},
                 {"outcome", outcome},
                 {"train_seconds", train_seconds},
                 {"tokens_per_second", tokens_per_second},
                 {"peak_bytes", peak},
                 {"final_loss", std::move(final_loss)},
                 {"error", outcome == "cancelled" ? "cancelled at step 3" : ""}};
  if (!checkpoint.is_null()) result["checkpoint"] = std::move(checkpoint);
  return result;
}

}  // namespace llmctl::store::test_support

#endif  // LLMCTL_CONTROLLER_STORE_STORE_TEST_SUPPORT_H_
