//! Issue 8 section 1: the consensus core in `shards/src/vsr/` is pure. It never awaits I/O, reads
//! a clock, touches a file or a socket, so the simulator can run the very same code as `serve`.
//! This test fails if any source file under `shards/src/vsr/` names `compio`, `std::fs`,
//! `std::net`, `Instant` or `SystemTime` in code, naming the file, line and word. Comments are not
//! code (the text after `//` on a line is skipped), so a doc may say what the core never does.

use std::path::{Path, PathBuf};

/// What the core must not name (issue 8 section 1).
const FORBIDDEN: [&str; 5] = ["compio", "std::fs", "std::net", "Instant", "SystemTime"];

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|error| {
            panic!("cannot list {}: {error}", dir.display());
        }) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// `file:line: names WORD: text` for every line of `source` whose code (the text before any
/// `//`) names a forbidden word.
fn violations(path: &Path, source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (index, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        for word in FORBIDDEN {
            if code.contains(word) {
                found.push(format!(
                    "{}:{}: names `{word}`: {}",
                    path.display(),
                    index + 1,
                    line.trim()
                ));
            }
        }
    }
    found
}

#[test]
fn the_vsr_core_names_no_io_and_no_clock() {
    let vsr = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/vsr");
    let files = rust_files(&vsr);
    assert!(
        files.iter().any(|path| path.ends_with("replica.rs")),
        "{} holds no replica.rs: the scan looks in the wrong place ({files:?})",
        vsr.display()
    );
    let found: Vec<String> = files
        .iter()
        .flat_map(|path| {
            let source = std::fs::read_to_string(path)
                .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
            violations(path, &source)
        })
        .collect();
    assert!(
        found.is_empty(),
        "shards/src/vsr/ must stay sans-IO (issue 8 section 1); move I/O to shards/src/store/:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_finds_each_forbidden_word() {
    let source = "use compio::fs::File;\nlet t = std::time::Instant::now();\nfn pure() {}\n\
                  use std::net::TcpStream;\nstd::fs::read(p);\nSystemTime::now();\n\
                  //! never touches compio or std::fs\nlet x = 1; // no Instant here\n";
    let found = violations(Path::new("x.rs"), source);
    assert_eq!(
        found.len(),
        5,
        "comments are skipped, code is not: {found:?}"
    );
    assert!(found[0].starts_with("x.rs:1: names `compio`"), "{found:?}");
    assert!(found[1].starts_with("x.rs:2: names `Instant`"), "{found:?}");
    assert!(
        found[2].starts_with("x.rs:4: names `std::net`"),
        "{found:?}"
    );
    assert!(found[3].starts_with("x.rs:5: names `std::fs`"), "{found:?}");
    assert!(
        found[4].starts_with("x.rs:6: names `SystemTime`"),
        "{found:?}"
    );
}
