"""Neutron v2.0: networks, ports, security groups and their rules, floating IPs."""
import uuid

from .errors import neutron_error
from .state import NETWORKS, PROJECT, STATE


class NeutronRoutes:
    """/neutron/v2.0/...: a mixin of server.Handler, self is the request being answered."""

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
