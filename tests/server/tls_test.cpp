// HTTPS (--tls-cert/--tls-key) and --private-metrics against a `mnemo serve` child process (issue 13:
// the hardening a deployer expects when the server is exposed directly). The certificate is made
// here, self-signed for 127.0.0.1 with an EC P-256 key, so no key material lives in the repository.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <gtest/gtest.h>
#include <httplib.h>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server_process.h"

namespace mnemo::testing {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "mnemo_tls_XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

// Writes a self-signed certificate for 127.0.0.1 and its key as PEM files; false on any failure.
bool WriteSelfSigned(const fs::path& cert_file, const fs::path& key_file) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
  if (!key || !cert) return false;
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 3600L * 24 * 365);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
  X509_EXTENSION* san = X509V3_EXT_conf_nid(nullptr, &ctx, NID_subject_alt_name, "IP:127.0.0.1");
  if (!san) return false;
  X509_add_ext(cert.get(), san, -1);
  X509_EXTENSION_free(san);
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) return false;
  FILE* c = std::fopen(cert_file.c_str(), "w");
  FILE* k = std::fopen(key_file.c_str(), "w");
  const bool ok = c && k && PEM_write_X509(c, cert.get()) == 1 &&
                  PEM_write_PrivateKey(k, key.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1;
  if (c) std::fclose(c);
  if (k) std::fclose(k);
  return ok;
}

// For a server expected to refuse to start: true once it exited and its log holds `needle`.
bool ExitsSaying(ServerProcess& server, const std::string& needle) {
  if (!server.StopWithin(0, 30)) return false;  // signal 0: only waits; kills it after 30 s
  for (int i = 0; i < 100 && server.log().find(needle) == std::string::npos; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the log's reader may lag the exit
  }
  return server.log().find(needle) != std::string::npos;
}

class Tls : public ::testing::Test {
 protected:
  void SetUp() override {
    cert_ = dir_.path / "cert.pem";
    key_ = dir_.path / "key.pem";
    ASSERT_TRUE(WriteSelfSigned(cert_, key_));
  }
  // A client that trusts exactly our certificate (verification on: the name and chain are checked).
  std::unique_ptr<httplib::SSLClient> Client(int port) {
    auto c = std::make_unique<httplib::SSLClient>("127.0.0.1", port);
    c->set_ca_cert_path(cert_.c_str());
    c->enable_server_certificate_verification(true);
    c->set_read_timeout(20, 0);
    return c;
  }
  TempDir dir_;
  fs::path cert_, key_;
};

TEST_F(Tls, ServesTheApiOverHttpsAndRefusesPlainHttp) {
  ServerProcess server({"--tls-cert", cert_.string(), "--tls-key", key_.string()});
  ASSERT_GT(server.port(), 0) << server.log();
  auto client = Client(server.port());
  auto health = client->Get("/health");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  // A turn, streamed (chunked over TLS) and not.
  const std::string body = R"({"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":8,"seed":1})";
  auto r = client->Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_FALSE(Json::parse(r->body)["choices"][0]["message"]["content"].get<std::string>().empty());
  const std::string streamed = R"({"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":8,"stream":true})";
  auto s = client->Post("/v1/chat/completions", streamed, "application/json");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, 200);
  EXPECT_NE(s->body.find("data: [DONE]"), std::string::npos);

  // Plain HTTP to the TLS port gets no HTTP answer (the handshake fails), and the server goes on.
  httplib::Client plain("127.0.0.1", server.port());
  plain.set_read_timeout(5, 0);
  auto p = plain.Get("/health");
  EXPECT_TRUE(!p || p->status != 200);
  auto again = Client(server.port())->Get("/health");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200);
}

TEST_F(Tls, AClientThatNeverHandshakesIsCutAtTheHeaderDeadline) {
  ServerProcess server({"--tls-cert", cert_.string(), "--tls-key", key_.string(), "--header-timeout-s", "1"});
  ASSERT_GT(server.port(), 0) << server.log();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(server.port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const auto t0 = std::chrono::steady_clock::now();
  char c;
  const ssize_t n = recv(fd, &c, 1, 0);  // blocks until the server closes
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(fd);
  EXPECT_LE(n, 0);
  EXPECT_GT(waited, 0.5);
  EXPECT_LT(waited, 5.0);
}

TEST_F(Tls, AKeyThatDoesNotMatchTheCertificateStopsTheStart) {
  const fs::path other_cert = dir_.path / "other.pem", other_key = dir_.path / "other_key.pem";
  ASSERT_TRUE(WriteSelfSigned(other_cert, other_key));
  ServerProcess server({"--tls-cert", cert_.string(), "--tls-key", other_key.string()}, "", false);
  EXPECT_TRUE(ExitsSaying(server, "TLS key")) << server.log();
}

TEST(PrivateMetrics, MetricsNeedTheKeyHealthDoesNot) {
  ServerProcess server({"--api-key", "k1", "--private-metrics"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c("127.0.0.1", server.port());
  auto none = c.Get("/metrics");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(Json::parse(none->body)["error"]["code"], "missing_api_key");
  auto keyed = c.Get("/metrics", httplib::Headers{{"Authorization", "Bearer k1"}});
  ASSERT_TRUE(keyed);
  EXPECT_EQ(keyed->status, 200);
  EXPECT_NE(keyed->body.find("mnemo_"), std::string::npos);
  for (const char* open : {"/health", "/ready", "/"}) {
    auto r = c.Get(open);
    ASSERT_TRUE(r) << open;
    EXPECT_EQ(r->status, 200) << open;
  }
  // Without the flag /metrics stays open, keys or not.
  ServerProcess open_server({"--api-key", "k1"});
  ASSERT_GT(open_server.port(), 0);
  auto m = httplib::Client("127.0.0.1", open_server.port()).Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
}

TEST(PrivateMetrics, NeedsAnApiKey) {
  ServerProcess server({"--private-metrics"}, "", false);
  EXPECT_TRUE(ExitsSaying(server, "--private-metrics needs")) << server.log();
}

}  // namespace
}  // namespace mnemo::testing
