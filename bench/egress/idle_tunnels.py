"""Opens N idle tunnels through the egress proxy and holds them.

Each tunnel: CONNECT, TLS with the proxy's leaf, one request with a token
(so the upstream connection is made too), then nothing. Prints "ready N"
once all are open, then waits until stdin closes or a timeout passes.
"""
import argparse
import socket
import ssl
import sys
import select

p = argparse.ArgumentParser()
p.add_argument("--proxy-port", type=int, required=True)
p.add_argument("--host", default="api.openai.com")
p.add_argument("--port", type=int, required=True)
p.add_argument("--ca", required=True)
p.add_argument("--token", required=True)
p.add_argument("-n", type=int, default=1000)
p.add_argument("--hold-seconds", type=float, default=60)
a = p.parse_args()

ctx = ssl.create_default_context(cafile=a.ca)
tunnels = []
for i in range(a.n):
    s = socket.create_connection(("127.0.0.1", a.proxy_port), timeout=10)
    s.sendall(f"CONNECT {a.host}:{a.port} HTTP/1.1\r\nHost: {a.host}:{a.port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            sys.exit(f"tunnel {i}: proxy closed")
        head += chunk
    if b" 200 " not in head.split(b"\r\n")[0]:
        sys.exit(f"tunnel {i}: {head!r}")
    t = ctx.wrap_socket(s, server_hostname=a.host)
    t.sendall(f"GET / HTTP/1.1\r\nHost: {a.host}:{a.port}\r\nAuthorization: Bearer {a.token}\r\n\r\n".encode())
    resp = t.recv(65536)
    if not resp.startswith(b"HTTP/1.1 200"):
        sys.exit(f"tunnel {i}: {resp[:200]!r}")
    tunnels.append(t)
print(f"ready {len(tunnels)}", flush=True)
select.select([sys.stdin], [], [], a.hold_seconds)
