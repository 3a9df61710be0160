//! `shardline doctor` as an operator runs it: every check line is present on this host, `--json`
//! is one document whose verdict matches the exit code, usage errors exit 2, and under a seccomp
//! filter that refuses `io_uring_setup` with EPERM (as container runtimes' default profiles do)
//! the io_uring check fails naming seccomp, and the exit code is 1.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

const BIN: &str = env!("CARGO_BIN_EXE_shardline");

/// Every check, in report order.
const CHECK_NAMES: [&str; 10] = [
    "io_uring",
    "cpus",
    "cpu_quota",
    "numa",
    "open_files",
    "data_dir",
    "filesystem",
    "free_space",
    "o_direct",
    "fsync_latency",
];

/// `shardline doctor ARGS` with the data directory under `root`, free of `SHARDLINE_*` settings
/// from the environment that runs the tests.
fn doctor(root: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .arg("doctor")
        .arg("--data-dir")
        .arg(root.join("data"))
        .args(args)
        .env_remove("SHARDLINE_DATA_DIR")
        .env_remove("SHARDLINE_SHARDS")
        .env_remove("SHARDLINE_NO_PIN");
    command
}

/// Runs `command`; returns (exit code, stdout, stderr).
fn output(command: &mut Command) -> (i32, String, String) {
    let output = command.output().unwrap();
    (
        output.status.code().unwrap(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

fn parse_json(stdout: &str, stderr: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|error| {
        panic!("--json output does not parse: {error}\nstdout: {stdout}\nstderr: {stderr}")
    })
}

/// The check of `name` in a `--json` report.
fn json_check<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|check| check["name"] == name)
        .unwrap_or_else(|| panic!("no {name} check in {report}"))
}

#[test]
fn a_plain_run_prints_every_check_and_a_verdict_that_matches_the_exit_code() {
    let root = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(&mut doctor(root.path(), &[]));
    assert!(code == 0 || code == 1, "exit {code}\n{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), CHECK_NAMES.len() + 1, "{stdout}");
    for (line, name) in lines.iter().zip(CHECK_NAMES) {
        let (status, rest) = line.split_once(' ').unwrap();
        assert!(["ok", "warn", "fail"].contains(&status), "{line}");
        assert!(
            rest.trim_start().starts_with(&format!("{name}: ")),
            "{line}"
        );
    }
    let checks = &lines[..CHECK_NAMES.len()];
    let worst = ["fail", "warn", "ok"]
        .into_iter()
        .find(|status| {
            checks
                .iter()
                .any(|line| line.starts_with(&format!("{status} ")))
        })
        .unwrap();
    assert_eq!(code, i32::from(worst == "fail"), "{stdout}");
    let verdict = lines.last().unwrap();
    assert!(
        verdict.starts_with(&format!("verdict: {worst} (")),
        "{verdict}"
    );
    // The data directory is checked in its parent, never created; the scratch file is gone.
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
}

#[test]
fn json_is_one_document_with_every_check_and_the_verdict() {
    let root = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(&mut doctor(root.path(), &["--json"]));
    let report = parse_json(&stdout, &stderr);
    let checks = report["checks"].as_array().unwrap();
    let names: Vec<&str> = checks
        .iter()
        .map(|check| check["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, CHECK_NAMES);
    for check in checks {
        let status = check["status"].as_str().unwrap();
        assert!(["ok", "warn", "fail"].contains(&status), "{check}");
        assert!(!check["found"].as_str().unwrap().is_empty(), "{check}");
        // Every warn and fail says what to do.
        let fix = check["fix"].as_str().unwrap();
        assert_eq!(status == "ok", fix.is_empty(), "{check}");
    }
    let worst = ["fail", "warn", "ok"]
        .into_iter()
        .find(|status| checks.iter().any(|check| check["status"] == *status))
        .unwrap();
    assert_eq!(report["verdict"], worst);
    assert_eq!(code, i32::from(worst == "fail"), "{stdout}");
}

#[test]
fn usage_errors_exit_2() {
    let root = tempfile::tempdir().unwrap();
    for args in [
        &["--partitions", "many"][..],
        &["--shards", "0"],
        &["--no-such-flag"],
    ] {
        let (code, _, stderr) = output(&mut doctor(root.path(), args));
        assert_eq!(code, 2, "{args:?}: {stderr}");
    }
}

#[test]
fn more_pinned_shards_than_cores_fails_the_cpus_check_as_serve_would() {
    let root = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(&mut doctor(root.path(), &["--json", "--shards", "1024"]));
    let report = parse_json(&stdout, &stderr);
    let cpus = json_check(&report, "cpus");
    // No test host has 1024 allowed CPUs; if one does, the check is rightly ok.
    if cpus["status"] == "fail" {
        assert!(
            cpus["found"]
                .as_str()
                .unwrap()
                .contains("serve would refuse: --shards 1024: more shards than allowed cores"),
            "{cpus}"
        );
        assert!(cpus["fix"].as_str().unwrap().contains("--no-pin"), "{cpus}");
        assert_eq!(code, 1);
    } else {
        assert_eq!(cpus["status"], "ok", "{cpus}");
    }
    // With --no-pin serve accepts any count: the cpus check passes.
    let (_, stdout, stderr) = output(&mut doctor(
        root.path(),
        &["--json", "--shards", "1024", "--no-pin"],
    ));
    let report = parse_json(&stdout, &stderr);
    let cpus = json_check(&report, "cpus");
    assert_eq!(cpus["status"], "ok", "{cpus}");
    assert!(
        cpus["found"]
            .as_str()
            .unwrap()
            .ends_with("--shards 1024 runs 1024 shard(s), unpinned (--no-pin)"),
        "{cpus}"
    );
}

/// A seccomp program that answers `io_uring_setup` with EPERM and allows every other call.
fn io_uring_blocking_filter() -> BpfProgram {
    let rules = BTreeMap::from([(libc::SYS_io_uring_setup, Vec::new())]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM.unsigned_abs()),
        TargetArch::try_from(std::env::consts::ARCH).unwrap(),
    )
    .unwrap();
    filter.try_into().unwrap()
}

/// Installs `program` in the child between fork and exec (with `PR_SET_NO_NEW_PRIVS`, which an
/// unprivileged process needs to install a filter; `apply_filter` sets it).
fn under_filter(command: &mut Command, program: BpfProgram) {
    // SAFETY: the closure runs in the forked child before exec and calls only prctl and seccomp
    // (through `apply_filter`), which allocate nothing; the program was built before the fork.
    unsafe {
        command.pre_exec(move || {
            seccompiler::apply_filter(&program)
                .map_err(|_| std::io::Error::from_raw_os_error(libc::EPERM))
        });
    }
}

#[test]
fn io_uring_blocked_by_seccomp_fails_naming_seccomp() {
    let root = tempfile::tempdir().unwrap();
    let mut command = doctor(root.path(), &["--json"]);
    under_filter(&mut command, io_uring_blocking_filter());
    let (code, stdout, stderr) = output(&mut command);
    let report = parse_json(&stdout, &stderr);
    let io_uring = json_check(&report, "io_uring");
    assert_eq!(io_uring["status"], "fail", "{io_uring}");
    let found = io_uring["found"].as_str().unwrap();
    assert!(
        found.starts_with(
            "a seccomp filter (Seccomp: 2 in /proc/self/status) refuses io_uring_setup with EPERM"
        ),
        "{found}"
    );
    let fix = io_uring["fix"].as_str().unwrap();
    assert!(fix.contains("seccomp profile"), "{fix}");
    assert!(fix.contains("--io-driver poll"), "{fix}");
    assert_eq!(report["verdict"], "fail");
    assert_eq!(code, 1, "{stdout}");

    // The text form says the same on the io_uring line.
    let mut command = doctor(root.path(), &[]);
    under_filter(&mut command, io_uring_blocking_filter());
    let (code, stdout, _) = output(&mut command);
    assert_eq!(code, 1);
    let first = stdout.lines().next().unwrap();
    assert!(
        first.starts_with("fail io_uring: a seccomp filter (Seccomp: 2"),
        "{first}"
    );
}

/// New-user review: `doctor --shards N` with more pinned shards than allowed cores sized the
/// io_uring check for the allowed count without a word. It sizes for the N requested (what
/// `--no-pin` runs) and says why.
#[test]
fn refused_pinned_shards_size_the_io_uring_check_as_requested_and_say_why() {
    let root = tempfile::tempdir().unwrap();
    let allowed = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let requested = allowed + 1;
    if requested > 1024 {
        return;
    }
    let requested = requested.to_string();
    let (_, stdout, stderr) = output(&mut doctor(
        root.path(),
        &["--json", "--shards", &requested],
    ));
    let report = parse_json(&stdout, &stderr);
    let io_uring = json_check(&report, "io_uring");
    // Where io_uring is refused (container, seccomp) the check names the cause instead.
    if io_uring["status"] == "ok" {
        assert!(
            io_uring["found"].as_str().unwrap().contains(&format!(
                "{requested} shard(s) (the {requested} requested: serve refuses to pin them to \
                 the {allowed} allowed core(s), see the cpus check; with --no-pin it runs \
                 {requested}) need "
            )),
            "{io_uring}"
        );
    }
}
