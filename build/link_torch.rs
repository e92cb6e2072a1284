// Shared build script of every crate that links a binary or test against libtorch
// (cargo:rustc-link-arg applies only to the package that emits it, not to dependents).
// Link libtorch even when no symbol from libtorch.so (the umbrella lib) is referenced directly,
// so the CUDA backend registers itself at load time (tch-rs #980, #907), and record an rpath to
// the libtorch torch-sys linked, so binaries run without LD_LIBRARY_PATH. The directory comes
// from torch-sys itself (`links = "tch"` hands it to direct dependents as DEP_TCH_LIBTORCH_LIB,
// hence torch-sys in each such crate's dependencies): a second lookup of our own (python3 on
// PATH) could disagree with it, and did, leaving binaries without the rpath.
fn main() {
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB")
        .expect("torch-sys did not report its libtorch lib directory (DEP_TCH_LIBTORCH_LIB); add torch-sys to this crate's [dependencies]");
    println!("cargo:rustc-link-search=native={lib}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
}
