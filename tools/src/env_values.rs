//! Refused values from `SHARDLINE_*` environment variables, named by their variable. clap checks
//! a variable's value with its flag's parser and words a refusal as if the flag had been typed
//! (`invalid value '0' for '--shards <N|all>'`); someone who never typed `--shards` then looks in
//! the wrong place. This module finds out where the refused value came from and, when it was the
//! environment, names the variable (`SHARDLINE_SHARDS="0" (the environment variable for
//! --shards): RULE`).
//!
//! It never changes what is accepted: it only rewords errors clap already raised. Tested from
//! outside (`tests/flags.rs`), where each case sets its own child's environment: a unit test
//! would have to set this process's, which other test threads read.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// A value from an environment variable that its flag's parser refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?} (the environment variable for --{flag}): {rule}")]
pub struct EnvValueError {
    /// The variable, e.g. `SHARDLINE_SHARDS`.
    pub variable: String,
    /// The long flag the variable stands for, without dashes (`shards`).
    pub flag: String,
    /// The variable's value, as clap read it.
    pub value: String,
    /// The parser's rule, without clap's framing.
    pub rule: String,
}

/// The error of `error`, which `command` raised parsing `args` (program name first), when the
/// value it refused came from an environment variable rather than from `args`; `None` when it
/// came from `args`, or when `error` is not about a refused value.
///
/// How: clap reads a variable only for a flag absent from the command line, so the value came
/// from the variable exactly when parsing `args` again without that variable no longer raises
/// the same error.
pub fn env_value_error(
    command: &clap::Command,
    args: &[OsString],
    error: &clap::Error,
) -> Option<EnvValueError> {
    if !matches!(
        error.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return None;
    }
    let (Some(ContextValue::String(arg_text)), Some(ContextValue::String(value))) = (
        error.get(ContextKind::InvalidArg),
        error.get(ContextKind::InvalidValue),
    ) else {
        return None;
    };
    // Built, as parsing builds it: an argument renders as `--shards <N|all>` only then.
    let mut built = command.clone();
    built.build();
    let (flag, variable) = env_arg(&built, arg_text, value)?;
    let without = without_env(command.clone(), &variable);
    let same_error = without
        .try_get_matches_from(args)
        .err()
        .is_some_and(|again| {
            again.kind() == error.kind()
                && again.get(ContextKind::InvalidArg) == error.get(ContextKind::InvalidArg)
                && again.get(ContextKind::InvalidValue) == error.get(ContextKind::InvalidValue)
        });
    if same_error {
        return None;
    }
    Some(EnvValueError {
        variable,
        flag,
        value: value.clone(),
        rule: crate::config_file::clap_rule(error),
    })
}

/// The long flag and the variable of the argument of `command` (or of any of its subcommands)
/// that clap renders as `arg_text` (`--shards <N|all>`) and whose variable holds `value` now.
fn env_arg(command: &clap::Command, arg_text: &str, value: &str) -> Option<(String, String)> {
    let own = command.get_arguments().find_map(|arg| {
        let variable = arg.get_env()?;
        let long = arg.get_long()?;
        let set_to_value = std::env::var_os(variable).is_some_and(|set| set == value);
        (arg.to_string() == arg_text && set_to_value)
            .then(|| (long.to_owned(), variable.to_string_lossy().into_owned()))
    });
    own.or_else(|| {
        command
            .get_subcommands()
            .find_map(|sub| env_arg(sub, arg_text, value))
    })
}

/// `command` with `variable` read by none of its arguments, nor by its subcommands'.
fn without_env(command: clap::Command, variable: &str) -> clap::Command {
    command
        .mut_args(|arg| {
            if arg.get_env().is_some_and(|name| name == variable) {
                arg.env(None::<&'static str>)
            } else {
                arg
            }
        })
        .mut_subcommands(|sub| without_env(sub, variable))
}
