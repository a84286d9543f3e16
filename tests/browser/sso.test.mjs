// Single sign-on end to end in Debian's headless Chromium: keygate (the binary
// `cargo test` built) signing in through a real OpenID provider (the certified
// `oidc-provider` package, tests/oidc/provider.mjs, whose packages
// `npm ci` in tests/oidc installs), both over HTTPS on loopback. The provider
// is `https://localhost:<port>` and keygate `https://127.0.0.1:<port>`: two
// sites, so the provider's redirect back to keygate is a cross-site
// navigation, and only a SameSite=Lax cookie (not Strict) comes along with it.
// keygate's `/` is a tiny page the test serves, standing in for the
// platform's web UI.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { createServer } from "node:http";
import { createServer as createNetServer } from "node:net";
import { generateKeyPairSync, randomUUID } from "node:crypto";
import { mkdtempSync, writeFileSync, rmSync, openSync, closeSync, readFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";

const ROOT = resolve(import.meta.dirname, "../..");
const KEYGATE = process.env.KEYGATE_BIN || join(ROOT, "target/debug/keygate");
const OIDC_DIR = join(ROOT, "tests/oidc");
const ALICE = "alice@example.com";
const TENANT = "5f1c0c9e-1d2a-4c3b-9e8f-0a1b2c3d4e5f";
const CLIENT_SECRET = "keygate-browser-test-secret";
const UI_PAGE = "<!doctype html><title>platform UI</title><h1>platform UI</h1>";

let workdir, provider, providerLog, issuer, ui, keygate, browser, base;

function firstMatch(stream, pattern, what) {
  return new Promise((resolveMatch, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), 60_000);
    createInterface({ input: stream }).on("line", (line) => {
      const match = line.match(pattern);
      if (match) {
        clearTimeout(timer);
        resolveMatch(match);
      }
    });
  });
}

/** A free loopback port (bound and released; keygate binds it next). */
async function freePort() {
  const server = createNetServer();
  await new Promise((ready) => server.listen(0, "127.0.0.1", ready));
  const { port } = server.address();
  await new Promise((closed) => server.close(closed));
  return port;
}

/**
 * A private CA and a certificate it signs for `localhost` and 127.0.0.1 (the
 * provider's), made with openssl in `dir`: the CA is keygate's `ca_file`.
 * keygate verifies as browsers do, so the CA is a CA and the leaf is not.
 */
function makeCertificates(dir) {
  const openssl = (...args) => execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  openssl("req", "-x509", ...ec, "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "2",
    "-subj", "/CN=keygate browser test CA",
    "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
    "-addext", "keyUsage=critical,keyCertSign,cRLSign");
  openssl("req", "-new", ...ec, "-keyout", "provider-key.pem", "-out", "provider.csr", "-subj", "/CN=localhost");
  writeFileSync(join(dir, "provider.ext"), [
    "basicConstraints=critical,CA:FALSE",
    "keyUsage=critical,digitalSignature",
    "extendedKeyUsage=serverAuth",
    "subjectAltName=DNS:localhost,IP:127.0.0.1",
  ].join("\n") + "\n");
  openssl("x509", "-req", "-in", "provider.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
    "-days", "2", "-out", "provider.pem", "-extfile", "provider.ext");
  return { ca: join(dir, "ca.pem"), cert: join(dir, "provider.pem"), key: join(dir, "provider-key.pem") };
}

/** The provider's signing key set (one P-256 key, private part included). */
function writeSigningKeys(path) {
  const { privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const jwk = { ...privateKey.export({ format: "jwk" }), kid: `browser-${randomUUID()}`, alg: "ES256", use: "sig" };
  writeFileSync(path, JSON.stringify({ keys: [jwk] }));
}

before(async () => {
  assert.ok(existsSync(join(OIDC_DIR, "node_modules/oidc-provider")),
    "the OpenID provider's packages are missing: run `npm ci` in tests/oidc first");
  workdir = mkdtempSync(join(tmpdir(), "keygate-sso-browser-"));
  const certs = makeCertificates(workdir);
  const jwks = join(workdir, "jwks.json");
  writeSigningKeys(jwks);
  const port = await freePort();
  base = `https://127.0.0.1:${port}`;

  providerLog = join(workdir, "provider.log");
  const logFd = openSync(providerLog, "w");
  // stdin stays open: the provider exits when it closes.
  provider = spawn("node", [join(OIDC_DIR, "provider.mjs"), "--port=0", `--cert=${certs.cert}`, `--key=${certs.key}`,
    `--jwks=${jwks}`, `--redirect-uri=${base}/login/oauth2/code/`, `--client-secret=${CLIENT_SECRET}`,
    "--auth-method=client_secret_basic"], { cwd: OIDC_DIR, stdio: ["pipe", "pipe", logFd] });
  closeSync(logFd);
  [, issuer] = await firstMatch(provider.stdout, /^ready (\S+)/, "the OpenID provider").catch((e) => {
    throw new Error(`${e.message}:\n${readFileSync(providerLog, "utf8")}`);
  });

  // The platform's UI: one page, whatever the path (`/` and `/login`).
  ui = createServer((req, res) => {
    req.resume();
    res.writeHead(200, { "content-type": "text/html; charset=utf-8" });
    res.end(UI_PAGE);
  });
  await new Promise((ready) => ui.listen(0, "127.0.0.1", ready));

  const config = join(workdir, "keygate.toml");
  writeFileSync(config, `
[server]
data_dir = "${workdir}"
public_base_url = "${base}"
[listen]
https = "127.0.0.1:${port}"
http = ""
admin = ""
[store]
url = "sqlite://${workdir}/keygate.db"
[[route]]
name = "ui"
prefix = "/"
upstreams = ["http://127.0.0.1:${ui.address().port}"]
public = true
[[oidc]]
name = "corp"
issuer = "${issuer}"
client_id = "keygate"
client_secret = "${CLIENT_SECRET}"
button_label = "Corp login"
ca_file = "${certs.ca}"
`);
  // keygate reads every KEYGATE_* variable as a setting and refuses unknown
  // ones, so the test's own (KEYGATE_BIN, KEYGATE_CONFIG) stay out.
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith("KEYGATE_")));
  Object.assign(env, { KEYGATE_BOOTSTRAP_PASSWORD: "bootstrap-password", RUST_LOG: "info" });
  keygate = spawn(KEYGATE, ["--config", config, "--log-format", "json", "serve"], { env, stdio: ["ignore", "ignore", "pipe"] });
  await firstMatch(keygate.stderr, /"https":"127\.0\.0\.1:\d+"/, "keygate");
  keygate.stderr.resume();
  // The server makes the store; management commands never create one.
  execFileSync(KEYGATE, ["--config", config, "user", "add", "--email", ALICE, "--authority", "TENANT_ADMIN",
    "--tenant-id", TENANT], { input: "alice-password\n", env, encoding: "utf8", stdio: "pipe" });

  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
  });
});

after(async () => {
  await browser?.close();
  keygate?.kill("SIGTERM");
  provider?.kill("SIGTERM");
  ui?.close();
  if (workdir) rmSync(workdir, { recursive: true, force: true });
});

/** A fresh context (no cookies) with the UI page loaded from keygate's origin. */
async function openUi() {
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  const page = await context.newPage();
  const response = await page.goto(`${base}/`);
  assert.equal(response.status(), 200);
  assert.equal(await page.locator("h1").textContent(), "platform UI");
  return { context, page };
}

/**
 * What the platform's login page does: asks keygate for the sign-in buttons,
 * shows them, and the user clicks "Corp login". Leaves the page at the
 * provider's login form.
 */
async function clickCorpLogin(page) {
  const listing = await page.evaluate(async () => {
    const answer = await fetch("/api/noauth/oauth2Clients?platform=WEB", { method: "POST" });
    return { status: answer.status, body: await answer.json() };
  });
  assert.equal(listing.status, 200);
  const corp = listing.body.find((entry) => entry.name === "Corp login");
  assert.ok(corp, JSON.stringify(listing.body));
  assert.equal(corp.url, "/oauth2/authorization/corp");
  await page.evaluate(({ name, url }) => {
    const link = document.createElement("a");
    link.href = url;
    link.textContent = name;
    document.body.append(link);
  }, corp);
  await page.getByRole("link", { name: "Corp login" }).click();
  await page.waitForURL((url) => url.href.startsWith(issuer), { timeout: 15_000 });
}

/**
 * At the provider, as `login`: its login form, then its consent form. The
 * consent's redirects end at keygate's callback.
 */
async function signInAtProvider(page, login) {
  await page.locator('input[name="login"]').fill(login);
  await page.locator('input[name="password"]').fill("through-the-looking-glass");
  await page.locator('button[type="submit"]').click();
  await page.waitForSelector('input[name="prompt"][value="consent"]', { state: "attached", timeout: 15_000 });
  await page.locator('button[type="submit"]').click();
}

/** keygate's flow cookie as the browser holds it, if any. */
async function flowCookie(context) {
  return (await context.cookies(`${base}/login/oauth2/code/`)).find((c) => c.name === "keygate_oauth2");
}

test("signing in through the provider's pages lands on the UI with tokens that answer as alice", async () => {
  const { context, page } = await openUi();
  const callbacks = [];
  page.on("request", (request) => {
    if (request.url().startsWith(`${base}/login/oauth2/code/`)) callbacks.push(request);
  });
  await clickCorpLogin(page);
  const cookie = await flowCookie(context);
  assert.ok(cookie, "keygate set its flow cookie before sending the browser to the provider");
  assert.equal(cookie.sameSite, "Lax");
  assert.equal(cookie.secure, true);
  assert.equal(cookie.httpOnly, true);
  assert.equal(cookie.path, "/login/oauth2/");

  await signInAtProvider(page, "alice");
  await page.waitForURL((url) => url.href.startsWith(`${base}/?`), { timeout: 15_000 });
  const landed = new URL(page.url());
  assert.equal(landed.origin, base);
  assert.equal(landed.pathname, "/");
  assert.equal(landed.searchParams.get("loginError"), null, page.url());
  const accessToken = landed.searchParams.get("accessToken");
  const refreshToken = landed.searchParams.get("refreshToken");
  assert.ok(accessToken && refreshToken, page.url());
  assert.equal(await page.locator("h1").textContent(), "platform UI");

  // The callback came across sites from the provider, cookie included.
  assert.equal(callbacks.length, 1, callbacks.map((r) => r.url()).join("\n"));
  const headers = await callbacks[0].allHeaders();
  assert.match(headers.cookie ?? "", /(^|; )keygate_oauth2=/, "the flow cookie came back with the callback");
  assert.equal(await flowCookie(context), undefined, "the callback cleared the flow cookie");

  const user = await page.evaluate(async (token) => {
    const answer = await fetch("/api/auth/user", { headers: { "X-Authorization": `Bearer ${token}` } });
    return { status: answer.status, body: await answer.json() };
  }, accessToken);
  assert.equal(user.status, 200, JSON.stringify(user.body));
  assert.equal(user.body.email, ALICE);
  assert.equal(user.body.authority, "TENANT_ADMIN");
  await context.close();
});

test("a callback opened in a browser that did not start the sign-in lands on the login error without tokens", async () => {
  const { context: starter, page: starterPage } = await openUi();
  // The starter's browser never reaches keygate's callback: Chromium fails
  // the request (DevTools' Fetch interception, which sees the provider's
  // redirect; Playwright's routes do not), and its URL is kept.
  let callback;
  starterPage.on("request", (request) => {
    if (request.url().startsWith(`${base}/login/oauth2/code/`)) callback ??= request.url();
  });
  const cdp = await starter.newCDPSession(starterPage);
  cdp.on("Fetch.requestPaused", ({ requestId }) => cdp.send("Fetch.failRequest", { requestId, errorReason: "BlockedByClient" }));
  await cdp.send("Fetch.enable", { patterns: [{ urlPattern: `${base}/login/oauth2/code/*`, requestStage: "Request" }] });
  await clickCorpLogin(starterPage);
  await signInAtProvider(starterPage, "alice");
  const deadline = Date.now() + 15_000;
  while (!callback) {
    assert.ok(Date.now() < deadline, "the provider never sent the browser to keygate's callback");
    await starterPage.waitForTimeout(50);
  }
  const sent = new URL(callback);
  assert.ok(sent.searchParams.get("code") && sent.searchParams.get("state"), callback);
  assert.ok(await flowCookie(starter), "the starter still holds its flow cookie");

  const other = await browser.newContext({ ignoreHTTPSErrors: true });
  assert.deepEqual(await other.cookies(), []);
  const page = await other.newPage();
  const tokens = [];
  page.on("request", (request) => {
    if (/[?&](accessToken|refreshToken)=/.test(request.url())) tokens.push(request.url());
  });
  await page.goto(callback);
  const landed = new URL(page.url());
  assert.equal(landed.origin, base);
  assert.equal(landed.pathname, "/login");
  assert.equal(landed.searchParams.get("loginError"), "Authentication failed: the sign-in was not started here or has expired");
  assert.equal(landed.searchParams.get("accessToken"), null);
  assert.equal(landed.searchParams.get("refreshToken"), null);
  assert.deepEqual(tokens, [], "no token was handed out on the way");
  await other.close();

  // The same URL in the browser that started the sign-in still signs in:
  // the refusal was the missing cookie's alone.
  await cdp.send("Fetch.disable");
  await starterPage.goto(callback);
  const own = new URL(starterPage.url());
  assert.equal(own.pathname, "/", starterPage.url());
  assert.ok(own.searchParams.get("accessToken") && own.searchParams.get("refreshToken"), starterPage.url());
  await starter.close();
});
