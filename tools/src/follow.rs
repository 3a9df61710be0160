//! `shardline poll --follow` (issue 11 section 3): prints a partition's messages as they are
//! appended, like `tail -f`, until SIGINT or SIGTERM.
//!
//! Each poll carries a wait (`Client::poll_wait`), so the server parks it until the partition
//! grows: following never polls in a loop on the client or on the server. A signal ends the
//! command cleanly (exit 0) after what was printed is committed.

use std::io::Write;
use std::pin::pin;

use anyhow::Context;
use bus::{Client, Namespace};
use futures_util::future::{Either, select};
use shardline::output::stdout_error;

use crate::client_cmds::{PollArgs, commit_offset, write_messages};

/// Most messages one follow poll asks for (its reply is also cut at the server's poll byte
/// limit): a burst is printed in pieces of this many, each committed with `--commit`.
const FOLLOW_POLL_COUNT_MAX: u32 = 10_000;

/// Follows `namespace` from `start`: prints each message as it arrives, with `--commit` stores
/// the consumer's offset after each printed batch, and returns `Ok` at SIGINT or SIGTERM or
/// once `--count` messages were printed.
///
/// # Errors
/// A poll failed after the client's retries (server gone for longer than its retry budget, an
/// offset beyond the end, a damaged message), stdout failed, or a commit failed.
///
/// # Cancel safety
/// Not cancel safe: a poll cut short may leave its connection unusable (the command ends then).
pub async fn follow(
    client: &mut Client,
    namespace: Namespace,
    start: u64,
    args: &PollArgs,
) -> anyhow::Result<()> {
    let mut stop = pin!(stop_signal()?);
    let mut stdout = std::io::stdout().lock();
    let mut offset = start;
    let mut printed = 0u64;
    let count_max = args.count.map(u64::from);
    loop {
        let left = count_max.map_or(u64::MAX, |max| max - printed);
        let max_count = u32::try_from(left).map_or(FOLLOW_POLL_COUNT_MAX, |left| {
            left.min(FOLLOW_POLL_COUNT_MAX)
        });
        let result = {
            let wait = bus::limits::POLL_WAIT_MAX;
            let poll = pin!(client.poll_wait(namespace, offset, max_count, wait));
            match select(poll, stop.as_mut()).await {
                Either::Left((result, _)) => result
                    .with_context(|| format!("poll of {namespace} at offset {offset} failed"))?,
                Either::Right(((), _)) => return Ok(()),
            }
        };
        let messages = result.messages().context("server sent a malformed batch")?;
        let (written, after) = write_messages(&mut stdout, args.output, &messages, left as usize)?;
        stdout.flush().map_err(stdout_error)?;
        let Some(after) = after else {
            continue;
        };
        printed += written as u64;
        offset = after;
        if args.commit {
            commit_offset(client, namespace, args, offset).await?;
        }
        if count_max.is_some_and(|max| printed >= max) {
            return Ok(());
        }
    }
}

/// A future that resolves at the first SIGINT or SIGTERM delivered to the process from now on
/// (a thread waits for them with `signal_hook` and wakes the runtime through a oneshot).
///
/// # Errors
/// The signal handlers could not be installed.
fn stop_signal() -> anyhow::Result<impl Future<Output = ()>> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("cannot install the SIGINT/SIGTERM handlers of poll --follow")?;
    let (tx, rx) = crossfire::oneshot::oneshot::<()>();
    std::thread::Builder::new()
        .name("follow-signals".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                tx.send(());
            }
        })
        .context("cannot start the signal thread of poll --follow")?;
    Ok(async move {
        // An error means the thread ended without a signal: never stop then.
        if rx.await.is_err() {
            std::future::pending::<()>().await;
        }
    })
}
