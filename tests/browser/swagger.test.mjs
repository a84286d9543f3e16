// The API browser end to end: keygate (and the reference upstream it fronts)
// started from the binaries `cargo test` built, the page loaded over HTTPS in
// Debian's headless Chromium, authorized as a person would, calls made with
// "Try it out". A hostile upstream publishes a document that points calls at a
// second loopback server playing the attacker.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { createServer } from "node:http";
import { mkdtempSync, writeFileSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { createHmac } from "node:crypto";
import { chromium } from "playwright-core";

const ROOT = resolve(import.meta.dirname, "../..");
const KEYGATE = process.env.KEYGATE_BIN || join(ROOT, "target/debug/keygate");
const ENTITY_SERVICE = process.env.ENTITY_SERVICE_BIN || join(ROOT, "target/debug/examples/entity_service");
const ARTIFACTS = join(ROOT, "tests/artifacts");
const EMAIL = "browser@example.com";
const PASSWORD = "browser-password";
const TENANT = "5f1c0c9e-1d2a-4c3b-9e8f-0a1b2c3d4e5f";
const TOTP_EMAIL = "second-factor@example.com";

let workdir, upstream, keygate, browser, base, apiKey, attacker, hostile;

/** A loopback HTTP server that records every request; `answer` writes the response. */
async function recordingServer(answer) {
  const seen = [];
  const server = createServer((req, res) => {
    seen.push({ method: req.method, url: req.url, headers: req.headers });
    req.resume();
    req.on("end", () => answer(req, res));
  });
  await new Promise((ready) => server.listen(0, "127.0.0.1", ready));
  return { server, seen, origin: `http://127.0.0.1:${server.address().port}` };
}

// The attacker: answers everything, preflights included, so a request that
// left the page would arrive here with whatever headers it carried.
async function startAttacker() {
  return recordingServer((req, res) => {
    res.writeHead(200, {
      "access-control-allow-origin": req.headers.origin || "*",
      "access-control-allow-headers": "*, x-authorization, authorization",
      "access-control-allow-methods": "*",
      "content-type": "application/json",
    });
    res.end("{}");
  });
}

// An upstream whose OpenAPI document names the attacker as its server at the
// document, path and operation level, and whose /hostile/redirect answers
// with a redirect to the attacker.
async function startHostileUpstream(attackerOrigin) {
  const document = {
    openapi: "3.0.3",
    info: { title: "hostile", version: "1" },
    servers: [{ url: attackerOrigin }],
    tags: [{ name: "hostile" }],
    paths: {
      "/hostile/loot": {
        servers: [{ url: `${attackerOrigin}/path-level` }],
        get: {
          tags: ["hostile"],
          operationId: "stealKey",
          servers: [{ url: `${attackerOrigin}/operation-level` }],
          responses: { 200: { description: "ok" } },
        },
      },
      "/hostile/redirect": {
        get: { tags: ["hostile"], operationId: "followRedirect", responses: { 200: { description: "ok" } } },
      },
    },
  };
  return recordingServer((req, res) => {
    if (req.url === "/v3/api-docs") {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(document));
    } else if (req.url.startsWith("/hostile/redirect")) {
      res.writeHead(307, { location: `${attackerOrigin}/collect` });
      res.end();
    } else {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ looted: false }));
    }
  });
}

// RFC 6238 of the test's own (6 digits, 30 s, HMAC-SHA1): the code an
// authenticator app shows for `step`.
function base32Decode(text) {
  const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
  let bits = "";
  for (const c of text.replace(/=+$/, "").toUpperCase()) bits += alphabet.indexOf(c).toString(2).padStart(5, "0");
  const bytes = [];
  for (let i = 0; i + 8 <= bits.length; i += 8) bytes.push(parseInt(bits.slice(i, i + 8), 2));
  return Buffer.from(bytes);
}
function totp(secret, step) {
  const counter = Buffer.alloc(8);
  counter.writeBigUInt64BE(BigInt(step));
  const mac = createHmac("sha1", base32Decode(secret)).update(counter).digest();
  const offset = mac[19] & 0xf;
  const binary = ((mac[offset] & 0x7f) << 24) | (mac[offset + 1] << 16) | (mac[offset + 2] << 8) | mac[offset + 3];
  return String(binary % 1_000_000).padStart(6, "0");
}
const stepNow = () => Math.floor(Date.now() / 1000 / 30);

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

before(async () => {
  workdir = mkdtempSync(join(tmpdir(), "keygate-browser-"));
  upstream = spawn(ENTITY_SERVICE, ["--listen", "127.0.0.1:0"], { stdio: ["ignore", "pipe", "inherit"] });
  const [, upstreamAddr] = await firstMatch(upstream.stdout, /listening on (\S+)/, "the entity service");
  attacker = await startAttacker();
  hostile = await startHostileUpstream(attacker.origin);
  const config = join(workdir, "keygate.toml");
  writeFileSync(config, `
[server]
data_dir = "${workdir}"
[listen]
https = "127.0.0.1:0"
http = "127.0.0.1:0"
admin = "127.0.0.1:0"
[store]
url = "sqlite://${workdir}/keygate.db"
[[route]]
name = "entities"
prefix = "/api/"
upstreams = ["http://${upstreamAddr}"]
openapi = "/v3/api-docs"
[[route]]
name = "hostile"
prefix = "/hostile/"
upstreams = ["${hostile.origin}"]
openapi = "/v3/api-docs"
`);
  // keygate reads every KEYGATE_* variable as a setting and refuses unknown
  // ones, so the test's own (KEYGATE_BIN, KEYGATE_CONFIG) stay out.
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith("KEYGATE_")));
  Object.assign(env, { KEYGATE_BOOTSTRAP_PASSWORD: "bootstrap-password", RUST_LOG: "info" });
  const cli = (args, input = "") => execFileSync(KEYGATE, ["--config", config, ...args], { input, env, encoding: "utf8" });
  // The server makes the store; management commands never create one.
  keygate = spawn(KEYGATE, ["--config", config, "--log-format", "json", "serve"], { env, stdio: ["ignore", "ignore", "pipe"] });
  const [, port] = await firstMatch(keygate.stderr, /"https":"127\.0\.0\.1:(\d+)"/, "keygate");
  cli(["user", "add", "--email", EMAIL, "--authority", "TENANT_ADMIN", "--tenant-id", TENANT], PASSWORD + "\n");
  apiKey = cli(["apikey", "create", "--email", EMAIL]).trim().split("\n").pop();
  cli(["user", "add", "--email", TOTP_EMAIL, "--authority", "TENANT_ADMIN", "--tenant-id", TENANT], PASSWORD + "\n");
  base = `https://localhost:${port}`;
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
  });
});

after(async () => {
  await browser?.close();
  keygate?.kill("SIGTERM");
  upstream?.kill("SIGTERM");
  attacker?.server.close();
  hostile?.server.close();
  if (workdir) rmSync(workdir, { recursive: true, force: true });
});

/**
 * A fresh page (own storage) with the page loaded, the sent X-Authorization
 * headers recorded, and every Content-Security-Policy violation (the page's
 * securitypolicyviolation events and the console's reports) collected.
 */
async function openPage(init) {
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1400, height: 1000 } });
  if (init) await context.addInitScript(init.script, init.arg);
  const violations = [];
  await context.exposeBinding("reportViolation", (_source, violation) => violations.push(violation));
  await context.addInitScript(() => {
    document.addEventListener("securitypolicyviolation", (e) =>
      window.reportViolation({ directive: e.violatedDirective, blocked: e.blockedURI, source: e.sourceFile }));
  });
  const page = await context.newPage();
  page.on("console", (message) => {
    if (/Content Security Policy/i.test(message.text())) violations.push({ console: message.text() });
  });
  const sent = [];
  page.on("request", (request) => {
    const header = request.headers()["x-authorization"];
    if (header) sent.push({ url: request.url(), header });
  });
  const response = await page.goto(`${base}/swagger-ui.html`);
  await page.waitForSelector("#operations-auth-controller-getUser", { timeout: 30_000 });
  return { context, page, sent, violations, response };
}

/** Reloads until keygate's document lists the hostile upstream's operations. */
async function waitForHostileDocument(page) {
  const deadline = Date.now() + 30_000;
  while (!(await page.locator("#operations-hostile-stealKey").count())) {
    assert.ok(Date.now() < deadline, "the hostile upstream's document was not joined");
    const joined = await page.evaluate(async () => (await (await fetch("/v3/api-docs")).text()).includes("/hostile/loot"));
    if (joined) {
      await page.reload();
      await page.waitForSelector("#operations-auth-controller-getUser");
    } else {
      await page.waitForTimeout(100);
    }
  }
}

async function authorize(page, { username, password, key }) {
  await page.click(".auth-wrapper button.authorize");
  const dialog = page.locator(".modal-ux");
  if (username) {
    const section = dialog.locator(".auth-container", { hasText: "HttpLoginForm" });
    await section.locator("input[type=text]").fill(username);
    await section.locator("input[type=password]").fill(password);
    await section.locator("button.authorize").click();
    await section.locator("button", { hasText: "Logout" }).waitFor({ timeout: 15_000 });
  }
  if (key) {
    const section = dialog.locator(".auth-container", { hasText: "ApiKeyForm" });
    await section.locator("input[type=text]").fill(key);
    await section.locator("button.authorize").click();
    await section.locator("button", { hasText: "Logout" }).waitFor({ timeout: 15_000 });
  }
  await dialog.locator("button.btn-done").first().click();
}

/** "Try it out" and "Execute" on one operation; returns [status, body]. */
async function tryItOut(page, operationId, params = {}) {
  const block = page.locator(`#${operationId}`);
  if (!(await block.locator(".opblock-body").count())) await block.locator(".opblock-summary").first().click();
  const tryOut = block.locator("button.try-out__btn");
  if ((await tryOut.textContent()).includes("Try it out")) await tryOut.click();
  for (const [name, value] of Object.entries(params)) {
    await block.locator(`tr[data-param-name="${name}"] input`).fill(String(value));
  }
  await block.locator("button.execute").click();
  const status = block.locator(".live-responses-table tr.response .response-col_status").first();
  await status.waitFor({ timeout: 15_000 });
  const body = await block.locator(".live-responses-table tr.response .response-col_description pre").first().textContent();
  return [(await status.textContent()).trim(), body];
}

test("logging in through the Authorize dialog runs calls as that user", async () => {
  const { context, page, sent, violations } = await openPage();
  await authorize(page, { username: EMAIL, password: PASSWORD });
  const [status, body] = await tryItOut(page, "operations-auth-controller-getUser");
  assert.equal(status, "200");
  assert.ok(body.includes(EMAIL), body);
  assert.ok(sent.some((s) => s.url.endsWith("/api/auth/user") && s.header.startsWith("Bearer ")), JSON.stringify(sent));
  const stored = await page.evaluate(() => JSON.stringify(localStorage));
  assert.ok(!stored.includes(PASSWORD), "the password is never stored");
  await page.reload();
  await page.waitForSelector("#operations-auth-controller-getUser");
  const [again] = await tryItOut(page, "operations-auth-controller-getUser");
  assert.equal(again, "200", "authorization survives a reload");
  // An expired access token is refreshed by the page, not failed on.
  await page.evaluate(() => {
    const session = JSON.parse(localStorage.getItem("keygate.apiBrowser.session"));
    localStorage.setItem("keygate.apiBrowser.session", JSON.stringify({ ...session, exp: 0 }));
  });
  // Both waits start before the click: the call follows the refresh within
  // milliseconds, and a wait started after the first answer could miss it.
  const refreshed = page.waitForResponse((r) => r.url().endsWith("/api/auth/token") && r.status() === 200);
  const called = page.waitForResponse((r) => r.url().endsWith("/api/auth/user"));
  await page.locator("#operations-auth-controller-getUser button.execute").click();
  await refreshed;
  assert.equal((await called).status(), 200, "the call went out with the refreshed token");
  const [afterRefresh] = await tryItOut(page, "operations-auth-controller-getUser");
  assert.equal(afterRefresh, "200");
  assert.deepEqual(violations, [], "login and refresh stay within the content policy");
  await context.close();
});

test("an API key typed without its prefix runs calls as its user", async () => {
  const { context, page, sent } = await openPage();
  await authorize(page, { key: apiKey });
  const [status, body] = await tryItOut(page, "operations-auth-controller-getUser");
  assert.equal(status, "200");
  assert.ok(body.includes(EMAIL), body);
  assert.ok(sent.some((s) => s.header === `ApiKey ${apiKey}`));
  await context.close();
});

test("with both authorized the Bearer token is sent, and upstream endpoints work through the page", async () => {
  const { context, page, sent } = await openPage();
  await authorize(page, { username: EMAIL, password: PASSWORD, key: apiKey });
  const [status] = await tryItOut(page, "operations-auth-controller-getUser");
  assert.equal(status, "200");
  const mine = sent.filter((s) => s.url.endsWith("/api/auth/user"));
  assert.ok(mine.length > 0 && mine.every((s) => s.header.startsWith("Bearer ")), JSON.stringify(mine));
  assert.ok(await page.locator("#operations-device-controller-getTenantDevices").count(), "the upstream's endpoint is listed");
  const [listed, body] = await tryItOut(page, "operations-device-controller-getTenantDevices", { pageSize: 10, page: 0 });
  assert.equal(listed, "200", body);
  assert.ok(body.includes("totalElements"), body);
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: join(ARTIFACTS, "api-browser-authorized.png"), fullPage: false });
  await context.close();
});

test("a session of the main web UI in localStorage is used without asking", async () => {
  // Node's fetch does not trust the development CA; log in from the page's origin instead.
  const { context, page } = await openPage();
  const token = await page.evaluate(async ([email, password]) => {
    const r = await fetch("/api/auth/login", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ username: email, password }) });
    return (await r.json()).token;
  }, [EMAIL, PASSWORD]);
  await context.close();
  assert.ok(token);
  const seeded = await openPage({
    script: ([jwt]) => {
      if (!localStorage.getItem("jwt_token")) {
        localStorage.setItem("jwt_token", jwt);
        localStorage.setItem("jwt_token_expiration", String(Date.now() + 3_600_000));
      }
    },
    arg: [token],
  });
  const [status, body] = await tryItOut(seeded.page, "operations-auth-controller-getUser");
  assert.equal(status, "200", body);
  assert.ok(seeded.sent.some((s) => s.header === `Bearer ${token}`));
  await seeded.context.close();
});

test("the page runs under its content policy without a single violation", async () => {
  const { context, page, violations, response } = await openPage();
  const headers = response.headers();
  assert.match(headers["content-security-policy"], /default-src 'self'/);
  assert.match(headers["content-security-policy"], /frame-ancestors 'none'/);
  assert.doesNotMatch(headers["content-security-policy"], /unsafe-inline|unsafe-eval/);
  assert.equal(headers["x-frame-options"], "DENY");
  assert.equal(headers["x-content-type-options"], "nosniff");
  assert.equal(headers["referrer-policy"], "no-referrer");
  await authorize(page, { key: apiKey });
  const [status] = await tryItOut(page, "operations-auth-controller-getUser");
  assert.equal(status, "200");
  // Schemas render too, expanded all the way down.
  const models = page.locator("section.models");
  await models.scrollIntoViewIfNeeded();
  if ((await models.getAttribute("class")).split(" ").indexOf("is-open") < 0) await models.locator("h4 button").click();
  const schema = models.locator("article.json-schema-2020-12").first();
  await schema.locator(".json-schema-2020-12-expand-deep-button").click();
  await schema.locator(".json-schema-2020-12-body:not(.json-schema-2020-12-body--collapsed)").first().waitFor();
  assert.ok(await page.locator(".info .title").count(), "the page rendered");
  assert.deepEqual(violations, []);
  await context.close();
});

test("a hostile upstream document cannot send the API key to another origin", async () => {
  const { context, page, sent, violations } = await openPage();
  await waitForHostileDocument(page);
  await authorize(page, { key: apiKey });
  const [status, body] = await tryItOut(page, "operations-hostile-stealKey");
  assert.equal(status, "200", body);
  assert.ok(body.includes("looted"), body);
  const loot = sent.filter((s) => s.url.includes("/hostile/loot"));
  assert.ok(loot.length > 0, JSON.stringify(sent));
  assert.ok(loot.every((s) => s.url.startsWith(`${base}/hostile/loot`)), "calls go to keygate's origin: " + JSON.stringify(loot));
  assert.ok(sent.every((s) => s.url.startsWith(`${base}/`)), "no credential left the origin: " + JSON.stringify(sent));
  const upstreamSaw = hostile.seen.filter((r) => r.url.startsWith("/hostile/loot"));
  assert.ok(upstreamSaw.length > 0 && upstreamSaw.every((r) => !r.headers["x-authorization"]), "keygate forwards no key either");

  // The page's own rule, whatever a document says: a request for another
  // origin leaves the interceptor with no credential; one for this origin gets it.
  const [foreign, own] = await page.evaluate(async (attackerOrigin) => {
    const intercept = window.ui.getConfigs().requestInterceptor;
    const away = await intercept({ url: `${attackerOrigin}/collect`, method: "GET", headers: { "X-Authorization": "ApiKey copied", authorization: "Basic eDp5" } });
    const home = await intercept({ url: `${location.origin}/api/auth/user`, method: "GET", headers: {} });
    return [away.headers, home.headers];
  }, attacker.origin);
  assert.deepEqual(foreign, {});
  assert.equal(own["X-Authorization"], `ApiKey ${apiKey}`);
  assert.deepEqual(violations, []);

  // An upstream that redirects a call to the attacker: the browser refuses to follow.
  const blocked = new Promise((resolveBlocked, reject) => {
    const deadline = Date.now() + 15_000;
    const check = setInterval(() => {
      // Chrome reports the URL before the redirect as the one blocked.
      if (violations.some((v) => v.directive === "connect-src" && v.blocked === `${base}/hostile/redirect`)) {
        clearInterval(check);
        resolveBlocked();
      } else if (Date.now() > deadline) {
        clearInterval(check);
        reject(new Error("the redirect was not refused: " + JSON.stringify(violations)));
      }
    }, 20);
  });
  const block = page.locator("#operations-hostile-followRedirect");
  await block.locator(".opblock-summary").first().click();
  await block.locator("button.try-out__btn").click();
  await block.locator("button.execute").click();
  await blocked;
  assert.ok(hostile.seen.some((r) => r.url.startsWith("/hostile/redirect")), "the call reached the upstream through keygate");
  assert.deepEqual(attacker.seen, [], "the attacker received no request at all");
  await context.close();
});

test("the Authorize dialog says what each scheme sends, header values included", async () => {
  const { context, page, violations } = await openPage();
  await page.click(".auth-wrapper button.authorize");
  const dialog = page.locator(".modal-ux");
  const login = dialog.locator(".auth-container", { hasText: "HttpLoginForm" });
  const key = dialog.locator(".auth-container", { hasText: "ApiKeyForm" });
  await login.waitFor();
  const loginText = await login.innerText();
  const keyText = await key.innerText();
  assert.match(loginText, /HttpLoginForm \(username and password, posted to \/api\/auth\/login\)/, loginText);
  assert.ok(loginText.includes("X-Authorization: Bearer <token>"), loginText);
  assert.ok(keyText.includes("X-Authorization: ApiKey <key>"), keyText);
  const all = await dialog.innerText();
  assert.doesNotMatch(all, /\(http, Basic\)/);
  assert.doesNotMatch(all, /(ApiKey|Bearer) \./, "no header value rendered away");
  assert.equal(await login.locator("input[type=text]").count(), 1, "a username field");
  assert.equal(await login.locator("input[type=password]").count(), 1, "a password field");
  assert.deepEqual(violations, []);
  await context.close();
});

test("a wrong password shows the server's message inside the dialog, never an alert", async () => {
  const { context, page, sent } = await openPage();
  const alerts = [];
  page.on("dialog", (d) => {
    alerts.push(d.message());
    d.dismiss().catch(() => {});
  });
  await page.click(".auth-wrapper button.authorize");
  const section = page.locator(".modal-ux .auth-container", { hasText: "HttpLoginForm" });
  await section.locator("input[type=text]").fill(EMAIL);
  await section.locator("input[type=password]").fill("not-the-password");
  const refused = page.waitForResponse((r) => r.url().endsWith("/api/auth/login"));
  await section.locator("button.authorize").click();
  assert.equal((await refused).status(), 401);
  const message = section.locator(".errors", { hasText: "Invalid username or password" });
  await message.waitFor({ timeout: 15_000 });
  assert.equal(await section.locator("button", { hasText: "Logout" }).count(), 0, "not authorized");
  assert.ok(await page.locator(".modal-ux").isVisible(), "the dialog stays open");
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.locator(".modal-ux .modal-ux-content").screenshot({ path: join(ARTIFACTS, "api-browser-login-refused.png") });

  // The right password then logs in, and the message goes away.
  await section.locator("input[type=password]").fill(PASSWORD);
  await section.locator("button.authorize").click();
  await section.locator("button", { hasText: "Logout" }).waitFor({ timeout: 15_000 });
  assert.equal(await section.locator(".errors").count(), 0);
  await page.locator(".modal-ux button.btn-done").first().click();
  const [status] = await tryItOut(page, "operations-auth-controller-getUser");
  assert.equal(status, "200");
  assert.ok(sent.some((s) => s.url.endsWith("/api/auth/user") && s.header.startsWith("Bearer ")));
  assert.deepEqual(alerts, [], "no alert, confirm or prompt");
  await context.close();
});

test("the stock Swagger UI addresses lead to keygate's page", async () => {
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  const page = await context.newPage();
  const requested = [];
  page.on("request", (r) => requested.push(new URL(r.url()).pathname));
  for (const path of ["/swagger-ui/", "/swagger-ui/index.html"]) {
    requested.length = 0;
    const response = await page.goto(`${base}${path}`);
    assert.equal(new URL(page.url()).pathname, "/swagger-ui.html", path);
    assert.equal(response.request().redirectedFrom()?.url(), `${base}${path}`, path);
    assert.ok((await response.text()).includes("/swagger-ui/keygate-api-browser.js"), path);
    await page.waitForSelector("#operations-auth-controller-getUser", { timeout: 30_000 });
    assert.ok(!requested.includes("/swagger-ui/swagger-initializer.js"), `${path}: ${requested}`);
    await page.click(".auth-wrapper button.authorize");
    assert.doesNotMatch(await page.locator(".modal-ux").innerText(), /\(http, Basic\)/, path);
  }
  await context.close();
});

test("a user with a second factor is asked for the code inside the dialog, then runs calls with the pair", async () => {
  // TOTP configured as a person would, from the page's origin (Node's fetch
  // does not trust the development CA); the code computed here.
  const setup = await openPage();
  const authUrl = await setup.page.evaluate(async ([email, password]) => {
    const login = await (await fetch("/api/auth/login", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ username: email, password }) })).json();
    window.fullToken = login.token;
    const generated = await fetch("/api/2fa/account/config/generate?providerType=TOTP", { method: "POST", headers: { "x-authorization": `Bearer ${login.token}` } });
    window.generated = await generated.json();
    return window.generated.authUrl;
  }, [TOTP_EMAIL, PASSWORD]);
  const secret = new URL(authUrl).searchParams.get("secret");
  const savedStep = stepNow();
  const saved = await setup.page.evaluate(async (code) => {
    const r = await fetch(`/api/2fa/account/config?verificationCode=${code}`, { method: "POST", headers: { "content-type": "application/json", "x-authorization": `Bearer ${window.fullToken}` }, body: JSON.stringify(window.generated) });
    return r.status;
  }, totp(secret, savedStep));
  assert.equal(saved, 200);
  await setup.context.close();

  const { context, page, sent, violations } = await openPage();
  await page.click(".auth-wrapper button.authorize");
  const section = page.locator(".modal-ux .auth-container", { hasText: "HttpLoginForm" });
  await section.locator("input[type=text]").first().fill(TOTP_EMAIL);
  await section.locator("input[type=password]").fill(PASSWORD);
  await section.locator("button.authorize").click();
  const codeField = section.locator("#keygate-login-code");
  await codeField.waitFor({ timeout: 15_000 });
  assert.match(await section.innerText(), /code from the authenticator app/);
  assert.equal(await section.locator("button", { hasText: "Logout" }).count(), 0, "not authorized before the code");

  // A wrong code: the server's message in the dialog, and the code asked again.
  await codeField.fill(totp(secret, savedStep - 5));
  const refused = page.waitForResponse((r) => r.url().includes("/api/auth/2fa/verification/check"));
  await section.locator("button.authorize").click();
  assert.equal((await refused).status(), 400);
  await section.locator(".errors", { hasText: "Verification code is incorrect" }).waitFor({ timeout: 15_000 });
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.locator(".modal-ux .modal-ux-content").screenshot({ path: join(ARTIFACTS, "api-browser-second-factor.png") });

  // The current code (not the one that saved the secret): authorized.
  await codeField.fill(totp(secret, savedStep + 1));
  await section.locator("button.authorize").click();
  await section.locator("button", { hasText: "Logout" }).waitFor({ timeout: 15_000 });
  await page.locator(".modal-ux button.btn-done").first().click();
  const [status, body] = await tryItOut(page, "operations-auth-controller-getUser");
  assert.equal(status, "200", body);
  assert.ok(body.includes(TOTP_EMAIL), body);

  // The pre-verification token went to the check only and is not kept; the
  // pair is, with its refresh token, and no password.
  const checks = sent.filter((s) => s.url.includes("/api/auth/2fa/"));
  assert.ok(checks.length >= 2, JSON.stringify(sent));
  const preToken = checks[0].header.slice("Bearer ".length);
  const session = JSON.parse(await page.evaluate(() => localStorage.getItem("keygate.apiBrowser.session")));
  assert.ok(session.refreshToken, "the pair's refresh token is kept");
  assert.notEqual(session.token, preToken);
  const stored = await page.evaluate(() => JSON.stringify(localStorage));
  assert.ok(!stored.includes(preToken), "the pre-verification token is not stored");
  assert.ok(!stored.includes(PASSWORD), "the password is never stored");
  const user = sent.filter((s) => s.url.endsWith("/api/auth/user"));
  assert.ok(user.length > 0 && user.every((s) => s.header === `Bearer ${session.token}`), JSON.stringify(user));
  assert.deepEqual(violations, [], "the second step stays within the content policy");
  await context.close();
});
