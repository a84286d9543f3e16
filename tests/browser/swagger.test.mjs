// The API browser end to end: keygate (and the reference upstream it fronts)
// started from the binaries `cargo test` built, the page loaded over HTTPS in
// Debian's headless Chromium, authorized as a person would, calls made with
// "Try it out".

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";

const ROOT = resolve(import.meta.dirname, "../..");
const KEYGATE = process.env.KEYGATE_BIN || join(ROOT, "target/debug/keygate");
const ENTITY_SERVICE = process.env.ENTITY_SERVICE_BIN || join(ROOT, "target/debug/examples/entity_service");
const ARTIFACTS = join(ROOT, "tests/artifacts");
const EMAIL = "browser@example.com";
const PASSWORD = "browser-password";
const TENANT = "5f1c0c9e-1d2a-4c3b-9e8f-0a1b2c3d4e5f";

let workdir, upstream, keygate, browser, base, apiKey;

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
`);
  const env = { ...process.env, KEYGATE_BOOTSTRAP_PASSWORD: "bootstrap-password", RUST_LOG: "info" };
  delete env.KEYGATE_CONFIG;
  const cli = (args, input = "") => execFileSync(KEYGATE, ["--config", config, ...args], { input, env, encoding: "utf8" });
  cli(["user", "add", "--email", EMAIL, "--authority", "TENANT_ADMIN", "--tenant-id", TENANT], PASSWORD + "\n");
  apiKey = cli(["apikey", "create", "--email", EMAIL]).trim().split("\n").pop();
  keygate = spawn(KEYGATE, ["--config", config, "--log-format", "json", "serve"], { env, stdio: ["ignore", "ignore", "pipe"] });
  const [, port] = await firstMatch(keygate.stderr, /"https":"Some\(127\.0\.0\.1:(\d+)\)"/, "keygate");
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
  if (workdir) rmSync(workdir, { recursive: true, force: true });
});

/** A fresh page (own storage) with the page loaded and the sent X-Authorization headers recorded. */
async function openPage(init) {
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1400, height: 1000 } });
  if (init) await context.addInitScript(init.script, init.arg);
  const page = await context.newPage();
  const sent = [];
  page.on("request", (request) => {
    const header = request.headers()["x-authorization"];
    if (header) sent.push({ url: request.url(), header });
  });
  await page.goto(`${base}/swagger-ui.html`);
  await page.waitForSelector("#operations-auth-controller-getUser", { timeout: 30_000 });
  return { context, page, sent };
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
  const { context, page, sent } = await openPage();
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
  const refreshed = page.waitForResponse((r) => r.url().endsWith("/api/auth/token") && r.status() === 200);
  await page.locator("#operations-auth-controller-getUser button.execute").click();
  await refreshed;
  await page.waitForResponse((r) => r.url().endsWith("/api/auth/user"));
  const [afterRefresh] = await tryItOut(page, "operations-auth-controller-getUser");
  assert.equal(afterRefresh, "200");
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
