#![no_main]
// Merged and unmerged code must return the same bits (jitfold::fuzzing::differential).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some(Err(e)) = jitfold::fuzzing::differential_bytes(data) {
        panic!("{e}");
    }
});
