"""Blazar v1: leases (flavor, host and the reservation types llmctl does not make), hosts."""
import datetime as dt
import json
import uuid

from .errors import blazar_error
from .state import (LEASE_STABLE, NETWORKS, OTHER_RESERVATIONS, PROJECT, PUBLIC_FLAVORS, STATE, USER, UTC,
                    fmt_blazar)


def parse_blazar_date(text):
    """Blazar's LEASE_DATE_FORMAT and nothing else: seconds are refused as the real manager refuses them."""
    try:
        return dt.datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
    except (TypeError, ValueError):
        raise blazar_error(400, "%s is an invalid date. Required format: %%Y-%%m-%%d %%H:%%M" % text)


class BlazarRoutes:
    """/blazar/v1/...: a mixin of server.Handler, self is the request being answered."""

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
