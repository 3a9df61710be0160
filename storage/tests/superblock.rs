//! Superblock behaviour a booting replica observes: create/open round trips, writes that survive a
//! reopen, every single-copy damage survived and named in the report, all-copies damage refused
//! naming the file, a crash between copies opening the newest valid sequence, VSR monotonicity
//! asserted, and a property test that random byte flips never panic open nor invent a state.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use storage::limits::{SUPERBLOCK_COPY_COUNT, SUPERBLOCK_COPY_SIZE, SUPERBLOCK_FILE_SIZE};
use storage::{
    CopyDefect, CopyStatus, OpenReport, SUPERBLOCK_FILE_NAME, Superblock, SuperblockError,
    SuperblockState,
};

fn block_on<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new().unwrap().block_on(future)
}

fn initial() -> SuperblockState {
    SuperblockState {
        sequence: 0,
        cluster: 0xfeed_0000_0000_0000_0000_0000_0000_beef,
        replica_id: 1,
        replica_count: 3,
        view: 0,
        log_view: 0,
        commit_max: 0,
        checkpoint_op: 0,
        snapshot_checksum: 0,
    }
}

/// `initial()` advanced `step` times: each step raises view, log_view, commit_max and the
/// checkpoint pairing, so every step's state is distinct.
fn advanced(step: u64) -> SuperblockState {
    SuperblockState {
        view: step as u32 * 2,
        log_view: step as u32,
        commit_max: step * 10,
        checkpoint_op: step * 5,
        snapshot_checksum: step.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        ..initial()
    }
}

fn with_sequence(state: SuperblockState, sequence: u64) -> SuperblockState {
    SuperblockState { sequence, ..state }
}

fn superblock_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join(SUPERBLOCK_FILE_NAME)
}

/// Creates the file and writes `advanced(1..=writes)`; returns the file bytes after each sequence
/// (index 0 is sequence 1).
fn create_and_write(path: &Path, writes: u64) -> Vec<Vec<u8>> {
    block_on(async {
        let mut superblock = Superblock::create(path, initial()).await.unwrap();
        let mut images = vec![std::fs::read(path).unwrap()];
        for step in 1..=writes {
            superblock.write(advanced(step)).await.unwrap();
            images.push(std::fs::read(path).unwrap());
        }
        superblock.close().await.unwrap();
        images
    })
}

fn open(path: &Path) -> Result<(SuperblockState, OpenReport), SuperblockError> {
    block_on(async {
        let (superblock, report) = Superblock::open(path).await?;
        let state = *superblock.state();
        superblock.close().await.unwrap();
        Ok((state, report))
    })
}

fn copy_range(copy_index: usize) -> std::ops::Range<usize> {
    copy_index * SUPERBLOCK_COPY_SIZE..(copy_index + 1) * SUPERBLOCK_COPY_SIZE
}

#[test]
fn create_then_open_round_trips_at_sequence_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let created = block_on(async {
        let superblock = Superblock::create(&path, with_sequence(advanced(3), 42))
            .await
            .unwrap();
        *superblock.state()
    });
    assert_eq!(created, with_sequence(advanced(3), 1));
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        SUPERBLOCK_FILE_SIZE as u64
    );
    assert!(
        !dir.path().join("superblock.tmp").exists(),
        "the temporary file was unlinked"
    );
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(3), 1));
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.copies, [CopyStatus::Current; SUPERBLOCK_COPY_COUNT]);
}

#[test]
fn create_refuses_an_existing_file_and_leaves_it_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let before = create_and_write(&path, 2).pop().unwrap();
    let error = block_on(Superblock::create(&path, initial())).unwrap_err();
    assert!(
        matches!(&error, SuperblockError::AlreadyExists { path: named } if *named == path),
        "{error}"
    );
    assert_eq!(
        error.to_string(),
        format!("{}: superblock file already exists", path.display())
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert!(!dir.path().join("superblock.tmp").exists());
}

#[test]
fn create_truncates_a_leftover_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    // A crash during an earlier create, before the link, leaves only the temporary file.
    std::fs::write(dir.path().join("superblock.tmp"), vec![0xa5; 40_000]).unwrap();
    assert!(matches!(open(&path), Err(SuperblockError::NotFound { .. })));
    block_on(Superblock::create(&path, initial())).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        SUPERBLOCK_FILE_SIZE as u64
    );
    assert_eq!(open(&path).unwrap().0, with_sequence(initial(), 1));
}

#[test]
fn open_of_a_missing_file_is_not_found_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let error = open(&path).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("{}: superblock file does not exist", path.display())
    );
}

#[test]
fn write_advances_the_sequence_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    block_on(async {
        let mut superblock = Superblock::create(&path, initial()).await.unwrap();
        // The sequence passed in is ignored.
        superblock
            .write(with_sequence(advanced(1), 999))
            .await
            .unwrap();
        assert_eq!(*superblock.state(), with_sequence(advanced(1), 2));
        superblock.write(advanced(2)).await.unwrap();
        assert_eq!(*superblock.state(), with_sequence(advanced(2), 3));
        superblock.close().await.unwrap();
    });
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(2), 3));
    assert!(report.is_clean(), "{report}");
    // A reopened superblock continues the sequence.
    block_on(async {
        let (mut superblock, _) = Superblock::open(&path).await.unwrap();
        superblock.write(advanced(3)).await.unwrap();
        assert_eq!(superblock.state().sequence, 4);
    });
    assert_eq!(open(&path).unwrap().0, with_sequence(advanced(3), 4));
}

#[test]
fn an_equal_state_may_be_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    block_on(async {
        let mut superblock = Superblock::create(&path, advanced(1)).await.unwrap();
        superblock.write(advanced(1)).await.unwrap();
        assert_eq!(*superblock.state(), with_sequence(advanced(1), 2));
    });
}

/// Whether a defect is the kind a test expects.
type DefectCheck = fn(&CopyDefect) -> bool;

#[test]
fn a_flipped_byte_in_any_one_copy_is_survived_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let image = create_and_write(&path, 3).pop().unwrap();
    let expected = with_sequence(advanced(3), 4);
    // A byte in the checksummed fields, in the checksum, in the magic, and in the padding.
    let cases: [(usize, DefectCheck); 4] = [
        (40, |defect| matches!(defect, CopyDefect::Checksum { .. })),
        (120, |defect| matches!(defect, CopyDefect::Checksum { .. })),
        (3, |defect| matches!(defect, CopyDefect::Magic { .. })),
        (2000, |defect| *defect == CopyDefect::Padding),
    ];
    for copy_index in 0..SUPERBLOCK_COPY_COUNT {
        for (offset_in_copy, is_expected_defect) in cases {
            let mut damaged = image.clone();
            damaged[copy_index * SUPERBLOCK_COPY_SIZE + offset_in_copy] ^= 0x40;
            std::fs::write(&path, &damaged).unwrap();
            let (state, report) = open(&path).unwrap();
            assert_eq!(state, expected, "copy {copy_index} byte {offset_in_copy}");
            let invalid: Vec<(usize, CopyDefect)> = report.invalid_copies().collect();
            assert_eq!(invalid.len(), 1, "{report}");
            assert_eq!(invalid[0].0, copy_index, "{report}");
            assert!(is_expected_defect(&invalid[0].1), "{report}");
            for (other, status) in report.copies.iter().enumerate() {
                if other != copy_index {
                    assert_eq!(*status, CopyStatus::Current, "{report}");
                }
            }
            assert!(
                report
                    .to_string()
                    .contains(&format!("copy {copy_index}: invalid")),
                "{report}"
            );
        }
    }
}

#[test]
fn a_zeroed_copy_is_survived_and_rewritten_by_the_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let mut image = create_and_write(&path, 1).pop().unwrap();
    image[copy_range(2)].fill(0);
    std::fs::write(&path, &image).unwrap();
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(1), 2));
    assert_eq!(report.copies[2], CopyStatus::Invalid(CopyDefect::Zeroed));
    assert_eq!(
        report.to_string(),
        "copy 0: current; copy 1: current; copy 2: invalid (zeroed); copy 3: current"
    );
    block_on(async {
        let (mut superblock, _) = Superblock::open(&path).await.unwrap();
        superblock.write(advanced(2)).await.unwrap();
    });
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(2), 3));
    assert!(report.is_clean(), "{report}");
}

#[test]
fn damage_to_every_copy_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let mut image = create_and_write(&path, 2).pop().unwrap();
    image[50] ^= 0x01; // copy 0: a field
    image[SUPERBLOCK_COPY_SIZE] ^= 0x01; // copy 1: the magic
    image[copy_range(2)].fill(0); // copy 2: zeroed
    image[3 * SUPERBLOCK_COPY_SIZE + 3000] = 7; // copy 3: the padding
    std::fs::write(&path, &image).unwrap();
    let error = open(&path).unwrap_err();
    match &error {
        SuperblockError::AllCopiesInvalid {
            path: named,
            reasons,
        } => {
            assert_eq!(named, &path);
            assert!(matches!(reasons[0], CopyDefect::Checksum { .. }));
            assert!(matches!(reasons[1], CopyDefect::Magic { .. }));
            assert_eq!(reasons[2], CopyDefect::Zeroed);
            assert_eq!(reasons[3], CopyDefect::Padding);
        }
        other => panic!("expected AllCopiesInvalid, got {other}"),
    }
    let message = error.to_string();
    assert!(
        message.starts_with(&format!(
            "{}: all 4 superblock copies are invalid: copy 0: checksum mismatch",
            path.display()
        )),
        "{message}"
    );
    assert!(
        message.ends_with("copy 2: zeroed; copy 3: padding after the header is not zero"),
        "{message}"
    );
}

#[test]
fn a_crash_after_the_first_copy_of_a_write_opens_the_new_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let images = create_and_write(&path, 2);
    // The write of sequence 3 reached copy 0 only.
    let mut image = images[1].clone();
    image[copy_range(0)].copy_from_slice(&images[2][copy_range(0)]);
    std::fs::write(&path, &image).unwrap();
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(2), 3));
    assert_eq!(
        report.copies,
        [
            CopyStatus::Current,
            CopyStatus::Stale { sequence: 2 },
            CopyStatus::Stale { sequence: 2 },
            CopyStatus::Stale { sequence: 2 },
        ]
    );
    // Copy 1 was torn half way as well: still the new sequence from copy 0.
    image[SUPERBLOCK_COPY_SIZE..SUPERBLOCK_COPY_SIZE + 60]
        .copy_from_slice(&images[2][SUPERBLOCK_COPY_SIZE..SUPERBLOCK_COPY_SIZE + 60]);
    std::fs::write(&path, &image).unwrap();
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(2), 3));
    assert!(matches!(
        report.copies[1],
        CopyStatus::Invalid(CopyDefect::Checksum { .. })
    ));
    // The next write starts from the recovered state and rewrites every copy.
    block_on(async {
        let (mut superblock, _) = Superblock::open(&path).await.unwrap();
        superblock.write(advanced(4)).await.unwrap();
    });
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(4), 4));
    assert!(report.is_clean(), "{report}");
}

#[test]
fn a_torn_first_copy_opens_the_old_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let images = create_and_write(&path, 2);
    let mut image = images[1].clone();
    // The write of sequence 3 tore copy 0: its first 32 bytes are new, the rest old.
    image[..32].copy_from_slice(&images[2][..32]);
    std::fs::write(&path, &image).unwrap();
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(1), 2));
    assert!(matches!(
        report.copies[0],
        CopyStatus::Invalid(CopyDefect::Checksum { .. })
    ));
}

#[test]
fn a_truncated_file_opens_from_the_copies_that_remain() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let image = create_and_write(&path, 1).pop().unwrap();
    std::fs::write(&path, &image[..6000]).unwrap();
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(1), 2));
    let missing = CopyStatus::Invalid(CopyDefect::Missing {
        file_size_bytes: 6000,
    });
    assert_eq!(
        report.copies,
        [CopyStatus::Current, missing, missing, missing]
    );
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(
        open(&path),
        Err(SuperblockError::AllCopiesInvalid { reasons, .. })
            if *reasons == [CopyDefect::Missing { file_size_bytes: 0 }; SUPERBLOCK_COPY_COUNT]
    ));
}

#[test]
fn a_copy_moved_to_another_slot_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let images = create_and_write(&path, 1);
    // A misdirected write put the new copy 0 into slot 3.
    let mut image = images[0].clone();
    image[copy_range(3)].copy_from_slice(&images[1][copy_range(0)]);
    std::fs::write(&path, &image).unwrap();
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(initial(), 1));
    assert_eq!(
        report.copies[3],
        CopyStatus::Invalid(CopyDefect::CopyIndex { found: 0 })
    );
}

#[test]
fn copies_of_the_same_sequence_that_differ_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let first = create_and_write(&path, 1).pop().unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let other_path = superblock_path(&other_dir);
    // Another history that also reached sequence 2, with a different state.
    let second = block_on(async {
        let mut superblock = Superblock::create(&other_path, initial()).await.unwrap();
        superblock.write(advanced(5)).await.unwrap();
        std::fs::read(&other_path).unwrap()
    });
    let mut image = first;
    image[copy_range(2)].copy_from_slice(&second[copy_range(2)]);
    std::fs::write(&path, &image).unwrap();
    let error = open(&path).unwrap_err();
    assert!(
        matches!(&error, SuperblockError::Corrupt { path: named, reason }
            if *named == path && reason.starts_with("copies 0 and 2 both have sequence 2 but differ")),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .starts_with(&format!("{}: corrupt superblock:", path.display()))
    );
}

#[test]
fn a_stale_copy_ahead_of_the_newest_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    // Sequence 3 holds advanced(2) (view 4).
    let mut image = create_and_write(&path, 2).pop().unwrap();
    // A sequence-2 copy from another history whose view (18) is ahead of sequence 3's.
    let ahead = block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let path = superblock_path(&dir);
        let mut superblock = Superblock::create(&path, initial()).await.unwrap();
        superblock.write(advanced(9)).await.unwrap();
        std::fs::read(&path).unwrap()
    });
    image[copy_range(1)].copy_from_slice(&ahead[copy_range(1)]);
    std::fs::write(&path, &image).unwrap();
    let error = open(&path).unwrap_err();
    assert!(
        matches!(&error, SuperblockError::Corrupt { reason, .. }
            if reason == "copy 0 (sequence 3) contradicts older copy 1 (sequence 2): view decreased"),
        "{error}"
    );
}

#[test]
fn a_copy_from_another_cluster_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let mut image = create_and_write(&path, 1).pop().unwrap();
    let foreign = block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let path = superblock_path(&dir);
        Superblock::create(
            &path,
            SuperblockState {
                cluster: 7,
                ..initial()
            },
        )
        .await
        .unwrap();
        std::fs::read(&path).unwrap()
    });
    image[copy_range(3)].copy_from_slice(&foreign[copy_range(3)]);
    std::fs::write(&path, &image).unwrap();
    assert!(matches!(
        open(&path),
        Err(SuperblockError::Corrupt { reason, .. }) if reason.ends_with("cluster changed")
    ));
}

fn write_after(change: impl FnOnce(&mut SuperblockState)) {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    block_on(async {
        let mut superblock = Superblock::create(&path, advanced(4)).await.unwrap();
        let mut next = *superblock.state();
        change(&mut next);
        let _ = superblock.write(next).await;
    });
}

#[test]
#[should_panic(expected = "view decreased")]
fn a_decreasing_view_panics() {
    write_after(|state| state.view -= 1);
}

#[test]
#[should_panic(expected = "log_view decreased")]
fn a_decreasing_log_view_panics() {
    write_after(|state| state.log_view -= 1);
}

#[test]
#[should_panic(expected = "commit_max decreased")]
fn a_decreasing_commit_max_panics() {
    write_after(|state| state.commit_max -= 1);
}

#[test]
#[should_panic(expected = "checkpoint_op decreased")]
fn a_decreasing_checkpoint_op_panics() {
    write_after(|state| state.checkpoint_op -= 1);
}

#[test]
#[should_panic(expected = "replica_id changed")]
fn a_changed_replica_id_panics() {
    write_after(|state| state.replica_id = 0);
}

#[test]
#[should_panic(expected = "log_view is above view")]
fn a_log_view_above_view_panics() {
    write_after(|state| state.log_view = state.view + 1);
}

#[test]
#[should_panic(expected = "replica_id is not below replica_count")]
fn create_with_an_impossible_replica_id_panics() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let _ = block_on(Superblock::create(
        &path,
        SuperblockState {
            replica_id: 3,
            ..initial()
        },
    ));
}

#[test]
fn a_cancelled_write_poisons_the_handle_until_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    block_on(async {
        let mut superblock = Superblock::create(&path, initial()).await.unwrap();
        // One poll submits the first copy's write; dropping the future cancels the rest.
        let polled = futures_util::FutureExt::now_or_never(superblock.write(advanced(1)));
        assert!(polled.is_none(), "a write needs more than one poll");
        let error = superblock.write(advanced(2)).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "{}: an earlier superblock write did not complete; reopen the superblock",
                path.display()
            )
        );
        assert_eq!(*superblock.state(), with_sequence(initial(), 1));
        drop(superblock);
        // The file holds the old or the new state; a reopened handle writes again.
        let (mut superblock, _) = Superblock::open(&path).await.unwrap();
        let reopened = *superblock.state();
        assert!(
            reopened == with_sequence(initial(), 1) || reopened == with_sequence(advanced(1), 2),
            "{reopened:?}"
        );
        superblock.write(advanced(2)).await.unwrap();
        assert_eq!(superblock.state().sequence, reopened.sequence + 1);
    });
    let (state, report) = open(&path).unwrap();
    assert_eq!(state.view, advanced(2).view);
    assert!(report.is_clean(), "{report}");
}

#[derive(Debug, Clone)]
struct Flip {
    copy_index: usize,
    offset_in_copy: usize,
    mask: u8,
}

fn flip() -> impl Strategy<Value = Flip> {
    (0..SUPERBLOCK_COPY_COUNT, 0..SUPERBLOCK_COPY_SIZE, 1u8..=255).prop_map(
        |(copy_index, offset_in_copy, mask)| Flip {
            copy_index,
            offset_in_copy,
            mask,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// After `writes` writes and a crash that left `copies_reached` copies of one further write on
    /// disk, random byte flips never make open panic or invent a state: it returns exactly the
    /// newest state among the undamaged copies, or `AllCopiesInvalid` when every copy is damaged.
    #[test]
    fn random_flips_open_the_newest_undamaged_state_or_refuse(
        writes in 0u64..4,
        copies_reached in 0..=SUPERBLOCK_COPY_COUNT,
        flips in proptest::collection::vec(flip(), 0..8),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = superblock_path(&dir);
        let images = create_and_write(&path, writes + 1);
        let old = &images[writes as usize];
        let new = &images[writes as usize + 1];
        let mut image = old.clone();
        let mut copy_states = [with_sequence(advanced(writes), writes + 1); SUPERBLOCK_COPY_COUNT];
        for copy_index in 0..copies_reached {
            image[copy_range(copy_index)].copy_from_slice(&new[copy_range(copy_index)]);
            copy_states[copy_index] = with_sequence(advanced(writes + 1), writes + 2);
        }
        let mut damaged = [false; SUPERBLOCK_COPY_COUNT];
        for flip in &flips {
            image[flip.copy_index * SUPERBLOCK_COPY_SIZE + flip.offset_in_copy] ^= flip.mask;
        }
        // Two flips at the same byte may cancel out: a copy is damaged if its bytes differ.
        let intact = {
            let mut intact = old.clone();
            for copy_index in 0..copies_reached {
                intact[copy_range(copy_index)].copy_from_slice(&new[copy_range(copy_index)]);
            }
            intact
        };
        for (copy_index, is_damaged) in damaged.iter_mut().enumerate() {
            *is_damaged = image[copy_range(copy_index)] != intact[copy_range(copy_index)];
        }
        std::fs::write(&path, &image).unwrap();

        let expected = (0..SUPERBLOCK_COPY_COUNT)
            .filter(|&copy_index| !damaged[copy_index])
            .map(|copy_index| copy_states[copy_index])
            .max_by_key(|state| state.sequence);
        match (open(&path), expected) {
            (Ok((state, report)), Some(expected)) => {
                prop_assert_eq!(state, expected);
                for (copy_index, status) in report.copies.iter().enumerate() {
                    prop_assert_eq!(
                        matches!(status, CopyStatus::Invalid(_)),
                        damaged[copy_index],
                        "copy {}: {}", copy_index, report
                    );
                }
            }
            (Err(SuperblockError::AllCopiesInvalid { path: named, .. }), None) => {
                prop_assert_eq!(named, path);
            }
            (result, expected) => {
                return Err(TestCaseError::fail(format!(
                    "open gave {result:?}, expected {expected:?}"
                )));
            }
        }
    }

    /// The copy decoder never panics on arbitrary bytes, and accepts none of them.
    #[test]
    fn decode_copy_rejects_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..SUPERBLOCK_COPY_SIZE + 16),
        copy_index in 0..SUPERBLOCK_COPY_COUNT,
    ) {
        prop_assert!(storage::superblock::decode_copy(&bytes, copy_index).is_err());
    }
}

// ------------------------------------------------ issue 12 downgrade guard (superblock version)

/// Rewrites copy `copy_index` of the file image as version `version`, resealing its checksum:
/// what a binary of that version would have written (versions 1, 2 and 3 share the layout).
fn set_copy_version(image: &mut [u8], copy_index: usize, version: u16) {
    let copy = &mut image[copy_range(copy_index)];
    copy[8..10].copy_from_slice(&version.to_le_bytes());
    let checksum = twox_hash::XxHash3_128::oneshot(&copy[..112]);
    copy[112..128].copy_from_slice(&checksum.to_le_bytes());
}

/// The version field of each copy of the file at `path`.
fn copy_versions(path: &Path) -> [u16; SUPERBLOCK_COPY_COUNT] {
    let image = std::fs::read(path).unwrap();
    std::array::from_fn(|copy_index| {
        let copy = &image[copy_range(copy_index)];
        u16::from_le_bytes([copy[8], copy[9]])
    })
}

/// A superblock as a binary of superblock version `version` left it: `writes` writes after
/// create, every copy at `version` (1: before issue 12; 2: before the timestamp checksum rule).
fn older_version_file(path: &Path, writes: u64, version: u16) {
    create_and_write(path, writes);
    let mut image = std::fs::read(path).unwrap();
    for copy_index in 0..SUPERBLOCK_COPY_COUNT {
        set_copy_version(&mut image, copy_index, version);
    }
    std::fs::write(path, &image).unwrap();
}

#[test]
fn issue12_downgrade_create_and_write_put_version_3_in_every_copy() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    assert_eq!(storage::superblock::SUPERBLOCK_VERSION, 3);
    create_and_write(&path, 0);
    assert_eq!(copy_versions(&path), [3; SUPERBLOCK_COPY_COUNT]);
    let (_, report) = open(&path).unwrap();
    assert_eq!(report.versions, [Some(3); SUPERBLOCK_COPY_COUNT]);
    assert_eq!(report.oldest_version(), 3);
}

/// A file of every copy at `version` (below the current one) opens, and one upgrade rewrites
/// every copy at version 3, copy by copy, keeping the state; a second upgrade writes nothing.
fn an_older_file_opens_and_upgrade_rewrites_every_copy_at_version_3(version: u16) {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    older_version_file(&path, 2, version);
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(2), 3));
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.versions, [Some(version); SUPERBLOCK_COPY_COUNT]);
    assert_eq!(report.oldest_version(), version);

    let mut seen = Vec::new();
    block_on(async {
        let (mut superblock, _) = Superblock::open(&path).await.unwrap();
        assert_eq!(superblock.oldest_version(), version);
        let from = superblock
            .upgrade(&mut |copy_index| seen.push((copy_index, copy_versions(&path))))
            .await
            .unwrap();
        assert_eq!(from, Some(version));
        assert_eq!(superblock.oldest_version(), 3);
        // The state is kept; only the sequence moves (the existing write path).
        assert_eq!(*superblock.state(), with_sequence(advanced(2), 4));
        superblock.close().await.unwrap();
    });
    // Copy by copy, each fsynced before the next (the torn-write rules of `write`), straight to
    // version 3 whatever the version found.
    let v = version;
    assert_eq!(
        seen,
        vec![
            (0, [3, v, v, v]),
            (1, [3, 3, v, v]),
            (2, [3, 3, 3, v]),
            (3, [3, 3, 3, 3]),
        ]
    );
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(2), 4));
    assert_eq!(report.versions, [Some(3); SUPERBLOCK_COPY_COUNT]);
    // A second upgrade writes nothing.
    let before = std::fs::read(&path).unwrap();
    block_on(async {
        let (mut superblock, _) = Superblock::open(&path).await.unwrap();
        assert_eq!(superblock.upgrade(&mut |_| {}).await.unwrap(), None);
        assert_eq!(superblock.state().sequence, 4);
    });
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn issue12_downgrade_a_version_1_file_opens_and_upgrade_rewrites_every_copy_at_version_3() {
    an_older_file_opens_and_upgrade_rewrites_every_copy_at_version_3(1);
}

#[test]
fn issue12_timestamp_rule_a_version_2_file_opens_and_upgrade_rewrites_every_copy_at_version_3() {
    an_older_file_opens_and_upgrade_rewrites_every_copy_at_version_3(2);
}

/// An upgrade from `version` torn after copy 1 still needs the upgrade, and the next one
/// completes it.
fn a_torn_upgrade_still_needs_the_upgrade_and_completes_it(version: u16) {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    older_version_file(&path, 1, version);
    // The upgrade reached copies 0 and 1 only (a crash before copy 2).
    let mut torn = Vec::new();
    block_on(async {
        let (mut superblock, _) = Superblock::open(&path).await.unwrap();
        superblock
            .upgrade(&mut |copy_index| {
                if copy_index == 1 {
                    torn = std::fs::read(&path).unwrap();
                }
            })
            .await
            .unwrap();
    });
    std::fs::write(&path, &torn).unwrap();
    assert_eq!(copy_versions(&path), [3, 3, version, version]);
    // This binary boots from the new sequence, but copies 2 and 3 are still at the old version
    // (a binary of that version would boot from them), so the upgrade is still due.
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(1), 3));
    assert_eq!(
        report.versions,
        [Some(3), Some(3), Some(version), Some(version)]
    );
    assert_eq!(report.oldest_version(), version);
    block_on(async {
        let (mut superblock, _) = Superblock::open(&path).await.unwrap();
        assert_eq!(
            superblock.upgrade(&mut |_| {}).await.unwrap(),
            Some(version)
        );
        assert_eq!(*superblock.state(), with_sequence(advanced(1), 4));
    });
    assert_eq!(copy_versions(&path), [3; SUPERBLOCK_COPY_COUNT]);
}

#[test]
fn issue12_downgrade_a_torn_upgrade_still_needs_the_upgrade_and_completes_it() {
    a_torn_upgrade_still_needs_the_upgrade_and_completes_it(1);
}

#[test]
fn issue12_timestamp_rule_a_torn_upgrade_from_version_2_still_needs_it_and_completes_it() {
    a_torn_upgrade_still_needs_the_upgrade_and_completes_it(2);
}

/// A version-2 binary's own torn 1 -> 2 upgrade (copies 0 and 1 at version 2 with the new
/// sequence, copies 2 and 3 still version 1 with the old one) is upgraded by this binary in one
/// write, from the lowest version found, to version 3 in every copy.
#[test]
fn issue12_timestamp_rule_copies_of_versions_1_and_2_upgrade_in_one_write_to_3() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    let images = create_and_write(&path, 1);
    // Sequence 2 in copies 0 and 1 (version 2), sequence 1 in copies 2 and 3 (version 1).
    let mut image = images[1].clone();
    image[copy_range(2)].copy_from_slice(&images[0][copy_range(2)]);
    image[copy_range(3)].copy_from_slice(&images[0][copy_range(3)]);
    for (copy_index, version) in [(0, 2), (1, 2), (2, 1), (3, 1)] {
        set_copy_version(&mut image, copy_index, version);
    }
    std::fs::write(&path, &image).unwrap();
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(1), 2));
    assert_eq!(report.versions, [Some(2), Some(2), Some(1), Some(1)]);
    assert_eq!(report.oldest_version(), 1);
    block_on(async {
        let (mut superblock, _) = Superblock::open(&path).await.unwrap();
        assert_eq!(superblock.upgrade(&mut |_| {}).await.unwrap(), Some(1));
        assert_eq!(*superblock.state(), with_sequence(advanced(1), 3));
    });
    assert_eq!(copy_versions(&path), [3; SUPERBLOCK_COPY_COUNT]);
    let (_, report) = open(&path).unwrap();
    assert!(report.is_clean(), "{report}");
}

#[test]
fn issue12_downgrade_a_version_4_superblock_is_refused_naming_the_path_and_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    create_and_write(&path, 1);
    let mut image = std::fs::read(&path).unwrap();
    for copy_index in 0..SUPERBLOCK_COPY_COUNT {
        set_copy_version(&mut image, copy_index, 4);
    }
    std::fs::write(&path, &image).unwrap();
    let error = open(&path).unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(
            &error,
            SuperblockError::UnsupportedVersion { path: named, copy_index: 0, found: 4 }
                if *named == path
        ),
        "{error:?}"
    );
    assert_eq!(
        message,
        format!(
            "{}: superblock copy 0 has version 4, but this binary reads only versions 1 to 3: \
             the data directory was written by a newer shardline, and this one could misread its \
             data as damage. Nothing was changed; start it with a shardline that supports \
             superblock version 4 (a newer release)",
            path.display()
        )
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        image,
        "open changed the file"
    );
}

#[test]
fn issue12_downgrade_one_intact_newer_copy_refuses_the_file_but_a_damaged_version_is_survived() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock_path(&dir);
    create_and_write(&path, 1);
    let good = std::fs::read(&path).unwrap();
    // Version 0 (never written by any binary) and a newer version in one copy, the others
    // readable: refused all the same, and left as it was (never rewritten in an older version).
    for (copy_index, version) in [(2, 0u16), (3, 4), (1, u16::MAX)] {
        let mut image = good.clone();
        set_copy_version(&mut image, copy_index, version);
        std::fs::write(&path, &image).unwrap();
        match open(&path) {
            Err(SuperblockError::UnsupportedVersion {
                copy_index: named_copy,
                found,
                ..
            }) => assert_eq!((named_copy, found), (copy_index, version)),
            other => panic!("copy {copy_index} at version {version}: {other:?}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), image);
    }
    // A version field changed without its checksum is damage to one copy: survived.
    let mut image = good.clone();
    image[SUPERBLOCK_COPY_SIZE + 8] = 4;
    std::fs::write(&path, &image).unwrap();
    let (state, report) = open(&path).unwrap();
    assert_eq!(state, with_sequence(advanced(1), 2));
    assert!(matches!(
        report.copies[1],
        CopyStatus::Invalid(CopyDefect::Checksum { .. })
    ));
    assert_eq!(report.versions, [Some(3), None, Some(3), Some(3)]);
}
