//! `knowrl`: train and evaluate retrieval-augmented LLM agents with RL.
//!
//! Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad input (a model directory,
//! config or file that cannot be used; the message names it).
use clap::{Parser, Subcommand};

mod bench;
mod bench_data_parallel;
mod bench_env;
mod bench_gpu;
mod bench_grpo;
mod bench_memory;
mod bench_retrieval;
mod bench_world_speed;
mod demo;
mod device_args;
mod eval;
mod generate;
mod report;
mod reproduce;
mod retrieval;
mod rss;
mod train;
mod world;
mod world_eval;

#[derive(Parser)]
#[command(
    name = "knowrl",
    version,
    about = "Train and evaluate retrieval-augmented LLM agents with RL (Knowledgeable-R1, AKBE, BRIDGE; GRPO/DAPO/GSPO)"
)]
struct Cli {
    /// Intra-op CPU threads for libtorch (default: all cores).
    #[arg(long, global = true)]
    threads: Option<i32>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate from a Hugging Face model directory (batched, KV-cached).
    Generate(generate::Args),
    /// The main job on the embedded default: evaluate the world's policy (S1–S5 and S2p, the agent), then
    /// a short GRPO run with validation agent EM before and after it.
    Demo(demo::Args),
    /// Benchmarks, side by side with the Python peer a user would otherwise pick.
    #[command(subcommand)]
    Bench(bench::Cmd),
    /// Build retrieval indexes.
    #[command(subcommand)]
    Index(retrieval::IndexCmd),
    /// Query an index from the command line.
    Search(retrieval::SearchArgs),
    /// Run services.
    #[command(subcommand)]
    Serve(retrieval::ServeCmd),
    /// Corpus conversions.
    #[command(subcommand)]
    Corpus(retrieval::CorpusCmd),
    /// RL training on the world: GRPO / DAPO / GSPO, Knowledgeable-R1, AKBE (per the config).
    Train(train::Args),
    /// A Markdown report with SVG training curves for a run directory.
    Report(report::Args),
    /// Evaluate a model directory on the world's suites or the real-data samples.
    Eval(eval::Args),
    /// A paper's comparison on the world at an equal budget (benchmark; writes bench/results/).
    #[command(subcommand)]
    Reproduce(reproduce::Cmd),
    /// The synthetic knowledge world (the embedded default).
    #[command(subcommand)]
    World(world::WorldCmd),
}

/// Keeps freed tensor memory in the process instead of returning it to the kernel. glibc serves
/// every allocation over 32 MB (logits, activations) with a fresh mmap, and each first touch of
/// those pages faults: on the 2-core VM that was ~20% of a GRPO step's forward and backward
/// (sys 24 s of 112 s). The heap then stays at its peak, as PyTorch's caching allocators do;
/// PyTorch's CPU tuning guide gets the same effect by preloading jemalloc or tcmalloc.
/// Trimming is off altogether (-1, mallopt(3)): a threshold of `i32::MAX` still gave 2 GB
/// back whenever the free top of the heap grew past it, which an update of several GB does
/// every step, and the next step faulted those pages in again (`clear_page_erms`, 14% of an
/// AKBE step's samples in `perf`).
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before any other thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
    }
}

fn main() {
    let cli = Cli::parse();
    // A long-running retrieval server should give memory back; everything else runs tensors.
    if !matches!(cli.cmd, Cmd::Serve(_)) {
        keep_freed_memory();
    }
    if let Some(n) = cli.threads {
        tch::set_num_threads(n);
    }
    let res = match cli.cmd {
        Cmd::Generate(a) => generate::run(a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Bench(c) => bench::run(c),
        Cmd::Index(retrieval::IndexCmd::Build(a)) => retrieval::build(a),
        Cmd::Search(a) => retrieval::search(a),
        Cmd::Serve(c) => retrieval::serve_cmd(c),
        Cmd::Corpus(c) => retrieval::corpus(c),
        Cmd::World(c) => world::run(c),
        Cmd::Train(a) => train::run(a),
        Cmd::Reproduce(c) => reproduce::run(c),
        Cmd::Eval(a) => eval::run(a),
        Cmd::Report(a) => report::run(a),
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        let bad_input = e.chain().any(|c| {
            matches!(
                c.downcast_ref::<knowrl_engine::EngineError>(),
                Some(
                    knowrl_engine::EngineError::Config { .. }
                        | knowrl_engine::EngineError::Weights { .. }
                        | knowrl_engine::EngineError::Safetensors { .. }
                        | knowrl_engine::EngineError::Tokenizer { .. }
                        | knowrl_engine::EngineError::Io { .. }
                        | knowrl_engine::EngineError::Checksum { .. }
                )
            ) || matches!(
                c.downcast_ref::<knowrl_retrieval::RetrievalError>(),
                Some(
                    knowrl_retrieval::RetrievalError::BadLine { .. }
                        | knowrl_retrieval::RetrievalError::Io { .. }
                        | knowrl_retrieval::RetrievalError::Index { .. }
                        | knowrl_retrieval::RetrievalError::Engine(_)
                )
            )
        });
        let bad_config = e.chain().any(|c| {
            c.downcast_ref::<knowrl_world::config::ConfigError>().is_some()
                || c.downcast_ref::<knowrl_rl::config::ConfigError>().is_some()
                || c.downcast_ref::<toml::de::Error>().is_some()
        });
        std::process::exit(if bad_input || bad_config { 2 } else { 1 });
    }
}
