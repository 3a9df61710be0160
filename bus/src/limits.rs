//! Every bound of the wire protocol, with why it has its value. Relations between bounds are
//! checked at compile time at the bottom. Nothing here may depend on configuration.

use std::time::Duration;

use crate::batch::{BATCH_HEADER_SIZE, MESSAGE_HEADER_SIZE};
use crate::header::HEADER_SIZE;

/// Default `max_message_size` (bytes, header included). DESIGN section 5. Also the most memory
/// one connection's read may allocate for a body.
pub const MESSAGE_SIZE_MAX_DEFAULT: u32 = 64 * 1024 * 1024;
/// Largest name of a stream or topic, bytes of UTF-8.
pub const NAME_LEN_MAX: usize = 255;
/// Largest partition count of one topic.
pub const PARTITION_COUNT_MAX: u32 = 4096;
/// Largest message count in one batch. With 32-byte message headers this is 32 MiB of headers
/// alone, half the default message size, so a parser's work per batch stays bounded.
pub const BATCH_MESSAGE_COUNT_MAX: u32 = 1 << 20;
/// Longest message body of an error reply, bytes of UTF-8; longer texts are cut at a character
/// boundary. Error texts are for people and logs, not for data.
pub const ERROR_MESSAGE_SIZE_MAX: usize = 4096;

/// How long a client keeps retrying one call transparently (reconnects and resends after a
/// connection failure, or resends after `Busy`/`ShuttingDown`) before it returns the last error.
/// 30 s outlasts a server restart with a short WAL replay and a burst of full inboxes, and is short
/// enough that a dead server is reported while a person is still watching.
pub const RETRY_BUDGET_DEFAULT: Duration = Duration::from_secs(30);
/// First wait between two attempts of one call: about a loopback round trip plus a shard inbox
/// drain, so a momentary `Busy` costs little latency.
pub const RETRY_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest wait between two attempts (the wait doubles from `RETRY_BACKOFF_MIN` up to this): a
/// restarting server is noticed within a second of coming back, and a client in a retry loop
/// sends at most one request (or connect) a second.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Most `NotPrimary` answers one client call follows (each moves it to the named primary or the
/// next address it knows) before it fails with `NoPrimary`. Answers that name no primary (a view
/// change under way) are each followed by the backoff, so 16 of them span about 10 s (10 ms
/// doubling to 1 s), many times a view change with default timers (a few hundred ms); answers
/// that do name one are followed at once only every other time, so a confused pair of servers
/// naming each other costs at least 8 backoffs before the call fails.
pub const NOT_PRIMARY_REDIRECT_MAX: u32 = 16;

/// Default deadline of one client call (`Client::with_request_timeout`, `shardline --timeout`):
/// from the call's start to its reply, across retries and `NotPrimary` redirects. A replica that
/// cannot reach a majority holds a request without answering, so without a deadline the call
/// would wait forever. 30 s, as `RETRY_BUDGET_DEFAULT`, outlasts a view change (a few hundred ms
/// with default timers), a server restart with a short WAL replay and an fsync on a slow disk,
/// and reports a cluster without a majority while a person is still watching.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// Default for how long `Client::connect_with_timeout` keeps retrying a refused first connect
/// (`shardline --connect-timeout`): covers a server that is starting or restarting (bind,
/// recovery, ready barrier) while a script already runs its client, and reports a server that is
/// not there while a person is still watching.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Longest wait between two connect attempts (the wait doubles from `RETRY_BACKOFF_MIN`): a
/// server that starts listening is found within this long, and a client that waits for one
/// makes at most 5 connects a second.
pub const CONNECT_BACKOFF_MAX: Duration = Duration::from_millis(200);

/// Longest a server parks one `PollMessages` waiting for data (header `wait_ms`, issue 11
/// section 3): a larger wait is clamped to this. A minute is far longer than a follower needs
/// between two re-polls (each costs one round trip) and short enough that a poll whose client
/// went away holds its parked slot only briefly; it also stays well inside a client's default
/// request deadline plus the wait it adds.
pub const POLL_WAIT_MAX: Duration = Duration::from_mins(1);

// A full batch of empty messages fits in a default-sized message.
const _: () = assert!(
    BATCH_HEADER_SIZE + (BATCH_MESSAGE_COUNT_MAX as usize) * MESSAGE_HEADER_SIZE
        <= MESSAGE_SIZE_MAX_DEFAULT as usize - HEADER_SIZE
);
// An error reply always fits in the smallest sensible max_message_size.
const _: () = assert!(HEADER_SIZE + ERROR_MESSAGE_SIZE_MAX <= 64 * 1024);
const _: () = assert!(MESSAGE_SIZE_MAX_DEFAULT as usize >= HEADER_SIZE);
// The backoff doubles from its minimum to its maximum, and the default budget allows several
// attempts at the maximum wait.
const _: () = assert!(RETRY_BACKOFF_MIN.as_nanos() > 0);
const _: () = assert!(RETRY_BACKOFF_MIN.as_nanos() <= RETRY_BACKOFF_MAX.as_nanos());
const _: () = assert!(RETRY_BACKOFF_MAX.as_nanos() * 4 <= RETRY_BUDGET_DEFAULT.as_nanos());
const _: () = assert!(RETRY_BACKOFF_MIN.as_nanos() <= CONNECT_BACKOFF_MAX.as_nanos());
// The default deadline of a call leaves room for the retries its retry budget allows.
const _: () = assert!(REQUEST_TIMEOUT_DEFAULT.as_nanos() >= RETRY_BUDGET_DEFAULT.as_nanos());
const _: () = assert!(CONNECT_BACKOFF_MAX.as_nanos() * 4 <= CONNECT_TIMEOUT_DEFAULT.as_nanos());
// A clamped wait fits the wire's u32 milliseconds.
const _: () = assert!(POLL_WAIT_MAX.as_millis() <= u32::MAX as u128);
