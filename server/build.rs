//! Stamps `sessionstore --version` with the git commit it was built from
//! (when built from a git checkout; a source tarball says the version only).

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    Some(text.trim().to_owned())
}

/// Rebuild when `git_path` (a file under the git directory) changes, if it
/// exists: cargo reruns on every build for a missing file.
fn watch(git_path: &str) {
    if let Some(path) = git(&[
        "rev-parse",
        "--path-format=absolute",
        "--git-path",
        git_path,
    ]) && Path::new(&path).exists()
    {
        println!("cargo:rerun-if-changed={path}");
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // `sqlx::migrate!` embeds the migrations: a new one must rebuild.
    println!("cargo:rerun-if-changed=../migrations");
    let version = env!("CARGO_PKG_VERSION");
    let stamped = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(commit) => {
            watch("HEAD");
            watch("packed-refs");
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                watch(&branch);
                // A packed branch gets a file of its own at its next commit:
                // the directory it appears in is watched too.
                if let Some((directory, _)) = branch.rsplit_once('/') {
                    watch(directory);
                }
            }
            format!("{version} (commit {commit})")
        }
        None => version.to_owned(),
    };
    println!("cargo:rustc-env=SESSIONSTORE_VERSION={stamped}");
}
