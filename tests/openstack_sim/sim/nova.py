"""Nova: flavors (public and reservations' private ones), key pairs and servers."""
import base64
import datetime as dt
import re
import uuid

from .errors import nova_error
from .state import KEYPAIRS, NETWORKS, PROJECT, PUBLIC_FLAVORS, STATE, USER, fmt_iso


class NovaRoutes:
    """/nova/v2.1/...: a mixin of server.Handler, self is the request being answered."""

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
