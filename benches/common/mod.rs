//! Shared by the benches: reading back what criterion measured in this run,
//! so each bench can print ratios against its baseline.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Mean time in nanoseconds of the benchmark `target/criterion/<id...>`
/// from this run's estimates, if criterion wrote them.
pub fn mean_ns(id: &[&str]) -> Option<f64> {
    let mut path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/criterion");
    for part in id {
        path.push(part);
    }
    let text = std::fs::read_to_string(path.join("new/estimates.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["mean"]["point_estimate"].as_f64()
}

/// Unpacks each `.tar.zst` of `corpora` into `dest/<name>` unless present.
fn unpack(corpora: &Path, dest: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut archives: Vec<_> = std::fs::read_dir(corpora)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".tar.zst"))
        .collect();
    archives.sort();
    for archive in archives {
        let name = archive
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(".tar.zst", "");
        let dir = dest.join(&name);
        if !dir.join(".done").exists() {
            std::fs::create_dir_all(&dir).unwrap();
            let status = Command::new("tar")
                .arg("--zstd")
                .arg("-xf")
                .arg(&archive)
                .arg("-C")
                .arg(&dir)
                .status()
                .expect("tar runs (with zstd installed)");
            assert!(status.success(), "unpacking {}", archive.display());
            std::fs::write(dir.join(".done"), "").unwrap();
        }
        dirs.push(dir);
    }
    dirs
}

/// The shared corpora, unpacked once into `target/jitfold-bench-corpora`
/// (empty when `../shared/corpora` is absent).
pub fn corpus_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    unpack(
        &root.join("../shared/corpora"),
        &root.join("target/jitfold-bench-corpora"),
    )
}
