"""Runs the README's tour of the CLI (the shell block under "A tour of the
CLI") line by line, as written, in one bash, against the daemon its first
line starts.

    python3 readme_tour.py README.md WORKDIR

WORKDIR holds what the tour names as the reader's own (./src, data.csv,
summary.txt, token.txt, the image sources); CAIRN_HOME and PATH come from
the caller. Each line must exit 0, unless RULES below says otherwise and
why: a line that names a host the test cannot reach, starts an alternative
daemon, or needs a person at a terminal is not run, and is listed with its
reason. A rule that matches no line fails the run, so the rules cannot go
stale. Prints one line per tour line and a JSON summary last; exits
non-zero naming the first line that did not do as expected.
"""

import json
import os
import re
import shlex
import subprocess
import sys

# (pattern, what): "skip: why", "exit N: why" (the line's expected exit
# code in the tour's context), "before: SHELL" or "after: SHELL" (run
# around the line, standing in for the reader or the outside world).
RULES = [
    (r"^cairn serve &", "after: echo $! > daemon.pid; for i in $(seq 300); do cairn task list >/dev/null 2>&1 && break; sleep 0.1; done"),
    (r"^cairn serve --store postgres://cairn@db\.example", "skip: names an example database host"),
    (r"^cairn serve --node alpha &", "skip: a second daemon on the tour's home (an alternative to its first line)"),
    (r"^cairn exec -it ", "skip: interactive, for a person at a terminal"),
    (r"--timeout 30s -- make test", "exit 2: the tour's workspace has no Makefile (make says so)"),
    (r"^cairn image pull registry\.example\.com", "skip: names an example registry host"),
    (r"^cairn hooks test HOOK", "skip: posts to the example receiver host the tour adds"),
    (r"^cairn exec \$T$", "exit 1: the tour's task runs the host image, which has no Entrypoint or Cmd (the line says what it does with one)"),
    (r"^CAIRN_HOME=/var/lib/cairn-new cairn restore", "skip: restores into a host directory outside the test's own"),
    (r"^cairn completions bash > /etc/", "skip: writes into the host's /etc"),
    (r"^cairn exec -i \$T -- sh -c 'cat > data.csv' < data.csv", "after: cairn exec $T -- cat data.csv | cmp - data.csv"),
    (r"^cairn cp --follow-links \$T:/workspace/out", "before: cairn exec $T -- sh -c 'mkdir -p /workspace/out && echo made > /workspace/made && ln -s /workspace/made /workspace/out/link'"),
    (r"^cairn task watch", "skip: follows the log until interrupted"),
    (r"^cairn deliver \$T", "before: cairn exec $T -- sh -c 'mkdir -p /workspace/dist && echo built > /workspace/dist/app && echo done > /workspace/report.md'"),
]


def tour(readme):
    text = open(readme, encoding="utf-8").read()
    start = text.index("## A tour of the CLI")
    m = re.compile(r"^```sh\n(.*?)^```", re.S | re.M).search(text, start)
    lines, pending = [], ""
    for raw in m.group(1).splitlines():
        if pending:
            raw = pending + "\n" + raw
            pending = ""
        if raw.rstrip().endswith("\\"):
            pending = raw
            continue
        if raw.strip() and not raw.lstrip().startswith("#"):
            lines.append(raw)
    return lines


def command(line):
    """The line without its trailing comment (a # after two spaces)."""
    return re.split(r"\s{2,}#\s", line, maxsplit=1)[0].rstrip()


def main():
    readme, workdir = sys.argv[1:3]
    used = set()
    script = ["set -u", "cd " + shlex.quote(workdir)]
    plan = []
    for n, line in enumerate(tour(readme), 1):
        cmd = command(line)
        rules = [(i, what) for i, (pat, what) in enumerate(RULES) if re.search(pat, cmd)]
        used.update(i for i, _ in rules)
        whats = [w for _, w in rules]
        skip = next((w[len("skip: "):] for w in whats if w.startswith("skip: ")), None)
        want = next((int(w.split()[1].rstrip(":")) for w in whats if w.startswith("exit ")), 0)
        first = cmd.splitlines()[0]
        plan.append({"line": n, "command": first, "skipped": skip, "want": want})
        if skip:
            script.append(f"echo {shlex.quote(f'-- {n}: not run ({skip}): {first}')}")
            continue
        script.append(f"echo {shlex.quote(f'== {n}: {first}')}")
        for w in whats:
            if w.startswith("before: "):
                script.append(w[len("before: "):])
        script.append(f"eval {shlex.quote(cmd)} </dev/null; rc=$?")
        script.append(f'[ "$rc" = {want} ] || {{ echo "tour line {n} exited $rc, not {want}: "{shlex.quote(first)}; exit 1; }}')
        for w in whats:
            if w.startswith("after: "):
                script.append(w[len("after: "):] + f' || {{ echo "tour line {n}: its check failed"; exit 1; }}')
    stale = [RULES[i][0] for i in range(len(RULES)) if i not in used]
    if stale:
        sys.exit(f"rules that match no line of the tour: {stale}")
    # The daemon the tour started, and what runs in it, go at the end.
    script.append("echo '== the tour ran to its end'")
    # Into a file, not a pipe: the daemon the tour starts in the background
    # keeps what it inherited open after the script ends.
    log = os.path.join(workdir, "tour.log")
    with open(log, "w") as out:
        run = subprocess.run(["bash", "-c", "\n".join(script)], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=900)
    shown = open(log, errors="replace").read()
    print(shown, file=sys.stderr)
    if run.returncode != 0 or "== the tour ran to its end" not in shown:
        sys.exit(f"the tour stopped (exit {run.returncode})")
    print(json.dumps({"lines": len(plan), "ran": sum(1 for p in plan if not p["skipped"]), "skipped": {p["command"]: p["skipped"] for p in plan if p["skipped"]}}))


if __name__ == "__main__":
    main()
