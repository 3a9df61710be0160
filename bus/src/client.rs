//! Async client library over compio TCP, used by the bench and the CLI. One request in flight per
//! connection.

use crate::batch::BatchView;
use crate::command::ErrorCode;
use crate::frame::FrameError;
use crate::namespace::Namespace;
use crate::wire::Metadata;

#[derive(Debug)]
pub struct Client {}

/// The owner shard acknowledged a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendAck {
    pub base_offset: u64,
    pub message_count: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("server error {code:?} ({}): {message}", *code as u32)]
    Server { code: ErrorCode, message: String },
    #[error("protocol violation by server: {0}")]
    Protocol(String),
}

impl ClientError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, ClientError::Server { code, .. } if code.is_retryable())
    }
}

impl Client {
    pub async fn connect(addr: std::net::SocketAddr) -> Result<Client, ClientError> {
        todo!("{addr}")
    }
    pub async fn ping(&mut self) -> Result<(), ClientError> {
        todo!()
    }
    pub async fn create_stream(&mut self, stream_id: u32, name: &str) -> Result<(), ClientError> {
        todo!("{stream_id}{name}")
    }
    pub async fn delete_stream(&mut self, stream_id: u32) -> Result<(), ClientError> {
        todo!("{stream_id}")
    }
    pub async fn create_topic(
        &mut self,
        stream_id: u32,
        topic_id: u16,
        name: &str,
        partition_count: u32,
    ) -> Result<(), ClientError> {
        todo!("{stream_id}{topic_id}{name}{partition_count}")
    }
    pub async fn delete_topic(&mut self, stream_id: u32, topic_id: u16) -> Result<(), ClientError> {
        todo!("{stream_id}{topic_id}")
    }
    pub async fn get_metadata(&mut self) -> Result<Metadata, ClientError> {
        todo!()
    }
    /// Sends one batch built with `BatchBuilder`.
    pub async fn send_messages(
        &mut self,
        namespace: Namespace,
        batch: Vec<u8>,
    ) -> Result<SendAck, ClientError> {
        todo!("{namespace}{}", batch.len())
    }
    /// Returns the reply body: concatenated batches starting at the batch containing `offset`
    /// (callers skip messages below `offset`); empty when nothing is there yet.
    pub async fn poll_messages(
        &mut self,
        namespace: Namespace,
        offset: u64,
        max_count: u32,
    ) -> Result<Vec<u8>, ClientError> {
        todo!("{namespace}{offset}{max_count}")
    }
}

/// Helper for callers: the messages at or above `offset` in a poll reply body.
pub fn messages_from(
    body: &[u8],
    offset: u64,
) -> Result<Vec<crate::batch::MessageView<'_>>, crate::batch::BatchError> {
    let batches = BatchView::parse_many(body)?;
    Ok(batches
        .into_iter()
        .flat_map(|b| b.messages())
        .filter(|m| m.offset >= offset)
        .collect())
}
