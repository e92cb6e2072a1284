//! Data parallelism on libtorch's own c10d, not a home-made one: ranks meet at a `TCPStore`
//! (rank 0 serves it) and talk through `ProcessGroupGloo` (CPU) or `ProcessGroupNCCL` (one GPU
//! per rank). tch does not bind c10d, so `csrc/` is a small C++ shim compiled against the torch
//! wheel's headers; this file is its safe face. What the trainer builds on it
//! (sharded rollouts, the global normaliser, bucketed gradient all-reduce) is in `knowrl-rl`.
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::NonNull;
use std::time::Duration;
use tch::Tensor;

#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// A torchrun variable is missing or malformed.
    #[error("environment variable {var}: {msg}")]
    Env { var: &'static str, msg: String },
    /// c10d's own message (a dead peer, a timeout, a refused connection).
    #[error("{op}: {msg}")]
    Collective { op: &'static str, msg: String },
}

pub type Result<T, E = DistError> = std::result::Result<T, E>;

/// Where this process stands among the ranks: torchrun's environment (`RANK`, `WORLD_SIZE`,
/// `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`).
#[derive(Debug, Clone, PartialEq)]
pub struct Rendezvous {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
}

impl Rendezvous {
    /// The rendezvous torchrun (or `knowrl train --nproc`) set, or `None` when `WORLD_SIZE`
    /// is unset: one process. Errors name the variable.
    pub fn from_env() -> Result<Option<Rendezvous>> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`Rendezvous::from_env`] over any variable lookup (tests).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Rendezvous>> {
        let Some(world) = var("WORLD_SIZE") else {
            return Ok(None);
        };
        fn num<T: std::str::FromStr>(var: &'static str, v: &str) -> Result<T> {
            v.trim().parse().map_err(|_| DistError::Env { var, msg: format!("`{v}` is not a number") })
        }
        let world_size: usize = num("WORLD_SIZE", &world)?;
        if world_size == 0 {
            return Err(DistError::Env { var: "WORLD_SIZE", msg: "must be at least 1".into() });
        }
        let need = |k: &'static str| var(k).ok_or(DistError::Env { var: k, msg: "not set (WORLD_SIZE is)".into() });
        let rank: usize = num("RANK", &need("RANK")?)?;
        if rank >= world_size {
            return Err(DistError::Env { var: "RANK", msg: format!("{rank} is not below WORLD_SIZE {world_size}") });
        }
        let local_rank = match var("LOCAL_RANK") {
            Some(v) => num("LOCAL_RANK", &v)?,
            None => rank,
        };
        Ok(Some(Rendezvous {
            rank,
            world_size,
            local_rank,
            master_addr: var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
            master_port: num("MASTER_PORT", &need("MASTER_PORT")?)?,
        }))
    }
}

mod ffi {
    use std::ffi::{c_char, c_void};
    extern "C" {
        /// backend 0: gloo, 1: NCCL.
        pub fn knowrl_group_new(
            backend: i32,
            host: *const c_char,
            port: u16,
            rank: i32,
            size: i32,
            timeout_ms: i64,
            err: *mut *mut c_char,
        ) -> *mut c_void;
        pub fn knowrl_group_free(g: *mut c_void);
        pub fn knowrl_free(s: *mut c_char);
        pub fn knowrl_all_reduce_sum(g: *mut c_void, t: *mut c_void, err: *mut *mut c_char) -> i32;
        pub fn knowrl_all_gather(g: *mut c_void, out: *mut c_void, input: *mut c_void, err: *mut *mut c_char) -> i32;
        pub fn knowrl_broadcast(g: *mut c_void, t: *mut c_void, root: i32, err: *mut *mut c_char) -> i32;
        pub fn knowrl_barrier(g: *mut c_void, err: *mut *mut c_char) -> i32;
    }
}

/// Turns the shim's error string into a [`DistError`] (and frees it).
fn check(op: &'static str, rc: i32, err: *mut c_char) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    let msg = if err.is_null() {
        "failed".to_string()
    } else {
        // SAFETY: the shim hands over a NUL-terminated malloc'ed string, freed here once.
        let s = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
        unsafe { ffi::knowrl_free(err) };
        s
    };
    Err(DistError::Collective { op, msg })
}

fn raw(t: &mut Tensor) -> *mut c_void {
    t.as_mut_ptr() as *mut c_void
}

/// Which c10d backend carries the collectives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Backend {
    /// ProcessGroupGloo: CPU tensors (CUDA ones are staged through the host).
    Gloo,
    /// ProcessGroupNCCL: CUDA tensors on this rank's GPU (`cuda:LOCAL_RANK`).
    Nccl,
}

/// One rank's handle on a process group. Collectives block until every rank has joined them,
/// or fail (a peer that died, the timeout) with c10d's message.
pub struct ProcessGroup {
    raw: NonNull<c_void>,
    rank: usize,
    size: usize,
    /// Where the helpers' small tensors (counts, bytes) live: the host for gloo, this rank's
    /// GPU for NCCL.
    device: tch::Device,
}

// The group is used from one thread at a time (the trainer's); c10d guards its own state.
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// Joins the others at the rendezvous: rank 0 serves the TCPStore, every rank waits for all
    /// of them (up to `timeout`, which also bounds every collective).
    pub fn gloo(r: &Rendezvous, timeout: Duration) -> Result<ProcessGroup> {
        Self::new(r, Backend::Gloo, timeout)
    }

    /// [`ProcessGroup::gloo`] with the backend chosen (NCCL needs a build with its headers and
    /// a GPU per local rank; otherwise an error says which is missing).
    pub fn new(r: &Rendezvous, backend: Backend, timeout: Duration) -> Result<ProcessGroup> {
        let host = CString::new(r.master_addr.clone())
            .map_err(|_| DistError::Env { var: "MASTER_ADDR", msg: "holds a NUL byte".into() })?;
        let code = match backend {
            Backend::Gloo => 0,
            Backend::Nccl => 1,
        };
        let mut err: *mut c_char = std::ptr::null_mut();
        let (rank, size, ms) = (r.rank as i32, r.world_size as i32, timeout.as_millis() as i64);
        // SAFETY: host outlives the call; err is written only on failure.
        let g = unsafe { ffi::knowrl_group_new(code, host.as_ptr(), r.master_port, rank, size, ms, &mut err) };
        let device = match backend {
            Backend::Gloo => tch::Device::Cpu,
            Backend::Nccl => tch::Device::Cuda(r.local_rank),
        };
        match NonNull::new(g) {
            Some(raw) => Ok(ProcessGroup { raw, rank: r.rank, size: r.world_size, device }),
            None => {
                check("rendezvous", 1, err)?;
                unreachable!("a failed rendezvous returns an error")
            }
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// In place: `t` = the sum of every rank's `t` (contiguous; same shape and kind everywhere).
    pub fn all_reduce_sum(&self, t: &mut Tensor) -> Result<()> {
        let mut err = std::ptr::null_mut();
        // SAFETY: t is a live tensor for the duration of the (blocking) call.
        check("all_reduce", unsafe { ffi::knowrl_all_reduce_sum(self.raw.as_ptr(), raw(t), &mut err) }, err)
    }

    /// Every rank's `t` stacked in rank order (`[size, ..t's shape]`); shapes must agree.
    pub fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        // Gloo's allgather_base wants a flat output, `size` times the (flat) input.
        let mut input = t.contiguous().view(-1);
        let mut out = Tensor::empty([self.size as i64 * input.numel() as i64], (t.kind(), t.device()));
        let mut err = std::ptr::null_mut();
        // SAFETY: both tensors are live for the (blocking) call; out is contiguous.
        let rc = unsafe { ffi::knowrl_all_gather(self.raw.as_ptr(), raw(&mut out), raw(&mut input), &mut err) };
        check("all_gather", rc, err)?;
        let mut shape = vec![self.size as i64];
        shape.extend(t.size());
        Ok(out.view(shape.as_slice()))
    }

    /// In place: `t` = rank `root`'s `t`.
    pub fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()> {
        let mut err = std::ptr::null_mut();
        // SAFETY: t is live for the (blocking) call.
        check("broadcast", unsafe { ffi::knowrl_broadcast(self.raw.as_ptr(), raw(t), root as i32, &mut err) }, err)
    }

    /// Returns once every rank has reached it.
    pub fn barrier(&self) -> Result<()> {
        let mut err = std::ptr::null_mut();
        // SAFETY: plain call on a live group.
        check("barrier", unsafe { ffi::knowrl_barrier(self.raw.as_ptr(), &mut err) }, err)
    }

    /// In place: each value = its sum over ranks (f64 on the wire: exact for counts).
    pub fn all_reduce_f64(&self, v: &mut [f64]) -> Result<()> {
        let mut t = Tensor::from_slice(v).to_device(self.device);
        self.all_reduce_sum(&mut t)?;
        t.to_device(tch::Device::Cpu).copy_data(v, v.len());
        Ok(())
    }

    /// Every rank's bytes, in rank order (any lengths: padded to the longest on the wire).
    pub fn all_gather_bytes(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let host = |t: Tensor| t.to_device(tch::Device::Cpu).view(-1);
        let lens = self.all_gather(&Tensor::from_slice(&[bytes.len() as i64]).to_device(self.device))?;
        let lens: Vec<i64> = Vec::try_from(host(lens)).expect("i64 lengths");
        let longest = lens.iter().copied().max().unwrap_or(0).max(1) as usize;
        let mut padded = bytes.to_vec();
        padded.resize(longest, 0);
        let all = self.all_gather(&Tensor::from_slice(&padded).to_device(self.device))?;
        let all: Vec<u8> = Vec::try_from(host(all)).expect("u8 bytes");
        Ok(all.chunks(longest).zip(&lens).map(|(c, &n)| c[..n as usize].to_vec()).collect())
    }

    /// In place: every tensor = its sum over ranks, sent in buckets of at most `bucket_bytes`
    /// (consecutive tensors of one kind and device flattened into one buffer, as DDP's
    /// reducer does; a tensor larger than a bucket goes alone). All ranks pass the same list.
    pub fn all_reduce_buckets(&self, tensors: &mut [Tensor], bucket_bytes: usize) -> Result<()> {
        for range in buckets(tensors, bucket_bytes) {
            let part = &mut tensors[range];
            if part.len() == 1 && part[0].is_contiguous() {
                self.all_reduce_sum(&mut part[0])?;
                continue;
            }
            let mut flat = Tensor::cat(&part.iter().map(|t| t.reshape(-1)).collect::<Vec<_>>(), 0);
            self.all_reduce_sum(&mut flat)?;
            let mut at = 0;
            for t in part.iter_mut() {
                let n = t.numel() as i64;
                t.copy_(&flat.narrow(0, at, n).view(t.size().as_slice()));
                at += n;
            }
        }
        Ok(())
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: created by knowrl_group_new, freed once.
        unsafe { ffi::knowrl_group_free(self.raw.as_ptr()) }
    }
}

/// Index ranges of consecutive tensors sharing kind and device, each at most `bucket_bytes`
/// (or one tensor).
pub fn buckets(tensors: &[Tensor], bucket_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let bytes = |t: &Tensor| t.numel() * t.kind().elt_size_in_bytes();
    let mut out = vec![];
    let mut start = 0;
    let mut size = 0;
    for (i, t) in tensors.iter().enumerate() {
        let same = i > start && (t.kind(), t.device()) == (tensors[start].kind(), tensors[start].device());
        if i > start && (!same || size + bytes(t) > bucket_bytes) {
            out.push(start..i);
            start = i;
            size = 0;
        }
        size += bytes(t);
    }
    if start < tensors.len() {
        out.push(start..tensors.len());
    }
    out
}

/// A loopback port nothing listens on now (the OS picks it; released before rank 0 binds it):
/// the MASTER_PORT of a local run.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// DDP's default bucket (`bucket_cap_mb = 25`).
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    #[test]
    fn torchrun_variables_are_read_and_bad_ones_named() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(Rendezvous::from_vars(vars(&[])).unwrap(), None);
        let r = Rendezvous::from_vars(vars(&[("WORLD_SIZE", "2"), ("RANK", "1"), ("MASTER_PORT", "29500")]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.rank, r.world_size, r.local_rank, r.master_addr.as_str(), r.master_port),
            (1, 2, 1, "127.0.0.1", 29500)
        );
        let err = Rendezvous::from_vars(vars(&[("WORLD_SIZE", "2"), ("RANK", "2"), ("MASTER_PORT", "1")])).unwrap_err();
        assert!(err.to_string().contains("RANK: 2 is not below WORLD_SIZE 2"), "{err}");
        let err = Rendezvous::from_vars(vars(&[("WORLD_SIZE", "two")])).unwrap_err();
        assert!(err.to_string().contains("WORLD_SIZE: `two` is not a number"), "{err}");
        let err = Rendezvous::from_vars(vars(&[("WORLD_SIZE", "2"), ("RANK", "0")])).unwrap_err();
        assert!(err.to_string().contains("MASTER_PORT: not set"), "{err}");
    }

    #[test]
    fn buckets_split_by_size_and_kind() {
        let f = |n: i64| Tensor::zeros([n], (Kind::Float, tch::Device::Cpu));
        let d = Tensor::zeros([2], (Kind::Double, tch::Device::Cpu));
        let ts = [f(4), f(4), f(10), d, f(1)];
        // 16 + 16 bytes fit 40; the 40-byte tensor goes alone; the f64 starts its own.
        assert_eq!(buckets(&ts, 40), vec![0..2, 2..3, 3..4, 4..5]);
        assert_eq!(buckets(&ts, 1 << 20), vec![0..3, 3..4, 4..5]);
        assert!(buckets(&[], 10).is_empty());
    }

    fn free_port() -> u16 {
        super::free_port().unwrap()
    }

    #[test]
    fn two_ranks_reduce_gather_and_broadcast_over_gloo() {
        let port = free_port();
        let rank = |rank: usize| {
            std::thread::spawn(move || {
                let r = Rendezvous {
                    rank,
                    world_size: 2,
                    local_rank: rank,
                    master_addr: "127.0.0.1".into(),
                    master_port: port,
                };
                let g = ProcessGroup::gloo(&r, Duration::from_secs(60)).unwrap();
                let mut v = [rank as f64 + 1.0, 10.0];
                g.all_reduce_f64(&mut v).unwrap();
                // Four tensors in three buckets; the transposed one is not contiguous (and goes
                // alone, as a gradient with a parameter's strides can).
                let mut ts = vec![
                    Tensor::from_slice(&[rank as f32; 3]),
                    Tensor::from_slice(&[1.0f32, 2.0]).view([2, 1]),
                    Tensor::from_slice(&[rank as f64]),
                    Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0]).view([2, 2]).tr(),
                ];
                assert!(!ts[3].is_contiguous());
                g.all_reduce_buckets(&mut ts, 16).unwrap();
                let got: Vec<Vec<f64>> =
                    ts.iter().map(|t| Vec::try_from(t.to_kind(Kind::Double).reshape(-1)).unwrap()).collect();
                let bytes = g.all_gather_bytes(&vec![b'a' + rank as u8; rank + 1]).unwrap();
                let mut b = Tensor::from_slice(&[rank as i64 * 7]);
                g.broadcast(&mut b, 1).unwrap();
                g.barrier().unwrap();
                (v, got, bytes, b.int64_value(&[0]))
            })
        };
        let (a, b) = (rank(0), rank(1));
        for (v, got, bytes, root) in [a.join().unwrap(), b.join().unwrap()] {
            assert_eq!(v, [3.0, 20.0]);
            assert_eq!(got, vec![vec![1.0; 3], vec![2.0, 4.0], vec![1.0], vec![2.0, 6.0, 4.0, 8.0]]);
            assert_eq!(bytes, vec![b"a".to_vec(), b"bb".to_vec()]);
            assert_eq!(root, 7);
        }
    }

    #[test]
    fn nccl_without_a_gpu_is_an_error_not_a_crash() {
        if tch::Cuda::is_available() {
            return;
        }
        let r = Rendezvous {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: free_port(),
        };
        let err = ProcessGroup::new(&r, Backend::Nccl, Duration::from_secs(5)).err().expect("no GPU: must fail");
        let msg = err.to_string();
        println!("{msg}");
        assert!(msg.contains("GPU") || msg.contains("no NCCL"), "{msg}");
    }

    #[test]
    fn a_missing_peer_ends_the_rendezvous_with_an_error() {
        let r = Rendezvous {
            rank: 0,
            world_size: 2,
            local_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: free_port(),
        };
        let t0 = std::time::Instant::now();
        let err = ProcessGroup::gloo(&r, Duration::from_secs(2)).err().expect("no peer: must fail");
        assert!(t0.elapsed() < Duration::from_secs(30), "took {:?}", t0.elapsed());
        assert!(err.to_string().starts_with("rendezvous: "), "{err}");
    }
}
