#!/usr/bin/python3
"""Calls API routes as whoever runs it (the tests run it as an unprivileged user).

Reads a JSON document on stdin:
    {"endpoint": "tcp:127.0.0.1:8080" | "unix:/path/rtgtd.sock",
     "calls": [{"method": "GET", "path": "/api/v1/...", "body": {...} | null,
                "token": "..." | null}, ...]}
and prints one JSON list on stdout: per call, {"status": N} or {"error": "..."} when no
HTTP answer came (e.g. the socket refused the connection).
"""

import http.client
import json
import socket
import sys


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=30)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(self.unix_path)
        self.sock = s


def connection(endpoint):
    kind, _, where = endpoint.partition(":")
    if kind == "unix":
        return UnixConnection(where)
    host, _, port = where.rpartition(":")
    return http.client.HTTPConnection(host, int(port), timeout=30)


def call(endpoint, c):
    headers = {}
    body = None
    if c.get("token") is not None:
        headers["Authorization"] = "Bearer " + c["token"]
    if c.get("body") is not None:
        body = json.dumps(c["body"]).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn = connection(endpoint)
        conn.request(c["method"], c["path"], body=body, headers=headers)
        r = conn.getresponse()
        text = r.read().decode("utf-8", "replace")
        conn.close()
        return {"status": r.status, "body": text[:300]}
    except OSError as e:
        return {"error": "%s: %s" % (type(e).__name__, e)}


def main():
    plan = json.load(sys.stdin)
    json.dump([call(plan["endpoint"], c) for c in plan["calls"]], sys.stdout)


if __name__ == "__main__":
    main()
