"""The SDK's tests run against a real daemon: `CAIRN_URL` and `CAIRN_TOKEN`
name it (the Rust test `crates/cli/tests/sdk_python.rs` starts one and runs
these). Without them the tests fail, they do not skip."""

from __future__ import annotations

import os
from typing import Iterator

import pytest

import cairn


@pytest.fixture(scope="session")
def daemon() -> tuple[str, str]:
    url, token = os.environ.get("CAIRN_URL"), os.environ.get("CAIRN_TOKEN")
    if not url or not token:
        pytest.fail("CAIRN_URL and CAIRN_TOKEN must name a running daemon (cargo test -p cairn-cli --test sdk_python starts one)")
    return url, token


@pytest.fixture
def client(daemon: tuple[str, str]) -> Iterator[cairn.Client]:
    with cairn.Client(*daemon) as c:
        yield c


@pytest.fixture
def make_task(client: cairn.Client) -> Iterator:
    """Creates tasks that are destroyed after the test, also when it fails."""
    made: list[cairn.Task] = []

    def make(**options: object) -> cairn.Task:
        t = client.tasks.create(**options)
        made.append(t)
        return t

    yield make
    for t in made:
        try:
            t.destroy()
        except cairn.NotFound:
            pass


@pytest.fixture
def task(make_task) -> cairn.Task:
    return make_task()
