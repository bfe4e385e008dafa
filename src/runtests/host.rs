//! Functions the host provides to code under test, as Cranelift's own
//! runner does: the libcalls Cranelift emits that no system library
//! exports.
//!
//! # What this module guarantees
//!
//! - [`symbols`] lists each such function under the name
//!   `cranelift_module::default_libcall_names` gives its libcall, with the
//!   host's C calling convention, which is the convention Cranelift calls
//!   libcalls with.
//! - Each computes exactly what the instruction it stands in for computes.

/// `(name, address)` of every function this module provides.
pub fn symbols() -> Vec<(&'static str, *const u8)> {
    vec![
        #[cfg(target_arch = "x86_64")]
        ("__cranelift_x86_pshufb", x86::pshufb as *const u8),
    ]
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::__m128i;

    /// SSSE3 `pshufb` for CPUs (and targets) without SSSE3: byte `i` of the
    /// result is 0 if bit 7 of `index[i]` is set, else byte
    /// `index[i] & 15` of `table`.
    #[expect(
        improper_ctypes_definitions,
        reason = "the x86-64 System V ABI passes and returns __m128i in xmm registers, as \
                  Cranelift passes i8x16; the simd-shuffle run tests check it"
    )]
    pub extern "C" fn pshufb(table: __m128i, index: __m128i) -> __m128i {
        let (table, index) = (to_bytes(table), to_bytes(index));
        let shuffled = index.map(|i| {
            if i & 0x80 != 0 {
                0
            } else {
                table[usize::from(i & 15)]
            }
        });
        from_bytes(shuffled)
    }

    fn to_bytes(v: __m128i) -> [u8; 16] {
        // SAFETY: `__m128i` is 16 plain bytes; every pattern is valid both ways.
        unsafe { core::mem::transmute::<__m128i, [u8; 16]>(v) }
    }

    fn from_bytes(b: [u8; 16]) -> __m128i {
        // SAFETY: as in `to_bytes`.
        unsafe { core::mem::transmute::<[u8; 16], __m128i>(b) }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn pshufb_selects_and_zeroes_bytes() {
            let table: [u8; 16] = core::array::from_fn(|i| 100 + i as u8);
            let mut index: [u8; 16] = core::array::from_fn(|i| 15 - i as u8);
            index[3] = 0x80;
            index[4] = 0x1f; // only the low four bits select
            let out = to_bytes(pshufb(from_bytes(table), from_bytes(index)));
            assert_eq!(out[0], 115);
            assert_eq!(out[15], 100);
            assert_eq!(out[3], 0);
            assert_eq!(out[4], 115);
        }
    }
}
