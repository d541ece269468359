#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target under fuzz/corpus/<target>/.

A few small valid and near-valid inputs per target; the fuzzer starts from
them. Python's standard library only, except the signed ledger seeds, which
need the `cryptography` package (without it they are left as they are).
Run from anywhere: python3 fuzz/make_corpus.py
"""

import base64
import gzip
import hashlib
import hmac
import io
import json
import os
import struct
import tarfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    assert len(data) <= 4096, (target, name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def compact(value):
    return json.dumps(value, separators=(",", ":")).encode()


# --- BLAKE3 (one chunk, up to 1024 bytes: enough for the seeds' chunks) ---

IV = [0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19]
PERM = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8]
M32 = 0xFFFFFFFF


def _rotr(x, n):
    return ((x >> n) | (x << (32 - n))) & M32


def _g(s, a, b, c, d, x, y):
    s[a] = (s[a] + s[b] + x) & M32
    s[d] = _rotr(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & M32
    s[b] = _rotr(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b] + y) & M32
    s[d] = _rotr(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & M32
    s[b] = _rotr(s[b] ^ s[c], 7)


def _compress(cv, block, block_len, flags):
    m = list(struct.unpack("<16I", block))
    s = cv[:] + IV[:4] + [0, 0, block_len, flags]
    for r in range(7):
        _g(s, 0, 4, 8, 12, m[0], m[1])
        _g(s, 1, 5, 9, 13, m[2], m[3])
        _g(s, 2, 6, 10, 14, m[4], m[5])
        _g(s, 3, 7, 11, 15, m[6], m[7])
        _g(s, 0, 5, 10, 15, m[8], m[9])
        _g(s, 1, 6, 11, 12, m[10], m[11])
        _g(s, 2, 7, 8, 13, m[12], m[13])
        _g(s, 3, 4, 9, 14, m[14], m[15])
        m = [m[i] for i in PERM]
    return [s[i] ^ s[i + 8] for i in range(8)]


def blake3(data):
    assert len(data) <= 1024, "one chunk only"
    blocks = [data[i:i + 64] for i in range(0, len(data), 64)] or [b""]
    cv = IV[:]
    for i, b in enumerate(blocks):
        flags = (1 if i == 0 else 0) | ((2 | 8) if i == len(blocks) - 1 else 0)
        cv = _compress(cv, b.ljust(64, b"\0"), len(b), flags)
    return struct.pack("<8I", *cv).hex()


assert blake3(b"") == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
assert blake3(b"abc") == "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"


def zstd_raw(data):
    """A zstd frame holding `data` in raw (stored) blocks, with runs of one
    byte as RLE blocks: valid zstd without a compressor."""
    assert len(data) < 128 * 1024
    # No single segment, no checksum, no dictionary, no content size; a
    # 128 KiB window.
    out = b"\x28\xb5\x2f\xfd" + bytes([0x00, 7 << 3])
    blocks = []
    i = 0
    while i < len(data):
        run = i
        while run < len(data) and data[run] == data[i]:
            run += 1
        if run - i >= 32:
            blocks.append((1, run - i, data[i:i + 1]))  # RLE
            i = run
            continue
        j = i
        while j < len(data) and not (data[j:j + 32] == data[j:j + 1] * 32):
            j += 1
        blocks.append((0, j - i, data[i:j]))  # raw
        i = j
    if not blocks:
        blocks.append((0, 0, b""))
    for n, (kind, size, body) in enumerate(blocks):
        last = 1 if n == len(blocks) - 1 else 0
        out += ((size << 3) | (kind << 1) | last).to_bytes(3, "little") + body
    return out


# --- image_layer: OCI layer blobs ---

def tar_bytes(members, fmt=tarfile.USTAR_FORMAT):
    buf = io.BytesIO()
    tf = tarfile.TarFile(fileobj=buf, mode="w", format=fmt)
    for info, data in members:
        tf.addfile(info, io.BytesIO(data) if data is not None else None)
    end = tf.offset
    tf.fileobj = io.BytesIO()  # the end blocks and padding are added below
    return buf.getvalue()[:end] + b"\0" * 1024


def member(name, kind=tarfile.REGTYPE, data=b"", link="", mode=0o644, pax=None):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = 1700000000
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    if pax:
        info.pax_headers = pax
    return info, (data if kind == tarfile.REGTYPE else None)


def image_layer():
    basic = tar_bytes([
        member("etc/", tarfile.DIRTYPE, mode=0o755),
        member("etc/hostname", data=b"example\n"),
        member("bin", tarfile.SYMTYPE, link="usr/bin", mode=0o777),
        member("etc/hostname.link", tarfile.LNKTYPE, link="etc/hostname"),
        member("run/fifo", tarfile.FIFOTYPE),
    ])
    write("image_layer", "plain.tar", basic)
    write("image_layer", "plain.tar.gz", gzip.compress(basic, mtime=0))
    write("image_layer", "plain.tar.zst", zstd_raw(basic))
    write("image_layer", "whiteouts.tar", tar_bytes([
        member("etc/", tarfile.DIRTYPE, mode=0o755),
        member("etc/.wh.removed.conf"),
        member("var/", tarfile.DIRTYPE, mode=0o755),
        member("var/.wh..wh..opq"),
        member("var/.wh..wh.plnk"),
    ]))
    long = "srv/" + "a" * 120 + "/file.txt"
    write("image_layer", "pax-long-xattr.tar", tar_bytes([
        member(long, data=b"pax\n", pax={"SCHILY.xattr.user.example": "value", "mtime": "1700000000.5"}),
    ], tarfile.PAX_FORMAT))
    write("image_layer", "gnu-long.tar", tar_bytes([
        member(long + "/", tarfile.DIRTYPE, mode=0o755),
        member("lnk", tarfile.SYMTYPE, link="x" * 150, mode=0o777),
    ], tarfile.GNU_FORMAT))
    # A PAX sparse file (format 1.0): the map heads the data.
    sparse_data = b"1\n4096\n4\n".ljust(512, b"\0") + b"data"
    write("image_layer", "pax-sparse.tar", tar_bytes([
        member("GNUSparseFile.0/sparse.bin", data=sparse_data, pax={
            "GNU.sparse.major": "1", "GNU.sparse.minor": "0",
            "GNU.sparse.name": "sparse.bin", "GNU.sparse.realsize": "8192",
        }),
    ], tarfile.PAX_FORMAT))
    # Near-valid: an escaping path, and an archive cut inside a file's data.
    write("image_layer", "dotdot.tar", tar_bytes([member("../escape", data=b"x")]))
    write("image_layer", "truncated.tar", basic[:512 * 3 + 3])


# --- oci_documents: index (0), config (1), manifest 0xff config (2) ---

def sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def oci_documents():
    def desc(mt, data, **extra):
        return dict(mediaType=mt, digest=sha(data), size=len(data), **extra)

    write("oci_documents", "index-platforms.json", b"\x00" + compact({
        "schemaVersion": 2, "mediaType": MT_INDEX, "manifests": [
            desc(MT_MANIFEST, b"a", platform={"architecture": "amd64", "os": "linux"}),
            desc(MT_MANIFEST, b"b", platform={"architecture": "arm64", "os": "linux", "variant": "v8"}),
            desc(MT_MANIFEST, b"c", platform={"architecture": "amd64", "os": "windows"}),
        ]}))
    write("oci_documents", "index-tagged.json", b"\x00" + compact({
        "schemaVersion": 2, "manifests": [
            desc(MT_MANIFEST, b"a", annotations={"org.opencontainers.image.ref.name": "latest"}),
        ]}))
    write("oci_documents", "index-v1.json", b"\x00" + compact({"schemaVersion": 1, "manifests": []}))
    layer_diff = sha(b"layer")
    config = compact({
        "created": "2024-01-01T00:00:00Z",
        "os": "linux",
        "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo hello"],
                   "WorkingDir": "/srv", "User": "1000:1000"},
        "rootfs": {"type": "layers", "diff_ids": [layer_diff]},
    })
    write("oci_documents", "config.json", b"\x01" + config)
    write("oci_documents", "config-bad-diffid.json", b"\x01" + compact(
        {"os": "linux", "rootfs": {"type": "layers", "diff_ids": ["sha256:XYZ"]}}))
    manifest = compact({
        "schemaVersion": 2, "mediaType": MT_MANIFEST,
        "config": desc(MT_CONFIG, config),
        "layers": [desc(MT_LAYER, b"compressed layer")],
    })
    write("oci_documents", "manifest-config.json", b"\x02" + manifest + b"\xff" + config)
    two_layers = compact({
        "schemaVersion": 2, "mediaType": MT_MANIFEST,
        "config": desc(MT_CONFIG, config),
        "layers": [desc(MT_LAYER, b"one"), desc(MT_LAYER, b"two")],
    })
    write("oci_documents", "manifest-layer-count.json", b"\x02" + two_layers + b"\xff" + config)


# --- snapshot_manifest: manifests as stored ---

def snapshot_manifest():
    chunk = blake3(b"example\n")
    t = {"sec": 1700000000, "nsec": 5}

    def entry(path, kind, mode=0o644, **extra):
        e = {"path": path, "kind": kind, "mode": mode, "uid": 0, "gid": 0, "mtime": t}
        e.update(extra)
        e.update({"ino": 1, "ctime": t})
        return e

    valid = {"version": 1, "layers": [
        {"name": "root", "at": "/", "entries": [
            entry("", "dir", 0o755),
            entry("etc", "dir", 0o755, xattrs=[["trusted.overlay.opaque", "y"]]),
            entry("etc/hostname", {"file": {"size": 8, "extents": [{"offset": 0, "len": 8, "chunks": [chunk]}]}}),
            entry("etc/hostname.link", {"hard_link": {"to": "etc/hostname"}}),
            entry("etc/old", "whiteout", 0),
            entry("etc/pipe", "fifo"),
            entry("etc/sparse", {"file": {"size": 1 << 20, "extents": []}}),
            entry("etc/tty", {"char_dev": {"rdev": 1025}}),
            entry("etc/\u00e9t\u00e9", {"symlink": {"target": "hostname"}}, 0o777),
        ]},
        {"name": "at_usr", "at": "/usr", "entries": [entry("", "dir", 0o755)]},
    ]}
    data = compact(valid)
    write("snapshot_manifest", "valid.json", data)
    write("snapshot_manifest", "valid.json.zst", zstd_raw(data))
    non_utf8 = {"version": 1, "layers": [{"name": "root", "at": "/", "entries": [
        entry("", "dir", 0o755),
        entry({"hex": "ff6e616d65"}, {"symlink": {"target": {"hex": "c0"}}}, 0o777, xattrs=[[{"hex": "80"}, {"hex": ""}]]),
    ]}]}
    write("snapshot_manifest", "non-utf8.json", compact(non_utf8))
    write("snapshot_manifest", "version-2.json", compact({"version": 2, "layers": []}))
    unsorted = {"version": 1, "layers": [{"name": "root", "at": "/", "entries": [
        entry("", "dir", 0o755), entry("b", "dir", 0o755), entry("a", "dir", 0o755),
    ]}]}
    write("snapshot_manifest", "unsorted.json", compact(unsorted))
    overlap = {"version": 1, "layers": [{"name": "root", "at": "/", "entries": [
        entry("", "dir", 0o755),
        entry("f", {"file": {"size": 10, "extents": [
            {"offset": 0, "len": 8, "chunks": [chunk]}, {"offset": 4, "len": 8, "chunks": [chunk]}]}}),
    ]}]}
    write("snapshot_manifest", "overlapping-extents.json", compact(overlap))


# --- blob_pack and blob_index ---

def pack(chunks, corrupt=None):
    """chunks: (raw bytes, compress?); returns the pack's bytes and entries."""
    data = b""
    entries = []
    for raw, compressed in chunks:
        stored = zstd_raw(raw) if compressed else raw
        entries.append((blake3(raw), len(data), len(stored), len(raw), compressed))
        data += stored
    trailer = struct.pack("<I", len(entries))
    for cid, off, length, raw_len, compressed in entries:
        trailer += bytes.fromhex(cid) + struct.pack("<QIIB", off, length, raw_len, 1 if compressed else 0)
    if corrupt:
        trailer = corrupt(trailer)
    return data + trailer + struct.pack("<I", len(trailer)) + b"CAIRNPK\x01", entries


def blob_pack():
    write("blob_pack", "one-raw.pack", pack([(b"hello, pack\n", False)])[0])
    write("blob_pack", "raw-and-zstd.pack", pack([(b"first chunk", False), (b"z" * 300, True)])[0])
    write("blob_pack", "empty.pack", pack([])[0])
    # Near-valid: a chunk whose id is wrong, one past the data, no magic.
    write("blob_pack", "bad-id.pack", pack([(b"abc", False)], lambda t: t[:4] + b"\0" * 32 + t[36:])[0])
    write("blob_pack", "past-the-data.pack",
          pack([(b"abc", False)], lambda t: t[:36] + struct.pack("<Q", 1000) + t[44:])[0])
    write("blob_pack", "no-magic.pack", pack([(b"abc", False)])[0][:-1] + b"\x02")


def blob_index():
    _, entries = pack([(b"first chunk", False), (b"z" * 300, True)])
    chunks = [{"id": cid, "offset": off, "length": length, "raw_length": raw_len, "compressed": c}
              for cid, off, length, raw_len, c in entries]
    index = compact({"version": 1, "packs": [{"id": blake3(b"a pack"), "size": 4096, "chunks": chunks}]})
    write("blob_index", "index.json", index)
    write("blob_index", "index.json.zst", zstd_raw(index))
    write("blob_index", "empty.json", compact({"version": 1, "packs": []}))
    write("blob_index", "version-2.json", compact({"version": 2, "packs": []}))
    write("blob_index", "bad-id.json", compact({"version": 1, "packs": [
        {"id": "ABC", "size": 1, "chunks": []}]}))


# --- webhook: headers, a blank line, the body ---

WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
WEBHOOK_NOW = 1614265330


def webhook_sig(msg_id, ts, body):
    key = base64.b64decode(WEBHOOK_SECRET[len("whsec_"):])
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def webhook():
    body = b'{"test": 2432232314}'
    msg_id = "msg_p5jXN8AQM9LWM0D4loKWxJek"
    good = webhook_sig(msg_id, WEBHOOK_NOW, body)

    def req(headers, body=body):
        return "".join(f"{k}: {v}\n" for k, v in headers).encode() + b"\n" + body

    write("webhook", "valid", req([("webhook-id", msg_id), ("webhook-timestamp", WEBHOOK_NOW), ("webhook-signature", good)]))
    write("webhook", "valid-svix", req([("svix-id", msg_id), ("svix-timestamp", WEBHOOK_NOW), ("svix-signature", good)]))
    write("webhook", "several-signatures", req([
        ("Webhook-Id", msg_id), ("Webhook-Timestamp", WEBHOOK_NOW),
        ("Webhook-Signature", "v1a,c29tZXRoaW5n v1,AAAA " + good)]))
    write("webhook", "bad-signature", req([("webhook-id", msg_id), ("webhook-timestamp", WEBHOOK_NOW),
                                           ("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")],
                                          b'{"test": 1}'))
    old = WEBHOOK_NOW - 3600
    write("webhook", "stale", req([("webhook-id", msg_id), ("webhook-timestamp", old),
                                   ("webhook-signature", webhook_sig(msg_id, old, body))]))
    write("webhook", "no-id", req([("webhook-timestamp", WEBHOOK_NOW), ("webhook-signature", good)]))


# --- exec_frames: length-prefixed JSON frames ---

def frame(msg):
    body = compact(msg)
    return struct.pack(">I", len(body)) + body


def exec_frames():
    write("exec_frames", "exited", frame({"Exited": {"code": 0, "signal": None}}))
    write("exec_frames", "started-exited",
          frame({"Started": {"pid": 7}}) + frame({"Exited": {"code": None, "signal": 9}}))
    write("exec_frames", "exec-ping", frame({"Exec": {"argv": ["echo", "hi"], "env": ["A=1"], "cwd": "/",
                                                      "tty": {"rows": 24, "cols": 80}, "user": "1000:1000"}}) + frame("Ping"))
    write("exec_frames", "requests", frame({"ConnectPort": {"port": 8080}}) + frame({"Watch": {"path": "/srv", "recursive": True}})
          + frame({"Signal": {"pid": 7, "signal": 15}}) + frame("ProxyListener"))
    write("exec_frames", "replies", frame({"Failed": {"errno": 2, "message": "No such file or directory"}})
          + frame({"Pong": {"pid": 1}}) + frame("Signalled") + frame("PortConnection"))
    write("exec_frames", "truncated", struct.pack(">I", 100) + b'{"Exited":')
    write("exec_frames", "oversized", struct.pack(">I", 0x7FFFFFFF) + b"{}")
    write("exec_frames", "malformed", struct.pack(">I", 3) + b"{x}")


# --- ledger_records: envelope (0), checkpoint (1), statement (2), key (3) ---

def ledger_records():
    statement = compact({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "report.md", "digest": {"sha256": hashlib.sha256(b"report").hexdigest()}}],
        "predicateType": "https://example.com/delivery/v1",
        "predicate": {"task": "t-example", "deliverables": [{"name": "report.md", "size": 6}], "ratio": 0.5},
    })
    write("ledger_records", "statement.json", b"\x02" + statement)
    write("ledger_records", "statement-other-type.json", b"\x02" + compact(
        {"_type": "https://example.com/Other", "subject": [], "predicateType": "x", "predicate": None}))
    write("ledger_records", "envelope-unknown-key.json", b"\x00" + compact({
        "payload": base64.urlsafe_b64encode(statement).decode().rstrip("="),
        "payloadType": "application/vnd.in-toto+json",
        "signatures": [{"keyid": "0123456789abcdef0123456789abcdef", "sig": base64.b64encode(b"\0" * 64).decode()}],
    }))
    write("ledger_records", "key-json.json", b"\x03" + compact([{
        "key_id": "00" * 16, "public_key": "11" * 32}]))
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    except ImportError:
        print("no `cryptography` module: the signed ledger seeds are left as they are")
        return
    # The fuzz target's fixed node key.
    signing = Ed25519PrivateKey.from_private_bytes(bytes([7] * 32))
    public = signing.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    key_id = hashlib.sha256(public).digest()[:16].hex()

    def envelope(payload_type, payload):
        pae = f"DSSEv1 {len(payload_type)} {payload_type} {len(payload)} ".encode() + payload
        return {"payload": base64.b64encode(payload).decode(), "payloadType": payload_type,
                "signatures": [{"keyid": key_id, "sig": base64.b64encode(signing.sign(pae)).decode()}]}

    write("ledger_records", "envelope-signed.json", b"\x00" + compact(envelope("application/vnd.in-toto+json", statement)))
    checkpoint = {"task": "t-example", "seq": 42, "head": hashlib.sha256(b"head").hexdigest(),
                  "time_ms": 1700000000000, "key_id": key_id}
    env = envelope("application/vnd.cairn.checkpoint+json", compact(checkpoint))
    write("ledger_records", "checkpoint-signed.json", b"\x01" + compact({"checkpoint": checkpoint, "envelope": env}))
    write("ledger_records", "checkpoint-mismatch.json", b"\x01" + compact({"checkpoint": dict(checkpoint, seq=43), "envelope": env}))
    write("ledger_records", "key-hex.txt", b"\x03" + public.hex().encode() + b"\n")


# --- api_bodies: the first byte picks the request type (see BODIES) ---

def api_bodies():
    bodies = [
        ("create-task", {"image": "example", "name": "demo", "memory": "512M", "cpus": "1", "env": ["A=1"],
                         "allow": ["example.com"], "metadata": {"owner": "example"}, "timeout": "1h"}),
        ("run", {"cmd": ["sh", "-c", "echo hi"], "env": {"A": "1"}, "cwd": "/srv", "timeout": 2.5, "stdin": "x"}),
        ("exec-start", {"argv": ["bash"], "env": ["TERM=xterm"], "stdin": True, "tty": {"rows": 24, "cols": 80},
                        "timeout_ms": 60000}),
        ("client-frame", {"type": "resize", "rows": 50, "cols": 132}),
        ("snapshot", {"kind": "milestone", "note": "before upgrade", "healthy": True}),
        ("rollback", {"to": "s-1", "reason": "broke the build"}),
        ("fork", {"from": "s-1", "count": 3}),
        ("wait", {"approval": "deploy?", "timer": "10m"}),
        ("approve", {"approve": False, "comment": "not yet"}),
        ("event", {"name": "ci.done", "data": {"ok": True, "runs": [1, 2.5, None], "by": "example"}}),
        ("deliver", {"files": ["/srv/report.md"], "archive": "/srv/out", "patch": True, "complete": True}),
        ("import", {"name": "example", "path": "/images/example.tar", "tag": "latest"}),
        ("pull", {"reference": "registry.example.com/library/example:1", "insecure": True,
                  "username": "user", "password": "secret"}),
        ("commit", {"task": "t-1", "name": "example-template", "from": "s-2"}),
        ("gc", {"dry_run": True, "grace": "1h"}),
        ("check", {"read_data": True}),
        ("start-process", {"argv": ["sleep", "60"], "tag": "sleeper"}),
        ("resize", {"rows": 40, "cols": 120}),
        ("policy", {"allow": ["*.example.com"], "deny": ["example.org"], "clear": False}),
        ("api-key", {"name": "ci"}),
    ]
    for i, (name, body) in enumerate(bodies):
        write("api_bodies", f"{i:02}-{name}.json", bytes([i]) + compact(body))
    write("api_bodies", "blank-snapshot", bytes([4]) + b" \n")
    write("api_bodies", "deliver-unknown-field.json", bytes([10]) + compact({"files": [], "extra": 1}))


def client_hello_bytes(sni, alpn=(b"h2", b"http/1.1")):
    """A TLS 1.3 ClientHello record with a server_name and ALPN extension."""
    exts = b""
    if sni is not None:
        name = sni.encode()
        entry = b"\x00" + struct.pack(">H", len(name)) + name
        body = struct.pack(">H", len(entry)) + entry
        exts += struct.pack(">HH", 0, len(body)) + body
    if alpn:
        protos = b"".join(bytes([len(p)]) + p for p in alpn)
        body = struct.pack(">H", len(protos)) + protos
        exts += struct.pack(">HH", 16, len(body)) + body
    versions = b"\x02\x03\x04"
    exts += struct.pack(">HH", 43, len(versions)) + versions
    hello = b"\x03\x03" + bytes(range(32)) + b"\x20" + bytes(32)
    hello += struct.pack(">H", 4) + b"\x13\x01\x13\x02" + b"\x01\x00"
    hello += struct.pack(">H", len(exts)) + exts
    handshake = b"\x01" + struct.pack(">I", len(hello))[1:] + hello
    return b"\x16\x03\x01" + struct.pack(">H", len(handshake)) + handshake


def client_hello():
    write("client_hello", "sni", client_hello_bytes("docs.example.org"))
    write("client_hello", "no-sni", client_hello_bytes(None))
    whole = client_hello_bytes("api.example.com")
    write("client_hello", "truncated", whole[: len(whole) // 2])
    write("client_hello", "not-tls", b"GET / HTTP/1.1\r\n\r\n")


def connect():
    write("connect", "connect", "CONNECT docs.example.org:443 HTTP/1.1\r\nHost: docs.example.org:443\r\n\r\n")
    write("connect", "plain-get", "GET http://example.com/index.html HTTP/1.1\r\nHost: example.com\r\nUser-Agent: seed\r\n\r\n")
    write("connect", "host-disagrees", "GET http://example.com/ HTTP/1.1\r\nHost: example.org\r\n\r\n")
    write("connect", "ipv6", "CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n")
    write("connect", "partial", "CONNECT example.com:443 HTTP/1.1\r\nHost: exa")


if __name__ == "__main__":
    client_hello()
    connect()
    image_layer()
    oci_documents()
    snapshot_manifest()
    blob_pack()
    blob_index()
    webhook()
    exec_frames()
    ledger_records()
    api_bodies()
