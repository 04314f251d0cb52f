"""Who may call the services: this simulator's tokens, or a real Keystone's (tests/blazar)."""
import datetime as dt
import json
import urllib.error
import urllib.request

from .errors import keystone_error
from .state import STATE, UTC


def keystone_accepts(token):
    """Whether the real Keystone at STATE.keystone_url takes `token`, asked with that Keystone's admin token
    (a trust-scoped token may not validate itself: 403), cached until the expiry it names. Called under
    STATE.lock: Keystone never calls back here."""
    now = dt.datetime.now(UTC)
    if not token or STATE.keystone_tokens.get(token, now) > now:
        return bool(token)
    request = urllib.request.Request(STATE.keystone_url + "/auth/tokens?nocatalog",
                                     headers={"X-Auth-Token": STATE.keystone_admin_token,
                                              "X-Subject-Token": token})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            expires = json.loads(response.read())["token"]["expires_at"]
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError, KeyError):
        return False
    STATE.keystone_tokens[token] = dt.datetime.fromisoformat(expires.replace("Z", "+00:00"))
    return True


class TokenCheck:
    """A mixin of server.Handler: self is the request being answered."""

    def require_token(self):
        token = STATE.tokens.get(self.headers.get("X-Auth-Token", ""))
        if token is None and STATE.keystone_url and keystone_accepts(self.headers.get("X-Auth-Token", "")):
            return
        if token is None or token["revoked"] or STATE.now >= token["expires"]:
            raise keystone_error(401, "The request you have made requires authentication.")
        if not token["scoped"]:
            raise keystone_error(401, "An unscoped token cannot call services.")
