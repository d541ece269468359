"""The blocking client against a real daemon and real sandboxes."""

from __future__ import annotations

import datetime
import json
import os
import threading
import time

import httpx
import pytest

import cairn


def test_tasks_are_created_found_and_listed(client, make_task):
    t = make_task(name=f"sdk-{time.time_ns()}", memory="256M", env={"GREETING": "hello"})
    assert t.state == "running" and t.id.startswith("t")
    assert client.tasks.get(t.id).id == t.id
    assert client.tasks.get(t.info.name).id == t.id, "found by name too"
    assert t.id in [x.id for x in client.tasks.list()]
    assert t.exec("echo $GREETING").stdout == "hello\n"
    assert t.info.raw["limits"]["memory"] == "256M"


def test_commands_answer_exit_code_output_and_limits(task):
    r = task.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.exit_code, r.stdout, r.stderr, r.ok) == (3, "out\n", "err\n", False)
    assert task.exec("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert task.exec(["cat"], stdin="piped in").stdout == "piped in"
    assert task.exec("echo $X", env={"X": "from env"}).stdout == "from env\n"
    slow = task.exec("sleep 30", timeout=0.5)
    assert slow.timed_out and not slow.ok and slow.signal is not None
    assert task.exec("true").ok, "positive control after a timeout"


def test_streamed_output_reaches_the_callbacks_as_it_comes(task):
    seen: list[tuple[str, float]] = []
    began = time.monotonic()
    r = task.exec(
        "for i in 1 2 3; do echo line $i; sleep 0.3; done; echo done >&2",
        on_stdout=lambda s: seen.append((s, time.monotonic() - began)),
        on_stderr=lambda s: seen.append(("ERR " + s, time.monotonic() - began)),
    )
    assert r.exit_code == 0
    assert r.stdout == "line 1\nline 2\nline 3\n" and r.stderr == "done\n"
    assert "".join(s for s, _ in seen if not s.startswith("ERR ")) == r.stdout
    # The first line came before the command ended, not all at its end.
    assert seen[0][1] < seen[-1][1] - 0.4, seen


def test_files_are_written_read_and_listed(task):
    blob = bytes(range(256)) * 1000
    task.files.write("/workspace/data.bin", blob)
    task.files.write("/workspace/note.txt", "text is written as UTF-8 ✓")
    assert task.files.read("/workspace/data.bin") == blob
    assert task.files.read("/workspace/note.txt").decode() == "text is written as UTF-8 ✓"
    task.exec("mkdir /workspace/sub && ln -s /etc/hostname /workspace/link")
    entries = {e.name: e for e in task.files.list("/workspace")}
    assert entries["data.bin"].kind == "file" and entries["data.bin"].size == len(blob)
    assert entries["sub"].kind == "dir"
    assert (entries["link"].kind, entries["link"].target) == ("symlink", "/etc/hostname")
    with pytest.raises(cairn.NotFound) as e:
        task.files.read("/workspace/missing")
    assert e.value.code == "not_found" and e.value.status == 404
    with pytest.raises(cairn.InvalidRequest, match="symlink"):
        task.files.read("/workspace/link")


def test_a_name_that_is_not_utf8_is_listed_losslessly_and_read_back(task):
    # Latin-1 "café" and a name with a space, both made inside the sandbox.
    task.exec("mkdir -p /workspace/n && printf latin1 > \"$(printf '/workspace/n/caf\\351')\" && printf plain > '/workspace/n/a b'")
    entries = {e.name: e for e in task.files.list("/workspace/n")}
    latin1 = os.fsdecode(b"caf\xe9")
    assert set(entries) == {latin1, "a b"}, entries
    assert task.files.read(f"/workspace/n/{latin1}") == b"latin1"
    assert task.files.read(b"/workspace/n/caf\xe9") == b"latin1"
    assert task.files.read("/workspace/n/a b") == b"plain"
    task.files.write(f"/workspace/n/{latin1}.copy", b"again")
    assert task.exec("cat /workspace/n/caf$(printf '\\351').copy").stdout == "again"
    # Never the replacement character: that name does not exist.
    with pytest.raises(cairn.NotFound):
        task.files.read("/workspace/n/caf\ufffd")


def test_a_rollback_undoes_the_work_and_hands_the_reason_back(task):
    task.files.write("/workspace/app.py", "good = True\n")
    good = task.snapshot(kind="milestone", note="app works")
    assert good.id.startswith("s") and good.kind == "milestone"
    task.files.write("/workspace/app.py", "good = False  # broken\n")
    note = task.rollback(to=good.id, reason="the edit broke the tests")
    assert (note.to, note.reason) == (good.id, "the edit broke the tests")
    assert task.files.read("/workspace/app.py") == b"good = True\n"
    note = task.refresh().info.rollback_note
    assert note.reason == "the edit broke the tests", "the agent reads the note on its task"
    assert note.chosen == "--to: named by the caller", note.chosen
    task.files.write("/workspace/app.py", "again broken\n")
    assert task.rollback(last_healthy=True, reason="broken again").to == good.id
    assert task.files.read("/workspace/app.py") == b"good = True\n"
    with pytest.raises(cairn.InvalidRequest, match="reason"):
        task.rollback(to=good.id, reason=" ")
    with pytest.raises(cairn.NotFound):
        task.rollback(to="s000000000", reason="no such snapshot")
    assert [s.id for s in task.snapshots()][:1] == [good.id]


def test_forks_start_from_a_snapshot(task, make_task, client):
    task.files.write("/workspace/base.txt", "shared start")
    snap = task.snapshot(kind="milestone", note="before choosing")
    kids = task.fork(from_=snap.id, count=2)
    try:
        assert len(kids) == 2 and len({k.id for k in kids}) == 2
        for k in kids:
            assert k.files.read("/workspace/base.txt") == b"shared start"
        kids[0].files.write("/workspace/base.txt", "changed in one fork")
        assert kids[1].files.read("/workspace/base.txt") == b"shared start", "forks are apart"
    finally:
        for k in kids:
            k.destroy()


def test_an_approval_wait_suspends_the_task_and_answers_the_event_once_woken(task, daemon):
    task.files.write("/workspace/kept.txt", "kept across the wait")
    seen: list[cairn.Wait] = []

    def approve_later(w: cairn.Wait) -> None:
        seen.append(w)

        def go() -> None:
            with cairn.Client(*daemon) as other:
                for _ in range(100):
                    if other.tasks.get(task.id).state == "suspended":
                        break
                    time.sleep(0.05)
                other.tasks.get(task.id).approve(comment="ship it")

        threading.Thread(target=go, daemon=True).start()

    event = task.wait_for_approval("Deploy to staging?", timeout=60, on_wait=approve_later)
    assert seen and seen[0].approval_url and seen[0].kind == "approval"
    assert event.source == "approval" and event.data["decision"] == "approve" and event.data["comment"] == "ship it"
    assert task.refresh().state == "running"
    assert task.files.read("/workspace/kept.txt") == b"kept across the wait"


def test_a_wait_gives_up_after_its_timeout_and_the_task_stays_suspended(task):
    with pytest.raises(cairn.WaitTimeout, match="still pending"):
        task.wait_for_approval("Nobody answers", timeout=0.5)
    assert task.refresh().state == "suspended"
    task.approve(approve=False, comment="no")
    assert task.wait_for_timer(0.1, timeout=30).source in ("approval", "timer")


def test_a_pending_wait_can_be_cancelled_and_a_blocked_caller_hears_of_it(task, daemon):
    def cancel_later(w: cairn.Wait) -> None:
        def go() -> None:
            with cairn.Client(*daemon) as other:
                for _ in range(100):
                    if other.tasks.get(task.id).state == "suspended":
                        break
                    time.sleep(0.05)
                other.tasks.get(task.id).cancel_wait()

        threading.Thread(target=go, daemon=True).start()

    with pytest.raises(cairn.CairnError, match="cancelled"):
        task.wait_for_approval("Never answered", timeout=60, on_wait=cancel_later)
    assert task.refresh().state == "running", "a task suspended only to wait wakes when the wait is cancelled"
    with pytest.raises(cairn.NotFound):
        task.cancel_wait()
    assert task.exec("true").ok


def test_timer_and_webhook_waits_wake_the_task(task):
    assert task.wait_for_timer(0.5, timeout=30).source == "timer"
    assert task.refresh().state == "running"
    secret = task.info.raw["webhook_secret"]
    from standardwebhooks import Webhook

    def send(w: cairn.Wait) -> None:
        body = json.dumps({"build": "green"})
        now = datetime.datetime.now(tz=datetime.timezone.utc)
        msg = f"msg_{time.time_ns()}"
        sig = Webhook(secret).sign(msg, now, body)
        headers = {"webhook-id": msg, "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": sig, "content-type": "application/json"}
        threading.Thread(target=lambda: httpx.post(w.webhook_url, content=body, headers=headers), daemon=True).start()

    event = task.wait_for_webhook("ci", timeout=60, on_wait=send)
    assert (event.source, event.name, event.data) == ("webhook", "ci", {"build": "green"})


def test_suspend_and_resume_keep_the_files(task):
    task.files.write("/workspace/s.txt", "still here")
    assert task.suspend().state == "suspended"
    assert task.refresh().state == "suspended"
    with pytest.raises(cairn.Conflict):
        task.suspend()
    assert task.resume().state == "running"
    assert task.files.read("/workspace/s.txt") == b"still here"


def test_egress_rules_are_added(task):
    assert "docs.example.org" in task.allow("docs.example.org").allow
    assert "evil.example.com" in task.deny("evil.example.com").deny
    with pytest.raises(cairn.InvalidRequest):
        task.allow("not a rule !")


def test_a_delivery_is_written_out_and_verifies_until_tampered_with(task, tmp_path):
    task.files.write("/workspace/report.md", "# Report\nall green\n")
    task.files.write("/workspace/out.txt", "result 42\n")
    out = tmp_path / "delivery"
    d = task.deliver(["/workspace/out.txt"], report="/workspace/report.md", out=out)
    assert d.record_path == str(out / "record.json")
    names = {x.name for x in d.deliverables}
    assert "out.txt" in names and (out / "out.txt").read_text() == "result 42\n"
    assert cairn.verify(d.record_path)
    task_id, key = cairn.verify_or_raise(d.record_path)
    assert task_id == task.id and len(key) == 32
    (out / "out.txt").write_text("result 43\n")
    assert not cairn.verify(d.record_path)
    with pytest.raises(cairn.VerifyError, match="deliverable out.txt does not match"):
        cairn.verify_or_raise(d.record_path)
    with pytest.raises(cairn.InvalidRequest, match="not empty"):
        task.deliver(["/workspace/out.txt"], out=out)


def test_errors_carry_the_api_code(client, daemon):
    with pytest.raises(cairn.NotFound) as e:
        client.tasks.get("t0000000000x")
    assert e.value.code == "not_found" and "t0000000000x" in e.value.message
    with pytest.raises(cairn.InvalidRequest) as e:
        client.tasks.create(memory="lots")
    assert e.value.code == "invalid" and "\n" not in e.value.message
    with cairn.Client(daemon[0], "wrong-token") as bad:
        with pytest.raises(cairn.Unauthorized):
            bad.tasks.list()
    with cairn.Client("http://127.0.0.1:9", "x") as gone:
        with pytest.raises(cairn.DaemonUnreachable, match="cannot reach the daemon"):
            gone.tasks.list()
    assert isinstance(client.tasks.list(), list), "positive control"


def test_background_commands_have_handles_that_outlive_the_request(task):
    sleeper = task.start("echo begun; sleep 60", tag="sleeper")
    assert sleeper.info.running and sleeper.info.tag == "sleeper"
    cat = task.start(["cat"], stdin=True)
    assert {sleeper.id, cat.id} <= {p.id for p in task.processes() if p.running}
    cat.write_stdin("fed ")
    cat.write_stdin("through stdin", close=True)
    done = cat.wait(timeout=30)
    assert (done.running, done.exit_code, done.stdout) == (False, 0, "fed through stdin")
    deadline = time.monotonic() + 10
    while "begun" not in sleeper.output().stdout and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleeper.info.stdout == "begun\n" and sleeper.info.running, "output so far, while it runs"
    killed = sleeper.kill()
    assert not killed.running and killed.signal == 9 and killed.exit_code is None
    assert task.process(sleeper.id).info.signal == 9, "an ended command stays to be asked about"
    failing = task.start("echo partial; exit 4")
    assert failing.wait(timeout=30).exit_code == 4
    with pytest.raises(cairn.NotFound):
        task.process(999999)


def test_a_background_terminal_is_resized_and_its_timeout_ends_it(task):
    term = task.start(["sh"], pty=(24, 80), stdin=True)
    term.write_stdin("stty size\n")
    deadline = time.monotonic() + 10
    while "24 80" not in term.output().stdout and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "24 80" in term.info.stdout
    term.resize(40, 120)
    term.write_stdin("stty size; exit\n")
    assert "40 120" in term.wait(timeout=30).stdout
    with pytest.raises(cairn.InvalidRequest):
        task.start(["sleep", "30"]).resize(10, 10)
    slow = task.start(["sleep", "30"], timeout=1)
    assert slow.wait(timeout=30).timed_out


def test_a_port_has_a_signed_url(task):
    task.exec("mkdir -p /workspace/www && echo page > /workspace/www/index.html")
    server = task.start("cd /workspace/www && exec python3 -m http.server 8000")
    url = task.url(8000, ttl="10m")
    assert f"/v1/tasks/{task.id}/ports/8000/" in url and "sig=" in url
    deadline = time.monotonic() + 10
    while True:
        r = httpx.get(url)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.text == "page\n"
    server.kill()


def test_secrets_are_set_listed_never_read_back_and_removed(client):
    name = "SDK_SUITE_TOKEN"
    made = client.secrets.set(name, "sdk-secret-value-1")
    assert made.name == name and made.uses == 0 and made.last_used_ms is None
    again = client.secrets.set(name, b"sdk-secret-value-2")
    assert again.created_ms == made.created_ms and again.updated_ms >= made.updated_ms
    listed = [s for s in client.secrets.list() if s.name == name]
    assert listed == [again]
    assert "sdk-secret-value" not in repr(client.secrets.list())
    with pytest.raises(cairn.InvalidRequest):
        client.secrets.set("1-bad name", "x")
    with pytest.raises(cairn.InvalidRequest):
        client.secrets.set("EMPTY", b"")
    client.secrets.remove(name)
    assert name not in [s.name for s in client.secrets.list()]
    with pytest.raises(cairn.NotFound):
        client.secrets.remove(name)
