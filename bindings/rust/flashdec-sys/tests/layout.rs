//! Every struct of the header has the same size and field offsets in Rust as
//! in C (values printed by bindings/layout_probe.c, compiled by build.rs).
use flashdec_sys::*;
use std::collections::HashMap;
use std::mem::{offset_of, size_of};

include!("common/fields.rs");

fn probe() -> HashMap<String, usize> {
    let text = LAYOUT_PROBE;
    assert!(!text.starts_with("PROBE_FAILED"), "{text}");
    text.lines()
        .map(|l| {
            let mut it = l.split_whitespace();
            (it.next().unwrap().to_string(), it.next().unwrap().parse().unwrap())
        })
        .collect()
}

#[test]
fn struct_sizes_and_offsets_match_c() {
    let p = probe();
    let mut checked = 0usize;
    macro_rules! check {
        ($t:ident; $($f:ident),*) => {{
            assert_eq!(size_of::<$t>(), p[stringify!($t)], "sizeof {}", stringify!($t));
            $(
                // `type` is a Rust keyword: the mirror calls it `type_`.
                let key = format!("{}.{}", stringify!($t), stringify!($f).trim_end_matches("type_").to_string()
                    + if stringify!($f) == "type_" { "type" } else { "" });
                assert_eq!(offset_of!($t, $f), p[&key], "offsetof {}", key);
                checked += 1;
            )*
        }};
    }
    for_each_struct_field!(check);
    assert_eq!(checked, p.keys().filter(|k| k.contains('.')).count(), "probe fields without a Rust mirror");
}

#[test]
fn enum_values_are_pinned() {
    assert_eq!(FD_OK, 0);
    assert_eq!(FD_ERR_INVARIANT, 12);
    assert_eq!(FD_DTYPE_BF16, 2);
    assert_eq!(FD_TX_ABORTED, 2);
}
