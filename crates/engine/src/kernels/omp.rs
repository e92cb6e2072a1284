//! Our CPU kernels (`small_gemm`, `decode_attention`) run on libtorch's own OpenMP thread team.
//!
//! A second pool (rayon) fights libgomp's workers, which spin for a while after each libtorch
//! op: in `perf` the spinning took 38% of generation time and made the decode GEMM slower than
//! MKL's. On the same team the kernels and libtorch's ops take turns on the same threads.

/// Runs `job(t, nt)` for t in 0..nt (nt ≤ `threads`) on libtorch's OpenMP team when libgomp
/// is loaded (it is, with the PyPI libtorch); on rayon where it is not.
pub fn parallel(threads: usize, job: &(dyn Fn(usize, usize) + Sync)) {
    if threads <= 1 {
        return job(0, 1);
    }
    match gomp() {
        Some(g) => {
            extern "C" fn body(data: *mut std::ffi::c_void) {
                // SAFETY: `data` is the `Team` below, alive until GOMP_parallel returns.
                let team = unsafe { &*(data as *const Team) };
                let (t, nt) = unsafe { ((team.gomp.thread_num)(), (team.gomp.num_threads)()) };
                (team.job)(t as usize, nt as usize);
            }
            struct Team<'a> {
                job: &'a (dyn Fn(usize, usize) + Sync),
                gomp: &'a Gomp,
            }
            let team = Team { job, gomp: g };
            // SAFETY: libgomp's documented entry point for `#pragma omp parallel`.
            unsafe { (g.parallel)(body, &team as *const Team as *mut std::ffi::c_void, threads as u32, 0) };
        }
        None => {
            use rayon::prelude::*;
            (0..threads).into_par_iter().for_each(|t| job(t, threads));
        }
    }
}

type GompParallel = unsafe extern "C" fn(extern "C" fn(*mut std::ffi::c_void), *mut std::ffi::c_void, u32, u32);
type OmpQuery = unsafe extern "C" fn() -> i32;

struct Gomp {
    parallel: GompParallel,
    thread_num: OmpQuery,
    num_threads: OmpQuery,
}

/// libgomp's entry points, looked up in the process (loaded by libtorch_cpu), not linked:
/// a libtorch built without OpenMP simply has none.
fn gomp() -> Option<&'static Gomp> {
    static GOMP: std::sync::OnceLock<Option<Gomp>> = std::sync::OnceLock::new();
    GOMP.get_or_init(|| {
        extern "C" {
            fn dlsym(handle: *mut std::ffi::c_void, symbol: *const std::ffi::c_char) -> *mut std::ffi::c_void;
        }
        // RTLD_DEFAULT (a null handle on glibc): every object loaded so far.
        let find = |name: &std::ffi::CStr| unsafe { dlsym(std::ptr::null_mut(), name.as_ptr()) };
        let (p, t, n) = (find(c"GOMP_parallel"), find(c"omp_get_thread_num"), find(c"omp_get_num_threads"));
        if p.is_null() || t.is_null() || n.is_null() {
            return None;
        }
        // SAFETY: the symbols have these C signatures in every libgomp.
        unsafe {
            Some(Gomp {
                parallel: std::mem::transmute::<*mut std::ffi::c_void, GompParallel>(p),
                thread_num: std::mem::transmute::<*mut std::ffi::c_void, OmpQuery>(t),
                num_threads: std::mem::transmute::<*mut std::ffi::c_void, OmpQuery>(n),
            })
        }
    })
    .as_ref()
}
