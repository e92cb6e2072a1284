//! `knowrl world build`: generate the synthetic knowledge world deterministically.
use anyhow::{Context, Result};
use knowrl_world::config::{default_toml, WorldConfig};
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum WorldCmd {
    /// Generate the world (entities, facts with PK labels, corpus, questions, scenario suites).
    Build(BuildArgs),
    /// Implant the world's parametric knowledge into a pretrained base with a LoRA (the policy,
    /// a PEFT adapter) and train the world's tiny retriever; `--from-scratch`: the tiny policy.
    Pretrain(PretrainArgs),
    /// Calibration of the shipped policy on the test split (greedy).
    Eval(crate::world_eval::EvalArgs),
}

#[derive(clap::Args)]
pub struct BuildArgs {
    /// World config (TOML); default: the embedded default (crates/world/src/default.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override the config's seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Output directory (world files only: an existing policy/ and encoder/ are kept).
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
    /// Recipe (TOML; unknown fields are errors): the fields of ImplantConfig, or of
    /// PretrainConfig with --from-scratch. Default: WORLD/implant.toml (WORLD/pretrain.toml with
    /// --from-scratch) when it exists, else the built-in defaults. Every run writes its recipe
    /// back there. The flags below override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Policy epochs.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Retriever epochs.
    #[arg(long)]
    pub encoder_epochs: Option<usize>,
    /// Policy peak learning rate.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Keep the existing encoder (train only the policy).
    #[arg(long)]
    pub policy_only: bool,
    /// Train the tiny from-scratch policy (a Llama-family decoder on a world-trained tokenizer;
    /// the fast model of the tests' world, assets/tiny-world) instead of the knowledge adapter.
    #[arg(long)]
    pub from_scratch: bool,
    /// With --from-scratch: copies of each parametric-knowledge example per epoch.
    #[arg(long, requires = "from_scratch")]
    pub fact_repeats: Option<usize>,
    /// With --from-scratch: shadow worlds for reading practice (0 = none).
    #[arg(long, requires = "from_scratch")]
    pub shadow_worlds: Option<usize>,
    /// With --from-scratch: continue from this policy directory (same world, same tokenizer).
    #[arg(long, requires = "from_scratch")]
    pub init: Option<PathBuf>,
}

fn read_recipe<T: serde::de::DeserializeOwned + Default>(path: &std::path::Path, explicit: bool) -> Result<T> {
    if !explicit && !path.exists() {
        return Ok(T::default());
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str::<T>(&text).with_context(|| format!("{}: not a pretraining recipe", path.display()))
}

/// The world of `a.world` and the recipe: `--config`, else `WORLD/default_file` when it exists,
/// else the built-in defaults. Returns (world, recipe path, recipe).
fn world_and_recipe<T: serde::de::DeserializeOwned + Default>(
    a: &PretrainArgs,
    default_file: &str,
) -> Result<(knowrl_world::Built, PathBuf, T)> {
    let built = knowrl_world::build(&WorldConfig::load(&a.world.join("config.toml"))?);
    let recipe = a.config.clone().unwrap_or_else(|| a.world.join(default_file));
    let r = read_recipe(&recipe, a.config.is_some())?;
    eprintln!("recipe: {}", if recipe.exists() { recipe.display().to_string() } else { "built-in defaults".into() });
    Ok((built, recipe, r))
}

/// A progress bar whose callback is `(epoch, step, steps, loss)`.
fn epoch_bar() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix:>8} {bar:30} {pos}/{len} [{elapsed} < {eta}] {msg}").unwrap(),
    );
    bar
}

fn progress_fn(bar: &indicatif::ProgressBar, prefix: &'static str) -> impl Fn(usize, usize, usize, f64) {
    let bar = bar.clone();
    move |epoch: usize, step: usize, steps: usize, loss: f64| {
        bar.set_prefix(prefix);
        bar.set_length(steps as u64);
        bar.set_position(step as u64);
        bar.set_message(format!("epoch {} loss {loss:.3}", epoch + 1));
        // Without a terminal (a log file) the bar is hidden: a line every 25 steps instead.
        if bar.is_hidden() && (step.is_multiple_of(25) || step == steps) {
            let secs = bar.elapsed().as_secs_f64();
            eprintln!("{prefix} epoch {} step {step}/{steps} loss {loss:.3} ({secs:.0}s)", epoch + 1);
        }
    }
}

pub fn pretrain(a: PretrainArgs) -> Result<()> {
    if a.from_scratch {
        return pretrain_from_scratch(a);
    }
    use knowrl_world::implant::{train_adapter, ImplantConfig};
    use knowrl_world::pretrain::{train_encoder, train_tokenizer};
    let (built, recipe, mut ic) = world_and_recipe::<ImplantConfig>(&a, "implant.toml")?;
    if let Some(e) = a.epochs {
        ic.epochs = e;
    }
    if let Some(e) = a.encoder_epochs {
        ic.encoder_epochs = e;
    }
    if let Some(lr) = a.lr {
        ic.lr = lr;
    }
    let base = knowrl_engine::adapter::models_dir().join(&ic.base);
    if !base.join("config.json").is_file() {
        let msg = format!("no model at {} (run scripts/fetch-real-models, or set KNOWRL_MODELS)", base.display());
        return Err(knowrl_engine::EngineError::config(&recipe, "base", msg).into());
    }
    let t0 = std::time::Instant::now();
    let bar = epoch_bar();
    let encoder = if a.policy_only {
        "encoder kept".to_string()
    } else {
        // The retriever's tokenizer is trained on the world's text; the policy keeps its base's.
        let edir = a.world.join("encoder");
        let scratch = a.world.join(".tokenizer.tmp");
        train_tokenizer(&built, ic.encoder_vocab, &scratch, &edir).map_err(|e| anyhow::anyhow!("tokenizer: {e}"))?;
        let _ = std::fs::remove_dir_all(&scratch);
        format!(
            "encoder (loss {:.3})",
            train_encoder(&built, &ic.encoder_recipe(), &edir, &progress_fn(&bar, "encoder"))?
        )
    };
    let (pdir, tmp) = (a.world.join("policy"), a.world.join(".policy.tmp"));
    let _ = std::fs::remove_dir_all(&tmp);
    let loss = train_adapter(&built, &ic, &base, &tmp, &progress_fn(&bar, "policy"))?;
    bar.finish_and_clear();
    if pdir.exists() {
        std::fs::remove_dir_all(&pdir)?;
    }
    std::fs::rename(&tmp, &pdir)?;
    std::fs::write(a.world.join("implant.toml"), toml::to_string(&ic)?)?;
    println!(
        "knowledge adapter on {} (final epoch loss {loss:.3}) -> {}, {encoder}, in {:.0}s",
        ic.base,
        pdir.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn pretrain_from_scratch(a: PretrainArgs) -> Result<()> {
    use knowrl_world::pretrain::{train_encoder, train_policy, train_tokenizer, PretrainConfig};
    let (built, _, mut pc) = world_and_recipe::<PretrainConfig>(&a, "pretrain.toml")?;
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
    let bar = epoch_bar();
    let progress = |prefix: &'static str| progress_fn(&bar, prefix);
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
