# A WebSocket echo server in Python's standard library, run inside a sandbox
# by tests/ports.rs and tests/e2b/test_e2b_sdk.py: listens on 127.0.0.1:8765
# and answers each text frame with "echo: " and the frame.
import base64, hashlib, socket, threading
def serve(c):
    req = b""
    while b"\r\n\r\n" not in req:
        chunk = c.recv(1024)
        if not chunk:
            return
        req += chunk
    key = [l.split(b":", 1)[1].strip() for l in req.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key")][0]
    acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    while True:
        h = c.recv(2)
        if len(h) < 2 or h[0] & 0x0f == 8:
            return
        n = h[1] & 0x7f
        if n == 126:
            n = int.from_bytes(c.recv(2), "big")
        mask = c.recv(4)
        data = b""
        while len(data) < n:
            chunk = c.recv(n - len(data))
            if not chunk:
                return
            data += chunk
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        reply = b"echo: " + data
        c.sendall(bytes([0x81, len(reply)]) + reply)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765))
s.listen()
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
