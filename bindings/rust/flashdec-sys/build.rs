//! Finds libflashdec and probes the C layout of the public structs.
//!
//! Library search, first match wins:
//! 1. `FLASHDEC_DIR`: an install prefix (`cmake --install --prefix DIR`);
//!    the library is taken from its lib/ (or lib64/); a prefix without one
//!    fails the build;
//! 2. `FLASHDEC_LIB_DIR`: a directory holding libflashdec.so (a build tree);
//! 3. `pkg-config --libs flashdec` (flashdec.pc from `cmake --install`; the
//!    `pkg-config` program is run directly, no crate needed);
//! 4. the linker's default paths (a cargo warning says so).
//!
//! The directory found is also written into the executable as an rpath, so a
//! program runs after a plain install without LD_LIBRARY_PATH. Cargo passes
//! `rustc-link-arg` only to this package's own targets; a binary in another
//! package gets the directory as `DEP_FLASHDEC_LIB_DIR` by depending on
//! flashdec-sys directly and adds the rpath in its build script (see
//! examples/rust/build.rs).
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
    println!("cargo:rerun-if-env-changed=FLASHDEC_DIR");
    println!("cargo:rerun-if-env-changed=FLASHDEC_LIB_DIR");
    println!("cargo:rerun-if-env-changed=FLASHDEC_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=CC");
    link();
    probe_layout();
}

/// Links libflashdec from `dir` and records `dir` as the rpath.
fn link_dir(dir: &str) {
    println!("cargo:rustc-link-search=native={dir}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    println!("cargo:lib_dir={dir}");
}

fn link() {
    if let Ok(prefix) = env::var("FLASHDEC_DIR") {
        let prefix = PathBuf::from(prefix);
        let found = ["lib", "lib64"]
            .iter()
            .map(|d| prefix.join(d))
            .find(|d| d.join("libflashdec.so").exists());
        match found {
            Some(dir) => {
                link_dir(&dir.display().to_string());
                println!("cargo:rustc-link-lib=dylib=flashdec");
                return;
            }
            None => panic!(
                "FLASHDEC_DIR={}: no lib/libflashdec.so or lib64/libflashdec.so there \
                 (expected an install prefix: cmake --install BUILD --prefix DIR)",
                prefix.display()
            ),
        }
    }
    if let Ok(dir) = env::var("FLASHDEC_LIB_DIR") {
        link_dir(&dir);
        println!("cargo:rustc-link-lib=dylib=flashdec");
        return;
    }
    if let Ok(out) = Command::new("pkg-config").args(["--libs", "flashdec"]).output() {
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let mut linked = false;
            for flag in text.split_whitespace() {
                if let Some(dir) = flag.strip_prefix("-L") {
                    link_dir(dir);
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
        "cargo:warning=libflashdec not found through FLASHDEC_DIR, FLASHDEC_LIB_DIR or pkg-config; \
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
