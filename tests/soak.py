"""Soak: mixed traffic through a real keygate for a bounded time, then a verdict.

    tests/soak.sh [SECONDS]        default 600; CI runs 60

Starts the reference entity service and keygate (the binaries `cargo test`
builds, or KEYGATE_BIN / ENTITY_SERVICE_BIN) on free loopback ports, then runs
at once, until the time is up:

- API-key requests and Bearer-token requests to the upstream;
- logins followed by logouts, and refreshes of a session;
- revocations: an API key created, used, disabled (then refused), deleted;
- WebSockets: open, authenticate with `authCmd`, run a command, close.

Every answer is classified; anything but the expected one is an error of its
kind. Resident memory and open file descriptors of keygate are sampled every
few seconds. It passes when there was no unexpected error, no worker ended on
an exception, every kind of traffic reached its floor (MIN_PER_MINUTE, at
least once), and, after warm-up (the first fifth of the run, and at least half
of it up to 30 s), memory (the least of the last three samples against the
least of the first three) grew by less than 10% (4 MiB allowed at least, 16 MiB
at most) and file descriptors by fewer than 20. It prints the samples and one
summary line.
"""

import collections
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path

import websocket

sys.path.insert(0, str(Path(__file__).resolve().parent / "clients"))
from conftest import (  # noqa: E402
    ENTITY_SERVICE,
    TENANT_EMAIL,
    TENANT_ID,
    TENANT_PASSWORD,
    Keygate,
    _read_line,
)

SAMPLE_EVERY = 5

# The least of each kind of expected answer per minute of soak (and at least
# one): far below what even a loaded debug build does, so that only a worker
# that stopped or never got going falls short.
MIN_PER_MINUTE = {
    "api_key": 60,
    "bearer": 60,
    "login": 6,
    "logout": 3,
    "refresh": 3,
    "current_user": 0,
    "key_create": 3,
    "key_use": 3,
    "key_disable": 3,
    "revoked_key_refused": 3,
    "key_delete": 3,
    "websocket": 3,
}


class Soak:
    def __init__(self, keygate, seconds):
        self.keygate = keygate
        self.base = f"https://localhost:{keygate.port}"
        self.ssl = ssl.create_default_context(cafile=keygate.ca)
        self.deadline = time.monotonic() + seconds
        self.outcomes = collections.Counter()
        self.errors = collections.Counter()
        self.crashes = []
        self.lock = threading.Lock()

    def guarded(self, worker):
        """`worker`, with an exception that ends it recorded as a crash."""

        def run():
            try:
                worker()
            except Exception:  # noqa: BLE001 - any crash fails the soak
                with self.lock:
                    self.crashes.append(f"{worker.__name__}: {traceback.format_exc()}")

        return run

    def short_of_floor(self, seconds):
        """The kinds of traffic below their floor: (kind, seen, floor)."""
        short = []
        for kind, per_minute in MIN_PER_MINUTE.items():
            floor = max(1, per_minute * seconds // 60)
            if self.outcomes[kind] < floor:
                short.append((kind, self.outcomes[kind], floor))
        return short

    def running(self):
        return time.monotonic() < self.deadline

    def count(self, kind, ok, detail=""):
        with self.lock:
            if ok:
                self.outcomes[kind] += 1
            else:
                self.errors[f"{kind}: {detail}"] += 1

    def call(self, method, path, auth=None, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if auth:
            request.add_header("X-Authorization", auth)
        try:
            with urllib.request.urlopen(request, context=self.ssl, timeout=10) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            return error.code, None
        except OSError as error:
            return 0, str(error)

    def login(self):
        status, body = self.call(
            "POST", "/api/auth/login", body={"username": TENANT_EMAIL, "password": TENANT_PASSWORD}
        )
        return (status, body) if status == 200 else (status, None)

    # The workers: each loops until the deadline.

    def api_keys(self):
        auth = f"ApiKey {self.keygate.api_key}"
        while self.running():
            status, _ = self.call("GET", "/api/tenant/devices?pageSize=10&page=0", auth)
            self.count("api_key", status == 200, status)

    def bearer(self):
        status, tokens = self.login()
        self.count("login", status == 200, status)
        refreshed_at = time.monotonic()
        while self.running() and tokens:
            status, _ = self.call(
                "GET", "/api/tenant/devices?pageSize=10&page=0", f"Bearer {tokens['token']}"
            )
            self.count("bearer", status == 200, status)
            if time.monotonic() - refreshed_at > 5:
                status, fresh = self.call(
                    "POST", "/api/auth/token", body={"refreshToken": tokens["refreshToken"]}
                )
                self.count("refresh", status == 200 and fresh is not None, status)
                tokens = fresh or tokens
                refreshed_at = time.monotonic()

    def logins(self):
        while self.running():
            status, tokens = self.login()
            self.count("login", status == 200, status)
            if tokens:
                status, _ = self.call("POST", "/api/auth/logout", f"Bearer {tokens['token']}")
                self.count("logout", status == 200, status)
            time.sleep(0.2)

    def revocations(self):
        status, tokens = self.login()
        self.count("login", status == 200, status)
        admin = f"Bearer {tokens['token']}" if tokens else None
        status, me = self.call("GET", "/api/auth/user", admin)
        self.count("current_user", status == 200, status)
        user_id = me["id"]["id"] if me else None
        logged_in_at = time.monotonic()
        while self.running() and user_id:
            if time.monotonic() - logged_in_at > 30:
                # A new token long before the short test lifetime ends.
                status, fresh = self.login()
                self.count("login", status == 200, status)
                admin = f"Bearer {fresh['token']}" if fresh else admin
                logged_in_at = time.monotonic()
            status, key = self.call(
                "POST", "/api/apiKey", admin,
                {"userId": {"entityType": "USER", "id": user_id}, "description": "soak"},
            )
            self.count("key_create", status == 200 and key is not None, status)
            if not key:
                continue
            auth, key_id = f"ApiKey {key['value']}", key["id"]["id"]
            status, _ = self.call("GET", "/api/tenant/devices?pageSize=1&page=0", auth)
            self.count("key_use", status == 200, status)
            status, _ = self.call("PUT", f"/api/apiKey/{key_id}/enabled/false", admin)
            self.count("key_disable", status == 200, status)
            status, _ = self.call("GET", "/api/tenant/devices?pageSize=1&page=0", auth)
            self.count("revoked_key_refused", status == 401, status)
            status, _ = self.call("DELETE", f"/api/apiKey/{key_id}", admin)
            self.count("key_delete", status == 200, status)
            time.sleep(0.3)

    def websockets(self):
        while self.running():
            status, tokens = self.login()
            if not tokens:
                self.count("ws_login", False, status)
                continue
            try:
                ws = websocket.create_connection(
                    f"wss://localhost:{self.keygate.port}/api/ws",
                    sslopt={"ca_certs": self.keygate.ca},
                    timeout=10,
                )
                cmds = [{"cmdId": 1, "type": "ENTITY_DATA"}]
                ws.send(json.dumps({"authCmd": {"cmdId": 0, "token": tokens["token"]}, "cmds": cmds}))
                reply = json.loads(ws.recv())
                for n in range(5):
                    ws.send(json.dumps({"cmds": [{"cmdId": 2 + n}]}))
                    json.loads(ws.recv())
                ws.close()
                self.count("websocket", reply.get("received") == {"cmds": cmds}, reply)
            except Exception as error:  # noqa: BLE001 - every failure is counted by kind
                self.count("websocket", False, type(error).__name__)
            self.call("POST", "/api/auth/logout", f"Bearer {tokens['token']}")
            time.sleep(0.2)


def sample(pid):
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def main():
    seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 600
    workdir = Path(tempfile.mkdtemp(prefix="keygate-soak-"))
    upstream = subprocess.Popen([ENTITY_SERVICE, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    keygate = None
    try:
        match = _read_line(upstream.stdout, r"listening on (\S+)", time.monotonic() + 30)
        keygate = Keygate(workdir, f"http://{match.group(1)}")
        keygate.env["RUST_LOG"] = "warn,keygate::server=info"
        # The revocation worker creates and deletes keys as fast as it can, as
        # one user: far past the default limit on management writes, which the
        # soak does not measure (tests/management.rs does).
        keygate.env["KEYGATE_LIMITS_MANAGEMENT_WRITES_PER_USER"] = ""
        # The server makes the store; management commands never create one.
        keygate.start()
        keygate.cli(
            "user", "add", "--email", TENANT_EMAIL, "--authority", "TENANT_ADMIN",
            "--tenant-id", TENANT_ID, "--first-name", "Soak", stdin=TENANT_PASSWORD + "\n",
        )
        keygate.api_key = keygate.cli("apikey", "create", "--email", TENANT_EMAIL).stdout.splitlines()[-1]
        soak = Soak(keygate, seconds)
        workers = [soak.api_keys, soak.api_keys, soak.bearer, soak.logins, soak.revocations, soak.websockets]
        threads = [threading.Thread(target=soak.guarded(w), daemon=True) for w in workers]
        for thread in threads:
            thread.start()
        started = time.monotonic()
        samples = []
        while soak.running():
            samples.append((round(time.monotonic() - started), *sample(keygate.process.pid)))
            time.sleep(SAMPLE_EVERY)
        for thread in threads:
            thread.join(timeout=30)
        stuck = [w.__name__ for w, t in zip(workers, threads) if t.is_alive()]
        samples.append((round(time.monotonic() - started), *sample(keygate.process.pid)))
    finally:
        if keygate is not None and getattr(keygate, "process", None):
            keygate.stop()
        upstream.terminate()
        upstream.wait(timeout=30)

    print("  second   RSS KiB   open fds")
    for at, rss, fds in samples:
        print(f"  {at:6d}  {rss:8d}  {fds:9d}")
    print("  outcomes:", dict(sorted(soak.outcomes.items())))
    for kind, n in sorted(soak.errors.items()):
        print(f"  ERROR {kind} x{n}")
    for crash in soak.crashes:
        print(f"  CRASH {crash}")
    for name in stuck:
        print(f"  STUCK {name}: still running 30 s after the end")
    short = soak.short_of_floor(seconds)
    for kind, seen, floor in short:
        print(f"  SHORT {kind}: {seen} expected answers, at least {floor} required")
    warm_up = max(seconds / 5, min(30, seconds / 2))
    warm = [s for s in samples if s[0] >= warm_up] or samples
    # The least of the first three samples after warm-up against the least of
    # the last three: a password hash holds its memory (Argon2id, 19 MiB) while
    # it runs, and logins never stop, so a single sample may catch one or two;
    # a leak raises the least sample too.
    start = [min(s[i] for s in warm[:3]) for i in (1, 2)]
    end = [min(s[i] for s in warm[-3:]) for i in (1, 2)]
    rss_growth = int(end[0] - start[0])
    fd_growth = int(end[1] - start[1])
    flat = rss_growth < min(16 * 1024, max(int(start[0]) // 10, 4096)) and fd_growth < 20
    ok = not soak.errors and not soak.crashes and not stuck and not short and flat
    print(
        f"soak: {'pass' if ok else 'FAIL'}: {seconds}s, {sum(soak.outcomes.values())} expected answers, "
        f"{sum(soak.errors.values())} unexpected; after warm-up (least of three samples) RSS "
        f"{int(start[0])} -> {int(end[0])} KiB ({rss_growth:+d}), open fds {int(start[1])} -> {int(end[1])} "
        f"({fd_growth:+d})"
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
