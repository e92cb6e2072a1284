//! `knowrl world build`: generate the synthetic knowledge world deterministically.
use anyhow::{Context, Result};
use knowrl_world::config::{default_toml, WorldConfig};
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum WorldCmd {
    /// Generate the world (entities, facts with PK labels, corpus, questions, scenario suites).
    Build(BuildArgs),
    /// Train the world's tokenizer, tiny policy and tiny retriever (HF directories).
    Pretrain(PretrainArgs),
    /// Calibration of the shipped policy on the test split (greedy).
    Eval(EvalArgs),
}

#[derive(clap::Args)]
pub struct BuildArgs {
    /// World config (TOML); default: the embedded default (crates/world/src/default.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override the config's seed.
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long, default_value = "assets/world")]
    pub out: PathBuf,
}

pub fn run(c: WorldCmd) -> Result<()> {
    let a = match c {
        WorldCmd::Build(a) => a,
        WorldCmd::Pretrain(a) => return pretrain(a),
        WorldCmd::Eval(a) => return crate::world_eval::run(a),
    };
    let mut cfg = match &a.config {
        Some(p) => WorldConfig::load(p)?,
        None => WorldConfig::from_toml(default_toml(), "<embedded default>")?,
    };
    if let Some(s) = a.seed {
        cfg.seed = s;
    }
    let t0 = std::time::Instant::now();
    let built = knowrl_world::build(&cfg);
    built.write(&a.out).with_context(|| format!("writing {}", a.out.display()))?;
    let q = &built.questions;
    let count = |f: &dyn Fn(&knowrl_world::questions::Question) -> bool| q.iter().filter(|x| f(x)).count();
    println!(
        "world (seed {}): {} entities, {} facts ({} in PK), {} passages, {} questions (1-hop {}, 2-hop {}, 3-hop {}; PK-answerable {}), {} scenario items -> {} in {:.2}s",
        cfg.seed,
        built.world.entities.len(),
        built.world.facts.len(),
        built.world.facts.iter().filter(|f| f.pk).count(),
        built.passages.len(),
        q.len(),
        count(&|x| x.hops == 1),
        count(&|x| x.hops == 2),
        count(&|x| x.hops == 3),
        count(&|x| x.pk_answerable),
        built.scenarios.len(),
        a.out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

#[derive(clap::Args)]
pub struct PretrainArgs {
    /// World directory from `knowrl world build`.
    #[arg(long, default_value = "assets/world")]
    pub world: PathBuf,
    /// Pretraining recipe (TOML, the fields of PretrainConfig; unknown fields are errors).
    /// Default: WORLD/pretrain.toml when it exists (every run writes its recipe there), else
    /// the built-in defaults. The flags below override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Policy epochs (default from PretrainConfig).
    #[arg(long)]
    pub epochs: Option<usize>,
    #[arg(long)]
    pub encoder_epochs: Option<usize>,
    /// Policy peak learning rate.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Copies of each parametric-knowledge example per epoch.
    #[arg(long)]
    pub fact_repeats: Option<usize>,
    /// Shadow worlds for reading practice (0 = none; see PretrainConfig::shadow_worlds).
    #[arg(long)]
    pub shadow_worlds: Option<usize>,
    /// Continue from this policy directory instead of a random initialisation (same world,
    /// same tokenizer); copy it first if it is the output directory.
    #[arg(long)]
    pub init: Option<PathBuf>,
    /// Keep the existing encoder (train only the tokenizer-compatible policy).
    #[arg(long)]
    pub policy_only: bool,
}

#[derive(clap::Args)]
pub struct EvalArgs {
    #[arg(long, default_value = "assets/world")]
    pub world: PathBuf,
    /// Write the calibration figures here (JSON).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Questions per agent measurement (0 = all of the test split).
    #[arg(long, default_value_t = 0)]
    pub limit: usize,
}

pub fn pretrain(a: PretrainArgs) -> Result<()> {
    use indicatif::{ProgressBar, ProgressStyle};
    use knowrl_world::pretrain::{train_encoder, train_policy, train_tokenizer, PretrainConfig};
    let cfg_path = a.world.join("config.toml");
    let wcfg = WorldConfig::load(&cfg_path)?;
    let built = knowrl_world::build(&wcfg);
    let recipe = a.config.clone().unwrap_or_else(|| a.world.join("pretrain.toml"));
    let mut pc = if a.config.is_some() || recipe.exists() {
        let text = std::fs::read_to_string(&recipe).with_context(|| format!("reading {}", recipe.display()))?;
        toml::from_str::<PretrainConfig>(&text)
            .with_context(|| format!("{}: not a pretraining recipe", recipe.display()))?
    } else {
        PretrainConfig::default()
    };
    eprintln!("recipe: {}", if recipe.exists() { recipe.display().to_string() } else { "built-in defaults".into() });
    if let Some(e) = a.epochs {
        pc.epochs = e;
    }
    if let Some(e) = a.encoder_epochs {
        pc.encoder_epochs = e;
    }
    if let Some(lr) = a.lr {
        pc.lr = lr;
    }
    if let Some(r) = a.fact_repeats {
        pc.fact_repeats = r;
    }
    if let Some(k) = a.shadow_worlds {
        pc.shadow_worlds = k;
    }
    let (pdir, edir) = (a.world.join("policy"), a.world.join("encoder"));
    let t0 = std::time::Instant::now();
    train_tokenizer(&built, pc.vocab_size, &pdir, &edir).map_err(|e| anyhow::anyhow!("tokenizer: {e}"))?;
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template("{prefix:>8} {bar:30} {pos}/{len} [{elapsed} < {eta}] {msg}").unwrap());
    let progress = |prefix: &'static str| {
        let bar = bar.clone();
        move |epoch: usize, step: usize, steps: usize, loss: f64| {
            bar.set_prefix(prefix);
            bar.set_length(steps as u64);
            bar.set_position(step as u64);
            bar.set_message(format!("epoch {} loss {loss:.3}", epoch + 1));
            if step == steps && bar.is_hidden() {
                eprintln!("{prefix} epoch {} done (last batch loss {loss:.3})", epoch + 1);
            }
        }
    };
    let pl = train_policy(&built, &pc, &pdir, a.init.as_deref(), &progress("policy"))?;
    let encoder = if a.policy_only {
        "encoder kept".to_string()
    } else {
        format!("encoder (loss {:.3})", train_encoder(&built, &pc, &edir, &progress("encoder"))?)
    };
    bar.finish_and_clear();
    std::fs::write(a.world.join("pretrain.toml"), toml::to_string(&pc)?)?;
    println!("pretrained policy (final epoch loss {pl:.3}), {encoder}, in {:.0}s", t0.elapsed().as_secs_f64());
    Ok(())
}
