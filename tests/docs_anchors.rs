//! The documentation's pointers into the code stay true: every anchor in
//! docs/lifecycle.md names a function that exists where it says, and the
//! crate's table of contents (src/lib.rs) names every module.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `` `src/<path>.rs:<name>` `` in `text`, as (file, function name).
fn anchors(text: &str) -> Vec<(String, String)> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|span| {
            let (file, name) = span.split_once(".rs:")?;
            let file = format!("{file}.rs");
            let is_name =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            (file.starts_with("src/") && !file.contains(' ') && is_name)
                .then(|| (file, name.to_owned()))
        })
        .collect()
}

/// Whether `source` defines `fn name` (any visibility, async or not,
/// generic or not).
fn defines(source: &str, name: &str) -> bool {
    let needle = format!("fn {name}");
    source.match_indices(&needle).any(|(at, _)| {
        let before = source[..at].chars().next_back();
        let after = source[at + needle.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            && matches!(after, Some('(' | '<'))
    })
}

#[test]
fn every_lifecycle_anchor_names_a_file_that_defines_that_function() {
    let page = root().join("docs/lifecycle.md");
    let text = std::fs::read_to_string(&page).expect("docs/lifecycle.md exists");
    let anchors = anchors(&text);
    assert!(
        !anchors.is_empty(),
        "docs/lifecycle.md has no `src/<path>.rs:<name>` anchor to check"
    );
    let mut wrong = Vec::new();
    for (file, name) in &anchors {
        match std::fs::read_to_string(root().join(file)) {
            Ok(source) if defines(&source, name) => {}
            Ok(_) => wrong.push(format!("`{file}:{name}`: {file} defines no fn {name}")),
            Err(_) => wrong.push(format!("`{file}:{name}`: there is no {file}")),
        }
    }
    assert!(wrong.is_empty(), "docs/lifecycle.md:\n{}", wrong.join("\n"));
}

/// The modules under `src/`: each `src/*.rs` but lib.rs and main.rs, and
/// each directory with a mod.rs.
fn modules(src: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(src)
        .unwrap()
        .filter_map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_stem()?.to_str()?.to_owned();
            if path.is_dir() {
                path.join("mod.rs").is_file().then_some(name)
            } else {
                let rust = path.extension().is_some_and(|e| e == "rs");
                (rust && name != "lib" && name != "main").then_some(name)
            }
        })
        .collect();
    names.sort();
    names
}

#[test]
fn the_crate_table_of_contents_names_every_module() {
    let src = root().join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let contents: String = lib
        .lines()
        .filter_map(|line| line.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let modules = modules(&src);
    assert!(modules.len() > 10, "found the modules: {modules:?}");
    let missing: Vec<&String> = modules
        .iter()
        .filter(|name| !contents.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "src/lib.rs's doc comment does not name these modules (as [`name`] or `name`): {missing:?}"
    );
}

#[test]
fn anchors_are_read_from_code_spans_only() {
    let text = "see `src/app.rs:admit` and `src/path.rs:normalize`, not src/x.rs:y or `a b.rs:c`";
    assert_eq!(
        anchors(text),
        [
            ("src/app.rs".to_owned(), "admit".to_owned()),
            ("src/path.rs".to_owned(), "normalize".to_owned())
        ]
    );
    assert!(defines("pub async fn admit<'p>(", "admit"));
    assert!(!defines("fn admit_quota(", "admit"));
    assert!(!defines("fn readmit(", "admit"));
}
