# Shared by the benchmark scripts (sourced): a busybox rootfs, a daemon in
# $CAIRN_HOME, and a hyperfine --prepare script that destroys the tasks a
# timed command created. Expects CAIRN and WORK to be set.

# busybox_rootfs DIR: a static busybox with /bin/true, sh and ls.
busybox_rootfs() {
  mkdir -p "$1"/{bin,proc,dev,tmp,workspace}
  cp "$(readlink -f "$(command -v busybox)")" "$1/bin/busybox"
  for t in true sh ls; do ln -s busybox "$1/bin/$t"; done
}

# start_daemon [ARGS...]: starts `cairn serve` and waits until it answers;
# sets DAEMON. setsid: Ctrl-C must reach the script, not the daemon, so the
# script's cleanup can stop it.
start_daemon() {
  setsid "$CAIRN" serve --listen 127.0.0.1:0 "$@" >>"$WORK/daemon.log" 2>&1 &
  DAEMON=$!
  for _ in $(seq 100); do [[ -s $CAIRN_HOME/url ]] && "$CAIRN" task list >/dev/null 2>&1 && break; sleep 0.1; done
}

# destroy_created_script: writes $WORK/destroy-created.sh, which destroys
# every task id listed in $WORK/created and empties the list.
destroy_created_script() {
  touch "$WORK/created"
  cat >"$WORK/destroy-created.sh" <<SH
#!/bin/sh
while read -r id; do "$CAIRN" destroy "\$id" >/dev/null 2>&1; done <"$WORK/created"
: >"$WORK/created"
SH
  chmod +x "$WORK/destroy-created.sh"
}
