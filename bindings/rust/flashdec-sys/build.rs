//! Finds libflashdec and probes the C layout of the public structs.
//!
//! Library search, first match wins:
//! 1. `FLASHDEC_LIB_DIR`: a directory holding libflashdec.so;
//! 2. `pkg-config --libs flashdec` (flashdec.pc from `cmake --install`);
//! 3. the linker's default paths (a cargo warning says so).
//!
//! Layout probe: compiles bindings/layout_probe.c against the header
//! (`FLASHDEC_INCLUDE_DIR`, default the repository's include/) with the
//! system C compiler (`CC`, default `cc`) and stores its output in
//! OUT_DIR/layout.txt for tests/layout.rs. A probe failure does not fail the
//! build: it is recorded and the layout test then fails with the reason.

use std::env;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=FLASHDEC_LIB_DIR");
    println!("cargo:rerun-if-env-changed=FLASHDEC_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=CC");
    link();
    probe_layout();
}

fn link() {
    if let Ok(dir) = env::var("FLASHDEC_LIB_DIR") {
        println!("cargo:rustc-link-search=native={dir}");
        println!("cargo:rustc-link-lib=dylib=flashdec");
        println!("cargo:lib_dir={dir}");
        return;
    }
    if let Ok(out) = Command::new("pkg-config").args(["--libs", "flashdec"]).output() {
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let mut linked = false;
            for flag in text.split_whitespace() {
                if let Some(dir) = flag.strip_prefix("-L") {
                    println!("cargo:rustc-link-search=native={dir}");
                    println!("cargo:lib_dir={dir}");
                } else if let Some(lib) = flag.strip_prefix("-l") {
                    println!("cargo:rustc-link-lib=dylib={lib}");
                    linked |= lib == "flashdec";
                }
            }
            if linked {
                return;
            }
        }
    }
    println!(
        "cargo:warning=libflashdec not found through FLASHDEC_LIB_DIR or pkg-config; \
         relying on the linker's default search path"
    );
    println!("cargo:rustc-link-lib=dylib=flashdec");
}

fn probe_layout() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let source = manifest.join("../../layout_probe.c");
    let include = env::var("FLASHDEC_INCLUDE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| manifest.join("../../../include"));
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed={}", include.join("flashdec.h").display());
    let exe = out_dir.join("layout_probe");
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let result = Command::new(&cc)
        .arg("-std=c99")
        .arg("-I")
        .arg(&include)
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .output()
        .map_err(|e| format!("cannot run {cc}: {e}"))
        .and_then(|o| {
            if o.status.success() {
                Ok(())
            } else {
                Err(format!("{cc} failed: {}", String::from_utf8_lossy(&o.stderr)))
            }
        })
        .and_then(|_| Command::new(&exe).output().map_err(|e| format!("cannot run probe: {e}")))
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string());
    let text = match result {
        Ok(text) => text,
        Err(reason) => {
            println!("cargo:warning=layout probe unavailable: {reason}");
            format!("PROBE_FAILED {}\n", reason.replace('\n', " "))
        }
    };
    fs::write(out_dir.join("layout.txt"), text).unwrap();
}
