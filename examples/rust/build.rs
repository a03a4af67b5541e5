//! Writes libflashdec's directory into this program as an rpath, so `cargo run`
//! works after a plain install with only PKG_CONFIG_PATH (or FLASHDEC_DIR) set.
//!
//! flashdec-sys finds the library (FLASHDEC_DIR > FLASHDEC_LIB_DIR >
//! pkg-config) and hands the directory to the build scripts of packages that
//! depend on it directly, as DEP_FLASHDEC_LIB_DIR. Cargo does not pass a
//! dependency's link arguments on to a binary, so a program that wants the
//! rpath adds it itself: copy this file and the flashdec-sys dependency.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_FLASHDEC_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_FLASHDEC_LIB_DIR") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{dir}");
    }
}
