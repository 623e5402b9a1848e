//! The house's shape, held against the code. Every host crate's files
//! import one way: no circle inside any crate (see
//! `crewlet_testkit::layout`). Circles between crates are the build
//! graph's to refuse; ARCHITECTURE.md's crate diagram draws that graph
//! exactly, one line per crate and one per arrow, so a crate added or a
//! dependency changed fails here until its line is added (the failure
//! says which lines), and `scripts/check-deps.sh` keeps the arrows that
//! matter most pointing the right way. Every path the page names from the
//! repository's root exists (`crewlet_testkit::doc_paths`).

#[test]
fn no_import_circle_in_any_host_crate() {
    let host = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("host");
    let mut crates: Vec<_> = std::fs::read_dir(&host)
        .expect("read host/")
        .map(|e| e.expect("a host/ entry").path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    crates.sort();
    assert!(crates.len() > 10, "found the host crates: {crates:?}");
    let circles: Vec<String> = crates
        .iter()
        .flat_map(|src| {
            crewlet_testkit::layout::import_cycles(src)
                .into_iter()
                .map(move |c| format!("{}: {} -> {}", src.display(), c.join(" -> "), c[0]))
        })
        .collect();
    assert!(
        circles.is_empty(),
        "import circles (each file should import one way; move the shared piece down):\n{}",
        circles.join("\n")
    );
}

/// ARCHITECTURE.md's crate diagram is the build graph: every workspace
/// crate named, every normal dependency between them drawn, nothing drawn
/// that the manifests do not hold (`crewlet_testkit::diagram`: one line a
/// crate, one line an arrow).
#[test]
fn the_crate_diagram_is_the_build_graph() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let picture = crewlet_testkit::diagram::drawn(&doc)
        .unwrap_or_else(|e| panic!("ARCHITECTURE.md's crate diagram: {e}"));
    let code = crewlet_testkit::diagram::built(&root.join("Cargo.toml"));
    assert!(
        code.crates.len() > 10,
        "cargo metadata names the crates: {code:?}"
    );
    let fixes = crewlet_testkit::diagram::fixes(&picture, &code);
    assert!(
        fixes.is_empty(),
        "ARCHITECTURE.md's crate diagram (under {:?}) differs from the build graph; in the diagram:\n{}",
        crewlet_testkit::diagram::HEADING,
        fixes.join("\n")
    );
}

/// Every path ARCHITECTURE.md names from the repository's root exists: a
/// file moved or renamed fails here until the page follows it.
#[test]
fn every_path_the_architecture_page_names_exists() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    assert!(
        crewlet_testkit::doc_paths::named(&doc).len() > 100,
        "ARCHITECTURE.md's paths are read"
    );
    let missing = crewlet_testkit::doc_paths::missing(&doc, root);
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist (fix each to where the code is now):\n{}",
        missing.join("\n")
    );
}
