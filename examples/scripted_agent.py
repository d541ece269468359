#!/usr/bin/env python3
"""A scripted agent on the Cairn SDK: how an agent should use milestones,
pre-risk snapshots, rollback notes, waits and delivery, on a small real task.

The task: a Python module and its tests in a git repository, inside a
sandbox. The agent
  1. sets up the repository, reproduces the bug with its tests and marks a
     milestone (a state worth coming back to);
  2. takes a pre-risk snapshot, tries a first change, runs the tests: red;
  3. rolls back to the last healthy snapshot with the reason, and reads the
     rollback note back from its task, as a real agent would on its next turn;
  4. makes the right change: green, commits, marks a milestone;
  5. asks for a human approval (the task is suspended while it waits);
  6. delivers the patch, the module and a report with a signed record, and
     verifies the record.

Run it against a daemon (`cairn serve`, or CAIRN_URL/CAIRN_TOKEN):
    python3 examples/scripted_agent.py            # waits for you to approve
    python3 examples/scripted_agent.py --auto-approve --out /tmp/delivery

With --auto-approve a reviewer thread answers the signed approval page as a
person would (it needs no token); without it, open the printed link.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import urllib.parse

import httpx

import cairn

MODULE = '''"""Money amounts in cents."""


def split(total_cents: int, people: int) -> list[int]:
    """Splits a bill: shares differ by at most one cent and add up to the total."""
    raise NotImplementedError
'''

TESTS = '''import unittest

from money import split


class SplitTest(unittest.TestCase):
    def test_even(self):
        self.assertEqual(split(900, 3), [300, 300, 300])

    def test_remainder_goes_to_the_first_shares(self):
        self.assertEqual(split(1000, 3), [334, 333, 333])

    def test_shares_add_up(self):
        for total in range(0, 500, 7):
            for people in range(1, 9):
                self.assertEqual(sum(split(total, people)), total)


if __name__ == "__main__":
    unittest.main()
'''

# The first attempt rounds each share: it loses cents.
FIRST_TRY = '''"""Money amounts in cents."""


def split(total_cents: int, people: int) -> list[int]:
    """Splits a bill: shares differ by at most one cent and add up to the total."""
    return [round(total_cents / people)] * people
'''

RIGHT = '''"""Money amounts in cents."""


def split(total_cents: int, people: int) -> list[int]:
    """Splits a bill: shares differ by at most one cent and add up to the total."""
    share, left = divmod(total_cents, people)
    return [share + 1 if i < left else share for i in range(people)]
'''

REPO = "/workspace/money"


def say(step: str, text: str) -> None:
    print(f"[{step}] {text}", flush=True)


def run_tests(task: cairn.Task) -> cairn.ExecResult:
    return task.exec(["python3", "-m", "unittest", "-q", "test_money"], cwd=REPO, timeout=120)


def reviewer(wait: cairn.Wait) -> None:
    """Answers the signed approval page, as a person clicking Approve."""
    assert wait.approval_url
    url = urllib.parse.urlsplit(wait.approval_url)
    query = dict(urllib.parse.parse_qsl(url.query))
    form = {"exp": query["exp"], "sig": query["sig"], "decision": "approve", "comment": "looks right, ship it"}
    page = httpx.post(urllib.parse.urlunsplit(url._replace(query="")), data=form, timeout=30)
    page.raise_for_status()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--auto-approve", action="store_true", help="approve through the signed page from a reviewer thread")
    ap.add_argument("--out", help="where to write the deliverables and record.json (default: a new temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the task instead of destroying it at the end")
    args = ap.parse_args()

    c = cairn.Client()
    task = c.tasks.create(name=None, memory="512M")
    say("setup", f"task {task.id} is {task.state}")
    try:
        # 1. The repository, green, as a milestone.
        task.exec(["mkdir", "-p", REPO])
        task.files.write(f"{REPO}/money.py", MODULE.replace("    raise NotImplementedError\n", "    return [total_cents // people] * people\n"))
        task.files.write(f"{REPO}/test_money.py", TESTS)
        git = "git -c user.name=agent -c user.email=agent@example.com"
        setup = task.exec(f"cd {REPO} && git init -q && {git} add . && {git} commit -qm 'money: a naive split'")
        assert setup.ok, setup.stderr
        first = run_tests(task)
        say("setup", f"tests: {'green' if first.ok else 'red'}: the naive split loses the remainder, the bug to fix")
        base = task.snapshot(kind="milestone", note="repository set up and committed, the bug reproduced", healthy=True)
        say("milestone", f"snapshot {base.id}: {base.note}")

        # 2. A risky change, after a pre-risk snapshot.
        pre = task.snapshot(kind="pre-risk", note="before rewriting split()")
        say("pre-risk", f"snapshot {pre.id}")
        task.files.write(f"{REPO}/money.py", FIRST_TRY)
        red = run_tests(task)
        failures = [l for l in red.stderr.splitlines() if l.startswith(("FAIL:", "ERROR:"))]
        say("red", f"exit {red.exit_code}: {'; '.join(failures) or red.stderr.strip().splitlines()[-1]}")
        assert not red.ok, "the first try should fail its tests"

        # 3. Roll back to the last healthy snapshot, with the reason.
        reason = f"rounding each share loses cents: {'; '.join(failures)}"
        note = task.rollback(last_healthy=True, reason=reason)
        say("rollback", f"back to {note.to}: {note.reason}")
        seen = task.refresh().info.rollback_note
        assert seen is not None and seen.reason == reason
        say("rollback", f"the task's rollback note, as the agent reads it next turn: {seen.reason!r}")
        assert b"round(" not in task.files.read(f"{REPO}/money.py"), "the rollback undid the first try"

        # 4. The right change: green, committed, a milestone.
        task.files.write(f"{REPO}/money.py", RIGHT)
        green = run_tests(task)
        say("green", f"exit {green.exit_code}: {green.stderr.strip().splitlines()[-1]}")
        assert green.ok, green.stderr
        commit = task.exec(f"cd {REPO} && {git} commit -qam 'money: split() gives the remainder to the first shares' && git log --oneline | head -1")
        assert commit.ok, commit.stderr
        done = task.snapshot(kind="milestone", note="split() correct, tests green", healthy=True)
        say("milestone", f"snapshot {done.id}: committed {commit.stdout.strip()}")

        # 5. A person approves before anything leaves the sandbox.
        def on_wait(w: cairn.Wait) -> None:
            say("approval", f"task suspended, waiting; approve at {w.approval_url}")
            if args.auto_approve:
                threading.Thread(target=reviewer, args=(w,), daemon=True).start()

        event = task.wait_for_approval("Deliver the fix to money.split()?", on_wait=on_wait)
        say("approval", f"{event.data['decision']} by {event.data['by']}: {event.data.get('comment')!r}; task {task.refresh().state}")
        if event.data["decision"] != "approve":
            say("approval", "rejected: nothing delivered")
            return 1

        # 6. Deliver, then check the signed record.
        task.files.write("/workspace/report.md", f"# money.split()\n\nTests green after one rollback.\n\nRolled back because: {reason}\n")
        out = args.out or tempfile.mkdtemp(prefix="cairn-delivery-")
        delivery = task.deliver([f"{REPO}/money.py"], patch=True, report="/workspace/report.md", out=out)
        names = ", ".join(d.name for d in delivery.deliverables)
        say("deliver", f"record {delivery.record_id[:16]}…: {names}, written to {out}")
        ok = cairn.verify(delivery.record_path)
        say("verify", f"record {'verified' if ok else 'DOES NOT VERIFY'}: signature, digests, ledger")
        return 0 if ok else 1
    finally:
        if not args.keep:
            task.destroy()
            say("teardown", f"task {task.id} destroyed")
        c.close()


if __name__ == "__main__":
    sys.exit(main())
