#!/usr/bin/env bash
# Sets up a fresh Debian machine, builds Cairn and runs `cairn demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
export PATH=$HOME/.cargo/bin:$PATH
cargo build --release --locked -p cairn-cli
exec target/release/cairn demo
