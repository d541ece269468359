#!/usr/bin/env bash
# A host-wide leak check, independent of Cairn's own code.
#
#   scripts/leak-check.sh before [STATE_DIR]   records what the host has
#   scripts/leak-check.sh after  [STATE_DIR]   names each thing that is new
#
# It reads mounts (/proc/self/mountinfo), loop devices (/sys/block),
# cgroups (every directory of every cgroup hierarchy whose path names
# `cairn`, and `gvisor-probe-*`), processes (pid and start time, so that a
# reused pid is a new process; kernel threads and this script's own
# processes left out, and so is other work on the host: see `ours`), network namespaces (`ip netns list` and the nsfs
# inodes of every process), listening sockets (`ss -Hlntup`, `ss -Hlxp`)
# and the entries of /var/tmp named `cairn-*`. `after` prints one line per
# new thing ("leak: KIND ..."), grouped by kind, and exits 1; with nothing
# new it prints a one-line summary and exits 0. Teardown is asynchronous:
# `after` reads again every half second for up to LEAK_CHECK_GRACE seconds
# (default 5) while something is new, and only what is still there at the
# end is a leak. Exit 2: a usage error, no `before` reading, a missing tool
# or something that could not be read (it never skips a kind).
#
# STATE_DIR defaults to /var/tmp/cairn-leak-check; it is left out of the
# comparison. See docs/testing.md.
set -euo pipefail
export LC_ALL=C

usage() {
  echo "usage: $0 before|after [STATE_DIR]" >&2
  exit 2
}
die() {
  echo "leak-check: $*" >&2
  exit 2
}

[[ $# -ge 1 && $# -le 2 ]] || usage
mode=$1
state=${2:-/var/tmp/cairn-leak-check}
case $mode in before | after) ;; *) usage ;; esac
grace=${LEAK_CHECK_GRACE:-5}
[[ $grace =~ ^[0-9]+$ ]] || die "LEAK_CHECK_GRACE must be a whole number of seconds, not '$grace'"

for tool in ip ss find sort awk sed tr grep cut wc head mkdir mktemp mv rm realpath date sleep; do
  command -v "$tool" >/dev/null || die "required tool '$tool' is missing (iproute2, coreutils, findutils)"
done
[[ -r /proc/self/mountinfo ]] || die "cannot read /proc/self/mountinfo"
[[ -d /sys/block ]] || die "no /sys/block: sysfs is not mounted"

state=$(realpath -m -- "$state")
kinds=(mount loop cgroup process netns socket file)

# The pids of this script, everything it started and its callers (e.g. a
# `timeout` around it): left out of every reading. They are not there
# before, and are gone or waiting for it after.
own_pids() {
  local -A parent=()
  local f line rest pid ppid
  for f in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null <"$f" || continue
    pid=${line%% *}
    rest=${line##*) }
    read -r _ ppid _ <<<"$rest"
    parent[$pid]=$ppid
  done
  local -A own=([$$]=1)
  local changed=1
  while ((changed)); do
    changed=0
    for pid in "${!parent[@]}"; do
      if [[ -z ${own[$pid]:-} && -n ${own[${parent[$pid]}]:-} ]]; then
        own[$pid]=1
        changed=1
      fi
    done
  done
  # The callers, not their other children.
  pid=$$
  while [[ -n ${parent[$pid]:-} && ${parent[$pid]} != 0 ]]; do
    pid=${parent[$pid]}
    own[$pid]=1
  done
  echo "${!own[@]}"
}

# Numbers repeated lines ("x", "x #2"), so that a second identical mount
# is a new thing too.
number_repeats() {
  awk '{ n[$0]++; if (n[$0] > 1) print $0 " #" n[$0]; else print }'
}

# iproute2 binds /run/netns on itself (to make it shared) the first time
# a namespace is named, and leaves it: that one mount is no leak. The
# namespaces it holds (/run/netns/NAME, nsfs) are.
read_mounts() {
  # mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
  awk '{
    for (i = 7; i <= NF; i++) if ($i == "-") break
    print $5 " " $(i + 1) " " $(i + 2)
  }' /proc/self/mountinfo | sort | number_repeats | { grep -Ev '^(/var)?/run/netns [^ ]+ [^ ]+$' || [[ $? == 1 ]]; }
}

read_loops() {
  local d f b
  for d in /sys/block/loop*; do
    [[ -e $d ]] || continue
    f=$d/loop/backing_file
    [[ -e $f ]] || continue # not attached
    b=$(<"$f") || continue  # detached between the test and the read
    echo "/dev/${d##*/} ${b% (deleted)}"
  done | sort
}

cgroup_mounts() {
  awk '{
    for (i = 7; i <= NF; i++) if ($i == "-") break
    if ($(i + 1) == "cgroup" || $(i + 1) == "cgroup2") print $5
  }' /proc/self/mountinfo
}

read_cgroups() {
  local mp err
  local -a mps
  mapfile -t mps < <(cgroup_mounts)
  ((${#mps[@]})) || die "no cgroup hierarchy is mounted"
  err=$(mktemp)
  for mp in "${mps[@]}"; do
    # A group removed while it is walked is no error. The parent group
    # `cairn` each hierarchy gets with the host's first sandbox is kept
    # for the next ones, as a state directory is; the groups below it
    # are the tasks'.
    find "$mp" -mindepth 1 -type d \( -path '*cairn*' -o -name 'gvisor-probe-*' \) ! -path "$mp/cairn" -print 2>>"$err" || true
  done | sort
  if grep -v 'No such file or directory' "$err" >&2; then
    rm -f "$err"
    die "cannot walk the cgroup hierarchies"
  fi
  rm -f "$err"
}

# Whether process $1 is one the check answers for, not other work on the
# host (a build, a login): it is in a cgroup of Cairn's or gVisor's, it is
# a cairn or runsc process, or it carries the run's mark in its
# environment (LEAK_CHECK_MARK, which scripts/test.sh sets to its state
# directory and every process a test starts inherits). Without a mark,
# only the first two.
mark=${LEAK_CHECK_MARK:+LEAK_CHECK_MARK=$LEAK_CHECK_MARK}
ours() {
  local pid=$1 comm
  grep -qs -e cairn -e gvisor "/proc/$pid/cgroup" && return 0
  read -r comm 2>/dev/null <"/proc/$pid/comm" || return 1
  [[ $comm == cairn || $comm == runsc* ]] && return 0
  [[ -n $mark ]] && tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qxF -- "$mark"
}

# "PID STARTTIME": kernel threads (PF_KTHREAD), this script's own
# processes and processes not ours (see `ours`) left out.
read_processes() {
  local -A own=()
  local p f line rest pid
  local -a fields
  for p in $(own_pids); do own[$p]=1; done
  for f in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null <"$f" || continue
    pid=${line%% *}
    [[ -z ${own[$pid]:-} ]] || continue
    rest=${line##*) }
    # After the comm: state ppid pgrp session tty tpgid flags ... starttime (the 20th).
    read -r -a fields <<<"$rest"
    ((fields[6] & 0x200000)) && continue
    ours "$pid" || continue
    echo "$pid ${fields[19]}"
  done | sort
}

read_netns() {
  local names
  names=$(ip netns list) || die "ip netns list failed"
  if [[ -n $names ]]; then
    awk '{ print "name " $1 }' <<<"$names"
  fi
  # A process that ends between the listing and the read is no error.
  local inodes
  inodes=$(find /proc/[0-9]*/ns/net -maxdepth 0 -printf 'inode %l\n' 2>/dev/null || true)
  [[ $inodes == *inode\ net:* ]] || die "cannot read the processes' network namespaces (/proc/*/ns/net)"
  # A zombie has none.
  grep -v '^inode $' <<<"$inodes" | sort -u
}

# The queue sizes (fields 3 and 4) change; the rest names the socket. A
# socket whose holders are all processes not ours (see `ours`) is left out.
read_sockets() {
  local tcp unix line pid keep
  tcp=$(ss -Hlntup) || die "ss -Hlntup failed"
  unix=$(ss -Hlxp) || die "ss -Hlxp failed"
  printf '%s\n%s\n' "$tcp" "$unix" | awk 'NF { $3 = ""; $4 = ""; print }' | tr -s ' ' | while IFS= read -r line; do
    keep=1
    if [[ $line == *pid=* ]]; then
      keep=0
      for pid in $(grep -o 'pid=[0-9]*' <<<"$line" | cut -d= -f2); do
        ours "$pid" && keep=1 && break
      done
    fi
    ((keep)) && echo "$line"
  done
  return 0
}

read_files() {
  local f
  for f in /var/tmp/cairn-*; do
    [[ -e $f || -L $f ]] || continue
    [[ $f == "$state" || $state == "$f"/* ]] && continue
    echo "$f"
  done | sort
}

# Takes one reading of every kind into directory $1.
reading() {
  local dir=$1 k
  mkdir -p "$dir"
  for k in "${kinds[@]}"; do
    case $k in
      mount) read_mounts ;;
      loop) read_loops ;;
      cgroup) read_cgroups ;;
      process) read_processes ;;
      netns) read_netns ;;
      socket) read_sockets ;;
      file) read_files ;;
    esac | sort -u >"$dir/$k.new" || die "cannot take the $k reading"
    mv "$dir/$k.new" "$dir/$k"
  done
}

# The lines of reading $2 whose thing is not in reading $1. A socket is
# the same socket whichever processes hold it now (its "users:" part).
added() {
  awk '
    { key = $0; sub(/ users:\(.*$/, "", key) }
    FILENAME == ARGV[1] { seen[key] = 1; next }
    !(key in seen)
  ' "$1" "$2"
}

# What a new process is, for the report.
describe_process() {
  local pid=$1 start=$2 line rest comm cmd
  local -a fields
  read -r line 2>/dev/null <"/proc/$pid/stat" || return 1
  comm=${line#* (}
  comm=${comm%) *}
  rest=${line##*) }
  read -r -a fields <<<"$rest"
  [[ ${fields[19]} == "$start" ]] || return 1
  cmd=$(tr '\0\n\t' '   ' <"/proc/$pid/cmdline" 2>/dev/null) || true
  # Its group that names cairn, else its pids or unified group.
  local cg
  cg=$(awk -F: '
    $3 ~ /cairn|gvisor-probe-/ { print $3; named = 1; exit }
    $2 == "pids" { p = $3 }
    $1 == "0" { u = $3 }
    END { if (!named) print (p != "" ? p : u) }
  ' "/proc/$pid/cgroup" 2>/dev/null) || true
  cmd=${cmd% }
  ((${#cmd} <= 300)) || cmd="${cmd:0:300}..."
  echo "$pid $comm (state ${fields[0]}, parent ${fields[1]}, cgroup ${cg:-?}): $cmd"
}

describe_netns() {
  local line=$1 ino holders
  case $line in
    name\ *) echo "${line#name } (named, /run/netns)" ;;
    inode\ *)
      ino=${line#inode }
      holders=$({ find /proc/[0-9]*/ns/net -maxdepth 0 -printf '%l %h\n' 2>/dev/null || true; } |
        awk -v ino="$ino" '$1 == ino { split($2, p, "/"); print p[3] }' | sort -n | head -20 | tr '\n' ' ')
      echo "$ino (held by pids ${holders% })"
      ;;
  esac
}

case $mode in
  before)
    mkdir -p "$state"
    rm -rf "$state/before" "$state/now"
    reading "$state/before"
    date -u +%Y-%m-%dT%H:%M:%SZ >"$state/before/taken"
    counts=()
    for k in "${kinds[@]}"; do counts+=("$k $(wc -l <"$state/before/$k")"); done
    echo "leak-check: recorded in $state ($(IFS=,; echo "${counts[*]}" | sed 's/,/, /g'))"
    ;;
  after)
    [[ -f $state/before/taken ]] || die "no reading in $state: run '$0 before $state' first"
    deadline=$(($(date +%s%3N) + grace * 1000))
    while :; do
      reading "$state/now"
      new=0
      for k in "${kinds[@]}"; do
        added "$state/before/$k" "$state/now/$k" >"$state/now/$k.added"
        [[ -s $state/now/$k.added ]] && new=1
      done
      ((new)) && (($(date +%s%3N) < deadline)) || break
      sleep 0.5
    done
    total=0
    for k in "${kinds[@]}"; do
      while IFS= read -r item; do
        case $k in
          process)
            # Ended since the last reading: not a leak.
            d=$(describe_process "${item%% *}" "${item#* }") || continue
            echo "leak: process $d"
            ;;
          netns) echo "leak: netns $(describe_netns "$item")" ;;
          *) echo "leak: $k $item" ;;
        esac
        total=$((total + 1))
      done <"$state/now/$k.added"
    done
    taken=$(<"$state/before/taken")
    if ((total)); then
      echo "leak-check: $total new things since $taken (waited up to ${grace}s for them to go)" >&2
      exit 1
    fi
    echo "leak-check: nothing new since $taken"
    ;;
esac
