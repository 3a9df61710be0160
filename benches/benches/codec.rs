//! Codec micro-benchmarks: sealing and validating a 256-byte header, building and parsing a
//! 1000 x 1000-byte message batch, and the server's verification of a `SendMessages` body before
//! and after issue 12 item 1 ("hash each byte once"). CPU only: never touches a socket or a file.

use std::hash::Hasher as _;
use std::hint::black_box;
use std::time::Duration;

use bus::{
    BATCH_HEADER_SIZE, BatchBuilder, BatchView, Command, Header, MESSAGE_FLAG_CHECKSUM_OF_HEADERS,
    MESSAGE_HEADER_SIZE, Operation, checksum_of_batches,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const MESSAGE_COUNT: usize = 1000;
const PAYLOAD_SIZE: usize = 1000;
const MAX: u32 = bus::limits::MESSAGE_SIZE_MAX_DEFAULT;

fn header(c: &mut Criterion) {
    let mut group = c.benchmark_group("header");
    group.throughput(Throughput::Elements(1));
    group.bench_function("encode_empty_body", |b| {
        b.iter(|| {
            let mut header = Header::new(Command::Request, Operation::Ping);
            header.request = black_box(7);
            header.set_checksums(black_box(&[]));
            header
        });
    });
    let mut sealed = Header::new(Command::Request, Operation::Ping);
    sealed.set_checksums(&[]);
    group.bench_function("validate_prefix", |b| {
        b.iter(|| black_box(&sealed).validate_prefix(MAX).is_ok());
    });
    group.finish();
}

fn build(payload: &[u8]) -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(MESSAGE_COUNT, MESSAGE_COUNT * payload.len());
    for index in 0..MESSAGE_COUNT as u64 {
        builder.push(index, 1_700_000_000_000_000 + index, payload);
    }
    builder.finish()
}

fn batch(c: &mut Criterion) {
    let payload: Vec<u8> = (0..PAYLOAD_SIZE).map(|i| (i % 251) as u8).collect();
    let bytes = build(&payload);
    let mut group = c.benchmark_group("batch_1000x1000");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function("build", |b| b.iter(|| build(black_box(&payload))));
    group.bench_function("parse", |b| {
        b.iter(|| {
            let view = BatchView::parse(black_box(&bytes)).expect("valid batch");
            view.messages().map(|m| m.payload.len()).sum::<usize>()
        });
    });
    group.bench_function("build_and_parse", |b| {
        b.iter(|| {
            let bytes = build(black_box(&payload));
            BatchView::parse(&bytes)
                .expect("valid batch")
                .header
                .message_count
        });
    });
    group.finish();
}

/// `batch` as every builder made it before issue 12: the checksum-rule flag clear and the batch
/// checksum over the whole message section (`bus::ChecksumRule::Section`).
fn to_section_rule(mut batch: Vec<u8>) -> Vec<u8> {
    batch[BATCH_HEADER_SIZE + 12] &= !(MESSAGE_FLAG_CHECKSUM_OF_HEADERS as u8);
    let checksum = twox_hash::XxHash3_64::oneshot(&batch[BATCH_HEADER_SIZE..]);
    batch[24..32].copy_from_slice(&checksum.to_le_bytes());
    batch
}

/// Issue 12 item 1: what the server hashes to accept a 1000 x 1000-byte `SendMessages` body.
/// `before`: the frame's `checksum_body` as XXH3-128 of the whole body, then `BatchView::parse`
/// of a batch of the section rule (XXH3-64 of the whole section) and `verify_messages` (XXH3-64
/// of each payload again): three passes over the payloads. `after`: `checksum_of_batches` (the
/// batch header), then `BatchView::parse_verified` of a builder batch (message-headers rule):
/// each payload hashed once, plus 32 bytes per message. Throughput is body bytes.
fn parse_verify(c: &mut Criterion) {
    let payload: Vec<u8> = (0..PAYLOAD_SIZE).map(|i| (i % 251) as u8).collect();
    let after_body = build(&payload);
    let before_body = to_section_rule(after_body.clone());
    let mut group = c.benchmark_group("parse_verify_1000x1000");
    group.throughput(Throughput::Bytes(after_body.len() as u64));
    group.bench_function("before", |b| {
        b.iter(|| {
            let body = black_box(&before_body);
            let checksum_body = twox_hash::XxHash3_128::oneshot(body);
            let view = BatchView::parse(body).expect("valid batch");
            view.verify_messages().expect("valid messages");
            (checksum_body, view.header.message_count)
        });
    });
    group.bench_function("after", |b| {
        b.iter(|| {
            let body = black_box(&after_body);
            let checksum_body = checksum_of_batches(body);
            let view = BatchView::parse_verified(body).expect("valid batch");
            (checksum_body, view.header.message_count)
        });
    });
    group.finish();
}

/// How the message-headers checksum feeds XXH3-64 (1000 headers of 32 bytes, spread through a
/// 1 MB batch as they are): one streaming write per header, a 1 KiB stack stage per write (what
/// `bus` and `storage` do), or all headers gathered into one buffer and hashed at once.
fn message_headers_checksum(c: &mut Criterion) {
    let payload: Vec<u8> = (0..PAYLOAD_SIZE).map(|i| (i % 251) as u8).collect();
    let batch = build(&payload);
    let positions: Vec<usize> = (0..MESSAGE_COUNT)
        .map(|index| BATCH_HEADER_SIZE + index * (MESSAGE_HEADER_SIZE + PAYLOAD_SIZE))
        .collect();
    let header_at = |at: usize| &batch[at..at + MESSAGE_HEADER_SIZE];
    let mut group = c.benchmark_group("message_headers_checksum");
    group.throughput(Throughput::Elements(MESSAGE_COUNT as u64));
    group.bench_function("streaming_per_header", |b| {
        b.iter(|| {
            let mut hasher = twox_hash::XxHash3_64::new();
            for &at in black_box(&positions) {
                hasher.write(header_at(at));
            }
            hasher.finish()
        });
    });
    group.bench_function("staged_1k", |b| {
        b.iter(|| {
            let mut hasher = twox_hash::XxHash3_64::new();
            let mut stage = [0u8; 1024];
            let mut staged_len = 0;
            for &at in black_box(&positions) {
                if staged_len == stage.len() {
                    hasher.write(&stage);
                    staged_len = 0;
                }
                stage[staged_len..staged_len + MESSAGE_HEADER_SIZE].copy_from_slice(header_at(at));
                staged_len += MESSAGE_HEADER_SIZE;
            }
            hasher.write(&stage[..staged_len]);
            hasher.finish()
        });
    });
    group.bench_function("gathered_oneshot", |b| {
        b.iter(|| {
            let mut gathered = Vec::with_capacity(MESSAGE_COUNT * MESSAGE_HEADER_SIZE);
            for &at in black_box(&positions) {
                gathered.extend_from_slice(header_at(at));
            }
            twox_hash::XxHash3_64::oneshot(&gathered)
        });
    });
    group.finish();
}

criterion_group! {
    name = codec;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).sample_size(20);
    targets = header, batch, parse_verify, message_headers_checksum
}
criterion_main!(codec);
