"""Glance v2: public images, paged as Glance pages them."""
from urllib.parse import quote

from .errors import ApiError
from .state import STATE

# What Glance says of a public image; an image added with its own members (an admin call) keeps them.
IMAGE_DEFAULTS = {"status": "active", "visibility": "public"}


class GlanceRoutes:
    """/glance/v2/...: a mixin of server.Handler, self is the request being answered."""

    def glance(self, what, query):
        parts = what.strip("/").split("/")
        if parts == ["images"] and self.command == "GET":
            images = [dict(IMAGE_DEFAULTS, **i) for i in STATE.images]
            if "name" in query:
                images = [i for i in images if i["name"] == query["name"][0]]
            start = 0
            if "marker" in query:
                start = next(n for n, i in enumerate(images) if i["id"] == query["marker"][0]) + 1
            size = int(query.get("limit", [STATE.image_page_size])[0])
            page = images[start:start + size]
            body = {"images": page, "first": "/v2/images", "schema": "/v2/schemas/images"}
            if start + size < len(images):
                rest = [("marker", page[-1]["id"])] + [
                    (k, v[0]) for k, v in query.items() if k != "marker"]
                body["next"] = "/v2/images?" + "&".join("%s=%s" % (k, quote(v)) for k, v in rest)
            return 200, body, None
        if len(parts) == 2 and parts[0] == "images" and self.command == "GET":
            image = next((i for i in STATE.images if i["id"] == parts[1]), None)
            if image is None:
                raise ApiError(404, {"message": "No image found with ID %s" % parts[1]})
            return 200, dict(IMAGE_DEFAULTS, **image), None
        raise ApiError(404, {"message": "no Glance route " + what})
