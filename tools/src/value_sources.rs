//! Where each setting of a subcommand took its value: the command line, a `SHARDLINE_*`
//! variable, the config file (`config_file`), its default, or nowhere. A rule between two
//! settings (`--view-change-timeout-ticks` above `--heartbeat-ticks`) names the source of each
//! side with it, so that an operator whose heartbeat came from a file they forgot is sent to that
//! file and key (issue 8 section 3 layers the sources).
//!
//! It only reports: which source wins is clap's and `config_file`'s business.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::parser::ValueSource;

use crate::config_file::ConfigFile;

/// Where one setting took its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Typed as the flag.
    CommandLine,
    /// The environment variable of that name.
    Env(String),
    /// The config file at that path.
    File(PathBuf),
    /// The flag's built-in default.
    Default,
    /// Not set at all (a flag without a default).
    Unset,
}

/// The origin of every long flag of one subcommand, and the config file read, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ValueSources {
    /// The config file, with the keys whose values took effect.
    pub file: Option<ConfigFile>,
    /// Long flag name (without dashes) to origin.
    origins: BTreeMap<String, Origin>,
}

impl ValueSources {
    /// The origins of `sub_command`'s long flags in `sub_matches` (its parsed arguments), a value
    /// taken from `file` counted as the file's (the file's values reach clap as defaults).
    pub fn of(
        sub_command: &clap::Command,
        sub_matches: &clap::ArgMatches,
        file: Option<ConfigFile>,
    ) -> Self {
        let origins = sub_command
            .get_arguments()
            .filter_map(|arg| {
                let long = arg.get_long()?;
                let origin = match sub_matches.value_source(arg.get_id().as_str()) {
                    Some(ValueSource::CommandLine) => Origin::CommandLine,
                    Some(ValueSource::EnvVariable) => Origin::Env(
                        arg.get_env()
                            .map_or_else(String::new, |name| name.to_string_lossy().into_owned()),
                    ),
                    Some(ValueSource::DefaultValue) => match &file {
                        Some(file) if file.sets(long) => Origin::File(file.path.clone()),
                        _ => Origin::Default,
                    },
                    _ => Origin::Unset,
                };
                Some((long.to_owned(), origin))
            })
            .collect();
        Self { file, origins }
    }

    /// The origin of `flag` (`--tick-ms` or `tick-ms`); `None` for a flag the subcommand lacks.
    pub fn origin(&self, flag: &str) -> Option<&Origin> {
        self.origins.get(flag.trim_start_matches("--"))
    }

    /// `flag`, then each other flag of this subcommand that `rule` names (`--heartbeat-ticks`),
    /// each with its origin, as a refusal appends them: `--view-change-timeout-ticks from the
    /// command line; --heartbeat-ticks from config file r0.toml, key heartbeat-ticks`. `None`
    /// when `rule` names no other flag (a value's own range: its flag or key says it all).
    pub fn sides(&self, flag: &str, rule: &str) -> Option<String> {
        let flag = flag.trim_start_matches("--");
        flags_named(rule)
            .any(|named| named != flag && self.origins.contains_key(named))
            .then(|| self.sides_of(flag, rule))
    }

    /// [`Self::sides`] even when `rule` names no other flag: `flag`'s origin alone then (a host
    /// rule, such as `--cpus` outside the affinity mask, is about the value wherever it came
    /// from).
    pub fn sides_of(&self, flag: &str, rule: &str) -> String {
        let flag = flag.trim_start_matches("--");
        let mut names = vec![flag];
        for named in flags_named(rule) {
            if self.origins.contains_key(named) && !names.contains(&named) {
                names.push(named);
            }
        }
        names
            .into_iter()
            .map(|name| self.side(name))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// `--NAME` and where its value came from.
    fn side(&self, name: &str) -> String {
        match self.origins.get(name) {
            Some(Origin::CommandLine) => format!("--{name} from the command line"),
            Some(Origin::Env(variable)) => format!("--{name} from {variable}"),
            Some(Origin::File(path)) => {
                format!("--{name} from config file {}, key {name}", path.display())
            }
            Some(Origin::Default) => format!("--{name} from its default"),
            Some(Origin::Unset) | None => format!("--{name} not set"),
        }
    }
}

/// The long flag names (without dashes) that `text` mentions as `--name`, in order.
fn flags_named(text: &str) -> impl Iterator<Item = &str> {
    text.split("--").skip(1).filter_map(|after| {
        let end = after
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            .unwrap_or(after.len());
        let name = after[..end].trim_end_matches('-');
        (!name.is_empty()).then_some(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(origins: &[(&str, Origin)]) -> ValueSources {
        ValueSources {
            file: None,
            origins: origins
                .iter()
                .map(|(name, origin)| ((*name).to_owned(), origin.clone()))
                .collect(),
        }
    }

    #[test]
    fn flags_named_finds_each_long_flag_in_order() {
        let names: Vec<&str> = flags_named(
            "is also this replica's (--replica 1) replica address in --addresses: clients",
        )
        .collect();
        assert_eq!(names, ["replica", "addresses"]);
        assert_eq!(flags_named("no flag - here").count(), 0);
    }

    #[test]
    fn sides_name_each_flag_of_a_rule_between_settings_with_its_origin() {
        let sources = sources(&[
            (
                "view-change-timeout-ticks",
                Origin::Env("SHARDLINE_X".into()),
            ),
            ("heartbeat-ticks", Origin::File(PathBuf::from("r0.toml"))),
            ("tick-ms", Origin::Default),
            ("addresses", Origin::Unset),
            ("replica", Origin::CommandLine),
        ]);
        assert_eq!(
            sources
                .sides(
                    "--view-change-timeout-ticks",
                    "must be greater than --heartbeat-ticks (40): ... --heartbeat-ticks"
                )
                .unwrap(),
            "--view-change-timeout-ticks from SHARDLINE_X; --heartbeat-ticks from config file \
             r0.toml, key heartbeat-ticks"
        );
        assert_eq!(
            sources
                .sides(
                    "--replica",
                    "needs --addresses, at index --replica; --tick-ms"
                )
                .unwrap(),
            "--replica from the command line; --addresses not set; --tick-ms from its default"
        );
        assert_eq!(
            sources.sides("--tick-ms", "must be between 1 and 1000 ms"),
            None,
            "a value's own range names no other flag"
        );
        assert_eq!(
            sources.sides("--tick-ms", "see --no-such-flag"),
            None,
            "only this subcommand's flags"
        );
        assert_eq!(
            sources.sides_of("--tick-ms", "--tick-ms 0 is not allowed here"),
            "--tick-ms from its default",
            "a host rule names its own flag's origin alone"
        );
    }
}
