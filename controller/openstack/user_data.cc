#include "controller/openstack/user_data.h"

#include <algorithm>
#include <cctype>
#include <string_view>

namespace llmctl::openstack {
namespace {

bool AllOf(std::string_view text, bool (*allowed)(char)) {
  return !text.empty() && std::all_of(text.begin(), text.end(), allowed);
}

bool NameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
}

// Image references and git URLs are pasted into the script inside double quotes: characters
// that the shell would expand there ($ ` \ ") and whitespace are refused.
bool ReferenceChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("-_.:/@+~%=?&,").find(c) != std::string_view::npos;
}

bool HexChar(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

bool PemChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("+/=- \n").find(c) != std::string_view::npos;
}

bool TokenChar(char c) { return c > ' ' && c < 0x7f; }

Status CheckPem(std::string_view pem, const char* field) {
  if (!pem.starts_with("-----BEGIN ") || pem.find("-----END ") == std::string_view::npos ||
      !AllOf(pem, PemChar)) {
    // The field, never the value: a key is a secret.
    return InvalidArgumentError(std::string("bootstrap ") + field + " is not a PEM block");
  }
  return Status::Ok();
}

Status CheckConfig(const BootstrapConfig& config) {
  if (!AllOf(config.node, NameChar) || config.node.size() > 63) {
    return InvalidArgumentError("node name '" + config.node +
                                "' must be 1-63 letters, digits, '-', '_' or '.'");
  }
  if (config.agent_port < 1 || config.agent_port > 65535) {
    return InvalidArgumentError("agent port " + std::to_string(config.agent_port) +
                                " is not in 1-65535");
  }
  const AgentImageSource& source = config.source;
  if (source.image.empty() == source.git_url.empty()) {
    return InvalidArgumentError(
        "the agent image comes from exactly one of a registry image and a git URL");
  }
  if (!source.image.empty() && !AllOf(source.image, ReferenceChar)) {
    return InvalidArgumentError("agent image '" + source.image + "' is not an image reference");
  }
  if (!source.git_url.empty()) {
    if (!AllOf(source.git_url, ReferenceChar) ||
        !(source.git_url.starts_with("https://") || source.git_url.starts_with("git@"))) {
      return InvalidArgumentError("git URL '" + source.git_url +
                                  "' is not an https:// or git@ URL");
    }
    if (source.git_commit.size() != 40 || !AllOf(source.git_commit, HexChar)) {
      return InvalidArgumentError("git commit '" + source.git_commit +
                                  "' is not a full 40-hex commit id (the build is pinned)");
    }
  }
  return Status::Ok();
}

// `text` as a YAML literal block at `indent` spaces, each line indented, ending in a newline.
std::string Block(std::string_view text, int indent) {
  std::string pad(static_cast<size_t>(indent), ' ');
  std::string out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    out += line.empty() ? "\n" : pad + std::string(line) + "\n";
    start = end + 1;
  }
  return out;
}

std::string WriteFile(const std::string& path, const char* permissions, std::string_view content) {
  return "  - path: " + path + "\n    owner: root:root\n    permissions: '" + permissions +
         "'\n    content: |\n" + Block(content, 6);
}

// Replaces an NVIDIA driver too old for llm-train's CUDA, installs Docker and the NVIDIA container
// toolkit the way the labs do, then starts the agent. Rerunnable: each step checks whether it is
// done.
constexpr char kScriptHead[] = R"SH(#!/bin/bash
# llmctl node bootstrap (run once by cloud-init, and once more after a reboot into a newer NVIDIA
# driver): the driver llm-train needs, Docker, the NVIDIA container toolkit, then llm-agent in a
# container with every GPU. The log is /var/log/llmctl-bootstrap.log.
set -euo pipefail
exec >>/var/log/llmctl-bootstrap.log 2>&1
export DEBIAN_FRONTEND=noninteractive

retry() {
  local attempt
  for attempt in 1 2 3 4 5; do
    if "$@"; then return 0; fi
    echo "llmctl-bootstrap: '$*' failed (attempt $attempt of 5)"
    sleep $((attempt * 10))
  done
  return 1
}

install_docker() {
  command -v docker >/dev/null && return 0
  curl -fsSL https://get.docker.com -o /tmp/get-docker.sh
  sh /tmp/get-docker.sh
}

# llm-train's LibTorch (deploy/Dockerfile's torch wheel) is built for CUDA 13, which needs NVIDIA
# driver 580 or newer; Chameleon's CC-Ubuntu24.04-CUDA image ships nvidia-driver-560 (CUDA 12.6;
# docs/architecture.md, "The agent image"). An older driver is replaced by nvidia-driver-580 from
# the image's own apt sources (its NVIDIA CUDA repository) and loaded at once, or after a reboot
# that runs this script again.
NVIDIA_DRIVER_BRANCH=580
PER_BOOT=/var/lib/cloud/scripts/per-boot/llmctl-bootstrap

reload_nvidia_modules() {
  local module
  systemctl stop nvidia-persistenced 2>/dev/null || true
  for module in nvidia_uvm nvidia_drm nvidia_modeset nvidia; do
    if grep -q "^$module " /proc/modules; then rmmod "$module" || return 1; fi
  done
  modprobe nvidia && modprobe nvidia_uvm
}

ensure_nvidia_driver() {
  command -v nvidia-smi >/dev/null || return 0  # no NVIDIA driver: a CPU node
  local version
  version=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  if [ -n "$version" ] && [ "${version%%.*}" -ge "$NVIDIA_DRIVER_BRANCH" ]; then return 0; fi
  echo "llmctl-bootstrap: NVIDIA driver ${version:-unknown} is older than" \
    "$NVIDIA_DRIVER_BRANCH (CUDA 13): installing nvidia-driver-$NVIDIA_DRIVER_BRANCH"
  retry apt-get install -y -q "nvidia-driver-$NVIDIA_DRIVER_BRANCH"
  if reload_nvidia_modules; then return 0; fi
  echo "llmctl-bootstrap: the old driver is in use: rebooting into the new one; this script" \
    "runs again after the reboot"
  mkdir -p "$(dirname "$PER_BOOT")"
  install -m 0700 "$0" "$PER_BOOT"
  systemctl reboot
  exit 0
}

install_nvidia_toolkit() {
  command -v nvidia-ctk >/dev/null && return 0
  local keyring=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
  curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey | gpg --batch --yes --dearmor -o "$keyring"
  curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list |
    sed "s#deb https://#deb [signed-by=$keyring] https://#g" >/etc/apt/sources.list.d/nvidia-container-toolkit.list
  apt-get update -q
  apt-get install -y -q nvidia-container-toolkit
}

retry apt-get update -q
retry apt-get install -y -q ca-certificates curl gnupg jq git
ensure_nvidia_driver
rm -f "$PER_BOOT"
retry install_docker
retry install_nvidia_toolkit
nvidia-ctk runtime configure --runtime=docker
# The labs' fix for https://github.com/NVIDIA/nvidia-container-toolkit/issues/48 (GPUs lost
# from running containers after a systemd daemon-reload): Docker uses the cgroupfs driver.
jq 'if has("exec-opts") then . else . + {"exec-opts": ["native.cgroupdriver=cgroupfs"]} end' \
  /etc/docker/daemon.json >/etc/docker/daemon.json.tmp
mv /etc/docker/daemon.json.tmp /etc/docker/daemon.json
systemctl restart docker
)SH";

constexpr char kScriptTail[] = R"SH(
mkdir -p /var/lib/llmctl
chmod 700 /var/lib/llmctl
docker rm -f llm-agent >/dev/null 2>&1 || true
# The agent waits for the controller to enroll it with the one-time token, then keeps the node's
# certificate, key and token in $CREDENTIALS_DIR (a restart finds them there and skips that).
docker run -d --name llm-agent --restart unless-stopped --gpus all --ipc host \
  -p "$AGENT_PORT:$AGENT_PORT" \
  -v "$CONFIG_DIR:$CONFIG_DIR:ro" -v /var/lib/llmctl:/var/lib/llmctl \
  "$IMAGE" \
  --listen "0.0.0.0:$AGENT_PORT" --data-dir /var/lib/llmctl --node "$NODE" \
  --ca "$CONFIG_DIR/ca.pem" --enrollment-token-file "$CONFIG_DIR/enrollment.token" \
  --cert "$CREDENTIALS_DIR/agent.pem" --key "$CREDENTIALS_DIR/agent.key" \
  --token-file "$CREDENTIALS_DIR/agent.token" --llm-train /usr/local/bin/llm-train
echo "llmctl-bootstrap: llm-agent started on port $AGENT_PORT"
)SH";

}  // namespace

StatusOr<std::string> BootstrapScript(const BootstrapConfig& config) {
  RETURN_IF_ERROR(CheckConfig(config));
  std::string script = kScriptHead;
  script += "\nNODE=\"" + config.node + "\"\nAGENT_PORT=" + std::to_string(config.agent_port) +
            "\nCONFIG_DIR=" + kNodeConfigDir + "\nCREDENTIALS_DIR=" + kNodeCredentialsDir + "\n";
  if (!config.source.image.empty()) {
    script += "IMAGE=\"" + config.source.image + "\"\nretry docker pull \"$IMAGE\"\n";
  } else {
    script += "GIT_URL=\"" + config.source.git_url + "\"\nGIT_COMMIT=" + config.source.git_commit +
              "\nIMAGE=\"llmctl-agent:$GIT_COMMIT\"\n"
              "SOURCE=/opt/llmctl/src\n"
              "if [ ! -d \"$SOURCE/.git\" ]; then\n"
              "  rm -rf \"$SOURCE\"\n"
              "  retry git clone --quiet \"$GIT_URL\" \"$SOURCE\"\n"
              "fi\n"
              "git -C \"$SOURCE\" checkout --quiet --detach \"$GIT_COMMIT\"\n"
              "docker build -f \"$SOURCE/deploy/Dockerfile\" -t \"$IMAGE\" \"$SOURCE\"\n";
  }
  script += kScriptTail;
  return script;
}

StatusOr<std::string> AgentUserData(const BootstrapConfig& config) {
  ASSIGN_OR_RETURN(std::string script, BootstrapScript(config));
  const NodeEnrollment& enrollment = config.enrollment;
  RETURN_IF_ERROR(CheckPem(enrollment.ca_pem, "CA certificate"));
  if (!AllOf(enrollment.enrollment_token, TokenChar)) {
    return InvalidArgumentError(
        "enrollment token is empty or holds whitespace or control characters");
  }
  const std::string dir = kNodeConfigDir;
  std::string user_data =
      "#cloud-config\n"
      "# llmctl: the controller's CA, the node's one-time enrollment token and its bootstrap.\n"
      "write_files:\n" +
      WriteFile(dir + "/ca.pem", "0600", enrollment.ca_pem) +
      WriteFile(dir + "/enrollment.token", "0600", enrollment.enrollment_token) +
      WriteFile("/usr/local/sbin/llmctl-bootstrap", "0700", script) +
      "runcmd:\n"
      "  - [/usr/local/sbin/llmctl-bootstrap]\n";
  if (user_data.size() > kMaxUserDataBytes) {
    return InvalidArgumentError("the node's user data is " + std::to_string(user_data.size()) +
                                " bytes; cloud-init takes at most " +
                                std::to_string(kMaxUserDataBytes));
  }
  return user_data;
}

}  // namespace llmctl::openstack
