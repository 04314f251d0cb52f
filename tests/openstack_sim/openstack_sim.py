#!/usr/bin/env python3
"""A stateful OpenStack simulator for llmctl's tests (Python standard library only).

Follows ../shared/reference/openstack-api.md for Keystone v3, Blazar v1, Nova (flavors, key pairs, servers),
Cinder volumes, Neutron (networks, ports, security groups and rules, floating IPs) and Glance images. It listens
on 127.0.0.1 port 0 and prints "PORT <n>" as its only line of output. Time is the simulator's own:
it starts at --now and moves only when a test asks (POST /admin/advance), so lease and token
lifetimes are deterministic. With --wall-clock it follows the system's clock instead (plus any
/admin/advance), for tests that run the real llmctl binary, whose clock is the system's.

Fixed identities (tests use these):
  password user      name "demo" (id "u-demo", domain Default), password "demo-password"
  project            name "demo-project", id "p-demo", domain Default
  app credentials    id "ac-unrestricted" / secret "ac-secret"; id "ac-restricted" / secret
                     "ac-secret" (Blazar answers its lease creates with 500, as on Chameleon)
  OIDC (v3oidcpassword) discovery at /oidc/.well-known/openid-configuration, user "oidc-user",
                     password "oidc-password", identity provider "chameleon", protocol "openid"

Admin endpoints (no token needed):
  GET  /admin/time                  {"now": "<iso>"}
  POST /admin/advance               {"seconds": n}: moves the clock, leases change state
  POST /admin/faults                {"method", "path" (prefix), "status" | "delay_ms", "count",
                                     "after": true to act first and delay the answer}
  POST /admin/revoke_tokens         every issued token answers 401 from now on
  POST /admin/capacity              {"flavor": {"<flavor id>": n}, "hosts": [{"id","node_type"}]}
  POST /admin/fail_lease            {"name"}: the lease goes to ERROR when it should start
  POST /admin/lease_status          {"name", "status"}: puts a lease in a status, e.g. UPDATING, in which
                                    Blazar's manager is at work on it
  POST /admin/keystone              {"url", "admin_token"}: also accept tokens that real Keystone
                                    validates (tests/blazar: the real Blazar calls Nova and Placement here)
  POST /admin/compute               {"build_seconds": n, "delete_seconds": n,
                                     "fail_servers": {"<name>": "<fault>"}}: how long BUILD and a
                                    delete last; named servers end in ERROR with that fault
  POST /admin/storage               {"volume_seconds": n}: how long a volume stays "creating"
  POST /admin/images                {"page_size": n, "add": [{"id", "name"}]}
  POST /admin/floating_ip_pool      {"size": n}: how many 127.0.0.x addresses Neutron can hand out
  GET  /admin/books                 what exists (leases, private flavors, servers, volumes, ports,
                                    security groups, floating IPs) and every request seen; a
                                    server's user_data is there as sent (base64), as Nova shows
                                    admins OS-EXT-SRV-ATTR:user_data

Servers are limited by their reservation: at most `amount` live servers per flavor:instance
reservation, one per host of a physical:host reservation; beyond that a server ends in ERROR with
"No valid host was found", as Nova's scheduler answers. Floating IPs are 127.0.0.x only.
"""
import argparse
import base64
import datetime as dt
import json
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, urlparse

UTC = dt.timezone.utc
PROJECT = {"id": "p-demo", "name": "demo-project", "domain": {"id": "default", "name": "Default"}}
USER = {"id": "u-demo", "name": "demo", "domain": {"id": "default", "name": "Default"}}
APP_CREDENTIALS = {"ac-unrestricted": ("ac-secret", True), "ac-restricted": ("ac-secret", False)}
PUBLIC_FLAVORS = [
    {"id": "f-small", "name": "m1.small", "vcpus": 1, "ram": 2048, "disk": 20},
    {"id": "f-h100-1", "name": "g1.h100.pci.1", "vcpus": 16, "ram": 131072, "disk": 0},
    {"id": "f-h100-4", "name": "g1.h100.pci.4", "vcpus": 64, "ram": 524288, "disk": 0},
    {"id": "f-baremetal", "name": "baremetal", "vcpus": 1, "ram": 1024, "disk": 0},
]
KEYPAIRS = {"demo-key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDemoKeyForTheSimulatorOnly demo"}
# The reservation types llmctl does not make, and the fields Blazar (upstream for floating IPs,
# Chameleon's fork for the others) requires of each.
OTHER_RESERVATIONS = {"virtual:floatingip": ("network_id", "amount"),
                      "device": ("min", "max", "resource_properties"),
                      "network": ("network_name", "network_properties", "resource_properties")}
NETWORKS = [{"id": "net-sharednet1", "name": "sharednet1", "router:external": False},
            {"id": "net-public", "name": "public", "router:external": True}]
SERVER_DELETE_SECONDS = 3


# Blazar's stable lease states; in the others (CREATING, STARTING, UPDATING, TERMINATING, DELETING) its
# manager is at work and an update is refused.
LEASE_STABLE = ("PENDING", "ACTIVE", "TERMINATED", "ERROR")


def fmt_blazar(t):
    return t.strftime("%Y-%m-%dT%H:%M:%S.000000")


def fmt_iso(t):
    return t.strftime("%Y-%m-%dT%H:%M:%S.000000Z")


class State:
    def __init__(self, now, token_ttl, region):
        self.lock = threading.Lock()
        self.now = now
        self.token_ttl = token_ttl
        self.region = region
        self.tokens = {}  # id -> {"expires": datetime, "scoped": bool, "method": str}
        self.leases = {}  # id -> lease dict (API shape, plus private keys starting with "_")
        self.private_flavors = {}  # reservation id -> flavor dict
        self.faults = []
        self.requests = []
        self.flavor_capacity = {"f-h100-1": 2, "f-h100-4": 1, "f-small": 100}
        self.hosts = [{"id": "1", "node_type": "gpu_a100_pcie"},
                      {"id": "2", "node_type": "gpu_a100_pcie"},
                      {"id": "3", "node_type": "compute_cascadelake"}]
        self.failing_leases = set()
        self.access_tokens = set()
        self.reservation_suffix = ""
        self.images = [{"id": "img-cuda-2404", "name": "CC-Ubuntu24.04-CUDA"},
                       {"id": "img-ubuntu-2404", "name": "CC-Ubuntu24.04"},
                       {"id": "img-ubuntu-2204", "name": "CC-Ubuntu22.04"}]
        self.image_page_size = 25
        self.build_seconds = 60
        self.delete_seconds = SERVER_DELETE_SECONDS
        self.wall_clock_offset = None  # --wall-clock: now = system time + this
        self.volume_seconds = 30
        self.fail_servers = {}  # server name -> fault message
        self.servers = {}  # id -> server (API shape, plus private keys starting with "_")
        self.volumes = {}
        self.ports = {}
        self.security_groups = {}
        self.floating_ips = {}
        self.floating_ip_pool = 20
        # What Blazar's host and flavor plugins ask Nova and Placement about (tests/blazar): aggregates by
        # id, the resource providers it creates (the hosts' own are derived from self.hosts), their
        # inventories, the resource classes it creates, and the real
        # Keystone whose tokens are accepted besides this simulator's own (POST /admin/keystone).
        self.aggregates = {}
        self.next_aggregate_id = 1
        self.created_providers = {}  # uuid -> provider
        self.provider_inventories = {}  # uuid of a created provider -> {resource class: inventory}
        self.resource_classes = set()  # the CUSTOM_ classes created through the API
        self.keystone_url = None
        self.keystone_admin_token = None
        self.keystone_tokens = {}  # token -> expiry (datetime) as that Keystone said

    # --- servers and volumes over time ---
    def tick_resources(self):
        for volume in self.volumes.values():
            if volume["status"] == "creating" and self.now >= volume["_ready"]:
                volume["status"] = "available"
        for server in list(self.servers.values()):
            if server.get("_deleting") is not None:
                if self.now >= server["_deleting"]:
                    self.remove_server(server)
                continue
            if server["status"] == "BUILD" and self.now >= server["_ready"]:
                fault = self.fail_servers.get(server["name"]) or self.no_valid_host(server)
                if fault:
                    server["status"] = "ERROR"
                    server["fault"] = {"code": 500, "message": fault,
                                       "created": fmt_iso(self.now)}
                else:
                    server["status"] = "ACTIVE"

    def no_valid_host(self, server):
        """Nova's scheduler: a reserved flavor or hint admits as many servers as the reservation holds."""
        reservation, allowed = server["_reservation"], None
        for lease in self.leases.values():
            for res in lease["reservations"]:
                # Blazar's Nova filter admits servers on hosts of a host or flavor reservation only.
                if res["id"] == reservation and res["resource_type"] in ("physical:host",
                                                                         "flavor:instance"):
                    if lease["status"] != "ACTIVE":
                        return "No valid host was found. Reservation %s is not active." % reservation
                    allowed = res.get("amount") or len(res.get("_hosts", []))
        if reservation is None:
            if server["flavor"]["id"] == "f-baremetal":
                return "No valid host was found. Bare-metal hosts are reserved: pass a reservation hint."
            return None
        if allowed is None:
            return "No valid host was found. Unknown reservation %s." % reservation
        running = [s for s in self.servers.values() if s["_reservation"] == reservation
                   and s["status"] == "ACTIVE" and s.get("_deleting") is None]
        if len(running) >= allowed:
            return "No valid host was found. There are not enough hosts available."
        return None

    def remove_server(self, server):
        del self.servers[server["id"]]
        for port in [p for p in self.ports.values() if p["device_id"] == server["id"]]:
            del self.ports[port["id"]]
            for fip in self.floating_ips.values():
                if fip["port_id"] == port["id"]:
                    fip.update(port_id=None, fixed_ip_address=None, status="DOWN")
        for volume in self.volumes.values():
            volume["attachments"] = [a for a in volume["attachments"]
                                     if a["server_id"] != server["id"]]
            if volume["status"] == "in-use" and not volume["attachments"]:
                volume["status"] = "available"

    # --- leases over time ---
    def tick(self):
        for lease in self.leases.values():
            start, end = lease["_start"], lease["_end"]
            if lease["status"] in ("ERROR", "TERMINATED"):
                continue
            if self.now >= end:
                self.set_status(lease, "TERMINATED", "deleted")
                for res in lease["reservations"]:
                    self.private_flavors.pop(res["id"], None)
            elif self.now > start and lease["status"] == "PENDING":
                # Strictly after: the start event runs on a later tick, as Blazar's periodic task does.
                if lease["name"] in self.failing_leases:
                    self.set_status(lease, "ERROR", "error")
                    continue
                self.set_status(lease, "ACTIVE", "active")
                for res in lease["reservations"]:
                    if res["resource_type"] == "flavor:instance":
                        self.private_flavors[res["id"]] = self.reservation_flavor(res)
        self.tick_resources()

    @staticmethod
    def set_status(lease, status, reservation_status):
        lease["status"] = status
        for res in lease["reservations"]:
            res["status"] = reservation_status
        for event in lease["events"]:
            if event["event_type"] == "start_lease" and status in ("ACTIVE", "TERMINATED"):
                event["status"] = "DONE"
            if event["event_type"] == "end_lease" and status == "TERMINATED":
                event["status"] = "DONE"

    @staticmethod
    def reservation_flavor(res):
        base = next(f for f in PUBLIC_FLAVORS if f["id"] == res["_flavor"])
        custom = "resources:CUSTOM_RESERVATION_" + res["id"].upper().replace("-", "_")
        return dict(base, id=res["id"], name="reservation:" + res["id"],
                    extra_specs={"aggregate_instance_extra_specs:reservation": res["id"],
                                 custom: "1"},
                    _projects={PROJECT["id"]})

    def overlapping(self, start, end, exclude=None):
        for lease in self.leases.values():
            if lease["id"] == exclude or lease["status"] in ("ERROR", "TERMINATED"):
                continue
            if lease["_start"] < end and start < lease["_end"]:
                yield lease

    def capacity_problem(self, reservations, start, end, exclude=None):
        for res in reservations:
            if res["resource_type"] == "flavor:instance":
                asked = res["_flavor"]
                used = sum(r.get("amount", 0) for l in self.overlapping(start, end, exclude)
                           for r in l["reservations"] if r.get("_flavor") == asked)
                if used + res["amount"] > self.flavor_capacity.get(asked, 0):
                    return True
            elif res["resource_type"] == "physical:host":
                busy = {h for l in self.overlapping(start, end, exclude)
                        for r in l["reservations"] for h in r.get("_hosts", [])}
                free = [h for h in self.hosts if h["node_type"] == res["_node_type"]
                        and h["id"] not in busy]
                if len(free) < res["min"]:
                    return True
                res["_hosts"] = [h["id"] for h in free[:res["min"]]]
        return False


STATE = None


class ApiError(Exception):
    def __init__(self, status, body):
        super().__init__(status)
        self.status = status
        self.body = body


def blazar_error(status, message):
    return ApiError(status, {"error_code": status, "error_message": message, "error_name": status})


def placement_error(status, title, detail, code="placement.undefined_code"):
    return ApiError(status, {"errors": [{"status": status, "title": title, "detail": detail,
                                         "code": code}]})


def keystone_error(status, message):
    titles = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}
    return ApiError(status, {"error": {"code": status, "title": titles.get(status, "Error"),
                                       "message": message}})


def nova_error(status, message):
    keys = {400: "badRequest", 403: "forbidden", 404: "itemNotFound", 409: "conflictingRequest"}
    return ApiError(status, {keys.get(status, "computeFault"): {"code": status, "message": message}})


def neutron_error(status, kind, message):
    return ApiError(status, {"NeutronError": {"type": kind, "message": message, "detail": ""}})


def cinder_error(status, message):
    keys = {400: "badRequest", 404: "itemNotFound"}
    return ApiError(status, {keys.get(status, "computeFault"): {"code": status, "message": message}})


def keystone_accepts(token):
    """Whether the real Keystone at STATE.keystone_url takes `token`, asked with that Keystone's admin token
    (a trust-scoped token may not validate itself: 403), cached until the expiry it names. Called under
    STATE.lock: Keystone never calls back here."""
    now = dt.datetime.now(UTC)
    if not token or STATE.keystone_tokens.get(token, now) > now:
        return bool(token)
    request = urllib.request.Request(STATE.keystone_url + "/auth/tokens?nocatalog",
                                     headers={"X-Auth-Token": STATE.keystone_admin_token,
                                              "X-Subject-Token": token})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            expires = json.loads(response.read())["token"]["expires_at"]
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError, KeyError):
        return False
    STATE.keystone_tokens[token] = dt.datetime.fromisoformat(expires.replace("Z", "+00:00"))
    return True


def new_id(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


def parse_blazar_date(text):
    """Blazar's LEASE_DATE_FORMAT and nothing else: seconds are refused as the real manager refuses them."""
    try:
        return dt.datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
    except (TypeError, ValueError):
        raise blazar_error(400, "%s is an invalid date. Required format: %%Y-%%m-%%d %%H:%%M" % text)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def base_url(self):
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def send_json(self, status, body, headers=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("X-Openstack-Request-Id", "req-" + uuid.uuid4().hex[:12])
        if body is not None:
            self.send_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (a test's timeout fault): nothing to tell it


    def handle_any(self):
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = url.path
        delay_before = delay_after = 0
        with STATE.lock:
            if STATE.wall_clock_offset is not None:
                STATE.now = dt.datetime.now(UTC) + STATE.wall_clock_offset
            STATE.requests.append({"method": self.command, "path": path})
            fault = next((f for f in STATE.faults if f["count"] > 0
                          and f.get("method", self.command) == self.command
                          and path.startswith(f["path"])), None)
            if fault is not None:
                fault["count"] -= 1
                if "status" in fault:
                    STATE.requests[-1]["status"] = fault["status"]
                    self.send_json(fault["status"], {"error_code": fault["status"],
                                                     "error_message": "injected fault"})
                    return
                if fault.get("after"):
                    delay_after = fault["delay_ms"]
                else:
                    delay_before = fault["delay_ms"]
        if delay_before:
            time.sleep(delay_before / 1000)
        try:
            with STATE.lock:
                STATE.tick()
                status, body, headers = self.route(path, parse_qs(url.query), raw)
                STATE.requests[-1]["status"] = status
        except ApiError as error:
            status, body, headers = error.status, error.body, None
            with STATE.lock:
                STATE.requests[-1]["status"] = status
        if delay_after:
            time.sleep(delay_after / 1000)
        self.send_json(status, body, headers)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = handle_any

    def json_body(self, raw):
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            raise blazar_error(400, "Malformed JSON in request body")

    def require_token(self):
        token = STATE.tokens.get(self.headers.get("X-Auth-Token", ""))
        if token is None and STATE.keystone_url and keystone_accepts(self.headers.get("X-Auth-Token", "")):
            return
        if token is None or token["revoked"] or STATE.now >= token["expires"]:
            raise keystone_error(401, "The request you have made requires authentication.")
        if not token["scoped"]:
            raise keystone_error(401, "An unscoped token cannot call services.")

    def route(self, path, query, raw):
        if path.startswith("/admin/"):
            return self.admin(path[len("/admin/"):], raw)
        if path.startswith("/oidc/"):
            return self.oidc(path[len("/oidc/"):], raw)
        if path.startswith("/v3/"):
            return self.keystone(path[len("/v3/"):], raw)
        if path.startswith("/blazar/v1/"):
            self.require_token()
            if "application/json" not in self.headers.get("Accept", ""):
                # Blazar's own answer to a request without it (the real one acts on it first).
                raise blazar_error(400, "Content type '%s' isn't supported" % self.headers.get("Accept", ""))
            return self.blazar(path[len("/blazar/v1/"):], query, raw)
        if path.startswith("/nova/v2.1/"):
            self.require_token()
            return self.nova(path[len("/nova/v2.1/"):], query, raw)
        if path.startswith("/cinder/v3/%s/" % PROJECT["id"]):
            self.require_token()
            return self.cinder(path[len("/cinder/v3/%s/" % PROJECT["id"]):], raw)
        if path.startswith("/neutron/v2.0/"):
            self.require_token()
            return self.neutron(path[len("/neutron/v2.0/"):], query, raw)
        if path.startswith("/glance/v2/"):
            self.require_token()
            return self.glance(path[len("/glance/v2/"):], query)
        if path.startswith("/placement/"):
            self.require_token()
            return self.placement(path[len("/placement/"):], query, raw)
        if path.rstrip("/") in ("/nova", "/cinder", "/neutron", "/glance", "/blazar"):
            return self.versions(path.strip("/"))
        raise ApiError(404, {"error": "no route for " + path})

    # --- admin ---
    def admin(self, what, raw):
        body = self.json_body(raw)
        if what == "time":
            return 200, {"now": fmt_iso(STATE.now)}, None
        if what == "advance":
            STATE.now += dt.timedelta(seconds=body["seconds"])
            if STATE.wall_clock_offset is not None:
                STATE.wall_clock_offset += dt.timedelta(seconds=body["seconds"])
            STATE.tick()
            return 200, {"now": fmt_iso(STATE.now)}, None
        if what == "faults":
            STATE.faults.append(body)
            return 200, {}, None
        if what == "revoke_tokens":
            for token in STATE.tokens.values():
                token["revoked"] = True
            return 200, {}, None
        if what == "capacity":
            STATE.flavor_capacity.update(body.get("flavor", {}))
            if "hosts" in body:
                STATE.hosts = body["hosts"]
            return 200, {}, None
        if what == "fail_lease":
            STATE.failing_leases.add(body["name"])
            return 200, {}, None
        if what == "lease_status":
            lease = next(l for l in STATE.leases.values() if l["name"] == body["name"])
            lease["status"] = body["status"]
            return 200, {}, None
        if what == "keystone":
            STATE.keystone_url = body["url"].rstrip("/")
            STATE.keystone_admin_token = body["admin_token"]
            return 200, {}, None
        if what == "compute":
            STATE.build_seconds = body.get("build_seconds", STATE.build_seconds)
            STATE.delete_seconds = body.get("delete_seconds", STATE.delete_seconds)
            STATE.fail_servers.update(body.get("fail_servers", {}))
            return 200, {}, None
        if what == "storage":
            STATE.volume_seconds = body.get("volume_seconds", STATE.volume_seconds)
            return 200, {}, None
        if what == "images":
            STATE.image_page_size = body.get("page_size", STATE.image_page_size)
            STATE.images += body.get("add", [])
            return 200, {}, None
        if what == "floating_ip_pool":
            STATE.floating_ip_pool = body["size"]
            return 200, {}, None
        if what == "books":
            def names(table, *keys):
                return [{k: item.get(k) for k in ("id", "name") + keys} for item in table.values()]
            return 200, {
                "now": fmt_iso(STATE.now),
                "leases": [self.lease_view(l) for l in STATE.leases.values()],
                "private_flavors": sorted(STATE.private_flavors),
                "servers": [dict(id=s["id"], name=s["name"], status=s["status"],
                                 user_data=s.get("_user_data")) for s in STATE.servers.values()],
                "volumes": names(STATE.volumes, "status"),
                "ports": names(STATE.ports, "device_id"),
                "security_groups": names(STATE.security_groups, "description"),
                "floating_ips": [{k: f[k] for k in ("id", "floating_ip_address", "port_id",
                                                    "description")}
                                 for f in STATE.floating_ips.values()],
                "tokens_issued": len(STATE.tokens),
                "requests": STATE.requests[:-1],
            }, None
        raise ApiError(404, {"error": "no admin route " + what})

    # --- OpenID Connect (Chameleon's Keycloak) ---
    def oidc(self, what, raw):
        if what == ".well-known/openid-configuration":
            return 200, {"issuer": self.base_url() + "/oidc",
                         "token_endpoint": self.base_url() + "/oidc/token"}, None
        if what == "token":
            form = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
            if form.get("grant_type") != "password" or "openid" not in form.get("scope", ""):
                raise ApiError(400, {"error": "invalid_request"})
            if (form.get("username"), form.get("password")) != ("oidc-user", "oidc-password"):
                raise ApiError(401, {"error": "invalid_grant",
                                     "error_description": "Invalid user credentials"})
            access = "at-" + uuid.uuid4().hex
            STATE.access_tokens.add(access)
            return 200, {"access_token": access, "token_type": "Bearer", "expires_in": 300}, None
        raise ApiError(404, {"error": "no oidc route " + what})

    # --- Keystone ---
    def catalog(self):
        base = self.base_url()
        def service(type_, url):
            return {"type": type_, "name": type_, "id": "svc-" + type_, "endpoints": [
                {"id": "ep-%s-pub" % type_, "interface": "public", "region": STATE.region,
                 "region_id": STATE.region, "url": url},
                {"id": "ep-%s-int" % type_, "interface": "internal", "region": STATE.region,
                 "region_id": STATE.region, "url": "http://internal.invalid/" + type_},
                {"id": "ep-%s-other" % type_, "interface": "public", "region": "CHI@Elsewhere",
                 "region_id": "CHI@Elsewhere", "url": "http://elsewhere.invalid/" + type_}]}
        # Whether Chameleon's reservation URL ends in /v1 is not confirmed: tests try both.
        return [service("reservation", base + "/blazar" + STATE.reservation_suffix),
                service("compute", base + "/nova/v2.1"),
                service("volumev3", base + "/cinder/v3/" + PROJECT["id"]),
                service("network", base + "/neutron"),
                service("image", base + "/glance"),
                service("identity", base + "/v3")]

    def issue_token(self, method, scoped, status=201):
        token_id = "tok-" + uuid.uuid4().hex
        expires = STATE.now + dt.timedelta(seconds=STATE.token_ttl)
        STATE.tokens[token_id] = {"expires": expires, "scoped": scoped, "revoked": False}
        token = {"methods": [method], "expires_at": fmt_iso(expires),
                 "issued_at": fmt_iso(STATE.now), "user": USER}
        if scoped:
            token.update(project=PROJECT, catalog=self.catalog(),
                         roles=[{"id": "r-member", "name": "member"}])
        return status, {"token": token}, {"X-Subject-Token": token_id}

    def check_scope(self, scope):
        project = (scope or {}).get("project")
        if project is None:
            raise keystone_error(401, "A project scope is required here.")
        if project.get("id") == PROJECT["id"]:
            return
        domain = project.get("domain", {})
        if project.get("name") == PROJECT["name"] and (
                domain.get("id") == "default" or domain.get("name") == "Default"):
            return
        raise keystone_error(401, "The request you have made requires authentication.")

    def keystone(self, what, raw):
        if what == "OS-FEDERATION/identity_providers/chameleon/protocols/openid/auth":
            auth = self.headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or auth[7:] not in STATE.access_tokens:
                raise keystone_error(401, "Invalid OpenID Connect access token.")
            return self.issue_token("openid", scoped=False)
        if what != "auth/tokens" or self.command != "POST":
            raise keystone_error(404, "Could not find the requested resource.")
        try:
            auth = json.loads(raw)["auth"]
            identity = auth["identity"]
            methods = identity["methods"]
        except (ValueError, KeyError, TypeError):
            raise keystone_error(400, "Expecting to find auth in request body.")
        if methods == ["password"]:
            user = identity["password"]["user"]
            by_id = user.get("id") == USER["id"]
            by_name = user.get("name") == USER["name"] and (
                user.get("domain", {}).get("id") == "default"
                or user.get("domain", {}).get("name") == "Default")
            if not (by_id or by_name) or user.get("password") != "demo-password":
                raise keystone_error(401, "The request you have made requires authentication.")
            self.check_scope(auth.get("scope"))
            return self.issue_token("password", scoped=True)
        if methods == ["application_credential"]:
            cred = identity["application_credential"]
            known = APP_CREDENTIALS.get(cred.get("id"))
            if known is None or known[0] != cred.get("secret"):
                raise keystone_error(401, "The request you have made requires authentication.")
            if "scope" in auth:
                raise keystone_error(401, "Application credentials cannot request a scope.")
            status, body, headers = self.issue_token("application_credential", scoped=True)
            body["token"]["application_credential"] = {
                "id": cred["id"], "restricted": not known[1]}
            STATE.tokens[headers["X-Subject-Token"]]["unrestricted"] = known[1]
            return status, body, headers
        if methods == ["token"]:
            old = STATE.tokens.get(identity["token"]["id"])
            if old is None or old["revoked"] or STATE.now >= old["expires"]:
                raise keystone_error(401, "The request you have made requires authentication.")
            self.check_scope(auth.get("scope"))
            return self.issue_token("token", scoped=True)
        raise keystone_error(401, "Unsupported authentication method %s" % methods)

    # --- Blazar ---
    def lease_view(self, lease):
        return {k: v for k, v in lease.items() if not k.startswith("_")} | {
            "reservations": [{k: v for k, v in r.items() if not k.startswith("_")}
                             for r in lease["reservations"]]}

    def find_lease(self, lease_id):
        lease = STATE.leases.get(lease_id)
        if lease is None:
            raise blazar_error(404, "Object with {'lease_id': '%s'} not found" % lease_id)
        return lease

    def blazar(self, what, query, raw):
        parts = what.strip("/").split("/")
        if parts == ["leases"] and self.command == "GET":
            return 200, {"leases": [self.lease_view(l) for l in STATE.leases.values()]}, None
        if parts == ["leases"] and self.command == "POST":
            return self.create_lease(self.json_body(raw))
        if len(parts) == 2 and parts[0] == "leases":
            lease = self.find_lease(parts[1])
            if self.command == "GET":
                return 200, {"lease": self.lease_view(lease)}, None
            if self.command == "DELETE":
                for res in lease["reservations"]:
                    STATE.private_flavors.pop(res["id"], None)
                del STATE.leases[lease["id"]]
                return 204, None, None
            if self.command == "PUT":
                return self.update_lease(lease, self.json_body(raw))
        if parts == ["os-hosts"] and self.command == "GET":
            return 200, {"hosts": [dict(h, hypervisor_hostname="node-" + h["id"])
                                   for h in STATE.hosts]}, None
        if parts == ["os-hosts", "allocations"] and self.command == "GET":
            allocations = []
            for host in STATE.hosts:
                reservations = [{"id": r["id"], "lease_id": l["id"],
                                 "start_date": fmt_blazar(l["_start"]),
                                 "end_date": fmt_blazar(l["_end"])}
                                for l in STATE.leases.values()
                                if l["status"] not in ("ERROR", "TERMINATED")
                                for r in l["reservations"] if host["id"] in r.get("_hosts", [])]
                allocations.append({"resource_id": host["id"], "reservations": reservations})
            return 200, {"allocations": allocations}, None
        raise blazar_error(404, "no Blazar route " + what)

    def create_lease(self, body):
        token = STATE.tokens[self.headers["X-Auth-Token"]]
        if token.get("unrestricted") is False:
            raise blazar_error(500, "Internal Server Error")
        name = body.get("name")
        if not name:
            raise blazar_error(400, "'name' is a required property")
        now_minute = STATE.now.replace(second=0, microsecond=0)
        if body.get("start_date") == "now":
            start = STATE.now
        else:
            start = parse_blazar_date(body.get("start_date", ""))
            if start < now_minute:
                raise blazar_error(400, "Start date must be later than current date")
        end = parse_blazar_date(body.get("end_date", ""))
        if end <= start:
            raise blazar_error(400, "End date must be later than start date.")
        reservations = body.get("reservations")
        if not isinstance(reservations, list) or not reservations:
            raise blazar_error(400, "'reservations' must be a non-empty list")
        lease_id = str(uuid.uuid4())
        stored = []
        for spec in reservations:
            res = {"id": str(uuid.uuid4()), "lease_id": lease_id, "status": "pending",
                   "resource_type": spec.get("resource_type")}
            if spec.get("resource_type") == "flavor:instance":
                for key in ("flavor_id", "amount", "affinity"):
                    if key not in spec:
                        raise blazar_error(400, "'%s' is a required property" % key)
                if spec["affinity"] is not None:
                    raise blazar_error(409, "Affinity not supported yet")
                flavor = next((f for f in PUBLIC_FLAVORS if f["id"] == spec["flavor_id"]), None)
                if flavor is None:
                    raise blazar_error(404, "Flavor %s could not be found" % spec["flavor_id"])
                # As Blazar 18's flavor plugin answers: flavor_id is the private flavor it makes for the
                # reservation (its id is the reservation's), and resource_properties keeps the flavor
                # asked for as Nova showed it.
                asked = dict(self.flavor_view(flavor), extra_specs={})
                del asked["links"]
                res.update(flavor_id=res["id"], amount=spec["amount"], affinity=None,
                           vcpus=flavor["vcpus"], memory_mb=flavor["ram"],
                           disk_gb=flavor["disk"], aggregate_id=7, server_group_id=None,
                           resource_properties=json.dumps(asked), _flavor=flavor["id"])
            elif spec.get("resource_type") == "physical:host":
                props = spec.get("resource_properties")
                if not isinstance(props, str):
                    raise blazar_error(400, "resource_properties must be a JSON string")
                try:
                    parsed = json.loads(props)
                except ValueError:
                    raise blazar_error(400, "Malformed requirements %s" % props)
                # Blazar reads "=" as "==" (blazar.utils.plugins.convert_requirements); the simulator
                # matches hosts on node_type alone and refuses what else Blazar would take.
                if not (isinstance(parsed, list) and len(parsed) == 3
                        and parsed[0] in ("=", "==") and parsed[1] == "$node_type"):
                    raise blazar_error(400, "the simulator matches only [\"==\", \"$node_type\", T]: %s"
                                       % props)
                res.update(resource_properties=props, hypervisor_properties="",
                           min=spec.get("min", 1), max=spec.get("max", 1),
                           _node_type=parsed[2])
            elif spec.get("resource_type") in OTHER_RESERVATIONS:
                res.update(self.other_reservation(spec))
            else:
                raise blazar_error(400, "Invalid resource type %r" % spec.get("resource_type"))
            stored.append(res)
        if STATE.capacity_problem(stored, start, end):
            raise blazar_error(500, "Not enough hosts available")
        lease = {"id": lease_id, "name": name, "start_date": fmt_blazar(start),
                 "end_date": fmt_blazar(end), "status": "PENDING", "degraded": False,
                 "project_id": PROJECT["id"], "user_id": USER["id"],
                 "created_at": STATE.now.strftime("%Y-%m-%d %H:%M:%S"),
                 "reservations": stored,
                 "events": [{"event_type": "start_lease", "status": "UNDONE",
                             "time": fmt_blazar(start)},
                            {"event_type": "end_lease", "status": "UNDONE",
                             "time": fmt_blazar(end)}],
                 "_start": start, "_end": end}
        STATE.leases[lease_id] = lease
        STATE.tick()
        return 201, {"lease": self.lease_view(lease)}, None

    @staticmethod
    def other_reservation(spec):
        """A reservation llmctl never makes but a lease made elsewhere (Horizon, python-chi) may hold,
        with the fields Blazar requires and as Chameleon's fork shows it: upstream's floating IPs
        (network_id, amount), the fork's devices (min, max, resource_properties) and networks, whose
        view the fork leaves without details. No capacity is modelled for them."""
        kind = spec["resource_type"]
        for key in OTHER_RESERVATIONS[kind]:
            if key not in spec:
                raise blazar_error(400, "Missing parameter %s" % key)
        if kind == "virtual:floatingip":
            if not any(n["id"] == spec["network_id"] and n["router:external"] for n in NETWORKS):
                raise blazar_error(400, "the simulator has no external network %s" % spec["network_id"])
            return {"network_id": spec["network_id"], "amount": spec["amount"]}
        if kind == "device":
            return {"min": spec["min"], "max": spec["max"],
                    "resource_properties": spec["resource_properties"], "before_end": "default"}
        return {"_network_name": spec["network_name"]}

    def update_lease(self, lease, body):
        """As Blazar 18's manager (and Chameleon's fork) extends: flavor:instance and physical:host alike,
        refused with its own texts and status codes."""
        if lease["status"] not in LEASE_STABLE:
            raise blazar_error(500, "Invalid lease status.")
        end = parse_blazar_date(body.get("end_date", ""))
        now_minute = STATE.now.replace(second=0, microsecond=0)
        if lease["_end"] < now_minute:
            raise blazar_error(400, "Terminated leases can only be renamed")
        if end < now_minute or end < lease["_start"]:
            raise blazar_error(400, "End date must be later than current and start date")
        if STATE.capacity_problem(lease["reservations"], lease["_start"], end, lease["id"]):
            raise blazar_error(500, "Not enough hosts available")
        lease["_end"] = end
        lease["end_date"] = fmt_blazar(end)
        for event in lease["events"]:
            if event["event_type"] == "end_lease":
                event["time"] = fmt_blazar(end)
        # Blazar answers while its manager still holds the lease in UPDATING.
        return 200, {"lease": dict(self.lease_view(lease), status="UPDATING")}, None

    # --- version documents (what openstacksdk's discovery reads) ---
    def versions(self, service):
        base = self.base_url() + "/" + service
        ids = {"nova": ("v2.1", "2.90"), "cinder": ("v3.0", "3.70"), "neutron": ("v2.0", ""),
               "glance": ("v2.15", ""), "blazar": ("v1.0", "")}
        version, micro = ids[service]
        suffix = {"nova": "/v2.1/", "cinder": "/v3/", "neutron": "/v2.0/", "glance": "/v2/",
                  "blazar": "/v1/"}[service]
        entry = {"id": version, "status": "CURRENT", "version": micro, "min_version": "",
                 "links": [{"rel": "self", "href": base + suffix}]}
        if micro:
            entry["min_version"] = {"nova": "2.1", "cinder": "3.0"}[service]
        return 300 if service != "neutron" else 200, {"versions": [entry]}, None

    # --- Nova ---
    def nova(self, what, query, raw):
        parts = what.strip("/").split("/")
        if parts == [""]:
            return 200, {"version": {"id": "v2.1", "status": "CURRENT", "version": "2.90",
                                     "min_version": "2.1", "links": []}}, None
        if parts == ["flavors", "detail"] and self.command == "GET":
            flavors = [dict(f, extra_specs={}) for f in PUBLIC_FLAVORS]
            flavors += [{k: v for k, v in f.items() if not k.startswith("_")}
                        for f in STATE.private_flavors.values()]
            return 200, {"flavors": flavors}, None
        if parts[0] == "flavors":
            return self.flavors(parts[1:], self.json_body(raw))
        if parts[0] in ("os-hypervisors", "os-availability-zone", "os-aggregates"):
            return self.compute_admin(parts, query, raw)
        if parts[0] == "os-keypairs" and self.command == "GET":
            if len(parts) == 1:
                return 200, {"keypairs": [{"keypair": {"name": n, "public_key": k, "type": "ssh"}}
                                          for n, k in KEYPAIRS.items()]}, None
            if parts[1] not in KEYPAIRS:
                raise nova_error(404, "Keypair %s not found for user %s" % (parts[1], USER["id"]))
            return 200, {"keypair": {"name": parts[1], "public_key": KEYPAIRS[parts[1]],
                                     "type": "ssh", "user_id": USER["id"]}}, None
        if parts in (["servers"], ["servers", "detail"]) and self.command == "GET":
            servers = [self.server_view(s) for s in STATE.servers.values()]
            if "flavor" in query:
                servers = [s for s in servers if s["flavor"]["id"] == query["flavor"][0]]
            if "name" in query:  # Nova's name filter is a regular expression
                pattern = re.compile(query["name"][0])
                servers = [s for s in servers if pattern.search(s["name"])]
            return 200, {"servers": servers}, None
        if parts == ["servers"] and self.command == "POST":
            return self.create_server(self.json_body(raw))
        if len(parts) == 2 and parts[0] == "servers":
            server = STATE.servers.get(parts[1])
            if server is None:
                raise nova_error(404, "Instance %s could not be found." % parts[1])
            if self.command == "GET":
                return 200, {"server": self.server_view(server)}, None
            if self.command == "DELETE":
                if server.get("_deleting") is None:
                    server["_deleting"] = STATE.now + dt.timedelta(seconds=STATE.delete_seconds)
                return 204, None, None
        raise nova_error(404, "no Nova route " + what)

    @staticmethod
    def flavor_view(flavor):
        """A flavor as Nova 2.1 shows it, without extra specs (those come at 2.61)."""
        return {"id": flavor["id"], "name": flavor["name"], "ram": flavor["ram"],
                "vcpus": flavor["vcpus"], "disk": flavor["disk"],
                "OS-FLV-EXT-DATA:ephemeral": flavor.get("ephemeral", 0),
                "OS-FLV-DISABLED:disabled": False, "swap": "", "rxtx_factor": 1.0,
                "os-flavor-access:is_public": flavor["id"] not in STATE.private_flavors,
                "links": []}

    def flavors(self, parts, body):
        """What Blazar's flavor plugin asks of Nova: a flavor by id and its extra specs, and (as admin)
        a private flavor per reservation with its extra specs and the project's access to it."""
        if not parts and self.command == "POST":
            spec = body["flavor"]
            if spec["id"] in STATE.private_flavors or any(f["id"] == spec["id"] for f in PUBLIC_FLAVORS):
                raise nova_error(409, "Flavor with ID %s already exists." % spec["id"])
            flavor = {"id": spec["id"], "name": spec["name"], "vcpus": int(spec["vcpus"]),
                      "ram": int(spec["ram"]), "disk": int(spec["disk"]),
                      "ephemeral": int(spec.get("OS-FLV-EXT-DATA:ephemeral", 0)), "extra_specs": {},
                      "_projects": set()}
            STATE.private_flavors[flavor["id"]] = flavor
            return 200, {"flavor": self.flavor_view(flavor)}, None
        flavor = next((f for f in PUBLIC_FLAVORS if parts and f["id"] == parts[0]), None) \
            or STATE.private_flavors.get(parts[0] if parts else "")
        if flavor is None:
            raise nova_error(404, "Flavor %s could not be found." % (parts or [""])[0])
        if len(parts) == 1 and self.command == "GET":
            return 200, {"flavor": self.flavor_view(flavor)}, None
        if len(parts) == 1 and self.command == "DELETE":
            if STATE.private_flavors.pop(flavor["id"], None) is None:
                raise nova_error(403, "Policy doesn't allow os_compute_api:os-flavor-manage:delete "
                                      "to be performed.")
            return 202, None, None
        if parts[1:] == ["os-extra_specs"] and self.command == "GET":
            return 200, {"extra_specs": dict(flavor.get("extra_specs", {}))}, None
        if parts[1:] == ["os-extra_specs"] and self.command == "POST":
            flavor.setdefault("extra_specs", {}).update(body["extra_specs"])
            return 200, {"extra_specs": body["extra_specs"]}, None
        if parts[1:] == ["action"] and self.command == "POST":
            return self.flavor_access(flavor, body)
        raise nova_error(404, "no Nova route flavors/" + "/".join(parts))

    @staticmethod
    def flavor_access(flavor, body):
        (action, value), = body.items()
        projects = flavor.get("_projects")
        if projects is None:
            raise nova_error(409, "Can not add access to a public flavor.")
        project = value["tenant"]
        if action == "addTenantAccess":
            if project in projects:
                raise nova_error(409, "Flavor access already exists for flavor %s and project %s "
                                      "combination." % (flavor["id"], project))
            projects.add(project)
        elif action == "removeTenantAccess":
            if project not in projects:
                raise nova_error(404, "Flavor access not found for %s / %s combination."
                                 % (flavor["id"], project))
            projects.remove(project)
        else:
            raise nova_error(400, "Invalid flavor action %s" % action)
        return 200, {"flavor_access": [{"flavor_id": flavor["id"], "tenant_id": p}
                                       for p in sorted(projects)]}, None

    def server_view(self, server):
        view = {k: v for k, v in server.items() if not k.startswith("_")}
        addresses = {}
        for port in STATE.ports.values():
            if port["device_id"] != server["id"]:
                continue
            net = next(n["name"] for n in NETWORKS if n["id"] == port["network_id"])
            entries = addresses.setdefault(net, [])
            entries.append({"addr": port["fixed_ips"][0]["ip_address"], "version": 4,
                            "OS-EXT-IPS:type": "fixed"})
            for fip in STATE.floating_ips.values():
                if fip["port_id"] == port["id"]:
                    entries.append({"addr": fip["floating_ip_address"], "version": 4,
                                    "OS-EXT-IPS:type": "floating"})
        view["addresses"] = addresses
        if server.get("_deleting") is not None:
            view["OS-EXT-STS:task_state"] = "deleting"
        return view

    def create_server(self, body):
        spec = body.get("server")
        if not isinstance(spec, dict) or not spec.get("name"):
            raise nova_error(400, "Invalid input for field/attribute server. 'name' is required")
        flavor_id = spec.get("flavorRef")
        flavor = next((f for f in PUBLIC_FLAVORS if f["id"] == flavor_id), None) \
            or STATE.private_flavors.get(flavor_id)
        if flavor is None:
            raise nova_error(400, "Flavor %s could not be found." % flavor_id)
        networks = spec.get("networks")
        if not isinstance(networks, list) or not networks:
            raise nova_error(400, "Invalid input for field/attribute networks.")
        for net in networks:
            if not any(n["id"] == net.get("uuid") for n in NETWORKS):
                raise nova_error(400, "Network %s could not be found." % net.get("uuid"))
        if "key_name" in spec and spec["key_name"] not in KEYPAIRS:
            raise nova_error(400, "Invalid key_name provided.")
        user_data = spec.get("user_data")
        if user_data is not None:
            if len(user_data) > 65535:
                raise nova_error(400, "User data too large. User data must be no larger than "
                                      "65535 bytes once base64 encoded.")
            try:
                base64.b64decode(user_data, validate=True)
            except ValueError:
                raise nova_error(400, "User data needs to be valid base 64.")
        groups = []
        for group in spec.get("security_groups") or [{"name": "default"}]:
            matches = [g for g in STATE.security_groups.values() if g["name"] == group["name"]]
            if group["name"] != "default" and len(matches) != 1:
                raise nova_error(400 if not matches else 409,
                                 "Security group %s not found for project %s."
                                 % (group["name"], PROJECT["id"]) if not matches else
                                 "Multiple security groups named %s" % group["name"])
            groups += [g["id"] for g in matches]
        mappings = spec.get("block_device_mapping_v2") or []
        volume = None
        if mappings:
            mapping = mappings[0]
            if mapping.get("source_type") != "volume" or mapping.get("destination_type") != "volume":
                raise nova_error(400, "The simulator boots only from an existing volume")
            volume = STATE.volumes.get(mapping.get("uuid"))
            if volume is None:
                raise nova_error(400, "Block Device Mapping is Invalid: failed to get volume %s."
                                 % mapping.get("uuid"))
            if volume["status"] != "available":
                raise nova_error(400, "Block Device Mapping is Invalid: volume %s is %s, not "
                                      "available." % (volume["id"], volume["status"]))
        elif not any(i["id"] == spec.get("imageRef") for i in STATE.images):
            raise nova_error(400, "Image %s could not be found." % spec.get("imageRef"))
        hints = body.get("OS-SCH-HNT:scheduler_hints") or body.get("os:scheduler_hints") or {}
        reservation = hints.get("reservation")
        extra = flavor.get("extra_specs", {}) if isinstance(flavor, dict) else {}
        reservation = extra.get("aggregate_instance_extra_specs:reservation", reservation)
        server_id = str(uuid.uuid4())
        server = {"id": server_id, "name": spec["name"], "status": "BUILD",
                  "flavor": {"id": flavor_id}, "image": "" if volume else {"id": spec["imageRef"]},
                  "key_name": spec.get("key_name"), "tenant_id": PROJECT["id"],
                  "user_id": USER["id"], "created": fmt_iso(STATE.now),
                  "metadata": spec.get("metadata", {}),
                  "security_groups": [{"name": g["name"]} for g in
                                      spec.get("security_groups") or [{"name": "default"}]],
                  "_reservation": reservation, "_user_data": user_data,
                  "_ready": STATE.now + dt.timedelta(seconds=STATE.build_seconds)}
        STATE.servers[server_id] = server
        if volume is not None:
            volume["status"] = "in-use"
            volume["attachments"].append({"server_id": server_id, "device": "/dev/vda"})
        for net in networks:
            port_id = str(uuid.uuid4())
            STATE.ports[port_id] = {
                "id": port_id, "name": "", "network_id": net["uuid"], "device_id": server_id,
                "device_owner": "compute:nova", "security_groups": groups, "status": "ACTIVE",
                "project_id": PROJECT["id"], "tenant_id": PROJECT["id"],
                "fixed_ips": [{"ip_address": "10.0.0.%d" % (len(STATE.ports) + 10)}]}
        return 202, {"server": {"id": server_id, "links": [], "adminPass": "x" * 12,
                                "security_groups": server["security_groups"],
                                "OS-DCF:diskConfig": "MANUAL"}}, {
            "Location": self.base_url() + "/nova/v2.1/servers/" + server_id}

    # --- Cinder ---
    def volume_view(self, volume):
        return {k: v for k, v in volume.items() if not k.startswith("_")}

    def cinder(self, what, raw):
        parts = what.strip("/").split("/")
        if parts in (["volumes"], ["volumes", "detail"]) and self.command == "GET":
            return 200, {"volumes": [self.volume_view(v) for v in STATE.volumes.values()]}, None
        if parts == ["volumes"] and self.command == "POST":
            spec = self.json_body(raw).get("volume")
            if not isinstance(spec, dict) or not isinstance(spec.get("size"), int) \
                    or spec["size"] < 1:
                raise cinder_error(400, "Invalid input received: size must be an integer >= 1")
            image = spec.get("imageRef")
            if image is not None and not any(i["id"] == image for i in STATE.images):
                raise cinder_error(400, "Invalid image identifier or unable to access "
                                        "requested image.")
            volume_id = str(uuid.uuid4())
            STATE.volumes[volume_id] = {
                "id": volume_id, "name": spec.get("name"), "size": spec["size"],
                "status": "creating", "bootable": "true" if image else "false",
                "volume_type": spec.get("volume_type") or "ceph-ssd", "attachments": [],
                "created_at": fmt_iso(STATE.now),
                "_ready": STATE.now + dt.timedelta(seconds=STATE.volume_seconds)}
            return 202, {"volume": self.volume_view(STATE.volumes[volume_id])}, None
        if len(parts) == 2 and parts[0] == "volumes":
            volume = STATE.volumes.get(parts[1])
            if volume is None:
                raise cinder_error(404, "Volume %s could not be found." % parts[1])
            if self.command == "GET":
                return 200, {"volume": self.volume_view(volume)}, None
            if self.command == "DELETE":
                if volume["status"] not in ("available", "error", "error_restoring",
                                            "error_extending"):
                    raise cinder_error(400, "Invalid volume: Volume status must be available or "
                                            "error or error_restoring or error_extending or "
                                            "error_managing and must not be migrating, attached, "
                                            "belong to a group, have snapshots or be disassociated "
                                            "from snapshots after volume transfer.")
                del STATE.volumes[volume["id"]]
                return 202, None, None
        raise cinder_error(404, "no Cinder route " + what)

    # --- Neutron ---
    def neutron(self, what, query, raw):
        parts = what.strip("/").split("/")
        if parts == [""]:
            return 200, {"resources": []}, None
        filters = {k: v[0] for k, v in query.items() if k not in ("fields", "limit", "marker")}

        def listed(items):
            return [i for i in items
                    if all(str(i.get(k)) == v or (v == "" and i.get(k) is None)
                           for k, v in filters.items())]
        if parts == ["networks"] and self.command == "GET":
            return 200, {"networks": listed([dict(n, status="ACTIVE", subnets=[],
                                                  project_id="admin", shared=True)
                                             for n in NETWORKS])}, None
        if parts == ["ports"] and self.command == "GET":
            return 200, {"ports": listed(list(STATE.ports.values()))}, None
        if parts == ["security-groups"] and self.command == "GET":
            return 200, {"security_groups": listed(list(STATE.security_groups.values()))}, None
        if parts == ["security-groups"] and self.command == "POST":
            spec = self.json_body(raw).get("security_group") or {}
            if not spec.get("name"):
                raise neutron_error(400, "HTTPBadRequest", "security_group needs a name")
            group_id = str(uuid.uuid4())
            STATE.security_groups[group_id] = {
                "id": group_id, "name": spec["name"], "description": spec.get("description", ""),
                "project_id": PROJECT["id"], "tenant_id": PROJECT["id"], "stateful": True,
                "security_group_rules": [self.rule(group_id, "egress", None, None, None)]}
            return 201, {"security_group": STATE.security_groups[group_id]}, None
        if len(parts) == 2 and parts[0] == "security-groups":
            group = STATE.security_groups.get(parts[1])
            if group is None:
                raise neutron_error(404, "SecurityGroupNotFound",
                                    "Security group %s does not exist" % parts[1])
            if self.command == "GET":
                return 200, {"security_group": group}, None
            if self.command == "DELETE":
                if any(group["id"] in p["security_groups"] for p in STATE.ports.values()):
                    raise neutron_error(409, "SecurityGroupInUse",
                                        "Security Group %s in use." % group["id"])
                del STATE.security_groups[group["id"]]
                return 204, None, None
        if parts == ["security-group-rules"] and self.command == "POST":
            spec = self.json_body(raw).get("security_group_rule") or {}
            group = STATE.security_groups.get(spec.get("security_group_id"))
            if group is None:
                raise neutron_error(404, "SecurityGroupNotFound", "Security group %s does not "
                                    "exist" % spec.get("security_group_id"))
            rule = self.rule(group["id"], spec.get("direction"), spec.get("protocol"),
                             spec.get("port_range_min"), spec.get("port_range_max"))
            for existing in group["security_group_rules"]:
                if all(existing[k] == rule[k] for k in ("direction", "protocol",
                                                         "port_range_min", "port_range_max")):
                    raise neutron_error(409, "SecurityGroupRuleExists",
                                        "Security group rule already exists. Rule id is %s."
                                        % existing["id"])
            group["security_group_rules"].append(rule)
            return 201, {"security_group_rule": rule}, None
        if parts == ["floatingips"] and self.command == "GET":
            return 200, {"floatingips": listed(list(STATE.floating_ips.values()))}, None
        if parts == ["floatingips"] and self.command == "POST":
            spec = self.json_body(raw).get("floatingip") or {}
            if spec.get("floating_network_id") != "net-public":
                raise neutron_error(400, "BadRequest", "Bad floatingip request: network %s is "
                                    "not external" % spec.get("floating_network_id"))
            used = {f["floating_ip_address"] for f in STATE.floating_ips.values()}
            free = [a for a in ("127.0.0.%d" % n for n in range(10, 10 + STATE.floating_ip_pool))
                    if a not in used]
            if not free:
                raise neutron_error(409, "IpAddressGenerationFailure",
                                    "No more IP addresses available on network net-public.")
            fip_id = str(uuid.uuid4())
            STATE.floating_ips[fip_id] = {
                "id": fip_id, "floating_ip_address": free[0], "floating_network_id": "net-public",
                "port_id": None, "fixed_ip_address": None, "status": "DOWN",
                "description": spec.get("description", ""), "project_id": PROJECT["id"],
                "tenant_id": PROJECT["id"], "router_id": None}
            self.associate(STATE.floating_ips[fip_id], spec.get("port_id"))
            return 201, {"floatingip": STATE.floating_ips[fip_id]}, None
        if len(parts) == 2 and parts[0] == "floatingips":
            fip = STATE.floating_ips.get(parts[1])
            if fip is None:
                raise neutron_error(404, "FloatingIPNotFound",
                                    "Floating IP %s could not be found" % parts[1])
            if self.command == "GET":
                return 200, {"floatingip": fip}, None
            if self.command == "PUT":
                spec = self.json_body(raw).get("floatingip") or {}
                if "description" in spec:
                    fip["description"] = spec["description"]
                if "port_id" in spec:
                    self.associate(fip, spec["port_id"])
                return 200, {"floatingip": fip}, None
            if self.command == "DELETE":
                del STATE.floating_ips[fip["id"]]
                return 204, None, None
        raise neutron_error(404, "HTTPNotFound", "no Neutron route " + what)

    @staticmethod
    def rule(group_id, direction, protocol, port_min, port_max):
        return {"id": str(uuid.uuid4()), "security_group_id": group_id, "direction": direction,
                "ethertype": "IPv4", "protocol": protocol, "port_range_min": port_min,
                "port_range_max": port_max, "remote_ip_prefix": None}

    @staticmethod
    def associate(fip, port_id):
        if port_id is None:
            fip.update(port_id=None, fixed_ip_address=None, status="DOWN")
            return
        port = STATE.ports.get(port_id)
        if port is None:
            raise neutron_error(404, "PortNotFound", "Port %s could not be found." % port_id)
        if any(f["port_id"] == port_id and f["id"] != fip["id"]
               for f in STATE.floating_ips.values()):
            raise neutron_error(409, "FloatingIPPortAlreadyAssociated",
                                "Cannot associate floating IP %s with port %s: it already has a "
                                "floating IP." % (fip["floating_ip_address"], port_id))
        fip.update(port_id=port_id, fixed_ip_address=port["fixed_ips"][0]["ip_address"],
                   status="ACTIVE")

    # --- what Blazar's host and flavor plugins ask Nova and Placement (tests/blazar runs the real Blazar) ---
    @staticmethod
    def hypervisor(host):
        """A host of STATE.hosts as Nova's hypervisor (microversion 2.1: integer ids)."""
        name = "node-" + host["id"]
        return {"id": int(host["id"]), "hypervisor_hostname": name, "state": "up", "status": "enabled",
                "service": {"host": name, "id": int(host["id"]), "disabled_reason": None},
                "vcpus": 48, "memory_mb": 196608, "local_gb": 240, "vcpus_used": 0,
                "memory_mb_used": 0, "local_gb_used": 0, "hypervisor_type": "ironic",
                "hypervisor_version": 1, "cpu_info": "{}", "host_ip": "127.0.0.1",
                "running_vms": 0, "current_workload": 0, "disk_available_least": 240}

    def compute_admin(self, parts, query, raw):
        hosts = {"node-" + h["id"]: h for h in STATE.hosts}
        if parts[0] == "os-hypervisors" and self.command == "GET":
            if len(parts) == 2 and parts[1].isdigit():
                host = next((h for h in STATE.hosts if h["id"] == parts[1]), None)
                if host is None:
                    raise nova_error(404, "Hypervisor with ID %s could not be found." % parts[1])
                return 200, {"hypervisor": self.hypervisor(host)}, None
            if len(parts) == 3 and parts[2] in ("search", "servers"):
                found = [h for name, h in hosts.items() if parts[1] in name]
                if not found:
                    raise nova_error(404, "No hypervisor matching '%s' could be found." % parts[1])
                views = [{"id": int(h["id"]), "hypervisor_hostname": "node-" + h["id"],
                          "state": "up", "status": "enabled"} for h in found]
                if parts[2] == "servers":
                    for view in views:
                        servers = [{"uuid": s["id"], "name": s["name"]} for s in STATE.servers.values()
                                   if s.get("_host") == view["hypervisor_hostname"]]
                        if servers:
                            view["servers"] = servers
                return 200, {"hypervisors": views}, None
            if len(parts) == 2:
                raise nova_error(404, "Hypervisor with ID %s could not be found." % parts[1])
        if parts == ["os-availability-zone", "detail"] and self.command == "GET":
            return 200, {"availabilityZoneInfo": [{
                "zoneName": "nova", "zoneState": {"available": True},
                "hosts": {name: {"nova-compute": {"available": True, "active": True}}
                          for name in hosts}}]}, None
        if parts[0] == "os-aggregates":
            return self.aggregates(parts[1:], self.json_body(raw), hosts)
        raise nova_error(404, "no Nova route " + "/".join(parts))

    def aggregates(self, parts, body, hosts):
        if not parts and self.command == "GET":
            return 200, {"aggregates": list(STATE.aggregates.values())}, None
        if not parts and self.command == "POST":
            name = body["aggregate"]["name"]
            if any(a["name"] == name for a in STATE.aggregates.values()):
                raise nova_error(409, "Aggregate %s already exists." % name)
            aggregate = {"id": STATE.next_aggregate_id, "name": name, "uuid": str(uuid.uuid4()),
                         "availability_zone": body["aggregate"].get("availability_zone"),
                         "hosts": [], "metadata": {}, "deleted": False}
            STATE.next_aggregate_id += 1
            STATE.aggregates[aggregate["id"]] = aggregate
            return 200, {"aggregate": aggregate}, None
        aggregate = STATE.aggregates.get(int(parts[0])) if parts[0].isdigit() else None
        if aggregate is None:
            raise nova_error(404, "Aggregate %s could not be found." % parts[0])
        if len(parts) == 1 and self.command == "GET":
            return 200, {"aggregate": aggregate}, None
        if len(parts) == 1 and self.command == "DELETE":
            if aggregate["hosts"]:
                raise nova_error(400, "Cannot remove aggregate %s: it still has hosts" % parts[0])
            del STATE.aggregates[aggregate["id"]]
            return 200, None, None
        if parts[1:] == ["action"] and self.command == "POST":
            (action, value), = body.items()
            if action == "set_metadata":
                for key, item in value["metadata"].items():
                    if item is None:
                        aggregate["metadata"].pop(key, None)
                    else:
                        aggregate["metadata"][key] = item
            elif action in ("add_host", "remove_host"):
                host = value["host"]
                if host not in hosts:
                    raise nova_error(404, "Compute host %s could not be found." % host)
                if action == "add_host":
                    if host in aggregate["hosts"]:
                        raise nova_error(409, "Cannot add host to aggregate %d. Reason: Host %s "
                                         "already in aggregate." % (aggregate["id"], host))
                    aggregate["hosts"].append(host)
                elif host not in aggregate["hosts"]:
                    raise nova_error(404, "Cannot remove host %s in aggregate %d" %
                                     (host, aggregate["id"]))
                else:
                    aggregate["hosts"].remove(host)
            else:
                raise nova_error(400, "Invalid aggregate action %s" % action)
            return 200, {"aggregate": aggregate}, None
        raise nova_error(404, "no Nova route os-aggregates/" + "/".join(parts))

    @staticmethod
    def providers():
        """The hosts' resource providers (named as their hypervisors) and those created through the API."""
        own = [{"uuid": str(uuid.uuid5(uuid.NAMESPACE_DNS, "node-" + h["id"])), "name": "node-" + h["id"],
                "generation": 1, "parent_provider_uuid": None} for h in STATE.hosts]
        return own + list(STATE.created_providers.values())

    def placement(self, what, query, raw):
        parts = what.strip("/").split("/")
        if parts[0] == "resource_classes":
            return self.resource_classes(parts[1:], raw)
        providers = self.providers()
        if parts == ["resource_providers"] and self.command == "GET":
            if "name" in query:
                providers = [p for p in providers if p["name"] == query["name"][0]]
            return 200, {"resource_providers": providers}, None
        if parts == ["resource_providers"] and self.command == "POST":
            body = self.json_body(raw)
            if any(p["name"] == body["name"] for p in providers):
                raise ApiError(409, {"errors": [{"status": 409, "title": "Conflict", "detail":
                                                 "Conflicting resource provider name: %s already "
                                                 "exists." % body["name"]}]})
            provider = {"uuid": body.get("uuid") or str(uuid.uuid4()), "name": body["name"],
                        "generation": 0, "parent_provider_uuid": body.get("parent_provider_uuid")}
            STATE.created_providers[provider["uuid"]] = provider
            return 200, provider, None
        provider = next((p for p in providers if len(parts) > 1 and p["uuid"] == parts[1]), None)
        if parts[0] == "resource_providers" and provider is None:
            raise ApiError(404, {"errors": [{"status": 404, "title": "Not Found",
                                             "detail": "No resource provider with uuid %s found" %
                                             (parts[1:] or [""])[0]}]})
        if len(parts) == 2 and self.command == "DELETE":
            STATE.created_providers.pop(provider["uuid"], None)
            STATE.provider_inventories.pop(provider["uuid"], None)
            return 204, None, None
        if parts[2:] == ["inventories"] and self.command == "GET":
            return 200, {"inventories": self.inventories(provider),
                         "resource_provider_generation": provider["generation"]}, None
        if parts[2:] == ["inventories"] and self.command == "PUT":
            return self.put_inventories(provider, self.json_body(raw))
        if parts[2:3] == ["inventories"] and len(parts) == 4 and self.command == "DELETE":
            if STATE.provider_inventories.get(provider["uuid"], {}).pop(parts[3], None) is None:
                raise placement_error(404, "Not Found", "No inventory of class %s found for delete"
                                      % parts[3])
            provider["generation"] += 1
            return 204, None, None
        if parts[2:] == ["traits"] and self.command == "GET":
            return 200, {"traits": [], "resource_provider_generation": provider["generation"]}, None
        raise ApiError(404, {"errors": [{"status": 404, "title": "Not Found",
                                         "detail": "no Placement route " + what}]})

    @staticmethod
    def inventories(provider):
        """A host's compute inventory (as its hypervisor's vcpus, memory_mb and local_gb), else what was
        put on a provider created through the API."""
        if provider["uuid"] in STATE.created_providers:
            return STATE.provider_inventories.get(provider["uuid"], {})
        def inventory(total):
            return {"total": total, "reserved": 0, "min_unit": 1, "max_unit": total, "step_size": 1,
                    "allocation_ratio": 1.0}
        return {"VCPU": inventory(48), "MEMORY_MB": inventory(196608), "DISK_GB": inventory(240)}

    def put_inventories(self, provider, body):
        if provider["uuid"] not in STATE.created_providers:
            raise placement_error(409, "Conflict", "a host's inventory is its hypervisor's")
        if body.get("resource_provider_generation") != provider["generation"]:
            raise placement_error(409, "Conflict", "resource provider generation conflict",
                                  code="placement.concurrent_update")
        for rc in body["inventories"]:
            if rc not in ("VCPU", "MEMORY_MB", "DISK_GB") and rc not in STATE.resource_classes:
                raise placement_error(400, "Bad Request", "Unknown resource class in inventory "
                                      "for resource provider %s: %s" % (provider["uuid"], rc))
        STATE.provider_inventories[provider["uuid"]] = body["inventories"]
        provider["generation"] += 1
        return 200, {"inventories": body["inventories"],
                     "resource_provider_generation": provider["generation"]}, None

    def resource_classes(self, parts, raw):
        if not parts and self.command == "POST":
            name = self.json_body(raw)["name"]
            if not re.fullmatch(r"CUSTOM_[A-Z0-9_]+", name):
                raise placement_error(400, "Bad Request", "JSON does not validate: %r does not "
                                      "match '^CUSTOM\\_[A-Z0-9_]+$'" % name)
            if name in STATE.resource_classes:
                raise placement_error(409, "Conflict", "Conflicting resource class already exists: "
                                      "%s" % name)
            STATE.resource_classes.add(name)
            return 201, None, {"Location": "/placement/resource_classes/" + name}
        if len(parts) == 1 and self.command == "DELETE":
            if parts[0] not in STATE.resource_classes:
                raise placement_error(404, "Not Found", "No such resource class %s." % parts[0])
            STATE.resource_classes.remove(parts[0])
            return 204, None, None
        raise placement_error(404, "Not Found", "no Placement route resource_classes/" +
                              "/".join(parts))

    # --- Glance ---
    def glance(self, what, query):
        parts = what.strip("/").split("/")
        if parts == ["images"] and self.command == "GET":
            images = [dict(i, status="active", visibility="public") for i in STATE.images]
            if "name" in query:
                images = [i for i in images if i["name"] == query["name"][0]]
            start = 0
            if "marker" in query:
                start = next(n for n, i in enumerate(images) if i["id"] == query["marker"][0]) + 1
            size = int(query.get("limit", [STATE.image_page_size])[0])
            page = images[start:start + size]
            body = {"images": page, "first": "/v2/images", "schema": "/v2/schemas/images"}
            if start + size < len(images):
                rest = [("marker", page[-1]["id"])] + [
                    (k, v[0]) for k, v in query.items() if k != "marker"]
                body["next"] = "/v2/images?" + "&".join("%s=%s" % (k, quote(v)) for k, v in rest)
            return 200, body, None
        if len(parts) == 2 and parts[0] == "images" and self.command == "GET":
            image = next((i for i in STATE.images if i["id"] == parts[1]), None)
            if image is None:
                raise ApiError(404, {"message": "No image found with ID %s" % parts[1]})
            return 200, dict(image, status="active", visibility="public"), None
        raise ApiError(404, {"message": "no Glance route " + what})


def main():
    global STATE
    parser = argparse.ArgumentParser()
    parser.add_argument("--now", default="2030-01-01T00:00:00")
    parser.add_argument("--wall-clock", action="store_true",
                        help="follow the system's clock instead of --now")
    parser.add_argument("--token-ttl", type=int, default=3600)
    parser.add_argument("--region", default="KVM@TACC")
    parser.add_argument("--reservation-suffix", default="", choices=["", "/v1"],
                        help="what the catalog's reservation URL ends with after /blazar")
    args = parser.parse_args()
    STATE = State(dt.datetime.fromisoformat(args.now).replace(tzinfo=UTC), args.token_ttl,
                  args.region)
    STATE.reservation_suffix = args.reservation_suffix
    if args.wall_clock:
        STATE.wall_clock_offset = dt.timedelta(0)
        STATE.now = dt.datetime.now(UTC)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print("PORT %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
