//! Similar-function merging: functions that differ only in the values of a
//! few integer or float constants, or in which functions they call, share
//! one parameterized body, and each becomes a thunk that passes its own
//! values and function pointers.
//!
//! This module finds the groups, derives their parameters, decides with a
//! cost model in machine-code bytes which groups pay, and builds the
//! merged body and the thunks as CLIF. `jitfold report --merge similar`
//! runs it on a corpus; [`crate::DedupModule`] in batch and eager mode with
//! [`DedupOptions::with_similar`](crate::DedupOptions::with_similar)
//! merges the functions it defines with it.
//!
//! # What this module guarantees
//!
//! 1. **Shapes.** [`Shaper::shape`] gives a function's [`Shape`](crate::fingerprint::Shape): its exact
//!    key ([`crate::Fingerprint`]) with the words of each *parameterizable*
//!    constant's immediate (below) set to zero and each *name site*'s
//!    name (below) replaced by a placeholder in the key's names,
//!    followed by the count and the key positions of the immediates
//!    masked, and the count and the name slots masked. Two functions have
//!    equal shapes exactly when their exact keys are equal but for the
//!    immediates of those constants, which are then at the same
//!    positions, of the same opcodes and types, with the same uses, and
//!    but for the names in those slots, which every member uses in the
//!    same one of the ways listed below (the template, which the shape
//!    keeps, says how each slot is used). A constant no instruction of
//!    the layout uses (directly or through an alias), which Cranelift
//!    emits no code for, has its immediate masked too, without being a
//!    site: members may differ in it, and the merged body keeps the first
//!    member's value, which nothing reads. The exact key and the
//!    template key are not changed (nor
//!    [`KEY_FORMAT_VERSION`](crate::fingerprint::KEY_FORMAT_VERSION)):
//!    the walk only records where each constant's immediate is
//!    ([`Walk::constant_sites`](crate::fingerprint::Walk::constant_sites)). A member that calls itself passes its
//!    own name, so its body's recursive call goes through its own thunk
//!    (outside the `tail` convention, where the thunk tail-calls the body,
//!    that is one more frame per level of recursion, and the body's frame
//!    can be larger than the member's, so a recursion that ends just
//!    short of the stack's end unmerged overflows it merged; functions
//!    with a stack limit still check it in every frame, within the bound
//!    [`StackDepth`] states).
//! 2. **Parameters.** [`derive()`] numbers the sites of a group LLVM-style: a
//!    site whose value is equal in every member stays a constant; sites
//!    with equal value vectors (and types) share one parameter.
//! 3. **Meaning.** [`merged_body`] is the group's first member with each
//!    parameterized constant replaced by a new parameter appended to the
//!    signature (the constant's result becomes an alias of it), and each
//!    `call` of a parameterized callee replaced by a `call_indirect`
//!    through a new parameter, with the call's signature and arguments,
//!    and each `func_addr` or `symbol_value` of a parameterized name made
//!    an alias of a new parameter; it refuses a body that still refers to
//!    such a name. So the body called
//!    with member `m`'s values computes exactly what `m` computes: the
//!    members differ in nothing else (1), every use of a parameterized
//!    value is an operand whose meaning does not depend on whether it is a
//!    constant (below), an indirect call of a function's address is a
//!    call of that function, and an address passed is the one the member
//!    takes. [`thunk`] has the member's own signature and passes its
//!    arguments, its constants and the addresses of its functions
//!    (`func_addr`) and symbols (`symbol_value`) through.
//!
//!    Functions with a stack limit (with [`StackDepth::Bounded`], the
//!    default): the body keeps the first member's limit (the members'
//!    limits are equal: the global values are in the shape) and checks it
//!    against its own frame, and each thunk checks the same limit against
//!    its own, but for a thunk that tail-calls a body whose arguments are
//!    all in registers ([`thunk_skips_stack_check`]), which leaves no
//!    frame and writes nothing below where the member's prologue would
//!    before its check. So every frame that runs checks it, and no stack
//!    overflow goes undetected; what moves is the depth at which one is
//!    detected,
//!    by at most [`CostModel::stack_growth`] per merged call by that
//!    model ([`StackDepth`]; `jitfold report --similar --compile` compares
//!    it with the frames Cranelift lays out).
//! 4. **Cost.** [`CostModel::predict`] counts, in bytes of machine code, the
//!    members' code removed against the thunks and the body's growth;
//!    [`plan_group`] merges only groups that it predicts to pay, whose
//!    parameters fit [`SimilarOptions::max_params`] and, where the members
//!    have a stack limit, whose stack growth [`SimilarOptions::stack`]
//!    allows. [`plan_group`] is the one decision: `DedupModule` in batch
//!    and eager mode and `jitfold report` all call it.
//!
//! # What it costs
//!
//! The walk records one word position per constant (within the noise of
//! `jitfold report`'s `fingerprint_ns_per_inst` on the wasm corpora: the
//! least noisy, resvg, measured 31.2 before and 32.1 ns per instruction
//! after, best of seven). Shaping a walked function (the use scan, the
//! masked copy of the key and its hash) costs about as much again as the
//! walk, 45-65 ns per instruction, and is done only when asked for.
//!
//! # What is parameterizable
//!
//! Audited in Cranelift 0.135.8 (`cranelift-codegen` `src/`). Every CLIF
//! operand is a value, so any operand is *correct* with a parameter in
//! place of a constant: Cranelift's mid-end and lowering fold constants
//! into immediates and strength-reduce them, but only where the result is
//! the same (float folds, for one, only fold results that are not NaN,
//! "what the instruction would have at run-time", `opts/cprop.isle` from
//! line 392). That holds in the default floating-point environment
//! (round to nearest, no flush-to-zero), which CLIF assumes: under
//! another, a member's float arithmetic on two constants, folded at
//! compile time, and the body's, done at run time, can differ. What a
//! parameter changes is the code, not its meaning:
//! `iadd x, iconst` lowers to `add r, imm32` (`isa/x64/lower.isle`, the
//! `simm32_from_value` rules, e.g. `band` at line 341, `bor` at 467, `bxor`
//! at 538), and with a parameter to `add r, r`. So the rule is chosen to
//! keep the body's growth small and the audit short, not for correctness
//! alone. An `iconst`, `f32const` or `f64const` is a parameter site when
//! it is reachable, has at least one use, and **every** use (in any block
//! of the layout, through value aliases) is one of:
//!
//! - an operand of `iadd`, `isub`, `imul`, `band`, `bor`, `bxor`, `smin`,
//!   `smax`, `umin`, `umax`,
//!   `ineg`, `iabs`, `bnot`, `uextend`, `sextend`, `ireduce`, `splat`, or
//!   `icmp` (the condition code is an immediate and stays in the key);
//! - an operand of `fadd`, `fsub`, `fmul`, `fdiv`, `fmin`, `fmax`, `fneg`,
//!   `fabs`, `fcopysign`, `fma`, `fcmp`, `fpromote`, `fdemote`, `bitcast`
//!   (a float constant by its raw bits: NaN payloads and `-0.0` are
//!   passed as they are);
//! - the second or third operand of `select` (a selected value, not the
//!   condition);
//! - the stored value (first operand) of `store`, `istore8`, `istore16`,
//!   `istore32` (not the address);
//! - an argument of `call`, `return_call` or `return`, or a non-callee
//!   argument of `call_indirect` and `return_call_indirect`;
//! - a block argument of `jump` or `brif`.
//!
//! Not parameterizable (any such use keeps the constant in the shape):
//!
//! - addresses of memory accesses and atomics (address-mode folding,
//!   `amode` rules in `isa/x64/lower.isle`), callees of indirect calls;
//! - shift and rotate amounts: lowered with the amount masked to the type
//!   width as an immediate (`shift_amount_masked`, `isa/x64/lower.isle`
//!   line 794) and with an extra `and` otherwise (line 792);
//! - divisors and remainders: a constant divisor is strength-reduced to a
//!   multiply (`opts/arithmetic.isle`) and cannot trap, a register divisor
//!   gets a division and a zero check (`udiv` at `isa/x64/lower.isle` line
//!   4432): same meaning, much more code;
//! - branch conditions (`brif`), `br_table` indices and arguments, trap
//!   conditions, `try_call` arguments and exception-table contexts: they
//!   decide control flow and the mid-end folds them;
//! - everything that is an immediate in CLIF rather than a value: memory
//!   offsets (`Offset32`), lane indices (`Uimm8`), shuffle masks
//!   (`dfg.immediates`), condition and trap codes, stack slot sizes,
//!   types, `br_table` contents, exception tables. These are in the key and
//!   never masked.
//! - `f16const`, `f128const` and vector constants, and any use not listed
//!   above.
//!
//! A user or test-case name is a **name site** when every reference to it
//! in the function (through any function reference or global value, by
//! Cranelift's own list of each instruction format's references,
//! `InstructionData::map`) is of one of these kinds:
//!
//! - the callee of a `call`, all references with one signature and none
//!   `patchable` (a *callee*: the body calls it with `call_indirect`
//!   through the parameter, the thunk passes its `func_addr`);
//! - a `func_addr`, all references with one signature (a *function
//!   address*: the body takes the parameter for it, the thunk passes the
//!   `func_addr` of its own);
//! - a `symbol_value` of a global value that is the name with offset 0,
//!   not thread-local and not the base of another global value (a *symbol
//!   address*: the thunk passes the `symbol_value` of its own).
//!
//! An address passed is the address the member takes itself, so its
//! identity is kept: a body that compares or stores it sees what the
//! member saw. Not name sites: names used in more than one of these ways,
//! names of `patchable` references (the call site's patching metadata,
//! which a `call_indirect` does not have), of `return_call` (a `tail`
//! body could `return_call_indirect`, but not every convention may), of
//! `try_call` (its exception table stays as it is), of `tls_value` and
//! thread-local or offset symbols and symbols that scale a dynamic vector
//! type, and libcalls and known symbols (they
//! are not names of the module). A name parameter is an `i64`
//! ([`CALLEE_TYPE`]): jitfold's targets are 64-bit.
//!
//! Whole functions are left out when a thunk in front of them could be
//! observed ([`Walk::observes_own_frame`](crate::fingerprint::Walk::observes_own_frame): frame or return address reads,
//! stack switches, exception catching), when their calling convention is
//! not one that takes appended parameters plainly (`fast`, `tail`,
//! `system_v`, `windows_fastcall`, `apple_aarch64`), or when a parameter
//! has a special purpose other than `vmctx` (struct arguments and returns).
//!
//! # What Binaryen merges that this does not
//!
//! Binaryen's `wasm-opt --merge-similar-functions` (version 108, with
//! `--all-features`, which it needs to parameterize callees) and
//! `jitfold report --merge calls,similar` were compared on the shared wasm
//! corpora by function index (wasmtime's `wasm[0]::function[N]` is the
//! absolute index; Binaryen's `$K` is `N` less the imports). Binaryen
//! turns 30, 188 and 16 functions of sqlite, resvg and harfbuzz into
//! thunks, this 39, 211 and 90 (42 on sqlite once constants without a
//! use were masked); 9, 170 and 16 of them were the same functions. (It
//! now turns 137, 238 and 123 into thunks, the module as many: members
//! sized by [`CostModel::function_bytes`], thunks that tail-call with
//! every argument in a register without a check of their own
//! ([`thunk_skips_stack_check`]), eight parameters at most.) Of
//! the 39 Binaryen merges that this did not:
//!
//! - 10 (sqlite) are exact duplicates, which exact merging shares already;
//! - 3 (sqlite) differ in constants that have no use in wasmtime's CLIF
//!   (the mid-end rematerialized them): such constants are now masked
//!   without being parameters (1 above), which merges these 3 (one group,
//!   2 parameters);
//! - 6 (sqlite 2, resvg 4) differ in a constant that Cranelift's GVN
//!   shares with an equal constant elsewhere in one member only, so the
//!   members' shapes differ in their uses. Giving each use of a constant a
//!   site of its own would merge them (not done: it changes the shapes of
//!   every function);
//! - 9 (resvg) differ in shift amounts (element sizes of Rust vectors),
//!   which stay out (above: an immediate shift becomes a shift by `cl`);
//! - 2 (sqlite) call different imported functions, which wasmtime's CLIF
//!   reaches through a load from the `vmctx` at another `Offset32` and an
//!   indirect call: a memory offset immediate and a callee of an indirect
//!   call, both out (above); only a rule that knows wasmtime's `vmctx`
//!   layout could pass them;
//! - 2 (resvg) differ in 7 callees, over what was then
//!   [`SimilarOptions::max_params`] (6); the default is now 8, which
//!   merges them (the cost model counts the stack arguments their thunks
//!   pass);
//! - 7 (sqlite 4, resvg 3) are groups the cost model predicts lose bytes
//!   (Binaryen counts wasm expressions, not the thunks' native code:
//!   `vmctx`, the stack-limit check, a frame); with members' frames and
//!   checks counted, the model now merges more of such small groups
//!   where they pay.
//!
//! This merges 145 functions Binaryen does not: 114 differ in a wasm
//! memory offset, which wasmtime lowers to an `iadd` of a constant (a
//! parameter site here) where Binaryen compares offsets exactly; 27 are
//! groups Binaryen's cost model (in wasm expressions) refuses; 4 differ
//! in wasm but not once Cranelift has canonicalized them.

mod group;
mod merge;
mod shape;
mod size;

pub use group::{
    CostModel, Decision, Derived, FRAME_ALIGNMENT_BYTES, GroupPlan, Param, Prediction,
    SPILL_BYTES_PER_PARAM, SPLIT_TRIES, STACK_ARG_BYTES, SimilarOptions, StackDepth,
    THUNK_FRAME_BYTES, derive, plan_group, split, thunk_skips_stack_check, values_for,
};
pub use merge::{merged_body, thunk, thunk_calling, thunk_values};
pub use shape::{CALLEE_TYPE, ParamKind, ParamValue, ShapeOf, Shaper, Site, SiteValue, mergeable};
pub use size::{Lowered, live_instructions, lowered};

#[cfg(test)]
mod tests {
    use super::shape::*;
    use super::*;
    use crate::Fingerprinter;
    use cranelift_codegen::ir::{
        Function, GlobalValueData, Signature, UserExternalName, UserFuncName,
    };
    use cranelift_codegen::isa::CallConv;
    use cranelift_codegen::{ir, settings};

    fn parse(text: &str) -> Function {
        cranelift_reader::parse_functions(text)
            .expect("parses")
            .remove(0)
    }

    /// The ISA named `name` (`x86_64`, `aarch64`: built in every
    /// configuration) with the flags JITs use: `opt_level=speed`, frame
    /// pointers kept.
    fn isa_named(name: &str) -> cranelift_codegen::isa::OwnedTargetIsa {
        let mut flags = settings::builder();
        use settings::Configurable;
        flags.set("opt_level", "speed").unwrap();
        flags.set("preserve_frame_pointers", "true").unwrap();
        cranelift_codegen::isa::lookup_by_name(name)
            .unwrap()
            .finish(settings::Flags::new(flags))
            .unwrap()
    }

    fn shape(text: &str) -> (Function, ShapeOf, crate::Fingerprint) {
        shape_of(&parse(text))
    }

    fn shape_of(func: &Function) -> (Function, ShapeOf, crate::Fingerprint) {
        let mut walker = Fingerprinter::new();
        let walk = walker.walk(func);
        let fp = walk.fingerprint();
        let shape = Shaper::new().shape(&walk, func);
        (func.clone(), shape, fp)
    }

    /// `op` applied to `v0` and a constant `c`, returned.
    fn with_constant(op: &str, c: i64) -> String {
        format!(
            "function %f(i64) -> i64 system_v {{
             block0(v0: i64):
                 v1 = iconst.i64 {c}
                 v2 = {op} v0, v1
                 return v2
             }}"
        )
    }

    #[test]
    fn ordinary_constants_are_masked_and_listed() {
        let (_, a, fa) = shape(&with_constant("iadd", 7));
        let (_, b, fb) = shape(&with_constant("iadd", -3));
        assert_ne!(fa, fb, "the exact keys still differ");
        assert_eq!(a.shape, b.shape);
        assert_eq!(a.values.len(), 1);
        assert_eq!(a.values[0].value, SiteValue::Bits(7));
        assert_eq!(b.values[0].value, SiteValue::Bits(-3));
        assert_eq!(a.values[0].ty, ir::types::I64);
    }

    /// A constant without a use is masked but is no site: functions that
    /// differ in it (and in a parameterizable constant) share a shape,
    /// with one parameter.
    #[test]
    fn constants_without_a_use_are_masked_and_not_listed() {
        let text = |dead: i64, c: i64| {
            format!(
                "function %f(i64) -> i64 system_v {{
                 block0(v0: i64):
                     v9 = iconst.i64 {dead}
                     v1 = iconst.i64 {c}
                     v2 = iadd v0, v1
                     return v2
                 }}"
            )
        };
        let (_, a, fa) = shape(&text(5, 7));
        let (_, b, fb) = shape(&text(3, -3));
        assert_ne!(fa, fb);
        assert_eq!(a.shape, b.shape);
        assert_eq!(a.values.len(), 1);
        assert_eq!(a.values[0].value, SiteValue::Bits(7));
        // Used once, it is a site again, and a shift amount keeps it.
        let used = |dead: i64, op: &str| {
            format!(
                "function %f(i64) -> i64 system_v {{
                 block0(v0: i64):
                     v9 = iconst.i64 {dead}
                     v1 = iconst.i64 7
                     v2 = iadd v0, v1
                     v3 = {op} v2, v9
                     return v3
                 }}"
            )
        };
        let (_, c, _) = shape(&used(5, "iadd"));
        assert_eq!(c.values.len(), 2);
        let (_, d, _) = shape(&used(5, "ishl"));
        let (_, e, _) = shape(&used(3, "ishl"));
        assert_ne!(d.shape, e.shape);
    }

    #[test]
    fn constants_used_as_shift_amounts_or_divisors_stay_in_the_shape() {
        for op in ["ishl", "udiv", "sdiv", "rotl"] {
            let (_, a, _) = shape(&with_constant(op, 3));
            let (_, b, _) = shape(&with_constant(op, 5));
            assert!(a.values.is_empty(), "{op}");
            assert_ne!(a.shape, b.shape, "{op}");
        }
    }

    #[test]
    fn one_excluded_use_excludes_the_constant() {
        let text = |c: i64| {
            format!(
                "function %f(i64) -> i64 system_v {{
                 block0(v0: i64):
                     v1 = iconst.i64 {c}
                     v2 = iadd v0, v1
                     v3 = load.i64 v1
                     v4 = iadd v2, v3
                     return v4
                 }}"
            )
        };
        let (_, a, _) = shape(&text(16));
        let (_, b, _) = shape(&text(32));
        assert!(a.values.is_empty());
        assert_ne!(a.shape, b.shape);
    }

    #[test]
    fn the_shape_lists_the_positions_it_masked() {
        // Masked words are zero, as a constant 0 is: the list of masked
        // positions after the key keeps a masked constant apart from a
        // constant 0 that stays.
        let (_, a, fa) = shape(&with_constant("iadd", 5));
        let key = a.shape.key();
        // The constants masked (one, at `position`), and no callee.
        assert_eq!(key.len(), fa.key().len() + 3);
        assert_eq!(key[key.len() - 1], 0);
        let position = key[key.len() - 2] as usize;
        assert_eq!(key[key.len() - 3], 1);
        assert_eq!(fa.key()[position], 5);
        assert_eq!(key[position], 0);
        let (_, z, _) = shape(&with_constant("iadd", 0));
        assert_eq!(a.shape, z.shape);
    }

    #[test]
    fn derive_keeps_equal_sites_and_shares_equal_vectors() {
        let v = |bits: i64| ParamValue {
            kind: ParamKind::Int,
            ty: ir::types::I32,
            value: SiteValue::Bits(bits),
        };
        let a = [v(1), v(5), v(9), v(5)];
        let b = [v(1), v(6), v(8), v(6)];
        let c = [v(1), v(7), v(8), v(7)];
        let d = derive(&[&a, &b, &c]).unwrap();
        assert_eq!(d.site_param, vec![None, Some(0), Some(1), Some(0)]);
        let bits = |v: &[i64]| v.iter().map(|&b| SiteValue::Bits(b)).collect::<Vec<_>>();
        assert_eq!(d.params[0].values, bits(&[5, 6, 7]));
        assert_eq!(d.params[1].values, bits(&[9, 8, 8]));
        assert!(derive(&[&a[..], &a[..3]]).is_none());
    }

    #[test]
    fn split_keeps_subgroups_within_the_parameter_limit() {
        let v = |bits: i64| ParamValue {
            kind: ParamKind::Int,
            ty: ir::types::I64,
            value: SiteValue::Bits(bits),
        };
        // a and c differ in one site, b from both in three.
        let a = [v(1), v(2), v(3)];
        let b = [v(7), v(8), v(9)];
        let c = [v(1), v(2), v(4)];
        assert_eq!(split(&[&a, &b, &c], 1), vec![vec![0, 2], vec![1]]);
        assert_eq!(split(&[&a, &b, &c], 3), vec![vec![0, 1, 2]]);
        assert_eq!(split(&[&a, &b, &c], 0), vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn the_cost_model_refuses_small_groups_and_too_many_parameters() {
        let options = SimilarOptions::default();
        let v = |bits: i64| ParamValue {
            kind: ParamKind::Int,
            ty: ir::types::I64,
            value: SiteValue::Bits(bits),
        };
        let (a, b) = ([v(1)], [v(2)]);
        let (a, b) = (&a[..], &b[..]);
        let sig = Signature::new(CallConv::SystemV);
        let small = plan_group(&sig, false, &[a, b], &[20, 20], &options).unwrap();
        assert_eq!(small.decision, Decision::DoesNotPay);
        let large = plan_group(&sig, false, &[a, b], &[400, 400], &options).unwrap();
        assert_eq!(large.decision, Decision::Merge);
        assert_eq!(large.prediction.removed, 400);
        // Two thunks of 13 + 6 bytes, and 5 bytes of growth.
        assert_eq!(large.prediction.added, 43);
        let many_a: Vec<ParamValue> = (0..9).map(v).collect();
        let many_b: Vec<ParamValue> = (10..19).map(v).collect();
        let many = plan_group(&sig, false, &[&many_a, &many_b], &[4000, 4000], &options).unwrap();
        assert_eq!(many.decision, Decision::TooManyParams);
    }

    #[test]
    fn the_merged_body_takes_the_constants_as_parameters_and_verifies() {
        let text = |c: i64, d: i64| {
            format!(
                "function %f(i64) -> i64 system_v {{
                 block0(v0: i64):
                     v1 = iconst.i64 {c}
                     v2 = iconst.i32 {d}
                     v3 = iadd v0, v1
                     v4 = sextend.i64 v2
                     v5 = imul v3, v4
                     return v5
                 }}"
            )
        };
        let (f, a, _) = shape(&text(3, 4));
        let (_, b, _) = shape(&text(3, 9));
        assert_eq!(a.shape, b.shape);
        let d = derive(&[&a.values, &b.values]).unwrap();
        assert_eq!(d.site_param, vec![None, Some(0)]);
        let (body, t) = body_and_second_thunk(&f, &a.sites, &d);
        assert_eq!(body.signature.params.len(), 2);
        assert_eq!(body.signature.params[1].value_type, ir::types::I32);
        let printed = body.display().to_string();
        assert!(printed.contains("iconst.i64 3"), "{printed}");
        assert!(!printed.contains("iconst.i32"), "{printed}");
        assert!(t.display().to_string().contains("iconst.i32 9"));
    }

    #[test]
    fn a_thunk_checks_its_members_stack_limit_and_the_body_keeps_it() {
        let text = |c: i64| {
            format!(
                "function %f(i64 vmctx, i64) -> i64 system_v {{
                     gv0 = vmctx
                     gv1 = load.i64 notrap aligned readonly gv0+8
                     gv2 = iadd_imm.i64 gv1, 16
                     stack_limit = gv2
                 block0(v0: i64, v1: i64):
                     v2 = iconst.i64 {c}
                     v3 = iadd v1, v2
                     return v3
                 }}"
            )
        };
        let (f, a, _) = shape(&text(3));
        let (_, b, _) = shape(&text(4));
        let d = derive(&[&a.values, &b.values]).unwrap();
        let (body, t) = body_and_second_thunk(&f, &a.sites, &d);
        for func in [&body, &t] {
            let limit = func.stack_limit.expect("a stack limit");
            let GlobalValueData::IAddImm { base, offset, .. } = func.global_values[limit] else {
                panic!("{func}");
            };
            assert_eq!(offset.bits(), 16, "{func}");
            let GlobalValueData::Load { base, offset, .. } = func.global_values[base] else {
                panic!("{func}");
            };
            assert_eq!(i32::from(offset), 8, "{func}");
            assert_eq!(
                func.global_values[base],
                GlobalValueData::VMContext,
                "{func}"
            );
        }
        // Without a limit, the thunk has none.
        let mut unlimited = f.clone();
        unlimited.stack_limit = None;
        let (_, t) = body_and_second_thunk(&unlimited, &a.sites, &d);
        assert_eq!(t.stack_limit, None);
    }

    /// Where [`thunk_skips_stack_check`] leaves a thunk's check out,
    /// Cranelift's own code for the thunk (kept with its check, to
    /// compare) moves no stack pointer for the tail call's argument area
    /// on x86-64 or aarch64; and a body with stack arguments beyond the
    /// member's, which the rule refuses, does move it (so the test sees
    /// the growth it looks for). The rule refuses one register more of
    /// either class, a wide integer, two results, a thunk that calls, and
    /// other targets.
    #[test]
    fn a_thunk_without_a_check_grows_no_argument_area() {
        use cranelift_codegen::ir::AbiParam;
        use ir::types::{F64, I32, I64, I128};
        use target_lexicon::Architecture;
        let member = |ints: usize, floats: usize| {
            let mut sig = Signature::new(CallConv::Tail);
            sig.params
                .push(AbiParam::special(I64, ir::ArgumentPurpose::VMContext));
            sig.params.extend((0..ints).map(|_| AbiParam::new(I32)));
            sig.params.extend((0..floats).map(|_| AbiParam::new(F64)));
            sig.returns.push(AbiParam::new(I32));
            let mut func = Function::with_name_signature(UserFuncName::user(0, 1), sig);
            let gv = func.create_global_value(GlobalValueData::VMContext);
            func.stack_limit = Some(gv);
            func
        };
        for name in ["x86_64", "aarch64"] {
            let isa = isa_named(name);
            let arch = isa.triple().architecture;
            let skips =
                |sig: &Signature, types: &[ir::Type]| thunk_skips_stack_check(arch, sig, types);
            let moves_sp = |func: &Function| {
                let mut ctx = cranelift_codegen::Context::for_function(func.clone());
                ctx.set_disasm(true);
                ctx.compile(&*isa, &mut Default::default()).unwrap();
                let text = ctx.compiled_code().unwrap().vcode.clone().unwrap();
                text.lines()
                    .any(|l| l.contains("subq") && l.contains("%rsp") || l.contains("sub sp"))
            };
            let thunk_of = |m: &Function, types: &[ir::Type], tail_call: bool| {
                let mut body_sig = m.signature.clone();
                body_sig
                    .params
                    .extend(types.iter().map(|&t| AbiParam::new(t)));
                let values: Vec<(ir::Type, SiteValue)> =
                    types.iter().map(|&t| (t, SiteValue::Bits(7))).collect();
                let body = UserExternalName::new(0, 2);
                thunk_calling(&*isa, m, body, &body_sig, &values, tail_call)
            };
            let cases = [(0, 0, 1), (2, 0, 3), (3, 2, 2), (4, 8, 1), (5, 0, 0)];
            for (ints, floats, params) in cases {
                let m = member(ints, floats);
                let types = vec![I64; params];
                assert!(
                    skips(&m.signature, &types),
                    "{name}: {ints}, {floats}, {params}"
                );
                let t = thunk_of(&m, &types, true);
                assert_eq!(t.stack_limit, None, "{name}: {t}");
                let mut checked = t.clone();
                let gv = checked.create_global_value(GlobalValueData::VMContext);
                checked.stack_limit = Some(gv);
                assert!(!moves_sp(&checked), "{name}: {checked}");
                // A thunk that calls keeps its check.
                assert!(thunk_of(&m, &types, false).stack_limit.is_some());
            }
            // Five integers and the `vmctx`, then two parameters: the
            // body takes one on the stack, the member none.
            let m = member(5, 0);
            assert!(!skips(&m.signature, &[I64, I64]));
            let t = thunk_of(&m, &[I64, I64], true);
            assert!(t.stack_limit.is_some(), "{name}: {t}");
            assert!(moves_sp(&t), "{name}: {t}");
            // One register more of each class, a wide integer, two
            // results, another convention.
            assert!(!skips(&member(6, 0).signature, &[]));
            assert!(!skips(&member(0, 8).signature, &[F64]));
            assert!(!skips(&member(0, 0).signature, &[I128]));
            let mut two = member(0, 0);
            two.signature.returns.push(AbiParam::new(I32));
            assert!(!skips(&two.signature, &[I64]));
            let mut system_v = member(1, 0);
            system_v.signature.call_conv = CallConv::SystemV;
            assert!(!skips(&system_v.signature, &[I64]));
        }
        // Other targets lay out frames otherwise.
        let sig = member(0, 0).signature.clone();
        for arch in [
            Architecture::S390x,
            Architecture::Riscv64(target_lexicon::Riscv64Architecture::Riscv64),
        ] {
            assert!(!thunk_skips_stack_check(arch, &sig, &[I64]), "{arch}");
        }
        assert!(thunk_skips_stack_check(Architecture::X86_64, &sig, &[I64]));
    }

    #[test]
    fn a_stack_limit_whose_global_values_are_malformed_is_not_merged() {
        let (f, _, _) = shape(
            "function %f(i64 vmctx, i64) -> i64 system_v {
                 gv0 = vmctx
                 gv1 = load.i64 notrap aligned readonly gv0+8
                 stack_limit = gv1
             block0(v0: i64, v1: i64):
                 v2 = iconst.i64 3
                 v3 = iadd v1, v2
                 return v3
             }",
        );
        let stack = StackDepth::DEFAULT;
        assert!(mergeable(&f, false, stack));
        assert!(!mergeable(&f, false, StackDepth::Exact));
        let gv0 = ir::GlobalValue::from_u32(0);
        let gv1 = ir::GlobalValue::from_u32(1);
        // A cycle: gv0 loads from gv1, which loads from gv0.
        let mut cycle = f.clone();
        let GlobalValueData::Load { flags, .. } = cycle.global_values[gv1] else {
            panic!("{cycle}");
        };
        cycle.global_values[gv0] = GlobalValueData::Load {
            base: gv1,
            offset: 0.into(),
            global_type: ir::types::I64,
            flags,
        };
        assert!(!mergeable(&cycle, false, stack));
        // A limit that is not a global value of the function.
        let mut missing = f.clone();
        missing.stack_limit = Some(ir::GlobalValue::from_u32(7));
        assert!(!mergeable(&missing, false, stack));
    }

    /// The merged body of `f` (its sites `sites`, parameters `d`) and the
    /// thunk of the group's second member (`u0:1`, the body named
    /// `u0:2`), both verified.
    fn body_and_second_thunk(f: &Function, sites: &[Site], d: &Derived) -> (Function, Function) {
        let body = merged_body(f, sites, d).unwrap();
        let flags = settings::Flags::new(settings::builder());
        cranelift_codegen::verify_function(&body, &flags).unwrap();
        let mut member = f.clone();
        member.name = UserFuncName::user(0, 1);
        let isa = isa_named("x86_64");
        let t = thunk(
            &*isa,
            &member,
            UserExternalName::new(0, 2),
            &body.signature,
            &thunk_values(d, 1),
        );
        cranelift_codegen::verify_function(&t, &flags).unwrap();
        (body, t)
    }

    /// A function that calls `%{callee}` with `v0` and `how` is the call
    /// (`call`, `return_call`), or `addr` (takes its address too).
    fn calling(callee: &str, how: &str) -> String {
        let body = match how {
            "call" => "v1 = call fn0(v0)\n v2 = call fn0(v1)\n return v2",
            "return_call" => "return_call fn0(v0)",
            "addr" => "v1 = call fn0(v0)\n v2 = func_addr.i64 fn0\n v3 = iadd v1, v2\n return v3",
            _ => unreachable!(),
        };
        format!(
            "function %f(i64) -> i64 tail {{
             sig0 = (i64) -> i64 tail
             fn0 = %{callee} sig0
             block0(v0: i64):
                 {body}
             }}"
        )
    }

    #[test]
    fn direct_callees_are_masked_and_listed() {
        let (_, a, fa) = shape(&calling("g", "call"));
        let (_, b, fb) = shape(&calling("h", "call"));
        assert_ne!(fa, fb);
        assert_eq!(a.shape, b.shape);
        assert_eq!(a.values.len(), 1);
        assert_eq!(a.values[0].kind, ParamKind::Callee);
        assert_eq!(a.values[0].ty, CALLEE_TYPE);
        let SiteValue::Function(name, sig) = &a.values[0].value else {
            panic!("{:?}", a.values[0]);
        };
        assert_eq!(*name, crate::SymbolName::TestCase(b"g"[..].into()));
        assert_eq!(sig.call_conv, CallConv::Tail);
        assert_eq!(a.sites, vec![Site::Callee(name.clone())]);
    }

    #[test]
    fn tail_called_or_address_taken_callees_stay_in_the_shape() {
        for how in ["return_call", "addr"] {
            let (_, a, _) = shape(&calling("g", how));
            let (_, b, _) = shape(&calling("h", how));
            assert!(a.values.is_empty(), "{how}: {:?}", a.values);
            assert_ne!(a.shape, b.shape, "{how}");
        }
    }

    #[test]
    fn the_body_calls_a_callee_parameter_indirectly_and_the_thunk_passes_its_address() {
        let (f, a, _) = shape(&calling("g", "call"));
        let (_, b, _) = shape(&calling("h", "call"));
        let d = derive(&[&a.values, &b.values]).unwrap();
        assert_eq!(d.site_param, vec![Some(0)]);
        let (body, t) = body_and_second_thunk(&f, &a.sites, &d);
        let printed = body.display().to_string();
        assert_eq!(
            printed.matches("call_indirect sig0, v3(").count(),
            2,
            "{printed}"
        );
        assert!(!printed.contains("call fn0"), "{printed}");
        let printed = t.display().to_string();
        assert!(printed.contains("fn0 = %h sig0"), "{printed}");
        assert!(printed.contains("func_addr.i64 fn0"), "{printed}");
        // The body refuses a site that is not a callee of the function.
        let other = vec![Site::Callee(crate::SymbolName::TestCase(b"x"[..].into()))];
        assert!(merged_body(&f, &other, &d).is_err());
    }

    /// A block the walk does not reach may name a function reference that
    /// is not declared (built through the API, with the verifier off):
    /// building the body refuses the function instead of panicking.
    #[test]
    fn a_reference_to_nothing_in_unreachable_code_refuses_the_body() {
        use cranelift_codegen::entity::EntityRef;
        use cranelift_codegen::ir::{InstructionData, Opcode, TrapCode, ValueList};
        let (f, a, _) = shape(&calling("g", "call"));
        let (_, b, _) = shape(&calling("h", "call"));
        let d = derive(&[&a.values, &b.values]).unwrap();
        for opcode in [Opcode::Call, Opcode::FuncAddr] {
            let mut g = f.clone();
            let missing = ir::FuncRef::new(7);
            let block = g.dfg.make_block();
            g.layout.append_block(block);
            let arg = g.dfg.append_block_param(block, ir::types::I64);
            let data = match opcode {
                Opcode::Call => InstructionData::Call {
                    opcode,
                    args: ValueList::from_slice(&[arg], &mut g.dfg.value_lists),
                    func_ref: missing,
                },
                _ => InstructionData::FuncAddr {
                    opcode,
                    func_ref: missing,
                },
            };
            let inst = g.dfg.make_inst(data);
            g.layout.append_inst(inst, block);
            let trap = g.dfg.make_inst(InstructionData::Trap {
                opcode: Opcode::Trap,
                code: TrapCode::unwrap_user(1),
            });
            g.layout.append_inst(trap, block);
            let (_, shaped, _) = shape_of(&g);
            assert_eq!(
                shaped.shape, a.shape,
                "{opcode}: unreachable code is not shaped"
            );
            let built = merged_body(&g, &shaped.sites, &d);
            assert!(built.is_err(), "{opcode}: a body was built");
        }
    }

    #[test]
    fn symbols_that_scale_a_dynamic_type_stay_in_the_shape() {
        let text = |object: u32, scale: bool| {
            let dt = if scale { "dt0 = i32x4*gv0" } else { "" };
            format!(
                "function %f(i64) -> i64 system_v {{
                     gv0 = symbol colocated u1:{object}
                     {dt}
                 block0(v0: i64):
                     v1 = symbol_value.i64 gv0
                     v2 = iadd v0, v1
                     return v2
                 }}"
            )
        };
        let (_, plain, _) = shape(&text(0, false));
        assert_eq!(plain.values.len(), 1, "{:?}", plain.values);
        let (_, a, _) = shape(&text(0, true));
        let (_, b, _) = shape(&text(1, true));
        assert!(a.values.is_empty(), "{:?}", a.values);
        assert_ne!(a.shape, b.shape);
    }
}
