//! Rebuild when the embedded migrations change.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
