//! `shardline doctor`: host checks before a deployment, without starting a server (issue 10
//! section 3). Each check prints one line, `ok` / `warn` / `fail`, with the fix.

/// `shardline doctor` flags.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Data directory the server would use (checked: filesystem, free space, O_DIRECT, fsync
    /// latency). It is not created; its nearest existing parent is checked instead.
    #[arg(long, env = "SHARDLINE_DATA_DIR", default_value = "./shardline-data")]
    pub data_dir: std::path::PathBuf,
    /// Print the checks as JSON instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// Runs every check and prints them; returns the process exit code (non-zero when something
/// would make `serve` fail).
///
/// # Errors
/// Only when stdout cannot be written.
pub fn run(args: &DoctorArgs) -> anyhow::Result<std::process::ExitCode> {
    let _ = args;
    todo!("doctor helper")
}
