"""Runs every Python block of README.md and docs/*.md as written, against
a real daemon (CAIRN_URL, CAIRN_TOKEN).

    python3 doc_snippets.py REPO_ROOT

The blocks of one file run in order in one namespace, since a guide builds
on its earlier blocks; each is compiled as a module that may await at its
top level, as `python3 -m asyncio` runs it. While they run, a helper
stands in for the people and senders the blocks wait on: it approves each
pending approval and sends the event each pending webhook wait names.
After a file's blocks, a check of its own may test what they defined
(the webhook receiver of notifications.md against a real signature).

Prints one line per block and exits 0, or exits non-zero naming the file,
the block's first line and what it raised.
"""

import ast
import asyncio
import glob
import inspect
import json
import os
import re
import sys
import threading
import time
import traceback
import urllib.request

FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks(path):
    """(line of the block's first line of code, its source) of each block."""
    text = open(path, encoding="utf-8").read()
    for m in FENCE.finditer(text):
        yield text.count("\n", 0, m.start()) + 2, m.group(1)


def run_block(source, name, namespace):
    code = compile(source, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, namespace))  # a block that awaits: its coroutine
    else:
        exec(code, namespace)


def api(method, path, body=None):
    req = urllib.request.Request(
        os.environ["CAIRN_URL"] + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["CAIRN_TOKEN"], "Content-Type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def answer_waits(stop, answered):
    """Approves pending approvals and sends pending webhook events, until
    `stop`; counts what it answered by kind in `answered`."""
    while not stop.wait(0.2):
        try:
            for t in api("GET", "/v1/tasks"):
                if t["state"] != "suspended":
                    continue
                wait = api("GET", f"/v1/tasks/{t['id']}").get("pending_wait")
                if not wait or wait["state"] != "pending":
                    continue
                if wait["kind"] == "approval":
                    api("POST", f"/v1/tasks/{t['id']}/approve", {"approve": True, "comment": "looks right"})
                elif wait["kind"] == "webhook":
                    api("POST", f"/v1/tasks/{t['id']}/inbox", {"name": wait["name"], "data": {"status": "passed"}})
                else:
                    continue
                answered[wait["kind"]] = answered.get(wait["kind"], 0) + 1
        except Exception as e:  # a task gone between two calls: look again
            print(f"(the helper looked again: {e})", file=sys.stderr)


def check_notifications(namespace):
    """The receiver the page shows accepts a real Standard Webhooks
    signature and refuses a changed body and another secret."""
    from standardwebhooks.webhooks import Webhook
    import base64
    from datetime import datetime, timezone

    secret = "whsec_" + base64.b64encode(b"k" * 24).decode()
    body = b'{"type":"task.waiting"}'
    now = datetime.now(tz=timezone.utc)
    signature = Webhook(secret).sign("msg_1", now, body.decode())
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": signature}
    verify = namespace["verify"]
    assert verify(secret, headers, body), "the receiver refused a real signature"
    assert not verify(secret, headers, body + b" "), "the receiver accepted a changed body"
    other = "whsec_" + base64.b64encode(b"o" * 24).decode()
    assert not verify(other, headers, body), "the receiver accepted another secret"


CHECKS = {"docs/notifications.md": check_notifications}


def main():
    root = sys.argv[1]
    files = ["README.md"] + sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))
    stop, answered = threading.Event(), {}
    helper = threading.Thread(target=answer_waits, args=(stop, answered), daemon=True)
    helper.start()
    ran = 0
    try:
        for rel in files:
            found = list(blocks(os.path.join(root, rel)))
            if not found:
                continue
            namespace = {"__name__": "__main__"}
            for line, source in found:
                name = f"{rel}:{line}"
                began = time.monotonic()
                try:
                    run_block(source, name, namespace)
                except BaseException as e:
                    traceback.print_exc()
                    first = source.strip().splitlines()[0]
                    sys.exit(f"{name} (`{first}`) failed: {type(e).__name__}: {e}")
                ran += 1
                print(f"ran {name} in {time.monotonic() - began:.1f}s", flush=True)
            if rel in CHECKS:
                CHECKS[rel](namespace)
                print(f"checked what {rel} defines", flush=True)
    finally:
        stop.set()
        helper.join()
    print(json.dumps({"blocks": ran, "answered": answered}))


if __name__ == "__main__":
    main()
