//! jitfold's integration tests, in one binary so that Cranelift and the
//! test helpers are linked once (`tests/log.rs` and `tests/perf_map.rs`
//! have binaries of their own: one installs the global logger, the other
//! changes the environment). Run them all with `cargo test --all-features`;
//! one file's with `cargo test --all-features --test suite NAME::`.

mod common;

mod adapter;
mod addresses;
#[cfg(feature = "fuzzing")]
mod api_differential;
mod bad_input;
mod calls;
mod check_mode;
#[cfg(feature = "cli")]
mod cli;
#[cfg(all(feature = "fuzzing", feature = "all-targets"))]
mod cross_run;
mod demo;
mod drop_in;
mod errors;
#[cfg(feature = "fuzzing")]
mod fingerprint;
#[cfg(feature = "redis")]
mod fleet;
mod frame_layout;
#[cfg(feature = "fuzzing")]
mod fuzz_seeds;
mod jit;
mod machine_code;
mod object;
mod pack;
mod parallel;
mod persistent;
mod reuse;
#[cfg(feature = "runtests")]
mod runtests;
mod signatures;
#[cfg(target_arch = "x86_64")]
mod similar;
mod store;
mod threads;
mod unwind;
