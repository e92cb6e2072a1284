//! The state BRIDGE's lower level trains: the query-side LoRA of the dense retriever (η), its
//! AdamW moments, and — for the two-state estimator — the RAG-only second state η* (its own
//! values and moments). Everything here is checkpointed ([`QueryAdapter::state`]) so a BRIDGE run
//! resumes bit-identically.
use crate::method::MethodState;
use knowrl_dist::ProcessGroup;
use knowrl_engine::optim::{AdamW, AdamWConfig};
use knowrl_engine::Result;
use knowrl_retrieval::dense::DenseRetriever;
use std::collections::HashMap;
use tch::Tensor;

#[derive(Default)]
pub struct QueryAdapter {
    opt: Option<AdamW>,
    /// η* values and their optimiser (two-state only).
    second: Option<(Vec<Tensor>, AdamW)>,
}

/// The adapter's parameters (shallow: writing them writes the retriever's).
pub fn parameters(dense: &DenseRetriever) -> Vec<(String, Tensor)> {
    dense.encoder.lock().unwrap().adapter_parameters()
}

fn shallow(params: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    params.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect()
}

fn values(params: &[(String, Tensor)]) -> Vec<Tensor> {
    params.iter().map(|(_, t)| t.detach().copy()).collect()
}

fn set_values(params: &[(String, Tensor)], v: &[Tensor]) {
    tch::no_grad(|| {
        for ((_, p), x) in params.iter().zip(v) {
            p.shallow_clone().copy_(x);
        }
    });
}

fn adam(params: &[(String, Tensor)]) -> AdamW {
    AdamW::new(shallow(params), AdamWConfig { weight_decay: 0.0, ..Default::default() })
}

/// One Adam step of the adapter on `loss` (zeroing its gradients first, clipping at norm 1).
/// As one rank of `group`, `loss` is this rank's part of the batch's (None: it holds no
/// retrieval turn) and the gradients are summed over ranks first, so every rank's adapter
/// takes the same step.
fn adapter_step(opt: &mut AdamW, loss: Option<&Tensor>, lr: f64, group: Option<&ProcessGroup>) -> Result<()> {
    opt.zero_grad();
    if let Some(l) = loss {
        l.backward();
    }
    crate::data_parallel::all_reduce_grads(group, opt.params())?;
    opt.clip_grad_norm(1.0);
    opt.step(lr);
    Ok(())
}

fn bytes(t: &Tensor) -> f64 {
    (t.numel() * t.kind().elt_size_in_bytes()) as f64
}

impl QueryAdapter {
    /// One step of η on `loss(dense)` (built under the current adapter values; this rank's
    /// part of it as one rank of `group`, None when it holds none).
    pub fn step(
        &mut self,
        dense: &DenseRetriever,
        lr: f64,
        group: Option<&ProcessGroup>,
        loss: impl Fn() -> Result<Option<Tensor>>,
    ) -> Result<()> {
        let params = parameters(dense);
        let opt = self.opt.get_or_insert_with(|| adam(&params));
        adapter_step(opt, loss()?.as_ref(), lr, group)
    }

    /// One step of the second state η* on `loss` evaluated under η*'s values (η is left as it
    /// was). η* starts as a copy of η at its first step.
    pub fn step_second(
        &mut self,
        dense: &DenseRetriever,
        lr: f64,
        group: Option<&ProcessGroup>,
        loss: impl Fn() -> Result<Option<Tensor>>,
    ) -> Result<()> {
        let params = parameters(dense);
        let current = values(&params);
        let (second, opt) = self.second.get_or_insert_with(|| (values(&params), adam(&params)));
        set_values(&params, second);
        let stepped = loss().and_then(|l| adapter_step(opt, l.as_ref(), lr, group));
        if stepped.is_ok() {
            *second = values(&params);
        }
        set_values(&params, &current);
        stepped
    }

    /// `f` evaluated with η*'s values in the adapter (None before η*'s first step).
    pub fn with_second<T>(&self, dense: &DenseRetriever, f: impl FnOnce() -> T) -> Option<T> {
        let (second, _) = self.second.as_ref()?;
        let params = parameters(dense);
        let current = values(&params);
        set_values(&params, second);
        let out = f();
        set_values(&params, &current);
        Some(out)
    }

    /// Bytes the lower level keeps alive besides the frozen encoder: adapter values and
    /// gradients, Adam moments, and the second state's values and moments.
    pub fn held_bytes(&self, dense: &DenseRetriever) -> f64 {
        let moments = |o: &AdamW| o.state_tensors().iter().map(|(_, t)| bytes(t)).sum::<f64>();
        let mut held: f64 = parameters(dense).iter().map(|(_, p)| 2.0 * bytes(p)).sum();
        held += self.opt.as_ref().map_or(0.0, moments);
        if let Some((v, o)) = &self.second {
            held += v.iter().map(bytes).sum::<f64>() + moments(o);
        }
        held
    }

    /// Adapter values (`adapter.<name>`), moments (`opt.…`) and η* (`second.<name>`,
    /// `second_opt.…`), with the optimisers' step counts in `json`.
    pub fn state(&self, dense: &DenseRetriever) -> MethodState {
        let params = parameters(dense);
        let mut tensors: HashMap<String, Tensor> =
            params.iter().map(|(n, t)| (format!("adapter.{n}"), t.detach().copy())).collect();
        let mut json = serde_json::Map::new();
        if let Some(o) = &self.opt {
            tensors.extend(o.state_tensors().into_iter().map(|(n, t)| (format!("opt.{n}"), t.copy())));
            json.insert("opt_steps".into(), o.steps.into());
        }
        if let Some((v, o)) = &self.second {
            for ((n, _), t) in params.iter().zip(v) {
                tensors.insert(format!("second.{n}"), t.copy());
            }
            tensors.extend(o.state_tensors().into_iter().map(|(n, t)| (format!("second_opt.{n}"), t.copy())));
            json.insert("second_opt_steps".into(), o.steps.into());
        }
        MethodState { tensors, json: serde_json::Value::Object(json) }
    }

    /// Restores [`QueryAdapter::state`] into `dense`'s adapter and fresh optimisers.
    pub fn restore(dense: &DenseRetriever, s: MethodState) -> Result<QueryAdapter> {
        let params = parameters(dense);
        let mut t = s.tensors;
        set_values(&params, &take(&mut t, &params, "adapter")?);
        let steps = |k: &str| s.json.get(k).and_then(serde_json::Value::as_u64);
        let mut out = QueryAdapter::default();
        if let Some(n) = steps("opt_steps") {
            let mut o = adam(&params);
            o.load_state_tensors(strip(&mut t, "opt."), n)?;
            out.opt = Some(o);
        }
        if let Some(n) = steps("second_opt_steps") {
            let second = take(&mut t, &params, "second")?;
            let mut o = adam(&params);
            o.load_state_tensors(strip(&mut t, "second_opt."), n)?;
            out.second = Some((second, o));
        }
        Ok(out)
    }
}

/// The `<prefix>.<name>` tensor of every adapter parameter.
fn take(t: &mut HashMap<String, Tensor>, params: &[(String, Tensor)], prefix: &str) -> Result<Vec<Tensor>> {
    params
        .iter()
        .map(|(n, _)| {
            let k = format!("{prefix}.{n}");
            t.remove(&k)
                .ok_or_else(|| knowrl_engine::EngineError::Invalid(format!("bridge checkpoint state has no `{k}`")))
        })
        .collect()
}

/// The tensors under `prefix`, with the prefix removed.
fn strip(t: &mut HashMap<String, Tensor>, prefix: &str) -> HashMap<String, Tensor> {
    let keys: Vec<String> = t.keys().filter(|k| k.starts_with(prefix)).cloned().collect();
    keys.into_iter().map(|k| (k[prefix.len()..].to_string(), t.remove(&k).unwrap())).collect()
}
