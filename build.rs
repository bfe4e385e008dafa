//! Records the compiler's version for the crate (`JITFOLD_RUSTC_VERSION`):
//! the digest a store entry holds of a verified function is of what
//! Rust's `Hash` writes, which only one compiler version is sure to write
//! alike (see 6 in `src/module/verify.rs`).

fn main() {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|text| text.trim().to_string())
        // Unknown: no digest of this build matches another build's.
        .unwrap_or_else(|| format!("unknown rustc, build {:?}", std::time::SystemTime::now()));
    println!("cargo:rustc-env=JITFOLD_RUSTC_VERSION={version}");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC");
}
