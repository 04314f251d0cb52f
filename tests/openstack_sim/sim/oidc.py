"""OpenID Connect as Chameleon's Keycloak answers it: discovery and the password grant."""
import uuid
from urllib.parse import parse_qs

from .errors import ApiError
from .state import STATE


class OidcRoutes:
    """/oidc/...: a mixin of server.Handler, self is the request being answered."""

    def oidc(self, what, raw):
        if what == ".well-known/openid-configuration":
            return 200, {"issuer": self.base_url() + "/oidc",
                         "token_endpoint": self.base_url() + "/oidc/token"}, None
        if what == "token":
            form = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
            if form.get("grant_type") != "password" or "openid" not in form.get("scope", ""):
                raise ApiError(400, {"error": "invalid_request"})
            if (form.get("username"), form.get("password")) != ("oidc-user", "oidc-password"):
                raise ApiError(401, {"error": "invalid_grant",
                                     "error_description": "Invalid user credentials"})
            access = "at-" + uuid.uuid4().hex
            STATE.access_tokens.add(access)
            return 200, {"access_token": access, "token_type": "Bearer", "expires_in": 300}, None
        raise ApiError(404, {"error": "no oidc route " + what})
