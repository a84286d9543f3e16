#!/usr/bin/env python3
"""Support for benches/run: free ports, bulk API keys, a paced login stream,
one result line per wrk run, and the summary table. Standard library only."""

import argparse
import base64
import hashlib
import http.client
import json
import os
import signal
import socket
import sqlite3
import ssl
import statistics
import subprocess
import sys
import threading
import time
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


def record(args):
    """Joins wrk's RESULT line with what benches/run measured around it."""
    result = None
    with open(args.wrk) as f:
        for line in f:
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
    if result is None:
        sys.exit(f"harness: no RESULT line in {args.wrk}")
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
}


def summarize(rows):
    """Median over rounds of each measure, per case."""
    cases = {}
    for r in rows:
        cases.setdefault(r["case"], []).append(r)
    out = {}
    for case, runs in cases.items():
        rps = [r["requests"] * 1e6 / r["duration_us"] for r in runs]
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
        errors = sum(r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"] for r in runs)
        logins = [r["logins"] for r in runs if "logins" in r]
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
        if c is None:
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
        peers = [("nginx HTTPS", https), ("nginx plain", plain), ("pingap", s.get("pingap-apikey"))]
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
    return None


def failures(args):
    """Exit status: 1 when any request of any run failed, or any run did not
    run as its case describes."""
    rows = [json.loads(line) for line in open(args.results) if line.strip()]
    failed = 0
    for r in rows:
        n = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
        n += r.get("logins", {}).get("failed", 0)
        if n:
            print(f"harness: {r['case']} round {r['round']}: {n} failed requests", file=sys.stderr)
        failed += n
        why = not_as_described(r)
        if why:
            print(f"harness: {r['case']} round {r['round']}: {why}", file=sys.stderr)
            failed += 1
    sys.exit(1 if failed else 0)


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
    for name in ("cpu-ticks", "upstream-cpu-ticks", "rss-kib", "cache-misses", "redis-up"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--logins")
    p.set_defaults(run=record)
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
