//! Loads a corpus of CLIF functions (a directory of `.clif` files, such as
//! the wasm modules of `../shared/corpora` unpacked) into a
//! `DedupModule<ObjectModule>`, as a JIT would define them, once with each
//! of a few options, and prints what jitfold did: how to measure what a
//! mode gives on real code.
//!
//! Every function is declared first (as `f0`, `f1`, ...), then defined with
//! its references to other functions of the corpus turned into references
//! to their ids; what the corpus does not define is imported.
//!
//! ```sh
//! cargo run --release --features tools --example load_corpus -- DIR
//! ```

use cranelift_codegen::ir::{
    ExternalName, Function, GlobalValueData, UserExternalName, UserFuncName,
};
use cranelift_module::{DataId, FuncId, Linkage, Module, ModuleResult, default_libcall_names};
use cranelift_object::{ObjectBuilder, ObjectModule};
use hashbrown::HashMap;
use jitfold::{DedupModule, DedupOptions, similar::SimilarOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// The ids of a module, by the names the corpus uses.
#[derive(Default)]
struct Names {
    functions: HashMap<UserFuncName, FuncId>,
    imported: HashMap<String, FuncId>,
    data: HashMap<String, DataId>,
}

impl Names {
    /// The module name `name` (a user name of the corpus, in `func`)
    /// stands for: a function of the corpus, or an import declared now
    /// (with `import_sig` for a function).
    fn resolve<M: Module>(
        &mut self,
        m: &mut M,
        name: &UserExternalName,
        import_sig: Option<&cranelift_codegen::ir::Signature>,
    ) -> ModuleResult<UserExternalName> {
        if let Some(&id) = self.functions.get(&UserFuncName::User(name.clone())) {
            return Ok(UserExternalName::new(0, id.as_u32()));
        }
        let label = format!("import_{}_{}", name.namespace, name.index);
        Ok(match import_sig {
            Some(sig) => {
                let label = format!("{label}_{}", sig.call_conv);
                let id = match self.imported.get(&label) {
                    Some(&id) => id,
                    None => {
                        let id = m.declare_function(&label, Linkage::Import, sig)?;
                        self.imported.insert(label, id);
                        id
                    }
                };
                UserExternalName::new(0, id.as_u32())
            }
            None => {
                let id = match self.data.get(&label) {
                    Some(&id) => id,
                    None => {
                        let id = m.declare_data(&label, Linkage::Import, false, false)?;
                        self.data.insert(label, id);
                        id
                    }
                };
                UserExternalName::new(1, id.as_u32())
            }
        })
    }

    /// `func` with every user name it refers to resolved.
    fn rename<M: Module>(&mut self, m: &mut M, mut func: Function) -> ModuleResult<Function> {
        let refs: Vec<_> = func.dfg.ext_funcs.keys().collect();
        for r in refs {
            let ExternalName::User(u) = func.dfg.ext_funcs[r].name else {
                continue;
            };
            let name = func.params.user_named_funcs()[u].clone();
            let sig = func.dfg.signatures[func.dfg.ext_funcs[r].signature].clone();
            let to = self.resolve(m, &name, Some(&sig))?;
            let to = func.declare_imported_user_function(to);
            func.dfg.ext_funcs[r].name = ExternalName::User(to);
        }
        let gvs: Vec<_> = func.global_values.keys().collect();
        for gv in gvs {
            let GlobalValueData::Symbol {
                name: ExternalName::User(u),
                ..
            } = func.global_values[gv]
            else {
                continue;
            };
            let name = func.params.user_named_funcs()[u].clone();
            let to = self.resolve(m, &name, None)?;
            let to = func.declare_imported_user_function(to);
            if let GlobalValueData::Symbol { name, .. } = &mut func.global_values[gv] {
                *name = ExternalName::User(to);
            }
        }
        Ok(func)
    }
}

/// Defines `funcs` in a new module with `options`, flushes, prints the
/// statistics and returns them.
fn load(funcs: &[Function], options: DedupOptions) -> ModuleResult<jitfold::Stats> {
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags())
        .map_err(|e| cranelift_module::ModuleError::Backend(e.into()))?;
    let builder = ObjectBuilder::new(isa, "corpus", default_libcall_names())?;
    let mut m = DedupModule::wrap(ObjectModule::new(builder), options);
    let mut names = Names::default();
    for (i, f) in funcs.iter().enumerate() {
        let id = m.declare_function(&format!("f{i}"), Linkage::Local, &f.signature)?;
        names.functions.insert(f.name.clone(), id);
    }
    let start = Instant::now();
    let mut failed = 0;
    for f in funcs {
        let id = names.functions[&f.name];
        let mut func = names.rename(&mut m, f.clone())?;
        func.name = UserFuncName::user(0, id.as_u32());
        let mut ctx = m.make_context();
        ctx.func = func;
        if m.define_function(id, &mut ctx).is_err() {
            failed += 1;
        }
    }
    if m.flush().is_err() {
        failed += m.take_failed_definitions().len();
    }
    println!(
        "== {options}: {} functions in {:.3} s, {failed} failed\n{}\n",
        funcs.len(),
        start.elapsed().as_secs_f64(),
        m.stats()
    );
    Ok(m.stats().clone())
}

fn main() -> ExitCode {
    let Some(dir) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: load_corpus DIR");
        return ExitCode::from(2);
    };
    let isa = match jitfold::isa::host_isa(jitfold::isa::jit_flags()) {
        Ok(isa) => isa,
        Err(e) => {
            eprintln!("load_corpus: {e}");
            return ExitCode::from(2);
        }
    };
    let funcs = match jitfold::corpus::valid_functions(&[dir], Some(&*isa)) {
        Ok(funcs) => funcs,
        Err(e) => {
            eprintln!("load_corpus: {e}");
            return ExitCode::from(2);
        }
    };
    let similar = SimilarOptions::default();
    let mut summary = Vec::new();
    for mode in [DedupOptions::eager(), DedupOptions::batch()] {
        let mut code_bytes = [0; 2];
        for (i, options) in [mode, mode.with_similar(similar)].into_iter().enumerate() {
            match load(&funcs, options) {
                Ok(stats) => {
                    code_bytes[i] = stats.code_bytes;
                    if i == 1 {
                        summary.push(format!(
                            "{mode}: thunks {} ({} bodies); code {} bytes with similar merging, {} without ({:+.2}%)",
                            stats.similar_merged,
                            stats.similar_groups,
                            code_bytes[1],
                            code_bytes[0],
                            (code_bytes[1] as f64 / code_bytes[0].max(1) as f64 - 1.0) * 100.0
                        ));
                    }
                }
                Err(e) => {
                    eprintln!("load_corpus: {options}: {e}");
                    return ExitCode::from(1);
                }
            }
        }
    }
    for line in summary {
        println!("{line}");
    }
    ExitCode::SUCCESS
}
