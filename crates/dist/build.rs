// Compiles csrc/c10d.cpp against the headers of the libtorch torch-sys links (the PyPI wheel's
// torch/include), as torch-sys compiles its own libtch: same C++ standard and ABI flags.
// torch-sys (`links = "tch"`) hands its lib directory over as DEP_TCH_LIBTORCH_LIB.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys did not report its libtorch lib directory");
    let include = PathBuf::from(&lib).parent().expect("libtorch lib directory has a parent").join("include");
    if !include.join("torch/csrc/distributed/c10d/ProcessGroupGloo.hpp").is_file() {
        panic!("{}: no c10d headers (torch/csrc/distributed/c10d/ProcessGroupGloo.hpp); knowrl-dist needs the torch wheel's include directory", include.display());
    }
    // This crate's own tests run without LD_LIBRARY_PATH (as build/link_torch.rs does for the others).
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    // torch ≥ 2.7 wheels use the C++11 ABI (their symbols name std::__cxx11), torch-sys' default too.
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .std("c++17")
        .define("USE_C10D_GLOO", None)
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .define("GLOG_USE_GLOG_EXPORT", None)
        .include("csrc/gloo-decl")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .file("csrc/c10d.cpp")
        .file("csrc/nccl.cpp");
    match nccl_includes(&PathBuf::from(&lib)) {
        Ok(dirs) => {
            build.define("USE_C10D_NCCL", None).define("USE_CUDA", None).define("KNOWRL_WITH_NCCL", None);
            build.includes(dirs);
            println!("cargo:rustc-link-lib=torch_cuda");
        }
        Err(why) => println!("cargo:warning=knowrl-dist without NCCL: {why}"),
    }
    build.compile("knowrl_c10d");
}

/// The CUDA and NCCL header directories ProcessGroupNCCL.hpp needs, found next to libtorch (the
/// wheel's site-packages/nvidia/…) or under $CUDA_HOME; why not, when libtorch has no CUDA or a
/// header is missing.
fn nccl_includes(lib: &std::path::Path) -> Result<Vec<PathBuf>, String> {
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    if !lib.join("libtorch_cuda.so").is_file() {
        return Err(format!("{} has no libtorch_cuda.so", lib.display()));
    }
    let mut roots = vec![];
    if let Some(site) = lib.parent().and_then(|torch| torch.parent()) {
        let nvidia = site.join("nvidia");
        roots.push(nvidia.join("nccl/include"));
        if let Ok(dirs) = std::fs::read_dir(&nvidia) {
            roots.extend(dirs.flatten().map(|d| d.path().join("include")));
        }
    }
    roots.push(PathBuf::from(std::env::var("CUDA_HOME").unwrap_or_else(|_| "/usr/local/cuda".into())).join("include"));
    let mut dirs = vec![];
    for header in ["nccl.h", "cuda_runtime_api.h", "crt/host_config.h", "nv/target"] {
        match roots.iter().find(|r| r.join(header).exists()) {
            Some(dir) => dirs.push(dir.clone()),
            None => return Err(format!("no {header} (scripts/requirements.txt pins the packages that hold it)")),
        }
    }
    dirs.dedup();
    Ok(dirs)
}
