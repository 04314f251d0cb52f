#!/usr/bin/env python3
"""The real Blazar (blazar 18.0.0 from PyPI, in .venv-blazar) on 127.0.0.1 for integration tests.

    blazar_local.py --dir DIR --auth-url http://127.0.0.1:PORT/v3 --admin-password PASSWORD
                    --region KVM@TACC --services-url http://127.0.0.1:SIM
                    [--host node-1=gpu_a100_pcie ...]

It needs a running local Keystone (tests/keystone/keystone_local.py, whose catalog came from
--services-url) and the simulator (tests/openstack_sim) at --services-url, serving Nova and Placement for
Blazar's host plugin and accepting that Keystone's tokens. As Keystone's admin it registers Placement in the
catalog and points the reservation service's public endpoint in --region at the real Blazar; as an operator
would, it creates Nova's "freepool" aggregate and adds each --host (a hypervisor name the simulator knows)
to Blazar with its node_type as an extra capability. Everything else lives in DIR (new or empty):
blazar.conf, the SQLite database and the logs (blazar-server.out, blazar.log). It prints one JSON line

    {"url": "http://127.0.0.1:PORT/v1", "pid": <Blazar's process>, "hosts": {"<name>": <Blazar's host id>}}

and serves until SIGINT, SIGTERM or SIGHUP, when it stops Blazar (SIGTERM, oslo.service's clean stop).

Exit status: 0 after a requested stop, 3 when .venv-blazar is missing (scripts/setup.sh --tests installs
it), 1 when Blazar could not be started (the message names the log to read).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from local_process import StartError, empty_dir, exit_on_stop_signal, serve, tail  # noqa: E402

exit_on_stop_signal()

EXIT_MISSING = 3
# Blazar served 28 s after Keystone on two idle cores and 63 s on two loaded ones (blazar_live_test).
START_TIMEOUT_S = 180
SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_PYTHON = os.path.join(SOURCE_DIR, ".venv-blazar", "bin", "python")
SERVER_SCRIPT = os.path.join(SOURCE_DIR, "tests", "blazar", "blazar_server.py")
FREEPOOL = "freepool"
FIND_BLAZAR = "import importlib.util, sys; sys.exit(importlib.util.find_spec('blazar') is None)"


def call(method, url, body=None, token=None):
    """One JSON request; the answer's headers and JSON body (None when empty), or StartError naming it."""
    request = urllib.request.Request(url, method=method,
                                     data=None if body is None else json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    # Blazar answers 400 "Content type '' isn't supported" (after acting) to a request without it.
    request.add_header("Accept", "application/json")
    if token:
        request.add_header("X-Auth-Token", token)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            data = response.read()
            return response.headers, json.loads(data) if data else None
    except urllib.error.HTTPError as error:
        raise StartError(f"{method} {url} answered HTTP {error.code}: "
                         f"{error.read().decode(errors='replace')[:500]}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
        raise StartError(f"{method} {url} failed: {error}") from None


def admin_token(auth_url, password):
    headers, _ = call("POST", auth_url + "/auth/tokens", {"auth": {
        "identity": {"methods": ["password"], "password": {
            "user": {"name": "admin", "domain": {"id": "default"}, "password": password}}},
        "scope": {"project": {"name": "admin", "domain": {"id": "default"}}}}})
    return headers["X-Subject-Token"]


def write_config(directory, args):
    auth = args.auth_url.rstrip("/")
    host_port = auth[len("http://"):auth.rindex("/")]
    host, port = host_port.split(":")
    config = f"""[DEFAULT]
log_file = {directory}/blazar.log
debug = true
transport_url = fake://
os_auth_protocol = http
os_auth_host = {host}
os_auth_port = {port}
os_auth_version = v3
os_admin_username = admin
os_admin_password = {args.admin_password}
os_admin_project_name = admin
os_region_name = {args.region}
endpoint_type = public
[manager]
plugins = physical.host.plugin,flavor.instance.plugin
[database]
connection = sqlite:///{directory}/blazar.db
[keystone_authtoken]
auth_type = password
www_authenticate_uri = {auth}
auth_url = {auth}
username = admin
password = {args.admin_password}
user_domain_name = Default
project_name = admin
project_domain_name = Default
region_name = {args.region}
service_token_roles_required = true
interface = public
[nova]
endpoint_type = public
[placement]
endpoint_type = public
[oslo_concurrency]
lock_path = {directory}/locks
"""
    path = os.path.join(directory, "blazar.conf")
    with open(path, "w") as f:
        f.write(config)
    return path


def start_blazar(directory, config_path, children):
    """blazar_server.py on a new database (it makes the schema); returns it and its port once it serves."""
    port_file = os.path.join(directory, "port")
    log_path = os.path.join(directory, "blazar.log")
    with open(os.path.join(directory, "blazar-server.out"), "w") as out:
        server = children.spawn([VENV_PYTHON, SERVER_SCRIPT, "--config-file", config_path,
                                  "--port-file", port_file, "--create-schema"], stdout=out,
                                 stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise StartError(f"Blazar exited with status {server.returncode} before serving; see "
                             f"{directory}/blazar-server.out and {log_path}:\n"
                             f"{tail(os.path.join(directory, 'blazar-server.out'))}{tail(log_path)}")
        if os.path.exists(port_file):
            with open(port_file) as f:
                port = int(f.read())
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5):
                    return server, port
            except urllib.error.HTTPError:
                return server, port  # it answers (401 without a token)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
        time.sleep(0.1)
    raise StartError(f"Blazar did not serve within {START_TIMEOUT_S} s; see {log_path}")


def register_catalog(auth_url, token, region, services_url, blazar_url):
    """Placement on the simulator; the reservation service's public endpoint in `region` at Blazar."""
    _, body = call("POST", auth_url + "/services", {"service": {"type": "placement", "name": "placement"}},
                   token)
    call("POST", auth_url + "/endpoints", {"endpoint": {
        "service_id": body["service"]["id"], "interface": "public", "region_id": region,
        "url": services_url.rstrip("/") + "/placement"}}, token)
    _, services = call("GET", auth_url + "/services?type=reservation", token=token)
    if len(services["services"]) != 1:
        raise StartError(f"Keystone's catalog has {len(services['services'])} reservation services, not 1"
                         " (start keystone_local.py with --services-url)")
    service_id = services["services"][0]["id"]
    _, endpoints = call("GET", f"{auth_url}/endpoints?service_id={service_id}&interface=public", token=token)
    mine = [e for e in endpoints["endpoints"] if e["region_id"] == region]
    if len(mine) != 1:
        raise StartError(f"Keystone has {len(mine)} public reservation endpoints in {region}, not 1")
    call("PATCH", f"{auth_url}/endpoints/{mine[0]['id']}", {"endpoint": {"url": blazar_url}}, token)


def add_hosts(nova_url, blazar_url, token, hosts):
    """As an operator does: the freepool aggregate, then each host with its node_type."""
    call("POST", nova_url + "/os-aggregates", {"aggregate": {"name": FREEPOOL}}, token)
    ids = {}
    for name, node_type in hosts:
        _, body = call("POST", blazar_url + "/os-hosts", {"name": name, "node_type": node_type}, token)
        ids[name] = body["host"]["id"]
    return ids


def parse_hosts(parser, values):
    hosts = []
    for value in values:
        name, _, node_type = value.partition("=")
        if not name or not node_type:
            parser.error(f"--host {value}: expected NAME=NODE_TYPE")
        hosts.append((name, node_type))
    return hosts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="an empty or new directory for all of Blazar's files")
    parser.add_argument("--auth-url", required=True, help="the local Keystone's, ending in /v3")
    parser.add_argument("--admin-password", required=True, help="Keystone's admin (keystone_local.py's)")
    parser.add_argument("--region", default="KVM@TACC")
    parser.add_argument("--services-url", required=True, help="the simulator's base URL")
    parser.add_argument("--host", action="append", default=[], help="NAME=NODE_TYPE, a host to add")
    args = parser.parse_args()
    hosts = parse_hosts(parser, args.host)
    for flag, url in (("--auth-url", args.auth_url), ("--services-url", args.services_url)):
        if not url.startswith("http://127.0.0.1:"):
            parser.error(f"{flag} {url}: must be an http URL on 127.0.0.1 with a port")
    directory = empty_dir(parser, args.dir)
    # Found, not imported: importing blazar.api.app costs 2.3 s of CPU, and the server does it next.
    if not os.path.exists(VENV_PYTHON) or subprocess.run(
            [VENV_PYTHON, "-c", FIND_BLAZAR], capture_output=True).returncode != 0:
        print(f"blazar_local: no blazar in {os.path.dirname(os.path.dirname(VENV_PYTHON))} "
              "(scripts/setup.sh --tests installs it)", file=sys.stderr)
        return EXIT_MISSING

    def start(children):
        auth_url = args.auth_url.rstrip("/")
        token = admin_token(auth_url, args.admin_password)
        call("POST", args.services_url.rstrip("/") + "/admin/keystone", {"url": auth_url, "admin_token": token})
        config_path = write_config(directory, args)
        server, port = start_blazar(directory, config_path, children)
        blazar_url = f"http://127.0.0.1:{port}/v1"
        register_catalog(auth_url, token, args.region, args.services_url, blazar_url)
        host_ids = add_hosts(args.services_url.rstrip("/") + "/nova/v2.1", blazar_url, token, hosts)
        print(json.dumps({"url": blazar_url, "pid": server.pid, "hosts": host_ids}), flush=True)
        return server, "Blazar", f"{directory}/blazar.log"

    return serve("blazar_local", signal.SIGTERM, start)  # SIGTERM: oslo.service's clean stop


if __name__ == "__main__":
    sys.exit(main())
