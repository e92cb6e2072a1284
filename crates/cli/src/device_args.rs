//! `--device` / `--dtype`, shared by `train`, `eval`, `reproduce`, `world eval` and `bench`:
//! where a run's tensors live and their precision. On a command with a config they override its
//! `[model] device` / `dtype`; elsewhere they choose the load options.
use anyhow::Result;
use knowrl_engine::device::parse_placement;
use knowrl_engine::LoadOptions;
use knowrl_rl::config::ModelSection;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct DeviceArgs {
    /// cpu | cuda | cuda:N | auto (CUDA when there is one). Default: the config's `model.device`,
    /// else cpu. A CUDA device that is not there is an error at start.
    #[arg(long)]
    pub device: Option<String>,
    /// f32 | bf16: weights and activations (LoRA, AdamW moments and log-probs stay f32).
    /// Default: the config's `model.dtype`, else f32.
    #[arg(long)]
    pub dtype: Option<String>,
}

impl DeviceArgs {
    /// Writes the flags given into a config's `[model]` section.
    pub fn apply(&self, m: &mut ModelSection) {
        if let Some(d) = &self.device {
            m.device = d.clone();
        }
        if let Some(d) = &self.dtype {
            m.dtype = d.clone();
        }
    }

    /// Load options for a command without a config (no LoRA).
    pub fn load_options(&self) -> Result<LoadOptions> {
        let (device, dtype) =
            parse_placement(self.device.as_deref().unwrap_or("cpu"), self.dtype.as_deref().unwrap_or("f32"))?;
        Ok(LoadOptions { device, dtype, ..Default::default() })
    }
}
