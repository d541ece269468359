"""Times the console's pages for bench/console.sh: logs in, then asks for
each page N times over one keep-alive connection; prints JSON with the
median and p95 of each (milliseconds, request sent to body read).

    python3 console_bench.py URL TOKEN TASK N
"""
import http.client
import json
import statistics
import sys
import time
import urllib.parse

url, token, task, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
host = urllib.parse.urlsplit(url).netloc
conn = http.client.HTTPConnection(host, timeout=60)
conn.request("POST", "/console/login", body=urllib.parse.urlencode({"token": token}),
             headers={"content-type": "application/x-www-form-urlencoded"})
r = conn.getresponse()
r.read()
cookie = r.getheader("set-cookie").split(";")[0]
pages = {
    "task list, first page": "/",
    "task list, page 100": "/?page=100",
    "task list, filtered by name (no match)": "/?q=nomatch",
    "task list, filtered by state": "/?state=suspended",
    "timeline, newest 200 of 100,000 events": f"/console/tasks/{task}",
    "timeline, an older page": f"/console/tasks/{task}?before=50000",
    "approvals": "/console/approvals",
}
out = {}
for name, path in pages.items():
    times = []
    for i in range(n + 3):
        t = time.perf_counter()
        conn.request("GET", path, headers={"cookie": cookie})
        r = conn.getresponse()
        body = r.read()
        dt = (time.perf_counter() - t) * 1000
        assert r.status == 200, (path, r.status, body[:200])
        if i >= 3:  # warm-up
            times.append(dt)
    times.sort()
    out[name] = {"path": path, "median_ms": statistics.median(times), "p95_ms": times[int(len(times) * 0.95) - 1], "bytes": len(body)}
print(json.dumps(out))
