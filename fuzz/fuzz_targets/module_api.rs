#![no_main]
// Random sequences of `Module` calls give the same outcomes and results
// under the plain module and `DedupModule` (jitfold::fuzzing::api).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some(Err(e)) = jitfold::fuzzing::api::check_bytes(data) {
        panic!("{e}");
    }
});
