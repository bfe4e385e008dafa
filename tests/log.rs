//! Decisions are visible: through the `log` crate, `DedupModule` says for
//! each function what it became (compiled, duplicate of, reused from,
//! adapter for), naming both functions. (One test per process: the logger
//! is global.)

#[path = "suite/common/mod.rs"]
mod common;

use common::build::{define, emit_call, twelve_steps};
use cranelift_codegen::ir::{AbiParam, InstBuilder, Signature, types::I64};
use cranelift_codegen::isa::CallConv;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};
use jitfold::{DedupModule, DedupOptions};
use std::sync::Mutex;

/// Keeps jitfold's records.
struct Recorder(Mutex<Vec<(log::Level, String)>>);

impl log::Log for Recorder {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.target().starts_with("jitfold")
    }
    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            let text = record.args().to_string();
            self.0.lock().unwrap().push((record.level(), text));
        }
    }
    fn flush(&self) {}
}

static RECORDER: Recorder = Recorder(Mutex::new(Vec::new()));

#[test]
fn every_outcome_is_logged() {
    log::set_logger(&RECORDER).unwrap();
    log::set_max_level(log::LevelFilter::Trace);

    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).unwrap();
    let jit = JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()));
    let mut m = DedupModule::wrap(jit, DedupOptions::default());
    let sig = |conv: CallConv| {
        let mut s = Signature::new(conv);
        s.params.push(AbiParam::new(I64));
        s.returns.push(AbiParam::new(I64));
        s
    };
    let conv = m.isa().default_call_conv();
    let declare = |m: &mut DedupModule<JITModule>, name: &str, conv: CallConv| {
        m.declare_function(name, Linkage::Local, &sig(conv))
            .unwrap()
    };
    let [first, twin, leaf_a, leaf_b, call_a, call_b] =
        ["first", "twin", "leaf_a", "leaf_b", "call_a", "call_b"].map(|n| declare(&mut m, n, conv));
    let big_sysv = declare(&mut m, "big_sysv", CallConv::SystemV);
    let big_tail = declare(&mut m, "big_tail", CallConv::Tail);
    for f in [first, twin] {
        define(&mut m, f, |b, _, p| {
            let r = b.ins().imul_imm_s(p[0], 9);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    for (f, k) in [(leaf_a, 1), (leaf_b, 2)] {
        define(&mut m, f, |b, _, p| {
            let r = b.ins().iadd_imm_s(p[0], k);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    for (f, leaf) in [(call_a, leaf_a), (call_b, leaf_b)] {
        define(&mut m, f, |b, m, p| {
            let r = emit_call(b, m, leaf, p[0]);
            let r = b.ins().imul_imm_s(r, 3);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    for f in [big_sysv, big_tail] {
        define(&mut m, f, |b, _, p| {
            let r = twelve_steps(b, p[0]);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    m.finalize_definitions().unwrap();
    let s = m.stats();
    assert_eq!(
        (s.compiled, s.trampolined, s.reused, s.adapted),
        (5, 1, 1, 1)
    );

    let records = RECORDER.0.lock().unwrap().clone();
    let has = |level: log::Level, needle: &str| {
        records
            .iter()
            .any(|(l, text)| *l == level && text.contains(needle))
    };
    let records_before_store = RECORDER.0.lock().unwrap().len();
    rejected_alike_is_said_once();
    let store_warnings: Vec<String> = RECORDER.0.lock().unwrap()[records_before_store..]
        .iter()
        .filter(|(l, text)| *l == log::Level::Warn && text.contains("were all rejected"))
        .map(|(_, text)| text.clone())
        .collect();
    assert_eq!(store_warnings.len(), 1, "{store_warnings:#?}");
    assert!(
        store_warnings[0].contains("MAC"),
        "names the reason: {store_warnings:?}"
    );

    for needle in [
        "first (funcid0): compiled",
        "twin (funcid1): duplicate of first (funcid0)",
        "keeps its own address",
        "call_b (funcid5): reused the code of call_a (funcid4)",
        "big_tail (funcid7): adapter for big_sysv (funcid6)",
    ] {
        assert!(
            has(log::Level::Debug, needle),
            "{needle} not in {records:#?}"
        );
    }
}

/// A store whose entries are all signed with another secret: a module
/// using it rejects every entry, and says so once (at `warn` level), not
/// only function by function at `debug` level.
fn rejected_alike_is_said_once() {
    use jitfold::store::{CodeStore, MemoryStore, Secret};
    use std::sync::Arc;
    let store: Arc<dyn CodeStore> = Arc::new(MemoryStore::new());
    let jit = || {
        let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).unwrap();
        JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()))
    };
    let program = |secret: [u8; 32]| {
        let mut m = DedupModule::wrap(jit(), DedupOptions::default())
            .with_store(store.clone(), Some(Secret::new(secret)));
        for k in 0..6 {
            let mut s = m.make_signature();
            s.params.push(AbiParam::new(I64));
            s.returns.push(AbiParam::new(I64));
            let f = m
                .declare_function(&format!("f{k}"), Linkage::Local, &s)
                .unwrap();
            define(&mut m, f, |b, _, p| {
                let r = b.ins().imul_imm_s(p[0], 100 + k);
                b.ins().return_(&[r]);
            })
            .unwrap();
        }
        m.finalize_definitions().unwrap();
        m.wait_for_store_writes();
        m.stats().clone()
    };
    assert_eq!(program([1; 32]).store_writes, 6);
    let warm = program([2; 32]);
    assert_eq!((warm.loaded, warm.store_rejected), (0, 6), "{warm}");
}
