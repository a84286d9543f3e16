//! Environment overrides: the platform's `JWT_*` names and
//! `KEYGATE_<SECTION>_<KEY>`, typed by the defaults.

use toml::Value;

/// `KEYGATE_` variables that are not config keys: the config file's path,
/// the first administrator's password, and the binary the test, soak, scan
/// and benchmark scripts run (they start keygate with their own environment,
/// so it sees the name too).
const NON_CONFIG_ENV: &[&str] = &[
    "KEYGATE_CONFIG",
    "KEYGATE_BOOTSTRAP_PASSWORD",
    "KEYGATE_BIN",
];

/// Variables of the test suites (`KEYGATE_TEST_DATABASE_URL` and the like):
/// there is no `[test]` section, so they are never config keys.
const TEST_ENV_PREFIX: &str = "KEYGATE_TEST_";

/// The platform's setting names, mapped onto `[jwt]`.
const PLATFORM_ENV: &[(&str, &str)] = &[
    ("JWT_TOKEN_EXPIRATION_TIME", "token_expiration_time"),
    (
        "JWT_REFRESH_TOKEN_EXPIRATION_TIME",
        "refresh_token_expiration_time",
    ),
    ("JWT_TOKEN_ISSUER", "token_issuer"),
    ("JWT_TOKEN_SIGNING_KEY", "token_signing_key"),
];

/// Applies `JWT_*` and `KEYGATE_<SECTION>_<KEY>` variables, typed by the schema.
pub(super) fn apply(
    value: &mut Value,
    schema: &Value,
    env: &[(String, String)],
    errors: &mut Vec<String>,
) {
    for found in overrides(schema, env, errors) {
        let Override {
            section,
            key,
            name,
            raw,
        } = found;
        let Some(expected) = schema.get(&section).and_then(|s| s.get(&key)) else {
            continue;
        };
        let Some(parsed) = typed(expected, raw) else {
            errors.push(format!(
                "{name}: expected {}, got {raw:?}",
                expected.type_str()
            ));
            continue;
        };
        if let Some(table) = value.as_table_mut() {
            let entry = table
                .entry(section)
                .or_insert_with(|| Value::Table(toml::Table::new()));
            if let Some(section_table) = entry.as_table_mut() {
                section_table.insert(key, parsed);
            }
        }
    }
}

/// One variable that sets one key.
struct Override<'a> {
    section: String,
    key: String,
    /// The variable's name, for messages.
    name: &'a str,
    raw: &'a str,
}

/// The variables that set keys: the platform's names first, then keygate's
/// own. A `KEYGATE_` variable that names no key is reported.
fn overrides<'a>(
    schema: &Value,
    env: &'a [(String, String)],
    errors: &mut Vec<String>,
) -> Vec<Override<'a>> {
    let mut sections: Vec<&str> = schema
        .as_table()
        .map(|t| {
            t.iter()
                .filter(|(_, v)| v.is_table())
                .map(|(k, _)| k.as_str())
                .collect()
        })
        .unwrap_or_default();
    // Longest first, so `api_keys_prefix` is not read as section `api`.
    sections.sort_by_key(|s| std::cmp::Reverse(s.len()));

    let mut overrides = Vec::new();
    for (name, raw) in env {
        if let Some((_, key)) = PLATFORM_ENV.iter().find(|(n, _)| n == name) {
            overrides.push(Override {
                section: "jwt".into(),
                key: (*key).into(),
                name,
                raw,
            });
        }
    }
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix("KEYGATE_") else {
            continue;
        };
        if NON_CONFIG_ENV.contains(&name.as_str()) || name.starts_with(TEST_ENV_PREFIX) {
            continue;
        }
        let lower = rest.to_ascii_lowercase();
        let found = sections.iter().find_map(|section| {
            let key = lower.strip_prefix(section)?.strip_prefix('_')?;
            schema.get(section)?.get(key)?;
            Some((section.to_string(), key.to_string()))
        });
        match found {
            Some((section, key)) => overrides.push(Override {
                section,
                key,
                name,
                raw,
            }),
            None => errors.push(format!("{name}: not a configuration setting")),
        }
    }
    overrides
}

/// A variable's text as the type the key's default has; `None` when it is
/// not one.
fn typed(expected: &Value, raw: &str) -> Option<Value> {
    match expected {
        Value::String(_) => Some(Value::String(raw.to_string())),
        Value::Integer(_) => raw.trim().parse::<i64>().ok().map(Value::Integer),
        Value::Boolean(_) => match raw.trim() {
            "true" | "1" => Some(Value::Boolean(true)),
            "false" | "0" => Some(Value::Boolean(false)),
            _ => None,
        },
        Value::Array(_) => Some(Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_string()))
                .collect(),
        )),
        _ => None,
    }
}
