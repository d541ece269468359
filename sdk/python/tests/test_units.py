"""Pieces of the SDK that need no daemon: event parsing, errors, DSSE."""

from __future__ import annotations

import pytest

import cairn
from cairn._errors import error_for
from cairn._transport import SseParser, discover
from cairn._verify import key_id, pae, parse_keys


def test_server_sent_events_are_parsed_line_by_line():
    p = SseParser()
    got = [p.feed(line) for line in ["event: stdout", 'data: {"data": "a"}', "", ": keep-alive", "", "event: exit", 'data: {"exit_code": 0}', ""]]
    assert [g for g in got if g] == [("stdout", {"data": "a"}), ("exit", {"exit_code": 0})]
    with pytest.raises(cairn.ProtocolError):
        for line in ["data: not json", ""]:
            p.feed(line)


def test_error_bodies_become_the_class_of_their_code():
    e = error_for(404, b'{"error": {"code": "not_found", "message": "no task t1"}}')
    assert isinstance(e, cairn.NotFound) and e.code == "not_found" and e.status == 404 and e.message == "no task t1"
    assert isinstance(error_for(409, b'{"error": {"code": "conflict", "message": "x"}}'), cairn.Conflict)
    odd = error_for(502, b"Bad Gateway\nmore")
    assert type(odd) is cairn.CairnError and odd.message == "Bad Gateway" and odd.status == 502


def test_pae_matches_the_dsse_spec_vector():
    assert pae("http://example.com/HelloWorld", b"hello world") == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


def test_a_key_whose_id_does_not_match_is_refused():
    public = "11" * 32
    with pytest.raises(cairn.VerifyError):
        parse_keys('{"key_id": "00", "public_key": "%s"}' % public)
    # Positive control: the right id, or a bare hex key.
    assert list(parse_keys('{"key_id": "%s", "public_key": "%s"}' % (key_id(bytes.fromhex(public)), public))) == [key_id(bytes.fromhex(public))]


def test_the_daemon_is_found_as_the_cli_finds_it(tmp_path, monkeypatch):
    monkeypatch.delenv("CAIRN_URL", raising=False)
    monkeypatch.delenv("CAIRN_TOKEN", raising=False)
    (tmp_path / "url").write_text("http://127.0.0.1:1/\n")
    (tmp_path / "token").write_text("secret\n")
    assert discover(None, None, tmp_path) == ("http://127.0.0.1:1", "secret")
    monkeypatch.setenv("CAIRN_HOME", str(tmp_path))
    assert discover(None, None, None) == ("http://127.0.0.1:1", "secret")
    monkeypatch.setenv("CAIRN_URL", "http://127.0.0.1:2")
    monkeypatch.setenv("CAIRN_TOKEN", "other")
    assert discover(None, None, None) == ("http://127.0.0.1:2", "other")
    with pytest.raises(cairn.DaemonUnreachable, match="daemon not running"):
        monkeypatch.delenv("CAIRN_URL")
        discover(None, None, tmp_path / "missing")


def test_a_snapshot_with_memory_asks_for_it_and_reads_it_back():
    from cairn import _ops as ops

    op = ops.snapshot("t1", "manual", None, None, True)
    call = next(op)
    assert (call.method, call.path, call.json) == ("POST", "/v1/tasks/t1/snapshots", {"kind": "manual", "with_memory": True})
    # Positive control: without it, the body does not ask.
    assert next(ops.snapshot("t1")).json == {"kind": "manual"}
    with pytest.raises(StopIteration) as done:
        op.send({"id": "s1", "task": "t1", "kind": "manual", "with_memory": True})
    assert done.value.value.with_memory is True
