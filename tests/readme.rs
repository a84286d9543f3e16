//! What the documentation shows must keep working: README's production
//! configuration passes `keygate check-config`, and every test the security
//! model names as the guard of a rule exists.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The fenced block between `<!-- NAME:begin -->` and `<!-- NAME:end -->`
/// in `text`, without its fences.
fn marked_block(text: &str, name: &str) -> String {
    let begin = format!("<!-- {name}:begin -->");
    let end = format!("<!-- {name}:end -->");
    let start = text
        .find(&begin)
        .unwrap_or_else(|| panic!("README.md has no {begin}"));
    let stop = text[start..]
        .find(&end)
        .unwrap_or_else(|| panic!("README.md has no {end}"))
        + start;
    let inner: Vec<&str> = text[start + begin.len()..stop].trim().lines().collect();
    assert!(
        inner.len() > 2 && inner[0].starts_with("```") && inner[inner.len() - 1] == "```",
        "the {name} block is one fenced code block"
    );
    inner[1..inner.len() - 1].join("\n")
}

#[test]
fn readme_production_configuration_passes_check_config() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let config = marked_block(&readme, "production-config");
    assert!(
        config.contains("postgres://") && config.contains("redis://"),
        "the production configuration uses PostgreSQL and Redis"
    );

    // The block's absolute paths, moved into a scratch folder that holds a
    // real certificate and its key.
    let dir = tempfile::tempdir().unwrap();
    let etc = dir.path().join("etc");
    let data = dir.path().join("data");
    std::fs::create_dir_all(etc.join("tls")).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["api.example.com".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(etc.join("tls/fullchain.pem"), cert.pem()).unwrap();
    std::fs::write(etc.join("tls/privkey.pem"), key.serialize_pem()).unwrap();
    let config = config
        .replace("/etc/keygate/", &format!("{}/", etc.display()))
        .replace("/var/lib/keygate", &data.display().to_string());
    assert!(
        !config.contains("/etc/keygate") && !config.contains("/var/lib/keygate"),
        "every path of the block is under /etc/keygate or /var/lib/keygate"
    );
    let path: PathBuf = dir.path().join("keygate.toml");
    std::fs::write(&path, &config).unwrap();

    // Only PATH from the environment: no KEYGATE_* variable of the machine
    // running the test may change what is checked.
    let out = Command::new(env!("CARGO_BIN_EXE_keygate"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .arg("--config")
        .arg(&path)
        .arg("check-config")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "README's production configuration is refused:\n{stderr}\n{config}"
    );
    assert!(
        stdout.contains("configuration is valid (2 routes)"),
        "{stdout}"
    );
}

/// Every `fn` name in the Rust files under `dir`.
fn function_names(dir: &Path, into: &mut std::collections::BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            function_names(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for rest in text.split("fn ").skip(1) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    into.insert(name);
                }
            }
        }
    }
}

/// The names in backticks that read as a test's: snake case of four words
/// or more, not a metric (`keygate_...`, `process_...`).
fn named_tests(text: &str) -> Vec<&str> {
    let mut names: Vec<&str> = text
        .split('`')
        // Every piece between two backticks: a name is one token, so prose
        // (a fence's parity aside) never passes the filter.
        .filter(|name| {
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && name.starts_with(|c: char| c.is_ascii_lowercase())
                && name.matches('_').count() >= 3
                && !name.starts_with("keygate_")
                && !name.starts_with("process_")
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

#[test]
fn security_document_names_only_tests_that_exist() {
    let text = std::fs::read_to_string(repo().join("docs/security.md")).unwrap();
    let named = named_tests(&text);
    // The document's rules are guarded by many tests; finding few means the
    // names were lost, not that they all exist.
    assert!(
        named.len() >= 50,
        "only {} test names in docs/security.md",
        named.len()
    );
    let mut functions = std::collections::BTreeSet::new();
    function_names(&repo().join("tests"), &mut functions);
    function_names(&repo().join("src"), &mut functions);
    let missing: Vec<&&str> = named
        .iter()
        .filter(|name| !functions.contains(**name))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/security.md names tests that do not exist (renamed or removed?): {missing:?}"
    );
}

#[test]
fn named_tests_are_the_long_snake_case_names_in_backticks() {
    let text = "guarded (`api_key_sent_in_clear_is_refused`), metric \
                `keygate_upstream_errors_total`, `process_cpu_seconds_total`, \
                key `proxy.trusted_proxies`, `max_connections`, `X_Not_Snake_Case_Name`";
    assert_eq!(named_tests(text), ["api_key_sent_in_clear_is_refused"]);
}

/// Every alert of the rules file has its row in the deployment guide's alert
/// table, and the table names no alert the rules file lacks: an operator
/// paged by one finds what it means.
#[test]
fn every_alert_in_the_rules_file_is_listed_in_the_deployment_guide() {
    let rules =
        std::fs::read_to_string(repo().join("deploy/prometheus/keygate-rules.yaml")).unwrap();
    let guide = std::fs::read_to_string(repo().join("docs/deploying.md")).unwrap();
    let defined: std::collections::BTreeSet<&str> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert:"))
        .map(str::trim)
        .collect();
    assert!(
        defined.len() >= 5,
        "the rules file defines its alerts: {defined:?}"
    );
    let listed: std::collections::BTreeSet<&str> = guide
        .lines()
        .filter_map(|line| line.strip_prefix("| `Keygate"))
        .filter_map(|rest| rest.split('`').next())
        .collect();
    let listed: std::collections::BTreeSet<String> =
        listed.iter().map(|name| format!("Keygate{name}")).collect();
    let defined: std::collections::BTreeSet<String> =
        defined.iter().map(|name| (*name).to_owned()).collect();
    assert_eq!(
        defined, listed,
        "docs/deploying.md's alert table lists exactly the alerts of deploy/prometheus/keygate-rules.yaml"
    );
}
