// Authorization for the API browser.
//
// HttpLoginForm: the Authorize dialog shows a username and password form for
// it (the document describes what goes on the wire, the X-Authorization
// header, so Swagger UI alone would show a single value box). The username and
// password are posted to /api/auth/login at once; only the resulting tokens are
// kept (in localStorage, so a reload keeps the session), never the password.
// Requests then carry "X-Authorization: Bearer <token>", refreshed when it
// expires. A refused login shows the server's message inside the dialog.
// ApiKeyForm: the user types the key only; requests carry "X-Authorization:
// ApiKey <key>". When both are authorized the Bearer token is sent.
// A user with a second factor: the login answers a pre-verification token
// (kept in memory only); the form then asks for a code (TOTP or a backup code)
// inside the dialog, checks it at /api/auth/2fa/verification/check and goes
// on with the token pair it answers. A user who must configure a second
// factor first (MFA_CONFIGURATION_TOKEN) is told so; the page keeps no token.
// A session of the main web UI in this origin (localStorage jwt_token and
// jwt_token_expiration, not expired, not a public token) is used without asking.
//
// Credentials go to this page's origin only: a request to any other origin is
// sent without X-Authorization (keygate's document names no other server, and
// the page's Content-Security-Policy refuses connections elsewhere too).
(function () {
  "use strict";
  var SESSION = "keygate.apiBrowser.session";
  var LOGIN = "HttpLoginForm";
  var APIKEY = "ApiKeyForm";

  function decode(token) {
    try {
      var part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
      return JSON.parse(atob(part + "===".slice((part.length + 3) % 4)));
    } catch (e) { return null; }
  }
  function loadSession() {
    try { return JSON.parse(localStorage.getItem(SESSION)); } catch (e) { return null; }
  }
  function saveSession(pair) {
    var claims = decode(pair.token) || {};
    var session = { token: pair.token, refreshToken: pair.refreshToken || null, exp: claims.exp || 0, sub: claims.sub || "" };
    localStorage.setItem(SESSION, JSON.stringify(session));
    return session;
  }
  function clearSession() { localStorage.removeItem(SESSION); }

  // The main web UI's session, when usable.
  function mainUiSession() {
    var token = localStorage.getItem("jwt_token");
    var expiration = Number(localStorage.getItem("jwt_token_expiration") || 0);
    if (!token || !expiration || expiration <= Date.now()) { return null; }
    var claims = decode(token);
    if (!claims || claims.isPublic) { return null; }
    return { token: token, refreshToken: localStorage.getItem("refresh_token"), exp: claims.exp || Math.floor(expiration / 1000), sub: claims.sub || "" };
  }

  // The URL resolved against the page, or null when it is on another origin.
  function sameOrigin(url) {
    try {
      var resolved = new URL(url, window.location.href);
      return resolved.origin === window.location.origin ? resolved : null;
    } catch (e) { return null; }
  }
  // A call of keygate's own endpoints: this origin, no redirect followed.
  function ownCall(path, init) {
    var url = sameOrigin(path);
    if (!url) { return Promise.reject(new Error("refusing a call to another origin")); }
    return fetch(url.href, Object.assign({ credentials: "same-origin", redirect: "error" }, init));
  }
  function dropCredentials(headers) {
    Object.keys(headers || {}).forEach(function (name) {
      var lower = name.toLowerCase();
      if (lower === "authorization" || lower === "x-authorization") { delete headers[name]; }
    });
  }

  function answerOf(response) {
    return response.json().catch(function () { return {}; }).then(function (json) {
      if (!response.ok) {
        var error = new Error(json.message || ("HTTP " + response.status));
        error.status = response.status;
        throw error;
      }
      return json;
    });
  }
  function postJson(path, body) {
    return ownCall(path, {
      method: "POST",
      headers: { "Content-Type": "application/json", "Accept": "application/json" },
      body: JSON.stringify(body)
    }).then(answerOf);
  }
  // A call of a second-factor endpoint with the pre-verification token.
  function withPreToken(method, path, token) {
    return ownCall(path, {
      method: method,
      headers: { "Accept": "application/json", "X-Authorization": "Bearer " + token }
    }).then(answerOf);
  }

  // The login waiting for its second factor: its token (in memory only, never
  // stored), the providers the user may answer with, and what to do with the
  // pair. The login form listens to it.
  var pending = null;
  var listeners = [];
  function setPending(next) {
    pending = next;
    listeners.forEach(function (listener) { listener(pending); });
  }
  var PROVIDER_LABELS = { TOTP: "code from the authenticator app", BACKUP_CODE: "backup code", EMAIL: "code sent by e-mail" };

  // A valid access token for the login session: refreshed when expired, or
  // nothing (and the user is asked to authorize again).
  var refreshing = null;
  function sessionToken() {
    var session = loadSession();
    if (!session) { return Promise.resolve(null); }
    if (session.exp * 1000 > Date.now() + 5000) { return Promise.resolve(session.token); }
    if (!session.refreshToken) { return Promise.resolve(expired()); }
    refreshing = refreshing || postJson("/api/auth/token", { refreshToken: session.refreshToken })
      .then(function (pair) { return saveSession(pair).token; })
      .catch(function () { return expired(); })
      .then(function (token) { refreshing = null; return token; });
    return refreshing;
  }
  // Shows a message under the login form of the Authorize dialog.
  function loginError(system, message) {
    system.errActions.clear({ authId: LOGIN });
    if (message) {
      system.errActions.newAuthErr({ authId: LOGIN, source: "auth", level: "error", message: message });
    }
  }

  function expired() {
    clearSession();
    if (window.ui) {
      window.ui.authActions.logout([LOGIN]);
      loginError(window.ui, "The session has expired: log in again.");
    }
    return null;
  }

  function authorizedSchemes() {
    if (!window.ui) { return {}; }
    var authorized = window.ui.authSelectors.authorized();
    return authorized && authorized.toJS ? authorized.toJS() : {};
  }

  function requestInterceptor(request) {
    request.headers = request.headers || {};
    // Whatever Swagger UI added from the Authorize dialog goes first; only a
    // call to this origin gets a credential back.
    dropCredentials(request.headers);
    if (!sameOrigin(request.url)) { return request; }
    if (request.loadSpec || /\/v3\/api-docs$/.test(request.url)) { return request; }
    var schemes = authorizedSchemes();
    var apiKeyScheme = schemes[APIKEY];
    var apiKey = apiKeyScheme && apiKeyScheme.value ? String(apiKeyScheme.value).trim() : null;
    return sessionToken().then(function (token) {
      if (token) {
        request.headers["X-Authorization"] = "Bearer " + token;
      } else if (apiKey) {
        request.headers["X-Authorization"] = /^ApiKey /.test(apiKey) ? apiKey : "ApiKey " + apiKey;
      }
      return request;
    });
  }

  // The dialog's form for HttpLoginForm: a username and a password, said to
  // be posted to /api/auth/login, with the scheme's errors under it.
  function loginForm(system) {
    var React = system.React;
    var h = React.createElement;
    return function LoginForm(props) {
      var get = props.getComponent;
      var Input = get("Input"), Row = get("Row"), Col = get("Col"), AuthError = get("authError");
      var Markdown = get("Markdown", true);
      var typed = React.useRef({});
      var waiting = React.useState(pending);
      React.useEffect(function () {
        var listener = function (next) { waiting[1](next); };
        listeners.push(listener);
        return function () { listeners.splice(listeners.indexOf(listener), 1); };
      }, []);
      var second = waiting[0];
      var value = props.authorized && props.authorized.getIn([props.name, "value"]);
      var username = value && value.get ? value.get("username") : null;
      var errors = props.errSelectors.allErrors().filter(function (err) { return err.get("authId") === props.name; });
      function change(event) {
        typed.current[event.target.name] = event.target.value;
        props.onAuthChange({ name: props.name, schema: props.schema, value: Object.assign({}, typed.current) });
      }
      function field(name, label, type, autoComplete) {
        var id = "keygate-login-" + name;
        return h(Row, null,
          h("label", { htmlFor: id }, label),
          username
            ? h("code", null, name === "username" ? " " + username + " " : " ****** ")
            : h(Col, null, h(Input, { id: id, name: name, type: type, autoComplete: autoComplete, required: true, onChange: change })));
      }
      // The second step: which provider, and its code.
      function secondFactor() {
        var choose = function (event) { setPending(Object.assign({}, pending, { provider: event.target.value })); };
        return h("div", { className: "keygate-second-factor" },
          h(Row, null, h("p", null, "This account has a second factor: enter the " +
            (PROVIDER_LABELS[second.provider] || second.provider) + ", then Authorize.")),
          second.providers.length > 1
            ? h(Row, null,
              h("label", { htmlFor: "keygate-login-provider" }, "Second factor:"),
              h(Col, null, h("select", { id: "keygate-login-provider", value: second.provider, onChange: choose },
                second.providers.map(function (type) { return h("option", { key: type, value: type }, type); }))))
            : null,
          h(Row, null,
            h("label", { htmlFor: "keygate-login-code" }, "Code:"),
            h(Col, null, h(Input, { id: "keygate-login-code", name: "code", type: "text", inputMode: "text",
              autoComplete: "one-time-code", required: true, onChange: change }))));
      }
      return h("div", null,
        h("h4", null, h("code", null, props.name), " (username and password, posted to ", h("code", null, "/api/auth/login"), ")"),
        username ? h("h6", null, "Authorized") : null,
        h(Row, null, h(Markdown, { source: props.schema.get("description") })),
        field("username", "Username:", "text", "username"),
        field("password", "Password:", "password", "current-password"),
        second && !username ? secondFactor() : null,
        errors.valueSeq().map(function (error, index) { return h(AuthError, { error: error, key: index }); }));
    };
  }

  // Log in as soon as the dialog authorizes HttpLoginForm; keep no password.
  var LoginPlugin = function (system) {
    var LoginForm = loginForm(system);
    return {
      wrapComponents: {
        AuthItem: function (Original) {
          return function (props) {
            return system.React.createElement(props.name === LOGIN ? LoginForm : Original, props);
          };
        }
      },
      statePlugins: {
        auth: {
          wrapActions: {
            authorize: function (original, system) {
              return function (payload) {
                var login = payload && payload[LOGIN];
                if (!login || !login.value) { return original(payload); }
                var username = login.value.username;
                // The pair: kept, and the scheme authorized as today.
                var authorized = function (pair) {
                  setPending(null);
                  saveSession(pair);
                  var kept = {};
                  kept[LOGIN] = Object.assign({}, login, { value: { username: username, password: "" } });
                  original(kept);
                  system.authActions.persistAuthorizationIfNeeded();
                };
                var code = login.value.code ? String(login.value.code).trim() : "";
                if (pending && pending.username === username && code) {
                  loginError(system, null);
                  var check = "/api/auth/2fa/verification/check?providerType=" + encodeURIComponent(pending.provider) +
                    "&verificationCode=" + encodeURIComponent(code);
                  withPreToken("POST", check, pending.token)
                    .then(authorized)
                    .catch(function (error) {
                      // A 401: this login attempt is over (expired, or too
                      // many wrong codes); the password is asked again.
                      if (error.status === 401) { setPending(null); }
                      loginError(system, error.message);
                    });
                  return undefined;
                }
                if (!login.value.password) { return original(payload); }
                loginError(system, null);
                setPending(null);
                postJson("/api/auth/login", { username: username, password: login.value.password })
                  .then(function (answer) {
                    if (answer.scope === "PRE_VERIFICATION_TOKEN") {
                      return withPreToken("GET", "/api/auth/2fa/providers", answer.token).then(function (infos) {
                        var providers = (infos || []).map(function (info) { return info.type; });
                        var preferred = (infos || []).filter(function (info) { return info["default"]; })[0];
                        setPending({
                          token: answer.token,
                          username: username,
                          providers: providers,
                          provider: preferred ? preferred.type : (providers[0] || "TOTP")
                        });
                      });
                    }
                    if (answer.scope === "MFA_CONFIGURATION_TOKEN") {
                      throw new Error("This account must configure a second factor before it can log in: " +
                        "configure one in the web UI (or with /api/2fa/account/config), then log in again.");
                    }
                    authorized(answer);
                  })
                  .catch(function (error) {
                    // The contract's message ("Invalid username or password"), in the dialog.
                    loginError(system, error.message);
                  });
                return undefined;
              };
            },
            logout: function (original) {
              return function (names) {
                if (names && names.indexOf(LOGIN) >= 0) {
                  setPending(null);
                  var session = loadSession();
                  if (session) {
                    ownCall("/api/auth/logout", { method: "POST", headers: { "X-Authorization": "Bearer " + session.token } })
                      .catch(function () { return null; });
                  }
                  clearSession();
                }
                return original(names);
              };
            }
          }
        }
      }
    };
  };

  window.onload = function () {
    window.ui = SwaggerUIBundle({
      url: "/v3/api-docs",
      dom_id: "#swagger-ui",
      deepLinking: true,
      persistAuthorization: true,
      displayRequestDuration: true,
      // BaseLayout: no top bar. The standalone layout's bar only offers a URL
      // box for other documents, and its logo carries an inline <style> that
      // the page's policy refuses.
      presets: [SwaggerUIBundle.presets.apis],
      plugins: [LoginPlugin],
      layout: "BaseLayout",
      requestInterceptor: requestInterceptor,
      // No badge from validator.swagger.io: the page talks to its origin only.
      validatorUrl: null,
      onComplete: function () {
        var session = loadSession();
        if (!session) {
          var main = mainUiSession();
          if (main) { session = main; localStorage.setItem(SESSION, JSON.stringify(main)); }
        }
        if (session && !authorizedSchemes()[LOGIN]) {
          window.ui.preauthorizeBasic(LOGIN, session.sub, "");
        }
      }
    });
  };
})();
