#!/usr/bin/env python3
"""A stateful OpenStack simulator for llmctl's tests (Python standard library only).

Follows ../shared/reference/openstack-api.md for Keystone v3, Blazar v1 and Nova's flavors. It listens
on 127.0.0.1 port 0 and prints "PORT <n>" as its only line of output. Time is the simulator's own:
it starts at --now and moves only when a test asks (POST /admin/advance), so lease and token
lifetimes are deterministic.

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
  GET  /admin/books                 what exists (leases, private flavors) and every request seen
"""
import argparse
import datetime as dt
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

UTC = dt.timezone.utc
PROJECT = {"id": "p-demo", "name": "demo-project", "domain": {"id": "default", "name": "Default"}}
USER = {"id": "u-demo", "name": "demo", "domain": {"id": "default", "name": "Default"}}
APP_CREDENTIALS = {"ac-unrestricted": ("ac-secret", True), "ac-restricted": ("ac-secret", False)}
PUBLIC_FLAVORS = [
    {"id": "f-small", "name": "m1.small", "vcpus": 1, "ram": 2048, "disk": 20},
    {"id": "f-h100-1", "name": "g1.h100.pci.1", "vcpus": 16, "ram": 131072, "disk": 0},
    {"id": "f-h100-4", "name": "g1.h100.pci.4", "vcpus": 64, "ram": 524288, "disk": 0},
]


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
        base = next(f for f in PUBLIC_FLAVORS if f["id"] == res["flavor_id"])
        custom = "resources:CUSTOM_RESERVATION_" + res["id"].upper().replace("-", "_")
        return dict(base, id=res["id"], name="reservation:" + res["id"],
                    extra_specs={"aggregate_instance_extra_specs:reservation": res["id"],
                                 custom: "1"})

    def overlapping(self, start, end, exclude=None):
        for lease in self.leases.values():
            if lease["id"] == exclude or lease["status"] in ("ERROR", "TERMINATED"):
                continue
            if lease["_start"] < end and start < lease["_end"]:
                yield lease

    def capacity_problem(self, reservations, start, end, exclude=None):
        for res in reservations:
            if res["resource_type"] == "flavor:instance":
                used = sum(r.get("amount", 0) for l in self.overlapping(start, end, exclude)
                           for r in l["reservations"] if r.get("flavor_id") == res["flavor_id"])
                if used + res["amount"] > self.flavor_capacity.get(res["flavor_id"], 0):
                    return True
            else:
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


def keystone_error(status, message):
    titles = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}
    return ApiError(status, {"error": {"code": status, "title": titles.get(status, "Error"),
                                       "message": message}})


def parse_blazar_date(text, field):
    for pattern in ("%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"):
        try:
            return dt.datetime.strptime(text, pattern).replace(tzinfo=UTC)
        except ValueError:
            pass
    raise blazar_error(400, "Invalid %s: %r" % (field, text))


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
        self.wfile.write(data)

    def handle_any(self):
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = url.path
        delay_before = delay_after = 0
        with STATE.lock:
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
            return self.blazar(path[len("/blazar/v1/"):], query, raw)
        if path.startswith("/nova/v2.1/"):
            self.require_token()
            return self.nova(path[len("/nova/v2.1/"):])
        raise ApiError(404, {"error": "no route for " + path})

    # --- admin ---
    def admin(self, what, raw):
        body = self.json_body(raw)
        if what == "time":
            return 200, {"now": fmt_iso(STATE.now)}, None
        if what == "advance":
            STATE.now += dt.timedelta(seconds=body["seconds"])
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
        if what == "books":
            return 200, {
                "now": fmt_iso(STATE.now),
                "leases": [{"id": l["id"], "name": l["name"], "status": l["status"]}
                           for l in STATE.leases.values()],
                "private_flavors": sorted(STATE.private_flavors),
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
            start = parse_blazar_date(body.get("start_date", ""), "start_date")
            if start < now_minute:
                raise blazar_error(400, "Start date must be later than current date")
        end = parse_blazar_date(body.get("end_date", ""), "end_date")
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
                res.update(flavor_id=flavor["id"], amount=spec["amount"], affinity=None,
                           vcpus=flavor["vcpus"], memory_mb=flavor["ram"],
                           disk_gb=flavor["disk"], aggregate_id=7, server_group_id=None)
            elif spec.get("resource_type") == "physical:host":
                props = spec.get("resource_properties")
                if not isinstance(props, str):
                    raise blazar_error(400, "resource_properties must be a JSON string")
                try:
                    parsed = json.loads(props)
                except ValueError:
                    raise blazar_error(400, "resource_properties is not JSON: %s" % props)
                if not (isinstance(parsed, list) and len(parsed) == 3
                        and parsed[:2] == ["==", "$node_type"]):
                    raise blazar_error(400, "Unsupported resource_properties %s" % props)
                res.update(resource_properties=props, hypervisor_properties="",
                           min=spec.get("min", 1), max=spec.get("max", 1),
                           _node_type=parsed[2])
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

    def update_lease(self, lease, body):
        if any(r["resource_type"] == "flavor:instance" for r in lease["reservations"]):
            raise blazar_error(409, "Updating flavor:instance reservations is not supported")
        if lease["status"] in ("TERMINATED", "ERROR"):
            raise blazar_error(409, "Lease %s is %s" % (lease["id"], lease["status"]))
        end = parse_blazar_date(body.get("end_date", ""), "end_date")
        if end <= lease["_start"]:
            raise blazar_error(400, "End date must be later than start date.")
        if STATE.capacity_problem(lease["reservations"], lease["_start"], end, lease["id"]):
            raise blazar_error(500, "Not enough hosts available")
        lease["_end"] = end
        lease["end_date"] = fmt_blazar(end)
        for event in lease["events"]:
            if event["event_type"] == "end_lease":
                event["time"] = fmt_blazar(end)
        return 200, {"lease": self.lease_view(lease)}, None

    # --- Nova ---
    def nova(self, what):
        if what.strip("/") == "flavors/detail" and self.command == "GET":
            flavors = [dict(f, extra_specs={}) for f in PUBLIC_FLAVORS]
            flavors += list(STATE.private_flavors.values())
            return 200, {"flavors": flavors}, None
        raise ApiError(404, {"itemNotFound": {"code": 404, "message": "no Nova route " + what}})


def main():
    global STATE
    parser = argparse.ArgumentParser()
    parser.add_argument("--now", default="2030-01-01T00:00:00")
    parser.add_argument("--token-ttl", type=int, default=3600)
    parser.add_argument("--region", default="KVM@TACC")
    parser.add_argument("--reservation-suffix", default="", choices=["", "/v1"],
                        help="what the catalog's reservation URL ends with after /blazar")
    args = parser.parse_args()
    STATE = State(dt.datetime.fromisoformat(args.now).replace(tzinfo=UTC), args.token_ttl,
                  args.region)
    STATE.reservation_suffix = args.reservation_suffix
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print("PORT %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
