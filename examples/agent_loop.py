#!/usr/bin/env python3
"""A reference agent loop on the Cairn SDK, with any OpenAI-compatible chat
endpoint (not run in CI: it needs a model).

    export OPENAI_BASE_URL=https://llm.example.com/v1  OPENAI_API_KEY=...  AGENT_MODEL=...
    python3 examples/agent_loop.py "Add a --version flag to the CLI in /workspace/app"

The model works in one Cairn task through tools. What Cairn adds to a plain
loop, and how this loop uses it:
- the task's sandbox is the only place the model's commands run;
- commands matching `risky` patterns get a pre-risk snapshot first, by the
  daemon; the model marks milestones itself when something works;
- when the model rolls back, it gives a reason: the rollback note is put
  back in front of it on every later turn, so it does not repeat the mistake;
- before anything leaves the sandbox it asks a person (`wait_for_approval`
  suspends the task, releasing its compute, until the answer comes);
- the result is delivered with a signed record, which the loop verifies.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import httpx

import cairn

MAX_TURNS = 40
OUTPUT_LIMIT = 8_000

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }
    for name, description, props, required in [
        ("run_command", "Run a shell command in the sandbox; answers exit code, stdout and stderr.", {"command": {"type": "string"}, "cwd": {"type": "string"}}, ["command"]),
        ("read_file", "Read a file of the sandbox.", {"path": {"type": "string"}}, ["path"]),
        ("write_file", "Write a file of the sandbox (its directory must exist).", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
        ("list_files", "List a directory of the sandbox.", {"path": {"type": "string"}}, ["path"]),
        ("milestone", "Mark the current state as a healthy milestone (tests pass, a step is done).", {"note": {"type": "string"}}, ["note"]),
        (
            "rollback",
            "Undo everything since the last healthy milestone (or a given snapshot), with the reason it failed.",
            {"reason": {"type": "string"}, "snapshot": {"type": "string"}},
            ["reason"],
        ),
        ("ask_approval", "Ask a person before delivering; answers their decision and comment.", {"question": {"type": "string"}}, ["question"]),
        (
            "deliver",
            "Deliver the result (files, a patch of all changes, a report) and finish.",
            {"files": {"type": "array", "items": {"type": "string"}}, "report": {"type": "string"}},
            ["files"],
        ),
    ]
]


def clip(text: str) -> str:
    return text if len(text) <= OUTPUT_LIMIT else text[:OUTPUT_LIMIT] + f"\n... ({len(text) - OUTPUT_LIMIT} more characters)"


def call_tool(task: cairn.Task, name: str, args: dict[str, Any]) -> str:
    """Runs one tool call; a failure is an answer the model reads, not a crash."""
    try:
        if name == "run_command":
            r = task.exec(args["command"], cwd=args.get("cwd"), timeout=600)
            return json.dumps({"exit_code": r.exit_code, "stdout": clip(r.stdout), "stderr": clip(r.stderr), "timed_out": r.timed_out})
        if name == "read_file":
            return clip(task.files.read(args["path"]).decode("utf-8", "replace"))
        if name == "write_file":
            task.files.write(args["path"], args["content"])
            return "written"
        if name == "list_files":
            return "\n".join(f"{e.kind:7} {e.size:>9} {e.name}" for e in task.files.list(args["path"]))
        if name == "milestone":
            return f"milestone {task.snapshot(kind='milestone', note=args['note'], healthy=True).id}"
        if name == "rollback":
            note = task.rollback(to=args.get("snapshot"), last_healthy=not args.get("snapshot"), reason=args["reason"])
            return f"rolled back to {note.to}; the note says: {note.reason}"
        if name == "ask_approval":

            def show(w: cairn.Wait) -> None:
                print(f"\n>>> approval needed: {args['question']}\n>>> open {w.approval_url}\n", flush=True)

            event = task.wait_for_approval(args["question"], on_wait=show)
            return json.dumps(event.data)
        if name == "deliver":
            d = task.deliver(args["files"], patch=True, report=args.get("report"), out=os.environ.get("AGENT_OUT", "delivery"))
            verified = cairn.verify(d.record_path) if d.record_path else False
            return f"delivered {', '.join(x.name for x in d.deliverables)}; record {d.record_id}; verified={verified}"
        return f"unknown tool {name}"
    except cairn.CairnError as e:
        return f"error ({e.code}): {e.message}"


def system_prompt(task: cairn.Task) -> str:
    lines = [
        "You are a software agent working in a Linux sandbox through tools.",
        "Mark a milestone whenever something works. When an approach fails, roll back with the reason instead of patching over it.",
        "Ask for approval before delivering. Deliver once, at the end.",
    ]
    note = task.refresh().info.rollback_note
    if note is not None:
        lines.append(f"Your last attempt was rolled back (to {note.to}) because: {note.reason}. Do not repeat it.")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    goal = sys.argv[1]
    base, key, model = os.environ["OPENAI_BASE_URL"].rstrip("/"), os.environ.get("OPENAI_API_KEY", ""), os.environ["AGENT_MODEL"]
    llm = httpx.Client(base_url=base, headers={"authorization": f"Bearer {key}"}, timeout=300)
    with cairn.Client() as c:
        task = c.tasks.create(risky=[r"\brm\s+-rf\b", r"\bgit\s+(push|reset)\b"], allow=os.environ.get("AGENT_ALLOW", "").split())
        print(f"task {task.id}", flush=True)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(task)}, {"role": "user", "content": goal}]
        for _turn in range(MAX_TURNS):
            messages[0]["content"] = system_prompt(task)
            reply = llm.post("/chat/completions", json={"model": model, "messages": messages, "tools": TOOLS}).raise_for_status().json()
            msg = reply["choices"][0]["message"]
            messages.append(msg)
            if msg.get("content"):
                print(msg["content"], flush=True)
            calls = msg.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                name, args = call["function"]["name"], json.loads(call["function"]["arguments"] or "{}")
                print(f"-> {name} {json.dumps(args)[:200]}", flush=True)
                result = call_tool(task, name, args)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
                if name == "deliver" and result.startswith("delivered"):
                    print(result)
                    task.destroy()
                    return 0
        print(f"stopped without a delivery; task {task.id} is kept for inspection")
        return 1


if __name__ == "__main__":
    sys.exit(main())
