#!/usr/bin/env python3
"""A webhook receiver for spotplane's tests.

Verifies every request with the `standardwebhooks` package (the Standard Webhooks reference
library), once per secret in the secrets file (re-read on every request, one secret a line), and
appends what it saw to a JSON-lines log. Prints its port on the first line of its output.

  --fail-first N   answer 500 to the first N requests
  --slow SECONDS   wait this long before answering
"""
import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook, WebhookVerificationError

parser = argparse.ArgumentParser()
parser.add_argument("--secrets", required=True)
parser.add_argument("--log", required=True)
parser.add_argument("--fail-first", type=int, default=0)
parser.add_argument("--slow", type=float, default=0.0)
args = parser.parse_args()

lock = threading.Lock()
seen = [0]


def secrets():
    try:
        with open(args.secrets) as f:
            return [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return []


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        with lock:
            seen[0] += 1
            n = seen[0]
        if args.slow:
            time.sleep(args.slow)
        headers = {k.lower(): v for k, v in self.headers.items()}
        verified = []
        errors = []
        for i, secret in enumerate(secrets()):
            try:
                Webhook(secret).verify(body, headers)
                verified.append(i)
            except WebhookVerificationError as e:
                errors.append(str(e))
        status = 500 if n <= args.fail_first else (204 if verified else 400)
        record = {
            "n": n,
            "id": headers.get("webhook-id"),
            "timestamp": headers.get("webhook-timestamp"),
            "signatures": len(headers.get("webhook-signature", "").split()),
            "verified": verified,
            "errors": errors,
            "body": json.loads(body) if body else None,
            "answered": status,
        }
        with lock, open(args.log, "a") as f:
            f.write(json.dumps(record) + "\n")
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
