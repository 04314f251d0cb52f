"""What Blazar's host plugin asks Nova as admin (tests/blazar runs the real Blazar): hypervisors,
availability zones and host aggregates."""
import uuid

from .errors import nova_error
from .state import STATE


class NovaAdminRoutes:
    """/nova/v2.1/os-hypervisors, os-availability-zone, os-aggregates: a mixin of server.Handler, self is
    the request being answered."""

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
