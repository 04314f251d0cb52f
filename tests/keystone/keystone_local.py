#!/usr/bin/env python3
"""A real Keystone (Debian's `keystone`, OpenStack Zed) on 127.0.0.1 for integration tests.

    keystone_local.py --dir DIR [--token-expiration SECONDS] [--region KVM@TACC]
                      [--services-url http://127.0.0.1:PORT]

Everything lives in DIR (new or empty): keystone.conf, the SQLite database, the Fernet and
credential key repositories and the logs (keystone-manage.log, uwsgi.log, keystone.log). The script
bootstraps Keystone (admin password, region, identity endpoint), creates a `demo` project and user with the
member role and an unrestricted application credential of that user, registers the catalog services when
--services-url is given (each with its public endpoint in the region, plus decoys a client must not pick: an
internal endpoint under URL/internal and a public one in CHI@UC under URL/other-region), prints one JSON line

    {"auth_url", "port", "region", "username", "password", "project", "project_id", "user_domain",
     "app_cred_id", "app_cred_secret", "admin_password", "pid"}

(admin_password is the bootstrap user "admin"'s, admin of project "admin", which a service such as
tests/blazar's needs; pid is uwsgi's master) and then serves until SIGINT, SIGTERM or SIGHUP, when it stops uwsgi with SIGINT
(uwsgi reloads on SIGTERM by default) and waits for it. uwsgi is bound to this script's life (parent-death
signal, --no-orphans), so no process outlives it even when it is killed.

Exit status: 0 after a requested stop, 3 when the Keystone packages are missing (scripts/setup.sh installs
them), 1 when Keystone could not be started (the message names the log to read).
"""

import argparse
import base64
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from local_process import StartError, empty_dir, exit_on_stop_signal, serve, tail  # noqa: E402

# main() installs the real handlers (serve) before it starts a process.
exit_on_stop_signal()

EXIT_MISSING = 3
START_TIMEOUT_S = 60
# Debian's own python3: keystone's modules live in its dist-packages, whatever python3 runs this script.
SYSTEM_PYTHON = "/usr/bin/python3"
WSGI_FILE = "/usr/bin/keystone-wsgi-public"
UWSGI_PYTHON_PLUGIN = "/usr/lib/uwsgi/plugins/python3_plugin.so"
OTHER_REGION = "CHI@UC"

# The catalog registered with --services-url, as (service type, name, path under the URL). Blazar's and
# Nova's are the simulator's routes (tests/openstack_sim), the others follow their pattern; Keystone
# substitutes $(project_id)s with the token's project, as real Cinder endpoints use it. block-storage and
# volumev3 both name Cinder, as in a Zed deployment.
SERVICES = [
    ("reservation", "blazar", "/blazar"),
    ("compute", "nova", "/nova/v2.1"),
    ("network", "neutron", "/neutron"),
    ("volumev3", "cinderv3", "/cinder/v3/$(project_id)s"),
    ("block-storage", "cinder", "/cinder/v3/$(project_id)s"),
    ("image", "glance", "/glance"),
]

# Keystone's own setup in one interpreter, side by side with uwsgi loading Keystone (each keystone-manage
# process spends most of its time importing keystone, 5-10 s here): keystone-manage db_sync and bootstrap
# (admin, region, identity endpoint), then the catalog and the demo identities through the same provider
# APIs bootstrap uses, which skips ~30 HTTP round trips of ~0.3 s each on a busy machine. The key
# repositories are written by write_keys before uwsgi starts, because it reads them while loading.
MANAGE_SCRIPT = """
import json, os, sys, uuid
from keystone.cmd import cli
from keystone.common import driver_hints, provider_api
setup = json.loads(os.environ["KEYSTONE_LOCAL_SETUP"])
for command in (["db_sync"],
                # "--option=value": a random password may begin with "-", which argparse would take for
                # an option (a CI run failed so, one run in 64).
                ["bootstrap", "--bootstrap-password=" + setup["admin_password"],
                 "--bootstrap-region-id=" + setup["region"], "--bootstrap-public-url=" + setup["auth_url"]]):
    cli.CONF.clear()
    cli.main(argv=["keystone-manage", "--config-file", setup["config_file"]] + command)
apis = provider_api.ProviderAPIs
for region in setup["other_regions"]:
    apis.catalog_api.create_region({"id": region})
for service_type, name, endpoints in setup["services"]:
    service_id = uuid.uuid4().hex
    apis.catalog_api.create_service(service_id, {"id": service_id, "type": service_type, "name": name,
                                                 "enabled": True})
    for interface, region, url in endpoints:
        endpoint_id = uuid.uuid4().hex
        apis.catalog_api.create_endpoint(endpoint_id, {
            "id": endpoint_id, "service_id": service_id, "interface": interface, "region_id": region,
            "url": url, "enabled": True})
project_id = uuid.uuid4().hex
apis.resource_api.create_project(project_id, {"id": project_id, "name": "demo", "domain_id": "default",
                                              "enabled": True, "description": "llmctl's test project"})
user = apis.identity_api.create_user({"name": "demo", "domain_id": "default", "enabled": True,
                                      "password": setup["demo_password"], "default_project_id": project_id})
hints = driver_hints.Hints()
hints.add_filter("name", "member")
hints.add_filter("domain_id", None)
apis.assignment_api.add_role_to_user_and_project(user["id"], project_id, apis.role_api.list_roles(hints)[0]["id"])
print("keystone_local: setup done", json.dumps({"project_id": project_id, "user_id": user["id"]}), flush=True)
"""


def missing_prerequisites():
    missing = [path for path in (SYSTEM_PYTHON, WSGI_FILE, UWSGI_PYTHON_PLUGIN) if not os.path.exists(path)]
    missing += [tool for tool in ("uwsgi",) if shutil.which(tool) is None]
    return missing


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_config(directory, token_expiration):
    config = f"""[DEFAULT]
log_file = {directory}/keystone.log
[database]
connection = sqlite:///{directory}/keystone.db
[token]
provider = fernet
expiration = {token_expiration}
[fernet_tokens]
key_repository = {directory}/fernet-keys
[fernet_receipts]
key_repository = {directory}/fernet-keys
[credential]
key_repository = {directory}/credential-keys
[identity]
# bcrypt's minimum: every password and application-credential secret is hashed; 12 rounds cost 0.3 s each.
password_hash_rounds = 4
[cache]
# What a deployment does with memcached, in-process (one uwsgi worker): tokens, users, roles and the
# catalog are read from the cache instead of ~90 SQLite queries a request. Uncached, issuing a token
# cost 214 ms of CPU and validating one 269 ms; cached 74 and 75 (two busy cores). Expiry is checked
# on every validation, cached or not, and a revocation clears the cache.
enabled = true
backend = dogpile.cache.memory
"""
    path = os.path.join(directory, "keystone.conf")
    with open(path, "w") as f:
        f.write(config)
    # WAL lets the API write while another connection reads; without it creating an application credential
    # fails with "database is locked". The mode is stored in the file, so set it before keystone opens it.
    with sqlite3.connect(os.path.join(directory, "keystone.db")) as db:
        db.execute("PRAGMA journal_mode=WAL")
    return path


def write_keys(directory):
    """What `keystone-manage fernet_setup` and `credential_setup` make: a repository of Fernet keys (32 random
    bytes, urlsafe base64) named by index, 0 the staged key and the highest the primary one."""
    for repository in ("fernet-keys", "credential-keys"):
        path = os.path.join(directory, repository)
        os.mkdir(path, 0o700)
        for index in (0, 1):
            descriptor = os.open(os.path.join(path, str(index)), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as key:
                key.write(base64.urlsafe_b64encode(os.urandom(32)).decode())


def catalog_services(region, services_url):
    """[(type, name, [(interface, region, url)])] for --services-url, with decoys a client must not pick:
    another interface, and the same service at another site."""
    base = services_url.rstrip("/")
    return [(service_type, name, [("public", region, base + path),
                                  ("internal", region, base + "/internal" + path),
                                  ("public", OTHER_REGION, base + "/other-region" + path)])
            for service_type, name, path in SERVICES]


def start_keystone_manage(directory, setup, children):
    with open(os.path.join(directory, "keystone-manage.log"), "w") as log:
        return children.spawn([SYSTEM_PYTHON, "-c", MANAGE_SCRIPT],
                     env=dict(os.environ, KEYSTONE_LOCAL_SETUP=json.dumps(setup)), stdout=log,
                     stderr=subprocess.STDOUT)


def wait_for_keystone_manage(manage, directory):
    """The ids the setup made. Eventlet prints tracebacks at interpreter exit even when every command
    succeeded: success is the exit status and the last step's line."""
    log_path = os.path.join(directory, "keystone-manage.log")
    status = manage.wait()
    with open(log_path, errors="replace") as log:
        done = [line for line in log if line.startswith("keystone_local: setup done ")]
    if status != 0 or not done:
        raise StartError(f"keystone-manage failed (exit status {status}); see {log_path}:\n{tail(log_path)}")
    return json.loads(done[0][len("keystone_local: setup done "):])


def start_uwsgi(directory, config_path, port, children):
    environment = dict(os.environ, OS_KEYSTONE_CONFIG_FILES=config_path)
    command = ["uwsgi", "--plugin", "python3", "--http-socket", f"127.0.0.1:{port}",
               "--wsgi-file", WSGI_FILE, "--master", "--processes", "1", "--threads", "2",
               "--need-app", "--no-orphans", "--die-on-term", "--buffer-size", "65535",
               # uwsgi's http-socket closes every connection after its answer without saying so, and a
               # client that reuses it (the openstack CLI does) gets "connection reset by peer".
               "--add-header", "Connection: close",
               "--logto", os.path.join(directory, "uwsgi.log")]
    return children.spawn(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_until_bound(uwsgi, port, directory):
    """uwsgi binds its socket before it loads Keystone: a port someone else took shows within a second."""
    log_path = os.path.join(directory, "uwsgi.log")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if f"bound to TCP address 127.0.0.1:{port}" in tail(log_path, 100):
            return
        if uwsgi.poll() is not None:
            raise StartError(f"uwsgi exited with status {uwsgi.returncode} before binding port {port};"
                             f" see {log_path}:\n{tail(log_path)}")
        time.sleep(0.05)
    raise StartError(f"uwsgi did not bind port {port} within {START_TIMEOUT_S} s; see {log_path}")


def wait_until_answering(uwsgi, port, directory):
    log_path = os.path.join(directory, "uwsgi.log")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if uwsgi.poll() is not None:
            raise StartError(f"uwsgi exited with status {uwsgi.returncode} before answering on port {port};"
                             f" see {log_path}:\n{tail(log_path)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v3", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise StartError(f"Keystone did not answer on port {port} within {START_TIMEOUT_S} s; see {log_path}")


def bind_free_port(directory, config_path, children):
    """uwsgi on a port nobody uses: another process may take the probed port before uwsgi binds it, then
    another one is tried. Returns uwsgi (still loading Keystone) and its port."""
    for attempt in range(3):
        port = free_port()
        uwsgi = start_uwsgi(directory, config_path, port, children)
        try:
            wait_until_bound(uwsgi, port, directory)
            return uwsgi, port
        except StartError:
            if attempt == 2 or "Address already in use" not in tail(os.path.join(directory, "uwsgi.log")):
                raise


def post(url, body, token=None):
    """POST a JSON body to Keystone; the answer's headers and JSON body, or StartError naming the call."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("X-Auth-Token", token)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.headers, json.loads(response.read().decode())
    except urllib.error.HTTPError as error:
        raise StartError(f"Keystone answered POST {url} with HTTP {error.code}: "
                         f"{error.read().decode(errors='replace')[:500]}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
        raise StartError(f"POST {url} failed: {error}") from None


def create_application_credential(auth_url, user_id, password):
    """As the demo user would, through the API. Unrestricted: Blazar refuses leases from a restricted
    credential (it creates trusts)."""
    headers, _ = post(auth_url + "/auth/tokens", {"auth": {
        "identity": {"methods": ["password"], "password": {
            "user": {"id": user_id, "password": password}}},
        "scope": {"project": {"name": "demo", "domain": {"id": "default"}}}}})
    _, body = post(f"{auth_url}/users/{user_id}/application_credentials",
                   {"application_credential": {"name": "llmctl-test", "unrestricted": True}},
                   token=headers["X-Subject-Token"])
    return body["application_credential"]["id"], body["application_credential"]["secret"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="an empty or new directory for all of Keystone's files")
    parser.add_argument("--token-expiration", type=int, default=3600, help="token lifetime in seconds")
    parser.add_argument("--region", default="KVM@TACC")
    parser.add_argument("--services-url", default="",
                        help="base URL of the services to register in the catalog (the simulator's)")
    args = parser.parse_args()
    directory = empty_dir(parser, args.dir)
    if args.token_expiration < 2:
        parser.error(f"--token-expiration {args.token_expiration}: must be at least 2 seconds")
    if args.services_url and not args.services_url.startswith(("http://127.", "http://localhost")):
        parser.error(f"--services-url {args.services_url}: must be an http URL on loopback")
    missing = missing_prerequisites()
    if missing:
        print(f"keystone_local: missing {', '.join(missing)} (scripts/setup.sh installs keystone and uwsgi)",
              file=sys.stderr)
        return EXIT_MISSING

    def start(children):
        config_path = write_config(directory, args.token_expiration)
        write_keys(directory)
        uwsgi, port = bind_free_port(directory, config_path, children)
        auth_url = f"http://127.0.0.1:{port}/v3"
        demo_password = secrets.token_urlsafe(16)
        admin_password = secrets.token_urlsafe(16)
        setup = {"config_file": config_path, "admin_password": admin_password, "region": args.region,
                 "auth_url": auth_url, "demo_password": demo_password,
                 "other_regions": [OTHER_REGION] if args.services_url else [],
                 "services": catalog_services(args.region, args.services_url) if args.services_url else []}
        manage = start_keystone_manage(directory, setup, children)
        ids = wait_for_keystone_manage(manage, directory)
        wait_until_answering(uwsgi, port, directory)
        app_cred_id, app_cred_secret = create_application_credential(auth_url, ids["user_id"], demo_password)
        print(json.dumps({"auth_url": auth_url, "port": port, "region": args.region, "username": "demo",
                          "password": demo_password, "project": "demo", "project_id": ids["project_id"],
                          "user_domain": "Default", "app_cred_id": app_cred_id, "app_cred_secret": app_cred_secret,
                          "admin_password": admin_password, "pid": uwsgi.pid}), flush=True)
        return uwsgi, "uwsgi", f"{directory}/uwsgi.log"

    return serve("keystone_local", signal.SIGINT, start)  # SIGINT: uwsgi reloads on SIGTERM


if __name__ == "__main__":
    sys.exit(main())
