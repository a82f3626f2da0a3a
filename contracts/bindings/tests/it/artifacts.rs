//! The committed artifacts (contracts/artifacts/*.json, read by `sol!`) must be what the current
//! sources compile to: this recompiles with the pinned toolchain and compares byte for byte.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    // This crate is `contracts/bindings/`: the workspace root is two levels up.
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn committed_contract_artifacts_match_a_fresh_compile() {
    let root = root();
    let setup = Command::new(root.join("scripts/setup-foundry.sh"))
        .status()
        .expect("run setup-foundry.sh");
    assert!(setup.success(), "scripts/setup-foundry.sh failed");
    let scratch = std::env::temp_dir().join(format!("cx-artifacts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let build = Command::new(root.join(".tools/forge"))
        .current_dir(root.join("contracts"))
        .args(["build", "--skip", "test", "--out"])
        .arg(scratch.join("out"))
        .arg("--cache-path")
        .arg(scratch.join("cache"))
        .output()
        .expect("run forge");
    assert!(
        build.status.success(),
        "forge build failed: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    let export = Command::new("node")
        .current_dir(root.join("contracts"))
        .arg("bin/export-artifacts.cjs")
        .arg(scratch.join("out"))
        .arg(scratch.join("artifacts"))
        .status()
        .expect("run node");
    assert!(export.success(), "export-artifacts failed");
    let committed = root.join("contracts/artifacts");
    let mut names: Vec<_> = std::fs::read_dir(scratch.join("artifacts"))
        .expect("fresh artifacts")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert!(
        names.len() >= 4,
        "expected the four deployable contracts, got {names:?}"
    );
    for name in names {
        let fresh = std::fs::read_to_string(scratch.join("artifacts").join(&name)).expect("fresh");
        let old = std::fs::read_to_string(committed.join(&name)).unwrap_or_default();
        assert!(
            fresh == old,
            "contracts/artifacts/{} is stale: run CX_FORGE_UPDATE=1 scripts/forge-test.sh and commit",
            name.to_string_lossy()
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
