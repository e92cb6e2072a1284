//! The Llama family decoder: Llama 2/3 (GQA, Llama-3 RoPE scaling), SmolLM2 (tied
//! embeddings), Qwen2/Qwen2.5 (q/k/v bias) and Qwen3 (per-head q/k RMSNorm).
//!
//! Parameters carry transformers' names (`model.layers.N.self_attn.q_proj.weight`, ...), the
//! attention is libtorch's SDPA with an explicit boolean mask (so left-padded ragged batches and
//! KV-cache "holes" are handled by one code path), and the KV cache is preallocated and written
//! in place rather than concatenated every step.
use crate::config::{DecoderConfig, RopeScaling};
use crate::layers::{Linear, LoraConfig, Mode, RmsNorm};
use tch::nn::{Init, Path};
use tch::{Kind, Tensor};

#[derive(Debug)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    n_heads: i64,
    n_kv: i64,
    head_dim: i64,
}

#[derive(Debug)]
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

#[derive(Debug)]
struct Block {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

/// Per-layer key/value buffers of shape [B, n_kv, capacity, head_dim], filled up to `len`.
#[derive(Debug)]
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    pub len: i64,
}

/// A cache buffer shaped `shape` like `like`, uninitialised: every slot is written before it
/// is read (see [`KvCache::clear_block`]), and zero-filling the whole capacity on each growth
/// cost a 1.5 GB memset per doubling at 32 rows. The engine's unit tests fill it with NaN
/// instead, so a slot read before it is written fails them.
fn buffer(shape: [i64; 4], like: &Tensor) -> Tensor {
    if cfg!(test) {
        Tensor::full(shape, f64::NAN, (like.kind(), like.device()))
    } else {
        Tensor::empty(shape, (like.kind(), like.device()))
    }
}

impl KvCache {
    pub fn new() -> KvCache {
        KvCache { k: vec![], v: vec![], len: 0 }
    }

    fn capacity(&self) -> i64 {
        self.k.first().map_or(0, |t| t.size()[2])
    }

    /// Makes room for `extra` more positions, doubling so appends stay amortised O(1). Only
    /// the `len` positions in use are copied; the new slots start uninitialised ([`buffer`]).
    fn reserve(&mut self, extra: i64, like: &Tensor, n_layers: usize) {
        let need = self.len + extra;
        if need <= self.capacity() && !self.k.is_empty() {
            return;
        }
        let (b, h, _, d) = like.size4().unwrap();
        let cap = need.max(2 * self.capacity()).max(64);
        let len = self.len;
        let grow = |old: &Tensor| {
            let t = buffer([b, h, cap, d], like);
            if len > 0 {
                t.narrow(2, 0, len).copy_(&old.narrow(2, 0, len));
            }
            t
        };
        if self.k.is_empty() {
            self.k = (0..n_layers).map(|_| buffer([b, h, cap, d], like)).collect();
            self.v = (0..n_layers).map(|_| buffer([b, h, cap, d], like)).collect();
        } else {
            self.k = self.k.iter().map(grow).collect();
            self.v = self.v.iter().map(grow).collect();
        }
    }

    /// Keeps only the given batch rows, in that order (moves fed rows to the computed front).
    /// Copies the `len` positions in use, not the whole capacity: with the capacity doubling,
    /// a GRPO rollout's ~9 reorders per step copied ~1.7x the bytes they needed (1.25 s of a
    /// 17 s rollout on SmolLM2, 32 rows, 2 cores).
    pub fn select_rows(&mut self, rows: &Tensor) {
        let (n, len) = (rows.size()[0], self.len);
        let pick = |t: &Tensor| {
            let (_, h, cap, d) = t.size4().unwrap();
            let out = buffer([n, h, cap, d], t);
            // libtorch writes into a correctly shaped `out` view in place (checked on CPU); the
            // copy covers a backend that would hand back a new tensor instead (not run on CUDA).
            let mut used = out.narrow(2, 0, len);
            let got = t.narrow(2, 0, len).index_select_out(&used, 0, rows);
            if got.data_ptr() != used.data_ptr() {
                used.copy_(&got);
            }
            out
        };
        self.k = self.k.iter().map(pick).collect();
        self.v = self.v.iter().map(pick).collect();
    }

    /// Copies batch rows `src[i]` into rows `dst[i]`, positions `first..len`.
    pub fn copy_rows(&mut self, src: &Tensor, dst: &Tensor, first: i64) {
        let len = self.len;
        for x in self.k.iter_mut().chain(self.v.iter_mut()) {
            let mut used = x.narrow(2, first, len - first);
            let rows = used.index_select(0, src);
            let _ = used.index_copy_(0, dst, &rows);
        }
    }

    /// Zeroes positions `pos .. pos + t` of the rows from `first` on: a feed that runs only
    /// the first rows leaves those slots unwritten, and attention later reads them (masked:
    /// zeros, not garbage, since a masked score is still computed before the mask applies).
    pub fn clear_block(&mut self, first: i64, pos: i64, t: i64) {
        for x in self.k.iter().chain(&self.v) {
            let rows = x.size()[0] - first;
            if rows > 0 {
                let _ = x.narrow(0, first, rows).narrow(2, pos, t).zero_();
            }
        }
    }

    /// The first `rows` batch rows as views sharing this cache's buffers (writes land here), for
    /// a forward pass over part of the batch. Reserve room first: a view cannot grow.
    pub fn front_rows(&self, rows: i64) -> KvCache {
        let view = |t: &Tensor| t.narrow(0, 0, rows);
        KvCache { k: self.k.iter().map(view).collect(), v: self.v.iter().map(view).collect(), len: self.len }
    }
}

impl Default for KvCache {
    fn default() -> Self {
        Self::new()
    }
}

/// Keys and values of prompt prefixes, per layer [U, n_kv, P, head_dim] (post-RoPE), recorded by
/// [`DecoderLm::forward_prefix`] with autograd intact, so rows that share a prefix can attend to
/// one computation of it (training on G samples of a prompt runs the prompt once, not G times).
pub struct PrefixKv {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl PrefixKv {
    /// Backward GEMM passes the prefix's forward costs (see [`crate::flops`]).
    pub fn backward_passes(&self, lm: &DecoderLm) -> u32 {
        self.k.first().map_or(0, |k| lm.backward_passes(k))
    }
}

/// What one attention layer does with its keys and values.
enum LayerKv<'a> {
    None,
    /// Write them into the cache buffers at `pos`, attend to everything cached.
    Cache(&'a mut Tensor, &'a mut Tensor, i64),
    /// Keep them (for a prefix).
    Record(&'a mut Vec<Tensor>, &'a mut Vec<Tensor>),
    /// Attend to these prefix keys/values (already one row per batch row) before our own.
    Prefix(&'a Tensor, &'a Tensor),
}

/// The real tokens of a right-padded [B, T] batch, as flat indices into its B·T slots, so the
/// projections, MLPs and norms run on those N tokens only. Ragged rows (GRPO samples stop at
/// different lengths) otherwise spend a quarter of every training forward and backward on
/// padding. Attention runs on the padded [B, T] layout, except for a generation feed on CPU,
/// where it runs row by row on the real tokens too ([`Attention::attend_rows`]).
pub struct Packing {
    index: Tensor,
    b: i64,
    t: i64,
    /// Row r's real tokens: columns `spans[r].0 .. spans[r].0 + spans[r].1` of the batch.
    spans: Vec<(i64, i64)>,
}

impl Packing {
    /// Rows of `lens[r]` real tokens, left-aligned in a batch `t` wide (scoring).
    pub fn new(lens: &[usize], t: usize, device: tch::Device) -> Packing {
        Packing::spans(lens, t, device, |_| 0)
    }

    /// Rows of `lens[r]` real tokens, right-aligned in a batch `t` wide (a generation feed).
    pub fn right_aligned(lens: &[usize], t: usize, device: tch::Device) -> Packing {
        Packing::spans(lens, t, device, |n| t - n)
    }

    /// Row r's real tokens at columns `start(lens[r])..start(lens[r]) + lens[r]`, packed row by row.
    fn spans(lens: &[usize], t: usize, device: tch::Device, start: impl Fn(usize) -> usize) -> Packing {
        let index: Vec<i64> = lens
            .iter()
            .enumerate()
            .flat_map(|(r, &n)| (start(n)..start(n) + n).map(move |j| (r * t + j) as i64))
            .collect();
        let spans = lens.iter().map(|&n| (start(n) as i64, n as i64)).collect();
        Packing { index: Tensor::from_slice(&index).to_device(device), b: lens.len() as i64, t: t as i64, spans }
    }

    /// Whether attention runs row by row on the real tokens rather than on the padded layout:
    /// for a generation feed (`cached`) on CPU. The layers' RoPE tables and their attention
    /// both ask this, so they agree on the layout. On CPU the padded layout costs FLOPs: a feed of observations
    /// whose longest block is 151 tokens ran 24 × 151 query rows for 309 real tokens (1.9 s of
    /// a 17 s GRPO rollout on SmolLM2). On CUDA those FLOPs are cheap and B kernel launches per
    /// layer are not. Scoring keeps the padded layout on CPU too: row by row, GRPO's update
    /// went 4.66 → 4.45 s per step but Knowledgeable-R1's 11.4 → 12.7 s (its rows differ little
    /// in length, and every row adds autograd nodes).
    fn per_row(&self, cached: bool) -> bool {
        cached && self.index.device() == tch::Device::Cpu
    }

    /// Per-slot rows [B, 1, T, W] (RoPE's cos/sin) → the real tokens' [N, 1, W].
    fn pack_slots(&self, y: &Tensor) -> Tensor {
        let w = *y.size().last().unwrap();
        y.reshape([self.b * self.t, w]).index_select(0, &self.index).unsqueeze(1)
    }

    /// [N, W] real-token rows → [B, T, W], zeros in the padding.
    fn unpack(&self, y: &Tensor) -> Tensor {
        let w = y.size()[1];
        Tensor::zeros([self.b * self.t, w], (y.kind(), y.device()))
            .index_copy(0, &self.index, y)
            .view([self.b, self.t, w])
    }

    /// [B, T, W] → [N, W].
    fn pack(&self, y: &Tensor) -> Tensor {
        let w = y.size()[2];
        y.reshape([self.b * self.t, w]).index_select(0, &self.index)
    }
}

/// What the whole stack does with keys and values (one [`LayerKv`] per layer).
enum ModelKv<'a> {
    None,
    Cache(&'a mut KvCache, i64),
    Record(&'a mut PrefixKv),
    Prefix(&'a [Tensor], &'a [Tensor]),
}

/// rotate_half(x) = [-x2, x1]: transformers' (non-interleaved) RoPE convention.
fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size()[x.dim() - 1] / 2;
    Tensor::cat(&[-x.narrow(-1, half, half), x.narrow(-1, 0, half)], -1)
}

/// The dtype attention runs in for activations `x`: f32 on CPU for 16-bit models, else x's.
fn attention_kind(x: &Tensor) -> Kind {
    match (x.device(), x.kind()) {
        (tch::Device::Cpu, Kind::BFloat16 | Kind::Half) => Kind::Float,
        (_, k) => k,
    }
}

fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    x * cos + rotate_half(x) * sin
}

/// Inverse frequencies θ^(-2i/d), with Llama-3's wavelength-dependent scaling when configured
/// (transformers' `_compute_llama3_parameters`).
pub fn rope_inv_freq(cfg: &DecoderConfig) -> Vec<f32> {
    let d = cfg.head_dim;
    let base: Vec<f64> = (0..d / 2)
        .map(|i| {
            let e = ((2 * i) as f32 / d as f32) as f64;
            1.0 / cfg.rope_theta.powf(e)
        })
        .collect();
    match cfg.rope_scaling {
        RopeScaling::None => base.iter().map(|&f| f as f32).collect(),
        RopeScaling::Linear { factor } => base.iter().map(|&f| (f / factor) as f32).collect(),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings: old } => {
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let scaled = if wavelen > low_wavelen { f / factor } else { f };
                    if wavelen < high_wavelen || wavelen > low_wavelen {
                        scaled as f32
                    } else {
                        let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        ((1.0 - smooth) * scaled / factor + smooth * scaled) as f32
                    }
                })
                .collect()
        }
    }
}

impl Attention {
    fn new(p: &Path, cfg: &DecoderConfig, lora: Option<&LoraConfig>, random: bool) -> Attention {
        let (d, hd) = (cfg.hidden_size, cfg.head_dim);
        let (nh, nkv) = (cfg.num_heads, cfg.num_kv_heads);
        let b = cfg.attention_bias;
        Attention {
            q_proj: Linear::new(p, "q_proj", (d, nh * hd), b, lora, random),
            k_proj: Linear::new(p, "k_proj", (d, nkv * hd), b, lora, random),
            v_proj: Linear::new(p, "v_proj", (d, nkv * hd), b, lora, random),
            o_proj: Linear::new(p, "o_proj", (nh * hd, d), false, lora, random),
            q_norm: cfg.qk_norm.then(|| RmsNorm::new(&(p / "q_norm"), hd, cfg.rms_norm_eps)),
            k_norm: cfg.qk_norm.then(|| RmsNorm::new(&(p / "k_norm"), hd, cfg.rms_norm_eps)),
            n_heads: nh,
            n_kv: nkv,
            head_dim: hd,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
        kv: LayerKv,
        packing: Option<&Packing>,
        mode: Mode,
    ) -> Tensor {
        let (b, t) = packing.map_or_else(|| (x.size()[0], x.size()[1]), |p| (p.b, p.t));
        let heads = |y: Tensor, n: i64, norm: &Option<RmsNorm>| {
            let y = match packing {
                Some(p) => p.unpack(&y),
                None => y,
            };
            let y = y.view([b, t, n, self.head_dim]);
            let y = match norm {
                Some(nm) => nm.forward(&y),
                None => y,
            };
            y.transpose(1, 2)
        };
        let (q, k, v) = (self.q_proj.forward(x, mode), self.k_proj.forward(x, mode), self.v_proj.forward(x, mode));
        if let (Some(p), LayerKv::Cache(ck, cv, pos)) = (packing.filter(|p| p.per_row(true)), &kv) {
            // A packed decode step (one new token in some cache rows: the others repeat a row that
            // runs, or take no token): the one-pass kernel on the rows that run. The new slot of
            // every other row is zeroed (the kernel still reads a masked key); with q/k norms the
            // kernel does not apply and the row-by-row path below never reads those slots.
            if p.t == 1 && self.q_norm.is_none() {
                let rows: Vec<usize> = p.spans.iter().enumerate().filter(|(_, s)| s.1 > 0).map(|(r, _)| r).collect();
                if rows.len() < p.b as usize {
                    for x in [ck, cv] {
                        let _ = x.narrow(2, *pos, 1).zero_();
                    }
                }
                if let Some(y) = self.decode_step(&q, &k, &v, cos, sin, mask, (ck, cv, *pos), Some(&rows)) {
                    return self.o_proj.forward(&y.view([rows.len() as i64, -1]), mode);
                }
            }
            let y = self.attend_rows(q, k, v, cos, sin, mask, (ck, cv, *pos), p);
            return self.o_proj.forward(&y.to_kind(x.kind()), mode);
        }
        // A decode step (one new token per row, f32 on CPU, no autograd) in one pass.
        if let (LayerKv::Cache(ck, cv, pos), None, 1) = (&kv, packing, t) {
            if let Some(y) = self.decode_step(&q, &k, &v, cos, sin, mask, (ck, cv, *pos), None) {
                return self.o_proj.forward(&y, mode);
            }
        }
        let q = heads(q, self.n_heads, &self.q_norm);
        let k = heads(k, self.n_kv, &self.k_norm);
        let v = heads(v, self.n_kv, &None);
        let q = apply_rope(&q, cos, sin);
        let k = apply_rope(&k, cos, sin);
        // libtorch's CPU flash-attention kernel is ~5x slower in bf16 than in f32 at decode
        // shapes, so on CPU attention (and the cache) runs in f32; the projections stay bf16.
        let attn_kind = attention_kind(x);
        let (q, k, v) = (q.to_kind(attn_kind), k.to_kind(attn_kind), v.to_kind(attn_kind));
        let (k, v) = match kv {
            LayerKv::Cache(ck, cv, pos) => {
                ck.narrow(2, pos, t).copy_(&k);
                cv.narrow(2, pos, t).copy_(&v);
                (ck.narrow(2, 0, pos + t), cv.narrow(2, 0, pos + t))
            }
            LayerKv::Record(rk, rv) => {
                rk.push(k.shallow_clone());
                rv.push(v.shallow_clone());
                (k, v)
            }
            LayerKv::Prefix(pk, pv) => (Tensor::cat(&[pk, &k], 2), Tensor::cat(&[pv, &v], 2)),
            LayerKv::None => (k, v),
        };
        let y = attend(&q, &k, &v, mask).to_kind(x.kind());
        let y = match packing {
            Some(p) => p.pack(&y),
            None => y,
        };
        self.o_proj.forward(&y, mode)
    }

    /// One new token in each of n rows through the one-pass decode kernel: q, k, v [n, ·]
    /// or [n, 1, ·], cos/sin of n rows, the cache rows `rows` names (all, in order, for `None`).
    /// Returns [n, 1, heads·head_dim]; `None` where the kernel does not apply (q/k norms, not
    /// f32 on CPU, autograd), and the caller runs libtorch's path.
    #[allow(clippy::too_many_arguments)]
    fn decode_step(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
        (ck, cv, pos): (&Tensor, &Tensor, i64),
        rows: Option<&[usize]>,
    ) -> Option<Tensor> {
        if self.q_norm.is_some() {
            return None;
        }
        let (n, d, kv) = (q.size()[0], self.head_dim, self.n_kv * self.head_dim);
        let (q, k, v) = (q.view([n, 1, -1]), k.view([n, 1, kv]), v.view([n, 1, kv]));
        let (cos, sin) = (cos.view([n, 1, 1, d]), sin.view([n, 1, 1, d]));
        crate::kernels::decode_attention::attend(&crate::kernels::decode_attention::DecodeStep {
            q: &q,
            k: &k,
            v: &v,
            cos: &cos,
            sin: &sin,
            cache_k: ck,
            cache_v: cv,
            pos,
            mask,
            n_heads: self.n_heads,
            n_kv: self.n_kv,
            head_dim: d,
            rows,
        })
    }

    /// A generation feed's attention one row at a time ([`Packing::per_row`]): row r's real
    /// queries against its cache row (its new tokens written into it first, in the padded
    /// layout the cache keeps) under its rows of `mask`, so no padded query is computed.
    /// `q`, `k`, `v`: [N, width] in packing order; `cos`, `sin`: [N, 1, head_dim]
    /// ([`Packing::pack_slots`]). Returns [N, heads·head_dim].
    #[allow(clippy::too_many_arguments)]
    fn attend_rows(
        &self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
        (ck, cv, pos): (&Tensor, &Tensor, i64),
        p: &Packing,
    ) -> Tensor {
        let (n, d) = (q.size()[0], self.head_dim);
        let split = |y: Tensor, heads: i64, norm: &Option<RmsNorm>| {
            let y = y.view([n, heads, d]);
            norm.as_ref().map_or(y.shallow_clone(), |nm| nm.forward(&y))
        };
        let q = apply_rope(&split(q, self.n_heads, &self.q_norm), cos, sin);
        let k = apply_rope(&split(k, self.n_kv, &self.k_norm), cos, sin);
        let v = split(v, self.n_kv, &None);
        let kind = attention_kind(&q);
        let (q, k, v) = (q.to_kind(kind), k.to_kind(kind), v.to_kind(kind));
        let padded =
            |y: &Tensor| p.unpack(&y.reshape([n, self.n_kv * d])).view([p.b, p.t, self.n_kv, d]).transpose(1, 2);
        ck.narrow(2, pos, p.t).copy_(&padded(&k));
        cv.narrow(2, pos, p.t).copy_(&padded(&v));
        let (keys, values) = (ck.narrow(2, 0, pos + p.t), cv.narrow(2, 0, pos + p.t));
        let mut rows = vec![];
        let mut off = 0;
        for (r, &(start, len)) in p.spans.iter().enumerate() {
            if len == 0 {
                continue;
            }
            let r = r as i64;
            let qr = q.narrow(0, off, len).transpose(0, 1).unsqueeze(0); // [1, heads, len, d]
            let m = mask.narrow(0, r, 1).narrow(2, start, len);
            let (kr, vr) = (keys.narrow(0, r, 1), values.narrow(0, r, 1));
            rows.push(attend(&qr, &kr, &vr, &m).reshape([len, self.n_heads * d]));
            off += len;
        }
        Tensor::cat(&rows, 0) // a packed feed has a row with tokens (`feed` skips empty ones)
    }
}

/// softmax(q·kᵀ/√d, masked)·v for q [b, nh, t, d], k and v [b, nkv, keys, d] (GQA) under the
/// boolean `mask` [b, 1, t, keys], as [b, t, nh·d] (heads concatenated for o_proj). Outside
/// autograd on CPU (observation feeds, π_old, evaluation, BRIDGE's candidates) the engine's
/// kernel runs it: libtorch's flash attention runs small MKL products there.
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Tensor {
    crate::kernels::prefill_attention::attend(q, k, v, mask).unwrap_or_else(|| {
        let (b, nh, t, d) = q.size4().expect("attention: q is [b, heads, t, d]");
        Tensor::scaled_dot_product_attention(q, k, v, Some(mask), 0.0, false, None, true).transpose(1, 2).reshape([
            b,
            t,
            nh * d,
        ])
    })
}

impl Mlp {
    fn new(p: &Path, cfg: &DecoderConfig, lora: Option<&LoraConfig>, random: bool) -> Mlp {
        let (d, f, b) = (cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias);
        Mlp {
            gate_proj: Linear::new(p, "gate_proj", (d, f), b, lora, random),
            up_proj: Linear::new(p, "up_proj", (d, f), b, lora, random),
            down_proj: Linear::new(p, "down_proj", (f, d), b, lora, random),
        }
    }
    fn forward(&self, x: &Tensor, mode: Mode) -> Tensor {
        let h = self.gate_proj.forward(x, mode).silu() * self.up_proj.forward(x, mode);
        self.down_proj.forward(&h, mode)
    }
}

#[derive(Debug)]
pub struct DecoderLm {
    pub cfg: DecoderConfig,
    embed_tokens: Tensor,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    inv_freq: Tensor,
    /// Open [`MergedAdapters`] scopes: the first merges every adapter, the last unmerges.
    merge_scopes: std::sync::atomic::AtomicUsize,
}

/// While alive, inference forwards of the model run on LoRA-merged weights (see
/// [`Linear::merge_adapter`]); made by [`DecoderLm::merged_adapters`]. Scopes nest.
pub struct MergedAdapters<'a> {
    lm: &'a DecoderLm,
}

impl Drop for MergedAdapters<'_> {
    fn drop(&mut self) {
        if self.lm.merge_scopes.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            self.lm.linears().for_each(Linear::unmerge_adapter);
        }
    }
}

impl DecoderLm {
    /// Builds the module tree under `root` (a VarStore root; its kind and device are used).
    pub fn new(root: &Path, cfg: &DecoderConfig, lora: Option<&LoraConfig>, random: bool) -> DecoderLm {
        let m = root / "model";
        let embed_init =
            if random { Init::Randn { mean: 0.0, stdev: crate::layers::INIT_STD } } else { Init::Const(0.0) };
        let embed_tokens = (&m / "embed_tokens").var("weight", &[cfg.vocab_size, cfg.hidden_size], embed_init);
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let p = &m / "layers" / i;
                Block {
                    input_layernorm: RmsNorm::new(&(&p / "input_layernorm"), cfg.hidden_size, cfg.rms_norm_eps),
                    self_attn: Attention::new(&(&p / "self_attn"), cfg, lora, random),
                    post_attention_layernorm: RmsNorm::new(
                        &(&p / "post_attention_layernorm"),
                        cfg.hidden_size,
                        cfg.rms_norm_eps,
                    ),
                    mlp: Mlp::new(&(&p / "mlp"), cfg, lora, random),
                }
            })
            .collect();
        let norm = RmsNorm::new(&(&m / "norm"), cfg.hidden_size, cfg.rms_norm_eps);
        // The output head is never LoRA-adapted (PEFT leaves lm_head alone by default).
        let lm_head = (!cfg.tie_word_embeddings)
            .then(|| Linear::new(root, "lm_head", (cfg.hidden_size, cfg.vocab_size), false, None, random));
        let inv_freq = Tensor::from_slice(&rope_inv_freq(cfg)).to_device(root.device());
        DecoderLm { cfg: cfg.clone(), embed_tokens, layers, norm, lm_head, inv_freq, merge_scopes: Default::default() }
    }

    /// Opens a scope in which forwards that need no gradient use W + scale·B·A for every
    /// LoRA-adapted f32 weight: one product per projection instead of three. The weights are
    /// those of the moment the first scope opens, so no optimiser step may fall inside one
    /// (a decode session is one; the trainer steps after its rollout's session is gone). Costs
    /// one copy of the adapted weights while open.
    pub fn merged_adapters(&self) -> MergedAdapters<'_> {
        if self.merge_scopes.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            self.linears().for_each(Linear::merge_adapter);
        }
        MergedAdapters { lm: self }
    }

    /// Every projection of every block.
    fn linears(&self) -> impl Iterator<Item = &Linear> {
        self.layers.iter().flat_map(|l| {
            let (a, m) = (&l.self_attn, &l.mlp);
            [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj, &m.gate_proj, &m.up_proj, &m.down_proj]
        })
    }

    pub fn device(&self) -> tch::Device {
        self.embed_tokens.device()
    }

    pub fn kind(&self) -> Kind {
        self.embed_tokens.kind()
    }

    /// Final hidden states [B, T, D] for `ids` [B, T] at `positions` [B, T] (RoPE positions,
    /// i.e. the count of real tokens before each one). `mask` [B, 1, T, T_keys] is true where a
    /// query may attend to a key; with a cache, keys are all cached positions plus these T.
    pub fn forward_hidden(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        cache: Option<&mut KvCache>,
        mode: Mode,
    ) -> Tensor {
        self.forward_cached(ids, positions, mask, cache, None, mode)
    }

    /// [`Self::forward_hidden`] with a cache, computing only the real tokens `packing` names
    /// (a ragged feed: observations of different lengths, rows that take no tokens): the
    /// projections and MLPs skip the padding, and so does attention on CPU ([`Packing`]).
    /// Returns the hidden states [N, D] of those tokens, in `packing`'s order.
    pub fn forward_cached_packed(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        cache: &mut KvCache,
        packing: &Packing,
        mode: Mode,
    ) -> Tensor {
        self.forward_cached(ids, positions, mask, Some(cache), Some(packing), mode)
    }

    /// Both of the above: grows the cache, runs the layers, advances the cache's length.
    fn forward_cached(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        cache: Option<&mut KvCache>,
        packing: Option<&Packing>,
        mode: Mode,
    ) -> Tensor {
        let Some(c) = cache else {
            return self.run_layers(ids, positions, mask, mode, ModelKv::None, packing);
        };
        let (b, t) = ids.size2().unwrap();
        self.reserve_cache(c, b, t);
        let pos = c.len;
        let h = self.run_layers(ids, positions, mask, mode, ModelKv::Cache(c, pos), packing);
        c.len += t;
        h
    }

    /// Makes room in `cache` (a batch of `rows`) for `extra` more positions.
    pub fn reserve_cache(&self, cache: &mut KvCache, rows: i64, extra: i64) {
        let like = Tensor::empty(
            [rows, self.cfg.num_kv_heads, 1, self.cfg.head_dim],
            (attention_kind(&self.embed_tokens), self.device()),
        );
        cache.reserve(extra, &like, self.layers.len());
    }

    /// Runs prefixes `ids` [U, P] (right-padded, `mask` [U, 1, P, P]) and returns their keys and
    /// values and their final hidden states [U, P, D] (the ones that predict response tokens
    /// inside a prefix); gradients flow back through both.
    pub fn forward_prefix(&self, ids: &Tensor, positions: &Tensor, mask: &Tensor, mode: Mode) -> (PrefixKv, Tensor) {
        let mut prefix = PrefixKv { k: vec![], v: vec![] };
        let hidden = self.run_layers(ids, positions, mask, mode, ModelKv::Record(&mut prefix), None);
        (prefix, hidden)
    }

    /// Final hidden states [N, D] of the real tokens `packing` names in `ids` [B, T] (no cache):
    /// [`Self::forward_hidden`] without computing the padding.
    pub fn forward_packed(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        packing: &Packing,
        mode: Mode,
    ) -> Tensor {
        self.run_layers(ids, positions, mask, mode, ModelKv::None, Some(packing))
    }

    /// Hidden states [N, D] of the real tokens (`packing`) of continuations `ids` [B, T]: row r
    /// attends to prefix row `rows[r]` and then causally to its own tokens; `mask`
    /// [B, 1, T, P + T] covers both.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_after_prefix(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        prefix: &PrefixKv,
        rows: &Tensor,
        packing: &Packing,
        mode: Mode,
    ) -> Tensor {
        let k: Vec<Tensor> = prefix.k.iter().map(|t| t.index_select(0, rows)).collect();
        let v: Vec<Tensor> = prefix.v.iter().map(|t| t.index_select(0, rows)).collect();
        self.run_layers(ids, positions, mask, mode, ModelKv::Prefix(&k, &v), Some(packing))
    }

    // `x += h` on a tch Tensor is in place and would overwrite a tensor autograd saved for
    // the backward pass; the residual adds must allocate.
    #[allow(clippy::assign_op_pattern)]
    fn run_layers(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        mode: Mode,
        mut kv: ModelKv,
        packing: Option<&Packing>,
    ) -> Tensor {
        let ids = packing.map_or_else(|| ids.shallow_clone(), |p| ids.reshape([-1]).index_select(0, &p.index));
        let mut x = Tensor::embedding(&self.embed_tokens, &ids, -1, false, false);
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * &self.inv_freq;
        let emb = Tensor::cat(&[&freqs, &freqs], -1).unsqueeze(1);
        let (cos, sin) = (emb.cos().to_kind(x.kind()), emb.sin().to_kind(x.kind()));
        // Row-by-row attention (a generation feed on CPU) rotates the real tokens only.
        let (cos, sin) = match packing {
            Some(p) if p.per_row(matches!(kv, ModelKv::Cache(..))) => (p.pack_slots(&cos), p.pack_slots(&sin)),
            _ => (cos, sin),
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let h = layer.input_layernorm.forward(&x);
            let layer_kv = match &mut kv {
                ModelKv::None => LayerKv::None,
                ModelKv::Cache(c, pos) => LayerKv::Cache(&mut c.k[i], &mut c.v[i], *pos),
                ModelKv::Record(p) => LayerKv::Record(&mut p.k, &mut p.v),
                ModelKv::Prefix(k, v) => LayerKv::Prefix(&k[i], &v[i]),
            };
            let h = layer.self_attn.forward(&h, &cos, &sin, mask, layer_kv, packing, mode);
            x = x + h;
            let h = layer.mlp.forward(&layer.post_attention_layernorm.forward(&x), mode);
            x = x + h;
        }
        let (layers, passes) = (self.layers.len(), self.backward_passes(&x));
        let weights = crate::flops::forward(ids.numel() as i64, self.layer_macs() * layers as f64, passes);
        crate::flops::add_weights(weights);
        // The roofline's bytes: every block weight, read again by the backward's activation
        // gradients, and the K/V of each key some query of a row sees (read once per row and
        // layer; the backward's re-reads are not counted: a lower bound).
        let size = self.embed_tokens.kind().elt_size_in_bytes() as f64;
        let mut bytes = self.layer_macs() * layers as f64 * size * (1 + passes) as f64;
        let mut attention = 0.0;
        if mask.device() == tch::Device::Cpu {
            // (query, visible key) pairs of the real queries: padding query rows are dropped.
            let k = *mask.size().last().unwrap_or(&0);
            let rows = mask.reshape([-1, k]);
            let rows = packing.map_or(rows.shallow_clone(), |p| rows.index_select(0, &p.index));
            let pairs = rows.sum(Kind::Int64).int64_value(&[]);
            let width = self.cfg.num_heads * self.cfg.head_dim;
            attention = crate::flops::attention_products(pairs, layers, width, x.requires_grad());
            crate::flops::add_attention(attention);
            if crate::flops::roofline_on() {
                // Keys some real query of a row sees (a packed pass's padding queries see themselves).
                let q = mask.size()[mask.dim() - 2];
                let seen = match packing {
                    Some(p) => {
                        let row_of = p.index.divide_scalar_mode(q, "floor");
                        let hits = Tensor::zeros([mask.size()[0], k], (Kind::Int64, mask.device()));
                        hits.index_add(0, &row_of, &rows.to_kind(Kind::Int64)).gt(0)
                    }
                    None => mask.reshape([-1, q, k]).any_dim(1, false),
                };
                let keys_seen = seen.sum(Kind::Int64).int64_value(&[]);
                bytes += (keys_seen * 2 * self.cfg.num_kv_heads * self.cfg.head_dim) as f64 * layers as f64 * size;
            }
        }
        crate::flops::add_call(weights + attention, bytes);
        self.norm.forward(&x)
    }

    /// FLOPs of `tokens` tokens through the blocks with `pairs` (query, visible key) attention
    /// pairs per layer and `head_rows` rows through the LM head, as [`crate::flops`] counts them:
    /// the work of rows that sharing skips ([`crate::flops::add_shared`]).
    pub fn forward_flops(&self, tokens: i64, pairs: i64, head_rows: i64, backward_passes: u32) -> f64 {
        let (layers, c) = (self.layers.len(), &self.cfg);
        crate::flops::forward(tokens, self.layer_macs() * layers as f64, backward_passes)
            + crate::flops::attention_products(pairs, layers, c.num_heads * c.head_dim, backward_passes > 0)
            + crate::flops::forward(head_rows, (c.hidden_size * c.vocab_size) as f64, backward_passes)
    }

    /// Multiply-adds per token of one block's projections (q, k, v, o, gate, up, down).
    fn layer_macs(&self) -> f64 {
        let c = &self.cfg;
        let (d, q, kv, i) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size);
        (d * q + 2 * d * kv + q * d + 3 * d * i) as f64
    }

    /// Backward GEMM passes a forward whose output is `out` will cost (see [`crate::flops`]).
    fn backward_passes(&self, out: &Tensor) -> u32 {
        match (out.requires_grad(), self.embed_tokens.requires_grad()) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => 2,
        }
    }

    /// Logits for hidden states [.., D], upcast to float32 when the model runs in 16 bits
    /// (float64 models keep float64: the gradient-parity tests run in double precision).
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        let w = self.head_weight();
        let l = crate::layers::linear(hidden, w, None);
        let rows = hidden.numel() as i64 / self.cfg.hidden_size.max(1);
        let (macs, passes) = ((self.cfg.hidden_size * self.cfg.vocab_size) as f64, self.backward_passes(&l));
        let flops = crate::flops::forward(rows, macs, passes);
        crate::flops::add_weights(flops);
        crate::flops::add_call(flops, macs * w.kind().elt_size_in_bytes() as f64 * (1 + passes) as f64);
        match l.kind() {
            Kind::Double => l,
            _ => l.to_kind(Kind::Float),
        }
    }

    /// ∂L/∂hidden [N, D] from ∂L/∂logits [N, V]: dlogits · W, the head's one backward GEMM when
    /// its weight does not train (a LoRA run's frozen head: PEFT never adapts it). The scorer
    /// runs it ahead of autograd (`score`): oneDNN's backward-data at V-wide rows ran ~50 GFLOP/s
    /// on an AVX2 Zen 2, this product through MKL ~145. `None` when the weight trains or is not
    /// float32 on the CPU: the caller keeps autograd's path.
    pub fn head_input_grad(&self, dlogits: &Tensor) -> Option<Tensor> {
        if !self.head_is_frozen_f32_cpu() || !crate::kernels::f32_cpu(&[dlogits]) || dlogits.dim() != 2 {
            return None;
        }
        let macs = (self.cfg.hidden_size * self.cfg.vocab_size) as f64;
        let flops = crate::flops::forward(dlogits.size()[0], macs, 0);
        crate::flops::add_weights(flops);
        crate::flops::add_call(flops, macs * 4.0);
        Some(dlogits.mm(self.head_weight()))
    }

    /// Whether [`Self::head_input_grad`] applies: the head's weight is frozen float32 on the CPU.
    pub fn head_is_frozen_f32_cpu(&self) -> bool {
        let w = self.head_weight();
        !w.requires_grad() && crate::kernels::f32_cpu(&[w])
    }

    /// The LM head's weight [V, D]: its own, or the embedding when tied.
    fn head_weight(&self) -> &Tensor {
        self.lm_head.as_ref().map_or(&self.embed_tokens, |h| &h.weight)
    }

    /// Every parameter in its exported form: LoRA merged into its base weight, adapter tensors
    /// dropped, names as transformers expects them.
    pub fn merged_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("model.embed_tokens.weight".to_string(), self.embed_tokens.shallow_clone())];
        let lin = |out: &mut Vec<(String, Tensor)>, name: String, l: &Linear| {
            out.push((format!("{name}.weight"), l.merged_weight()));
            if let Some(b) = &l.bias {
                out.push((format!("{name}.bias"), b.shallow_clone()));
            }
        };
        for (i, l) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            out.push((format!("{p}.input_layernorm.weight"), l.input_layernorm.weight.shallow_clone()));
            out.push((
                format!("{p}.post_attention_layernorm.weight"),
                l.post_attention_layernorm.weight.shallow_clone(),
            ));
            let a = &l.self_attn;
            for (n, lin_) in
                [("q_proj", &a.q_proj), ("k_proj", &a.k_proj), ("v_proj", &a.v_proj), ("o_proj", &a.o_proj)]
            {
                lin(&mut out, format!("{p}.self_attn.{n}"), lin_);
            }
            if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
                out.push((format!("{p}.self_attn.q_norm.weight"), qn.weight.shallow_clone()));
                out.push((format!("{p}.self_attn.k_norm.weight"), kn.weight.shallow_clone()));
            }
            let m = &l.mlp;
            for (n, lin_) in [("gate_proj", &m.gate_proj), ("up_proj", &m.up_proj), ("down_proj", &m.down_proj)] {
                lin(&mut out, format!("{p}.mlp.{n}"), lin_);
            }
        }
        out.push(("model.norm.weight".to_string(), self.norm.weight.shallow_clone()));
        if let Some(h) = &self.lm_head {
            out.push(("lm_head.weight".to_string(), h.weight.shallow_clone()));
        }
        out
    }
}
