//! `shardline doctor`: host checks before a deployment, without starting a server (issue 10
//! section 3). Each check prints one line, `ok` / `warn` / `fail`, with what it found and the fix;
//! `--json` prints the same as one document. Exit 0 when nothing fails, 1 when something would make
//! `serve` fail (a `fail` line), 2 on usage errors (clap).
//!
//! The checks read the same facts `serve` acts on and reuse its decisions (`runtime::probe_io_uring`,
//! `runtime::Topology::resolve`, `shards::resources::ResourceBudget`), so that doctor and serve
//! cannot disagree on what fails. It must never start a server, never write outside a temporary
//! file it removes in the data directory's nearest existing parent, and never create the data
//! directory itself.

mod cpus;
mod data_dir;
mod io_uring;
pub mod limits;
mod open_files;

use std::fmt::{self, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use runtime::topology::{ShardCountArg, Topology, TopologyConfig};

/// `shardline doctor` flags.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Data directory the server would use (checked: filesystem, free space, O_DIRECT, fsync
    /// latency). It is not created; its nearest existing parent is checked instead.
    #[arg(long, env = "SHARDLINE_DATA_DIR", default_value = "./shardline-data")]
    pub data_dir: PathBuf,
    /// Print the checks as JSON instead of lines.
    #[arg(long)]
    pub json: bool,
    /// Shards the server would run (`serve --shards`: 1..=1024 or `all`): sizes the io_uring
    /// locked-memory need and the open-file budget.
    #[arg(
        long,
        env = "SHARDLINE_SHARDS",
        default_value = "all",
        value_name = "N|all",
        allow_hyphen_values = true,
        value_parser = crate::arg_values::parse_shard_count
    )]
    pub shards: ShardCountArg,
    /// The server would run with `--no-pin` (more shards than cores allowed).
    #[arg(long, env = "SHARDLINE_NO_PIN", value_parser = crate::arg_values::parse_no_pin, action = clap::ArgAction::SetTrue)]
    pub no_pin: bool,
    /// Partitions (over all topics) the deployment plans to hold: checked against the open-file
    /// budget the server derives from the limit (1..=1073741824).
    #[arg(
        long,
        default_value_t = limits::PARTITIONS_DEFAULT,
        value_name = "N",
        allow_hyphen_values = true,
        value_parser = crate::arg_values::whole_number(
            "a planned partition count",
            1,
            limits::PARTITIONS_MAX
        )
    )]
    pub partitions: u64,
}

/// The outcome of one check, worst last (`Ord` follows severity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Nothing to do.
    Ok,
    /// `serve` starts, but something costs performance or will fail later (a fix is given).
    Warn,
    /// `serve` would refuse to start, or fail on first use, as configured.
    Fail,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so that `{:<4}` aligns the lines.
        f.pad(match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        })
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Check {
    /// Short, stable name (`io_uring`, `cpus`, `fsync_latency`, ...).
    pub name: &'static str,
    pub status: Status,
    /// What was found, with the figures.
    pub found: String,
    /// What to do about it; empty when there is nothing to do.
    pub fix: String,
}

impl Check {
    /// An `ok` check with nothing to fix.
    pub fn ok(name: &'static str, found: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Ok,
            found: found.into(),
            fix: String::new(),
        }
    }

    /// A `warn` check and its fix.
    pub fn warn(name: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Warn,
            found: found.into(),
            fix: fix.into(),
        }
    }

    /// A `fail` check and its fix.
    pub fn fail(name: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Fail,
            found: found.into(),
            fix: fix.into(),
        }
    }

    /// The text line: `STATUS NAME: found; fix: ...` (the fix only when there is one).
    pub fn line(&self) -> String {
        let mut line = format!("{:<4} {}: {}", self.status, self.name, self.found);
        if !self.fix.is_empty() {
            line.push_str("; fix: ");
            line.push_str(&self.fix);
        }
        line
    }
}

/// The whole report: every check and the worst status among them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// `fail` if any check failed, else `warn` if any warned, else `ok`.
    pub verdict: Status,
    pub checks: Vec<Check>,
}

impl Report {
    /// The report of `checks`, its verdict their worst status (`ok` for none).
    pub fn new(checks: Vec<Check>) -> Report {
        let verdict = checks
            .iter()
            .map(|check| check.status)
            .max()
            .unwrap_or(Status::Ok);
        Report { verdict, checks }
    }

    /// 1 when a check failed (`serve` would fail), else 0.
    pub fn exit_code(&self) -> u8 {
        u8::from(self.verdict == Status::Fail)
    }

    /// Every check line, then `verdict: STATUS (F fail, W warn, N checks)`.
    pub fn text(&self) -> String {
        let count = |status| {
            self.checks
                .iter()
                .filter(|check| check.status == status)
                .count()
        };
        let mut text = String::new();
        for check in &self.checks {
            text.push_str(&check.line());
            text.push('\n');
        }
        // Writing to a String cannot fail.
        let _ = writeln!(
            text,
            "verdict: {} ({} fail, {} warn, {} checks)",
            self.verdict,
            count(Status::Fail),
            count(Status::Warn),
            self.checks.len()
        );
        text
    }
}

/// Runs every check and prints them; returns the process exit code (non-zero when something
/// would make `serve` fail).
///
/// # Errors
/// Only when stdout cannot be written.
pub fn run(args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let report = Report::new(checks(args));
    if args.json {
        let mut text = serde_json::to_string_pretty(&report)?;
        text.push('\n');
        crate::output::print_text(&text)?;
    } else {
        crate::output::print_text(&report.text())?;
    }
    Ok(ExitCode::from(report.exit_code()))
}

/// Every check, in report order.
fn checks(args: &DoctorArgs) -> Vec<Check> {
    let topology = Topology::resolve(&TopologyConfig {
        shards: args.shards,
        cpus: None,
        pin: !args.no_pin,
    });
    let host = cpus::HostCpus::read();
    let sized = sized_shards(args.shards, &topology, host.allowed.len());
    let mut checks = vec![
        io_uring::check(&sized),
        cpus::shards_check(&host, args.shards, &topology),
        cpus::quota_check(&host),
        cpus::numa_check(&host),
        open_files::check(sized.count, args.partitions),
    ];
    checks.extend(data_dir::checks(&args.data_dir));
    checks
}

/// The shard count the resource checks size for, and why when it is not what `serve` would run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SizedShards {
    pub count: u16,
    /// Set when `serve` would refuse the topology, saying which count was taken instead.
    pub basis: Option<String>,
}

impl fmt::Display for SizedShards {
    /// `N shard(s)`, then ` (basis)` when there is one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} shard(s)", self.count)?;
        match &self.basis {
            Some(basis) => write!(f, " ({basis})"),
            None => Ok(()),
        }
    }
}

/// What the io_uring and open-file checks size for: the shards `serve --shards` would run; when
/// it would refuse (the cpus check says why), the requested count `N`, which `--no-pin` runs
/// and any other fix lowers, or for `all` one per allowed CPU (`allowed_cpu_count`), as
/// `Topology::resolve` counts `all`. The count is never silently changed: `basis` says why.
fn sized_shards(
    shards: ShardCountArg,
    topology: &Result<Topology, runtime::TopologyError>,
    allowed_cpu_count: usize,
) -> SizedShards {
    match (topology, shards) {
        (Ok(topology), _) => SizedShards {
            count: topology.shard_count(),
            basis: None,
        },
        (
            Err(runtime::TopologyError::TooManyShards { allowed_count, .. }),
            ShardCountArg::Count(requested),
        ) => SizedShards {
            count: requested,
            basis: Some(format!(
                "the {requested} requested: serve refuses to pin them to the \
                 {allowed_count} allowed core(s), see the cpus check; with --no-pin it runs \
                 {requested}"
            )),
        },
        (Err(_), ShardCountArg::Count(requested)) => SizedShards {
            count: requested,
            basis: Some(format!(
                "the {requested} requested: serve would refuse this topology, see the cpus check"
            )),
        },
        (Err(_), ShardCountArg::All) => {
            let count = u16::try_from(allowed_cpu_count.clamp(1, runtime::limits::SHARD_COUNT_MAX))
                .unwrap_or(u16::MAX);
            SizedShards {
                count,
                basis: Some(
                    "one per allowed CPU for --shards all: serve would refuse this topology, see \
                     the cpus check"
                        .to_owned(),
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// New-user review: `doctor --shards 8` on 2 allowed cores (pinned) sized the io_uring check
    /// for 2 shards without a word. It sizes for the 8 requested (what `--no-pin` runs) and says
    /// why.
    #[test]
    fn refused_pinned_shards_are_sized_as_requested_and_say_why() {
        let refused = Topology::resolve_with(
            &TopologyConfig {
                shards: ShardCountArg::Count(8),
                cpus: None,
                pin: true,
            },
            &[0, 1],
            None,
        );
        let sized = sized_shards(ShardCountArg::Count(8), &refused, 2);
        assert_eq!(sized.count, 8);
        assert_eq!(
            sized.to_string(),
            "8 shard(s) (the 8 requested: serve refuses to pin them to the 2 allowed core(s), \
             see the cpus check; with --no-pin it runs 8)"
        );
        let placed = Topology::resolve_with(
            &TopologyConfig {
                shards: ShardCountArg::Count(2),
                cpus: None,
                pin: true,
            },
            &[0, 1],
            None,
        );
        assert_eq!(
            sized_shards(ShardCountArg::Count(2), &placed, 2).to_string(),
            "2 shard(s)"
        );
    }

    #[test]
    fn verdict_is_the_worst_status() {
        assert_eq!(Report::new(vec![]).verdict, Status::Ok);
        let ok = Check::ok("a", "fine");
        let warn = Check::warn("b", "slow", "buy a disk");
        let fail = Check::fail("c", "broken", "fix it");
        assert_eq!(Report::new(vec![ok.clone()]).exit_code(), 0);
        let warned = Report::new(vec![ok.clone(), warn.clone(), ok.clone()]);
        assert_eq!((warned.verdict, warned.exit_code()), (Status::Warn, 0));
        let failed = Report::new(vec![fail.clone(), warn, ok]);
        assert_eq!((failed.verdict, failed.exit_code()), (Status::Fail, 1));
    }

    #[test]
    fn lines_name_status_found_and_fix() {
        assert_eq!(
            Check::ok("cpus", "2 allowed").line(),
            "ok   cpus: 2 allowed"
        );
        assert_eq!(
            Check::fail("io_uring", "blocked", "use poll").line(),
            "fail io_uring: blocked; fix: use poll"
        );
        let report = Report::new(vec![Check::ok("a", "x"), Check::warn("b", "y", "z")]);
        assert_eq!(
            report.text(),
            "ok   a: x\nwarn b: y; fix: z\nverdict: warn (0 fail, 1 warn, 2 checks)\n"
        );
    }

    #[test]
    fn json_has_every_field_in_lowercase_words() {
        let report = Report::new(vec![Check::fail("io_uring", "blocked", "use poll")]);
        let value = serde_json::to_value(&report).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "verdict": "fail",
                "checks": [{"name": "io_uring", "status": "fail", "found": "blocked", "fix": "use poll"}]
            })
        );
    }
}
