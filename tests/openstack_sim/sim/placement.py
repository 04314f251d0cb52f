"""Placement as Blazar's host and flavor plugins ask it (tests/blazar runs the real Blazar): resource
providers, their inventories and custom resource classes."""
import re
import uuid

from .errors import ApiError, placement_error
from .state import STATE


class PlacementRoutes:
    """/placement/...: a mixin of server.Handler, self is the request being answered."""

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
