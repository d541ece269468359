"""Drives Cairn's MCP server with the official `mcp` Python package as the
client, over one transport, and checks every answer on the way.

    python3 mcp_client.py stdio|http URL TOKEN CAIRN_BINARY LABEL

stdio starts `CAIRN_BINARY mcp` (the bridge) with CAIRN_URL and CAIRN_TOKEN;
http talks to URL/mcp with the bearer token. Prints one JSON object (the
ids it made, for the test to check with the CLI) and exits 0, or exits
non-zero naming the first check that failed.
"""

import asyncio
import base64
import contextlib
import json
import os
import sys
import urllib.request

try:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
except ImportError as e:
    sys.exit(f"the mcp Python package is missing ({e}): python3 -m pip install mcp")

TOOLS = {
    "create_task", "list_tasks", "run_command", "read_file", "write_file", "list_files",
    "snapshot", "rollback", "fork", "wait_for_approval", "deliver", "destroy_task", "expose_port",
    "get_task", "list_snapshots",
}


def check(ok, what):
    if not ok:
        raise SystemExit(f"check failed: {what}")


@contextlib.asynccontextmanager
async def http_streams(url, token):
    """The streamable HTTP transport, in the package's current API or its
    earlier one."""
    headers = {"Authorization": f"Bearer {token}"}
    try:
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client
    except ImportError:
        from mcp.client.streamable_http import streamablehttp_client

        async with streamablehttp_client(url, headers=headers) as streams:
            yield streams[0], streams[1]
        return
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams[0], streams[1]


def field(obj, snake, camel):
    """A result field: snake_case in the package's current API, camelCase
    in its earlier one."""
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel)


def text_of(result):
    return "".join(getattr(c, "text", "") for c in result.content)


class Tools:
    def __init__(self, session):
        self.session = session

    async def ok(self, name, args):
        """Calls a tool that must succeed; answers its JSON."""
        result = await self.session.call_tool(name, args)
        check(not field(result, "is_error", "isError"), f"{name}({json.dumps(args)}) failed: {text_of(result)}")
        data = field(result, "structured_content", "structuredContent")
        check(isinstance(data, dict), f"{name} answered no structured content: {text_of(result)}")
        check(json.loads(text_of(result)) == data, f"{name}: text and structured content differ: {text_of(result)} vs {data}")
        return data

    async def error(self, name, args):
        """Calls a tool that must answer an error result; answers its text."""
        result = await self.session.call_tool(name, args)
        check(field(result, "is_error", "isError"), f"{name}({json.dumps(args)}) should have failed, answered {text_of(result)}")
        return text_of(result)


def approve(api, token, task):
    req = urllib.request.Request(
        f"{api}/v1/tasks/{task}/approve",
        data=json.dumps({"approve": True, "comment": "go ahead"}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        check(r.status == 200, f"approve answered {r.status}")


async def scenario(session, api, token, label):
    await session.initialize()
    t = Tools(session)
    listed = await session.list_tools()
    names = {tool.name for tool in listed.tools}
    check(TOOLS <= names, f"tools missing: {sorted(TOOLS - names)}")
    for tool in listed.tools:
        check(tool.description and field(tool, "input_schema", "inputSchema").get("type") == "object", f"{tool.name} has no description or object schema")

    created = await t.ok("create_task", {"name": f"mcp-{label}", "env": {"GREETING": "hello"}})
    task = created["id"]
    workdir = created["workdir"]
    path = f"{workdir}/hello.txt"
    # Answers are compact: no webhook secret, no environment values.
    check("webhook_secret" not in json.dumps(created) and "hello" not in json.dumps(created), f"a compact task: {created}")
    check(created["env"] == ["GREETING"], f"the env's names only: {created}")

    wrote = await t.ok("write_file", {"task": task, "path": path, "content": "hello from mcp\n"})
    check(wrote["size"] == 15, f"write_file size {wrote}")
    ran = await t.ok("run_command", {"task": task, "cmd": ["sh", "-c", 'cat hello.txt; echo "$GREETING $EXTRA" >&2; exit 3'], "env": {"EXTRA": "there"}})
    check(ran["stdout"] == "hello from mcp\n", f"run_command read the file: {ran}")
    check(ran["stderr"] == "hello there\n" and ran["exit_code"] == 3, f"run_command stderr and exit code: {ran}")
    fed = await t.ok("run_command", {"task": task, "cmd": ["wc", "-c"], "stdin": "12345"})
    check(fed["stdout"].strip() == "5", f"run_command stdin: {fed}")
    line = await t.ok("run_command", {"task": task, "cmd": "cat hello.txt | tr a-z A-Z > upper.txt && cat upper.txt"})
    check(line["stdout"] == "HELLO FROM MCP\n" and line["exit_code"] == 0, f"a shell line as cmd: {line}")
    slow = await t.ok("run_command", {"task": task, "cmd": "sleep 5", "timeout": 0.5})
    check(slow["timed_out"] and slow["exit_code"] == 124 and "message" not in slow, f"a given timeout: {slow}")
    bad_cmd = await t.error("run_command", {"task": task, "cmd": 5})
    check("a shell line (a string) or a program" in bad_cmd, f"cmd of another type: {bad_cmd}")

    # Relative paths start at the task's working directory, as a command's do.
    rel = await t.ok("write_file", {"task": task, "path": "rel.txt", "content": "relative\n"})
    check(rel["path"] == f"{workdir}/rel.txt", f"a relative write lands in the workdir: {rel}")
    rel_back = await t.ok("read_file", {"task": task, "path": "./upper.txt"})
    check(rel_back["content"] == "HELLO FROM MCP\n" and rel_back["path"] == f"{workdir}/upper.txt", f"a relative read: {rel_back}")
    nested = await t.ok("write_file", {"task": task, "path": "made/on/the/way.txt", "content": "nested\n"})
    check(nested["path"] == f"{workdir}/made/on/the/way.txt", f"a write makes its missing directories: {nested}")
    # A name that is not UTF-8: listed with its bytes, read back by them.
    await t.ok("run_command", {"task": task, "cmd": "mkdir latin && printf latin1 > latin/caf$(printf '\\351')"})
    latin = await t.ok("list_files", {"task": task, "path": "latin"})
    [entry] = latin["entries"]
    check(entry["name"] == "caf\\xe9" and base64.b64decode(entry["name_b64"]) == b"caf\xe9", f"a Latin-1 name: {latin}")
    full = base64.b64encode(workdir.encode() + b"/latin/" + base64.b64decode(entry["name_b64"])).decode()
    back = await t.ok("read_file", {"task": task, "path_b64": full})
    check(back["content"] == "latin1" and back["path"] == f"{workdir}/latin/caf\\xe9", f"read back by its bytes: {back}")
    both = await t.error("read_file", {"task": task, "path": "x", "path_b64": full})
    check(both.startswith("invalid:") and "not both" in both, f"path and path_b64: {both}")
    absolute = await t.ok("run_command", {"task": task, "cmd": ["cat", f"{workdir}/rel.txt"]})
    check(absolute["stdout"] == "relative\n", f"the relative write, read by its absolute path: {absolute}")

    await t.ok("write_file", {"task": task, "path": f"{workdir}/blob.bin", "content": "/wA=", "encoding": "base64"})
    blob = await t.ok("read_file", {"task": task, "path": f"{workdir}/blob.bin"})
    check(blob["encoding"] == "base64" and blob["content"] == "/wA=" and blob["size"] == 2, f"binary read_file: {blob}")

    listing = await t.ok("list_files", {"task": task})
    entries = {e["name"]: e for e in listing["entries"]}
    check(entries.get("hello.txt", {}).get("kind") == "file", f"list_files shows hello.txt: {listing}")

    snap = await t.ok("snapshot", {"task": task, "kind": "milestone", "note": "hello written", "healthy": True})
    snap_id = snap["id"]
    check("config" not in snap and snap["kind"] == "milestone" and snap["healthy"] is True, f"a compact snapshot: {snap}")
    snaps = await t.ok("list_snapshots", {"task": task})
    check([s["id"] for s in snaps["snapshots"]][-1:] == [snap_id] and snaps["snapshots"][-1]["note"] == "hello written", f"list_snapshots: {snaps}")
    broke = await t.ok("run_command", {"task": task, "cmd": ["sh", "-c", "rm hello.txt && echo broken > broken.txt"]})
    check(broke["exit_code"] == 0, f"breaking it: {broke}")
    gone = await t.error("read_file", {"task": task, "path": path})
    check("not_found" in gone or "No such file" in gone, f"the file is gone: {gone}")

    reason = f"{label}: deleted hello.txt by mistake"
    rolled = await t.ok("rollback", {"task": task, "to": snap_id, "reason": reason})
    check(rolled["rollback_note"]["reason"] == reason, f"the rollback note keeps the reason: {rolled}")
    shown = await t.ok("get_task", {"task": task})
    check(shown["rollback_note"]["reason"] == reason and shown["state"] == "running" and "webhook_secret" not in shown, f"get_task: {shown}")
    back = await t.ok("read_file", {"task": task, "path": path})
    check(back["content"] == "hello from mcp\n" and back["encoding"] == "utf8", f"the file is back: {back}")
    after = await t.ok("list_files", {"task": task, "path": workdir})
    check("broken.txt" not in {e["name"] for e in after["entries"]}, f"the breakage is gone: {after}")
    no_reason = await t.error("rollback", {"task": task, "to": snap_id, "reason": " "})
    check(no_reason.startswith("invalid:") and "reason" in no_reason, f"a rollback without a reason: {no_reason}")

    no_forks = await t.error("fork", {"task": task, "from": snap_id, "count": 0})
    check(no_forks.startswith("invalid:"), f"count 0: {no_forks}")
    forked = await t.ok("fork", {"task": task, "from": snap_id, "count": 1})
    check(len(forked["tasks"]) == 1, f"one fork: {forked}")
    fork = forked["tasks"][0]["id"]
    in_fork = await t.ok("read_file", {"task": fork, "path": path})
    check(in_fork["content"] == "hello from mcp\n", f"the fork has the file: {in_fork}")

    report = f"{workdir}/report.md"
    await t.ok("write_file", {"task": task, "path": report, "content": "# Done\nhello.txt holds the greeting.\n"})
    delivered = await t.ok("deliver", {"task": task, "files": [path], "report": report})
    kinds = {d["kind"]: d for d in delivered["deliverables"]}
    check(delivered["record_id"] and kinds.get("file", {}).get("name") == "hello.txt" and "report" in kinds, f"deliver: {delivered}")

    # Bad calls answer an error result naming what was wrong; the session goes on.
    unknown = await t.error("run_command", {"task": "no-such-task", "cmd": ["true"]})
    check(unknown.startswith("not_found:") and "no-such-task" in unknown, f"unknown task: {unknown}")
    empty = await t.error("run_command", {"task": task, "cmd": []})
    check(empty.startswith("invalid:") and "no command given" in empty, f"empty cmd: {empty}")
    missing = await t.error("run_command", {"task": task})
    check("cmd" in missing, f"missing cmd: {missing}")
    still = await t.ok("run_command", {"task": task, "cmd": ["echo", "still here"]})
    check(still["stdout"] == "still here\n", f"the session goes on: {still}")
    tasks = await t.ok("list_tasks", {})
    check({task, fork} <= {x["id"] for x in tasks["tasks"]}, f"list_tasks: {tasks}")

    # An approval: pending within the timeout, then approved over HTTP.
    pending = await t.ok("wait_for_approval", {"task": task, "prompt": f"{label}: ship hello.txt?", "timeout": 1})
    check(pending["state"] == "pending" and pending["approval_url"] and pending["wait_id"], f"still waiting: {pending}")
    check("/approve/" in pending["approval_url"], f"an approval link: {pending}")
    wait_id = pending["wait_id"]
    approve(api, token, task)
    done = await t.ok("wait_for_approval", {"wait_id": wait_id, "timeout": 60})
    check(done["state"] == "satisfied" and done["approved"] is True, f"approved: {done}")
    check(done["task_state"] == "running" and done["comment"] == "go ahead", f"the task runs again: {done}")
    woke = await t.ok("read_file", {"task": task, "path": path})
    check(woke["content"] == "hello from mcp\n", f"the woken task has its files: {woke}")
    both = await t.error("wait_for_approval", {"task": task, "wait_id": wait_id})
    check(both.startswith("invalid:"), f"task and wait_id together: {both}")

    link = await t.ok("expose_port", {"task": task, "port": 8000, "ttl_seconds": 60})
    check(f"/v1/tasks/{task}/ports/8000/" in link["url"] and "sig=" in link["url"], f"expose_port: {link}")
    bad = await t.error("expose_port", {"task": task, "port": 0})
    check(bad.startswith("invalid:"), f"port 0: {bad}")

    destroyed = await t.ok("destroy_task", {"task": fork})
    check(destroyed["id"] == fork and destroyed["state"] == "destroyed", f"destroy_task: {destroyed}")
    listed = {x["id"] for x in (await t.ok("list_tasks", {}))["tasks"]}
    check(task in listed and fork not in listed, f"list_tasks leaves the destroyed fork out: {listed}")
    everything = {x["id"] for x in (await t.ok("list_tasks", {"include_destroyed": True}))["tasks"]}
    check({task, fork} <= everything, f"include_destroyed lists it: {everything}")
    return {"task": task, "fork": fork, "snapshot": snap_id, "wait": wait_id, "reason": reason, "record": delivered["record_id"]}


async def main():
    transport, url, token, cairn, label = sys.argv[1:6]
    if transport == "stdio":
        params = StdioServerParameters(command=cairn, args=["mcp"], env={"CAIRN_URL": url, "CAIRN_TOKEN": token, "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        streams = stdio_client(params)
    else:
        streams = http_streams(f"{url}/mcp", token)
    async with streams as (read, write):
        async with ClientSession(read, write) as session:
            summary = await scenario(session, url, token, label)
    print(json.dumps(summary))


asyncio.run(main())
