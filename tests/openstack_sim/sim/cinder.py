"""Cinder v3: volumes, created empty or from an image, that take a while to become available."""
import datetime as dt
import uuid

from .errors import cinder_error
from .state import STATE, fmt_iso


class CinderRoutes:
    """/cinder/v3/<project>/...: a mixin of server.Handler, self is the request being answered."""

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
