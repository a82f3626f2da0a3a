//! Every committed corpus file under `fuzz/corpus/<target>/` through its target, on stable: a
//! crash the fuzzer found and that was fixed stays fixed (its input is in the corpus), and every
//! seed still passes the target's assertions.

use std::path::{Path, PathBuf};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

#[test]
fn every_committed_corpus_file_passes_its_target() {
    let mut total = 0;
    for (target, run) in cx_fuzz_targets::TARGETS {
        let dir = corpus_dir(target);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("a directory entry").path())
            .filter(|path| path.is_file())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{target}: an empty corpus");
        for file in &files {
            let bytes = std::fs::read(file).expect("reads");
            let outcome = std::panic::catch_unwind(|| run(&bytes));
            assert!(outcome.is_ok(), "{target}: {} fails", file.display());
        }
        total += files.len();
    }
    eprintln!("{total} corpus files replayed");
}

#[test]
fn every_target_has_a_fuzz_target_file() {
    for (target, _) in cx_fuzz_targets::TARGETS {
        let file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/fuzz_targets")
            .join(format!("{target}.rs"));
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            text.contains(&format!("cx_fuzz_targets::{target}(")),
            "{} does not call cx_fuzz_targets::{target}",
            file.display()
        );
    }
}

#[test]
fn every_seed_passes_its_target() {
    for (target, run) in cx_fuzz_targets::TARGETS {
        for (name, bytes) in cx_fuzz_targets::seeds::seeds(target) {
            let outcome = std::panic::catch_unwind(|| run(&bytes));
            assert!(outcome.is_ok(), "{target}: {name} fails");
        }
    }
}

/// Writes the seeds into `fuzz/corpus/<target>/` (then `cargo fuzz cmin` each; see
/// `scripts/fuzz.sh`). Run by hand: `cargo test -p cx-fuzz-targets --test corpus -- --ignored
/// write_seeds`.
#[test]
#[ignore = "writes fuzz/corpus; run by hand"]
fn write_seeds() {
    for (target, _) in cx_fuzz_targets::TARGETS {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).expect("creates");
        for (name, bytes) in cx_fuzz_targets::seeds::seeds(target) {
            std::fs::write(dir.join(name), bytes).expect("writes");
        }
    }
}
