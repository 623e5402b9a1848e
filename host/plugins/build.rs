//! Embeds the guest SDK (`plugins/sdk`) and the WIT (`wit/`) that
//! `crewlet plugins new` ships beside a new plugin, file by file, so the
//! copy a binary writes is always the tree it was built from: no list to
//! keep by hand. `src/scaffold.rs` includes the generated table.

use std::path::{Path, PathBuf};

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let repo = manifest_dir.join("../..").canonicalize().unwrap();
    let mut files = Vec::new();
    for (from, to) in [
        ("plugins/sdk", "crewlet-sdk/plugins/sdk"),
        ("wit", "crewlet-sdk/wit"),
    ] {
        let root = repo.join(from);
        println!("cargo::rerun-if-changed={}", root.display());
        walk(&root, &root, to, &mut files);
    }
    files.sort();
    let mut out = String::from("/// Every file shipped, as (path under the plugin, contents).\n");
    out.push_str("pub(crate) const SDK_FILES: &[(&str, &str)] = &[\n");
    for (rel, path) in &files {
        out.push_str(&format!(
            "    ({rel:?}, include_str!({:?})),\n",
            path.display().to_string()
        ));
    }
    out.push_str("];\n");
    let dest = PathBuf::from(std::env::var_os("OUT_DIR").unwrap()).join("sdk_files.rs");
    std::fs::write(dest, out).unwrap();
}

/// Every file under `dir` (a build's `target/` excepted), as its path under
/// `to` and its path on disk.
fn walk(root: &Path, dir: &Path, to: &str, files: &mut Vec<(String, PathBuf)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            walk(root, &path, to, files);
        } else {
            let rel = path.strip_prefix(root).unwrap().to_str().unwrap();
            files.push((format!("{to}/{rel}"), path));
        }
    }
}
