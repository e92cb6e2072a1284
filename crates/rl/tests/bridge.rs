//! BRIDGE: the retriever loss reaches only the query LoRA (base encoder and passage index
//! untouched), a finite-difference check of the RAG-likelihood gradient, credit weights that
//! sum to 1 per retrieval turn, a RAG signal under zero advantages (Appendix D.1), and a step
//! on the world with every estimator.
mod common;
use knowrl_engine::{LoraConfig, Mode};
use knowrl_rl::bridge::{credit_surrogate, credit_weights, rag_loss, retriever_loss, BridgeConfig, LoggedTurn};
use knowrl_rl::method::StepCtx;
use knowrl_rl::update::LossTerm;
use tch::{Kind, Tensor};

fn lora() -> Option<LoraConfig> {
    Some(LoraConfig { rank: 4, alpha: 4.0, dropout: 0.0, target_modules: vec!["query".into(), "value".into()] })
}

/// Hand-made turns over real candidate rows of the world's index.
fn turns(r: &knowrl_retrieval::dense::DenseRetriever, advantage: f64) -> Vec<LoggedTurn> {
    let queries = vec!["Zolis Zoboneth".to_string(), "Vobilford".to_string()];
    let rows = r.top_rows(&queries, 5).unwrap();
    let s = tch::no_grad(|| r.scores_of(&queries, &rows, Mode::EVAL)).unwrap();
    let lr: Vec<f32> = Vec::try_from((s / 0.4).log_softmax(1, Kind::Float).view(-1)).unwrap();
    queries
        .iter()
        .zip(&rows)
        .enumerate()
        .map(|(i, (q, row))| LoggedTurn {
            query: q.clone(),
            rows: row.clone(),
            log_rho_old: lr[i * 5..(i + 1) * 5].iter().map(|x| *x as f64).collect(),
            // The answer is likelier under the 2nd candidate than under the others.
            log_py: vec![-6.0, -1.0, -5.0, -7.0, -6.5],
            advantage,
            docs: vec![],
        })
        .collect()
}

#[test]
fn credit_weights_sum_to_one_and_follow_the_answer_likelihood() {
    // ρ_old uniform over 3, log p = [0, −1, −2], τ_p = 0.5: c ∝ [1, e^{−2}, e^{−4}].
    let lr = vec![(1.0f64 / 3.0).ln(); 3];
    let c = credit_weights(&lr, &[0.0, -1.0, -2.0], 0.5);
    let z = 1.0 + (-2.0f64).exp() + (-4.0f64).exp();
    for (x, y) in c.iter().zip([1.0 / z, (-2.0f64).exp() / z, (-4.0f64).exp() / z]) {
        assert!((x - y).abs() < 1e-12);
    }
    assert!((c.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    // ρ_old matters too: a candidate the retriever ranked far lower gets less credit.
    let c = credit_weights(&[0.0f64.ln_1p(), (0.1f64).ln(), (0.1f64).ln()], &[-1.0, -1.0, -1.0], 0.5);
    assert!(c[0] > c[1] && (c.iter().sum::<f64>() - 1.0).abs() < 1e-12);
}

/// B3 and B5 on a 3-candidate turn, by hand: ρ = [0.5, 0.3, 0.2], p(y|h,d) = [0.1, 0.6, 0.3],
/// ρ_old = [0.4, 0.4, 0.2], credit c = [0.2, 0.5, 0.3], ε = 0.2.
#[test]
fn rag_loss_and_credit_surrogate_hand_computed() {
    let t = |v: &[f64]| tch::Tensor::from_slice(&v.iter().map(|x| x.ln() as f32).collect::<Vec<_>>()).view([1, 3]);
    let (rho, py, old) = (t(&[0.5, 0.3, 0.2]), t(&[0.1, 0.6, 0.3]), t(&[0.4, 0.4, 0.2]));
    // −log(0.05 + 0.18 + 0.06) = −log 0.29.
    assert!((rag_loss(&rho, &py).double_value(&[]) - 1.237874).abs() < 1e-5);
    let credit = tch::Tensor::from_slice(&[0.2f32, 0.5, 0.3]).view([1, 3]);
    // Ratios 1.25, 0.75, 1. A = +1: min(rA, clip(r)A) = 1.2, 0.75, 1 → 0.24 + 0.375 + 0.3.
    let j = |a: f32| credit_surrogate(&rho, &old, &credit, &tch::Tensor::from_slice(&[a]), 0.2).double_value(&[]);
    assert!((j(1.0) - 0.915).abs() < 1e-6, "{}", j(1.0));
    // A = −1: −1.25, −0.8, −1 → −0.25 − 0.4 − 0.3.
    assert!((j(-1.0) + 0.95).abs() < 1e-6, "{}", j(-1.0));
    // B4: c ∝ ρ_old · p^{1/τ_p} = [0.004, 0.144, 0.018] / 0.166 at τ_p = 0.5.
    let c = credit_weights(&[0.4f64.ln(), 0.4f64.ln(), 0.2f64.ln()], &[0.1f64.ln(), 0.6f64.ln(), 0.3f64.ln()], 0.5);
    for (x, y) in c.iter().zip([0.004 / 0.166, 0.144 / 0.166, 0.018 / 0.166]) {
        assert!((x - y).abs() < 1e-9, "{c:?}");
    }
}

#[test]
fn retriever_loss_reaches_only_the_query_lora() {
    tch::set_num_threads(1);
    let r = common::retriever_with(lora());
    let index_before = r.index.flat().rows(0, r.corpus.len()).copy();
    let cfg = BridgeConfig::default();
    let (loss, _, _) = retriever_loss(&r, &turns(&r, 1.0), &cfg, cfg.retriever_weights()).unwrap();
    loss.backward();
    let enc = r.encoder.lock().unwrap();
    let mut lora_grad = 0.0;
    for (name, t) in enc.vs.variables() {
        let g = t.grad();
        let norm = if g.defined() { g.abs().sum(Kind::Float).double_value(&[]) } else { 0.0 };
        if knowrl_engine::policy::is_lora_param(&name) {
            lora_grad += norm;
        } else {
            assert!(!t.requires_grad() || norm == 0.0, "base parameter {name} got a gradient");
        }
    }
    assert!(lora_grad > 0.0, "no gradient reached the adapter");
    drop(enc);
    // One adapter step leaves the passage index as it was (passages are encoded without adapters).
    let params = r.encoder.lock().unwrap().adapter_parameters();
    tch::no_grad(|| {
        for (_, p) in &params {
            let g = p.grad();
            if g.defined() {
                let _ = p.shallow_clone().f_sub_(&(g * 0.1)).unwrap();
            }
        }
    });
    assert!(r.index.flat().rows(0, r.corpus.len()).equal(&index_before));
}

#[test]
fn rag_likelihood_gradient_matches_finite_differences() {
    tch::set_num_threads(1);
    let r = common::retriever_with(lora());
    let t = turns(&r, 0.0);
    let queries: Vec<String> = t.iter().map(|x| x.query.clone()).collect();
    let rows: Vec<Vec<usize>> = t.iter().map(|x| x.rows.clone()).collect();
    let log_py =
        Tensor::from_slice(&t.iter().flat_map(|x| x.log_py.iter().map(|v| *v as f32)).collect::<Vec<_>>()).view([2, 5]);
    let loss = || {
        let s = r.scores_of(&queries, &rows, Mode::TRAIN).unwrap();
        rag_loss(&(s / 0.4).log_softmax(1, Kind::Float), &log_py)
    };
    let params = r.encoder.lock().unwrap().adapter_parameters();
    // Move off the LoRA init (B = 0) so that A's gradient is not trivially zero.
    tch::manual_seed(3);
    tch::no_grad(|| {
        for (_, p) in &params {
            let _ = p.shallow_clone().f_add_(&(p.randn_like() * 0.05)).unwrap();
        }
    });
    for (_, p) in &params {
        p.shallow_clone().zero_grad();
    }
    loss().backward();
    // Per parameter tensor, the central difference along its own analytic gradient ĝ must equal
    // ‖g‖: a wrong sign, scale or component breaks the equality. Along ĝ the loss moves by
    // ‖g‖·h, ~100x its float32 rounding; one element's difference (an earlier form of this
    // test) was ~20 rounding steps and failed on an AMD VM with a correct gradient.
    let mut checked = 0;
    for (name, p) in params.iter().take(4) {
        let g = p.grad().detach().copy();
        let norm = g.norm().double_value(&[]);
        assert!(norm > 1e-4, "{name}: gradient {norm} too small to check");
        let direction = &g / norm;
        let h = 5e-2;
        let shift = |d: f64| tch::no_grad(|| drop(p.shallow_clone().f_add_(&(&direction * d)).unwrap()));
        shift(h);
        let up = tch::no_grad(|| loss().double_value(&[]));
        shift(-2.0 * h);
        let down = tch::no_grad(|| loss().double_value(&[]));
        shift(h);
        let numeric = (up - down) / (2.0 * h);
        assert!((norm - numeric).abs() <= 5e-3 * norm, "{name}: ‖g‖ {norm} vs finite difference along ĝ {numeric}");
        checked += 1;
    }
    assert_eq!(checked, 4);
}

#[test]
fn zero_advantage_turns_still_train_the_retriever_through_the_rag_likelihood() {
    tch::set_num_threads(1);
    let r = common::retriever_with(lora());
    let cfg = BridgeConfig::default();
    let params = r.encoder.lock().unwrap().adapter_parameters();
    let grad_norm = |w: (f64, f64)| {
        for (_, p) in &params {
            p.shallow_clone().zero_grad();
        }
        let (loss, _, _) = retriever_loss(&r, &turns(&r, 0.0), &cfg, w).unwrap();
        loss.backward();
        params.iter().map(|(_, p)| p.grad().abs().sum(Kind::Float).double_value(&[])).sum::<f64>()
    };
    // All advantages 0: the RL credit term alone gives nothing, the RAG term still does.
    assert_eq!(grad_norm((1.0, 0.0)), 0.0);
    assert!(grad_norm(cfg.retriever_weights()) > 0.0);
}

#[test]
fn a_world_step_with_each_estimator_updates_the_adapter_and_logs_turns() {
    tch::set_num_threads(1);
    let policy = common::policy();
    let r = common::retriever_with(lora());
    let tasks = common::agent_tasks(40);
    let picks: Vec<&knowrl_rl::task::Task> = tasks.iter().skip(20).take(2).collect();
    for (estimator, fidelity) in [("bridge", 0), ("drop", 0), ("two_state", 1)] {
        let cfg = common::config(
            &std::env::temp_dir().join("knowrl-bridge-unused"),
            2,
            &format!(
                "[method]\nname = \"bridge\"\nk = 4\nestimator = \"{estimator}\"\nfidelity_every = {fidelity}\nretriever_lr = 0.05\n"
            ),
        );
        let before: Vec<tch::Tensor> =
            r.encoder.lock().unwrap().adapter_parameters().iter().map(|(_, t)| t.copy()).collect();
        let ctx = StepCtx { dense: Some(&r), ..common::ctx(&policy, &r, &cfg) };
        let mut method = cfg.method.spec().build();
        let out = method.step(&ctx, &picks).unwrap();
        // The fidelity diagnostic runs apart from the step, on its terms.
        let diag: std::collections::BTreeMap<String, f64> = method.diagnose(&ctx, &out).unwrap().into_iter().collect();
        let rag = out.terms.iter().filter(|t| matches!(t, LossTerm::Rag { .. })).count();
        let m = &out.metrics.extra;
        assert!(m["retrieval_turns"] > 0.0, "{estimator}: the pretrained policy searches");
        let after = r.encoder.lock().unwrap().adapter_parameters();
        let moved = before.iter().zip(&after).any(|(b, (_, a))| !b.equal(a));
        assert!(moved, "{estimator}: the retriever adapter did not move");
        assert_eq!(out.pg_rows().len(), 2 * 3);
        match estimator {
            "bridge" => assert_eq!(rag, 0),
            "drop" => assert_eq!(rag, 1),
            _ => {
                assert_eq!(rag, 2);
                // B9: +γ L_RAG(θ, η_γ) − γ L_RAG(θ, η*), each under its own retriever state: after
                // one update η_γ (RAG weight γ/(1+γ)) and η* (RAG only) differ, so do their ρ.
                let [_, LossTerm::Rag { turns: g, coef: cg }, LossTerm::Rag { turns: st, coef: cs }] = &out.terms[..]
                else {
                    panic!("want PG, RAG(η_γ), RAG(η*)")
                };
                assert_eq!((*cg, *cs), (0.25, -0.25), "signs of the two-state terms");
                let differ = g.iter().zip(st).any(|(a, b)| a.rho.iter().zip(&b.rho).any(|(x, y)| (x - y).abs() > 1e-9));
                assert!(differ, "the η* term uses η_γ's retrieval distribution");
                // The cosines are undefined (not recorded) on a batch without an RL gradient,
                // whose groups all tie; the relative error then says BRIDGE missed all of it.
                match diag.get("fidelity_cos_bridge") {
                    Some(c) => assert!(c.is_finite() && diag["fidelity_cos_drop"].is_finite()),
                    None => assert_eq!(diag["fidelity_relerr_bridge"], 1.0, "{estimator}"),
                }
                assert!(diag["fidelity_relerr_drop"].is_finite());
                assert!(!m.contains_key("fidelity_relerr_drop"), "the step itself measures no fidelity");
                assert!(m.contains_key("retriever_update_s"));
            }
        }
    }
}

/// B2's rows put the history in the prompt and ⟨information⟩d in the response's masked head, so
/// a turn's candidates share one prompt (scored once). log p(y | h, d) is the same as with
/// h ‖ d as the prompt: per candidate, with three candidates sharing h in one batch.
#[test]
fn candidate_rows_with_a_shared_history_score_the_answer_as_concatenated_rows() {
    use knowrl_engine::score::{score, ScoreRequest};
    tch::set_num_threads(1);
    let policy = common::policy();
    let tok = policy.tokenizer().unwrap();
    let h = tok.encode("Who founded Vobilford? <search> Vobilford </search>", false).unwrap();
    let y = tok.encode("<answer> Zolis Zoboneth </answer>", false).unwrap();
    let docs: Vec<Vec<u32>> = ["Vobilford was founded by Zolis Zoboneth.", "Kelmora is a river.", "Nothing here."]
        .iter()
        .map(|d| tok.encode(&format!("<information>Doc 1: {d}</information>"), false).unwrap())
        .collect();
    let logp = |reqs: &[ScoreRequest]| -> Vec<f64> {
        let s = tch::no_grad(|| score(&policy.lm, reqs, 1.0, Mode::EVAL));
        Vec::try_from((s.logprobs * s.mask).sum_dim_intlist(1, false, Kind::Double)).unwrap()
    };
    let joined: Vec<Vec<u32>> = docs.iter().map(|d| [h.clone(), d.clone()].concat()).collect();
    let want =
        logp(&joined.iter().map(|p| ScoreRequest { prompt: p, response: &y, loss_mask: None }).collect::<Vec<_>>());
    let (resp, masks): (Vec<Vec<u32>>, Vec<Vec<bool>>) = docs
        .iter()
        .map(|d| ([d.clone(), y.clone()].concat(), [vec![false; d.len()], vec![true; y.len()]].concat()))
        .unzip();
    let shared: Vec<ScoreRequest> =
        resp.iter().zip(&masks).map(|(r, m)| ScoreRequest { prompt: &h, response: r, loss_mask: Some(m) }).collect();
    let got = logp(&shared);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-4 * w.abs().max(1.0), "{got:?} vs {want:?}");
    }
    println!("log p(y | h, d): {want:?}");
    assert!(want[0] > want[2], "the document with the answer makes it likelier: {want:?}");
}
