"""Fetch a Drover /v1/metrics?format=prometheus answer and parse it with the
Prometheus Python client's text parser (prometheus_client.parser, PyPI
prometheus-client): what a Prometheus-format consumer reads.

Usage: metrics_parse.py http://127.0.0.1:PORT | unix:/path/to/api.sock

Prints one JSON object: {"content_type": ..., "types": {family: type},
"samples": [[name, labels, value], ...]}. Exits non-zero when the parser refuses
the exposition.
"""

import http.client
import json
import socket
import sys

from prometheus_client.parser import text_string_to_metric_families

PATH = "/v1/metrics?format=prometheus"


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=30)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(self.unix_path)


def fetch(target):
    if target.startswith("unix:"):
        conn = UnixConnection(target[len("unix:"):])
    else:
        host = target.split("//", 1)[1]
        conn = http.client.HTTPConnection(host, timeout=30)
    conn.request("GET", PATH)
    resp = conn.getresponse()
    body = resp.read().decode("utf-8")
    if resp.status != 200:
        sys.exit(f"{target}{PATH}: HTTP {resp.status}: {body}")
    return resp.getheader("Content-Type"), body


def main():
    content_type, text = fetch(sys.argv[1])
    types = {}
    samples = []
    for family in text_string_to_metric_families(text):
        if family.name in types:
            sys.exit(f"family {family.name} appears twice")
        types[family.name] = family.type
        for s in family.samples:
            samples.append([s.name, s.labels, s.value])
    print(json.dumps({"content_type": content_type, "types": types, "samples": samples}))


if __name__ == "__main__":
    main()
