//! Raw declarations of libflashdec's C ABI (`include/flashdec.h`).
//!
//! Everything here is `unsafe` to call and mirrors the header one to one:
//! opaque handle types, `#[repr(C)]` structs, enums as integer type aliases
//! with their pinned values as constants, `FD_*` macros, and the functions.
//! `generated.rs` is bindgen's output for the header and `fields.rs` comes
//! from the same header through `bindings/tools/gen_bindings.py` (which also
//! runs bindgen); regenerate both with that script after a header change.
//! bindgen's layout tests and the `layout` test (against a C probe compiled
//! with the system compiler) check every struct size and field offset. Use
//! the `flashdec` crate for a safe API.
#![allow(non_upper_case_globals)]

#[allow(non_camel_case_types, non_snake_case, clippy::all)]
mod generated;
pub use generated::*;

mod fields;
pub use fields::*;

/// Text of the layout probe's output, for the layout test.
#[doc(hidden)]
pub const LAYOUT_PROBE: &str = include_str!(concat!(env!("OUT_DIR"), "/layout.txt"));
