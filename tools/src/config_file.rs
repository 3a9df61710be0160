//! `--config FILE`: a TOML file whose keys are a subcommand's long flag names (`data-dir`,
//! `addresses`, `tick-ms`, ...), layered under flags and environment variables: a flag wins over
//! its `SHARDLINE_*` variable, which wins over the file, which wins over the built-in default
//! (issue 8 section 3).
//!
//! How: the command line is parsed once to find the file; every key of the file must name one of
//! the subcommand's long flags (an unknown key is refused, naming it and the file) and its value
//! must pass that flag's own parser (a bad one is refused, naming key, value, file and rule);
//! then each value whose flag was given neither on the command line nor in the environment
//! becomes that flag's default, and the command line is parsed again. So a file value goes
//! through exactly the checks a flag value does, and `ServerConfig::validate` judges the result
//! (callers name the file in its errors with [`ConfigFile::sets`]).
//!
//! Values: a string or an integer as the flag would take it (`shards = 4`, `shards = "all"`,
//! `max-message-size = "64MiB"`), a boolean for a flag that takes no value (`no-pin = true`),
//! an array of strings for a list (`addresses = ["127.0.0.1:7001", "127.0.0.1:7002"]`, the same
//! as the comma-separated text).

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches};

use crate::env_values::{EnvValueError, env_value_error};
use crate::value_sources::ValueSources;

/// Largest config file read (bytes): a full one is a few hundred bytes.
pub const CONFIG_FILE_SIZE_MAX: u64 = 1 << 20;

/// Long flags that cannot be set from a file: the file itself, and help and version.
const NOT_FILE_KEYS: [&str; 3] = ["config", "help", "version"];

/// A config file that was read, and the keys whose values took effect (those whose flag was
/// given neither on the command line nor in the environment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFile {
    pub path: PathBuf,
    pub applied: BTreeSet<String>,
}

impl ConfigFile {
    /// Whether the value of `flag` (`--tick-ms` or `tick-ms`) came from this file.
    pub fn sets(&self, flag: &str) -> bool {
        self.applied.contains(flag.trim_start_matches("--"))
    }

    /// The error of a value from this file that a later check refused: `key`, `value` and
    /// `rule` as `ServerConfig::validate` names them.
    pub fn invalid(&self, flag: &str, value: &str, rule: &str) -> ConfigFileError {
        ConfigFileError::BadValue {
            path: self.path.clone(),
            key: flag.trim_start_matches("--").to_owned(),
            value: value.to_owned(),
            rule: rule.to_owned(),
        }
    }
}

/// Why a config file was refused; each names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read config file {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    #[error("config file {} is not valid TOML: {reason}", path.display())]
    Syntax { path: PathBuf, reason: String },
    #[error(
        "config file {}: unknown key {key:?}; keys are the long flag names of `{subcommand}` \
         (see `shardline {subcommand} --help`): {known}",
        path.display()
    )]
    UnknownKey {
        path: PathBuf,
        key: String,
        subcommand: String,
        known: String,
    },
    #[error("config file {}: key {key} has {found}: {expected}", path.display())]
    BadType {
        path: PathBuf,
        key: String,
        found: String,
        expected: &'static str,
    },
    #[error("config file {}: invalid {key} value {value:?}: {rule}", path.display())]
    BadValue {
        path: PathBuf,
        key: String,
        value: String,
        rule: String,
    },
}

/// Why parsing the command line failed.
#[derive(Debug)]
pub enum ParseFailure {
    /// Bad flags, or `--help`/`--version`: call `exit()` on it, as clap's `parse` would.
    Clap(clap::Error),
    /// The config file was refused.
    File(ConfigFileError),
    /// A `SHARDLINE_*` variable's value was refused by its flag's parser.
    Env(EnvValueError),
}

/// `error`, which `command` raised parsing `args`: `Env` when the value it refused came from an
/// environment variable (`env_values`), else `Clap`.
fn clap_failure(command: &clap::Command, args: &[OsString], error: clap::Error) -> ParseFailure {
    match env_value_error(command, args, &error) {
        Some(env_error) => ParseFailure::Env(env_error),
        None => ParseFailure::Clap(error),
    }
}

/// Parses `args` (program name first) into `P`, reading the config file that the `config_id`
/// argument of subcommand `subcommand` names (flag or environment), as the module doc says.
/// Returns where each of `subcommand`'s settings came from, with the file and the keys it set
/// (no file without one; no settings when another subcommand ran).
///
/// # Errors
/// `Clap` for what `Parser::try_parse_from` refuses (flags, or a value the file set that
/// a flag's parser refuses after all, which the file check makes unreachable); `Env` for a
/// value of a `SHARDLINE_*` variable that its flag's parser refuses; `File` for the file's own
/// errors (unreadable, not TOML, unknown key, wrong type, bad value).
pub fn parse_with_config_file<P>(
    args: &[OsString],
    subcommand: &str,
    config_id: &str,
) -> Result<(P, ValueSources), ParseFailure>
where
    P: CommandFactory + FromArgMatches,
{
    let command = P::command();
    let matches = command
        .clone()
        .try_get_matches_from(args)
        .map_err(|error| clap_failure(&command, args, error))?;
    let file_path = match matches.subcommand() {
        Some((name, sub)) if name == subcommand => sub.get_one::<PathBuf>(config_id).cloned(),
        _ => None,
    };
    let Some(path) = file_path else {
        let parsed = P::from_arg_matches(&matches).map_err(ParseFailure::Clap)?;
        return Ok((parsed, sources_of(&command, &matches, subcommand, None)));
    };
    let sub_matches = matches
        .subcommand_matches(subcommand)
        .expect("the subcommand matched above");
    let sub_command = command
        .find_subcommand(subcommand)
        .expect("the subcommand exists: it matched");
    let values = read_values(&path, sub_command).map_err(ParseFailure::File)?;
    let mut applied = BTreeSet::new();
    let mut defaults = Vec::new();
    for (key, id, text) in values {
        let overridden = matches!(
            sub_matches.value_source(&id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if !overridden {
            applied.insert(key);
            defaults.push((id, text));
        }
    }
    let command = command.mut_subcommand(subcommand, |mut sub| {
        for (id, text) in defaults {
            // Arg defaults are `&'static str` without clap's `string` feature; a config file is
            // read once per process, so leaking its few values is bounded.
            let text: &'static str = Box::leak(text.into_boxed_str());
            sub = sub.mut_arg(id, |arg| arg.default_value(text));
        }
        sub
    });
    let matches = command
        .clone()
        .try_get_matches_from(args)
        .map_err(|error| clap_failure(&command, args, error))?;
    let parsed = P::from_arg_matches(&matches).map_err(ParseFailure::Clap)?;
    let file = ConfigFile { path, applied };
    Ok((
        parsed,
        sources_of(&command, &matches, subcommand, Some(file)),
    ))
}

/// The [`ValueSources`] of subcommand `subcommand` in `matches`; empty (and without the file)
/// when another subcommand ran.
fn sources_of(
    command: &clap::Command,
    matches: &clap::ArgMatches,
    subcommand: &str,
    file: Option<ConfigFile>,
) -> ValueSources {
    match (
        command.find_subcommand(subcommand),
        matches.subcommand_matches(subcommand),
    ) {
        (Some(sub_command), Some(sub_matches)) => ValueSources::of(sub_command, sub_matches, file),
        _ => ValueSources::default(),
    }
}

/// Reads and checks the file: every key names a long flag of `sub_command` and every value
/// passes that flag's parser. Returns (key, argument id, value as flag text).
fn read_values(
    path: &Path,
    sub_command: &clap::Command,
) -> Result<Vec<(String, String, String)>, ConfigFileError> {
    let text = read_text(path)?;
    let table: toml::Table = toml::from_str(&text).map_err(|error| {
        wide_integer_error(path, &text, sub_command).unwrap_or_else(|| ConfigFileError::Syntax {
            path: path.to_owned(),
            reason: error.to_string().trim_end().replace('\n', " "),
        })
    })?;
    let mut values = Vec::new();
    for (key, value) in table {
        let arg = file_arg(path, &key, sub_command)?;
        let flag = matches!(arg.get_action(), ArgAction::SetTrue);
        let text = value_text(path, &key, &value, flag)?;
        if !flag && let Err(error) = check_value(arg, &text) {
            return Err(ConfigFileError::BadValue {
                path: path.to_owned(),
                key,
                value: text,
                rule: clap_rule(&error),
            });
        }
        values.push((key, arg.get_id().as_str().to_owned(), text));
    }
    Ok(values)
}

/// The long flag of `sub_command` that config-file key `key` names.
///
/// # Errors
/// `UnknownKey`, listing the keys there are, for a key that names none.
fn file_arg<'a>(
    path: &Path,
    key: &str,
    sub_command: &'a clap::Command,
) -> Result<&'a clap::Arg, ConfigFileError> {
    let file_args: Vec<&clap::Arg> = sub_command
        .get_arguments()
        .filter(|arg| {
            arg.get_long()
                .is_some_and(|long| !NOT_FILE_KEYS.contains(&long))
        })
        .collect();
    let known = || {
        file_args
            .iter()
            .filter_map(|arg| arg.get_long())
            .collect::<Vec<_>>()
            .join(", ")
    };
    file_args
        .iter()
        .find(|arg| arg.get_long() == Some(key))
        .copied()
        .ok_or_else(|| ConfigFileError::UnknownKey {
            path: path.to_owned(),
            key: key.to_owned(),
            subcommand: sub_command.get_name().to_owned(),
            known: known(),
        })
}

/// The error of a file that TOML refuses only for an integer beyond its 64 bits (`tick-ms =
/// 99999999999999999999`: TOML's own message names neither the key nor its rule), judged as
/// `read_values` judges any value: an unknown key first, else the integer (as written, e.g.
/// `0x1_0000_0000_0000_0000` as `0x10000000000000000`) through its flag's parser, naming key,
/// value and rule; an integer the flag takes (a 128-bit `cluster`) is refused with how to write
/// it, as a string. `None` when the file has no such integer at its top level (TOML's message
/// stands).
fn wide_integer_error(
    path: &Path,
    text: &str,
    sub_command: &clap::Command,
) -> Option<ConfigFileError> {
    let table = toml::de::DeTable::parse(text).ok()?;
    let mut wide = None;
    for (key, value) in table.get_ref() {
        let key = key.get_ref().as_ref();
        if let Err(error) = file_arg(path, key, sub_command) {
            return Some(error);
        }
        let items = match value.get_ref() {
            toml::de::DeValue::Array(items) => items.iter().collect(),
            _ => vec![value],
        };
        let beyond_i64 = items.into_iter().find_map(|item| match item.get_ref() {
            toml::de::DeValue::Integer(integer)
                if i64::from_str_radix(integer.as_str(), integer.radix()).is_err() =>
            {
                Some(integer.to_string())
            }
            _ => None,
        });
        if wide.is_none()
            && let Some(integer) = beyond_i64
        {
            wide = Some((key.to_owned(), integer));
        }
    }
    let (key, value) = wide?;
    let arg = file_arg(path, &key, sub_command).ok()?;
    let rule = match check_value(arg, &value) {
        Err(error) => clap_rule(&error),
        Ok(()) => format!(
            "a TOML integer holds {} to {}; write a larger value as a string: {key} = \"{value}\"",
            i64::MIN,
            i64::MAX
        ),
    };
    Some(ConfigFileError::BadValue {
        path: path.to_owned(),
        key,
        value,
        rule,
    })
}

/// Runs `arg`'s value parser on `text` (as the one value of a throwaway command: clap keeps a
/// parser's own entry point private).
fn check_value(arg: &clap::Arg, text: &str) -> Result<(), clap::Error> {
    clap::Command::new("config-file-value")
        .no_binary_name(true)
        .arg(
            clap::Arg::new("value")
                .value_parser(arg.get_value_parser().clone())
                .allow_hyphen_values(true)
                .required(true),
        )
        .try_get_matches_from([OsStr::new(text)])
        .map(drop)
}

fn read_text(path: &Path) -> Result<String, ConfigFileError> {
    let read_error = |reason: String| ConfigFileError::Read {
        path: path.to_owned(),
        reason,
    };
    let size = std::fs::metadata(path)
        .map_err(|error| read_error(error.to_string()))?
        .len();
    if size > CONFIG_FILE_SIZE_MAX {
        return Err(read_error(format!(
            "{size} bytes, more than the {CONFIG_FILE_SIZE_MAX}-byte limit of a config file"
        )));
    }
    // The size above is 0 for a device, a FIFO or a /proc file: bound the read itself too.
    let file = std::fs::File::open(path).map_err(|error| read_error(error.to_string()))?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, CONFIG_FILE_SIZE_MAX + 1),
        &mut bytes,
    )
    .map_err(|error| read_error(error.to_string()))?;
    if bytes.len() as u64 > CONFIG_FILE_SIZE_MAX {
        return Err(read_error(format!(
            "more than the {CONFIG_FILE_SIZE_MAX}-byte limit of a config file (a device or a \
             pipe?)"
        )));
    }
    String::from_utf8(bytes).map_err(|error| read_error(format!("not UTF-8 text: {error}")))
}

/// What a value of a flag that takes one must be, for `BadType`.
const SCALAR_EXPECTED: &str = "use a string or an integer, as the flag takes it (or an array of \
                               them for a list, e.g. addresses = [\"127.0.0.1:7001\", \
                               \"127.0.0.1:7002\"])";

/// A TOML value as the text its flag would take.
fn value_text(
    path: &Path,
    key: &str,
    value: &toml::Value,
    flag: bool,
) -> Result<String, ConfigFileError> {
    let bad_type = |expected: &'static str| ConfigFileError::BadType {
        path: path.to_owned(),
        key: key.to_owned(),
        found: match value {
            toml::Value::String(text) => format!("the string {text:?}"),
            toml::Value::Integer(number) => format!("the integer {number}"),
            toml::Value::Float(number) => format!("the float {number}"),
            toml::Value::Boolean(on) => format!("the boolean {on}"),
            other => format!("a {}", other.type_str()),
        },
        expected,
    };
    if flag {
        return match value {
            toml::Value::Boolean(on) => Ok(on.to_string()),
            _ => Err(bad_type("a flag without a value takes true or false")),
        };
    }
    let scalar = |value: &toml::Value| match value {
        toml::Value::String(text) => Some(text.clone()),
        toml::Value::Integer(number) => Some(number.to_string()),
        _ => None,
    };
    match value {
        toml::Value::Array(items) => items
            .iter()
            .map(scalar)
            .collect::<Option<Vec<_>>>()
            .map(|items| items.join(","))
            .ok_or_else(|| bad_type(SCALAR_EXPECTED)),
        other => scalar(other).ok_or_else(|| bad_type(SCALAR_EXPECTED)),
    }
}

/// The rule a flag parser's error states, without clap's `error: invalid value ... for ...`
/// framing (the caller names key and value itself).
pub(crate) fn clap_rule(error: &clap::Error) -> String {
    if let Some(source) = std::error::Error::source(error) {
        return source.to_string();
    }
    let rendered = error.to_string();
    let first = rendered.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Sub,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Sub {
        Serve(Args),
    }

    #[derive(Debug, clap::Args)]
    struct Args {
        #[arg(long, env = "CONFIG_FILE_TEST_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long, env = "CONFIG_FILE_TEST_TICK_MS", default_value_t = 10)]
        tick_ms: u64,
        #[arg(long, default_value = "a")]
        name: String,
        #[arg(long, value_parser = crate::arg_values::parse_address_list)]
        addresses: Option<crate::arg_values::AddressList>,
        #[arg(long)]
        quiet: bool,
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        file
    }

    fn parse(args: &[&str]) -> Result<(Args, Option<ConfigFile>), ParseFailure> {
        let args: Vec<OsString> = std::iter::once("prog")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        let (cli, sources) = parse_with_config_file::<Cli>(&args, "serve", "config")?;
        let Sub::Serve(args) = cli.command;
        Ok((args, sources.file))
    }

    fn file_error(args: &[&str]) -> ConfigFileError {
        match parse(args) {
            Err(ParseFailure::File(error)) => error,
            other => panic!("expected a file error, got {other:?}"),
        }
    }

    /// Adversarial review: `--config /dev/zero` grew the process by gigabytes (a device's size
    /// reads as 0, so the size check alone let the read run unbounded).
    #[test]
    fn a_device_as_config_file_is_refused_at_the_size_limit() {
        let error = read_text(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(error.contains("/dev/zero"), "{error}");
        assert!(error.contains("byte limit of a config file"), "{error}");
    }

    #[test]
    fn file_values_fill_what_flags_do_not_set() {
        let config = file(
            "tick-ms = 25\nname = \"from-file\"\naddresses = [\"127.0.0.1:7001\", \
             \"127.0.0.1:7002\"]\nquiet = true\n",
        );
        let path = config.path().to_str().unwrap();
        let (args, loaded) = parse(&["serve", "--config", path, "--name", "flag"]).unwrap();
        assert_eq!(args.tick_ms, 25);
        assert_eq!(args.name, "flag", "a flag beats the file");
        assert!(args.quiet);
        assert_eq!(
            args.addresses.unwrap().to_string(),
            "127.0.0.1:7001,127.0.0.1:7002"
        );
        let loaded = loaded.unwrap();
        assert!(loaded.sets("--tick-ms") && loaded.sets("addresses") && loaded.sets("quiet"));
        assert!(!loaded.sets("--name"), "the flag's value is not the file's");
        // Without the file: defaults.
        let (args, loaded) = parse(&["serve"]).unwrap();
        assert_eq!(
            (args.tick_ms, args.name.as_str(), args.quiet),
            (10, "a", false)
        );
        assert_eq!(loaded, None);
    }

    #[test]
    fn unknown_keys_and_bad_values_name_key_value_and_file() {
        let config = file("tick-ms = 5\nticks = 3\n");
        let path = config.path().to_str().unwrap();
        let error = file_error(&["serve", "--config", path]);
        assert_eq!(
            error.to_string(),
            format!(
                "config file {path}: unknown key \"ticks\"; keys are the long flag names of \
                 `serve` (see `shardline serve --help`): tick-ms, name, addresses, quiet"
            )
        );
        let config = file("tick-ms = \"soon\"\n");
        let path = config.path().to_str().unwrap();
        assert_eq!(
            file_error(&["serve", "--config", path]).to_string(),
            format!(
                "config file {path}: invalid tick-ms value \"soon\": invalid digit found in \
                 string"
            )
        );
        // A bad value is refused even where a flag overrides it: the file is wrong either way.
        assert!(matches!(
            file_error(&["serve", "--config", path, "--tick-ms", "3"]),
            ConfigFileError::BadValue { .. }
        ));
        let config = file("quiet = \"yes\"\n");
        let path = config.path().to_str().unwrap();
        assert_eq!(
            file_error(&["serve", "--config", path]).to_string(),
            format!(
                "config file {path}: key quiet has the string \"yes\": a flag without a value \
                 takes true or false"
            )
        );
        let config = file("tick-ms = 1.5\n");
        let path = config.path().to_str().unwrap();
        assert!(matches!(
            file_error(&["serve", "--config", path]),
            ConfigFileError::BadType { .. }
        ));
        let config = file("addresses = [\"127.0.0.1:1\", \"nowhere\"]\n");
        let path = config.path().to_str().unwrap();
        assert_eq!(
            file_error(&["serve", "--config", path]).to_string(),
            format!(
                "config file {path}: invalid addresses value \"127.0.0.1:1,nowhere\": \
                 \"nowhere\" is not HOST:PORT (e.g. 127.0.0.1:8090 or localhost:8090)"
            )
        );
        let config = file("tick-ms = \n");
        let path = config.path().to_str().unwrap();
        assert!(matches!(
            file_error(&["serve", "--config", path]),
            ConfigFileError::Syntax { .. }
        ));
        assert!(matches!(
            file_error(&["serve", "--config", "/nonexistent/shardline.toml"]),
            ConfigFileError::Read { .. }
        ));
    }

    #[test]
    fn a_later_rule_names_the_file_when_the_value_came_from_it() {
        let loaded = ConfigFile {
            path: PathBuf::from("r0.toml"),
            applied: BTreeSet::from(["tick-ms".to_owned()]),
        };
        assert!(loaded.sets("--tick-ms"));
        assert_eq!(
            loaded
                .invalid("--tick-ms", "0", "must be between 1 and 1000 ms")
                .to_string(),
            "config file r0.toml: invalid tick-ms value \"0\": must be between 1 and 1000 ms"
        );
    }
}
