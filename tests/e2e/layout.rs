//! Every host crate's files import one way: no circle inside any crate
//! (see `crewlet_testkit::layout`). Circles between crates are the build
//! graph's to refuse; `scripts/check-deps.sh` keeps the arrows pointing
//! the way ARCHITECTURE.md says.

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
