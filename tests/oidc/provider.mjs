// A real OpenID provider (the certified `oidc-provider` package) on loopback
// over HTTPS, for keygate's single sign-on tests (tests/single_sign_on.rs,
// driven by tests/common/oidc.rs).
//
//   node provider.mjs --cert C --key K --jwks J --redirect-uri U \
//        [--port 0] [--client-secret S] [--auth-method client_secret_basic]
//
// Every option may also come from the environment (OIDC_TEST_PORT,
// OIDC_TEST_CERT, OIDC_TEST_KEY, OIDC_TEST_JWKS, OIDC_TEST_REDIRECT_URI,
// OIDC_TEST_CLIENT_SECRET, OIDC_TEST_AUTH_METHOD). Port 0 picks a free one.
// The issuer is `https://localhost:<port>`; the signing keys are the JWKS
// file's (written by the test, which keeps the private key to forge tokens).
//
// Prints one line `ready <issuer>` once listening; exits on stdin EOF or
// SIGTERM. `GET /test/jwks-count` answers `{"count": N}`: how many times the
// key set (`/jwks`) was fetched.
import { readFileSync } from 'node:fs';
import * as https from 'node:https';
import { parseArgs } from 'node:util';

import Provider from 'oidc-provider';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string', default: process.env.OIDC_TEST_PORT ?? '0' },
    cert: { type: 'string', default: process.env.OIDC_TEST_CERT },
    key: { type: 'string', default: process.env.OIDC_TEST_KEY },
    jwks: { type: 'string', default: process.env.OIDC_TEST_JWKS },
    'redirect-uri': { type: 'string', default: process.env.OIDC_TEST_REDIRECT_URI },
    'client-secret': {
      type: 'string',
      default: process.env.OIDC_TEST_CLIENT_SECRET ?? 'keygate-test-secret',
    },
    'auth-method': {
      type: 'string',
      default: process.env.OIDC_TEST_AUTH_METHOD ?? 'client_secret_basic',
    },
  },
});

for (const name of ['cert', 'key', 'jwks', 'redirect-uri']) {
  if (!args[name]) {
    console.error(`provider.mjs: --${name} is required`);
    process.exit(2);
  }
}

// The resource server whose access tokens keygate accepts, and a second one
// (same provider, same keys) whose tokens carry another audience.
const API = 'https://api.keygate.test';
const OTHER_API = 'https://other.keygate.test';

// Logins are the user names; the password is not checked (the built-in
// development interactions accept any).
const USERS = {
  alice: {
    email: 'alice@example.com',
    email_verified: true,
    given_name: 'Alice',
    family_name: 'Liddell',
    groups: ['iot-admins'],
  },
  bob: {
    email: 'bob@example.com',
    email_verified: false,
    given_name: 'Bob',
    family_name: 'Builder',
    groups: ['iot-users'],
  },
  // U+0130 (capital I with dot above): lower-cased by Unicode rules it is
  // "i̇" (i + U+0307), never "i"; it must not land on alice's account.
  mallory: {
    email: 'ALİCE@example.com',
    email_verified: true,
    given_name: 'Mallory',
    family_name: 'Mallet',
    groups: ['iot-admins'],
  },
  // Signed in with a second factor at the provider (amr shows it).
  carol: {
    email: 'carol@example.com',
    email_verified: true,
    given_name: 'Carol',
    family_name: 'Cipher',
    groups: ['iot-users'],
    amr: ['pwd', 'otp', 'mfa'],
  },
  // In no group that an authority map names.
  dave: {
    email: 'dave@example.com',
    email_verified: true,
    given_name: 'Dave',
    family_name: 'Visitor',
    groups: ['visitors'],
  },
};

const jwks = JSON.parse(readFileSync(args.jwks, 'utf8'));
const signingAlg = jwks.keys[0].alg ?? 'ES256';

let jwksFetches = 0;

const server = https.createServer({
  cert: readFileSync(args.cert),
  key: readFileSync(args.key),
});

// A second listener on ::1 (when the machine has one) serves the same
// provider, so a client that resolves `localhost` to ::1 first finds it too.
const serverV6 = https.createServer({
  cert: readFileSync(args.cert),
  key: readFileSync(args.key),
});

function listen(srv, port, host) {
  return new Promise((resolve, reject) => {
    srv.once('error', reject);
    srv.listen(port, host, () => {
      srv.off('error', reject);
      resolve(srv.address().port);
    });
  });
}

const port = await listen(server, Number(args.port), '127.0.0.1');
const issuer = `https://localhost:${port}`;
await listen(serverV6, port, '::1').catch(() => serverV6.close());

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: 'keygate',
      client_secret: args['client-secret'],
      redirect_uris: [args['redirect-uri']],
      response_types: ['code'],
      grant_types: ['authorization_code', 'refresh_token'],
      token_endpoint_auth_method: args['auth-method'],
      id_token_signed_response_alg: signingAlg,
    },
  ],
  // The discovery document lists only the method the client is registered
  // with, so a relying party that reads it picks the one that works.
  clientAuthMethods: [args['auth-method']],
  jwks,
  cookies: { keys: ['keygate-oidc-test-provider-cookie-key'] },
  pkce: { required: () => true },
  claims: {
    openid: ['sub', 'amr', 'auth_time'],
    email: ['email', 'email_verified'],
    profile: ['given_name', 'family_name', 'name', 'groups'],
    groups: ['groups'],
  },
  scopes: ['openid', 'offline_access', 'email', 'profile', 'groups', 'api'],
  // Every claim the scopes grant goes into the ID token, as most providers do.
  conformIdTokenClaims: false,
  async findAccount(_ctx, id) {
    const user = USERS[id];
    if (!user) return undefined;
    return {
      accountId: id,
      async claims() {
        const { amr: _amr, ...claims } = user;
        return { sub: id, name: `${user.given_name} ${user.family_name}`, ...claims };
      },
    };
  },
  features: {
    devInteractions: { enabled: true },
    resourceIndicators: {
      enabled: true,
      // Only an explicit `resource` asks for an API token; without one the
      // access token is the provider's own (opaque, for userinfo).
      defaultResource: (_ctx, _client, oneOf) => oneOf,
      useGrantedResource: () => true,
      getResourceServerInfo(_ctx, resource) {
        if (resource !== API && resource !== OTHER_API) {
          throw new Provider.errors.InvalidTarget();
        }
        return {
          audience: resource,
          scope: 'api',
          accessTokenTTL: 600,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: signingAlg } },
        };
      },
    },
  },
  // The API's access tokens name the user by e-mail, as keygate finds them,
  // and say whether it was verified (as Keycloak's do).
  async extraTokenClaims(_ctx, token) {
    const user = USERS[token.accountId];
    return user ? { email: user.email, email_verified: user.email_verified } : undefined;
  },
  ttl: {
    AccessToken: 600,
    AuthorizationCode: 60,
    IdToken: 600,
    Interaction: 600,
    Session: 3600,
    Grant: 3600,
  },
});

// The built-in login records no authentication methods; each user's `amr`
// (default: a password) goes into the session and from there the ID token.
const finished = provider.interactionFinished.bind(provider);
provider.interactionFinished = (req, res, result, options) => {
  if (result?.login) {
    result.login.amr = USERS[result.login.accountId]?.amr ?? ['pwd'];
  }
  return finished(req, res, result, options);
};

provider.use(async (ctx, next) => {
  if (ctx.path === '/test/jwks-count') {
    ctx.body = { count: jwksFetches };
    return;
  }
  if (ctx.path === '/jwks') {
    jwksFetches += 1;
  }
  await next();
});

// Quiet: the tests read errors from what the provider answers.
provider.on('server_error', (_ctx, err) => console.error('provider server_error', err));

const handler = provider.callback();
server.on('request', handler);
serverV6.on('request', handler);

const stop = () => {
  server.close();
  serverV6.close();
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
process.stdin.on('end', stop);
process.stdin.on('close', stop);
process.stdin.resume();

process.stdout.write(`ready ${issuer}\n`);
