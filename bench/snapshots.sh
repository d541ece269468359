#!/usr/bin/env bash
# Snapshot benchmark: cairn's snapshot of a task's writable layer (full,
# incremental after a 10-file change, its freeze window) and rollback, side
# by side in the same run with `restic backup` of the same directory (first
# and second run) and `tar | zstd -3`.
#
#   bench/snapshots.sh                 # 3 rounds, prints the markdown section
#   bench/snapshots.sh --write-docs    # ... and puts it into docs/benchmarks.md
#   ROUNDS=5 bench/snapshots.sh        # more rounds
#   SIZES=10000 bench/snapshots.sh     # one workspace size (default: 10,000 and 100,000 files)
#   DAEMON_LOG=FILE bench/snapshots.sh # keep the daemon logs (RUST_LOG applies)
#   RAW=FILE bench/snapshots.sh        # keep every measurement (FILE.<size>: round, key, value)
#
# The workspace (10,000 files, ~500 MB, and 100,000 files, ~1.5 GB; fixed seed) is generated inside the
# sandbox. Every round starts from nothing: a new daemon home (so an empty
# blob store), a new task, a new restic repository and cache. Needs root,
# restic, zstd and python3 (installed when missing) and a release build of
# cairn (built when missing).
set -euo pipefail
shopt -s inherit_errexit
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-3}
SIZES=${SIZES:-10000 100000}
CAIRN=$ROOT/target/release/cairn
WRITE_DOCS=()
for a in "$@"; do
  case $a in
    --write-docs) WRITE_DOCS=(--write-docs "$ROOT/docs/benchmarks.md") ;;
    *) echo "usage: $0 [--write-docs]" >&2; exit 2 ;;
  esac
done

need=()
for p in restic:restic zstd:zstd python3:python3 tar:tar; do
  command -v "${p%%:*}" >/dev/null || need+=("${p#*:}")
done
if ((${#need[@]})); then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
[[ -x $CAIRN ]] || (cd "$ROOT" && cargo build --release -p cairn-cli)

WORK=$(mktemp -d /var/tmp/cairn-snapbench.XXXXXX)
TASK=
DAEMON=
stop_daemon() {
  if [[ -n $TASK ]]; then "$CAIRN" destroy "$TASK" >/dev/null 2>&1 || true; TASK=; fi
  if [[ -n $DAEMON ]]; then kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true; DAEMON=; fi
}
cleanup() {
  stop_daemon
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The workspace: argv = seed, directory, files. One directory per 100 files
# (packages of 9 modules); all but 100 of the files are source-like text files
# (the 100 others, and the first 9,900 of these, the same in every size) of 1-40 KB (log-uniform, so most are
# small), 90 medium files of 1-3 MB and 10 large ones of 16-24 MB, each of
# those half random (incompressible) and half log-like records (compressible,
# but no two chunks alike). Prints the totals as JSON.
cat >"$WORK/gen.py" <<'PY'
import json, math, os, random, sys
rng = random.Random(int(sys.argv[1]))
root = sys.argv[2]
KB, MB = 1024, 1024 * 1024
letters = "abcdefghijklmnopqrstuvwxyz"
words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 10))) for _ in range(3000)]
shapes = [
    "use {a}::{b}::{C};", "fn {a}_{b}(&self, {c}: u{n}) -> Result<{C}> {{", "    let {a} = self.{b}.{c}({d})?;",
    "    if {a}.len() > {n} {{", "        return Err(Error::{C}({a}));", "    }}", "}}", "",
    "def {a}_{b}({c}, {d}={n}):", "    {a} = {b}.{c}({d}, {n})", "    return {a}", "class {C}({B}):",
    "    # {a} {b} {c} {d}: {e} the {a} when {b}", "import {a}.{b}", "const {a} = require('{b}/{c}');",
    "  {a}: {{ {b}: {n}, {c}: '{d}' }},", "// TODO({a}): {b} {c} {d} {e}",
]
def line():
    w = rng.sample(words, 5)
    return rng.choice(shapes).format(a=w[0], b=w[1], c=w[2], d=w[3], e=w[4], n=rng.randint(0, 9999),
                                     B=w[1].capitalize(), C=w[2].capitalize()) + "\n"
source = [line().encode() for _ in range(60000)]
levels = ["INFO", "DEBUG", "WARN", "ERROR"]
records = [(f"2026-01-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z "
            f"{rng.choice(levels)} {rng.choice(words)}-{rng.randint(0, 63)} req={rng.getrandbits(48):012x} "
            f"{rng.choice(words)}={rng.randint(0, 10**6)} took {rng.randint(0, 5000)} ms\n").encode() for _ in range(60000)]

def text(size, pool):
    out, n = [], 0
    while n < size:
        chunk = rng.choices(pool, k=max(1, (size - n) // 40))
        out.extend(chunk)
        n += sum(map(len, chunk))
    return b"".join(out)[:size]

def blob(f, size):
    half = size // 2
    for off in range(0, half, MB):
        f.write(rng.randbytes(min(MB, half - off)))
    rest = size - half
    for off in range(0, rest, 4 * MB):
        f.write(text(min(4 * MB, rest - off), records))

files = int(sys.argv[3])
pkgs = max(1, files // 1000)
dirs = [f"pkg{p:02d}" for p in range(pkgs)] + [f"pkg{p:02d}/mod{m:02d}" for p in range(pkgs) for m in range(9)]
for d in dirs:
    os.makedirs(os.path.join(root, d), exist_ok=True)
exts = [".rs", ".py", ".js", ".md", ".toml", ".json", ".txt"]
totals = {"dirs": len(dirs), "files": 0, "bytes": 0, "small": 0, "small_bytes": 0,
          "medium": 0, "medium_bytes": 0, "large": 0, "large_bytes": 0}
# The large files first: the same bytes whatever the count of small files.
for kind, count, lo, hi in (("medium", 90, 1 * MB, 3 * MB), ("large", 10, 16 * MB, 24 * MB)):
    for i in range(count):
        size = rng.randint(lo, hi)
        path = os.path.join(root, dirs[(i * 7) % len(dirs)], f"{kind}{i:03d}.dat")
        with open(path, "wb") as f:
            blob(f, size)
        totals[kind] += 1; totals[kind + "_bytes"] += size
for i in range(files - 100):
    size = int(math.exp(rng.uniform(math.log(1 * KB), math.log(40 * KB))))
    path = os.path.join(root, dirs[i % len(dirs)], f"src{i:05d}{exts[i % len(exts)]}")
    with open(path, "wb") as f:
        f.write(text(size, source))
    totals["small"] += 1; totals["small_bytes"] += size
totals["files"] = totals["small"] + totals["medium"] + totals["large"]
totals["bytes"] = totals["small_bytes"] + totals["medium_bytes"] + totals["large_bytes"]
print(json.dumps(totals))
PY

# The change: argv = seed, directory, mode, files. mode "change": append ~2 KB to 5
# small files and overwrite 5 medium files with new random data of the same
# size; mode "hash": print a digest of those 10 files (to check a rollback).
cat >"$WORK/change.py" <<'PY'
import hashlib, os, random, sys
rng = random.Random(int(sys.argv[1]))
root, mode = sys.argv[2], sys.argv[3]
pkgs = max(1, int(sys.argv[4]) // 1000)
dirs = [f"pkg{p:02d}" for p in range(pkgs)] + [f"pkg{p:02d}/mod{m:02d}" for p in range(pkgs) for m in range(9)]
exts = [".rs", ".py", ".js", ".md", ".toml", ".json", ".txt"]
small = [os.path.join(root, dirs[i % len(dirs)], f"src{i:05d}{exts[i % len(exts)]}") for i in (17, 2003, 4111, 6007, 9871)]
medium = [os.path.join(root, dirs[(i * 7) % len(dirs)], f"medium{i:03d}.dat") for i in (3, 21, 40, 58, 77)]
if mode == "hash":
    h = hashlib.sha256()
    for p in small + medium:
        h.update(open(p, "rb").read())
    print(h.hexdigest())
    sys.exit()
changed = 0
for p in small:
    with open(p, "ab") as f:
        f.write(b"".join(b"// changed %d: %x\n" % (n, rng.getrandbits(64)) for n in range(80)))
    changed += os.path.getsize(p)
for p in medium:
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        for off in range(0, size, 1 << 20):
            f.write(rng.randbytes(min(1 << 20, size - off)))
    changed += size
print(changed)
PY

now() { date +%s%N; }
ms_since() { local end; end=$(now); awk -v a="$1" -v b="$end" 'BEGIN { printf "%.1f", (b - a) / 1e6 }'; }
rec() { printf '%s\t%s\t%s\n' "$ROUND" "$1" "$2" >>"$RESULTS"; }
jget() { python3 -c 'import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1].split("."):
    v = v[k]
print(v)' "$1"; }
size_of() { if [[ -e $1 ]]; then du -sb "$1" | cut -f1; else echo 0; fi; }
inside() { "$CAIRN" exec --env PYTHONDONTWRITEBYTECODE=1 "$TASK" -- "$@"; }

load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" 'BEGIN { exit !(l > 0.5) }'; then
  echo "note: load average $load before the first round; other work will show in the numbers" >&2
fi
export RESTIC_PASSWORD=bench
NO_SCAN=()
restic backup --help 2>/dev/null | grep -q -- '--no-scan' && NO_SCAN=(--no-scan)

cairn_snapshot() { # name, then: wall, daemon duration, freeze, blob growth
  local name=$1 before t0 out
  before=$(size_of "$CAIRN_HOME/blobs")
  sync
  t0=$(now)
  out=$("$CAIRN" --json snapshot "$TASK" --note "$name")
  rec "cairn_${name}_ms" "$(ms_since "$t0")"
  rec "cairn_${name}_daemon_ms" "$(jget duration_ms <<<"$out")"
  rec "cairn_${name}_freeze_ms" "$(jget freeze_ms <<<"$out")"
  rec "cairn_${name}_stored" $(($(size_of "$CAIRN_HOME/blobs") - before))
  rec "cairn_${name}_files" "$(jget files <<<"$out")"
  rec "cairn_${name}_added" "$(jget added_bytes <<<"$out")"
  jget id <<<"$out"
}
restic_backup() { # name
  local t0
  sync
  t0=$(now)
  restic -r "$REPO" backup -q "${NO_SCAN[@]}" "$SRC" >/dev/null
  rec "restic_${1}_ms" "$(ms_since "$t0")"
  rec "restic_${1}_stored" "$(size_of "$REPO")"
}
tar_zstd() {
  local t0
  rm -f "$WORK/ws.tar.zst"
  sync
  t0=$(now)
  tar -C "$SRC" -cf - . | zstd -3 -T0 -q -o "$WORK/ws.tar.zst"
  rec tar_zstd_ms "$(ms_since "$t0")"
  rec tar_zstd_stored "$(size_of "$WORK/ws.tar.zst")"
  rm -f "$WORK/ws.tar.zst"
}

REPORT_ARGS=()
for FILES in $SIZES; do
RESULTS=$WORK/results-$FILES.tsv # round, key, value
: >"$RESULTS"
for ROUND in $(seq "$ROUNDS"); do
  export CAIRN_HOME=$WORK/home$ROUND
  REPO=$WORK/restic$ROUND
  export RESTIC_CACHE_DIR=$WORK/restic-cache$ROUND
  # setsid: Ctrl-C must reach this script, not the daemon (see cleanup).
  RUST_LOG=${RUST_LOG:-info} setsid "$CAIRN" serve --listen 127.0.0.1:0 >"$WORK/daemon$ROUND.log" 2>&1 &
  DAEMON=$!
  for _ in $(seq 100); do [[ -s $CAIRN_HOME/url ]] && "$CAIRN" task list >/dev/null 2>&1 && break; sleep 0.1; done
  TASK=$("$CAIRN" task create --disk 4G --memory 1G)
  SRC=$CAIRN_HOME/run/$TASK/disk/root/upper/workspace
  shape=$(inside python3 -c "$(cat "$WORK/gen.py")" 42 /workspace "$FILES")
  [[ $ROUND == 1 ]] && printf '%s\n' "$shape" >"$WORK/shape-$FILES.json"
  [[ -d $SRC ]] || { echo "no workspace at the task's upper layer" >&2; exit 1; }
  restic -r "$REPO" init -q >/dev/null
  echo "round $ROUND/$ROUNDS: workspace $(jget files <<<"$shape") files, $(jget bytes <<<"$shape") bytes" >&2

  # Full: all three read the same warm page cache; odd rounds cairn first,
  # even rounds cairn last.
  if ((ROUND % 2)); then
    FULL=$(cairn_snapshot full); restic_backup first; tar_zstd
  else
    tar_zstd; restic_backup first; FULL=$(cairn_snapshot full)
  fi
  before_hash=$(inside python3 -c "$(cat "$WORK/change.py")" 7 /workspace hash "$FILES")

  # The same 10-file change seen by both the incremental snapshot and
  # restic's second run; the order alternates the same way.
  rec changed_bytes "$(inside python3 -c "$(cat "$WORK/change.py")" 7 /workspace change "$FILES")"
  if ((ROUND % 2)); then
    cairn_snapshot incr >/dev/null; restic_backup second
  else
    restic_backup second; cairn_snapshot incr >/dev/null
  fi

  sync
  t0=$(now)
  out=$("$CAIRN" --json rollback "$TASK" --to "$FULL" --reason "benchmark round $ROUND")
  rec cairn_rollback_ms "$(ms_since "$t0")"
  rec cairn_rollback_daemon_ms "$(jget duration_ms <<<"$out")"
  rec cairn_rollback_files_written "$(jget restore.files_written <<<"$out")"
  rec cairn_rollback_bytes_written "$(jget restore.bytes_written <<<"$out")"
  after_hash=$(inside python3 -c "$(cat "$WORK/change.py")" 7 /workspace hash "$FILES")
  if [[ $before_hash != "$after_hash" ]]; then
    echo "round $ROUND: the rollback did not restore the changed files" >&2
    exit 1
  fi

  stop_daemon
  if [[ -n ${DAEMON_LOG:-} ]]; then cat "$WORK/daemon$ROUND.log" >>"$DAEMON_LOG"; fi
  rm -rf "$CAIRN_HOME" "$REPO" "$RESTIC_CACHE_DIR"
done

if [[ -n ${RAW:-} ]]; then cp "$RESULTS" "$RAW.$FILES"; fi
REPORT_ARGS+=("$RESULTS" "$WORK/shape-$FILES.json")
done
python3 "$ROOT/bench/snapshot_report.py" "${REPORT_ARGS[@]}" "${WRITE_DOCS[@]}"
