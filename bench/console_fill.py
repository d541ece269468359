"""Fills a stopped daemon's SQLite store for bench/console.sh: TASKS tasks
copied from the one task there (its config; states spread over the
terminal and suspended ones, so a restart rebuilds no sandbox) and EVENTS
exec events appended to that task's log.

The copied events carry placeholder hashes: the timeline page does not
walk the chain (its ledger verdict is a page of its own), so the page's
cost is the same as with a real chain; that verdict says the chain does
not verify.

    python3 console_fill.py DB TASKS EVENTS
"""
import json
import random
import sqlite3
import sys

ALPHABET = "23456789abcdefghijkmnpqrstuvwxyz"
db, tasks, events = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
con = sqlite3.connect(db)
(task, config, created), = con.execute("SELECT id, config, created_ms FROM tasks").fetchall()
rng = random.Random(7)
states = ["destroyed", "completed", "failed", "suspended"]
rows = []
for i in range(tasks - 1):
    tid = "t" + "".join(rng.choice(ALPHABET) for _ in range(11))
    ms = created - (i + 1) * 1000
    rows.append((tid, f"bench-{i}", states[i % len(states)], config, ms, ms))
con.executemany(
    "INSERT INTO tasks (id, name, state, config, created_ms, last_activity_ms) VALUES (?, ?, ?, ?, ?, ?)", rows)
(last_seq, last_ms), = con.execute("SELECT MAX(seq), MAX(time_ms) FROM events WHERE task_id = ?", (task,)).fetchall()
args = json.dumps({"argv": ["sh", "-c", "make test"], "workdir": "/workspace", "tty": False, "step": 1})
con.executemany(
    "INSERT INTO events (task_id, seq, time_ms, kind, actor, args, exit_code, duration_ms, prev_hash, hash) "
    "VALUES (?, ?, ?, 'exec', 'bench', ?, 0, 12, ?, ?)",
    ((task, last_seq + n, last_ms + n, args, "0" * 64, "0" * 64) for n in range(1, events + 1)))
con.commit()
print(task)
