//! Overflow-checked size arithmetic for the safe wrappers. A product of
//! `u32` dimensions can exceed `usize`: unchecked, it panics in debug builds
//! and wraps in release builds, where a wrapped count could match a short
//! slice while C, given the real dimensions, reads past its end.
use crate::error::{Error, Result};

/// The product of `dims`, or an invalid-argument error naming `what`.
pub(crate) fn elem_count(dims: &[usize], what: &str) -> Result<usize> {
    dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| {
        Error::invalid(format!("{what}: {dims:?} elements overflow usize"))
    })
}

/// `n` as a C `uint32_t`, or an invalid-argument error naming `what`.
pub(crate) fn to_u32(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::invalid(format!("{what}: {n} does not fit in uint32")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elem_count_refuses_overflow() {
        assert_eq!(elem_count(&[3, 4, 5], "x").unwrap(), 60);
        assert_eq!(elem_count(&[usize::MAX, 0], "x").unwrap(), 0);
        let e = elem_count(&[usize::MAX / 2 + 1, 2], "q").unwrap_err();
        assert!(e.to_string().contains("q: "), "{e}");
    }

    #[test]
    fn to_u32_refuses_truncation() {
        assert_eq!(to_u32(u32::MAX as usize, "n").unwrap(), u32::MAX);
        assert!(to_u32(u32::MAX as usize + 1, "n").is_err());
    }
}
