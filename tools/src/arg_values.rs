//! Parsers of flag values shared by subcommands, whose errors list what is accepted: `HOST:PORT`
//! (`--listen`; an IP address or a host name, resolved once when the argument is parsed,
//! never re-resolved: a client reconnects to the address it resolved), comma-separated lists of
//! them (`--addresses`, `--addr`), cluster ids (`--cluster`, decimal or `0x` hex), byte sizes
//! with binary suffixes (`--max-message-size 64MiB`, `--segment-size`), durations with units
//! (`--timeout 30s`, `bench --duration 2m`), whole numbers, sizes and durations checked against
//! a range that their error states (`whole_number`, `whole_number_in`, `byte_size_in`,
//! `parse_duration_between`: with `allow_negative_numbers`, `-1` reaches them and never gets
//! clap's bare "unexpected argument") and booleans set from the environment
//! (`SHARDLINE_NO_PIN`).

use std::net::{SocketAddr, ToSocketAddrs as _};
use std::time::Duration;

/// Parses `text` as `IP:PORT` or `HOST:PORT` (e.g. `localhost:8090`, `[::1]:8090`). A host name
/// resolves (getaddrinfo) to its first IPv4 address, else its first IPv6 one: `localhost` then
/// means 127.0.0.1 for the client and the server alike, matching the default `--listen`.
///
/// # Errors
/// A text naming `text` and why: no `:PORT`, a name that does not resolve, or one that resolves
/// to no address. Used as a clap `value_parser`, which prefixes the flag's name.
pub fn parse_host_port(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!(
            "{text:?} is not HOST:PORT (e.g. 127.0.0.1:8090 or localhost:8090)"
        ));
    };
    if port.parse::<u16>().is_err() {
        return Err(format!(
            "{text:?}: port {port:?} is not a port number (0 to 65535)"
        ));
    }
    let addrs: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|error| format!("cannot resolve host name {host:?} of {text:?}: {error}"))?
        .collect();
    addrs
        .iter()
        .find(|addr| addr.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| format!("host name {host:?} of {text:?} resolves to no address"))
}

/// Parses `--shards N|all` by the server's own rule (`runtime::ShardCountArg`: `all`, or 1 to
/// `SHARD_COUNT_MAX`).
///
/// # Errors
/// The rule alone (e.g. `shard count must be between 1 and 1024`): clap, and the config file,
/// name the flag and the value themselves, so `TopologyError`'s own `invalid --shards value`
/// framing would say them twice.
pub fn parse_shard_count(text: &str) -> Result<runtime::ShardCountArg, String> {
    text.parse().map_err(topology_rule)
}

/// Parses `--cpus LIST` (e.g. `0-3,8`) by the server's own rule (`runtime::CpuList`).
///
/// # Errors
/// The rule alone, as [`parse_shard_count`] says.
pub fn parse_cpu_list(text: &str) -> Result<runtime::CpuList, String> {
    text.parse().map_err(topology_rule)
}

/// The rule of a topology flag parser's error, without the flag and value it also names.
fn topology_rule(error: runtime::TopologyError) -> String {
    match error {
        runtime::TopologyError::ShardCount { rule, .. }
        | runtime::TopologyError::CpuListSyntax { rule, .. } => rule,
        other => other.to_string(),
    }
}

/// A comma-separated list of `HOST:PORT` addresses, in the order given (`--addresses A0,A1,A2`,
/// `--addr A,B`). Never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressList(pub Vec<SocketAddr>);

impl std::fmt::Display for AddressList {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (index, addr) in self.0.iter().enumerate() {
            if index > 0 {
                formatter.write_str(",")?;
            }
            write!(formatter, "{addr}")?;
        }
        Ok(())
    }
}

/// Most addresses one list takes: a cluster has at most 5 replicas; a few more leave room for a
/// client that lists addresses of a cluster being moved.
pub const ADDRESS_LIST_LEN_MAX: usize = 16;

/// Parses `A0,A1,...`: each item as [`parse_host_port`] (host names resolved), spaces around
/// items ignored, order kept. Duplicates are the caller's to judge (`serve` refuses them).
///
/// # Errors
/// A text naming the item and why (see `parse_host_port`), an empty item (`a,,b`, a trailing
/// comma, an empty list), or more than [`ADDRESS_LIST_LEN_MAX`] items.
pub fn parse_address_list(text: &str) -> Result<AddressList, String> {
    let items: Vec<&str> = text.split(',').map(str::trim).collect();
    if items.len() > ADDRESS_LIST_LEN_MAX {
        return Err(format!(
            "{text:?} lists {} addresses, at most {ADDRESS_LIST_LEN_MAX}",
            items.len()
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            if item.is_empty() {
                Err(format!(
                    "{text:?}: address {} of the list is empty (use HOST:PORT,HOST:PORT,...)",
                    index + 1
                ))
            } else {
                parse_host_port(item)
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map(AddressList)
}

/// Parses a cluster id: a decimal u128 (`7`) or `0x`-prefixed hex (`0x7f`, any case), `_`
/// separators allowed.
///
/// # Errors
/// A text naming `text` and the accepted forms.
pub fn parse_cluster_id(text: &str) -> Result<u128, String> {
    let trimmed = text.trim().replace('_', "");
    let parsed = match trimmed
        .strip_prefix("0x")
        .or_else(|| trimmed.strip_prefix("0X"))
    {
        Some(hex) => u128::from_str_radix(hex, 16),
        None => trimmed.parse::<u128>(),
    };
    parsed.map_err(|_| {
        format!(
            "{text:?} is not a cluster id: use a decimal number (e.g. 7) or 0x-prefixed hex \
             (e.g. 0x5eed), at most 128 bits"
        )
    })
}

/// Values a boolean flag's environment variable accepts, as listed in errors.
pub const BOOLEAN_VALUES: &str = "1, 0, true, false, yes, no, on, off (any case)";

/// Parses a boolean flag value (from a `SHARDLINE_*` variable such as `SHARDLINE_NO_PIN`):
/// `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`, any case, surrounding spaces ignored.
///
/// # Errors
/// A text naming `text` and listing the accepted values.
pub fn parse_boolean(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!(
            "{text:?} is not a boolean; accepted: {BOOLEAN_VALUES}"
        )),
    }
}

/// Parses `--no-pin`'s value, which only `SHARDLINE_NO_PIN` can give (the flag itself takes
/// none): `parse_boolean`, with an empty or blank variable counted as unset (off).
///
/// # Errors
/// A text naming the value and listing the accepted values (`env_values` names the variable
/// before it).
pub fn parse_no_pin(text: &str) -> Result<bool, String> {
    if text.trim().is_empty() {
        return Ok(false);
    }
    parse_boolean(text)
        .map_err(|_| format!("{text:?} is not a boolean; accepted: {BOOLEAN_VALUES}, or empty"))
}

/// Binary suffixes a byte size accepts, with their multipliers (matched in any case).
const SIZE_SUFFIXES: [(&str, u64); 4] = [
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("b", 1),
];

/// Parses a byte size: an integer of bytes (`67108864`) or one with a binary suffix, `KiB`,
/// `MiB` or `GiB` in any case (`64MiB`, `4 KiB`). Range checks are the caller's.
///
/// # Errors
/// A text naming `text` and the accepted forms: not a whole number, an unknown suffix (decimal
/// `MB` included: say `MiB`), or a size beyond `u64`.
pub fn parse_byte_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(digits_end);
    let suffix = suffix.trim_start().to_ascii_lowercase();
    let multiplier = if suffix.is_empty() {
        Some(1)
    } else {
        SIZE_SUFFIXES
            .iter()
            .find(|(name, _)| *name == suffix)
            .map(|(_, multiplier)| *multiplier)
    };
    if multiplier.is_some() && is_digits(digits) && digits.parse::<u64>().is_err() {
        return Err(format!("{text:?} is too large a size"));
    }
    let (Ok(count), Some(multiplier)) = (digits.parse::<u64>(), multiplier) else {
        return Err(format!(
            "{text:?} is not a size: use bytes, an integer (e.g. 67108864), or one with a \
             suffix KiB, MiB or GiB (e.g. 64MiB)"
        ));
    };
    count
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large a size"))
}

/// `parse_byte_size` for a flag held in a `u32` (`--max-message-size`).
///
/// # Errors
/// Those of `parse_byte_size`, or a size above `u32::MAX` bytes.
pub fn parse_byte_size_u32(text: &str) -> Result<u32, String> {
    let size = parse_byte_size(text)?;
    u32::try_from(size)
        .map_err(|_| format!("{text:?} is {size} bytes, more than {} bytes", u32::MAX))
}

/// Parses a duration flag: `N` or `Ns` (seconds), `Nms` (milliseconds) or `Nm` (minutes), a
/// whole number in each, at most `max`; `what` names the flag's duration in the error (e.g.
/// `request timeout`). Moved here from the client commands so that `bench --duration` shares it.
/// Hours (`h`) and days (`d`) are not units here: the errors say so and give the largest value
/// in seconds and minutes (`3600 s (60m)`), so `2h` has an answer in the message.
///
/// # Errors
/// A text naming `text`, the accepted units and the largest value (not a whole number, an
/// unknown unit, a negative number), or saying that it exceeds `max` (in seconds and minutes).
pub fn parse_duration(text: &str, what: &str, max: Duration) -> Result<Duration, String> {
    let (digits, unit_ms) = if let Some(digits) = text.strip_suffix("ms") {
        (digits, 1)
    } else if let Some(digits) = text.strip_suffix('m') {
        (digits, 60_000)
    } else {
        (text.strip_suffix('s').unwrap_or(text), 1000)
    };
    let value: u64 = digits.parse().map_err(|_| {
        format!(
            "{text:?} is not a duration: use a whole number of seconds (5, 5s), milliseconds \
             (300ms) or minutes (2m), no other unit, at most {} for the {what}",
            duration_max_text(max)
        )
    })?;
    let duration = Duration::from_millis(value.saturating_mul(unit_ms));
    if duration > max {
        return Err(format!(
            "{text:?} exceeds the largest {what}, {}",
            duration_max_text(max)
        ));
    }
    Ok(duration)
}

/// `max` as the duration errors state it: seconds, and minutes too when whole (`3600 s (60m)`).
fn duration_max_text(max: Duration) -> String {
    let seconds = max.as_secs();
    if seconds > 0 && seconds.is_multiple_of(60) && max.subsec_nanos() == 0 {
        format!("{seconds} s ({}m)", seconds / 60)
    } else {
        format!("{seconds} s")
    }
}

/// A clap value parser of a whole number in `min..=max`; `what` names it with its article
/// (`a partition count`, `an offset`). One error for every refused text (a negative number, a
/// fraction, a word, one out of range) naming the text and the range. Pair it with
/// `allow_negative_numbers = true` on the argument so that `-1` reaches it instead of being
/// taken for a flag (clap's "unexpected argument").
///
/// # Errors
/// The returned parser fails with `"TEXT" is not WHAT: use a whole number from MIN to MAX`,
/// and `, without a minus sign` after it for `-0` (which is 0, and so may be in the range).
pub fn whole_number<T>(
    what: &'static str,
    min: T,
    max: T,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy + Send + Sync + 'static,
{
    move |text: &str| {
        text.trim()
            .parse::<T>()
            .ok()
            .filter(|value| (min..=max).contains(value))
            .ok_or_else(|| {
                // `-0` is 0 to a reader: "not ... from 0 to MAX" alone would contradict itself.
                let sign = if is_negative_zero(text) {
                    ", without a minus sign"
                } else {
                    ""
                };
                format!("{text:?} is not {what}: use a whole number from {min} to {max}{sign}")
            })
    }
}

/// A clap value parser of a whole number in `range` whose refusal is `rule`, a text that
/// names the range and its unit (`must be between 1 and 1000 ms`, as
/// `shards::RangedKey::rule` words it for `serve`). A number out of range (`-1`, `0`, `2000`)
/// gets `rule` alone; a text that is no whole number (`1e6`, `10k`, `1.5`) gets `"TEXT" is
/// not a whole number; RULE`; `-0`, which is 0 to a reader and so may be in the range, gets `"-0" has
/// a minus sign, which no whole number here takes; RULE`. Pair it with `allow_negative_numbers = true` so that `-1` reaches
/// it; clap names the flag and the value before the rule, a config file names its key.
///
/// # Errors
/// The returned parser fails as said above.
pub fn whole_number_in(
    range: std::ops::RangeInclusive<u64>,
    rule: String,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |text: &str| {
        let trimmed = text.trim();
        match trimmed.parse::<u64>() {
            Ok(value) if range.contains(&value) => Ok(value),
            Ok(_) => Err(rule.clone()),
            // `-0` is 0 to a reader: the rule alone would refuse 0 where the range holds it.
            Err(_) if is_negative_zero(trimmed) => Err(format!(
                "{text:?} has a minus sign, which no whole number here takes; {rule}"
            )),
            // A whole number all the same, below 0 or beyond u64: out of range.
            Err(_) if is_digits(trimmed.strip_prefix('-').unwrap_or(trimmed)) => Err(rule.clone()),
            Err(_) => Err(format!("{text:?} is not a whole number; {rule}")),
        }
    }
}

/// Whether `text` (trimmed) is a minus sign before one or more zeros (`-0`, `-00`): zero to a
/// reader, refused by the unsigned parsers for its sign alone.
fn is_negative_zero(text: &str) -> bool {
    text.trim()
        .strip_prefix('-')
        .is_some_and(|zeros| !zeros.is_empty() && zeros.bytes().all(|byte| byte == b'0'))
}

/// Whether `text` is one or more ASCII digits (a whole number too long for any integer type).
fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit())
}

/// A clap value parser of a byte size as [`parse_byte_size`] takes it (`4096`, `64KiB`), in
/// `range` bytes, whose refusal states `rule` (`must be between 4096 and 1073741824 bytes`):
/// alone for a size out of range, after `parse_byte_size`'s error for a text that is no size
/// (`-4KiB`, `64MB`). Pair it with `allow_hyphen_values = true` so that `-4KiB` reaches it.
///
/// # Errors
/// The returned parser fails as said above.
pub fn byte_size_in(
    range: std::ops::RangeInclusive<u64>,
    rule: String,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |text: &str| match parse_byte_size(text) {
        Ok(size) if range.contains(&size) => Ok(size),
        Ok(_) => Err(rule.clone()),
        Err(error) => Err(format!("{error}; {rule}")),
    }
}

/// Parses a duration flag as [`parse_duration`] does, at least `min` and at most `max`.
///
/// # Errors
/// Those of [`parse_duration`] with `; the smallest is MIN ms` after them, or a text naming
/// `text`, the smallest and the largest `what` when it is shorter than `min`.
pub fn parse_duration_between(
    text: &str,
    what: &str,
    min: Duration,
    max: Duration,
) -> Result<Duration, String> {
    let duration = parse_duration(text, what, max)
        .map_err(|error| format!("{error}; the smallest is {} ms", min.as_millis()))?;
    if duration < min {
        return Err(format!(
            "{text:?} is below the smallest {what}, {} ms (the largest is {})",
            min.as_millis(),
            duration_max_text(max)
        ));
    }
    Ok(duration)
}

/// Parses `serve --retention-interval` (issue 11 section 4) as [`parse_duration_between`]
/// does, from `RETENTION_INTERVAL_MIN` (10 ms) to `RETENTION_INTERVAL_MAX` (a day), the range
/// `ServerConfig::validate` checks too.
///
/// # Errors
/// As [`parse_duration_between`].
pub fn parse_retention_interval(text: &str) -> Result<Duration, String> {
    parse_duration_between(
        text,
        "retention interval",
        shards::limits::RETENTION_INTERVAL_MIN,
        shards::limits::RETENTION_INTERVAL_MAX,
    )
}

/// Bytes in a tebibyte, the one suffix `--retention-bytes` takes beyond `parse_byte_size`'s.
const TEBIBYTE: u64 = 1 << 40;

/// Parses `--retention-bytes` (issue 11 section 4): a byte size as `parse_byte_size` takes it
/// (`1073741824`, `512MiB`, `1GiB`), or with the suffix `TiB` (`2TiB`); `0` means no limit by
/// size.
///
/// # Errors
/// A text naming `text` and the accepted forms, or a size of `u64::MAX` bytes and above (the
/// wire reserves `u64::MAX` for "keep the current limit" in `AlterTopic`).
pub fn parse_retention_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let lower = trimmed.to_ascii_lowercase();
    let size = match lower.strip_suffix("tib") {
        Some(digits) => digits
            .trim_end()
            .parse::<u64>()
            .ok()
            .and_then(|count| count.checked_mul(TEBIBYTE))
            .ok_or_else(|| retention_bytes_refused(text)),
        None => parse_byte_size(trimmed).map_err(|_| retention_bytes_refused(text)),
    }?;
    if size == u64::MAX {
        return Err(retention_bytes_refused(text));
    }
    Ok(size)
}

/// The error of a `--retention-bytes` value that is not a size.
fn retention_bytes_refused(text: &str) -> String {
    format!(
        "{text:?} is not a retention size: use bytes (e.g. 1073741824), or a whole number with a \
         suffix KiB, MiB, GiB or TiB (e.g. 512MiB, 1GiB); 0 keeps every byte"
    )
}

/// Units `--retention-ms` takes, with their milliseconds; a bare number is milliseconds.
const RETENTION_UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// Parses `--retention-ms` (issue 11 section 4): a whole number of milliseconds (`86400000`),
/// or one with a unit `ms`, `s`, `m` (minutes), `h` or `d` (days): `90s`, `12h`, `7d`; `0`
/// means no limit by age.
///
/// # Errors
/// A text naming `text` and the accepted forms (not a whole number, an unknown unit), or an age
/// of `u64::MAX` milliseconds and above (reserved on the wire for "keep the current limit").
pub fn parse_retention_ms(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(digits_end);
    let unit = unit.trim_start().to_ascii_lowercase();
    let unit_ms = if unit.is_empty() {
        Some(1)
    } else {
        RETENTION_UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, ms)| *ms)
    };
    let refused = || {
        format!(
            "{text:?} is not a retention age: use milliseconds (e.g. 3600000) or a whole number \
             with a unit ms, s, m, h or d (e.g. 90s, 12h, 7d); 0 keeps messages of any age"
        )
    };
    let (Ok(count), Some(unit_ms)) = (digits.parse::<u64>(), unit_ms) else {
        return Err(refused());
    };
    match count.checked_mul(unit_ms) {
        Some(ms) if ms != u64::MAX => Ok(ms),
        _ => Err(format!("{text:?} is too long a retention age")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue7_6_a_bad_boolean_lists_the_accepted_values() {
        assert_eq!(
            parse_boolean("maybe"),
            Err("\"maybe\" is not a boolean; accepted: 1, 0, true, false, yes, no, on, off (any case)".into())
        );
        assert_eq!(parse_boolean(" YES "), Ok(true));
        assert_eq!(parse_boolean("off"), Ok(false));
    }

    #[test]
    fn issue7_6_empty_no_pin_is_unset_and_a_bad_one_lists_the_accepted_values() {
        assert_eq!(parse_no_pin(""), Ok(false));
        assert_eq!(parse_no_pin(" "), Ok(false));
        assert_eq!(parse_no_pin("true"), Ok(true));
        // `env_values` names the variable before this (tests/flags.rs).
        assert_eq!(
            parse_no_pin("maybe"),
            Err(
                "\"maybe\" is not a boolean; accepted: 1, 0, true, false, yes, no, on, off (any \
                 case), or empty"
                    .into()
            )
        );
    }

    #[test]
    fn issue7_6_sizes_take_binary_suffixes() {
        assert_eq!(parse_byte_size("67108864"), Ok(67_108_864));
        assert_eq!(parse_byte_size("64MiB"), Ok(67_108_864));
        assert_eq!(parse_byte_size("64 mib"), Ok(67_108_864));
        assert_eq!(parse_byte_size("4KiB"), Ok(4096));
        assert_eq!(parse_byte_size("1GiB"), Ok(1_073_741_824));
        assert_eq!(parse_byte_size("100B"), Ok(100));
        let refused = "is not a size: use bytes, an integer (e.g. 67108864), or one with a suffix \
                       KiB, MiB or GiB (e.g. 64MiB)";
        assert_eq!(parse_byte_size("64MB"), Err(format!("\"64MB\" {refused}")));
        assert_eq!(parse_byte_size("MiB"), Err(format!("\"MiB\" {refused}")));
        assert_eq!(
            parse_byte_size("1.5MiB"),
            Err(format!("\"1.5MiB\" {refused}"))
        );
        assert_eq!(
            parse_byte_size("17179869184GiB"),
            Err("\"17179869184GiB\" is too large a size".into())
        );
        // Digits beyond u64 are a size too, only too large (a config file's wide integer).
        assert_eq!(
            parse_byte_size("99999999999999999999"),
            Err("\"99999999999999999999\" is too large a size".into())
        );
        assert_eq!(parse_byte_size_u32("64MiB"), Ok(67_108_864));
        assert_eq!(
            parse_byte_size_u32("4GiB"),
            Err("\"4GiB\" is 4294967296 bytes, more than 4294967295 bytes".into())
        );
    }

    #[test]
    fn address_lists_keep_order_resolve_names_and_name_a_bad_item() {
        assert_eq!(
            parse_address_list("127.0.0.1:7001, localhost:7002,[::1]:7003"),
            Ok(AddressList(vec![
                SocketAddr::from(([127, 0, 0, 1], 7001)),
                SocketAddr::from(([127, 0, 0, 1], 7002)),
                "[::1]:7003".parse().unwrap(),
            ]))
        );
        assert_eq!(
            parse_address_list("127.0.0.1:7001,127.0.0.1:7002")
                .unwrap()
                .to_string(),
            "127.0.0.1:7001,127.0.0.1:7002"
        );
        assert_eq!(
            parse_address_list("127.0.0.1:1,,127.0.0.1:2"),
            Err(
                "\"127.0.0.1:1,,127.0.0.1:2\": address 2 of the list is empty (use \
                 HOST:PORT,HOST:PORT,...)"
                    .into()
            )
        );
        assert_eq!(
            parse_address_list(""),
            Err("\"\": address 1 of the list is empty (use HOST:PORT,HOST:PORT,...)".into())
        );
        assert_eq!(
            parse_address_list("127.0.0.1:1,localhost"),
            Err("\"localhost\" is not HOST:PORT (e.g. 127.0.0.1:8090 or localhost:8090)".into())
        );
        let long = vec!["127.0.0.1:1"; ADDRESS_LIST_LEN_MAX + 1].join(",");
        assert!(
            parse_address_list(&long)
                .unwrap_err()
                .contains("at most 16")
        );
    }

    #[test]
    fn cluster_ids_are_decimal_or_hex() {
        assert_eq!(parse_cluster_id("7"), Ok(7));
        assert_eq!(parse_cluster_id("0x5EED"), Ok(0x5eed));
        assert_eq!(parse_cluster_id("0X5eed_0000"), Ok(0x5eed_0000));
        assert_eq!(
            parse_cluster_id(&u128::MAX.to_string()),
            Ok(u128::MAX),
            "the whole u128 range"
        );
        let refused = "is not a cluster id: use a decimal number (e.g. 7) or 0x-prefixed hex \
                       (e.g. 0x5eed), at most 128 bits";
        assert_eq!(parse_cluster_id("abc"), Err(format!("\"abc\" {refused}")));
        assert_eq!(parse_cluster_id("-1"), Err(format!("\"-1\" {refused}")));
        assert_eq!(
            parse_cluster_id("0x1_0000_0000_0000_0000_0000_0000_0000_0000"),
            Err(format!(
                "\"0x1_0000_0000_0000_0000_0000_0000_0000_0000\" {refused}"
            ))
        );
    }

    #[test]
    fn issue7_6_localhost_resolves_to_ipv4_loopback() {
        assert_eq!(
            parse_host_port("localhost:8090"),
            Ok(SocketAddr::from(([127, 0, 0, 1], 8090)))
        );
    }

    #[test]
    fn ip_addresses_parse_without_resolving() {
        assert_eq!(
            parse_host_port("[::1]:9"),
            Ok("[::1]:9".parse::<SocketAddr>().unwrap())
        );
        assert_eq!(
            parse_host_port("10.1.2.3:0"),
            Ok(SocketAddr::from(([10, 1, 2, 3], 0)))
        );
    }

    #[test]
    fn issue7_6_bad_host_port_names_the_text() {
        assert_eq!(
            parse_host_port("localhost"),
            Err("\"localhost\" is not HOST:PORT (e.g. 127.0.0.1:8090 or localhost:8090)".into())
        );
        assert_eq!(
            parse_host_port("localhost:http"),
            Err("\"localhost:http\": port \"http\" is not a port number (0 to 65535)".into())
        );
        let error = parse_host_port("no-such-host.invalid:8090").unwrap_err();
        assert!(
            error.starts_with(
                "cannot resolve host name \"no-such-host.invalid\" of \"no-such-host.invalid:8090\": "
            ),
            "{error}"
        );
    }

    #[test]
    fn durations_take_seconds_milliseconds_or_minutes() {
        let max = Duration::from_hours(1);
        assert_eq!(parse_duration("5", "x", max), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("5s", "x", max), Ok(Duration::from_secs(5)));
        assert_eq!(
            parse_duration("300ms", "x", max),
            Ok(Duration::from_millis(300))
        );
        assert_eq!(parse_duration("2m", "x", max), Ok(Duration::from_mins(2)));
        assert_eq!(parse_duration("60m", "x", max), Ok(Duration::from_hours(1)));
        assert_eq!(
            parse_duration("61m", "bench duration", max),
            Err("\"61m\" exceeds the largest bench duration, 3600 s (60m)".to_owned())
        );
        assert_eq!(
            parse_duration("91s", "x", Duration::from_secs(90)),
            Err("\"91s\" exceeds the largest x, 90 s".to_owned()),
            "a largest value that is not whole minutes is said in seconds only"
        );
        for bad in ["2h", "1d", "1.5m", "m", "-1s", "-5", ""] {
            assert_eq!(
                parse_duration(bad, "request timeout", max),
                Err(format!(
                    "{bad:?} is not a duration: use a whole number of seconds (5, 5s), \
                     milliseconds (300ms) or minutes (2m), no other unit, at most 3600 s (60m) \
                     for the request timeout"
                ))
            );
        }
    }

    #[test]
    fn whole_numbers_name_the_range_for_every_refused_text() {
        let partitions = whole_number("a partition count", 1u32, 4096);
        assert_eq!(partitions("1"), Ok(1));
        assert_eq!(partitions("4096"), Ok(4096));
        assert_eq!(partitions(" 8 "), Ok(8));
        for bad in [
            "0",
            "4097",
            "100000000",
            "-1",
            "1.5",
            "eight",
            "",
            "99999999999",
        ] {
            assert_eq!(
                partitions(bad),
                Err(format!(
                    "{bad:?} is not a partition count: use a whole number from 1 to 4096"
                )),
                "{bad}"
            );
        }
        let offsets = whole_number("an offset", 0u64, u64::MAX);
        assert_eq!(offsets("0"), Ok(0));
        assert_eq!(
            offsets("-0"),
            Err(
                "\"-0\" is not an offset: use a whole number from 0 to 18446744073709551615, \
                 without a minus sign"
                    .to_owned()
            )
        );
        assert_eq!(
            offsets("-1"),
            Err(
                "\"-1\" is not an offset: use a whole number from 0 to 18446744073709551615"
                    .to_owned()
            )
        );
    }

    #[test]
    fn ranged_whole_numbers_state_the_rule_for_every_refused_text() {
        let rule = "must be between 1 and 1000 ms".to_owned();
        let tick_ms = whole_number_in(1..=1000, rule.clone());
        assert_eq!(tick_ms("1"), Ok(1));
        assert_eq!(tick_ms(" 1000 "), Ok(1000));
        for out_of_range in [
            "0",
            "1001",
            "-1",
            "-99999999999999999999999",
            "99999999999999999999",
        ] {
            assert_eq!(tick_ms(out_of_range), Err(rule.clone()), "{out_of_range}");
        }
        // `-0` is refused for its sign: the rule alone would contradict itself where 0 is in range.
        let idle_rule = "must be between 0 and 10000 µs".to_owned();
        let idle_poll_us = whole_number_in(0..=10000, idle_rule.clone());
        assert_eq!(idle_poll_us("0"), Ok(0));
        for minus_zero in ["-0", " -000 "] {
            assert_eq!(
                idle_poll_us(minus_zero),
                Err(format!(
                    "{minus_zero:?} has a minus sign, which no whole number here takes; {idle_rule}"
                ))
            );
            assert_eq!(
                tick_ms(minus_zero),
                Err(format!(
                    "{minus_zero:?} has a minus sign, which no whole number here takes; {rule}"
                ))
            );
        }
        for not_a_number in ["1e3", "10k", "1.5", "", "ten", "--1"] {
            assert_eq!(
                tick_ms(not_a_number),
                Err(format!("{not_a_number:?} is not a whole number; {rule}")),
                "{not_a_number}"
            );
        }
    }

    #[test]
    fn ranged_byte_sizes_state_the_rule_after_the_accepted_forms() {
        let rule = "must be between 4096 and 1073741824 bytes".to_owned();
        let segment_size = byte_size_in(4096..=1 << 30, rule.clone());
        assert_eq!(segment_size("4KiB"), Ok(4096));
        assert_eq!(segment_size("1GiB"), Ok(1 << 30));
        assert_eq!(segment_size("10"), Err(rule.clone()));
        assert_eq!(segment_size("2GiB"), Err(rule.clone()));
        assert_eq!(
            segment_size("-4KiB"),
            Err(format!(
                "\"-4KiB\" is not a size: use bytes, an integer (e.g. 67108864), or one with a \
                 suffix KiB, MiB or GiB (e.g. 64MiB); {rule}"
            ))
        );
    }

    #[test]
    fn durations_between_name_the_smallest_and_the_largest() {
        let (min, max) = (Duration::from_millis(100), Duration::from_hours(1));
        let session = |text| parse_duration_between(text, "group session timeout", min, max);
        assert_eq!(session("100ms"), Ok(min));
        assert_eq!(session("60m"), Ok(max));
        assert_eq!(
            session("50ms"),
            Err(
                "\"50ms\" is below the smallest group session timeout, 100 ms (the largest is \
                 3600 s (60m))"
                    .to_owned()
            )
        );
        assert_eq!(
            session("61m"),
            Err(
                "\"61m\" exceeds the largest group session timeout, 3600 s (60m); the smallest \
                 is 100 ms"
                    .to_owned()
            )
        );
        assert_eq!(
            session("-1"),
            Err(
                "\"-1\" is not a duration: use a whole number of seconds (5, 5s), milliseconds \
                 (300ms) or minutes (2m), no other unit, at most 3600 s (60m) for the group \
                 session timeout; the smallest is 100 ms"
                    .to_owned()
            )
        );
    }

    #[test]
    fn issue11_4_retention_bytes_take_binary_suffixes_up_to_tib() {
        assert_eq!(parse_retention_bytes("0"), Ok(0));
        assert_eq!(parse_retention_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_retention_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_retention_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_retention_bytes("2 tib"), Ok(2 << 40));
        assert_eq!(parse_retention_bytes("4KiB"), Ok(4096));
        let refused = "is not a retention size: use bytes (e.g. 1073741824), or a whole number \
                       with a suffix KiB, MiB, GiB or TiB (e.g. 512MiB, 1GiB); 0 keeps every byte";
        for bad in [
            "1GB",
            "1.5GiB",
            "TiB",
            "-1",
            "",
            "20000000TiB",
            "18446744073709551615",
        ] {
            assert_eq!(
                parse_retention_bytes(bad),
                Err(format!("{bad:?} {refused}")),
                "{bad}"
            );
        }
    }

    #[test]
    fn issue11_4_retention_ms_takes_units_up_to_days() {
        assert_eq!(parse_retention_ms("0"), Ok(0));
        assert_eq!(parse_retention_ms("1500"), Ok(1500));
        assert_eq!(parse_retention_ms("250ms"), Ok(250));
        assert_eq!(parse_retention_ms("90s"), Ok(90_000));
        assert_eq!(parse_retention_ms("30m"), Ok(1_800_000));
        assert_eq!(parse_retention_ms("12h"), Ok(43_200_000));
        assert_eq!(parse_retention_ms("7d"), Ok(604_800_000));
        assert_eq!(parse_retention_ms("7 D"), Ok(604_800_000));
        assert_eq!(
            parse_retention_ms("1w"),
            Err(
                "\"1w\" is not a retention age: use milliseconds (e.g. 3600000) or a whole number \
                 with a unit ms, s, m, h or d (e.g. 90s, 12h, 7d); 0 keeps messages of any age"
                    .to_owned()
            )
        );
        assert!(parse_retention_ms("1.5h").is_err());
        assert!(parse_retention_ms("").is_err());
        assert_eq!(
            parse_retention_ms("300000000000000d"),
            Err("\"300000000000000d\" is too long a retention age".to_owned())
        );
    }
}
