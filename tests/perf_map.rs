//! Where Cranelift writes a perf map (`PERF_BUILDID_DIR` set), every id's
//! name is listed at the address it resolves to, shared entry points
//! included. (Its own test binary: it sets an environment variable.)

#[path = "suite/common/mod.rs"]
mod common;

use common::build::define;
use cranelift_codegen::ir::{AbiParam, InstBuilder, types::I64};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};
use jitfold::{DedupModule, DedupOptions};

#[test]
fn every_name_is_in_the_perf_map_at_its_address() {
    // SAFETY: the only test of this binary, so no other thread reads the
    // environment while it is changed.
    unsafe { std::env::set_var("PERF_BUILDID_DIR", "/tmp") };
    for distinct_addresses in [true, false] {
        let options = DedupOptions::default().with_distinct_addresses(distinct_addresses);
        let mut d = DedupModule::wrap(
            JITModule::new(JITBuilder::new(default_libcall_names()).unwrap()),
            options,
        );
        let mut sig = d.make_signature();
        sig.params.push(AbiParam::new(I64));
        sig.returns.push(AbiParam::new(I64));
        let names = [0, 1, 2].map(|i| format!("perf_twin_{distinct_addresses}_{i}"));
        let ids = names
            .clone()
            .map(|n| d.declare_function(&n, Linkage::Local, &sig).unwrap());
        for id in ids {
            define(&mut d, id, |b, _, p| {
                let r = b.ins().imul_imm_s(p[0], 11);
                b.ins().return_(&[r]);
            })
            .unwrap();
        }
        d.finalize_definitions().unwrap();
        let map = std::fs::read_to_string(format!("/tmp/perf-{}.map", std::process::id())).unwrap();
        for (name, id) in names.iter().zip(ids) {
            let address = format!("{:x} ", d.get_finalized_function(id) as usize);
            assert!(
                map.lines()
                    .any(|l| l.starts_with(&address) && l.ends_with(&format!(" {name}"))),
                "{name} at {address} not in the perf map:\n{map}"
            );
        }
    }
}
