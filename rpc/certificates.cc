#include "rpc/certificates.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/files.h"

namespace llmctl::rpc {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct ReqFree {
  void operator()(X509_REQ* r) const { X509_REQ_free(r); }
};
struct BnFree {
  void operator()(BIGNUM* b) const { BN_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using BnPtr = std::unique_ptr<BIGNUM, BnFree>;
using ReqPtr = std::unique_ptr<X509_REQ, ReqFree>;

constexpr char kCaKeyFile[] = "ca.key";
constexpr char kCaCertificateFile[] = "ca.crt";
constexpr char kCaCommonName[] = "llmctl CA";
constexpr int kCaValidityDays = 3650;

// OpenSSL's most recent error as text, and clears its queue.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

X509Ptr ParseCertificate(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return X509Ptr(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

PkeyPtr ParsePrivateKey(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return PkeyPtr(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
}

std::string BioToString(BIO* bio) {
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(size));
}

StatusOr<std::string> CertificatePem(X509* certificate) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509(bio.get(), certificate) != 1) {
    return InternalError("cannot encode a certificate: " + OpenSslError());
  }
  return BioToString(bio.get());
}

StatusOr<std::string> PrivateKeyPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return InternalError("cannot encode a private key: " + OpenSslError());
  }
  return BioToString(bio.get());
}

StatusOr<PkeyPtr> NewP256Key() {
  PkeyPtr key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (key == nullptr) return InternalError("cannot generate an EC P-256 key: " + OpenSslError());
  return key;
}

Status AddExtension(X509* certificate, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, certificate, nullptr, nullptr, 0);
  X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (extension == nullptr) {
    return InternalError(std::string("cannot make extension ") + OBJ_nid2sn(nid) + "=" + value +
                         ": " + OpenSslError());
  }
  const int added = X509_add_ext(certificate, extension, -1);
  X509_EXTENSION_free(extension);
  if (added != 1) return InternalError("cannot add a certificate extension: " + OpenSslError());
  return Status::Ok();
}

using TimePoint = std::chrono::system_clock::time_point;

TimePoint DaysFromNow(int days) {
  return std::chrono::system_clock::now() + std::chrono::hours(24) * days;
}

// A certificate for `common_name` and `key`, not yet signed: random 159-bit serial, valid from an
// hour ago (clock skew) until `not_after`. `issuer` null means self-issued.
StatusOr<X509Ptr> NewCertificate(const std::string& common_name, EVP_PKEY* key, X509* issuer,
                                 TimePoint not_after) {
  X509Ptr certificate(X509_new());
  if (certificate == nullptr) return InternalError("X509_new: " + OpenSslError());
  X509_set_version(certificate.get(), X509_VERSION_3);
  BnPtr serial(BN_new());
  // 159 bits keeps the DER integer positive and within RFC 5280's 20 octets.
  if (serial == nullptr || BN_rand(serial.get(), 159, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(certificate.get())) == nullptr) {
    return InternalError("cannot draw a serial number: " + OpenSslError());
  }
  X509_gmtime_adj(X509_getm_notBefore(certificate.get()), -3600);
  if (ASN1_TIME_set(X509_getm_notAfter(certificate.get()),
                    std::chrono::system_clock::to_time_t(not_after)) == nullptr) {
    return InternalError("cannot set a certificate's expiry: " + OpenSslError());
  }
  X509_NAME* name = X509_get_subject_name(certificate.get());
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                 -1, 0) != 1) {
    return InvalidArgumentError("cannot use '" + common_name +
                                "' as a common name: " + OpenSslError());
  }
  X509_set_issuer_name(certificate.get(), issuer == nullptr ? name : X509_get_subject_name(issuer));
  if (X509_set_pubkey(certificate.get(), key) != 1) {
    return InternalError("X509_set_pubkey: " + OpenSslError());
  }
  return certificate;
}

Status Sign(X509* certificate, EVP_PKEY* signing_key) {
  if (X509_sign(certificate, signing_key, EVP_sha256()) == 0) {
    return InternalError("cannot sign a certificate: " + OpenSslError());
  }
  return Status::Ok();
}

}  // namespace

Status WriteSecretFile(const std::string& path, const std::string& text, mode_t mode) {
  return WriteFileAtomically(path, [&](int fd) -> Status {
    if (::fchmod(fd, mode) != 0)
      return InternalError(std::string("fchmod: ") + std::strerror(errno));
    return WriteAll(fd, text.data(), text.size());
  });
}

struct CertificateAuthority::Keys {
  PkeyPtr key;
  X509Ptr certificate;
};

CertificateAuthority::CertificateAuthority(std::unique_ptr<Keys> keys,
                                           std::string ca_certificate_pem)
    : keys_(std::move(keys)), ca_certificate_pem_(std::move(ca_certificate_pem)) {}

CertificateAuthority::~CertificateAuthority() = default;

StatusOr<std::unique_ptr<CertificateAuthority>> CertificateAuthority::LoadOrCreate(
    const std::string& dir) {
  // The CA's key and certificate are kept here, so no one else may enter it. One that is there
  // already is refused, not narrowed: while it was open, another user could have put their own
  // key and certificate in it, which narrowing it would keep as the CA.
  if (const Status made = EnsureOwnDirectory(dir, 0700, OthersMay::kNothing); !made.ok()) {
    return FailedPreconditionError(
        std::string("the CA's directory ")
            .append(made.message())
            .append("; no one else may enter it, as it holds the CA's key"));
  }
  const std::string key_path = dir + "/" + kCaKeyFile;
  const std::string certificate_path = dir + "/" + kCaCertificateFile;
  const bool have_key = std::filesystem::exists(key_path);
  const bool have_certificate = std::filesystem::exists(certificate_path);
  auto keys = std::make_unique<Keys>();
  std::string certificate_pem;
  if (have_key != have_certificate) {
    return FailedPreconditionError("the CA in " + dir +
                                   " is incomplete: " + (have_key ? certificate_path : key_path) +
                                   " is missing (restore it, or remove the directory to start a "
                                   "new CA, which invalidates every certificate issued so far)");
  }
  if (have_key) {
    ASSIGN_OR_RETURN(const std::string key_pem, ReadFileToString(key_path, 1 << 20));
    ASSIGN_OR_RETURN(certificate_pem, ReadFileToString(certificate_path, 1 << 20));
    keys->key = ParsePrivateKey(key_pem);
    if (keys->key == nullptr) return InvalidArgumentError(key_path + ": not a PEM private key");
    keys->certificate = ParseCertificate(certificate_pem);
    if (keys->certificate == nullptr) {
      return InvalidArgumentError(certificate_path + ": not a PEM certificate");
    }
    if (X509_check_private_key(keys->certificate.get(), keys->key.get()) != 1) {
      ERR_clear_error();
      return FailedPreconditionError(key_path + " does not belong to " + certificate_path);
    }
  } else {
    ASSIGN_OR_RETURN(keys->key, NewP256Key());
    ASSIGN_OR_RETURN(keys->certificate, NewCertificate(kCaCommonName, keys->key.get(), nullptr,
                                                       DaysFromNow(kCaValidityDays)));
    X509* ca = keys->certificate.get();
    RETURN_IF_ERROR(AddExtension(ca, ca, NID_basic_constraints, "critical,CA:TRUE"));
    RETURN_IF_ERROR(AddExtension(ca, ca, NID_key_usage, "critical,keyCertSign,cRLSign"));
    RETURN_IF_ERROR(AddExtension(ca, ca, NID_subject_key_identifier, "hash"));
    RETURN_IF_ERROR(Sign(ca, keys->key.get()));
    ASSIGN_OR_RETURN(const std::string key_pem, PrivateKeyPem(keys->key.get()));
    ASSIGN_OR_RETURN(certificate_pem, CertificatePem(ca));
    // The key first: a crash in between leaves a key without a certificate, reported above.
    RETURN_IF_ERROR(WriteSecretFile(key_path, key_pem, 0600));
    if (Status written = WriteSecretFile(certificate_path, certificate_pem, 0644); !written.ok()) {
      // Nothing was signed with this key: without it, the next start makes a new CA once the
      // write can succeed (a full disk freed), instead of refusing the directory as incomplete.
      std::error_code removal;
      std::filesystem::remove(key_path, removal);
      if (!removal) return written;
      return Status(written.code(), std::string(written.message())
                                        .append("; remove ")
                                        .append(key_path)
                                        .append(" (")
                                        .append(removal.message())
                                        .append("), which no certificate was signed with"));
    }
  }
  return std::unique_ptr<CertificateAuthority>(
      new CertificateAuthority(std::move(keys), std::move(certificate_pem)));
}

StatusOr<std::string> CertificateAuthority::SignLeaf(const std::string& common_name, EVP_PKEY* key,
                                                     TimePoint not_after) const {
  ASSIGN_OR_RETURN(X509Ptr certificate,
                   NewCertificate(common_name, key, keys_->certificate.get(), not_after));
  X509* leaf = certificate.get();
  X509* ca = keys_->certificate.get();
  RETURN_IF_ERROR(AddExtension(leaf, ca, NID_basic_constraints, "critical,CA:FALSE"));
  RETURN_IF_ERROR(
      AddExtension(leaf, ca, NID_key_usage, "critical,digitalSignature,keyEncipherment"));
  RETURN_IF_ERROR(AddExtension(leaf, ca, NID_ext_key_usage, "serverAuth,clientAuth"));
  RETURN_IF_ERROR(AddExtension(leaf, ca, NID_subject_alt_name, ("DNS:" + common_name).c_str()));
  RETURN_IF_ERROR(AddExtension(leaf, ca, NID_authority_key_identifier, "keyid:always"));
  RETURN_IF_ERROR(Sign(leaf, keys_->key.get()));
  return CertificatePem(leaf);
}

StatusOr<IssuedCertificate> CertificateAuthority::Issue(const std::string& common_name,
                                                        int validity_days) const {
  if (common_name.empty() || validity_days <= 0) {
    return InvalidArgumentError("a certificate needs a common name and a positive validity, got '" +
                                common_name + "' for " + std::to_string(validity_days) + " days");
  }
  ASSIGN_OR_RETURN(PkeyPtr key, NewP256Key());
  IssuedCertificate issued;
  ASSIGN_OR_RETURN(issued.certificate_pem,
                   SignLeaf(common_name, key.get(), DaysFromNow(validity_days)));
  ASSIGN_OR_RETURN(issued.private_key_pem, PrivateKeyPem(key.get()));
  return issued;
}

StatusOr<std::string> CertificateAuthority::SignRequest(const std::string& request_pem,
                                                        const std::string& common_name,
                                                        TimePoint not_after) const {
  if (common_name.empty() ||
      not_after <= std::chrono::system_clock::now() - std::chrono::hours(1)) {
    return InvalidArgumentError(
        "a certificate needs a common name and an expiry after its start ('" + common_name + "')");
  }
  BioPtr bio(BIO_new_mem_buf(request_pem.data(), static_cast<int>(request_pem.size())));
  ReqPtr request(PEM_read_bio_X509_REQ(bio.get(), nullptr, nullptr, nullptr));
  if (request == nullptr) {
    ERR_clear_error();
    return InvalidArgumentError("the certificate request is not a PEM CSR");
  }
  EVP_PKEY* key = X509_REQ_get0_pubkey(request.get());
  if (key == nullptr || X509_REQ_verify(request.get(), key) != 1) {
    ERR_clear_error();
    return InvalidArgumentError("the certificate request is not signed by its own key");
  }
  return SignLeaf(common_name, key, not_after);
}

StatusOr<CertificateRequest> NewCertificateRequest(const std::string& common_name) {
  ASSIGN_OR_RETURN(PkeyPtr key, NewP256Key());
  ReqPtr request(X509_REQ_new());
  if (request == nullptr) return InternalError("X509_REQ_new: " + OpenSslError());
  X509_NAME* name = X509_REQ_get_subject_name(request.get());
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                 -1, 0) != 1 ||
      X509_REQ_set_pubkey(request.get(), key.get()) != 1 ||
      X509_REQ_sign(request.get(), key.get(), EVP_sha256()) == 0) {
    return InternalError("cannot make a certificate request for '" + common_name +
                         "': " + OpenSslError());
  }
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509_REQ(bio.get(), request.get()) != 1) {
    return InternalError("cannot encode a certificate request: " + OpenSslError());
  }
  CertificateRequest made;
  made.request_pem = BioToString(bio.get());
  ASSIGN_OR_RETURN(made.private_key_pem, PrivateKeyPem(key.get()));
  return made;
}

StatusOr<TimePoint> CertificateExpiry(const std::string& certificate_pem) {
  X509Ptr certificate = ParseCertificate(certificate_pem);
  std::tm expiry{};
  if (certificate == nullptr ||
      ASN1_TIME_to_tm(X509_get0_notAfter(certificate.get()), &expiry) != 1) {
    ERR_clear_error();
    return InvalidArgumentError("not a PEM certificate with an expiry");
  }
  return std::chrono::system_clock::from_time_t(::timegm(&expiry));
}

StatusOr<std::string> CertificateCommonName(const std::string& certificate_pem) {
  X509Ptr certificate = ParseCertificate(certificate_pem);
  if (certificate == nullptr) {
    ERR_clear_error();
    return InvalidArgumentError("not a PEM certificate");
  }
  char name[256];
  const int length = X509_NAME_get_text_by_NID(X509_get_subject_name(certificate.get()),
                                               NID_commonName, name, sizeof(name));
  if (length <= 0) return InvalidArgumentError("the certificate names no common name");
  return std::string(name, static_cast<size_t>(length));
}

Status CheckIssuedCertificate(const std::string& ca_pem, const std::string& certificate_pem,
                              const std::string& private_key_pem) {
  X509Ptr ca = ParseCertificate(ca_pem);
  if (ca == nullptr) return InvalidArgumentError("the CA certificate is not a PEM certificate");
  X509Ptr certificate = ParseCertificate(certificate_pem);
  if (certificate == nullptr) return InvalidArgumentError("the certificate is not PEM");
  PkeyPtr key = ParsePrivateKey(private_key_pem);
  if (key == nullptr) return InvalidArgumentError("the private key is not PEM");
  if (X509_check_private_key(certificate.get(), key.get()) != 1) {
    ERR_clear_error();
    return InvalidArgumentError("the private key is not the certificate's");
  }
  if (X509_verify(certificate.get(), X509_get0_pubkey(ca.get())) != 1) {
    ERR_clear_error();
    return InvalidArgumentError("the certificate is not signed by the controller's CA");
  }
  return Status::Ok();
}

StatusOr<TlsIdentity> SelfSignedIdentity(const std::string& common_name, std::string ca_pem,
                                         int validity_days) {
  ASSIGN_OR_RETURN(PkeyPtr key, NewP256Key());
  ASSIGN_OR_RETURN(X509Ptr certificate,
                   NewCertificate(common_name, key.get(), nullptr, DaysFromNow(validity_days)));
  X509* self = certificate.get();
  RETURN_IF_ERROR(AddExtension(self, self, NID_ext_key_usage, "serverAuth"));
  RETURN_IF_ERROR(AddExtension(self, self, NID_subject_alt_name, ("DNS:" + common_name).c_str()));
  RETURN_IF_ERROR(Sign(self, key.get()));
  TlsIdentity identity;
  identity.ca_pem = std::move(ca_pem);
  ASSIGN_OR_RETURN(identity.certificate_pem, CertificatePem(self));
  ASSIGN_OR_RETURN(identity.private_key_pem, PrivateKeyPem(key.get()));
  return identity;
}

std::string EnrollmentCertificateName(const std::string& node) {
  return "enroll-" + node + ".llmctl";
}

std::string AgentCertificateName(const std::string& node) { return "agent-" + node + ".llmctl"; }

std::string AgentCertificateName(const std::string& node, const std::string& registration) {
  return "agent-" + node + "." + registration + ".llmctl";
}

StatusOr<TlsIdentity> LoadTlsIdentity(const std::string& ca_file,
                                      const std::string& certificate_file,
                                      const std::string& private_key_file) {
  TlsIdentity identity;
  ASSIGN_OR_RETURN(identity.ca_pem, ReadFileToString(ca_file, 1 << 20));
  ASSIGN_OR_RETURN(identity.certificate_pem, ReadFileToString(certificate_file, 1 << 20));
  ASSIGN_OR_RETURN(identity.private_key_pem, ReadFileToString(private_key_file, 1 << 20));
  if (ParseCertificate(identity.ca_pem) == nullptr) {
    return InvalidArgumentError(ca_file + ": not a PEM certificate");
  }
  X509Ptr certificate = ParseCertificate(identity.certificate_pem);
  if (certificate == nullptr)
    return InvalidArgumentError(certificate_file + ": not a PEM certificate");
  PkeyPtr key = ParsePrivateKey(identity.private_key_pem);
  if (key == nullptr) return InvalidArgumentError(private_key_file + ": not a PEM private key");
  if (X509_check_private_key(certificate.get(), key.get()) != 1) {
    ERR_clear_error();
    return InvalidArgumentError(private_key_file + " is not the key of " + certificate_file);
  }
  return identity;
}

}  // namespace llmctl::rpc
