use std::os::unix::fs::symlink;

use super::*;

/// A dir holding `server` (an executable script), `data` (not executable),
/// `innocent` (a symlink to /bin/sh) and `work/` (a directory).
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let server = dir.path().join("server");
        std::fs::write(&server, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&server, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("data"), "x").unwrap();
        symlink("/bin/sh", dir.path().join("innocent")).unwrap();
        std::fs::create_dir(dir.path().join("work")).unwrap();
        Fixture { dir }
    }

    fn path(&self, rel: &str) -> String {
        self.dir.path().join(rel).display().to_string()
    }

    /// Allows `server` (any args), `/bin/true` pinned to `--x`, the own
    /// binary (`own`, a copy of `server`'s path) and `work/` for cwd.
    fn policy(&self) -> CommandPolicy {
        let cfg = McpConfig {
            allowed_commands: vec![
                AllowedCommand {
                    program: Some(self.dir.path().join("server")),
                    args_prefix: vec![],
                },
                AllowedCommand {
                    program: Some(PathBuf::from("/bin/true")),
                    args_prefix: vec!["--x".into()],
                },
                AllowedCommand::own_binary(),
            ],
            allowed_dirs: vec![self.dir.path().join("work")],
        };
        let mut p = CommandPolicy::new(&cfg, Some(PathBuf::from("/bin/echo")));
        p.path_var = Some(self.dir.path().as_os_str().to_owned());
        p
    }
}

fn check(p: &CommandPolicy, command: &str, args: &[&str]) -> Result<Allowed, Refused> {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    p.check(command, &args, &[], None)
}

#[test]
fn an_allowed_program_runs_by_its_canonical_path() {
    let f = Fixture::new();
    let p = f.policy();
    let ok = check(&p, &f.path("server"), &["--port", "1"]).unwrap();
    assert_eq!(ok.program, std::fs::canonicalize(f.path("server")).unwrap());
    // The same file by a detour is the same program.
    let detour = format!("{}/work/../server", f.dir.path().display());
    assert_eq!(check(&p, &detour, &[]).unwrap().program, ok.program);
    // A bare name is looked up on the PATH, then matched the same way.
    assert_eq!(check(&p, "server", &[]).unwrap().program, ok.program);
}

#[test]
fn a_program_outside_the_list_is_refused_naming_what_it_is() {
    let f = Fixture::new();
    let p = f.policy();
    let err = check(&p, "/bin/sh", &["-c", "id"]).unwrap_err();
    assert!(matches!(err, Refused::NotAllowed { .. }), "{err:?}");
    assert_eq!(err.key(), "command");
    assert!(err.to_string().contains("allowed_commands"), "{err}");
}

#[test]
fn path_tricks_do_not_pass_for_an_allowed_program() {
    let f = Fixture::new();
    let p = f.policy();
    let err = check(&p, "/bin/../bin/sh", &[]).unwrap_err();
    assert!(matches!(err, Refused::NotAllowed { .. }), "{err:?}");
    // A symlink named innocently is judged by what it points at.
    let err = check(&p, &f.path("innocent"), &[]).unwrap_err();
    match &err {
        Refused::NotAllowed { resolved, .. } => {
            assert_eq!(resolved, &std::fs::canonicalize("/bin/sh").unwrap())
        }
        other => panic!("{other:?}"),
    }
    // Relative paths depend on the node's working directory: refused.
    for rel in ["./server", "bin/sh", "../server"] {
        let err = check(&p, rel, &[]).unwrap_err();
        assert!(matches!(err, Refused::Relative { .. }), "{rel}: {err:?}");
    }
    // Not executable, or not there.
    assert!(matches!(
        check(&p, &f.path("data"), &[]),
        Err(Refused::NotFound { .. })
    ));
    assert!(matches!(
        check(&p, "no-such-program-here", &[]),
        Err(Refused::NotFound { .. })
    ));
}

#[test]
fn pinned_arguments_must_lead() {
    let f = Fixture::new();
    let p = f.policy();
    check(&p, "/bin/true", &["--x", "more"]).unwrap();
    let err = check(&p, "/bin/true", &["--y"]).unwrap_err();
    assert_eq!(err.key(), "args");
    assert!(err.to_string().contains("--x"), "{err}");
}

#[test]
fn the_own_binary_runs_only_its_mcp_servers() {
    let f = Fixture::new();
    let p = f.policy();
    let ok = check(&p, "crewlet", &["mcp", "chat"]).unwrap();
    assert_eq!(ok.program, std::fs::canonicalize("/bin/echo").unwrap());
    // By its path too (the node hands children its absolute path).
    check(&p, "/bin/echo", &["mcp", "chat"]).unwrap();
    let err = check(&p, "crewlet", &["run", "--company", "/tmp/evil.toml"]).unwrap_err();
    assert_eq!(err.key(), "args");
}

#[test]
fn a_working_directory_must_lie_under_an_allowed_one() {
    let f = Fixture::new();
    let p = f.policy();
    let server = f.path("server");
    let inside = f.path("work");
    let ok = p.check(&server, &[], &[], Some(&inside)).unwrap();
    assert_eq!(ok.cwd, Some(std::fs::canonicalize(&inside).unwrap()));
    for bad in [
        "/tmp".to_owned(),
        format!("{inside}/.."),
        f.dir.path().display().to_string(),
    ] {
        let err = p.check(&server, &[], &[], Some(&bad)).unwrap_err();
        assert!(
            matches!(err, Refused::CwdNotAllowed { .. }),
            "{bad}: {err:?}"
        );
        assert_eq!(err.key(), "cwd");
    }
    let err = p.check(&server, &[], &[], Some("work")).unwrap_err();
    assert!(matches!(err, Refused::CwdRelative { .. }), "{err:?}");
    let err = p
        .check(&server, &[], &[], Some(&f.path("work/missing")))
        .unwrap_err();
    assert!(matches!(err, Refused::CwdNotFound { .. }), "{err:?}");
}

#[test]
fn loader_variables_are_refused() {
    let f = Fixture::new();
    let p = f.policy();
    let env = ["LD_PRELOAD".to_owned()];
    let err = p.check(&f.path("server"), &[], &env, None).unwrap_err();
    assert_eq!(err.key(), "env.LD_PRELOAD");
}

#[test]
fn a_company_is_checked_server_by_server_with_paths() {
    let f = Fixture::new();
    let p = f.policy();
    let doc = format!(
        r#"
[org]
name = "Acme"
timezone = "UTC"
[roles.dev]
system_prompt = "x"
executor = [{{ provider = "scripted", model = "m" }}]
reviewer = {{ provider = "scripted", model = "r" }}
[roles.dev.mcp.ok]
command = {server:?}
[roles.dev.mcp.shell]
command = "/bin/sh"
args = ["-c", "id"]
[roles.dev.mcp.elsewhere]
command = {server:?}
cwd = "/tmp"
[seats]
ada = {{ role = "dev" }}
"#,
        server = f.path("server")
    );
    let company = Company::parse(&doc).unwrap_or_else(|e| panic!("{e}"));
    let errors = p.check_company(&company);
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        ["roles.dev.mcp.elsewhere.cwd", "roles.dev.mcp.shell.command"]
    );
}
