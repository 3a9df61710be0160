//! `shardline group create|delete|list` (issue 11 section 2): consumer groups of a topic, which
//! are metadata (committed like topics). `list` shows each group's live members and their
//! partitions as the primary knows them (`GetMetadata`'s `GroupInfo`). Every stream or topic
//! argument takes an id or a name (`shardline::names`). Never joins a group itself.

use anyhow::Context as _;
use bus::{GroupInfo, Metadata};
use shardline::listing::{Align, render_table};
use shardline::names::{NameOrId, find_topic, resolve_topic_ids};
use shardline::output::{print_line, print_text};

use crate::client_cmds::{AddrArgs, block_on, connect};

#[derive(Debug, clap::Subcommand)]
pub enum GroupCommand {
    /// Create a consumer group on a topic: `shardline group create orders events billing`.
    Create {
        /// The stream: its id or its name.
        #[arg(value_parser = NameOrId::parse, value_name = "STREAM")]
        stream: NameOrId,
        /// The topic: its id or its name.
        #[arg(value_parser = NameOrId::parse, value_name = "TOPIC")]
        topic: NameOrId,
        /// Group name (1-255 bytes of UTF-8 without control characters, unique in the topic).
        name: String,
        #[command(flatten)]
        addr: AddrArgs,
    },
    /// Delete a consumer group: `shardline group delete orders events billing`. Its members
    /// get `GroupNotFound` at their next heartbeat.
    Delete {
        /// The stream: its id or its name.
        #[arg(value_parser = NameOrId::parse, value_name = "STREAM")]
        stream: NameOrId,
        /// The topic: its id or its name.
        #[arg(value_parser = NameOrId::parse, value_name = "TOPIC")]
        topic: NameOrId,
        /// Group name.
        name: String,
        #[command(flatten)]
        addr: AddrArgs,
    },
    /// List a topic's consumer groups: name, generation, members, and each member's partitions.
    List {
        /// The stream: its id or its name.
        #[arg(value_parser = NameOrId::parse, value_name = "STREAM")]
        stream: NameOrId,
        /// The topic: its id or its name.
        #[arg(value_parser = NameOrId::parse, value_name = "TOPIC")]
        topic: NameOrId,
        /// Print a JSON array (one object per group: name, generation, members with client and
        /// partitions).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        addr: AddrArgs,
    },
}

/// The groups of topic `topic` of stream `stream` in `metadata`.
///
/// # Errors
/// No such stream or topic.
fn topic_groups<'m>(
    metadata: &'m Metadata,
    stream: &NameOrId,
    topic: &NameOrId,
) -> anyhow::Result<&'m [GroupInfo]> {
    Ok(&find_topic(metadata, stream, topic)?.1.groups)
}

/// Partition ids as ranges: `0-2,5,7-8`; `-` for none.
fn partitions_text(partitions: &[u16]) -> String {
    if partitions.is_empty() {
        return "-".to_owned();
    }
    let mut parts: Vec<String> = Vec::new();
    let mut start = partitions[0];
    let mut end = start;
    for &partition in &partitions[1..] {
        if partition == end + 1 {
            end = partition;
            continue;
        }
        parts.push(range_text(start, end));
        start = partition;
        end = partition;
    }
    parts.push(range_text(start, end));
    parts.join(",")
}

fn range_text(start: u16, end: u16) -> String {
    if start == end {
        start.to_string()
    } else {
        format!("{start}-{end}")
    }
}

/// `group list`'s table: `GROUP GENERATION MEMBERS MEMBER PARTITIONS`, one line per member
/// (a group without members gets one line with `-`).
fn render_groups(groups: &[GroupInfo]) -> String {
    let mut rows = Vec::new();
    for group in groups {
        let member_count = group.members.len().to_string();
        if group.members.is_empty() {
            rows.push(vec![
                group.name.clone(),
                group.generation.to_string(),
                member_count.clone(),
                "-".to_owned(),
                "-".to_owned(),
            ]);
            continue;
        }
        for member in &group.members {
            rows.push(vec![
                group.name.clone(),
                group.generation.to_string(),
                member_count.clone(),
                member.client.clone(),
                partitions_text(&member.partitions),
            ]);
        }
    }
    render_table(
        &["GROUP", "GENERATION", "MEMBERS", "MEMBER", "PARTITIONS"],
        &[
            Align::Left,
            Align::Right,
            Align::Right,
            Align::Left,
            Align::Left,
        ],
        &rows,
    )
}

/// Refuses a group name the server would refuse, before any round trip.
///
/// # Errors
/// The name breaks the consumer-name rule (`bus::consumer::validate_consumer_name`).
fn check_group_name(name: &str) -> anyhow::Result<()> {
    bus::consumer::validate_consumer_name(name)
        .map_err(|rule| anyhow::anyhow!("group name: {rule}"))
}

pub fn run(command: GroupCommand) -> anyhow::Result<()> {
    block_on(async move {
        match command {
            GroupCommand::Create {
                stream,
                topic,
                name,
                addr,
            } => {
                check_group_name(&name)?;
                let mut client = connect(&addr).await?;
                let (stream_id, topic_id) = resolve_topic_ids(&mut client, &stream, &topic).await?;
                client
                    .create_group(stream_id, topic_id, &name)
                    .await
                    .with_context(|| {
                        format!("cannot create group {name:?} on topic {stream_id}/{topic_id}")
                    })?;
                print_line(&format!(
                    "created group {name:?} on topic {stream_id}/{topic_id}"
                ))
            }
            GroupCommand::Delete {
                stream,
                topic,
                name,
                addr,
            } => {
                check_group_name(&name)?;
                let mut client = connect(&addr).await?;
                let (stream_id, topic_id) = resolve_topic_ids(&mut client, &stream, &topic).await?;
                client
                    .delete_group(stream_id, topic_id, &name)
                    .await
                    .with_context(|| {
                        format!("cannot delete group {name:?} of topic {stream_id}/{topic_id}")
                    })?;
                print_line(&format!(
                    "deleted group {name:?} of topic {stream_id}/{topic_id}"
                ))
            }
            GroupCommand::List {
                stream,
                topic,
                json,
                addr,
            } => {
                let metadata = connect(&addr).await?.get_metadata().await?;
                let groups = topic_groups(&metadata, &stream, &topic)?;
                if json {
                    print_line(&serde_json::to_string(groups)?)
                } else {
                    print_text(&render_groups(groups))
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use bus::GroupMemberInfo;

    use super::*;

    #[test]
    fn issue11_2_partitions_print_as_ranges() {
        assert_eq!(partitions_text(&[]), "-");
        assert_eq!(partitions_text(&[3]), "3");
        assert_eq!(partitions_text(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    }

    #[test]
    fn issue11_2_group_list_prints_a_line_per_member() {
        let groups = vec![
            GroupInfo {
                name: "billing".to_owned(),
                generation: 4,
                members: vec![
                    GroupMemberInfo {
                        client: "0xa".to_owned(),
                        partitions: vec![0, 1, 2],
                    },
                    GroupMemberInfo {
                        client: "0xb".to_owned(),
                        partitions: vec![3],
                    },
                ],
            },
            GroupInfo {
                name: "audit".to_owned(),
                generation: 0,
                members: Vec::new(),
            },
        ];
        assert_eq!(
            render_groups(&groups),
            "GROUP    GENERATION  MEMBERS  MEMBER  PARTITIONS\n\
             billing           4        2  0xa     0-2\n\
             billing           4        2  0xb     3\n\
             audit             0        0  -       -\n"
        );
    }
}
