"""The admin endpoints tests drive the simulator with (no token needed): clock, faults, capacity, books."""
import datetime as dt

from .errors import ApiError
from .state import STATE, fmt_iso


class AdminRoutes:
    """/admin/...: a mixin of server.Handler, self is the request being answered."""

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
