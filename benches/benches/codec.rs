//! Codec micro-benchmarks: sealing and validating a 256-byte header, and building and parsing a
//! 1000 x 1000-byte message batch. CPU only: never touches a socket or a file.

use std::hint::black_box;
use std::time::Duration;

use bus::{BatchBuilder, BatchView, Command, Header, Operation};
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

criterion_group! {
    name = codec;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).sample_size(20);
    targets = header, batch
}
criterion_main!(codec);
