//! ARCHITECTURE.md's invariants that a look at the source can check.
//! Test code only (`lib.rs` includes it under `cfg(test)`).
#![cfg(test)]

use std::path::{Path, PathBuf};

/// Every `.rs` file under `src/<dir>`, with its text.
fn sources(dir: &str) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {dir:?}: {e}"));
        for entry in entries {
            let path = match entry {
                Ok(entry) => entry.path(),
                Err(e) => panic!("read an entry of {dir:?}: {e}"),
            };
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

/// The module a source file is (`store::sqlite::wal` for
/// `src/store/sqlite/wal.rs`, `store` for `src/store/mod.rs`).
fn module_of(path: &Path) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let relative = path.strip_prefix(&src).unwrap_or(path).with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .map(|part| part.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|last| last == "mod" || last == "lib")
    {
        parts.pop();
    }
    parts
}

/// The paths a file names through `crate::` and `super::`, as module
/// paths from the crate's root (what follows the last module is cut later,
/// against the modules that exist). `use` lists are expanded.
fn named_paths(module: &[String], text: &str) -> Vec<Vec<String>> {
    let mut code = String::new();
    for line in text.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        code.push_str(line.split("//").next().unwrap_or_default());
        code.push('\n');
    }
    // Tests may reach anywhere: the test module of a file is left out.
    if let Some(at) = code.find("#[cfg(test)]\nmod tests") {
        code.truncate(at);
    }
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        if !code.is_char_boundary(at) {
            at += 1;
            continue;
        }
        let rest = &code[at..];
        let starts = rest.starts_with("crate::") || rest.starts_with("super::");
        let boundary = at == 0
            || !(bytes[at - 1].is_ascii_alphanumeric()
                || bytes[at - 1] == b'_'
                || bytes[at - 1] == b':');
        if !(starts && boundary) {
            at += 1;
            continue;
        }
        // The path, with any `{…}` list, up to where it ends.
        let mut end = 0;
        let mut depth = 0;
        for (offset, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth > 0 => depth -= 1,
                c if depth == 0 && !(c.is_alphanumeric() || c == '_' || c == ':') => {
                    end = offset;
                    break;
                }
                _ => {}
            }
            end = offset + c.len_utf8();
        }
        for path in expand(&rest[..end]) {
            let mut parts: Vec<String> = path.split("::").map(str::to_owned).collect();
            let absolute = match parts.first().map(String::as_str) {
                Some("crate") => parts.split_off(1),
                _ => {
                    // Each `super` is one module up (a mod.rs is its
                    // folder's module, a file its own).
                    let mut base = module.to_vec();
                    while parts.first().is_some_and(|p| p == "super") {
                        parts.remove(0);
                        base.pop();
                    }
                    base.extend(parts);
                    base
                }
            };
            paths.push(absolute);
        }
        at += end.max(1);
    }
    paths
}

/// `a::{b, c::{d, e}}` as `a::b`, `a::c::d`, `a::c::e`.
fn expand(path: &str) -> Vec<String> {
    let path: String = path.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = path.find('{') else {
        return vec![path.trim_end_matches("::").to_owned()];
    };
    let head = &path[..open];
    let inner = &path[open + 1..path.rfind('}').unwrap_or(path.len())];
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (at, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|item| !item.is_empty())
        .flat_map(|item| {
            let item = if item == "self" {
                String::new()
            } else {
                item.to_owned()
            };
            expand(&format!("{head}{item}"))
        })
        .collect()
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let files = sources("");
    let modules: std::collections::BTreeSet<Vec<String>> =
        files.iter().map(|(path, _)| module_of(path)).collect();
    // Each file's arrows: to the longest existing module a path names,
    // leaving out its own ancestors (a child using what its `mod.rs`
    // defines is how Rust modules share) and itself.
    let mut arrows: std::collections::BTreeMap<
        Vec<String>,
        std::collections::BTreeSet<Vec<String>>,
    > = Default::default();
    for (path, text) in &files {
        let module = module_of(path);
        for named in named_paths(&module, text) {
            let Some(target) = (0..=named.len())
                .rev()
                .map(|len| named[..len].to_vec())
                .find(|prefix| modules.contains(prefix))
            else {
                continue;
            };
            if target.is_empty() || module.starts_with(&target) {
                continue;
            }
            arrows.entry(module.clone()).or_default().insert(target);
        }
    }
    // A depth-first walk finds any circle.
    fn visit(
        node: &Vec<String>,
        arrows: &std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>>,
        path: &mut Vec<Vec<String>>,
        done: &mut std::collections::BTreeSet<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        if let Some(at) = path.iter().position(|step| step == node) {
            return Some(path[at..].to_vec());
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.clone());
        for next in arrows.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, arrows, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.clone());
        None
    }
    let mut done = Default::default();
    for module in &modules {
        if let Some(circle) = visit(module, &arrows, &mut Vec::new(), &mut done) {
            let names: Vec<String> = circle.iter().map(|m| m.join("::")).collect();
            panic!("an import circle: {} -> back", names.join(" -> "));
        }
    }
}
