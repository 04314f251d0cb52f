#include "common/http/http_client.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/digest/digest.h"
#include "tests/support/server_process.h"
#include "tests/support/shell_command.h"

namespace llmctl::http {
namespace {

using std::chrono::milliseconds;

class HttpClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server =
        llmctl::testing::ServerProcess::StartPython("common/http/testdata/http_test_server.py", {});
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }

  // A client whose waits are recorded instead of slept and whose jitter is always `jitter`.
  HttpClient MakeClient(double jitter = 0.5, int max_attempts = 4) {
    ClientOptions options;
    options.retry.max_attempts = max_attempts;
    options.retry.base_delay = milliseconds(100);
    options.retry.max_delay = milliseconds(300);
    options.sleep = [this](milliseconds delay) { sleeps_.push_back(delay); };
    options.random_unit = [jitter] { return jitter; };
    return HttpClient(options);
  }

  Request Get(const std::string& path) {
    Request request;
    request.url = server_->url() + path;
    return request;
  }

  int Count(const std::string& key) {
    auto response = MakeClient().Send(Get("/count/" + key));
    return response.ok() ? std::stoi(response->body) : -1;
  }

  std::unique_ptr<llmctl::testing::ServerProcess> server_;
  std::vector<milliseconds> sleeps_;
};

TEST_F(HttpClientTest, SendsMethodHeadersAndBody) {
  Request request = Get("/echo");
  request.method = "PUT";
  request.body = R"({"a": 1})";
  request.headers.Add("X-Auth-Token", "tok");
  auto response = MakeClient().Send(request);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->headers.Get("content-type"), "application/json");
  EXPECT_EQ(response->headers.Get("CONTENT-TYPE"), "application/json");
  auto echo = nlohmann::json::parse(response->body);
  EXPECT_EQ(echo["method"], "PUT");
  EXPECT_EQ(echo["body"], R"({"a": 1})");
  EXPECT_EQ(echo["headers"]["x-auth-token"], "tok");
}

TEST_F(HttpClientTest, FollowsRedirects) {
  auto response = MakeClient().Send(Get("/redirect"));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(nlohmann::json::parse(response->body)["path"], "/echo");
}

TEST_F(HttpClientTest, ClientErrorsAreAnswersNotRetried) {
  auto response = MakeClient().Send(Get("/status/404"));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 404);
  EXPECT_TRUE(sleeps_.empty());
}

TEST_F(HttpClientTest, RetriesIdempotentCallsOn503WithCappedJitteredBackoff) {
  auto response = MakeClient(0.5).Send(Get("/flaky/get/3"));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(Count("get"), 4);
  // Half of min(300, 100 * 2^(n-1)) ms.
  EXPECT_EQ(sleeps_,
            (std::vector<milliseconds>{milliseconds(50), milliseconds(100), milliseconds(150)}));
}

TEST_F(HttpClientTest, GivesUpAfterMaxAttemptsWithTheLast5xx) {
  auto response = MakeClient(0.0, 3).Send(Get("/flaky/many/10"));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 503);
  EXPECT_EQ(Count("many"), 3);
}

TEST_F(HttpClientTest, NeverRetriesPost) {
  Request request = Get("/flaky/post/1");
  request.method = "POST";
  auto response = MakeClient().Send(request);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 503);
  EXPECT_EQ(Count("post"), 1);
  EXPECT_TRUE(sleeps_.empty());
}

TEST_F(HttpClientTest, TimeoutIsDeadlineExceededAndRetriedForGet) {
  Request request = Get("/slow/get-slow/3000?once=1");
  request.total_timeout = milliseconds(1000);
  auto response = MakeClient().Send(request);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->body, "slow");
  EXPECT_EQ(Count("get-slow"), 2);
}

TEST_F(HttpClientTest, PostTimeoutIsReportedOnce) {
  Request request = Get("/slow/post-slow/3000");
  request.method = "POST";
  request.total_timeout = milliseconds(1000);
  auto response = MakeClient().Send(request);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(response.status().message().find("POST http://127.0.0.1:"), std::string::npos)
      << response.status().message();
  EXPECT_EQ(Count("post-slow"), 1);
}

TEST_F(HttpClientTest, ConnectionRefusedIsUnavailableNamingTheUrl) {
  // A port that was just free: bind to 0 on loopback through a finished server is racy, so use
  // port 1, which no test machine serves.
  Request request;
  request.url = "http://127.0.0.1:1/v3?token=abc";
  auto response = MakeClient(0.0, 2).Send(request);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(response.status().message().find("GET http://127.0.0.1:1/v3?token=REDACTED"),
            std::string::npos)
      << response.status().message();
  EXPECT_NE(response.status().message().find("after 2 attempts"), std::string::npos);
  EXPECT_EQ(sleeps_.size(), 1u);
}

TEST_F(HttpClientTest, ResponseErrorCarriesMethodUrlStatusAndRequestId) {
  Request request = Get("/status/409");
  request.method = "DELETE";
  auto response = MakeClient().Send(request);
  ASSERT_TRUE(response.ok());
  Status error = ResponseError(request, *response, "lease is busy");
  EXPECT_EQ(error.code(), StatusCode::kAborted);
  EXPECT_EQ(error.message(), "DELETE " + server_->url() +
                                 "/status/409: HTTP 409 (request req-test-42): lease is busy");
}

std::string ExpectedFileBytes() {
  std::string bytes;
  for (int i = 0; i < 100000; ++i) bytes += static_cast<char>((i * 7 + 3) % 251);
  return bytes;
}

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class DownloadTest : public HttpClientTest {
 protected:
  void SetUp() override {
    HttpClientTest::SetUp();
    dir_ = std::filesystem::temp_directory_path() /
           ("llmctl_http_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(DownloadTest, StreamsToFileWithSha256) {
  Request request = Get("/file/whole");
  request.download_path = dir_ / "model.bin";
  auto response = MakeClient().Send(request);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 200);
  EXPECT_TRUE(response->body.empty());
  EXPECT_EQ(response->file_size, 100000u);
  std::string expected = ExpectedFileBytes();
  EXPECT_EQ(ReadAll(request.download_path), expected);
  EXPECT_EQ(response->file_sha256, digest::Sha256Hex(expected));
}

TEST_F(DownloadTest, ABodyPastItsBoundFailsTheCallInsteadOfGrowing) {
  // In memory: the 100,000-byte answer against a bound of 1,000.
  Request in_memory = Get("/file/whole");
  in_memory.max_body_bytes = 1000;
  auto refused = MakeClient().Send(in_memory);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(refused.status().message().find("larger than the 1000 bytes read into memory"),
            std::string::npos)
      << refused.status().message();
  // To a file: more than the size a listing announced.
  Request download = Get("/file/whole");
  download.download_path = dir_ / "model.bin";
  download.max_file_bytes = 50000;
  auto cut = MakeClient().Send(download);
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(cut.status().message().find("larger than the 50000 bytes announced for it"),
            std::string::npos)
      << cut.status().message();
  // Exactly the announced size arrives whole.
  std::filesystem::remove(download.download_path);
  download.max_file_bytes = 100000;
  auto whole = MakeClient().Send(download);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->file_size, 100000u);
}

TEST_F(DownloadTest, ResumesACutTransferWithRange) {
  Request request = Get("/file/cut?cut=30000");
  request.download_path = dir_ / "model.bin";
  auto response = MakeClient().Send(request);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 206);  // the retry asked for the rest
  EXPECT_EQ(Count("cut"), 2);
  std::string expected = ExpectedFileBytes();
  EXPECT_EQ(ReadAll(request.download_path), expected);
  EXPECT_EQ(response->file_size, 100000u);
  EXPECT_EQ(response->file_sha256, digest::Sha256Hex(expected));
}

TEST_F(DownloadTest, AStalledTransferEndsAtItsStallLimitAndIsResumed) {
  // The first answer sends 30,000 bytes and then nothing, with its connection open for an hour:
  // without the stall limit this call would wait out the total timeout (ctest's limit first).
  Request request = Get("/file/stall?stall=30000");
  request.download_path = dir_ / "model.bin";
  request.total_timeout = std::chrono::hours(1);
  request.stall_timeout = std::chrono::seconds(1);
  auto response = MakeClient().Send(request);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 206);
  EXPECT_EQ(Count("stall"), 2);
  EXPECT_EQ(sleeps_.size(), 1u);  // one retry
  EXPECT_EQ(response->file_sha256, digest::Sha256Hex(ExpectedFileBytes()));
}

TEST_F(DownloadTest, AStallIsNamedWhenTheRetriesRunOut) {
  Request request = Get("/file/stall-once?stall=10");
  request.download_path = dir_ / "model.bin";
  request.total_timeout = std::chrono::hours(1);
  request.stall_timeout = std::chrono::seconds(1);
  auto response = MakeClient(0.5, /*max_attempts=*/1).Send(request);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(response.status().message().find("stalled: under 1 byte a second for 1 s"),
            std::string::npos)
      << response.status().message();
}

TEST_F(DownloadTest, ACancelledCallEndsAndIsNotRetried) {
  // The caller gives up once bytes have reached the file, mid-stall.
  Request request = Get("/file/cancel?stall=30000");
  request.download_path = dir_ / "model.bin";
  request.total_timeout = std::chrono::hours(1);
  request.cancelled = [path = request.download_path] {
    std::error_code error;
    return std::filesystem::file_size(path, error) > 0 && !error;
  };
  auto response = MakeClient().Send(request);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), StatusCode::kCancelled);
  EXPECT_NE(response.status().message().find("/file/cancel?stall=30000: cancelled by its caller"),
            std::string::npos)
      << response.status().message();
  EXPECT_EQ(Count("cancel"), 1);
  EXPECT_TRUE(sleeps_.empty());
  // A caller that gave up before the call sends nothing.
  Request never = Get("/file/never");
  never.cancelled = [] { return true; };
  EXPECT_EQ(MakeClient().Send(never).status().code(), StatusCode::kCancelled);
  EXPECT_EQ(Count("never"), 0);
}

TEST_F(DownloadTest, ResumesAPartialFileLeftByAnEarlierRun) {
  std::string expected = ExpectedFileBytes();
  std::filesystem::path path = dir_ / "model.bin";
  std::ofstream(path, std::ios::binary) << expected.substr(0, 12345);
  Request request = Get("/file/partial");
  request.download_path = path;
  auto response = MakeClient().Send(request);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 206);
  EXPECT_EQ(ReadAll(path), expected);
  EXPECT_EQ(response->file_sha256, digest::Sha256Hex(expected));
}

TEST_F(DownloadTest, ErrorBodiesStayInTheResponseNotTheFile) {
  Request request = Get("/status/404");
  request.download_path = dir_ / "model.bin";
  auto response = MakeClient().Send(request);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 404);
  EXPECT_EQ(response->body, R"({"error": "as asked"})");
  EXPECT_FALSE(std::filesystem::exists(request.download_path));
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testdata_ = (llmctl::testing::SourceDir() / "common/http/testdata/").string();
    auto server = llmctl::testing::ServerProcess::StartPython(
        "common/http/testdata/http_test_server.py",
        {"--tls", testdata_ + "loopback_cert.pem", testdata_ + "loopback_key.pem"});
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }
  std::string testdata_;
  std::unique_ptr<llmctl::testing::ServerProcess> server_;
};

TEST_F(TlsTest, AnUntrustedCertificateIsRefusedAndNotRetried) {
  int sleeps = 0;
  ClientOptions options;
  options.sleep = [&](milliseconds) { ++sleeps; };
  Request request;
  request.url = "https://127.0.0.1:" + std::to_string(server_->port()) + "/echo";
  auto response = HttpClient(options).Send(request);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), StatusCode::kFailedPrecondition)
      << response.status().ToString();
  EXPECT_NE(response.status().message().find("TLS verification failed"), std::string::npos);
  EXPECT_EQ(sleeps, 0);
}

TEST_F(TlsTest, ACaBundleMakesTheCertificateTrusted) {
  ClientOptions options;
  options.ca_bundle_path = testdata_ + "loopback_cert.pem";
  Request request;
  request.url = "https://127.0.0.1:" + std::to_string(server_->port()) + "/echo";
  auto response = HttpClient(options).Send(request);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 200);
}

// An https request's headers may carry a token: a redirect may keep it on https (or move it from
// http to https), never take it to plain http.
TEST_F(TlsTest, AnHttpsRequestIsNotRedirectedToPlainHttp) {
  auto plain =
      llmctl::testing::ServerProcess::StartPython("common/http/testdata/http_test_server.py", {});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  const std::string plain_echo = "http://127.0.0.1:" + std::to_string((*plain)->port()) + "/echo";
  const std::string https = "https://127.0.0.1:" + std::to_string(server_->port());
  ClientOptions options;
  options.ca_bundle_path = testdata_ + "loopback_cert.pem";
  Request downgrade;
  downgrade.url = https + "/redirect?to=" + plain_echo;
  downgrade.headers.Add("X-Auth-Token", "secret-token");
  auto refused = HttpClient(options).Send(downgrade);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(), "GET " + downgrade.url + ": refused its redirect to " +
                                            plain_echo +
                                            ": an https request is not followed to plain http");

  Request within;
  within.url = https + "/redirect";
  auto followed = HttpClient(options).Send(within);
  ASSERT_TRUE(followed.ok()) << followed.status().ToString();
  EXPECT_EQ(followed->status, 200);
  EXPECT_NE(followed->body.find("\"path\": \"/echo\""), std::string::npos) << followed->body;

  Request upgrade;
  upgrade.url = plain_echo.substr(0, plain_echo.size() - 4) + "redirect?to=" + https + "/echo";
  auto upgraded = HttpClient(options).Send(upgrade);
  ASSERT_TRUE(upgraded.ok()) << upgraded.status().ToString();
  EXPECT_EQ(upgraded->status, 200);
}

TEST(RedactUrlTest, DropsCredentialsAndSecretQueryValues) {
  EXPECT_EQ(RedactUrl("https://user:pw@host:5000/v3?name=x&api_key=s3&Signature=abc"),
            "https://host:5000/v3?name=x&api_key=REDACTED&Signature=REDACTED");
  EXPECT_EQ(RedactUrl("http://127.0.0.1:80/a@b"), "http://127.0.0.1:80/a@b");
}

TEST(FormEncodeTest, EscapesReservedCharacters) {
  EXPECT_EQ(FormEncode({{"scope", "openid profile"}, {"password", "a&b=c"}}),
            "scope=openid%20profile&password=a%26b%3Dc");
}

TEST(IsIdempotentTest, PostAndPatchAreNot) {
  EXPECT_TRUE(IsIdempotent("GET"));
  EXPECT_TRUE(IsIdempotent("PUT"));
  EXPECT_TRUE(IsIdempotent("DELETE"));
  EXPECT_TRUE(IsIdempotent("HEAD"));
  EXPECT_FALSE(IsIdempotent("POST"));
  EXPECT_FALSE(IsIdempotent("PATCH"));
}

}  // namespace
}  // namespace llmctl::http
