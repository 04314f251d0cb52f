#include "controller/secrets.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <set>
#include <vector>

#include "common/files.h"

namespace llmctl::controller {
namespace {

class SecretsFileTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = testing::TempDir() + "/secrets_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    path_ = dir_ + "/secrets.json";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `text` as the secrets file, private.
  bool WriteSecretText(const std::string& text) {
    FILE* out = fopen(path_.c_str(), "w");
    if (out == nullptr) return false;
    fputs(text.c_str(), out);
    fclose(out);
    return chmod(path_.c_str(), 0600) == 0;
  }

  std::string dir_;
  std::string path_;
};

TEST(NodeTokenTest, IsRandomHexOf32Bytes) {
  const std::string a = *NewNodeToken();
  const std::string b = *NewNodeToken();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, b);
}

TEST_F(SecretsFileTest, TokensSurviveReopeningInAPrivateFile) {
  {
    auto secrets = *SecretsFile::Open(path_);
    EXPECT_EQ(secrets->NodeToken("n1").status().code(), StatusCode::kNotFound);
    ASSERT_TRUE(secrets->PutNodeToken("n1", "token-one").ok());
    ASSERT_TRUE(secrets->PutNodeToken("n2", "token-two").ok());
    ASSERT_TRUE(secrets->PutNodeToken("n1", "token-three").ok());
  }
  struct stat info;
  ASSERT_EQ(stat(path_.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);

  auto reopened = SecretsFile::Open(path_);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  EXPECT_EQ(*(*reopened)->NodeToken("n1"), "token-three");
  EXPECT_EQ(*(*reopened)->NodeToken("n2"), "token-two");
  EXPECT_EQ(SecretsFile::NodeTokenRef("n1"), "secrets.json#node_tokens/n1");
}

TEST_F(SecretsFileTest, ARemovedTokenIsGoneFromTheFileAndRemovingTwiceIsFine) {
  {
    auto secrets = *SecretsFile::Open(path_);
    ASSERT_TRUE(secrets->PutNodeToken("n1", "token-one").ok());
    ASSERT_TRUE(secrets->PutNodeToken("n2", "token-two").ok());
    ASSERT_TRUE(secrets->RemoveNodeToken("n1").ok());
    EXPECT_EQ(secrets->NodeToken("n1").status().code(), StatusCode::kNotFound);
    EXPECT_TRUE(secrets->RemoveNodeToken("n1").ok());
    EXPECT_TRUE(secrets->RemoveNodeToken("never-registered").ok());
  }
  auto reopened = *SecretsFile::Open(path_);
  EXPECT_EQ(reopened->NodeToken("n1").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*reopened->NodeToken("n2"), "token-two");
  EXPECT_EQ(ReadFileToString(path_, 1 << 20)->find("token-one"), std::string::npos);
}

TEST_F(SecretsFileTest, CertificateNamesGoWithTheTokenAndOlderFilesHaveThePlainOne) {
  {
    auto secrets = *SecretsFile::Open(path_);
    ASSERT_TRUE(secrets->PutNodeToken("n1", "token-one", "agent-n1.0123abcd.llmctl").ok());
    ASSERT_TRUE(secrets->PutNodeToken("n2", "token-two").ok());
    EXPECT_EQ(*secrets->NodeCertificateName("n1"), "agent-n1.0123abcd.llmctl");
    EXPECT_EQ(*secrets->NodeCertificateName("n2"), "agent-n2.llmctl");
    EXPECT_EQ(secrets->NodeCertificateName("n3").status().code(), StatusCode::kNotFound);
  }
  auto reopened = *SecretsFile::Open(path_);
  EXPECT_EQ(*reopened->NodeCertificateName("n1"), "agent-n1.0123abcd.llmctl");
  ASSERT_TRUE(reopened->RemoveNodeToken("n1").ok());
  EXPECT_EQ(reopened->NodeCertificateName("n1").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ReadFileToString(path_, 1 << 20)->find("0123abcd"), std::string::npos);

  // A file from before certificate names were kept: its nodes are dialled under the plain name.
  FILE* out = fopen(path_.c_str(), "w");
  fputs(R"({"node_tokens": {"old": "token-old"}})", out);
  fclose(out);
  auto older = SecretsFile::Open(path_);
  ASSERT_TRUE(older.ok()) << older.status().ToString();
  EXPECT_EQ(*(*older)->NodeCertificateName("old"), "agent-old.llmctl");
}

// A cloud node's enrollment token (docs/architecture.md, "Credentials"): kept as its sha256 only,
// good until its expiry, and spent by the enrollment it allows, across a restart of the controller.
TEST_F(SecretsFileTest, CertificateExpiryIsKeptWithTheTokenAndGoesWithIt) {
  {
    auto secrets = *SecretsFile::Open(path_);
    // No token, nothing to renew: a node down gets no expiry.
    EXPECT_EQ(secrets->SetNodeCertificateExpiry("n1", 1000).code(), StatusCode::kNotFound);
    ASSERT_TRUE(secrets->PutNodeToken("n1", "token-one", "agent-n1.r1.llmctl").ok());
    EXPECT_EQ(secrets->NodeCertificateExpiry("n1").status().code(), StatusCode::kNotFound);
    ASSERT_TRUE(secrets->SetNodeCertificateExpiry("n1", 1000).ok());
    ASSERT_TRUE(secrets->PutNodeToken("n2", "token-two", "agent-n2.r1.llmctl").ok());
    ASSERT_TRUE(secrets->SetNodeCertificateExpiry("n2", 2000).ok());
  }
  auto secrets = *SecretsFile::Open(path_);
  EXPECT_EQ(*secrets->NodeCertificateExpiry("n1"), 1000);
  // New credentials (registered again): the old certificate's expiry is not theirs.
  ASSERT_TRUE(secrets->PutNodeToken("n1", "token-new", "agent-n1.r2.llmctl").ok());
  EXPECT_EQ(secrets->NodeCertificateExpiry("n1").status().code(), StatusCode::kNotFound);
  // `node down`.
  ASSERT_TRUE(secrets->RemoveNodeToken("n2").ok());
  EXPECT_EQ(secrets->NodeCertificateExpiry("n2").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*SecretsFile::Open(path_))->NodeCertificateExpiry("n2").status().code(),
            StatusCode::kNotFound);
}

TEST_F(SecretsFileTest, AnEnrollmentTokenIsStoredHashedWorksOnceAndExpires) {
  const std::string token = "enroll-S3CRET";
  const std::string name = "agent-n1.0123abcd.llmctl";
  {
    auto secrets = *SecretsFile::Open(path_);
    ASSERT_TRUE(secrets->PutEnrollment("n1", token, /*expires_unix=*/1000, name).ok());
    EXPECT_TRUE(secrets->HasEnrollment("n1"));
    EXPECT_EQ(secrets->NodeToken("n1").status().code(), StatusCode::kNotFound);
  }
  EXPECT_EQ(ReadFileToString(path_, 1 << 20)->find(token), std::string::npos);
  auto secrets = *SecretsFile::Open(path_);
  StatusOr<std::string> wrong = secrets->CheckEnrollment("n1", "enroll-GUESS", 999);
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(wrong.status().message(),
            "the enrollment token presented for node 'n1' is not its own");
  StatusOr<std::string> expired = secrets->CheckEnrollment("n1", token, 1000);
  EXPECT_EQ(expired.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(expired.status().message().find("'n1''s enrollment token expired 0 s ago"),
            std::string::npos)
      << expired.status().message();
  EXPECT_EQ(secrets->CheckEnrollment("n2", token, 999).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_EQ(*secrets->CheckEnrollment("n1", token, 999), name);

  ASSERT_TRUE(secrets->CompleteEnrollment("n1", "node-token").ok());
  EXPECT_EQ(*secrets->NodeToken("n1"), "node-token");
  EXPECT_EQ(*secrets->NodeCertificateName("n1"), name);
  EXPECT_FALSE(secrets->HasEnrollment("n1"));
  for (const auto& reopened : {std::move(secrets), *SecretsFile::Open(path_)}) {
    StatusOr<std::string> again = reopened->CheckEnrollment("n1", token, 999);
    EXPECT_EQ(again.status().code(), StatusCode::kPermissionDenied);
    EXPECT_NE(again.status().message().find("already enrolled: its enrollment token works once"),
              std::string::npos)
        << again.status().message();
    EXPECT_EQ(reopened->CompleteEnrollment("n1", "other").code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(*reopened->NodeToken("n1"), "node-token");
  }
}

// The grant sent to an enrolling agent outlives a restart of the controller (its answer may be
// the one lost), until the enrollment completes or is replaced.
TEST_F(SecretsFileTest, ASentGrantIsKeptUntilTheEnrollmentEnds) {
  {
    auto secrets = *SecretsFile::Open(path_);
    EXPECT_EQ(secrets->RecordSentGrant("n1", "node-token", "PEM").code(),
              StatusCode::kFailedPrecondition);
    ASSERT_TRUE(secrets->PutEnrollment("n1", "enroll-S3CRET", 1000, "agent-n1.ab.llmctl").ok());
    EXPECT_EQ(secrets->SentGrantOf("n1").status().code(), StatusCode::kNotFound);
    ASSERT_TRUE(secrets->RecordSentGrant("n1", "node-token", "PEM").ok());
  }
  auto secrets = *SecretsFile::Open(path_);
  StatusOr<SecretsFile::SentGrant> sent = secrets->SentGrantOf("n1");
  ASSERT_TRUE(sent.ok()) << sent.status().ToString();
  EXPECT_EQ(sent->token, "node-token");
  EXPECT_EQ(sent->certificate_pem, "PEM");
  EXPECT_EQ(sent->certificate_name, "agent-n1.ab.llmctl");
  ASSERT_TRUE(secrets->PutEnrollment("n1", "enroll-AGAIN", 1000, "agent-n1.cd.llmctl").ok());
  EXPECT_EQ(secrets->SentGrantOf("n1").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(secrets->RecordSentGrant("n1", "node-token-2", "PEM2").ok());
  ASSERT_TRUE(secrets->CompleteEnrollment("n1", "node-token-2").ok());
  EXPECT_EQ(secrets->SentGrantOf("n1").status().code(), StatusCode::kNotFound);
}

TEST_F(SecretsFileTest, NodeDownDropsAPendingEnrollment) {
  {
    auto secrets = *SecretsFile::Open(path_);
    ASSERT_TRUE(secrets->PutEnrollment("n1", "enroll-S3CRET", 1000, "agent-n1.ab.llmctl").ok());
    ASSERT_TRUE(secrets->RemoveNodeToken("n1").ok());
    EXPECT_FALSE(secrets->HasEnrollment("n1"));
  }
  auto reopened = *SecretsFile::Open(path_);
  EXPECT_EQ(reopened->CheckEnrollment("n1", "enroll-S3CRET", 999).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadFileToString(path_, 1 << 20)->find("agent-n1.ab.llmctl"), std::string::npos);
}

TEST_F(SecretsFileTest, NewCredentialsDropAPendingEnrollment) {
  {
    auto secrets = *SecretsFile::Open(path_);
    ASSERT_TRUE(secrets->PutEnrollment("n1", "enroll-S3CRET", 1000, "agent-n1.ab.llmctl").ok());
    // Registered again with ordinary credentials while the enrollment was pending.
    ASSERT_TRUE(secrets->PutNodeToken("n1", "token-one", "agent-n1.cd.llmctl").ok());
    EXPECT_FALSE(secrets->HasEnrollment("n1"));
    EXPECT_EQ(secrets->CheckEnrollment("n1", "enroll-S3CRET", 999).status().code(),
              StatusCode::kPermissionDenied);
    EXPECT_EQ(*secrets->NodeCertificateName("n1"), "agent-n1.cd.llmctl");
  }
  auto reopened = *SecretsFile::Open(path_);
  EXPECT_EQ(reopened->CheckEnrollment("n1", "enroll-S3CRET", 999).status().code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(*reopened->NodeToken("n1"), "token-one");
  EXPECT_EQ(ReadFileToString(path_, 1 << 20)->find("agent-n1.ab.llmctl"), std::string::npos);
}

TEST_F(SecretsFileTest, TemporariesACrashLeftAreRemovedAtOpenAndNothingElse) {
  namespace fs = std::filesystem;
  ASSERT_TRUE((*SecretsFile::Open(path_))->PutNodeToken("n1", "token-one").ok());
  auto write = [](const std::string& path) {
    FILE* out = fopen(path.c_str(), "w");
    ASSERT_NE(out, nullptr) << path;
    fputs("{\"node_tokens\": {\"n1\": \"S3CRET\"}}", out);
    fclose(out);
  };
  // WriteFileAtomically's temporaries, left by a crash before their rename.
  write(path_ + ".tmp.4242.0");
  write(path_ + ".tmp.1.17");
  // Not its temporaries: another file's, names that only look alike, a directory of the pattern.
  const std::vector<std::string> kept = {"secrets.json",           "other.json.tmp.4242.0",
                                         "secrets.json.tmp.1",     "secrets.json.tmp.x.1",
                                         "secrets.json.tmp.1.2.3", "secrets.json.tmp.4242.0.bak"};
  for (const std::string& name : kept) {
    if (name != "secrets.json") write(dir_ + "/" + name);
  }
  ASSERT_TRUE(fs::create_directory(path_ + ".tmp.5.5"));

  auto reopened = SecretsFile::Open(path_);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  EXPECT_EQ(*(*reopened)->NodeToken("n1"), "token-one");
  std::set<std::string> left;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_)) {
    left.insert(entry.path().filename().string());
  }
  std::set<std::string> expected(kept.begin(), kept.end());
  expected.insert("secrets.json.tmp.5.5");
  EXPECT_EQ(left, expected);
}

TEST_F(SecretsFileTest, RefusesAFileOthersCanReadOrADamagedOne) {
  ASSERT_TRUE((*SecretsFile::Open(path_))->PutNodeToken("n", "t").ok());
  chmod(path_.c_str(), 0644);
  EXPECT_EQ(SecretsFile::Open(path_).status().code(), StatusCode::kFailedPrecondition);

  chmod(path_.c_str(), 0600);
  FILE* out = fopen(path_.c_str(), "w");
  fputs("{not json", out);
  fclose(out);
  EXPECT_EQ(SecretsFile::Open(path_).status().code(), StatusCode::kDataLoss);
}

TEST_F(SecretsFileTest, ADamagedFileIsNamedWithWhereNeverWhatItHolds) {
  const std::string token = "0123456789abcdefS3CRET0123456789abcdef";
  const std::string entry = std::string("{\"node_tokens\": {\"n1\": \"").append(token);
  // Cut off in the middle of a token, as a crash could leave it; two tokens without a comma; a
  // token of the wrong type.
  for (const std::string& text :
       {entry, std::string(entry).append("\" \"").append(token),
        std::string("{\"node_tokens\": {\"n1\": [\"").append(token).append("\"]}}")}) {
    ASSERT_TRUE(WriteSecretText(text));
    const Status damaged = SecretsFile::Open(path_).status();
    EXPECT_EQ(damaged.code(), StatusCode::kDataLoss);
    EXPECT_NE(damaged.message().find(path_), std::string::npos) << damaged.message();
    EXPECT_EQ(damaged.message().find("S3CRET"), std::string::npos) << damaged.message();
  }
  ASSERT_TRUE(WriteSecretText(entry));
  const Status cut_off = SecretsFile::Open(path_).status();
  EXPECT_NE(cut_off.message().find("not JSON at byte "), std::string::npos) << cut_off.message();
}

}  // namespace
}  // namespace llmctl::controller
