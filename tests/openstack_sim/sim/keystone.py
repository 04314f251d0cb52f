"""Keystone v3: tokens by password, application credential, token and OIDC, with the catalog."""
import datetime as dt
import json
import uuid

from .errors import keystone_error
from .state import APP_CREDENTIALS, PROJECT, STATE, USER, fmt_iso


class KeystoneRoutes:
    """/v3/...: a mixin of server.Handler, self is the request being answered."""

    def catalog(self):
        base = self.base_url()
        def service(type_, url):
            return {"type": type_, "name": type_, "id": "svc-" + type_, "endpoints": [
                {"id": "ep-%s-pub" % type_, "interface": "public", "region": STATE.region,
                 "region_id": STATE.region, "url": url},
                {"id": "ep-%s-int" % type_, "interface": "internal", "region": STATE.region,
                 "region_id": STATE.region, "url": "http://internal.invalid/" + type_},
                {"id": "ep-%s-other" % type_, "interface": "public", "region": "CHI@Elsewhere",
                 "region_id": "CHI@Elsewhere", "url": "http://elsewhere.invalid/" + type_}]}
        # Whether Chameleon's reservation URL ends in /v1 is not confirmed: tests try both.
        return [service("reservation", base + "/blazar" + STATE.reservation_suffix),
                service("compute", base + "/nova/v2.1"),
                service("volumev3", base + "/cinder/v3/" + PROJECT["id"]),
                service("network", base + "/neutron"),
                service("image", base + "/glance"),
                service("identity", base + "/v3")]

    def issue_token(self, method, scoped, status=201):
        token_id = "tok-" + uuid.uuid4().hex
        expires = STATE.now + dt.timedelta(seconds=STATE.token_ttl)
        STATE.tokens[token_id] = {"expires": expires, "scoped": scoped, "revoked": False}
        token = {"methods": [method], "expires_at": fmt_iso(expires),
                 "issued_at": fmt_iso(STATE.now), "user": USER}
        if scoped:
            token.update(project=PROJECT, catalog=self.catalog(),
                         roles=[{"id": "r-member", "name": "member"}])
        return status, {"token": token}, {"X-Subject-Token": token_id}

    def check_scope(self, scope):
        project = (scope or {}).get("project")
        if project is None:
            raise keystone_error(401, "A project scope is required here.")
        if project.get("id") == PROJECT["id"]:
            return
        domain = project.get("domain", {})
        if project.get("name") == PROJECT["name"] and (
                domain.get("id") == "default" or domain.get("name") == "Default"):
            return
        raise keystone_error(401, "The request you have made requires authentication.")

    def keystone(self, what, raw):
        if what == "OS-FEDERATION/identity_providers/chameleon/protocols/openid/auth":
            auth = self.headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or auth[7:] not in STATE.access_tokens:
                raise keystone_error(401, "Invalid OpenID Connect access token.")
            return self.issue_token("openid", scoped=False)
        if what != "auth/tokens" or self.command != "POST":
            raise keystone_error(404, "Could not find the requested resource.")
        try:
            auth = json.loads(raw)["auth"]
            identity = auth["identity"]
            methods = identity["methods"]
        except (ValueError, KeyError, TypeError):
            raise keystone_error(400, "Expecting to find auth in request body.")
        if methods == ["password"]:
            user = identity["password"]["user"]
            by_id = user.get("id") == USER["id"]
            by_name = user.get("name") == USER["name"] and (
                user.get("domain", {}).get("id") == "default"
                or user.get("domain", {}).get("name") == "Default")
            if not (by_id or by_name) or user.get("password") != "demo-password":
                raise keystone_error(401, "The request you have made requires authentication.")
            self.check_scope(auth.get("scope"))
            return self.issue_token("password", scoped=True)
        if methods == ["application_credential"]:
            cred = identity["application_credential"]
            known = APP_CREDENTIALS.get(cred.get("id"))
            if known is None or known[0] != cred.get("secret"):
                raise keystone_error(401, "The request you have made requires authentication.")
            if "scope" in auth:
                raise keystone_error(401, "Application credentials cannot request a scope.")
            status, body, headers = self.issue_token("application_credential", scoped=True)
            body["token"]["application_credential"] = {
                "id": cred["id"], "restricted": not known[1]}
            STATE.tokens[headers["X-Subject-Token"]]["unrestricted"] = known[1]
            return status, body, headers
        if methods == ["token"]:
            old = STATE.tokens.get(identity["token"]["id"])
            if old is None or old["revoked"] or STATE.now >= old["expires"]:
                raise keystone_error(401, "The request you have made requires authentication.")
            self.check_scope(auth.get("scope"))
            return self.issue_token("token", scoped=True)
        raise keystone_error(401, "Unsupported authentication method %s" % methods)
