"""Writes an OCI image layout for bench/images.sh, its layers generated
here: gzip-compressed tars, each blob hashed as it is written.

    oci_layout.py DIR < SPEC.json

SPEC:

    {"layers": {"NAME": [PART, ...], ...},
     "images": {"TAG": ["LAYER NAME", ...], ...}}   (bottom layer first)

A PART is one of
    {"kind": "busybox"}      bin/busybox (the host's static one) with sh, true,
                             ls, cat, head, mkdir as links, and /proc /dev
                             /tmp /workspace /etc
    {"kind": "files", "dir": "data/a", "count": N, "size": BYTES,
     "fill": "mixed" | "sparse", "seed": S}
        mixed:  half random bytes, half log-like text (gzip has work on
                half of it); sparse: zeros with 64 KiB of random bytes in
                each MiB (quick to generate and to compress, but every byte
                is file data in the tar, not a hole)

A layer used by several images is written once. Prints a JSON summary:
each layer's diff_id, digest and sizes, and each image's manifest digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import random
import shutil
import sys
import tarfile
import time
import zlib

CHUNK = 1 << 20
ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}


class Blob:
    """A file object that gzips what it is given into a blob file,
    hashing the uncompressed stream (the diff_id) and the blob."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.f = open(path, "wb")
        self.z = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip stream
        self.raw = hashlib.sha256()
        self.gz = hashlib.sha256()
        self.raw_bytes = 0
        self.gz_bytes = 0

    def write(self, data: bytes) -> int:
        self.raw.update(data)
        self.raw_bytes += len(data)
        self._out(self.z.compress(data))
        return len(data)

    def _out(self, data: bytes) -> None:
        if data:
            self.gz.update(data)
            self.gz_bytes += len(data)
            self.f.write(data)

    def close(self) -> None:
        self._out(self.z.flush())
        self.f.close()


class Generated(io.RawIOBase):
    """`size` bytes of generated content, read once by tarfile."""

    def __init__(self, size: int, fill: str, rng: random.Random) -> None:
        self.left = size  # still to be read
        self.unmade = size  # still to be generated
        self.half = size // 2
        self.pos = 0
        self.fill = fill
        self.rng = rng
        self.buf = b""
        self.off = 0

    def readable(self) -> bool:
        return True

    def _more(self) -> bytes:
        n = min(CHUNK, self.unmade)
        if self.fill == "sparse":
            block = bytearray(n)
            k = min(n, 64 << 10)
            block[:k] = self.rng.randbytes(k)
            return bytes(block)
        if self.pos < self.half:
            return self.rng.randbytes(min(n, self.half - self.pos))
        return log_text(self.rng, n)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.left
        out = []
        want = min(n, self.left)
        while want > 0:
            if self.off == len(self.buf):
                self.buf, self.off = self._more(), 0
                self.pos += len(self.buf)
                self.unmade -= len(self.buf)
            piece = self.buf[self.off:self.off + want]
            self.off += len(piece)
            want -= len(piece)
            out.append(piece)
        data = b"".join(out)
        self.left -= len(data)
        return data


LEVELS = ["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"]
PATHS = ["/api/v1/items", "/api/v1/users", "/healthz", "/api/v1/orders", "/static/app.js", "/login"]


def log_text(rng: random.Random, n: int) -> bytes:
    lines = []
    size = 0
    while size < n:
        line = (
            f"2026-12-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}."
            f"{rng.randint(0, 999):03d}Z {rng.choice(LEVELS)} worker-{rng.randint(1, 16)} request id={rng.getrandbits(64):016x} "
            f"path={rng.choice(PATHS)}/{rng.randint(1, 99999)} status={rng.choice((200, 200, 200, 201, 304, 404, 500))} "
            f"bytes={rng.randint(0, 65535)} ms={rng.random() * 250:.3f}\n"
        )
        lines.append(line)
        size += len(line)
    return "".join(lines).encode()[:n]


def entry(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    t = tarfile.TarInfo(name)
    t.type = kind
    t.mode = mode
    t.size = size
    t.linkname = link
    t.mtime = 1764720000  # fixed, so the same spec makes the same blobs
    t.uid = t.gid = 0
    t.uname = t.gname = "root"
    return t


def busybox_part(tar: tarfile.TarFile) -> None:
    path = os.path.realpath(shutil.which("busybox") or "/bin/busybox")
    for d in ("bin", "proc", "dev", "tmp", "workspace", "etc"):
        tar.addfile(entry(d, tarfile.DIRTYPE, 0o755))
    with open(path, "rb") as f:
        tar.addfile(entry("bin/busybox", tarfile.REGTYPE, 0o755, os.path.getsize(path)), f)
    for applet in ("sh", "true", "ls", "cat", "head", "mkdir"):
        tar.addfile(entry(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox"))
    tar.addfile(entry("etc/passwd", tarfile.REGTYPE, 0o644, 29), io.BytesIO(b"root:x:0:0:root:/root:/bin/sh\n"[:29]))


def files_part(tar: tarfile.TarFile, part: dict) -> None:
    made = set()
    parts = part["dir"].strip("/").split("/")
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in made:
            tar.addfile(entry(d, tarfile.DIRTYPE, 0o755))
            made.add(d)
    rng = random.Random(part.get("seed", 0))
    for i in range(part["count"]):
        size = part["size"]
        tar.addfile(entry(f"{part['dir'].strip('/')}/f{i:04d}", tarfile.REGTYPE, 0o644, size), Generated(size, part["fill"], rng))


def write_layer(blobs: str, parts: list) -> dict:
    tmp = os.path.join(blobs, f".tmp-{os.getpid()}")
    blob = Blob(tmp)
    with tarfile.open(fileobj=blob, mode="w|", format=tarfile.PAX_FORMAT, copybufsize=CHUNK) as tar:
        for part in parts:
            if part["kind"] == "busybox":
                busybox_part(tar)
            elif part["kind"] == "files":
                files_part(tar, part)
            else:
                sys.exit(f"unknown layer part {part['kind']!r}")
    blob.close()
    digest = blob.gz.hexdigest()
    os.replace(tmp, os.path.join(blobs, digest))
    return {"diff_id": f"sha256:{blob.raw.hexdigest()}", "digest": f"sha256:{digest}", "size": blob.gz_bytes, "uncompressed": blob.raw_bytes}


def put_json(blobs: str, doc: dict) -> tuple[str, int]:
    data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(blobs, digest), "wb") as f:
        f.write(data)
    return f"sha256:{digest}", len(data)


def main() -> None:
    out = sys.argv[1]
    spec = json.load(sys.stdin)
    blobs = os.path.join(out, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)
    with open(os.path.join(out, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    began = time.monotonic()
    layers = {name: write_layer(blobs, parts) for name, parts in spec["layers"].items()}
    arch = ARCH.get(platform.machine(), platform.machine())
    manifests, images = [], {}
    for tag, names in spec["images"].items():
        config = {
            "architecture": arch,
            "os": "linux",
            "created": "2026-12-03T00:00:00Z",
            "config": {"Cmd": ["/bin/sh"], "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [layers[n]["diff_id"] for n in names]},
            "history": [{"created": "2026-12-03T00:00:00Z", "created_by": f"bench layer {n}"} for n in names],
        }
        cdigest, csize = put_json(blobs, config)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdigest, "size": csize},
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layers[n]["digest"], "size": layers[n]["size"]}
                for n in names
            ],
        }
        mdigest, msize = put_json(blobs, manifest)
        manifests.append({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": mdigest,
            "size": msize,
            "annotations": {"org.opencontainers.image.ref.name": tag},
        })
        images[tag] = {"manifest": mdigest, "layers": names}
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests}, f)
    json.dump({"layers": layers, "images": images, "seconds": round(time.monotonic() - began, 2)}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
