#!/usr/bin/env bash
# Installs what Cairn and its tests need on Debian (run as root): kernel
# userland tools the sandbox uses, the peers the benchmarks compare with,
# and a Rust toolchain when none is installed.
set -euo pipefail
if [[ $(id -u) != 0 ]]; then
  echo "setup-debian.sh: run as root (Cairn builds namespaces, mounts and cgroups)" >&2
  exit 1
fi
pkgs=(e2fsprogs libcap2-bin iproute2 util-linux procps python3 python3-pip python3-venv busybox-static bubblewrap runc hyperfine curl ca-certificates build-essential pkg-config chromium git sqlite3 docker-registry skopeo apache2-utils postgresql runsc)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The pull tests start their own registry on 127.0.0.1:0; the packaged
# service on :5000 is not needed.
if command -v systemctl >/dev/null && systemctl is-enabled docker-registry >/dev/null 2>&1; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi
# The store tests start a PostgreSQL server of their own (initdb into a
# temporary directory); the cluster the package just created and started is
# not needed.
if [[ " ${missing[*]:-} " == *" postgresql "* ]] && command -v systemctl >/dev/null; then
  systemctl disable --now postgresql >/dev/null 2>&1 || true
fi
# The tests sign webhooks with the reference Standard Webhooks client.
if ! python3 -c 'import standardwebhooks' 2>/dev/null; then
  echo "installing the standardwebhooks Python package"
  python3 -m pip install -q standardwebhooks 2>/dev/null || python3 -m pip install -q --break-system-packages standardwebhooks
fi
# The browser test drives Debian's Chromium (above) with Playwright for
# Python; `playwright install` is not needed, the test uses /usr/bin/chromium.
if ! python3 -c 'import playwright.sync_api' 2>/dev/null; then
  echo "installing the playwright Python package"
  python3 -m pip install -q playwright 2>/dev/null || python3 -m pip install -q --break-system-packages playwright
fi
# Delivery records are checked with the reference DSSE and in-toto
# implementations (securesystemslib, in-toto-attestation).
if ! python3 -c 'import securesystemslib.dsse, in_toto_attestation.v1.statement' 2>/dev/null; then
  echo "installing the securesystemslib, in-toto and in-toto-attestation Python packages"
  python3 -m pip install -q 'securesystemslib[crypto]' in-toto in-toto-attestation 2>/dev/null ||
    python3 -m pip install -q --break-system-packages 'securesystemslib[crypto]' in-toto in-toto-attestation
fi
# The API fuzz generates requests from the daemon's OpenAPI document.
if ! command -v schemathesis >/dev/null; then
  echo "installing the schemathesis Python package"
  python3 -m pip install -q schemathesis 2>/dev/null || python3 -m pip install -q --break-system-packages schemathesis
fi
# The Python SDK, from this checkout, with what its tests need (pytest;
# httpx and cryptography come with it). Reinstalled each run, so the
# installed copy is this checkout's.
echo "installing the Python SDK (sdk/python) and pytest"
python3 -m pip install -q "$(dirname "$0")/../sdk/python[test]" 2>/dev/null ||
  python3 -m pip install -q --break-system-packages "$(dirname "$0")/../sdk/python[test]"
# The MCP test uses the official Model Context Protocol SDK for Python as
# the client of `cairn mcp` and /mcp.
if ! python3 -c 'import mcp.client.stdio, mcp.client.streamable_http' 2>/dev/null; then
  echo "installing the mcp Python package"
  python3 -m pip install -q mcp 2>/dev/null || python3 -m pip install -q --break-system-packages mcp
fi
# E2B's own Python SDK (current, from PyPI) runs against the daemon in
# tests/e2b_sdk.rs; it has an environment of its own, so that its
# dependencies never meet the other packages' versions.
if ! /opt/cairn-test/e2b/bin/python -c 'import e2b, pytest, httpx' 2>/dev/null; then
  echo "installing the e2b Python SDK into /opt/cairn-test/e2b"
  python3 -m venv /opt/cairn-test/e2b
  /opt/cairn-test/e2b/bin/pip install -q e2b pytest httpx
fi
# E2B's JavaScript SDK (current, from npm) runs with node's test runner in
# tests/e2b_sdk.rs; it needs Node.js 20.18 or later.
if ! command -v node >/dev/null; then
  echo "installing Node.js and npm"
  apt-get install -y -q nodejs npm >/dev/null
fi
if [[ ! -d /opt/cairn-test/e2b-js/node_modules/e2b ]]; then
  echo "installing the e2b npm package into /opt/cairn-test/e2b-js"
  mkdir -p /opt/cairn-test/e2b-js
  [[ -f /opt/cairn-test/e2b-js/package.json ]] || echo '{"name": "cairn-e2b-js-sdk-test", "private": true}' >/opt/cairn-test/e2b-js/package.json
  (cd /opt/cairn-test/e2b-js && npm install --no-audit --no-fund --silent e2b)
fi
# The tests of the blob store on S3-compatible storage start moto's S3
# server on loopback.
if ! python3 -c 'import moto.server, flask, flask_cors' 2>/dev/null; then
  echo "installing the moto[server] Python package"
  python3 -m pip install -q 'moto[server]' 2>/dev/null || python3 -m pip install -q --break-system-packages 'moto[server]'
fi
# The unprivileged run of the tests (scripts/unprivileged-tests.sh) needs
# the same Python helpers where any user can run them: a virtual
# environment of Debian's own python3 (another python3 on root's PATH may
# live under root's home, closed to others).
if ! /opt/cairn-test/py/bin/python3 -c 'import moto.server, flask, flask_cors, standardwebhooks' 2>/dev/null; then
  echo "installing moto[server] and standardwebhooks into /opt/cairn-test/py"
  rm -rf /opt/cairn-test/py
  /usr/bin/python3 -m venv /opt/cairn-test/py
  /opt/cairn-test/py/bin/pip install -q 'moto[server]' standardwebhooks
fi
if ! command -v cargo >/dev/null; then
  if [[ -x $HOME/.cargo/bin/cargo ]]; then
    export PATH=$HOME/.cargo/bin:$PATH
  else
    echo "installing a Rust toolchain with rustup"
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >/dev/null
  fi
fi
# The test script runs clippy; a minimal rustup profile lacks it.
export PATH=$HOME/.cargo/bin:$PATH
if ! cargo clippy --version >/dev/null 2>&1; then
  echo "installing clippy"
  rustup component add clippy
fi
