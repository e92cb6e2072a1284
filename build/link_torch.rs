// Shared build script of every crate that links a binary or test against libtorch
// (cargo:rustc-link-arg applies only to the package that emits it, not to dependents).
// Link libtorch even when no symbol from libtorch.so (the umbrella lib) is referenced directly,
// so the CUDA backend registers itself at load time (tch-rs #980, #907), and record an rpath to
// the venv's torch/lib so binaries run without LD_LIBRARY_PATH.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_USE_PYTORCH");
    if let Some(lib) = torch_lib_dir() {
        println!("cargo:rustc-link-search=native={lib}");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
}

fn torch_lib_dir() -> Option<String> {
    if let Ok(lib) = std::env::var("LIBTORCH") {
        return Some(format!("{lib}/lib"));
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))"])
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
