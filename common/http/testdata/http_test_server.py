#!/usr/bin/env python3
"""A tiny HTTP server for common/http's tests (standard library only).

Listens on 127.0.0.1 port 0 and prints "PORT <n>"; with --tls CERT KEY it speaks HTTPS (the
loopback_cert.pem here is self-signed for IP 127.0.0.1 and valid until 2126). Routes:
  /echo                  the request as JSON: method, path, headers, body
  /status/<code>         answers <code> with an X-Openstack-Request-Id header
  /flaky/<key>/<n>       answers 503 the first <n> times per key, then 200
  /slow/<key>/<ms>       sleeps <ms> before answering 200 (the first time only when ?once=1)
  /count/<key>           how many requests /flaky, /slow and /file saw for <key>
  /file/<key>            100000 deterministic bytes with Range support; ?cut=<n> makes the first
                         answer close the connection after <n> body bytes; ?stall=<n> makes it
                         send <n> body bytes and then nothing, the connection left open
  /redirect              302 to /echo; ?to=<url> to <url> instead
"""
import argparse
import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

FILE_BYTES = bytes((i * 7 + 3) % 251 for i in range(100000))
counts = {}
lock = threading.Lock()


def bump(key):
    with lock:
        counts[key] = counts.get(key, 0) + 1
        return counts[key]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", headers=None):
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self):
        url = urlparse(self.path)
        query = parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if parts[0] == "echo":
            echo = {"method": self.command, "path": self.path, "body": body.decode(),
                    "headers": {k.lower(): v for k, v in self.headers.items()}}
            self.answer(200, json.dumps(echo).encode(), {"Content-Type": "application/json"})
        elif parts[0] == "status":
            self.answer(int(parts[1]), b'{"error": "as asked"}',
                        {"X-Openstack-Request-Id": "req-test-42"})
        elif parts[0] == "flaky":
            seen = bump(parts[1])
            self.answer(503 if seen <= int(parts[2]) else 200, b"flaky")
        elif parts[0] == "slow":
            seen = bump(parts[1])
            if seen == 1 or "once" not in query:
                time.sleep(int(parts[2]) / 1000)
            self.answer(200, b"slow")
        elif parts[0] == "count":
            with lock:
                self.answer(200, str(counts.get(parts[1], 0)).encode())
        elif parts[0] == "file":
            seen = bump(parts[1])
            start = 0
            status = 200
            headers = {}
            if self.headers.get("Range"):
                start = int(self.headers["Range"].split("=")[1].rstrip("-"))
                status = 206
                headers["Content-Range"] = "bytes %d-%d/%d" % (start, len(FILE_BYTES) - 1,
                                                              len(FILE_BYTES))
            payload = FILE_BYTES[start:]
            if seen == 1 and "stall" in query:
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload[:int(query["stall"][0])])
                self.wfile.flush()
                time.sleep(3600)
                return
            if seen == 1 and "cut" in query:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload[:int(query["cut"][0])])
                self.wfile.flush()
                self.close_connection = True
                return
            self.answer(status, payload, headers)
        elif parts[0] == "redirect":
            self.answer(302, b"", {"Location": query.get("to", ["/echo"])[0]})
        else:
            self.answer(404, b"no such route")

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = handle_any


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if args.tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*args.tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    print("PORT %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
