//! `knowrl bench world-speed`: seconds per RL step of each world config (GRPO,
//! Knowledgeable-R1, AKBE, BRIDGE on the v2 policy with LoRA) against its compute floor: the
//! step's matmul FLOPs (weight GEMMs and attention products of generation, scoring and
//! backward, as computed; `knowrl_engine::flops`) divided by this machine's float32 GEMM rate,
//! measured in the same run. Beside it: the floor of the work with every row computed in full
//! (sharing copies rows that repeat a prompt or a history) and of the weight GEMMs alone, and
//! one decode step's matmuls against libtorch's and against streaming the weights (a decode
//! step's floor is the memory's). Beside the FLOP floor, a roofline floor prices each model call
//! that reads more bytes than the machine streams in its GEMM time at the memory bandwidth
//! (`knowrl_engine::flops`). Writes bench/results/world-v2-speed.json.
use anyhow::{Context, Result};
use knowrl_rl::config::TrainConfig;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::time::Instant;
use tch::{Kind, Tensor};

#[derive(clap::Args)]
pub struct Args {
    /// World training configs to time (each is run for `--steps` steps in a scratch directory).
    #[arg(long, num_args = 1.., default_values = [
        "configs/world-grpo.toml", "configs/world-knowledgeable-r1.toml",
        "configs/world-akbe.toml", "configs/world-bridge.toml"])]
    pub configs: Vec<PathBuf>,
    /// Steps per config; the first is a warm-up and not counted.
    #[arg(long, default_value_t = 3)]
    pub steps: u64,
    /// Threads (libtorch intra-op).
    #[arg(long, default_value_t = 2)]
    pub bench_threads: i32,
    #[arg(long, default_value = "bench/results/world-v2-speed.json")]
    pub out: PathBuf,
    #[command(flatten)]
    pub device: crate::device_args::DeviceArgs,
}

/// The fastest of five timed runs of `run` (seconds), after one untimed warm-up.
fn best_of_five(run: &dyn Fn()) -> f64 {
    run();
    (0..5)
        .map(|_| {
            let t = Instant::now();
            run();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

/// Best-of-five float32 GEMM rate (GFLOP/s) of an [m, k] × [k, n] product through each of
/// libtorch's CPU GEMM libraries: MKL (`matmul`) and oneDNN (a 1×1 convolution,
/// `knowrl_engine::kernels::onednn_linear`; `None` for a shape it declines). On an AMD EPYC with
/// AVX-512, MKL runs its non-Intel kernels at half oneDNN's rate, so a floor priced at MKL's rate
/// alone would be half the machine's.
fn gemm_gflops(m: i64, k: i64, n: i64) -> GemmRate {
    let a = Tensor::randn([m, k], (Kind::Float, tch::Device::Cpu));
    let b = Tensor::randn([k, n], (Kind::Float, tch::Device::Cpu));
    let w = b.tr().contiguous();
    let reps = ((2e9 / (2.0 * (m * k * n) as f64)) as usize).clamp(3, 2000);
    let rate =
        |run: &dyn Fn()| 2.0 * (m * k * n) as f64 * reps as f64 / best_of_five(&|| (0..reps).for_each(|_| run())) / 1e9;
    let mkl = rate(&|| {
        let _ = a.matmul(&b);
    });
    let onednn = knowrl_engine::kernels::onednn_linear::linear_conv(&a, &w, None).map(|_| {
        rate(&|| {
            let _ = knowrl_engine::kernels::onednn_linear::linear_conv(&a, &w, None);
        })
    });
    GemmRate { mkl, onednn }
}

/// One probe's rate through each library (GFLOP/s).
struct GemmRate {
    mkl: f64,
    onednn: Option<f64>,
}

impl GemmRate {
    /// The faster library's: the machine's rate, the floor's.
    fn best(&self) -> f64 {
        self.onednn.unwrap_or(0.0).max(self.mkl)
    }
}

/// One decode step's weight matmuls on SmolLM2-135M's shapes (30 layers of q, k, v, o, gate,
/// up, down, then the 49,152-row LM head: 538 MB of f32) at each of `rows`: best-of-five
/// milliseconds through the engine's decode kernel and through libtorch's matmul, against the
/// time a plain libtorch sum takes to stream the same bytes (the step's memory floor).
fn decode_matmuls(rows: &[i64]) -> Map<String, Value> {
    let f = (Kind::Float, tch::Device::Cpu);
    let layer = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)];
    let mut ws: Vec<Tensor> = (0..30).flat_map(|_| layer.map(|(n, k)| Tensor::randn([n, k], f))).collect();
    ws.push(Tensor::randn([49_152, 576], f));
    let flat = Tensor::cat(&ws.iter().map(|w| w.view([-1])).collect::<Vec<_>>(), 0);
    let bytes = 4.0 * flat.numel() as f64;
    let mut out = Map::new();
    for &m in rows {
        let xs: Vec<Tensor> = ws.iter().map(|w| Tensor::randn([m, w.size()[1]], f)).collect();
        let ours = best_of_five(&|| {
            for (x, w) in xs.iter().zip(&ws) {
                let _ = knowrl_engine::kernels::small_gemm::linear(x, w).unwrap_or_else(|| x.matmul(&w.tr()));
            }
        });
        let libtorch = best_of_five(&|| {
            for (x, w) in xs.iter().zip(&ws) {
                let _ = x.matmul(&w.tr());
            }
        });
        let stream = best_of_five(&|| {
            let _ = flat.sum(Kind::Float).double_value(&[]);
        });
        println!(
            "decode-step matmuls at {m} rows: knowrl {:.1} ms, libtorch {:.1} ms ({:.2}×); streaming the weights {:.1} ms ({:.1} GB/s)",
            ours * 1e3,
            libtorch * 1e3,
            libtorch / ours,
            stream * 1e3,
            bytes / stream / 1e9
        );
        out.insert(
            format!("rows_{m}"),
            json!({"knowrl_ms": ours * 1e3, "libtorch_ms": libtorch * 1e3, "speedup": libtorch / ours,
                   "stream_ms": stream * 1e3, "stream_gb_s": bytes / stream / 1e9,
                   "knowrl_gb_s": bytes / ours / 1e9, "knowrl_gflops": 2.0 * m as f64 * bytes / 4.0 / ours / 1e9}),
        );
    }
    out
}

fn method_name(cfg: &TrainConfig) -> String {
    cfg.method.name()
}

pub fn run(a: Args) -> Result<()> {
    tch::set_num_threads(a.bench_threads);
    anyhow::ensure!(a.steps >= 2, "--steps must be at least 2 (the first is a warm-up)");
    // SmolLM2-135M's shapes: a 512-token prefill/scoring GEMM, and the 32-row one of a decode step.
    // The GEMM rate is probed before the first config and after each one: on a shared VM it
    // moved between 90 and 170 GFLOP/s within one run, so each config's floor divides by the
    // best rate seen on either side of it (the machine's attainable rate then, not a dip).
    // The floor's rate is the faster library's (each probe's both rates go to the JSON).
    let probe = || gemm_gflops(512, 576, 1536);
    let mut probes = vec![probe()];
    let gemm_decode = gemm_gflops(32, 576, 1536).mkl;
    println!(
        "float32 GEMM (512 × 576 × 1536): MKL {:.1} GFLOP/s, oneDNN {:.1} GFLOP/s (knowrl's many-row products: {:?}); {gemm_decode:.1} GFLOP/s at 32 rows",
        probes[0].mkl,
        probes[0].onednn.unwrap_or(f64::NAN),
        knowrl_engine::kernels::onednn_linear::backend()
    );
    // A decode step reads every weight once: at few rows its floor is the memory's, not the GEMM rate.
    let decode = decode_matmuls(&[1, 8, 32]);
    // The memory bandwidth of the roofline: the fastest stream of the weights above.
    let gb_s = decode.values().filter_map(|v| v["stream_gb_s"].as_f64()).fold(0.0, f64::max);
    let (mut seconds, mut ratio, mut roofline_ratio, mut detail) = (Map::new(), Map::new(), Map::new(), Map::new());
    let scratch = std::env::temp_dir().join(format!("knowrl-world-speed-{}", std::process::id()));
    for path in &a.configs {
        let mut cfg = TrainConfig::load(path)?;
        a.device.apply(&mut cfg.model);
        let name = method_name(&cfg);
        cfg.run.steps = a.steps;
        cfg.run.out_dir = scratch.join(&name);
        cfg.run.eval_every = 0;
        cfg.run.checkpoint_every = 0;
        let policy = knowrl_run::load(&cfg)?;
        let tool = knowrl_run::retriever(&cfg)?;
        // Calls under this many FLOPs a byte are memory-bound (the rate probed just before).
        knowrl_engine::flops::set_machine_balance(probes[probes.len() - 1].best() / gb_s);
        let metrics = crate::train::train_with_progress(&policy, &tool, &cfg, false, &name)
            .with_context(|| format!("{}: training", path.display()))?;
        drop(policy);
        probes.push(probe());
        let gemm = probes[probes.len() - 2].best().max(probes[probes.len() - 1].best());
        let timed = &metrics[1..];
        let mean =
            |f: &dyn Fn(&knowrl_rl::method::StepMetrics) -> f64| timed.iter().map(f).sum::<f64>() / timed.len() as f64;
        let s = mean(&|m| m.step_s);
        let extra = |k: &'static str| mean(&|m| m.extra.get(k).copied().unwrap_or(0.0));
        let (computed, shared, attention) = (extra("gemm_flops"), extra("shared_flops"), extra("attention_flops"));
        let seconds_at = |flops: f64| flops / (gemm * 1e9);
        // The floor counts what ran. Sharing (rows repeating a prompt or a history are copied,
        // not computed) lowers it with the step time; the floor of computing every row in full
        // (`work_floor_s`) is reported beside it.
        let (floor, work_floor) = (seconds_at(computed), seconds_at(computed + shared));
        let rollout_floor = seconds_at(extra("rollout_gemm_flops"));
        // The roofline: memory-bound calls (a decode step over few rows) at the bandwidth.
        let roofline_at = |bytes: &'static str, flops: &'static str| {
            let split = knowrl_engine::flops::Snapshot {
                memory_bound_bytes: extra(bytes),
                compute_bound_flops: extra(flops),
                ..Default::default()
            };
            split.roofline_s(gemm, gb_s)
        };
        let roofline = roofline_at("memory_bound_bytes", "compute_bound_flops");
        let rollout_roofline = roofline_at("rollout_memory_bound_bytes", "rollout_compute_bound_flops");
        println!(
            "{name}: {s:.1} s/step, {:.1} GFLOP/step computed ({:.1} with every row in full), floor {floor:.2} s at {gemm:.1} GFLOP/s → {:.2}× the floor ({:.2}× the full work's)",
            computed / 1e9,
            (computed + shared) / 1e9,
            s / floor,
            s / work_floor
        );
        println!(
            "{name}: roofline floor {roofline:.2} s at {gb_s:.1} GB/s for memory-bound calls → {:.2}×",
            s / roofline
        );
        seconds.insert(name.clone(), json!(s));
        ratio.insert(name.clone(), json!(s / floor));
        roofline_ratio.insert(name.clone(), json!(s / roofline));
        detail.insert(
            name,
            json!({
                "config": path, "steps_timed": timed.len(), "gflop_per_step": computed / 1e9,
                "shared_gflop_per_step": shared / 1e9,
                "gemm_gflops": gemm,
                "attention_gflop_per_step": attention / 1e9,
                "weights_only_floor_s": seconds_at(computed - attention),
                "weights_only_floor_ratio": s / seconds_at(computed - attention),
                "floor_s": floor, "work_floor_s": work_floor, "work_floor_ratio": s / work_floor,
                "rollout_s": mean(&|m| m.rollout_s), "rollout_floor_s": rollout_floor,
                "rollout_shared_gflop": extra("rollout_shared_flops") / 1e9,
                "update_s": mean(&|m| m.update_s), "update_floor_s": floor - rollout_floor,
                "roofline_floor_s": roofline, "roofline_ratio": s / roofline,
                "rollout_roofline_s": rollout_roofline, "update_roofline_s": roofline - rollout_roofline,
                "memory_bound_gb_per_step": extra("memory_bound_bytes") / 1e9,
                "response_len": mean(&|m| m.response_len), "tool_calls": mean(&|m| m.tool_calls),
            }),
        );
    }
    let gemm = probes.iter().map(GemmRate::best).fold(0.0, f64::max);
    let _ = std::fs::remove_dir_all(&scratch);
    let out: Value = json!({
        "seconds_per_step": seconds,
        "floor_ratio": ratio,
        "roofline_ratio": roofline_ratio,
        "memory_gb_s": gb_s,
        "gemm_gflops": gemm,
        "gemm_gflops_probes": probes.iter().map(GemmRate::best).collect::<Vec<_>>(),
        "gemm_gflops_probes_by_library": probes.iter().map(|r| json!({"mkl": r.mkl, "onednn": r.onednn})).collect::<Vec<_>>(),
        "gemm_backend": format!("{:?}", knowrl_engine::kernels::onednn_linear::backend()),
        "gemm_gflops_32_rows": gemm_decode,
        "decode_step_matmuls": decode,
        "methods": detail,
        "threads": a.bench_threads,
        "machine": crate::bench_env::machine(),
        "isa": format!("{:?}", knowrl_engine::kernels::vmath::isa()),
        "floor": "matmul FLOPs the step computed (weight GEMMs and attention score/value products of generation \
                  incl. observation prefill, scoring and backward; padding of packed feeds, rows that repeat a prompt \
                  or a history (copied, not computed) and LoRA products and the retriever encoder not counted) / the best \
                  GEMM probe on either side of the config (methods.<m>.gemm_gflops; each probe is the faster of MKL and oneDNN, \
                  gemm_gflops_probes_by_library); gemm_backend: the library knowrl's many-row products ran on; work_floor_s: the same with every \
                  row computed in full (shared_gflop_per_step is the difference); weights_only_floor_s: without the attention products",
        "roofline": "roofline_floor_s: each model call (a forward's blocks, the LM head) priced at the larger of its FLOPs at \
                     the GEMM rate and the bytes it must read (its weights, again for the backward's activation gradients, \
                     and the K/V of each key its rows see) at memory_gb_s, the fastest stream of the weights probed here; \
                     the split is made with the GEMM probe before the config",
    });
    crate::bench_env::write_result(&a.out, &out)?;
    println!("wrote {}", a.out.display());
    Ok(())
}
