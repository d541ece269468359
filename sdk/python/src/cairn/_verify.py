"""`cairn.verify`: checks a delivery record as `cairn verify` does: the
node's signature on the record (DSSE, ed25519), each deliverable's SHA-256
(next to the record, else from the daemon's store), the signed ledger
checkpoint inside the record, and the task's live ledger at that entry."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ._errors import CairnError, NotFound
from ._transport import Call

RECORD_PAYLOAD_TYPE = "application/vnd.in-toto+json"
CHECKPOINT_PAYLOAD_TYPE = "application/vnd.cairn.checkpoint+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"


class VerifyError(CairnError):
    """A record that does not verify; the message names the first check that
    failed."""

    code = "unverified"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding, what the signature covers."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d " % (len(t), t, len(payload)) + payload


def key_id(public: bytes) -> str:
    return hashlib.sha256(public).hexdigest()[:32]


def parse_keys(key: str) -> dict[str, Ed25519PublicKey]:
    """A public key as 64 hex characters, or the JSON `cairn key show` prints
    (one key or a list, each with `key_id` and `public_key`)."""
    text = key.strip()
    items: list[Any]
    if len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text):
        items = [{"public_key": text}]
    else:
        try:
            v = json.loads(text)
        except ValueError:
            raise VerifyError("key: neither 64 hex characters nor JSON") from None
        items = v if isinstance(v, list) else [v]
    keys = {}
    for item in items:
        raw = bytes.fromhex(item["public_key"])
        kid = key_id(raw)
        if item.get("key_id", kid) != kid:
            raise VerifyError(f"key {item['key_id']}: its id does not match its public key")
        keys[kid] = Ed25519PublicKey.from_public_bytes(raw)
    return keys


def _b64(s: str, what: str) -> bytes:
    try:
        return base64.b64decode(s, validate=True)
    except ValueError:
        raise VerifyError(f"{what}: malformed base64") from None


def verify_envelope(env: dict[str, Any], keys: dict[str, Ed25519PublicKey], payload_type: str, what: str) -> tuple[str, bytes]:
    """The id of the known key that signed `env`, and its payload."""
    if env.get("payloadType") != payload_type:
        raise VerifyError(f"{what}: payload type {env.get('payloadType')!r}, expected {payload_type!r}")
    payload = _b64(env.get("payload", ""), f"{what} payload")
    message = pae(payload_type, payload)
    for sig in env.get("signatures", []):
        kid = sig.get("keyid", "")
        for candidate, public in keys.items():
            if kid and kid != candidate:
                continue
            try:
                public.verify(_b64(sig.get("sig", ""), f"{what} signature"), message)
                return candidate, payload
            except InvalidSignature:
                continue
    raise VerifyError(f"{what}: no valid signature by a known node key")


def verify_ops(record_path: Path, key: str | None) -> Any:
    """The checks as an operation of `_transport` (calls only where the
    daemon is needed); answers the task id and the key id."""
    try:
        env = json.loads(record_path.read_bytes())
    except OSError as e:
        raise VerifyError(f"cannot read record {record_path}: {e.strerror}") from None
    except ValueError:
        raise VerifyError(f"{record_path} is not a delivery record (a DSSE envelope)") from None
    if key is not None:
        keys = parse_keys(Path(key).read_text() if os.path.isfile(key) else key)
    else:
        keys = parse_keys(json.dumps((yield Call("GET", "/v1/keys"))))
    signer, payload = verify_envelope(env, keys, RECORD_PAYLOAD_TYPE, "record signature")
    statement = json.loads(payload)
    if statement.get("_type") != STATEMENT_TYPE:
        raise VerifyError(f"record payload: statement type {statement.get('_type')!r}")
    pred = statement["predicate"]
    task = pred["task"]["id"]
    for subject in statement.get("subject", []):
        name, want = subject["name"], subject.get("digest", {}).get("sha256")
        if "/" in name or name in ("", ".", ".."):
            raise VerifyError(f"deliverable {name!r} is not a plain file name")
        if not want:
            raise VerifyError(f"deliverable {name}: the record gives no sha256")
        local = record_path.parent / name
        data = local.read_bytes() if local.exists() else (yield Call("GET", f"/v1/deliverables/{want}", answer="bytes"))
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            raise VerifyError(f"deliverable {name} does not match the record: its sha256 is {got}, the record says {want}")
    seq, head = pred["ledger"]["seq"], pred["ledger"]["head"]
    _, cp_payload = verify_envelope(pred["ledger"]["checkpoint"], keys, CHECKPOINT_PAYLOAD_TYPE, "record's ledger checkpoint")
    cp = json.loads(cp_payload)
    if (cp.get("task"), cp.get("seq"), cp.get("head")) != (task, seq, head):
        raise VerifyError(f"record's ledger checkpoint names entry {cp.get('seq')} head {cp.get('head')}, the record entry {seq} head {head}")
    ledger = yield Call("GET", f"/v1/tasks/{task}/ledger")
    if not ledger.get("ok"):
        raise VerifyError(f"ledger of {task}: {ledger.get('problem') or 'does not verify'}")
    at = {s: h for s, h in ledger.get("hashes", [])}
    if seq not in at:
        raise VerifyError(f"ledger of {task} has no entry {seq}, which the record names")
    if at[seq] != head:
        raise VerifyError(f"ledger of {task} at entry {seq} is {at[seq]}, the record names {head}")
    return task, signer


def verify(record_path: str | os.PathLike[str], *, key: str | None = None, client: Any = None) -> bool:
    """True when the delivery record at `record_path` verifies: its signature,
    every deliverable's digest, its ledger checkpoint and the live ledger.
    False when any check fails (`verify_or_raise` says which). The daemon is
    found as `cairn.Client()` finds it, unless `client` is given."""
    try:
        verify_or_raise(record_path, key=key, client=client)
        return True
    except (VerifyError, NotFound):
        return False


def verify_or_raise(record_path: str | os.PathLike[str], *, key: str | None = None, client: Any = None) -> tuple[str, str]:
    """Like `verify`, but raises `VerifyError` naming the first failed check;
    answers (task id, signing key id)."""
    from ._sync import Client

    own = client is None
    c = client if client is not None else Client()
    try:
        return c._t.run(verify_ops(Path(record_path), key))
    finally:
        if own:
            c.close()
