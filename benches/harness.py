#!/usr/bin/env python3
"""Support for benches/run: free ports, bulk API keys, a paced login stream,
the load generators wrk and h2load do not cover (TLS handshakes, idle
connections, WebSocket messages), one result line per run, and the summary
tables. Standard library only."""

import argparse
import array
import asyncio
import base64
import collections
import hashlib
import http.client
import json
import multiprocessing
import os
import re
import resource
import signal
import socket
import sqlite3
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid


def ports(args):
    """Prints `count` distinct free loopback ports."""
    held = []
    for _ in range(args.count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        held.append(s)
    print(" ".join(str(s.getsockname()[1]) for s in held))
    for s in held:
        s.close()


def keys(args):
    """Imports `count` API keys of one user straight into keygate's SQLite
    store, digests only, as `keygate apikey create` stores them. The values
    are "tb_" + pad + the index on 10 digits (keys.lua builds the same)."""
    db = sqlite3.connect(args.db, timeout=30)
    row = db.execute(
        "SELECT id, tenant_id FROM users WHERE email = ?", (args.email,)
    ).fetchone()
    if row is None:
        sys.exit(f"harness: no user {args.email} in {args.db}")
    user_id, tenant_id = row
    now = int(time.time() * 1000)
    start = args.start

    def rows():
        for i in range(start, start + args.count):
            value = f"tb_{args.pad}{i:010d}"
            digest = hashlib.sha256(value.encode()).hexdigest()
            yield (str(uuid.uuid4()), now, tenant_id, user_id, digest, "bench", 1, 0)

    with db:
        db.executemany(
            "INSERT INTO api_keys (id, created_time, tenant_id, user_id, digest, "
            "description, enabled, expiration_time) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows(),
        )
    db.close()


def logins(args):
    """Sends logins at a steady rate over HTTPS until SIGTERM, from a few
    threads (one keep-alive connection each), rotating over the users so no
    account's limiter is involved. Writes a JSON summary to `out`."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    context = ssl.create_default_context(cafile=args.ca)
    context.check_hostname = False
    lock = threading.Lock()
    stats = {"sent": 0, "ok": 0, "failed": 0, "latencies": [], "failures": []}
    slots = threading.Semaphore(0)
    users = args.users.split(",")

    def worker(n):
        conn = None
        while True:
            slots.acquire()
            if stop.is_set():
                return
            with lock:
                user = users[stats["sent"] % len(users)]
                stats["sent"] += 1
            body = json.dumps({"username": user, "password": args.password})
            started = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPSConnection(
                        "127.0.0.1", args.port, context=context, timeout=60
                    )
                conn.request(
                    "POST",
                    "/api/auth/login",
                    body,
                    {"Content-Type": "application/json"},
                )
                response = conn.getresponse()
                response.read()
                ok = response.status == 200
                reason = str(response.status)
            except Exception as error:  # noqa: BLE001 - reported, then retried
                if stop.is_set():
                    return
                ok, reason = False, type(error).__name__
                conn = None
            with lock:
                if ok:
                    stats["ok"] += 1
                    stats["latencies"].append(time.monotonic() - started)
                else:
                    stats["failed"] += 1
                    stats["failures"].append(reason)

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(args.workers)]
    for t in threads:
        t.start()
    started = time.monotonic()
    due = started
    issued = 0
    while not stop.is_set():
        due += 1.0 / args.rate
        pause = due - time.monotonic()
        if pause > 0:
            stop.wait(pause)
        slots.release()
        issued += 1
    elapsed = time.monotonic() - started
    with lock:
        latencies = sorted(stats["latencies"])
        summary = {
            "issued": issued,
            "sent": stats["sent"],
            "ok": stats["ok"],
            "failed": stats["failed"],
            "failures": sorted(set(stats["failures"])),
            "seconds": round(elapsed, 2),
            "rate": round(stats["ok"] / elapsed, 1) if elapsed else 0,
            "p50_ms": round(1000 * latencies[len(latencies) // 2], 1) if latencies else None,
        }
    with open(args.out, "w") as f:
        json.dump(summary, f)
    os._exit(0)


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def der_items(data):
    """The elements of a DER SEQUENCE's body, as (tag, value) pairs."""
    items = []
    while data:
        tag, length, i = data[0], data[1], 2
        if length & 0x80:
            n = length & 0x7F
            length, i = int.from_bytes(data[2 : 2 + n], "big"), 2 + n
        items.append((tag, data[i : i + length]))
        data = data[i + length :]
    return items


def idp(args):
    """A single sign-on provider of static files for the provider-token case:
    writes its discovery document and key set (the P-256 public key of
    `--key`) under `--dir`, and prints an access token it signed (ES256 with
    openssl) for `--email`, valid for a day."""
    kid = "bench-1"
    spki = subprocess.run(
        ["openssl", "ec", "-in", args.key, "-pubout", "-outform", "DER"],
        check=True, capture_output=True,
    ).stdout
    point = spki[-65:]  # the uncompressed point: 0x04, x, y
    assert point[0] == 4, "not an uncompressed P-256 point"
    os.makedirs(os.path.join(args.dir, ".well-known"), exist_ok=True)
    discovery = {
        "issuer": args.issuer,
        "authorization_endpoint": args.issuer + "/authorize",
        "token_endpoint": args.issuer + "/token",
        "jwks_uri": args.issuer + "/jwks.json",
        "code_challenge_methods_supported": ["S256"],
    }
    with open(os.path.join(args.dir, ".well-known", "openid-configuration"), "w") as f:
        json.dump(discovery, f)
    jwk = {"kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": kid,
           "x": b64url(point[1:33]), "y": b64url(point[33:])}
    with open(os.path.join(args.dir, "jwks.json"), "w") as f:
        json.dump({"keys": [jwk]}, f)
    now = int(time.time())
    header = {"alg": "ES256", "typ": "at+jwt", "kid": kid}
    claims = {"iss": args.issuer, "aud": args.audience, "sub": "bench", "email": args.email,
              "email_verified": True, "iat": now, "exp": now + 86400, "jti": str(uuid.uuid4())}
    signing_input = (b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())).encode()
    der = subprocess.run(
        ["openssl", "dgst", "-sha256", "-sign", args.key], input=signing_input,
        check=True, capture_output=True,
    ).stdout
    (_, body), = der_items(der)
    r, s_ = (v.lstrip(b"\0").rjust(32, b"\0") for _, v in der_items(body))
    print(signing_input.decode() + "." + b64url(r + s_))


# --- load generators of their own: TLS handshakes, idle connections, WebSocket


def target(url):
    """Host, port, request target and Host header of an http(s)/ws(s) URL."""
    u = urllib.parse.urlsplit(url)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    return u.hostname, u.port or 443, path, u.netloc


def client_context(ca):
    """TLS 1.3 only, the peer verified against the harness's CA as localhost."""
    context = ssl.create_default_context(cafile=ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    return context


def request_head(method, path, netloc, headers):
    lines = [f"{method} {path} HTTP/1.1", f"Host: {netloc}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def parse_head(head):
    """Status, Content-Length (or None) and whether the body is chunked."""
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length, chunked = None, False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding" and "chunked" in value:
            chunked = True
    return status, length, chunked


def body_done(body, length, chunked):
    if length is not None:
        return len(body) >= length
    if chunked:
        return body.endswith(b"0\r\n\r\n")
    return False


def read_response(sock):
    """Reads one response whole from a blocking socket; its status."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError("closed before the response head")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, length, chunked = parse_head(head)
    while not body_done(body, length, chunked):
        chunk = sock.recv(65536)
        if not chunk:
            if length is None and not chunked:
                break
            raise EOFError("closed before the end of the body")
        body += chunk
    return status


async def read_response_async(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status, length, chunked = parse_head(head[:-4])
    if length is not None:
        await reader.readexactly(length)
    elif chunked:
        body = b""
        while not body.endswith(b"0\r\n\r\n"):
            body += await reader.readuntil(b"\r\n")
    return status


def percentiles(latencies_us):
    """p50, p90, p99 and max of a list of microseconds (0 when empty)."""
    values = sorted(latencies_us)
    if not values:
        return {"p50_us": 0, "p90_us": 0, "p99_us": 0, "max_us": 0}

    def at(q):
        return int(values[min(len(values) - 1, int(q * len(values)))])

    return {"p50_us": at(0.50), "p90_us": at(0.90), "p99_us": at(0.99), "max_us": int(values[-1])}


def errors_zero():
    return {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0}


def merge_counts(parts, names):
    return {name: sum(p[name] for p in parts) for name in names}


def print_result(result):
    print("RESULT " + json.dumps(result), flush=True)


def raise_nofile():
    """The soft limit on descriptors up to the hard one."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def one_connection(context, host, port, request, session):
    """Connect, handshake (resuming `session` when given), one request, its
    whole response: (status, the connection's session, whether it resumed)."""
    with socket.create_connection((host, port), timeout=10) as raw:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with context.wrap_socket(raw, server_hostname="localhost", session=session) as tls:
            tls.sendall(request)
            status = read_response(tls)
            # Taken after the response: the TLS 1.3 tickets came before it.
            return status, tls.session, tls.session_reused


def handshake_worker(job):
    """One process of `handshakes`: new connections back to back until the
    deadline, each one request with `Connection: close`."""
    url, ca, headers, resume, clients, start, duration = job
    host, port, path, netloc = target(url)
    context = client_context(ca)
    request = request_head("GET", path, netloc, [*headers, "Connection: close"])
    counts = dict(errors_zero(), ok=0, resumed=0, connections=0)
    latencies = array.array("q")
    # With --resume, `clients` devices each resuming its own session, in
    # turn: a fleet reconnecting, which a server's session cache must hold
    # (or its tickets serve). Each has its session before the clock starts.
    sessions = [None] * clients
    if resume:
        for i in range(clients):
            try:
                sessions[i] = one_connection(context, host, port, request, None)[1]
            except (OSError, EOFError, ValueError, IndexError, ssl.SSLError):
                pass
    time.sleep(max(0.0, start - time.time()))
    deadline = start + duration
    turn = 0
    while time.time() < deadline:
        began = time.perf_counter()
        counts["connections"] += 1
        turn = (turn + 1) % clients
        session = sessions[turn]
        try:
            status, new_session, reused = one_connection(context, host, port, request, session)
        except (socket.timeout, TimeoutError):
            counts["timeout"] += 1
            continue
        except (ConnectionRefusedError, ssl.SSLError):
            counts["connect"] += 1
            continue
        except (OSError, EOFError, ValueError, IndexError):
            counts["read"] += 1
            continue
        if status != 200:
            counts["status"] += 1
            continue
        counts["ok"] += 1
        counts["resumed"] += int(reused)
        latencies.append(int((time.perf_counter() - began) * 1e6))
        if resume:
            sessions[turn] = new_session
    counts["end"] = time.time()
    counts["latencies"] = latencies.tobytes()
    return counts


def handshakes(args):
    """Full (or, with --resume, resumed) TLS 1.3 handshakes: N processes,
    each connecting, sending one request, reading its answer and closing,
    over and over for the duration. Prints a RESULT line like wrk's, plus
    how many connections resumed."""
    clients = args.clients if args.resume else 1
    # Room for each process to give its clients their first sessions.
    start = time.time() + 0.3 + (0.01 * clients if args.resume else 0)
    job = (args.url, args.ca, args.header or [], args.resume, clients, start, args.duration)
    with multiprocessing.Pool(args.workers) as pool:
        parts = pool.map(handshake_worker, [job] * args.workers)
    latencies = array.array("q")
    for part in parts:
        latencies.frombytes(part["latencies"])
    counts = merge_counts(parts, [*errors_zero(), "ok", "resumed", "connections"])
    result = {
        "requests": counts.pop("ok"),
        "duration_us": int((max(p["end"] for p in parts) - start) * 1e6),
        **counts,
        **percentiles(latencies),
    }
    print_result(result)


async def open_idle(url, ca, headers, count, concurrency):
    """`count` TLS keep-alive connections, one request answered on each:
    the connections held, the counts, the latencies (connect to response)."""
    host, port, path, netloc = target(url)
    context = client_context(ca)
    request = request_head("GET", path, netloc, headers)
    counts, latencies, held = errors_zero(), [], []
    gate = asyncio.Semaphore(concurrency)

    async def one():
        async with gate:
            began = time.perf_counter()
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, ssl=context, server_hostname="localhost"), 30
                )
            except (asyncio.TimeoutError, OSError, ssl.SSLError):
                counts["connect"] += 1
                return
            try:
                writer.write(request)
                status = await asyncio.wait_for(read_response_async(reader), 30)
            except asyncio.TimeoutError:
                status = "timeout"
            except (OSError, ssl.SSLError, asyncio.IncompleteReadError, ValueError, IndexError):
                status = "read"
            if status != 200:
                counts[status if isinstance(status, str) else "status"] += 1
                writer.transport.abort()
                return
            latencies.append(int((time.perf_counter() - began) * 1e6))
            held.append((reader, writer))

    await asyncio.gather(*(one() for _ in range(count)))
    return held, counts, latencies


def idle_worker(url, ca, headers, count, queue, stop):
    """One process of `idle`: opens its share, reports, holds the connections
    until `stop` (or its parent is gone), then counts those the proxy closed
    meanwhile and closes the rest."""
    parent = os.getppid()

    async def run():
        held, counts, latencies = await open_idle(url, ca, headers, count, 64)
        queue.put(("open", dict(counts, ok=len(held), latencies=latencies)))
        loop = asyncio.get_running_loop()
        while not await loop.run_in_executor(None, stop.wait, 1.0):
            if os.getppid() != parent:
                break
        dropped = sum(
            1 for reader, writer in held
            if reader.at_eof() or reader.exception() is not None or writer.is_closing()
        )
        for _, writer in held:
            writer.transport.abort()
        queue.put(("closed", dropped))

    raise_nofile()
    asyncio.run(run())


def idle(args):
    """Opens `connections` TLS keep-alive connections (N processes), one
    request on each; 2 s after the last answer, writes `--ready` (the counts
    so far) and holds them idle until SIGTERM; then closes them and prints a
    RESULT line: the connections opened and held, failures, the latency of
    the one request (connect included), and how many the proxy closed while
    they were held (`dropped`)."""
    raise_nofile()
    context = multiprocessing.get_context("fork")
    queue, stop = context.Queue(), context.Event()
    shares = [args.connections // args.workers + (i < args.connections % args.workers) for i in range(args.workers)]
    procs = [
        context.Process(target=idle_worker, args=(args.url, args.ca, args.header or [], n, queue, stop), daemon=True)
        for n in shares
    ]
    began = time.perf_counter()
    for proc in procs:
        proc.start()
    # Until SIGTERM, then the connections are closed and counted.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    opened = [queue.get(timeout=300)[1] for _ in procs]
    open_us = int((time.perf_counter() - began) * 1e6)
    time.sleep(2)
    latencies = [v for part in opened for v in part["latencies"]]
    counts = merge_counts(opened, [*errors_zero(), "ok"])
    with open(args.ready, "w") as f:
        json.dump({"opened": counts["ok"], "open_us": open_us}, f)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    stop.set()
    dropped = sum(queue.get(timeout=60)[1] for _ in procs)
    for proc in procs:
        proc.join(10)
    result = {"requests": counts.pop("ok"), "duration_us": open_us, **counts, **percentiles(latencies),
              "asked": args.connections, "dropped": dropped}
    print_result(result)


def ws_frame(opcode, payload, mask):
    """A masked client frame (payload below 64 KiB)."""
    length = len(payload)
    head = bytes([0x80 | opcode]) + (bytes([0x80 | length]) if length < 126 else bytes([0xFE]) + length.to_bytes(2, "big"))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class Relay(asyncio.Protocol):
    """One WebSocket: the upgrade, then `inflight` binary messages kept in
    flight, each echo answered by the next message. Server frames are parsed
    only as far as counting whole messages and checking their length."""

    def __init__(self, request, frame, size, inflight, stats):
        self.request, self.frame, self.size, self.inflight, self.stats = request, frame, size, inflight, stats
        self.buffer = bytearray()
        self.upgraded = asyncio.get_running_loop().create_future()
        self.sent = collections.deque()
        self.running = False
        self.finished = False
        self.message = 0
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        transport.write(self.request)

    def connection_lost(self, exc):
        if not self.upgraded.done():
            self.stats["connect"] += 1
            self.upgraded.set_result(False)
        elif not self.finished:
            # Closed by the other side while it had messages to relay.
            self.stats["read"] += 1
            self.finished = True
            self.running = False

    def fail(self, kind):
        self.stats[kind] += 1
        self.running = False
        self.finished = True
        if not self.upgraded.done():
            self.upgraded.set_result(False)
        self.transport.abort()

    def data_received(self, data):
        self.buffer += data
        if not self.upgraded.done():
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            if self.buffer[9:12] != b"101":
                return self.fail("status")
            del self.buffer[: end + 4]
            self.upgraded.set_result(True)
        self.frames()

    def go(self):
        self.running = True
        now = time.perf_counter()
        self.sent.extend([now] * self.inflight)
        self.transport.write(self.frame * self.inflight)

    def frames(self):
        buffer, echoed, now = self.buffer, 0, time.perf_counter()
        while len(buffer) >= 2:
            opcode, length, at = buffer[0] & 0x0F, buffer[1] & 0x7F, 2
            if length == 126:
                length, at = int.from_bytes(buffer[2:4], "big"), 4
            elif length == 127:
                length, at = int.from_bytes(buffer[2:10], "big"), 10
            if len(buffer) < at + length:
                break
            fin = buffer[0] & 0x80
            del buffer[: at + length]
            if opcode == 8:
                return None if self.finished else self.fail("read")
            if opcode not in (0, 2):
                continue  # a ping or a pong
            self.message += length
            if not fin:
                continue
            if self.message != self.size or not self.sent:
                return self.fail("read")
            self.message = 0
            began = self.sent.popleft()
            if self.running:
                self.stats["messages"] += 1
                self.stats["latencies"].append(int((now - began) * 1e6))
                echoed += 1
        if echoed and self.running:
            self.sent.extend([now] * echoed)
            self.transport.write(self.frame * echoed)

    def finish(self, close_frame):
        if not self.finished:
            self.finished = True
            self.running = False
            self.transport.write(close_frame)
            self.transport.close()


async def ws_run(url, ca, headers, sockets, inflight, size, duration, barrier):
    host, port, path, netloc = target(url)
    context = client_context(ca)
    key = base64.b64encode(os.urandom(16)).decode()
    request = request_head("GET", path, netloc, [
        *headers, "Upgrade: websocket", "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13",
    ])
    mask = os.urandom(4)
    frame = ws_frame(2, os.urandom(size), mask)
    close_frame = ws_frame(8, (1000).to_bytes(2, "big"), mask)
    stats = dict(errors_zero(), messages=0, latencies=array.array("q"))
    loop = asyncio.get_running_loop()
    relays = []
    for _ in range(sockets):
        try:
            _, relay = await loop.create_connection(
                lambda: Relay(request, frame, size, inflight, stats), host, port,
                ssl=context, server_hostname="localhost",
            )
            relays.append(relay)
        except (OSError, ssl.SSLError):
            stats["connect"] += 1
    if relays:
        await asyncio.wait([r.upgraded for r in relays], timeout=30)
    for relay in relays:
        if not relay.upgraded.done():
            relay.fail("timeout")
    relays = [r for r in relays if r.upgraded.result()]
    await loop.run_in_executor(None, barrier.wait, 60)
    began = time.perf_counter()
    for relay in relays:
        relay.go()
    await asyncio.sleep(duration)
    stats["elapsed"] = time.perf_counter() - began
    for relay in relays:
        relay.finish(close_frame)
    await asyncio.sleep(0.1)
    stats["latencies"] = stats["latencies"].tobytes()
    return stats


def ws_worker(job, barrier, queue):
    queue.put(asyncio.run(ws_run(*job, barrier)))


def websocket(args):
    """Binary messages relayed both ways over `workers` x `sockets`
    WebSockets, `inflight` in flight on each: every echoed message counts
    once. Prints a RESULT line: messages as requests, round-trip latencies,
    failed upgrades (status), sockets that failed to connect (connect) or
    closed or carried a wrong message during the run (read)."""
    context = multiprocessing.get_context("fork")
    barrier, queue = context.Barrier(args.workers), context.Queue()
    job = (args.url, args.ca, args.header or [], args.sockets, args.inflight, args.size, args.duration)
    procs = [context.Process(target=ws_worker, args=(job, barrier, queue), daemon=True) for _ in range(args.workers)]
    for proc in procs:
        proc.start()
    parts = [queue.get(timeout=args.duration + 120) for _ in procs]
    for proc in procs:
        proc.join(10)
    latencies = array.array("q")
    for part in parts:
        latencies.frombytes(part["latencies"])
    counts = merge_counts(parts, [*errors_zero(), "messages"])
    result = {
        "requests": counts.pop("messages"),
        "duration_us": int(max(p["elapsed"] for p in parts) * 1e6),
        **counts,
        **percentiles(latencies),
        "sockets": args.workers * args.sockets,
    }
    print_result(result)


def h2result(args):
    """h2load's summary and per-request log as a RESULT line: answers with a
    2xx status are the requests; any other status is an error (status), and
    so is a request that failed below HTTP (errored: read, or timeout)."""
    text = open(args.summary).read()

    def number(pattern):
        found = re.search(pattern, text)
        if not found:
            sys.exit(f"harness: no '{pattern}' in h2load's output {args.summary}")
        return float(found.group(1))

    seconds = number(r"finished in ([\d.]+)s")
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text)
    ok, *others = (int(v) for v in codes.groups())
    errored, timeout = int(number(r"(\d+) errored")), int(number(r"(\d+) timeout"))
    protocol = re.search(r"Application protocol: (\S+)", text)
    latencies = []
    with open(args.log) as f:
        for line in f:
            fields = line.split("\t")
            if len(fields) >= 3:
                latencies.append(int(fields[2]))
    result = dict(errors_zero(), requests=ok, duration_us=int(seconds * 1e6), status=sum(others),
                  read=errored - timeout, timeout=timeout, protocol=protocol.group(1) if protocol else None)
    result.update(percentiles(latencies))
    print_result(result)


def result_line(path):
    """The last RESULT line of a load generator's output."""
    result = None
    with open(path) as f:
        for line in f:
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
    if result is None:
        sys.exit(f"harness: no RESULT line in {path}")
    return result


def record(args):
    """Joins a load generator's RESULT line (wrk's, or one of the harness's
    own) with what benches/run measured around it."""
    result = result_line(args.wrk)
    result.update(
        case=args.case,
        round=args.round,
        proxy=args.proxy,
        cpu_ticks=args.cpu_ticks,
        upstream_cpu_ticks=args.upstream_cpu_ticks,
        clk_tck=args.clk_tck,
        rss_kib=args.rss_kib,
        cache_misses=args.cache_misses,
        redis_up=args.redis_up,
    )
    if args.logins:
        with open(args.logins) as f:
            result["logins"] = json.load(f)
    if args.idle:
        # The idle connections held while wrk ran, and the proxy's resident
        # memory before they were opened and once they were all idle.
        result.update(idle=result_line(args.idle), rss_before_kib=args.rss_before_kib,
                      rss_after_kib=args.rss_after_kib)
    with open(args.out, "a") as f:
        f.write(json.dumps(result) + "\n")


# The cases in the order of the table, with the case each is compared with.
LABELS = {
    "direct": "upstream direct (no proxy)",
    "nginx-plain": "nginx proxy_pass, plain HTTP",
    "nginx-https": "nginx proxy_pass, HTTPS",
    "keygate-apikey": "keygate HTTPS + API key",
    "keygate-scoped": "keygate HTTPS + scoped API key (4 grants)",
    "keygate-quota": "keygate HTTPS + API key, quota far above the load",
    "keygate-jwt": "keygate HTTPS + Bearer JWT",
    "keygate-provider-token": "keygate HTTPS + a single sign-on provider's access token",
    "keygate-assertion": "keygate HTTPS + API key, identity as a signed assertion",
    "keygate-assertion-fresh": "keygate HTTPS + API key, a fresh assertion per request",
    "keygate-platform": "keygate HTTPS + API key, identity as the platform's token",
    "keygate-public": "keygate plain HTTP, public route",
    "keygate-entity": "keygate HTTPS + API key, entity service",
    "keygate-1key": "keygate HTTPS, 1 key via lua",
    "keygate-rotation": "keygate HTTPS, N keys in rotation via lua",
    "keygate-logins": "keygate HTTPS + API key, logins running",
    "nginx-https-post": "nginx proxy_pass, HTTPS, 1 KiB POST",
    "keygate-apikey-post": "keygate HTTPS + API key, 1 KiB POST",
    "nginx-https-upstream": "nginx proxy_pass https:// (upstream verified)",
    "keygate-https-upstream": "keygate HTTPS + API key, https:// upstream",
    "c1-direct": "1 connection: upstream direct",
    "c1-nginx-https": "1 connection: nginx HTTPS",
    "c1-keygate-apikey": "1 connection: keygate HTTPS + API key",
    "pingap-apikey": "pingap HTTPS + key_auth plugin",
    "haproxy-apikey": "HAProxy HTTPS + API key (ACL)",
    # The other axes: their own table (`AXES`), not the one above.
    "nginx-handshake": "nginx, a full TLS 1.3 handshake per request",
    "haproxy-handshake": "HAProxy, a full TLS 1.3 handshake per request",
    "keygate-handshake": "keygate + API key, a full TLS 1.3 handshake per request",
    "nginx-resume": "nginx, a resumed TLS 1.3 handshake per request",
    "haproxy-resume": "HAProxy, a resumed TLS 1.3 handshake per request",
    "keygate-resume": "keygate + API key, a resumed TLS 1.3 handshake per request",
    "nginx-h2": "nginx HTTP/2",
    "haproxy-h2": "HAProxy HTTP/2 + API key",
    "keygate-h2": "keygate HTTP/2 + API key",
    "nginx-download": "nginx, 1 MiB responses",
    "haproxy-download": "HAProxy + API key, 1 MiB responses",
    "keygate-download": "keygate + API key, 1 MiB responses",
    "nginx-upload": "nginx, 1 MiB request bodies",
    "haproxy-upload": "HAProxy + API key, 1 MiB request bodies",
    "keygate-upload": "keygate + API key, 1 MiB request bodies",
    "nginx-idle": "nginx, N idle connections held",
    "haproxy-idle": "HAProxy + API key, N idle connections held",
    "keygate-idle": "keygate + API key, N idle connections held",
    "nginx-ws": "nginx, WebSocket 1 KiB echo",
    "keygate-ws": "keygate + JWT, WebSocket 1 KiB echo",
}

# The second table: one axis per row group, each in its own unit. A case's
# CPU per request is per unit here (a handshake, a MiB: every request of the
# body cases moves 1 MiB, a message); keygate is compared with the nginx case
# and the HAProxy case of its axis (the last of each in the list).
AXES = [
    # (axis, throughput unit, CPU unit, CPU µs per request to that unit, cases)
    ("API key", "req/s", "µs/req", 1, ["nginx-plain", "nginx-https", "haproxy-apikey", "keygate-apikey"]),
    ("full handshake", "handshakes/s", "µs/handshake", 1,
     ["nginx-handshake", "haproxy-handshake", "keygate-handshake"]),
    ("resumed handshake", "handshakes/s", "µs/handshake", 1, ["nginx-resume", "haproxy-resume", "keygate-resume"]),
    ("HTTP/2", "req/s", "µs/req", 1, ["nginx-h2", "haproxy-h2", "keygate-h2"]),
    ("1 MiB download", "MiB/s", "ms/MiB", 1e-3, ["nginx-download", "haproxy-download", "keygate-download"]),
    ("1 MiB upload", "MiB/s", "ms/MiB", 1e-3, ["nginx-upload", "haproxy-upload", "keygate-upload"]),
    ("idle connections held", "req/s", "µs/req", 1, ["nginx-idle", "haproxy-idle", "keygate-idle"]),
    ("WebSocket", "messages/s", "µs/message", 1, ["nginx-ws", "keygate-ws"]),
]
AXIS_ONLY = {case for _, _, _, _, cases in AXES[1:] for case in cases}


def errors_of(r):
    """Failed requests of one run, with the idle connections that failed or
    were closed by the proxy while held."""
    n = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
    idle = r.get("idle")
    if idle:
        n += idle["connect"] + idle["read"] + idle["write"] + idle["status"] + idle["timeout"] + idle["dropped"]
    return n


def summarize(rows):
    """Median over rounds of each measure, per case."""
    cases = {}
    for r in rows:
        cases.setdefault(r["case"], []).append(r)
    out = {}
    for case, runs in cases.items():
        rps = [r["requests"] * 1e6 / r["duration_us"] if r["duration_us"] else 0 for r in runs]
        cpu = [
            r["cpu_ticks"] * 1e6 / r["clk_tck"] / r["requests"]
            for r in runs
            if r["requests"] and r["cpu_ticks"] is not None
        ]
        up = [
            r["upstream_cpu_ticks"] * 1e6 / r["clk_tck"] / r["requests"]
            for r in runs
            if r["requests"] and r["upstream_cpu_ticks"] is not None
        ]
        errors = sum(errors_of(r) for r in runs)
        logins = [r["logins"] for r in runs if "logins" in r]
        # Memory per idle connection from the first round only: nginx and
        # HAProxy keep what the connections freed for the next ones, so in
        # later rounds their resident memory hardly grows (keygate's does).
        idle_kib = [
            (r["rss_after_kib"] - r["rss_before_kib"]) / r["idle"]["requests"]
            for r in sorted(runs, key=lambda r: r["round"])
            if r.get("idle") and r["idle"]["requests"] and r.get("rss_after_kib") is not None
        ][:1]
        out[case] = {
            "rounds": len(runs),
            "rps": statistics.median(rps),
            "rps_min": min(rps),
            "rps_max": max(rps),
            "p50": statistics.median(r["p50_us"] for r in runs),
            "p99": statistics.median(r["p99_us"] for r in runs),
            "errors": errors,
            "cpu": statistics.median(cpu) if cpu else None,
            "upstream_cpu": statistics.median(up) if up else None,
            "rss": max((r["rss_kib"] or 0) for r in runs),
            "misses": sum((r.get("cache_misses") or 0) for r in runs),
            "logins": logins,
            "idle_kib": idle_kib[0] if idle_kib else None,
            "idle_held": min((r["idle"]["requests"] for r in runs if r.get("idle")), default=None),
            "resumed": sum(r.get("resumed", 0) for r in runs) / max(1, sum(r["requests"] for r in runs)),
        }
    return out


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "–"


def table(args):
    rows = [json.loads(line) for line in open(args.results) if line.strip()]
    s = summarize(rows)
    meta = json.load(open(args.meta)) if args.meta else {}
    plain, https = s.get("nginx-plain"), s.get("nginx-https")
    print(
        "| case | req/s (median, min–max) | p50 µs | p99 µs | errors | proxy CPU µs/req "
        "| upstream CPU µs/req | RSS MiB | req/s vs nginx plain | vs nginx HTTPS "
        "| CPU/req vs nginx HTTPS | p99 vs nginx HTTPS |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case, label in LABELS.items():
        c = s.get(case)
        if c is None or case in AXIS_ONLY:
            continue
        if case == "keygate-rotation":
            label = label.replace("N keys", f"{meta.get('keys', '?'):,} keys")
        cpu = f"{c['cpu']:.1f}" if c["cpu"] is not None else "–"
        up = f"{c['upstream_cpu']:.1f}" if c["upstream_cpu"] is not None else "–"
        rss = f"{c['rss'] / 1024:.1f}" if c["rss"] else "–"
        proxied = case not in ("direct", "c1-direct")
        ref_https = s.get("c1-nginx-https") if case.startswith("c1-") else https
        ref_plain = None if case.startswith("c1-") else plain
        print(
            f"| {label} | {c['rps']:,.0f} ({c['rps_min']:,.0f}–{c['rps_max']:,.0f}) "
            f"| {c['p50']:,.0f} | {c['p99']:,.0f} | {c['errors']} | {cpu} | {up} | {rss} "
            f"| {ratio(c['rps'], ref_plain['rps']) if proxied and ref_plain else '–'} "
            f"| {ratio(c['rps'], ref_https['rps']) if proxied and ref_https else '–'} "
            f"| {ratio(c['cpu'], ref_https['cpu']) if proxied and ref_https else '–'} "
            f"| {ratio(c['p99'], ref_https['p99']) if proxied and ref_https else '–'} |"
        )
    print()
    lines = []
    if "c1-direct" in s:
        direct = s["c1-direct"]["p50"]
        for case in ("c1-nginx-https", "c1-keygate-apikey"):
            if case in s:
                lines.append(f"- one connection, p50 added over direct: {LABELS[case][14:]} "
                             f"{s[case]['p50'] - direct:+,.0f} µs")
    if "keygate-apikey" in s:
        k = s["keygate-apikey"]
        peers = [("nginx HTTPS", https), ("nginx plain", plain), ("HAProxy", s.get("haproxy-apikey")),
                 ("pingap", s.get("pingap-apikey"))]
        lines.append(
            "- keygate HTTPS + API key vs "
            + ", ".join(
                f"{name}: {ratio(k['rps'], p['rps'])} req/s, {ratio(k['cpu'], p['cpu'])} CPU/req"
                for name, p in peers
                if p
            )
        )
    if "keygate-apikey-post" in s and "nginx-https-post" in s:
        k, n = s["keygate-apikey-post"], s["nginx-https-post"]
        lines.append(
            f"- 1 KiB POST, keygate HTTPS + API key vs nginx HTTPS: {ratio(k['rps'], n['rps'])} req/s, "
            f"{ratio(k['cpu'], n['cpu'])} CPU/req"
        )
    if all(c in s for c in ("keygate-https-upstream", "keygate-apikey", "nginx-https-upstream", "nginx-https")):
        k, kp = s["keygate-https-upstream"], s["keygate-apikey"]
        n, np_ = s["nginx-https-upstream"], s["nginx-https"]
        lines.append(
            f"- HTTPS to the upstream against plain HTTP to it: keygate {ratio(k['rps'], kp['rps'])} req/s, "
            f"{ratio(k['cpu'], kp['cpu'])} CPU/req; nginx {ratio(n['rps'], np_['rps'])} req/s, "
            f"{ratio(n['cpu'], np_['cpu'])} CPU/req; keygate vs nginx, both with an HTTPS upstream: "
            f"{ratio(k['rps'], n['rps'])} req/s, {ratio(k['cpu'], n['cpu'])} CPU/req"
        )
    if "keygate-provider-token" in s and "keygate-jwt" in s:
        k, j = s["keygate-provider-token"], s["keygate-jwt"]
        lines.append(
            f"- a provider's access token (its key set cached) vs keygate's own JWT: "
            f"{ratio(k['rps'], j['rps'])} req/s, {ratio(k['cpu'], j['cpu'])} CPU/req"
        )
    if "keygate-rotation" in s and "keygate-1key" in s:
        lines.append(
            f"- {meta.get('keys', '?'):,} keys in rotation vs one key: "
            f"{ratio(s['keygate-rotation']['rps'], s['keygate-1key']['rps'])} req/s "
            f"(api_keys cache misses during the measured rotation runs: "
            f"{s['keygate-rotation']['misses']})"
        )
    if "keygate-logins" in s and "keygate-apikey" in s:
        logins = s["keygate-logins"]["logins"]
        rate = statistics.median(l["rate"] for l in logins) if logins else 0
        failed = sum(l["failed"] for l in logins)
        p50s = [l["p50_ms"] for l in logins if l.get("p50_ms") is not None]
        p50 = f", p50 {statistics.median(p50s):,.0f} ms" if p50s else ""
        lines.append(
            f"- with logins running (asked {meta.get('login_rate', '?')}/s, "
            f"answered {rate:.1f}/s{p50}, {failed} failed): "
            f"{ratio(s['keygate-logins']['rps'], s['keygate-apikey']['rps'])} of the API-key req/s"
        )
    if "keygate-quota" in s and "keygate-apikey" in s:
        lines.append(
            f"- API key with a quota far above the load (shared through Redis) vs without: "
            f"{ratio(s['keygate-quota']['rps'], s['keygate-apikey']['rps'])} req/s, "
            f"{ratio(s['keygate-quota']['cpu'], s['keygate-apikey']['cpu'])} CPU/req"
        )
    if "keygate-scoped" in s and "keygate-apikey" in s:
        lines.append(
            f"- scoped API key (4 grants) vs unscoped: "
            f"{ratio(s['keygate-scoped']['rps'], s['keygate-apikey']['rps'])} req/s"
        )
    if "keygate-jwt" in s and "keygate-apikey" in s:
        lines.append(
            f"- Bearer JWT vs API key: {ratio(s['keygate-jwt']['rps'], s['keygate-apikey']['rps'])} req/s"
        )
    for case, what in (("keygate-assertion", "a signed assertion"), ("keygate-platform", "the platform's token")):
        if case in s and "keygate-apikey" in s:
            lines.append(
                f"- identity as {what} vs headers (API key): "
                f"{ratio(s[case]['rps'], s['keygate-apikey']['rps'])} req/s, "
                f"{ratio(s[case]['cpu'], s['keygate-apikey']['cpu'])} CPU/req"
            )
    if "keygate-assertion-fresh" in s and "keygate-assertion" in s:
        lines.append(
            f"- a fresh assertion per request (assertion.reuse = false) vs one reused: "
            f"{ratio(s['keygate-assertion-fresh']['rps'], s['keygate-assertion']['rps'])} req/s, "
            f"{ratio(s['keygate-assertion-fresh']['cpu'], s['keygate-assertion']['cpu'])} CPU/req"
        )
    for name in ("rss_idle_kib", "rss_million_kib"):
        if meta.get(name):
            what = "idle" if name == "rss_idle_kib" else f"with {meta.get('million_keys', 0):,} cached keys"
            lines.append(f"- keygate resident memory {what}: {meta[name] / 1024:.1f} MiB")
    print("\n".join(lines))
    axes_table(s, meta)


def amount(value):
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def axes_table(s, meta):
    """The second table: each axis in its unit, keygate against the nginx and
    the HAProxy case of the same axis."""
    if not any(case in s for *_, cases in AXES for case in cases if case in AXIS_ONLY or case == "haproxy-apikey"):
        return
    print(
        "\n| axis | case | throughput (median, min–max) | p99 µs | errors | proxy CPU per unit "
        "| RSS MiB / KiB per idle connection | keygate vs nginx: throughput | CPU/unit "
        "| keygate vs HAProxy: throughput | CPU/unit |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    notes = []
    for axis, unit, cpu_unit, scale, cases in AXES:
        refs = {peer: next((s[c] for c in reversed(cases) if c.startswith(peer + "-") and c in s), None)
                for peer in ("nginx", "haproxy")}
        for case in cases:
            c = s.get(case)
            if c is None:
                continue
            label = LABELS[case].replace("N idle", f"{c['idle_held'] or 0:,} idle")
            cpu = f"{c['cpu'] * scale:,.2f} {cpu_unit}" if c["cpu"] is not None else "–"
            if c["idle_kib"] is not None:
                memory = f"{c['idle_kib']:,.1f} KiB/conn"
            else:
                memory = f"{c['rss'] / 1024:.1f} MiB" if c["rss"] else "–"
            cells = ["–"] * 4
            if case.startswith("keygate-"):
                for i, peer in enumerate(("nginx", "haproxy")):
                    ref = refs[peer]
                    if ref:
                        cells[2 * i] = ratio(c["rps"], ref["rps"])
                        cells[2 * i + 1] = ratio(c["cpu"], ref["cpu"])
            print(
                f"| {axis} | {label} | {amount(c['rps'])} ({amount(c['rps_min'])}–{amount(c['rps_max'])}) {unit} "
                f"| {c['p99']:,.0f} | {c['errors']} | {cpu} | {memory} | " + " | ".join(cells) + " |"
            )
        notes += axis_notes(axis, cases, s)
    print()
    print("\n".join(notes))


def axis_notes(axis, cases, s):
    """What a row of the axes table leaves out: the share of handshakes
    resumed, and memory per idle connection against the peers."""
    notes = []
    present = [c for c in cases if c in s]
    if axis.endswith("handshake") and present:
        notes.append(
            f"- connections resumed, {axis} cases: "
            + ", ".join(f"{c.split('-')[0]} {100 * s[c]['resumed']:.1f}%" for c in present)
        )
    if axis.startswith("idle") and "keygate-idle" in s:
        k = s["keygate-idle"]["idle_kib"]
        peers = [(name, s[c]["idle_kib"]) for name, c in (("nginx", "nginx-idle"), ("HAProxy", "haproxy-idle"))
                 if c in s and s[c]["idle_kib"]]
        if k is not None and peers:
            notes.append(
                "- resident memory per idle TLS connection, keygate vs "
                + ", ".join(f"{name}: {ratio(k, v)} ({k:,.1f} against {v:,.1f} KiB)" for name, v in peers)
            )
    return notes


def not_as_described(r):
    """Why a run did not measure what its case describes, or None."""
    if not r["requests"]:
        return "no request was answered"
    if "logins" in r and not r["logins"].get("ok"):
        return "no login was answered"
    if r["proxy"].startswith("keygate") and r.get("cache_misses"):
        # Every key of every case was looked up before the rounds (warm-up).
        return f"{r['cache_misses']} api_keys cache misses: the cache was not warm"
    if r["case"] == "keygate-quota" and r.get("redis_up") != 1:
        return "keygate_redis_up was not 1: the quota was counted locally, not through Redis"
    return not_as_described_axis(r)


def not_as_described_axis(r):
    """The same for the cases of the axes table: handshakes resumed as the
    case says, HTTP/2 spoken, every idle connection opened and held."""
    case = r["case"]
    if case.endswith("-resume") and r.get("resumed", 0) < 0.9 * r["requests"]:
        return f"only {r.get('resumed', 0)} of {r['requests']} connections resumed (90% required)"
    if case.endswith("-handshake") and r.get("resumed"):
        return f"{r['resumed']} connections resumed in a full-handshake case"
    if case.endswith("-h2") and r.get("protocol") != "h2":
        return f"h2load spoke {r.get('protocol')}, not h2"
    idle = r.get("idle")
    if case.endswith("-idle") and (not idle or idle["requests"] < idle["asked"]):
        return f"{idle['requests'] if idle else 0} idle connections opened of {idle['asked'] if idle else '?'}"
    return None


def failures(args):
    """Exit status: 1 when any request of any run failed, or any run did not
    run as its case describes."""
    rows = [json.loads(line) for line in open(args.results) if line.strip()]
    failed = 0
    for r in rows:
        n = errors_of(r)
        n += r.get("logins", {}).get("failed", 0)
        if n:
            print(f"harness: {r['case']} round {r['round']}: {n} failed requests", file=sys.stderr)
        failed += n
        why = not_as_described(r)
        if why:
            print(f"harness: {r['case']} round {r['round']}: {why}", file=sys.stderr)
            failed += 1
    sys.exit(1 if failed else 0)


def add_target(p):
    """The options every load generator of the harness's own takes."""
    p.add_argument("--url", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("-H", "--header", action="append", help="a request header, as curl's -H")
    p.add_argument("--workers", type=int, default=2, help="processes")
    p.add_argument("--duration", type=float, default=8)


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(required=True)
    p = sub.add_parser("ports")
    p.add_argument("count", type=int)
    p.set_defaults(run=ports)
    p = sub.add_parser("keys")
    p.add_argument("--db", required=True)
    p.add_argument("--email", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--pad", required=True)
    p.set_defaults(run=keys)
    p = sub.add_parser("logins")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--users", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--out", required=True)
    p.set_defaults(run=logins)
    p = sub.add_parser("idp")
    for name in ("key", "dir", "issuer", "audience", "email"):
        p.add_argument(f"--{name}", required=True)
    p.set_defaults(run=idp)
    p = sub.add_parser("record")
    for name in ("wrk", "case", "out", "proxy"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--round", type=int, required=True)
    p.add_argument("--clk-tck", type=int, required=True)
    for name in ("cpu-ticks", "upstream-cpu-ticks", "rss-kib", "cache-misses", "redis-up",
                 "rss-before-kib", "rss-after-kib"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--logins")
    p.add_argument("--idle")
    p.set_defaults(run=record)
    p = sub.add_parser("handshakes")
    add_target(p)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--clients", type=int, default=256,
                   help="with --resume: clients per process, each resuming its own session in turn")
    p.set_defaults(run=handshakes)
    p = sub.add_parser("idle")
    add_target(p)
    p.add_argument("--connections", type=int, default=10000)
    p.add_argument("--ready", required=True)
    p.set_defaults(run=idle)
    p = sub.add_parser("websocket")
    add_target(p)
    p.add_argument("--sockets", type=int, default=32, help="per worker")
    p.add_argument("--inflight", type=int, default=4)
    p.add_argument("--size", type=int, default=1024)
    p.set_defaults(run=websocket)
    p = sub.add_parser("h2result")
    p.add_argument("summary")
    p.add_argument("log")
    p.set_defaults(run=h2result)
    p = sub.add_parser("table")
    p.add_argument("results")
    p.add_argument("--meta")
    p.set_defaults(run=table)
    p = sub.add_parser("failures")
    p.add_argument("results")
    p.set_defaults(run=failures)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
