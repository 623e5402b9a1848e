//! Embeds every `migrations/NNNN_name.sql` of the repository, in order.

use std::fmt::Write;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../migrations");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<(u32, String, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .map(|p| {
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            let (num, name) = stem
                .split_once('_')
                .unwrap_or_else(|| panic!("{}: expected NNNN_name.sql", p.display()));
            let version = num
                .parse()
                .unwrap_or_else(|_| panic!("{}: expected a numeric prefix", p.display()));
            (version, name.to_owned(), p.canonicalize().unwrap())
        })
        .collect();
    files.sort();
    for (i, (version, _, path)) in files.iter().enumerate() {
        assert_eq!(
            *version as usize,
            i + 1,
            "{}: migrations are numbered 1, 2, 3… without gaps",
            path.display()
        );
    }
    let mut out = String::from("&[\n");
    for (version, name, path) in &files {
        writeln!(
            out,
            "    Migration {{ version: {version}, name: {name:?}, sql: include_str!({:?}) }},",
            path.display().to_string()
        )
        .unwrap();
    }
    out.push(']');
    let dest = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("migrations.rs");
    std::fs::write(dest, out).unwrap();
}
