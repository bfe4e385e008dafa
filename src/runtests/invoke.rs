//! Calling compiled functions with [`DataValue`] arguments: one trampoline
//! per signature, which loads the arguments from a buffer of 16-byte slots,
//! calls the function, and stores its results back into the same slots;
//! the calls run in child processes, so that a trap, a memory fault or an
//! endless loop is the outcome of one call, not the end of the runner.
//!
//! # What this module guarantees
//!
//! - [`trampoline_for`] builds a function of the ISA's default calling
//!   convention, `(callee: pointer, slots: pointer) -> i64`, that passes
//!   slot *i* as argument *i* with the argument's own type, writes result
//!   *i* into slot *i*, and returns 0; in the slot after the last argument
//!   or result slot (the *state* slot) it writes 1 before the call and 2
//!   after it. It works for any
//!   calling convention of the callee, since it calls through
//!   `call_indirect` with the callee's own signature.
//! - [`call_isolated`] makes every call in child processes with
//!   [`crate::fuzzing::isolated::run`] (the fuzzing harness's mechanism),
//!   with the slots in memory shared with the children. Each call gets its
//!   own outcome: its results, read back typed by the signature, when its
//!   state slot says it returned; else an error that says whether it
//!   trapped or what ended its child (a fault, or no end within
//!   [`TIMEOUT_S`](crate::fuzzing::isolated::TIMEOUT_S) seconds, counted
//!   from the start of its child). A call is blamed for ending a child only
//!   when it was the child's first call (else it runs again, first in a new
//!   child), so the time limit is never blamed on a call for the time of
//!   the calls before it; after it, the later calls run in a new child.
//! - Arguments that do not match the signature in number or size are an
//!   error of that call, which is then not made.

use crate::fuzzing::isolated::{self, Entry};
use cranelift_codegen::data_value::DataValue;
use cranelift_codegen::ir::{
    self, AbiParam, InstBuilder, MemFlagsData, Signature, UserFuncName, types,
};
use cranelift_codegen::isa::TargetIsa;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

/// Bytes per argument or result in the buffer: the widest value a run line
/// can hold (`i128`, 128-bit vectors).
const SLOT_BYTES: usize = 16;

/// The trampoline that calls functions of `signature` (see the module docs).
pub fn trampoline_for(signature: &Signature, isa: &dyn TargetIsa) -> ir::Function {
    let pointer = isa.pointer_type();
    let mut own = Signature::new(isa.default_call_conv());
    own.params.push(AbiParam::new(pointer));
    own.params.push(AbiParam::new(pointer));
    own.returns.push(AbiParam::new(types::I64));
    let mut func = ir::Function::with_name_signature(UserFuncName::default(), own);
    let mut builder_context = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut builder_context);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    b.seal_block(entry);
    let (callee, slots) = {
        let params = b.block_params(entry);
        (params[0], params[1])
    };
    let state = slot_offset(state_slot(signature));
    let started = b.ins().iconst(types::I64, STARTED);
    b.ins()
        .store(MemFlagsData::trusted(), started, slots, state);
    let args: Vec<ir::Value> = signature
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            b.ins()
                .load(p.value_type, MemFlagsData::trusted(), slots, slot_offset(i))
        })
        .collect();
    let sig_ref = b.import_signature(signature.clone());
    let call = b.ins().call_indirect(sig_ref, callee, &args);
    let results = b.inst_results(call).to_vec();
    for (i, result) in results.into_iter().enumerate() {
        b.ins()
            .store(MemFlagsData::trusted(), result, slots, slot_offset(i));
    }
    let returned = b.ins().iconst(types::I64, RETURNED);
    b.ins()
        .store(MemFlagsData::trusted(), returned, slots, state);
    let zero = b.ins().iconst(types::I64, 0);
    b.ins().return_(&[zero]);
    b.finalize(isa.frontend_config());
    func
}

fn slot_offset(i: usize) -> i32 {
    i32::try_from(i * SLOT_BYTES).expect("a signature has far fewer than 2^27 parameters")
}

/// The slot in which the trampoline for `signature` records the call's
/// state: 0 before, [`STARTED`] once called, [`RETURNED`] once returned.
fn state_slot(signature: &Signature) -> usize {
    signature.params.len().max(signature.returns.len())
}

/// State slot value: the call was made.
const STARTED: i64 = 1;
/// State slot value: the call returned.
const RETURNED: i64 = 2;

/// The state slot as read back (the trampoline wrote it as an `i64` at the
/// start of the slot).
fn state_of(slot: u128) -> i64 {
    let bytes = slot.to_ne_bytes();
    i64::from_ne_bytes(bytes[..8].try_into().expect("8 bytes"))
}

/// One call for [`call_isolated`].
pub struct Call<'a> {
    /// The finalized code of [`trampoline_for`]`(signature)`.
    pub trampoline: *const u8,
    /// The finalized code of a function with `signature`.
    pub function: *const u8,
    /// The function's signature.
    pub signature: &'a Signature,
    /// The arguments, as `cranelift_reader::parse_run_command` makes them.
    pub args: &'a [DataValue],
}

/// Makes every call in child processes (see the module docs) and returns
/// each call's results or why it has none.
///
/// # Safety
///
/// Every [`Call`]'s `trampoline` and `function` must be what its fields
/// say, for the host, and stay alive (not freed) during the call.
pub unsafe fn call_isolated(calls: &[Call<'_>]) -> Vec<Result<Vec<DataValue>, String>> {
    let mut out: Vec<Result<Vec<DataValue>, String>> = Vec::with_capacity(calls.len());
    let offsets: Vec<usize> = calls
        .iter()
        .scan(0, |next, c| {
            let first = *next;
            *next += state_slot(c.signature) + 1;
            Some(first)
        })
        .collect();
    let total = offsets
        .last()
        .map_or(0, |&o| o + state_slot(calls[calls.len() - 1].signature) + 1);
    let mut slots = match SharedSlots::new(total) {
        Ok(slots) => slots,
        Err(e) => return calls.iter().map(|_| Err(e.clone())).collect(),
    };
    // The calls to make: (index in `calls`, entry, callee, slots address).
    let mut pending = Vec::with_capacity(calls.len());
    for (i, c) in calls.iter().enumerate() {
        let own = &mut slots.as_mut()[offsets[i]..][..state_slot(c.signature) + 1];
        match write_args(c.signature, c.args, own) {
            Ok(()) => {
                // SAFETY: the trampoline's signature, `(pointer, pointer) ->
                // i64` in the host's default calling convention, is `Entry`'s
                // (`write_args` checked that pointers are 64 bits).
                let entry: Entry = unsafe { std::mem::transmute(c.trampoline) };
                let slots_address = own.as_mut_ptr() as i64;
                pending.push((i, entry, c.function as i64, slots_address));
                out.push(Err(String::new()));
            }
            Err(e) => out.push(Err(e)),
        }
    }
    let mut next = 0;
    while next < pending.len() {
        let batch: Vec<(Entry, i64, i64)> = pending[next..]
            .iter()
            .map(|&(_, entry, callee, slots)| (entry, callee, slots))
            .collect();
        let ended = isolated::run(&batch).err();
        let slots = slots.as_mut();
        let state = |i: usize| state_of(slots[offsets[i] + state_slot(calls[i].signature)]);
        // Calls run in order; a trap ends a child and the next call starts
        // another. If a child ended otherwise, the last call that started
        // and did not return (the culprit) ended it; if no call started, the
        // first. The culprit is blamed only if it was the first call of its
        // child, so that the time limit, which is per child, is never
        // blamed on a call for the time of the calls before it; else it runs
        // again, first in a new child, with the calls after it.
        let (ran, blamed) = match &ended {
            None => (pending.len() - next, None),
            Some(e) => {
                let batch = &pending[next..];
                let culprit = batch
                    .iter()
                    .rposition(|&(i, ..)| state(i) == STARTED)
                    .unwrap_or(0);
                let child_start = batch[..culprit]
                    .iter()
                    .rposition(|&(i, ..)| state(i) == STARTED)
                    .map_or(0, |trapped| trapped + 1);
                if culprit == child_start {
                    (culprit + 1, Some((culprit, e)))
                } else {
                    (culprit, None)
                }
            }
        };
        for (k, &(i, ..)) in pending[next..next + ran].iter().enumerate() {
            out[i] = match (state(i), blamed) {
                (RETURNED, _) => {
                    let own = &slots[offsets[i]..][..state_slot(calls[i].signature)];
                    Ok(read_results(calls[i].signature, own))
                }
                (_, Some((culprit, e))) if k == culprit => Err(format!(
                    "the call ended its child process: {}",
                    // The harness says which call of its batch it was; the
                    // batch is this runner's business, so only the cause is
                    // kept, and outcomes do not depend on batching.
                    e.rsplit_once("ended its child process: ")
                        .map_or(e.as_str(), |(_, cause)| cause)
                )),
                _ => Err("the call trapped".to_string()),
            };
        }
        next += ran;
    }
    out
}

/// Checks `args` against `signature` and writes them into `slots` in native
/// byte order, clearing the state slot.
fn write_args(signature: &Signature, args: &[DataValue], slots: &mut [u128]) -> Result<(), String> {
    if size_of::<*const u8>() != size_of::<i64>() {
        return Err("calls need a 64-bit host".to_string());
    }
    if args.len() != signature.params.len() {
        return Err(format!(
            "{} arguments given, the signature has {} parameters",
            args.len(),
            signature.params.len()
        ));
    }
    slots.fill(0);
    for (i, (arg, param)) in args.iter().zip(&signature.params).enumerate() {
        if arg.ty().bytes() != param.value_type.bytes() {
            return Err(format!(
                "argument {i} is {} but the parameter is {}",
                arg.ty(),
                param.value_type
            ));
        }
        let mut bytes = [0u8; SLOT_BYTES];
        arg.write_to_slice_ne(&mut bytes);
        slots[i] = u128::from_ne_bytes(bytes);
    }
    Ok(())
}

/// The results the trampoline wrote into `slots`, typed by `signature`.
fn read_results(signature: &Signature, slots: &[u128]) -> Vec<DataValue> {
    signature
        .returns
        .iter()
        .zip(slots)
        .map(|(r, slot)| DataValue::read_from_slice_ne(&slot.to_ne_bytes(), r.value_type))
        .collect()
}

/// Slots in memory shared with child processes (an anonymous shared
/// mapping), so that what a child's calls write is seen by the parent.
struct SharedSlots {
    ptr: *mut u128,
    len: usize,
}

impl SharedSlots {
    fn new(len: usize) -> Result<Self, String> {
        let bytes = len.max(1) * SLOT_BYTES;
        // SAFETY: an anonymous mapping of `bytes` bytes, asking for no
        // particular address; the result is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    fn as_mut(&mut self) -> &mut [u128] {
        // SAFETY: the mapping holds `len` zero-initialized, page-aligned
        // (so 16-byte aligned) `u128`s and lives as long as `self`; child
        // processes write to it only while the parent waits for them.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for SharedSlots {
    fn drop(&mut self) {
        // SAFETY: `ptr` and the size are those of the mapping made in `new`,
        // and no slice of it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len.max(1) * SLOT_BYTES) };
    }
}
