#!/usr/bin/env python3
"""A stateful OpenStack simulator for llmctl's tests (Python standard library only).

Follows ../shared/reference/openstack-api.md for Keystone v3, Blazar v1, Nova (flavors, key pairs, servers),
Cinder volumes, Neutron (networks, ports, security groups and rules, floating IPs) and Glance images. It listens
on 127.0.0.1 port 0 and prints "PORT <n>" as its only line of output. Time is the simulator's own:
it starts at --now and moves only when a test asks (POST /admin/advance), so lease and token
lifetimes are deterministic. With --wall-clock it follows the system's clock instead (plus any
/admin/advance), for tests that run the real llmctl binary, whose clock is the system's.

Fixed identities (tests use these):
  password user      name "demo" (id "u-demo", domain Default), password "demo-password"
  project            name "demo-project", id "p-demo", domain Default
  app credentials    id "ac-unrestricted" / secret "ac-secret"; id "ac-restricted" / secret
                     "ac-secret" (Blazar answers its lease creates with 500, as on Chameleon)
  OIDC (v3oidcpassword) discovery at /oidc/.well-known/openid-configuration, user "oidc-user",
                     password "oidc-password", identity provider "chameleon", protocol "openid"

Admin endpoints (no token needed):
  GET  /admin/time                  {"now": "<iso>"}
  POST /admin/advance               {"seconds": n}: moves the clock, leases change state
  POST /admin/faults                {"method", "path" (prefix), "status" | "delay_ms", "count",
                                     "after": true to act first and delay the answer}
  POST /admin/revoke_tokens         every issued token answers 401 from now on
  POST /admin/capacity              {"flavor": {"<flavor id>": n}, "hosts": [{"id","node_type"}]}
  POST /admin/fail_lease            {"name"}: the lease goes to ERROR when it should start
  POST /admin/lease_status          {"name", "status"}: puts a lease in a status, e.g. UPDATING, in which
                                    Blazar's manager is at work on it
  POST /admin/keystone              {"url", "admin_token"}: also accept tokens that real Keystone
                                    validates (tests/blazar: the real Blazar calls Nova and Placement here)
  POST /admin/compute               {"build_seconds": n, "delete_seconds": n,
                                     "fail_servers": {"<name>": "<fault>"}}: how long BUILD and a
                                    delete last; named servers end in ERROR with that fault
  POST /admin/storage               {"volume_seconds": n}: how long a volume stays "creating"
  POST /admin/images                {"page_size": n, "add": [{"id", "name"}]}
  POST /admin/floating_ip_pool      {"size": n}: how many 127.0.0.x addresses Neutron can hand out
  GET  /admin/books                 what exists (leases, private flavors, servers, volumes, ports,
                                    security groups, floating IPs) and every request seen; a
                                    server's user_data is there as sent (base64), as Nova shows
                                    admins OS-EXT-SRV-ATTR:user_data

Servers are limited by their reservation: at most `amount` live servers per flavor:instance
reservation, one per host of a physical:host reservation; beyond that a server ends in ERROR with
"No valid host was found", as Nova's scheduler answers. Floating IPs are 127.0.0.x only.
"""
import argparse
import datetime as dt
import os
import sys
from http.server import ThreadingHTTPServer

# python3 -I (as tests start it) leaves the script's folder off sys.path; the sim package lives there.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim.server import Handler  # noqa: E402
from sim.state import STATE, UTC  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--now", default="2030-01-01T00:00:00")
    parser.add_argument("--wall-clock", action="store_true",
                        help="follow the system's clock instead of --now")
    parser.add_argument("--token-ttl", type=int, default=3600)
    parser.add_argument("--region", default="KVM@TACC")
    parser.add_argument("--reservation-suffix", default="", choices=["", "/v1"],
                        help="what the catalog's reservation URL ends with after /blazar")
    args = parser.parse_args()
    STATE.now = dt.datetime.fromisoformat(args.now).replace(tzinfo=UTC)
    STATE.token_ttl = args.token_ttl
    STATE.region = args.region
    STATE.reservation_suffix = args.reservation_suffix
    if args.wall_clock:
        STATE.wall_clock_offset = dt.timedelta(0)
        STATE.now = dt.datetime.now(UTC)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print("PORT %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
