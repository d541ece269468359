#!/usr/bin/env bash
# Runs every test outside the root tier (scripts/root-tier.txt) once more
# as an unprivileged user: uid and gid 65534, no supplementary groups, no
# capabilities (none inheritable, an empty bounding set). A test that is
# not in the root tier and needs root fails here, by name.
#
# Run as root (it switches to 65534 itself) after `cargo test --workspace
# --locked` has built the test binaries: it builds nothing new. Python's
# test helpers (moto, standardwebhooks) come from /opt/cairn-test/py, which
# scripts/setup-debian.sh makes from Debian's python3, so that any user can
# run them. Exit 1: a test failed; 2: a usage or set-up error.
set -euo pipefail
cd "$(dirname "$0")/.."
die() {
  echo "unprivileged-tests.sh: $*" >&2
  exit 2
}
[[ $(id -u) == 0 ]] || die "run as root: it switches to uid 65534 itself"
command -v setpriv >/dev/null || die "setpriv is missing (util-linux)"
py=/opt/cairn-test/py/bin
[[ -x $py/python3 ]] || die "$py/python3 is missing: run scripts/setup-debian.sh"

work=$(mktemp -d /tmp/cairn-unprivileged.XXXXXX)
granted=()
cleanup() {
  # Ancestors this run let others through are closed again.
  for d in "${granted[@]}"; do chmod o-x "$d" || true; done
  rm -rf "$work"
}
trap cleanup EXIT
chmod 755 "$work"
mkdir "$work/home"
chown 65534:65534 "$work/home"

# The test binaries cargo built, as JSON lines.
cargo test --workspace --locked --no-run --message-format=json >"$work/build.json" 2>"$work/build.err" ||
  { cat "$work/build.err" >&2; die "cargo test --no-run failed"; }
target_dir=$(cargo metadata --format-version 1 --no-deps | "$py/python3" -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')

# uid 65534 must reach the sources (tests read fixtures from them) and the
# binaries: a directory above them closed to others is opened (o+x) for the
# run and closed again after it.
for top in "$PWD" "$target_dir"; do
  d=$top
  while [[ $d != / ]]; do
    if [[ $(stat -c %A "$d") != *x ]]; then
      chmod o+x "$d"
      granted+=("$d")
      echo "unprivileged-tests.sh: opened $d to others (o+x) for this run"
    fi
    d=$(dirname "$d")
  done
done

# One line per binary to run: its package's directory, the binary, and the
# tests of it in the root tier, left out.
"$py/python3" - "$work/build.json" scripts/root-tier.txt >"$work/plan" <<'EOF'
import json, os, subprocess, sys, tomllib

build, tier_file = sys.argv[1], sys.argv[2]
tier = []  # (package, target, [tests])
for n, line in enumerate(open(tier_file), 1):
    line = line.split("#", 1)[0].split()
    if not line:
        continue
    if len(line) < 2:
        sys.exit(f"{tier_file}:{n}: a line is PACKAGE TARGET [TEST ...]")
    tier.append((line[0], line[1], line[2:], n))

used = set()
for raw in open(build):
    msg = json.loads(raw)
    if msg.get("reason") != "compiler-artifact" or not msg.get("profile", {}).get("test") or not msg.get("executable"):
        continue
    target = msg["target"]
    kind = target["kind"][0]
    name = "lib" if kind == "lib" else f"{kind}:{target['name']}"
    manifest = msg["manifest_path"]
    with open(manifest, "rb") as f:
        package = tomllib.load(f)["package"]["name"]
    exe = msg["executable"]
    listed = subprocess.run([exe, "--list", "--format", "terse"], capture_output=True, text=True, check=True).stdout
    tests = [l[: -len(": test")] for l in listed.splitlines() if l.endswith(": test")]
    skip = []
    whole = False
    for p, t, names, n in tier:
        if p != package or not (t == name or (t == "test:*" and kind == "test")):
            continue
        used.add(n)
        if not names:
            whole = True
        for want in names:
            hits = [x for x in tests if x == want or (want.endswith("::") and x.startswith(want))]
            if not hits:
                sys.exit(f"{tier_file}:{n}: {package} {name} has no test {want}")
            skip += hits
    if whole:
        print(f"root tier: {package} {name} (all {len(tests)})", file=sys.stderr)
        continue
    print(f"root tier: {package} {name}: {len(skip)} of {len(tests)}", file=sys.stderr) if skip else None
    print("\t".join([os.path.dirname(manifest), exe] + sorted(set(skip))))

for p, t, names, n in tier:
    if n not in used:
        sys.exit(f"{tier_file}:{n}: no test binary {p} {t}")
EOF

failed=()
ran=0
while IFS=$'\t' read -r dir exe skips; do
  args=()
  for s in $skips; do args+=(--skip "$s"); done
  echo "== as uid 65534: ${exe##*/} (in ${dir#"$PWD"/})"
  # A clean environment: nothing of root's but the mark the leak check
  # follows (scripts/test.sh).
  if ! (cd "$dir" && env -i HOME="$work/home" PATH="$py:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin" TMPDIR=/tmp LANG=C.UTF-8 \
    RUST_BACKTRACE=1 ${LEAK_CHECK_MARK:+LEAK_CHECK_MARK="$LEAK_CHECK_MARK"} ${CAIRN_PG_BIN:+CAIRN_PG_BIN="$CAIRN_PG_BIN"} \
    timeout -k 10 600 setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all -- \
    "$exe" --exact "${args[@]}" -q); then
    failed+=("${exe##*/}")
  fi
  ran=$((ran + 1))
done <"$work/plan"
((ran > 0)) || die "no test binary ran"
if ((${#failed[@]})); then
  echo "unprivileged-tests.sh: failed as uid 65534 (not in scripts/root-tier.txt, yet needing root?): ${failed[*]}" >&2
  exit 1
fi
echo "unprivileged-tests.sh: $ran test binaries passed as uid 65534, the root tier left out"
