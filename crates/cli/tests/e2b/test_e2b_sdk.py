"""E2B's own Python SDK (the `e2b` package from PyPI, unmodified) against a
Cairn daemon, configured only by E2B_API_URL, E2B_SANDBOX_URL and
E2B_API_KEY. Run by crates/cli/tests/e2b_sdk.rs, which starts the daemon."""

import os
import time
import uuid

import httpx
import pytest
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import (
    AuthenticationException,
    NotFoundException,
    SandboxException,
    TimeoutException,
)
from e2b.sandbox.commands.command_handle import CommandExitException

API_URL = os.environ["E2B_API_URL"]


@pytest.fixture
def sandbox():
    sb = Sandbox.create(timeout=300, metadata={"suite": "e2b-sdk"}, envs={"GREETING": "hello"})
    yield sb
    try:
        sb.kill()
    except Exception:
        pass


def test_create_runs_commands_with_env_cwd_and_user(sandbox):
    r = sandbox.commands.run("echo $GREETING; pwd; id -u; echo oops >&2")
    assert r.exit_code == 0
    assert r.stdout.splitlines() == ["hello", "/workspace", "0"]
    assert r.stderr == "oops\n"
    r = sandbox.commands.run("echo $ONE-$GREETING; pwd", envs={"ONE": "1"}, cwd="/tmp", user="root")
    assert r.stdout.splitlines() == ["1-hello", "/tmp"]


def test_a_failing_command_raises_with_its_exit_code_and_stderr(sandbox):
    with pytest.raises(CommandExitException) as e:
        sandbox.commands.run("echo partial; echo broken >&2; exit 3")
    assert e.value.exit_code == 3
    assert e.value.stdout == "partial\n" and e.value.stderr == "broken\n"


def test_a_command_past_its_timeout_raises_timeout(sandbox):
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)
    assert time.monotonic() - started < 20
    # The sandbox is fine afterwards.
    assert sandbox.commands.run("echo ok").stdout == "ok\n"


def test_output_streams_to_callbacks_as_it_comes(sandbox):
    seen = []
    r = sandbox.commands.run("for i in 1 2 3; do echo line$i; sleep 0.2; done", on_stdout=lambda s: seen.append((time.monotonic(), s)))
    assert "".join(s for _, s in seen) == "line1\nline2\nline3\n"
    assert len(seen) >= 2 and seen[-1][0] - seen[0][0] > 0.2, "output came as it was written, not at the end"
    assert r.stdout == "line1\nline2\nline3\n"


def test_background_commands_are_listed_connected_fed_and_killed(sandbox):
    cat = sandbox.commands.run("cat", background=True, stdin=True)
    sleeper = sandbox.commands.run("sleep 60", background=True)
    pids = {p.pid for p in sandbox.commands.list()}
    assert {cat.pid, sleeper.pid} <= pids
    sandbox.commands.send_stdin(cat.pid, "fed through stdin\n")
    sandbox.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "fed through stdin\n"
    again = sandbox.commands.connect(sleeper.pid)
    assert sandbox.commands.kill(sleeper.pid) is True
    with pytest.raises(CommandExitException):
        again.wait()
    assert sleeper.pid not in {p.pid for p in sandbox.commands.list()}
    assert sandbox.commands.kill(999999) is False


def test_files_round_trip_binary_and_directories(sandbox):
    # Larger than one read of the daemon's, and than a default body limit.
    blob = os.urandom(5 << 20) + bytes(range(256)) * 64 + b"\xff\xfe not utf-8 \x80"
    sandbox.files.write("/workspace/data/blob.bin", blob)
    assert sandbox.files.read("/workspace/data/blob.bin", format="bytes") == blob
    sandbox.files.write("/workspace/hello.txt", "hi there")
    assert sandbox.files.read("/workspace/hello.txt") == "hi there"
    assert sandbox.commands.run("cat /workspace/hello.txt").stdout == "hi there"
    names = {e.name for e in sandbox.files.list("/workspace")}
    assert {"data", "hello.txt"} <= names
    deep = sandbox.files.list("/workspace", depth=2)
    assert "/workspace/data/blob.bin" in {e.path for e in deep}
    assert sandbox.files.exists("/workspace/hello.txt") and not sandbox.files.exists("/workspace/missing")
    info = sandbox.files.get_info("/workspace/data/blob.bin")
    assert info.size == len(blob) and info.type.value == "file"
    assert sandbox.files.make_dir("/workspace/new/dir") is True
    assert sandbox.files.make_dir("/workspace/new/dir") is False
    moved = sandbox.files.rename("/workspace/hello.txt", "/workspace/new/hello.txt")
    assert moved.path == "/workspace/new/hello.txt"
    sandbox.files.remove("/workspace/new")
    assert not sandbox.files.exists("/workspace/new/hello.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.read("/workspace/missing")


def test_signed_urls_upload_and_download(sandbox):
    up = sandbox.upload_url("/workspace/signed.txt")
    assert httpx.post(up, files={"file": ("signed.txt", b"via a signed url")}).status_code == 200
    down = sandbox.download_url("/workspace/signed.txt")
    assert httpx.get(down).content == b"via a signed url"
    forged = down.replace("signature=v1_", "signature=v1_x")
    assert httpx.get(forged).status_code == 401


def test_paths_resolve_inside_the_sandbox_never_out(sandbox):
    # (A link to /tmp, not to /: gVisor refuses to create a file through a
    # link to its root, with EISDIR.)
    sandbox.commands.run("ln -s /tmp /workspace/tmp-link; ln -s /etc/hostname /workspace/name-link")
    # `..` and links go through the sandbox's own tree: the host's files
    # are never what is read or written.
    assert sandbox.files.read("/workspace/../etc/hostname").strip() == sandbox.commands.run("cat /etc/hostname").stdout.strip()
    sandbox.files.write("/workspace/tmp-link/through-link", "inside")
    assert sandbox.commands.run("cat /tmp/through-link").stdout == "inside"
    assert not os.path.exists("/tmp/through-link")


def test_list_filters_by_metadata_and_state_and_info_is_reported(sandbox):
    tag = uuid.uuid4().hex
    other = Sandbox.create(timeout=300, metadata={"run": tag})
    try:
        found = Sandbox.list(query=SandboxQuery(metadata={"run": tag})).next_items()
        assert [s.sandbox_id for s in found] == [other.sandbox_id]
        info = other.get_info()
        assert info.metadata == {"run": tag} and info.state.value == "running"
        running = {s.sandbox_id for s in Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])).next_items()}
        assert {sandbox.sandbox_id, other.sandbox_id} <= running
    finally:
        other.kill()
    assert other.sandbox_id not in {s.sandbox_id for s in Sandbox.list().next_items()}


def test_timeout_pause_resume_keep_files(sandbox):
    sandbox.set_timeout(600)
    end = sandbox.get_info().end_at
    assert end.timestamp() - time.time() > 500
    sandbox.files.write("/workspace/kept.txt", "across a pause")
    # A process holding a value only in its memory, and counting.
    sandbox.files.write("/workspace/hold.py", "import os, time\nv = os.urandom(8).hex()\ni = 0\nwhile True:\n    i += 1\n    open('/workspace/value.tmp', 'w').write(f'{v} {i}')\n    os.replace('/workspace/value.tmp', '/workspace/value')\n    time.sleep(0.2)\n")
    sandbox.commands.run("python3 /workspace/hold.py >/dev/null 2>&1 &")

    def held():
        text = sandbox.commands.run("cat /workspace/value 2>/dev/null || true").stdout.split()
        return (text[0], int(text[1])) if len(text) == 2 else None

    deadline = time.monotonic() + 20
    while held() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    before = held()
    assert before is not None, "the holding process never wrote"
    sandbox.pause()
    assert Sandbox.get_info(sandbox.sandbox_id).state.value == "paused"
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.get_info().state.value == "running"
    assert again.files.read("/workspace/kept.txt") == "across a pause"
    assert again.commands.run("echo awake").stdout == "awake\n"
    if os.environ.get("CAIRN_TEST_ISOLATION") == "gvisor":
        # Memory kept: the same process counts on from where it was, with
        # the value it held only in memory.
        deadline = time.monotonic() + 10
        while (now := held()) is not None and now[1] <= before[1] + 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert now is not None and now[0] == before[0] and now[1] > before[1] + 1, (before, now)
    else:
        # Files only on the native driver: the process is gone, its count stopped.
        time.sleep(1)
        after = held()
        assert after is not None and after[0] == before[0] and after[1] <= before[1] + 2, (before, after)
        assert again.commands.run("pgrep -f '[h]old.py' || true").stdout.strip() == ""


def test_the_sandbox_timeout_ends_it():
    sb = Sandbox.create(timeout=2)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if sb.sandbox_id not in {s.sandbox_id for s in Sandbox.list().next_items()}:
            break
        time.sleep(0.5)
    else:
        sb.kill()
        pytest.fail("the sandbox outlived its timeout")
    assert sb.kill() is False


def test_a_killed_sandbox_is_gone_and_bad_keys_and_ids_are_refused():
    sb = Sandbox.create(timeout=60)
    assert sb.kill() is True
    assert Sandbox.kill(sb.sandbox_id) is False
    with pytest.raises(NotFoundException):
        Sandbox.connect("tnosuchsandbox")
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "0" * 40)
    r = httpx.get(API_URL + "/v2/sandboxes")
    assert r.status_code == 401 and "API key" in r.json()["message"]


def access_token(sandbox_id):
    r = httpx.get(f"{API_URL}/sandboxes/{sandbox_id}", headers={"X-API-Key": os.environ["E2B_API_KEY"]})
    assert r.status_code == 200, r.text
    return r.json()["envdAccessToken"]


def test_another_sandboxs_access_token_is_refused(sandbox):
    other = Sandbox.create(timeout=60)
    try:
        headers = {
            "E2b-Sandbox-Id": sandbox.sandbox_id,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": access_token(other.sandbox_id),
            "Content-Type": "application/json",
            "Connect-Protocol-Version": "1",
        }
        r = httpx.post(os.environ["E2B_SANDBOX_URL"] + "/process.Process/List", headers=headers, content=b"{}")
        assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
        headers["X-Access-Token"] = access_token(sandbox.sandbox_id)
        assert httpx.post(os.environ["E2B_SANDBOX_URL"] + "/process.Process/List", headers=headers, content=b"{}").status_code == 200
    finally:
        other.kill()


def test_fork_copies_the_sandbox(sandbox):
    sandbox.files.write("/workspace/before-fork.txt", "shared")
    children = sandbox.fork(count=1)
    assert len(children) == 1 and not isinstance(children[0], Exception), children
    child = children[0]
    try:
        assert child.sandbox_id != sandbox.sandbox_id
        assert child.files.read("/workspace/before-fork.txt") == "shared"
    finally:
        child.kill()


def test_get_host_reaches_a_server_in_the_sandbox(sandbox):
    sandbox.files.write("/workspace/www/index.html", "served from the sandbox")
    sandbox.commands.run("cd /workspace/www && python3 -m http.server 8000", background=True)
    host = sandbox.get_host(8000)
    assert host.startswith(f"8000-{sandbox.sandbox_id}.")
    headers = {"Host": host, "e2b-traffic-access-token": sandbox.traffic_access_token}
    deadline = time.monotonic() + 10
    while True:
        r = httpx.get(API_URL + "/index.html", headers=headers)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.text == "served from the sandbox"
    assert httpx.get(API_URL + "/index.html", headers={"Host": host}).status_code == 401


# The same echo server tests/ports.rs runs.
WS_ECHO = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ws_echo.py")).read()


def test_a_websocket_in_the_sandbox_echoes_through_get_host(sandbox):
    import base64
    import socket
    from urllib.parse import urlparse

    sandbox.files.write("/workspace/ws.py", WS_ECHO)
    sandbox.commands.run("python3 /workspace/ws.py", background=True)
    host = sandbox.get_host(8765)
    api = urlparse(API_URL)
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET / HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"E2b-Traffic-Access-Token: {sandbox.traffic_access_token}\r\n\r\n"
    ).encode()
    deadline = time.monotonic() + 10
    while True:
        conn = socket.create_connection((api.hostname, api.port), timeout=10)
        conn.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = conn.recv(1024)
            if not chunk:
                break
            answer += chunk
        if answer.startswith(b"HTTP/1.1 101") or time.monotonic() > deadline:
            break
        conn.close()
        time.sleep(0.2)
    assert answer.startswith(b"HTTP/1.1 101"), answer
    payload, mask = b"over the daemon", os.urandom(4)
    conn.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    frame = answer.split(b"\r\n\r\n", 1)[1]
    while len(frame) < 2 or len(frame) < 2 + frame[1]:
        frame += conn.recv(1024)
    assert frame[0] == 0x81 and frame[2 : 2 + frame[1]] == b"echo: over the daemon", frame
    conn.close()


def test_a_pty_takes_input_resizes_and_is_killed(sandbox):
    import threading

    from e2b import PtySize
    from e2b.exceptions import InvalidArgumentException

    h = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=60)
    out = []
    done = {}
    waiter = threading.Thread(target=lambda: done.setdefault("r", h.wait(on_pty=out.append)), daemon=True)
    waiter.start()

    def seen(text):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if text in b"".join(out).decode(errors="replace"):
                return True
            time.sleep(0.05)
        return False

    sandbox.pty.send_stdin(h.pid, b"stty size; echo marker-$((6*7))\n")
    assert seen("marker-42") and seen("24 80"), b"".join(out)
    sandbox.pty.resize(h.pid, PtySize(rows=40, cols=100))
    sandbox.pty.send_stdin(h.pid, b"stty size; echo second-$((6*8))\n")
    assert seen("second-48") and seen("40 100"), b"".join(out)
    with pytest.raises(InvalidArgumentException):
        sandbox.pty.resize(h.pid, PtySize(rows=0, cols=0))
    assert sandbox.pty.kill(h.pid) is True
    waiter.join(15)
    assert not waiter.is_alive(), "the terminal's stream ended with its kill"
    assert h.pid not in {p.pid for p in sandbox.commands.list()}


def test_a_sandbox_killed_during_a_run_ends_the_stream_with_an_error():
    import threading

    sb = Sandbox.create(timeout=60)
    result = {}

    def run():
        try:
            sb.commands.run("sleep 30", timeout=60)
            result["r"] = "returned"
        except Exception as e:  # noqa: BLE001 - whichever the SDK raises
            result["r"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    time.sleep(1)
    assert Sandbox.kill(sb.sandbox_id) is True
    th.join(20)
    assert not th.is_alive(), "the run still waits after its sandbox was killed"
    assert isinstance(result["r"], Exception), result


def test_malformed_connect_requests_are_refused_in_the_protocols_shape(sandbox):
    base = os.environ["E2B_SANDBOX_URL"]
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "X-Access-Token": access_token(sandbox.sandbox_id),
        "Connect-Protocol-Version": "1",
    }
    # A unary call with broken JSON: Connect's error body.
    r = httpx.post(base + "/process.Process/List", headers={**headers, "Content-Type": "application/json"}, content=b"{not json")
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text
    # Broken protobuf, in a unary call and in a stream: Connect's error, in JSON.
    r = httpx.post(base + "/filesystem.Filesystem/Stat", headers={**headers, "Content-Type": "application/proto"}, content=b"\x0a\x64/")
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument" and "malformed protobuf" in r.json()["message"], r.text
    r = httpx.post(base + "/process.Process/Start", headers={**headers, "Content-Type": "application/connect+proto"}, content=b"\x00\x00\x00\x00\x01\x0f")
    assert r.status_code == 200 and r.content[0] == 2 and b"malformed protobuf" in r.content, r.content
    # A codec that is neither, refused by name.
    r = httpx.post(base + "/filesystem.Filesystem/Stat", headers={**headers, "Content-Type": "text/plain"}, content=b"/")
    assert r.status_code == 415 and "text/plain" in r.json()["message"], r.text
    # A stream whose envelope is cut short, or compressed: the end frame says why.
    stream_headers = {**headers, "Content-Type": "application/connect+json"}
    for body, why in [(b"\x00\x00\x00\x00\x09{", "truncated"), (b"\x01\x00\x00\x00\x02{}", "compressed"), (b"\x00\x00\x00\x00\x0d{\"process\":5}", "malformed")]:
        r = httpx.post(base + "/process.Process/Start", headers=stream_headers, content=body)
        assert r.status_code == 200 and r.headers["content-type"] == "application/connect+json", r.text
        assert r.content[0] == 2 and b"invalid_argument" in r.content and why.encode() in r.content, (why, r.content)
    # A client that drops a stream halfway leaves the daemon serving.
    start = b'{"process":{"cmd":"/bin/sh","args":["-c","sleep 2; echo late"]},"stdin":false}'
    frame = b"\x00" + len(start).to_bytes(4, "big") + start
    with httpx.stream("POST", base + "/process.Process/Start", headers=stream_headers, content=frame) as s:
        next(s.iter_raw())
    assert sandbox.commands.run("echo still").stdout == "still\n"
    # An unknown route of the sandbox API, and an unknown sandbox.
    r = httpx.post(base + "/process.Process/Nope", headers={**headers, "Content-Type": "application/json"}, content=b"{}")
    assert r.status_code == 404
    r = httpx.post(base + "/process.Process/List", headers={**headers, "E2b-Sandbox-Id": "tnosuchsandbx", "Content-Type": "application/json"}, content=b"{}")
    assert r.status_code == 401, "a token that is not this sandbox's is refused before anything is looked up"


def test_e2b_generated_clients_speak_the_binary_codec(sandbox):
    """E2B's own generated Connect clients with connectrpc's default codec
    (protobuf): a server stream, a client stream and unary calls."""
    from connectrpc.code import Code
    from connectrpc.errors import ConnectError
    from protobuf import Oneof
    from e2b.envd.filesystem import filesystem_connect, filesystem_pb
    from e2b.envd.process import process_connect, process_pb
    from e2b.sandbox.commands.stream_input import stream_input_data, stream_input_start

    base = os.environ["E2B_SANDBOX_URL"]
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": access_token(sandbox.sandbox_id)}
    plain = {"send_compression": None, "accept_compression": ()}
    with process_connect.ProcessClientSync(base, **plain) as proc:
        run = process_pb.StartRequest(process=process_pb.ProcessConfig(cmd="/bin/sh", args=["-c", "printf 'bin\\377'; exit 3"]))
        events = [e.event.event for e in proc.start(run, headers=headers)]
        assert b"".join(e.value.output.value for e in events if e.field == "data") == b"bin\xff", events
        ends = [e.value for e in events if e.field == "end"]
        assert len(ends) == 1 and ends[0].exit_code == 3 and ends[0].exited, ends
        # A background cat fed through a client stream of protobuf messages.
        cat = proc.start(process_pb.StartRequest(process=process_pb.ProcessConfig(cmd="/bin/cat"), stdin=True), headers=headers)
        first = next(cat).event.event
        assert first.field == "start", first
        pid = first.value.pid
        proc.stream_input(iter([stream_input_start(pid), stream_input_data("stdin", b"fed \x00\xfe\n")]), headers=headers)
        proc.close_stdin(process_pb.CloseStdinRequest(process=process_pb.ProcessSelector(selector=Oneof("pid", pid))), headers=headers)
        rest = [e.event.event for e in cat]
        assert b"".join(e.value.output.value for e in rest if e.field == "data") == b"fed \x00\xfe\n", rest
        assert [e.value.exit_code for e in rest if e.field == "end"] == [0], rest
    with filesystem_connect.FilesystemClientSync(base, **plain) as fs:
        made = fs.make_dir(filesystem_pb.MakeDirRequest(path="/workspace/binary-codec"), headers=headers).entry
        assert made.type == filesystem_pb.FileType.DIRECTORY and made.path == "/workspace/binary-codec", made
        listed = fs.list_dir(filesystem_pb.ListDirRequest(path="/workspace", depth=1), headers=headers).entries
        assert "binary-codec" in [e.name for e in listed], listed
        # An error still arrives as Connect's error (JSON in either codec).
        with pytest.raises(ConnectError) as missing:
            fs.stat(filesystem_pb.StatRequest(path="/workspace/nope"), headers=headers)
        assert missing.value.code == Code.NOT_FOUND and "no such file" in str(missing.value), repr(missing.value)


def test_watch_dir_collects_changes_until_stopped_and_refuses_what_is_no_directory(sandbox):
    from e2b.sandbox.filesystem.watch_handle import FilesystemEventType as T

    sandbox.files.make_dir("/workspace/watched/sub")
    handle = sandbox.files.watch_dir("/workspace/watched", recursive=True, include_entry=True)
    sandbox.files.write("/workspace/watched/a.bin", b"\x00\xff")
    sandbox.commands.run("echo y > /workspace/watched/sub/b.txt; chmod 600 /workspace/watched/sub/b.txt; rm /workspace/watched/a.bin")
    want = {("a.bin", T.CREATE), ("a.bin", T.WRITE), ("sub/b.txt", T.CREATE), ("sub/b.txt", T.CHMOD), ("a.bin", T.REMOVE)}
    seen = []
    deadline = time.monotonic() + 15
    while not want <= {(e.name, e.type) for e in seen} and time.monotonic() < deadline:
        seen += handle.get_new_events()
        time.sleep(0.1)
    assert want <= {(e.name, e.type) for e in seen}, seen
    # With include_entry, an entry that still exists comes with its details.
    chmod = next(e for e in seen if e.type == T.CHMOD)
    assert chmod.entry is not None and chmod.entry.path == "/workspace/watched/sub/b.txt" and chmod.entry.mode & 0o777 == 0o600, chmod
    handle.stop()
    with pytest.raises(Exception):
        handle.get_new_events()
    # A file, a missing directory and a link the sandbox planted are refused.
    sandbox.commands.run("echo f > /workspace/plain.txt; ln -sfn /etc /workspace/planted")
    for path, why in [("/workspace/plain.txt", "not a directory"), ("/workspace/missing", "no such directory"), ("/workspace/planted", "symbolic link")]:
        with pytest.raises(Exception) as refused:
            sandbox.files.watch_dir(path)
        assert why in str(refused.value), (path, refused.value)
    assert sandbox.commands.run("echo alive").stdout == "alive\n"


def test_a_snapshot_makes_new_sandboxes_with_its_files_and_is_listed_and_deleted(sandbox):
    sandbox.files.write("/workspace/snap.txt", "in the snapshot")
    info = sandbox.create_snapshot()
    assert info.snapshot_id and info.names == [info.snapshot_id], info
    # The source runs on.
    assert sandbox.commands.run("echo still").stdout == "still\n"
    sandbox.files.write("/workspace/snap.txt", "changed after")
    child = Sandbox.create(info.snapshot_id, timeout=120)
    try:
        assert child.files.read("/workspace/snap.txt") == "in the snapshot"
        listed = [s.snapshot_id for s in sandbox.list_snapshots().next_items()]
        assert listed == [info.snapshot_id], listed
        assert info.snapshot_id in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
        # In use by a sandbox: not deleted.
        with pytest.raises(Exception) as used:
            Sandbox.delete_snapshot(info.snapshot_id)
        assert "used by" in str(used.value), used.value
    finally:
        child.kill()
    assert Sandbox.delete_snapshot(info.snapshot_id) is True
    assert Sandbox.delete_snapshot(info.snapshot_id) is False
    assert sandbox.list_snapshots().next_items() == []
    named = sandbox.create_snapshot(name="suite-named-snapshot")
    assert named.snapshot_id == "suite-named-snapshot"
    with pytest.raises(Exception) as taken:
        sandbox.create_snapshot(name="suite-named-snapshot")
    assert "already exists" in str(taken.value), taken.value
    assert Sandbox.delete_snapshot("suite-named-snapshot") is True


def test_a_sandbox_killed_during_a_run_ends_the_stream_with_the_sdks_error():
    import threading

    sb = Sandbox.create(timeout=120)
    outcome = {}

    def run():
        try:
            outcome["result"] = sb.commands.run("echo started; sleep 60")
        except Exception as e:
            outcome["error"] = e

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    deadline = time.monotonic() + 20
    while "sleep 60" not in sb.commands.run("ps -eo args || true").stdout and time.monotonic() < deadline:
        time.sleep(0.1)
    killed_at = time.monotonic()
    assert Sandbox.kill(sb.sandbox_id) is True
    runner.join(30)
    assert not runner.is_alive(), "the run did not end when its sandbox was killed"
    assert time.monotonic() - killed_at < 30
    error = outcome.get("error")
    assert error is not None, f"the run ended without an error: {outcome}"
    assert type(error).__module__.startswith("e2b"), repr(error)


def test_sigterm_reaches_a_command_that_may_handle_it(sandbox):
    h = sandbox.commands.run("trap 'echo got-term; exit 7' TERM; touch /workspace/trapping; while true; do sleep 0.1; done", background=True)
    deadline = time.monotonic() + 20
    while not sandbox.files.exists("/workspace/trapping") and time.monotonic() < deadline:
        time.sleep(0.1)
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": access_token(sandbox.sandbox_id), "Content-Type": "application/json"}
    r = httpx.post(os.environ["E2B_SANDBOX_URL"] + "/process.Process/SendSignal", headers=headers, json={"process": {"pid": h.pid}, "signal": "SIGNAL_SIGTERM"})
    assert r.status_code == 200, r.text
    with pytest.raises(CommandExitException) as ended:
        h.wait()
    assert ended.value.exit_code == 7 and "got-term" in ended.value.stdout, ended.value
    # An unknown signal is refused in the protocol's shape.
    r = httpx.post(os.environ["E2B_SANDBOX_URL"] + "/process.Process/SendSignal", headers=headers, json={"process": {"pid": h.pid}, "signal": "SIGNAL_SIGSTOP"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text


def test_what_is_not_served_answers_501_with_its_name():
    before = {s.sandbox_id for s in Sandbox.list().next_items()}
    with pytest.raises(Exception) as mcp:
        Sandbox.create(mcp={"exa": {"apiKey": "x"}})
    assert "MCP gateway" in str(mcp.value) and "501" in repr(mcp.value) + str(getattr(mcp.value, "status_code", "")), repr(mcp.value)
    key = {"X-API-Key": os.environ["E2B_API_KEY"]}
    for method, path, what in [("POST", "/templates", "Dockerfile"), ("GET", "/volumes", "volumes"), ("GET", "/teams", "teams")]:
        r = httpx.request(method, API_URL + path, headers=key, json={})
        assert r.status_code == 501 and what in r.json()["message"], (path, r.status_code, r.text)
    assert {s.sandbox_id for s in Sandbox.list().next_items()} <= before, "a refused create made a sandbox"


def test_with_on_timeout_pause_the_sandbox_is_paused_at_its_timeout_and_connects_again():
    sb = Sandbox.create(timeout=2, lifecycle={"on_timeout": "pause"})
    try:
        sb.files.write("/workspace/kept.txt", "kept through the timeout")
        deadline = time.monotonic() + 30
        while Sandbox.get_info(sb.sandbox_id).state.value != "paused":
            assert time.monotonic() < deadline, "not paused at its timeout"
            time.sleep(0.5)
        again = Sandbox.connect(sb.sandbox_id, timeout=120)
        assert again.files.read("/workspace/kept.txt") == "kept through the timeout"
    finally:
        Sandbox.kill(sb.sandbox_id)


def test_several_files_upload_at_once(sandbox):
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    written = sandbox.files.write_files([WriteEntry(path="/workspace/multi/a.txt", data="A"), WriteEntry(path="/workspace/multi/b.bin", data=b"\x00\xffB")])
    assert sorted(w.path for w in written) == ["/workspace/multi/a.txt", "/workspace/multi/b.bin"]
    assert sandbox.files.read("/workspace/multi/b.bin", format="bytes") == b"\x00\xffB"
    assert sandbox.files.read("/workspace/multi/a.txt") == "A"


def test_stream_input_feeds_a_command_over_a_chunked_request(sandbox):
    import base64
    import json

    cat = sandbox.commands.run("cat", background=True, stdin=True)
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "X-Access-Token": access_token(sandbox.sandbox_id),
        "Connect-Protocol-Version": "1",
        "Content-Type": "application/connect+json",
    }

    def frame(message):
        body = json.dumps(message).encode()
        return b"\x00" + len(body).to_bytes(4, "big") + body

    def chunks():
        yield frame({"start": {"process": {"pid": cat.pid}}})
        for part in (b"streamed ", b"in parts"):
            yield frame({"data": {"input": {"stdin": base64.b64encode(part).decode()}}})

    r = httpx.post(os.environ["E2B_SANDBOX_URL"] + "/process.Process/StreamInput", headers=headers, content=chunks())
    assert r.status_code == 200 and r.content.endswith(b"{}"), r.content
    sandbox.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "streamed in parts"


def test_a_client_stream_over_h2c_feeds_a_command_while_it_is_open(sandbox):
    """HTTP/2 without TLS (prior knowledge), as Connect's client streams
    need it: the first input reaches the command before the stream ends."""
    import base64
    import json
    import threading

    writer = sandbox.commands.run("cat > /workspace/h2c.txt", background=True, stdin=True)
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "X-Access-Token": access_token(sandbox.sandbox_id),
        "Connect-Protocol-Version": "1",
        "Content-Type": "application/connect+json",
    }
    first_arrived = threading.Event()

    def frame(message):
        body = json.dumps(message).encode()
        return b"\x00" + len(body).to_bytes(4, "big") + body

    def chunks():
        yield frame({"start": {"process": {"pid": writer.pid}}})
        yield frame({"data": {"input": {"stdin": base64.b64encode(b"one\n").decode()}}})
        assert first_arrived.wait(30), "the first input never reached the command"
        yield frame({"data": {"input": {"stdin": base64.b64encode(b"two\n").decode()}}})

    answer = {}

    def send():
        with httpx.Client(http1=False, http2=True, timeout=60) as client:
            answer["r"] = client.post(os.environ["E2B_SANDBOX_URL"] + "/process.Process/StreamInput", headers=headers, content=chunks())

    sender = threading.Thread(target=send)
    sender.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if sandbox.commands.run("cat /workspace/h2c.txt").stdout == "one\n":
            first_arrived.set()
            break
        time.sleep(0.1)
    sender.join(60)
    assert first_arrived.is_set(), "the first input did not arrive while the stream was open"
    r = answer["r"]
    assert r.http_version == "HTTP/2" and r.status_code == 200 and r.content.endswith(b"{}"), (r.http_version, r.content)
    sandbox.commands.close_stdin(writer.pid)
    assert writer.wait().exit_code == 0
    assert sandbox.files.read("/workspace/h2c.txt") == "one\ntwo\n"
