#![no_main]
// Twins share a fingerprint, mutants do not (jitfold::fuzzing::differential).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some(Err(e)) = jitfold::fuzzing::fingerprint_bytes(data) {
        panic!("{e}");
    }
});
