"""mitmproxy addon doing what the hermes proxy does in the benchmark:
swap the proxy token in Authorization for the real key, and send
api.openai.com to the local upstream."""
import os

from mitmproxy import http

TOKEN = os.environ["BENCH_TOKEN"]
KEY = os.environ["BENCH_KEY"]
UPSTREAM_PORT = int(os.environ["BENCH_UPSTREAM_PORT"])


class Inject:
    def server_connect(self, data):
        data.server.address = ("127.0.0.1", UPSTREAM_PORT)

    def request(self, flow):
        if flow.request.headers.get("authorization") == f"Bearer {TOKEN}":
            flow.request.headers["authorization"] = f"Bearer {KEY}"
        else:
            flow.response = http.Response.make(403, b"no token")


addons = [Inject()]
