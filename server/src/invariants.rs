//! ARCHITECTURE.md's invariants that a look at the source can check.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `src/<dir>`, with its text.
fn sources(dir: &str) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {dir:?}: {e}"));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let text =
                    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path:?}: {e}"));
                out.push((path, text));
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir),
        &mut out,
    );
    assert!(!out.is_empty(), "no sources under src/{dir}");
    out
}

/// The lines of code (comments aside) that name one of `names`.
fn naming(dir: &str, names: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in sources(dir) {
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if names.iter().any(|name| code.contains(name)) {
                found.push(format!(
                    "{}:{}: {}",
                    path.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    found
}

#[test]
fn the_store_speaks_no_protobuf() {
    // Its encodings go through `wire`.
    let found = naming("store", &["prost", "sessionstore_client", "pb::"]);
    assert!(
        found.is_empty(),
        "the store names protobuf:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_domain_knows_no_protobuf_sql_or_grpc() {
    let found = naming(
        "domain",
        &["prost", "sessionstore_client", "sqlx", "tonic", "rusqlite"],
    );
    assert!(
        found.is_empty(),
        "the domain names a wire or a database:\n{}",
        found.join("\n")
    );
}

/// Functions of more than `max` lines under `src/<dir>`: from a line that
/// starts one (`fn`, at any indentation) to the line that closes it at the
/// same indentation.
fn long_functions(dir: &str, max: usize) -> Vec<String> {
    let mut long = Vec::new();
    for (path, text) in sources(dir) {
        let lines: Vec<&str> = text.lines().collect();
        for (start, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            let is_fn = !trimmed.starts_with("//")
                && (trimmed.starts_with("fn ") || trimmed.contains(" fn "));
            if !is_fn {
                continue;
            }
            // Its body opens where the signature ends with `{`; one ending
            // with `;` (a declaration) or `}` (one line) has none to count.
            let Some(open) = (start..lines.len()).find(|&at| {
                let end = lines[at].trim_end();
                end.ends_with('{') || end.ends_with(';') || end.ends_with('}')
            }) else {
                continue;
            };
            if !lines[open].trim_end().ends_with('{') {
                continue;
            }
            let close = format!("{indent}}}");
            if let Some(end) = (open + 1..lines.len()).find(|&at| lines[at] == close) {
                let length = end - start + 1;
                if length > max {
                    long.push(format!("{}:{}: {length} lines", path.display(), start + 1));
                }
            }
        }
    }
    long
}

#[test]
fn no_store_function_passes_100_lines() {
    let long = long_functions("store", 100);
    assert!(
        long.is_empty(),
        "functions over 100 lines:\n{}",
        long.join("\n")
    );
}
