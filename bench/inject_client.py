"""HTTPS client of bench/inject.sh: keep-alive requests to one host, either
straight to an address or through the proxy's CONNECT. Prints one JSON line.

  inject_client.py latency HOST PORT CAFILE N [PROXY_PORT] [AUTH]
  inject_client.py rate HOST PORT CAFILE SECONDS PROCS [PROXY_PORT] [AUTH]

latency: N sequential requests on one connection, each timed (the first
ten are a warm-up); rate: PROCS processes, each on its own connection, as
many requests as they can in SECONDS. AUTH is sent as the Authorization
header (the ways where the client must hold the credential itself).
"""
import http.client
import json
import multiprocessing
import ssl
import sys
import time

PATH = "/echo"


def connection(host, port, cafile, proxy_port):
    ctx = ssl.create_default_context(cafile=cafile)
    if proxy_port:
        c = http.client.HTTPSConnection("127.0.0.1", proxy_port, context=ctx, timeout=30)
        c.set_tunnel(host, port)
    else:
        c = http.client.HTTPSConnection(host, port, context=ctx, timeout=30)
    return c


def one(c, auth):
    headers = {"Authorization": auth} if auth else {}
    c.request("GET", PATH, headers=headers)
    r = c.getresponse()
    body = r.read()
    if r.status != 200:
        raise SystemExit(f"status {r.status}: {body[:200]!r}")
    return body


def latency(host, port, cafile, n, proxy_port, auth):
    c = connection(host, port, cafile, proxy_port)
    times = []
    for i in range(n + 10):
        t = time.perf_counter()
        body = one(c, auth)
        if i >= 10:
            times.append(time.perf_counter() - t)
    times.sort()
    q = lambda p: times[min(len(times) - 1, int(p * len(times)))]
    return {"n": n, "p50_us": q(0.5) * 1e6, "p99_us": q(0.99) * 1e6, "body": body.decode(errors="replace").strip()}


def worker(args):
    host, port, cafile, seconds, proxy_port, auth = args
    c = connection(host, port, cafile, proxy_port)
    one(c, auth)
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        one(c, auth)
        n += 1
    return n


def rate(host, port, cafile, seconds, procs, proxy_port, auth):
    with multiprocessing.Pool(procs) as pool:
        t = time.perf_counter()
        counts = pool.map(worker, [(host, port, cafile, seconds, proxy_port, auth)] * procs)
        took = time.perf_counter() - t
    return {"requests": sum(counts), "rps": sum(counts) / seconds, "wall_s": took}


def main():
    mode, host, port, cafile = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if mode == "latency":
        n = int(sys.argv[5])
        rest = sys.argv[6:]
        proxy_port = int(rest[0]) if rest and rest[0] else 0
        auth = rest[1] if len(rest) > 1 else None
        print(json.dumps(latency(host, port, cafile, n, proxy_port, auth)))
    else:
        seconds, procs = float(sys.argv[5]), int(sys.argv[6])
        rest = sys.argv[7:]
        proxy_port = int(rest[0]) if rest and rest[0] else 0
        auth = rest[1] if len(rest) > 1 else None
        print(json.dumps(rate(host, port, cafile, seconds, procs, proxy_port, auth)))


if __name__ == "__main__":
    main()
