#!/usr/bin/env bash
# Sets up a fresh Debian machine and runs every test of the workspace:
# unit tests per crate and integration tests against real daemons,
# sandboxes, cgroups and loop devices (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
export PATH=$HOME/.cargo/bin:$PATH
# One build from scratch: incremental caches would only double the disk it uses.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
cargo test --workspace --locked
# The isolation, limits, egress, delivery, injection, ports and E2B SDK tests once
# more on the gvisor driver: their daemons give every task --isolation
# gvisor (runsc comes with setup-debian.sh).
CAIRN_TEST_ISOLATION=gvisor cargo test --locked -p cairn-cli --test isolation --test egress --test deliver --test inject --test ports --test e2b_sdk
# Lints are part of the build: warnings fail it.
cargo clippy --workspace --all-targets --locked -- -D warnings
# A short fuzz run of the egress parsers.
scripts/fuzz.sh
