// The hub's answers apart from HTTP: its model listing and model.safetensors.index.json parsed, and
// what they refuse. PrepareHubModel's downloads are hub_test.cc's.
#include "agent/hub_listing.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl::agent {
namespace {

// The hub's answers apart from HTTP (agent/hub_listing.h; tests/fuzz/hub_listing_fuzz.cc tries
// any bytes): what a listing keeps, and refusals that name the model and the file.
TEST(HubListingTest, KeepsSizesAndDigestsAndRefusesWhatIsNoListing) {
  const std::string sha256(64, 'a');
  const StatusOr<HubListing> listing =
      ParseHubListing(R"({"sha":"0123456789abcdef0123456789abcdef01234567","siblings":[)"
                      R"({"rfilename":"config.json","size":665,"blobId":"b0"},)"
                      R"({"rfilename":"model.safetensors","size":135,"lfs":{"sha256":")" +
                          sha256 + R"(","size":547713960}}]})",
                      "m");
  ASSERT_TRUE(listing.ok()) << listing.status().ToString();
  EXPECT_EQ(listing->commit, "0123456789abcdef0123456789abcdef01234567");
  EXPECT_EQ(listing->files.at("config.json").size, 665);
  EXPECT_EQ(listing->files.at("config.json").git_blob_id, "b0");
  EXPECT_EQ(listing->files.at("model.safetensors").size, 547713960);
  EXPECT_EQ(listing->files.at("model.safetensors").lfs_sha256, sha256);
  for (const char* bad :
       {"", "[]", R"({"sha":"0123","siblings":[]})",
        R"({"sha":"0123456789abcdef0123456789abcdef01234567","siblings":[{"rfilename":"a"}]})",
        R"({"sha":"0123456789abcdef0123456789abcdef01234567","siblings":[)"
        R"({"rfilename":"a","size":9223372036854775808}]})"}) {
    const StatusOr<HubListing> refused = ParseHubListing(bad, "m");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(refused.status().message().rfind("m: the hub's answer is not a model listing: ", 0),
              0u)
        << refused.status().message();
  }

  const StatusOr<std::vector<std::string>> shards =
      ParseIndexShards(R"({"weight_map":{"b":"model-2.safetensors","a":"model-1.safetensors",)"
                       R"("c":"model-1.safetensors"}})",
                       "m");
  ASSERT_TRUE(shards.ok()) << shards.status().ToString();
  EXPECT_EQ(*shards, (std::vector<std::string>{"model-1.safetensors", "model-2.safetensors"}));
  for (const char* bad : {R"({"weight_map":{}})", R"({"weight_map":{"a":"../x"}})",
                          R"({"weight_map":{"a":"/etc/x"}})", R"({"weight_map":{"a":"x//y"}})"}) {
    const StatusOr<std::vector<std::string>> refused = ParseIndexShards(bad, "m");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(refused.status().message().rfind("m: model.safetensors.index.json", 0), 0u);
  }
}

// A file's name in the hub's listing is the hub's: quoted in a refusal, which becomes the trial's
// error on every terminal that shows it, it holds no escape sequence, BEL or C1 control.
TEST(HubListingTest, ARefusalQuotesTheHubsFileNameOnOneLine) {
  const StatusOr<HubListing> refused =
      ParseHubListing(R"({"sha":"0123456789abcdef0123456789abcdef01234567","siblings":[)"
                      R"({"rfilename":"w\u001b]0;HUBTITLE\u0007\u001b[31mRED\n\u009b2J.bin"}]})",
                      "m");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "m: the hub's answer is not a model listing: w ]0;HUBTITLE  [31mRED  2J.bin has no "
            "size (a non-negative integer)");
  const StatusOr<std::vector<std::string>> shards =
      ParseIndexShards(R"({"weight_map":{"t\u001b[2J":"../x"}})", "m");
  ASSERT_FALSE(shards.ok());
  EXPECT_EQ(shards.status().message().find('\x1b'), std::string::npos) << shards.status().message();
}

}  // namespace
}  // namespace llmctl::agent
