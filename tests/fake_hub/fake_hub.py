#!/usr/bin/env python3
"""A fake Hugging Face hub on 127.0.0.1 for the agent's download tests (stdlib only).

Serves model repositories from directories, the way huggingface.co does for huggingface_hub:

  GET /api/models/ORG/NAME/revision/REV[?blobs=true]  {"id", "sha", "siblings": [{"rfilename",
      "size", "blobId", "lfs": {"sha256", "size", "pointerSize"}}]} (lfs for *.safetensors)
  GET /ORG/NAME/resolve/REV/FILE   small files: the bytes, ETag = git blob id; LFS files: 302 to
      /cdn/ORG/NAME/COMMIT/FILE with X-Linked-Etag = sha256 and X-Linked-Size
  GET /cdn/...                     the bytes, honouring "Range: bytes=N-" with 206
  Errors as the hub sends them: X-Error-Code RepositoryNotFound (401 without a token, 404 with
  one), RevisionNotFound, EntryNotFound.

Test controls:
  GET  /_stats                     {"requests": {path: n}, "bytes": {file: n}, "authorization": [...],
                                   "abandoned": n (stalled transfers the client closed)}
  POST /_drop?file=F&after=N       the next transfer of F sends N bytes and closes the connection
  POST /_delay?ms=N                every listing answer waits N ms first (lets calls overlap)
  POST /_stall?file=F&after=N      the next transfer of F sends N bytes and then nothing, its
                                   connection open until POST /_release (or an hour)

Arguments: --repo ORG/NAME=DIR (repeatable), --private ORG/NAME (needs "Bearer --token"),
--wrong-sha256 ORG/NAME/FILE (the listing advertises a wrong sha256 for FILE), --listed-size
ORG/NAME/FILE=N (the listing gives FILE's size as N, a JSON value: 0, -5, "none" to leave it out).
Prints "PORT <n>" once listening.
"""
import argparse
import hashlib
import json
import os
import select
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, repo_id, directory, wrong_sha256, listed_sizes):
        self.repo_id = repo_id
        self.commit = hashlib.sha1(repo_id.encode()).hexdigest()
        self.files = {}
        for name in sorted(os.listdir(directory)):
            with open(os.path.join(directory, name), "rb") as f:
                self.files[name] = f.read()
        self.wrong_sha256 = wrong_sha256
        self.listed_sizes = listed_sizes  # file -> the size the listing gives ("none": no size)

    def is_lfs(self, name):
        return name.endswith(".safetensors")

    def sha256(self, name):
        if name in self.wrong_sha256:
            return hashlib.sha256(b"not these bytes").hexdigest()
        return hashlib.sha256(self.files[name]).hexdigest()

    def listing(self):
        siblings = []
        for name, data in self.files.items():
            sibling = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
            if name in self.listed_sizes:
                listed = self.listed_sizes[name]
                if listed == "none":
                    del sibling["size"]
                else:
                    sibling["size"] = json.loads(listed)
            if self.is_lfs(name):
                sibling["lfs"] = {"sha256": self.sha256(name), "size": len(data), "pointerSize": 134}
            siblings.append(sibling)
        return {"id": self.repo_id, "sha": self.commit, "siblings": siblings}


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = {}
        self.bytes = {}
        self.authorization = []
        self.drops = {}  # file -> bytes to send before closing
        self.delay_ms = 0
        self.stalls = {}  # file -> bytes to send before going quiet
        self.release = threading.Event()
        self.abandoned = 0  # stalled transfers the client closed


def make_handler(repos, private, token, state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send(self, status, body=b"", headers=()):
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def error(self, status, code, message):
            self.send(status, json.dumps({"error": message}).encode(),
                      [("Content-Type", "application/json"), ("X-Error-Code", code),
                       ("X-Error-Message", message)])

        def do_POST(self):
            url = urllib.parse.urlparse(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            with state.lock:
                if url.path == "/_drop":
                    state.drops[query["file"]] = int(query["after"])
                elif url.path == "/_delay":
                    state.delay_ms = int(query["ms"])
                elif url.path == "/_stall":
                    state.stalls[query["file"]] = int(query["after"])
                elif url.path == "/_release":
                    state.release.set()
                else:
                    return self.send(404)
            self.send(204)

        def find_repo(self, org, name):
            """The repository, or None after answering as the hub does."""
            repo_id = org + "/" + name
            auth = self.headers.get("Authorization")
            repo = repos.get(repo_id)
            if repo is not None and (repo_id not in private or auth == "Bearer " + token):
                return repo
            if auth:
                self.error(404, "RepositoryNotFound", "Repository not found")
            else:
                self.error(401, "RepositoryNotFound", "Invalid username or password.")
            return None

        def do_GET(self):
            url = urllib.parse.urlparse(self.path)
            parts = url.path.split("/")
            with state.lock:
                state.requests[url.path] = state.requests.get(url.path, 0) + 1
                auth = self.headers.get("Authorization")
                if auth:
                    state.authorization.append(auth)
                delay = state.delay_ms
            if url.path == "/_stats":
                with state.lock:
                    body = json.dumps({"requests": state.requests, "bytes": state.bytes,
                                       "authorization": state.authorization,
                                       "abandoned": state.abandoned}).encode()
                return self.send(200, body, [("Content-Type", "application/json")])
            # /api/models/ORG/NAME/revision/REV
            if len(parts) >= 7 and parts[1:3] == ["api", "models"] and parts[5] == "revision":
                time.sleep(delay / 1000)
                repo = self.find_repo(parts[3], parts[4])
                if repo is None:
                    return
                revision = urllib.parse.unquote("/".join(parts[6:]))
                if revision not in ("main", repo.commit):
                    return self.error(404, "RevisionNotFound", "Invalid rev id: " + revision)
                body = json.dumps(repo.listing()).encode()
                return self.send(200, body, [("Content-Type", "application/json")])
            # /ORG/NAME/resolve/REV/FILE
            if len(parts) >= 6 and parts[3] == "resolve":
                repo = self.find_repo(parts[1], parts[2])
                if repo is None:
                    return
                revision = urllib.parse.unquote(parts[4])
                if revision not in ("main", repo.commit):
                    return self.error(404, "RevisionNotFound", "Invalid rev id: " + revision)
                name = urllib.parse.unquote("/".join(parts[5:]))
                if name not in repo.files:
                    return self.error(404, "EntryNotFound", name + " does not exist")
                commit_header = ("X-Repo-Commit", repo.commit)
                if repo.is_lfs(name):
                    host = self.headers.get("Host")
                    location = "http://%s/cdn/%s/%s/%s" % (host, repo.repo_id, repo.commit, name)
                    sha256 = repo.sha256(name)
                    return self.send(302, b"", [
                        ("Location", location), commit_header, ("ETag", '"%s"' % sha256),
                        ("X-Linked-Etag", '"%s"' % sha256),
                        ("X-Linked-Size", str(len(repo.files[name])))])
                return self.serve_bytes(name, repo.files[name],
                                        [commit_header, ("ETag", '"%s"' % git_blob_id(repo.files[name]))])
            # /cdn/ORG/NAME/COMMIT/FILE
            if len(parts) >= 6 and parts[1] == "cdn":
                repo = repos.get(parts[2] + "/" + parts[3])
                name = urllib.parse.unquote("/".join(parts[5:]))
                if repo is None or parts[4] != repo.commit or name not in repo.files:
                    return self.send(404)
                return self.serve_bytes(name, repo.files[name], [])
            self.send(404)

        def stall(self):
            """Sends nothing until /_release, an hour, or the client closes the connection
            (counted in /_stats as "abandoned")."""
            deadline = time.time() + 3600
            while not state.release.is_set() and time.time() < deadline:
                readable, _, _ = select.select([self.connection], [], [], 0.1)
                if not readable:
                    continue
                try:
                    closed = not self.connection.recv(1, socket.MSG_PEEK)
                except OSError:
                    closed = True
                if closed:
                    with state.lock:
                        state.abandoned += 1
                    return

        def serve_bytes(self, name, data, headers):
            start = 0
            status = 200
            header = self.headers.get("Range")
            if header and header.startswith("bytes=") and header.endswith("-"):
                start = int(header[len("bytes="):-1])
                if start >= len(data):
                    return self.send(416, b"", [("Content-Range", "bytes */%d" % len(data))])
                status = 206
                headers = headers + [("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))]
            body = data[start:]
            with state.lock:
                drop = state.drops.pop(name, None)
                stall = state.stalls.pop(name, None)
            if stall is not None:
                drop = stall
            self.send_response(status)
            for field, value in headers:
                self.send_header(field, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            sent = body if drop is None else body[:drop]
            self.wfile.write(sent)
            with state.lock:
                state.bytes[name] = state.bytes.get(name, 0) + len(sent)
            if drop is not None:
                self.wfile.flush()
                if stall is not None:
                    self.stall()
                self.close_connection = True
                self.connection.shutdown(2)

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", action="append", default=[], help="ORG/NAME=DIR")
    parser.add_argument("--private", action="append", default=[])
    parser.add_argument("--token", default="")
    parser.add_argument("--wrong-sha256", action="append", default=[], help="ORG/NAME/FILE")
    parser.add_argument("--listed-size", action="append", default=[], help="ORG/NAME/FILE=N")
    args = parser.parse_args()
    repos = {}
    for spec in args.repo:
        repo_id, directory = spec.split("=", 1)
        wrong = {w[len(repo_id) + 1:] for w in args.wrong_sha256 if w.startswith(repo_id + "/")}
        sizes = dict(s[len(repo_id) + 1:].split("=", 1) for s in args.listed_size
                     if s.startswith(repo_id + "/"))
        repos[repo_id] = Repo(repo_id, directory, wrong, sizes)
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 make_handler(repos, set(args.private), args.token, State()))
    server.daemon_threads = True
    print("PORT %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
