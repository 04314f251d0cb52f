"""The simulated cloud: fixed identities and flavors, every resource, and the clock that moves them."""
import datetime as dt
import threading

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
    def __init__(self):
        self.lock = threading.Lock()
        self.now = None  # main sets these three from the command line before serving
        self.token_ttl = None
        self.region = None
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


# The one simulated cloud, shared by every module; main configures it from the command line.
STATE = State()
