//! `shardline group create|delete|list` (issue 11 section 2).

use crate::client_cmds::AddrArgs;

#[derive(Debug, clap::Subcommand)]
pub enum GroupCommand {
    /// Placeholder until the group commands land.
    List {
        #[command(flatten)]
        addr: AddrArgs,
    },
}

#[allow(clippy::needless_pass_by_value)] // stub until the group commands land
pub fn run(command: GroupCommand) -> anyhow::Result<()> {
    let _ = command;
    todo!("H2: group commands")
}
