"""The HTTP side: injected faults first, then each request routed to its service under STATE.lock."""
import datetime as dt
import json
import time
import uuid
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse

from .admin import AdminRoutes
from .auth import TokenCheck
from .blazar import BlazarRoutes
from .cinder import CinderRoutes
from .errors import ApiError, blazar_error
from .glance import GlanceRoutes
from .keystone import KeystoneRoutes
from .neutron import NeutronRoutes
from .nova import NovaRoutes
from .nova_admin import NovaAdminRoutes
from .oidc import OidcRoutes
from .placement import PlacementRoutes
from .state import PROJECT, STATE, UTC


class Handler(AdminRoutes, OidcRoutes, KeystoneRoutes, TokenCheck, BlazarRoutes, NovaRoutes, NovaAdminRoutes,
              PlacementRoutes, CinderRoutes, NeutronRoutes, GlanceRoutes, BaseHTTPRequestHandler):
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
