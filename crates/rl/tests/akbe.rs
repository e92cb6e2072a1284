//! AKBE: categories and target choice on hand-made dual-path batches (ties, all wrong, missing
//! paths), the CE term's value with masking and its λ scaling, and a step on the world.
mod common;
use knowrl_engine::score::{score, ScoreRequest};
use knowrl_engine::{Mode, Rng};
use knowrl_rl::akbe::{categorise, rejected, select_target, AkbeConfig, Category, Outcome, Target, TargetRule};
use knowrl_rl::update::{ce_backward, LossTerm, Sequence};

fn o(correct: bool, tool_calls: usize, tokens: usize) -> Outcome {
    // Each call's results: 100 tokens of the response that are not generated.
    Outcome { correct, tool_calls, tokens, all_tokens: tokens + 100 * tool_calls }
}

#[test]
fn categories_from_the_two_paths() {
    let (ok, bad) = (o(true, 1, 10), o(false, 1, 10));
    assert_eq!(categorise(&[ok, bad], &[bad]), Category::ToolDependent);
    assert_eq!(categorise(&[ok], &[ok, bad]), Category::Efficiency);
    assert_eq!(categorise(&[bad, bad], &[bad, ok]), Category::Hallucination);
    assert_eq!(categorise(&[bad], &[bad]), Category::BothWrong);
    // Missing paths count as all wrong.
    assert_eq!(categorise(&[], &[ok]), Category::Hallucination);
    assert_eq!(categorise(&[ok], &[]), Category::ToolDependent);
    assert_eq!(categorise(&[], &[]), Category::BothWrong);
}

#[test]
fn targets_ties_and_disabled_categories() {
    let released = AkbeConfig::default();
    let paper = AkbeConfig { target: TargetRule::FewestCallsRandom, ..AkbeConfig::default() };
    let mut rng = Rng::new(1);
    // With-tool: #0 wrong, #1 correct 2 calls 30 tokens, #2 correct 1 call 40 tokens, #3 correct 1 call 25 tokens.
    let wt = [o(false, 0, 5), o(true, 2, 30), o(true, 1, 40), o(true, 1, 25)];
    let nt = [o(false, 0, 8), o(false, 0, 6)];
    // Released: shortest correct (#3); paper: fewest calls (#2 or #3, random tie-break).
    assert_eq!(select_target(Category::ToolDependent, &wt, &nt, &released, &mut rng), Some(Target::WithTool(3)));
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..64 {
        match select_target(Category::ToolDependent, &wt, &nt, &paper, &mut rng) {
            Some(Target::WithTool(i)) => seen.insert(i),
            t => panic!("{t:?}"),
        };
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![2, 3], "both tied minimum-call trajectories are drawn");
    // Released "shortest" counts attention-mask tokens, tool results included: 1 call and 50
    // generated tokens (150 in all) beats 2 calls and 30 generated (230); counting generated
    // tokens only picks the other.
    let wt2 = [o(true, 2, 30), o(true, 1, 50)];
    assert_eq!(select_target(Category::ToolDependent, &wt2, &nt, &released, &mut rng), Some(Target::WithTool(1)));
    let generated = AkbeConfig { target: TargetRule::ShortestGenerated, ..AkbeConfig::default() };
    assert_eq!(select_target(Category::ToolDependent, &wt2, &nt, &generated, &mut rng), Some(Target::WithTool(0)));
    // Efficiency: shortest correct no-tool; ties → the first.
    let nt = [o(true, 0, 9), o(false, 0, 3), o(true, 0, 7), o(true, 0, 7)];
    assert_eq!(select_target(Category::Efficiency, &wt, &nt, &released, &mut rng), Some(Target::NoTool(2)));
    assert_eq!(select_target(Category::Hallucination, &wt, &nt, &released, &mut rng), Some(Target::NoTool(2)));
    // Paper: any correct no-tool trajectory, never a wrong one.
    for _ in 0..32 {
        let t = select_target(Category::Efficiency, &wt, &nt, &paper, &mut rng);
        assert!(matches!(t, Some(Target::NoTool(0 | 2 | 3))), "{t:?}");
    }
    // Both wrong: nothing. A disabled category (ablation): nothing.
    assert_eq!(select_target(Category::BothWrong, &wt, &nt, &released, &mut rng), None);
    let no_eff =
        AkbeConfig { categories: vec![Category::ToolDependent, Category::Hallucination], ..AkbeConfig::default() };
    assert_eq!(select_target(Category::Efficiency, &wt, &nt, &no_eff, &mut rng), None);
    // DPO's rejected: the most tool calls (#1), unless it is the target.
    assert_eq!(rejected(&wt, Target::NoTool(2)), Some(1));
    assert_eq!(rejected(&wt, Target::WithTool(1)), None);
}

#[test]
fn ce_value_is_masked_per_sequence_token_mean_and_scales_with_lambda() {
    tch::set_num_threads(1);
    let policy = common::policy();
    let tok = policy.tokenizer().unwrap();
    let prompt = tok.encode("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n", false).unwrap();
    let a = tok
        .encode("<search> Zolis </search><information> Doc 1 </information><answer> Vobilford </answer>", false)
        .unwrap();
    let b = tok.encode("<answer> Draitekir </answer>", false).unwrap();
    // Row a: the information block (observation) is masked out.
    let obs_start = tok.encode("<search> Zolis </search>", false).unwrap().len();
    let obs_len = tok.encode("<information> Doc 1 </information>", false).unwrap().len();
    let mask_a: Vec<bool> = (0..a.len()).map(|i| !(obs_start..obs_start + obs_len).contains(&i)).collect();
    let rows = vec![
        Sequence { prompt: prompt.clone(), response: a.clone(), loss_mask: mask_a.clone() },
        Sequence { prompt: prompt.clone(), response: b.clone(), loss_mask: vec![true; b.len()] },
    ];
    // By hand: per sequence, −Σ_{t ∈ mask} log p / |mask|; then the mean over sequences.
    let nll = |resp: &[u32], mask: &[bool]| {
        let s = score(
            &policy.lm,
            &[ScoreRequest { prompt: &prompt, response: resp, loss_mask: Some(mask) }],
            1.0,
            Mode::EVAL,
        );
        let lp: Vec<f32> = Vec::try_from(s.logprobs.view(-1)).unwrap();
        let kept: Vec<f64> = lp.iter().zip(mask).filter(|(_, m)| **m).map(|(x, _)| *x as f64).collect();
        -kept.iter().sum::<f64>() / kept.len() as f64
    };
    let want = (nll(&a, &mask_a) + nll(&b, &vec![true; b.len()])) / 2.0;
    let params = policy.trainable_parameters();
    let grads = |coef: f64| {
        for (_, p) in &params {
            p.shallow_clone().zero_grad();
        }
        let v = ce_backward(&policy, &rows, coef, rows.len(), 1);
        let g: Vec<tch::Tensor> = params.iter().map(|(_, p)| p.grad().copy()).collect();
        (v, g)
    };
    let (v1, g1) = grads(0.05);
    assert!((v1 - want).abs() < 1e-5, "{v1} vs {want}");
    // The mask matters: counting the observation tokens would give a different value.
    let unmasked = nll(&a, &vec![true; a.len()]);
    assert!((unmasked - nll(&a, &mask_a)).abs() > 1e-4);
    let (v2, g2) = grads(0.1);
    assert!((v1 - v2).abs() < 1e-9);
    for (x, y) in g1.iter().zip(&g2) {
        assert!((y - x * 2.0).abs().max().double_value(&[]) < 1e-6, "λ doubles the gradient");
    }
}

#[test]
fn a_step_on_the_world_builds_targets_for_tool_and_no_tool_paths() {
    tch::set_num_threads(1);
    let policy = common::policy();
    let r = common::retriever();
    let tasks = common::agent_tasks(40);
    let cfg = common::config(
        &std::env::temp_dir().join("knowrl-akbe-unused"),
        1,
        "[method]\nname = \"akbe\"\nn_wt = 3\nn_nt = 2\n",
    );
    let picks: Vec<&knowrl_rl::task::Task> = tasks.iter().take(6).collect();
    let ctx = common::ctx(&policy, &r, &cfg);
    let out = cfg.method.spec().build().step(&ctx, &picks).unwrap();
    let m = &out.metrics.extra;
    let total: f64 = Category::ALL.iter().map(|c| m[&format!("cat_{}", c.name())]).sum();
    assert_eq!(total, 6.0, "every question is categorised once");
    let [_, LossTerm::Ce { rows: ce, coef }] = &out.terms[..] else { panic!("want a PG and a CE term") };
    assert_eq!(ce.len() as f64, m["targets"]);
    assert_eq!(*coef, 0.05);
    // PG rows are with-tool trajectories only (3 per question).
    assert_eq!(out.pg_rows().len(), 18);
    let tok = policy.tokenizer().unwrap();
    let nt_prompts: Vec<Vec<u32>> = picks.iter().map(|t| t.no_tool.ids(tok).unwrap()).collect();
    assert!(out.pg_rows().iter().all(|r| !nt_prompts.contains(&r.seq.prompt)));
    // With-tool targets mask their tool results out: every token of an <information> block is
    // false in the mask, every generated token true.
    for t in ce.iter().filter(|t| !nt_prompts.contains(&t.prompt)) {
        let text = tok.decode(&t.response, false).unwrap();
        assert_eq!(t.loss_mask.len(), t.response.len());
        if text.contains("<information>") {
            let observed: String = t
                .response
                .iter()
                .zip(&t.loss_mask)
                .filter(|(_, m)| !**m)
                .map(|(id, _)| tok.decode(&[*id], false).unwrap())
                .collect();
            assert!(observed.contains("information>"), "the observation is not masked: {observed:?}");
            let generated: String = t
                .response
                .iter()
                .zip(&t.loss_mask)
                .filter(|(_, m)| **m)
                .map(|(id, _)| tok.decode(&[*id], false).unwrap())
                .collect();
            assert!(!generated.contains("<information>"), "observation tokens in the loss: {generated:?}");
        }
    }
    // No-tool targets keep their own (no-tool) prompt (released code) and contain no observation.
    for t in ce {
        if nt_prompts.contains(&t.prompt) {
            assert!(t.loss_mask.iter().all(|m| *m));
        }
    }
}

/// Appendix C's DPO term by hand: −log σ(β[(log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))]),
/// sequence log-probs summed over the loss mask. Against the policy itself the margin is 0 and
/// the loss ln 2; against a perturbed reference it is the formula on separately scored log-probs.
#[test]
fn dpo_loss_by_hand() {
    tch::set_num_threads(1);
    let policy = common::policy();
    let tok = policy.tokenizer().unwrap();
    let prompt = tok.encode("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n", false).unwrap();
    let w = tok.encode("<answer> Vobilford </answer>", false).unwrap();
    let l = tok
        .encode("<search> Zolis </search><information> Doc </information><answer> Draitekir </answer>", false)
        .unwrap();
    let obs = tok.encode("<search> Zolis </search>", false).unwrap().len();
    let obs_len = tok.encode("<information> Doc </information>", false).unwrap().len();
    let l_mask: Vec<bool> = (0..l.len()).map(|i| !(obs..obs + obs_len).contains(&i)).collect();
    let pair = knowrl_rl::update::DpoPair {
        chosen: Sequence { prompt: prompt.clone(), response: w.clone(), loss_mask: vec![true; w.len()] },
        rejected: Sequence { prompt: prompt.clone(), response: l.clone(), loss_mask: l_mask.clone() },
    };
    let same = knowrl_rl::update::dpo_backward(&policy, None, std::slice::from_ref(&pair), (0.1, 1.0), 1, 4);
    // f32 sequence log-probs of the policy and of its adapters-off self, scored through the
    // training and the no-grad paths: ~1e-5 apart on some CPUs (AMD EPYC, AVX-512), as below.
    assert!((same - std::f64::consts::LN_2).abs() < 1e-5, "{same}");
    let reference = common::policy();
    // Perturbed in name order (`parameters()`), so every run draws the same noise for each tensor.
    tch::manual_seed(3);
    tch::no_grad(|| {
        for (_, t) in reference.parameters() {
            let _ = t.shallow_clone().g_add_(&(tch::Tensor::randn_like(&t) * 0.02));
        }
    });
    let logp = |p: &knowrl_engine::Policy, resp: &[u32], mask: &[bool]| {
        let s =
            score(&p.lm, &[ScoreRequest { prompt: &prompt, response: resp, loss_mask: Some(mask) }], 1.0, Mode::EVAL);
        (s.logprobs * s.mask).sum(tch::Kind::Float).double_value(&[])
    };
    let margin = (logp(&policy, &w, &vec![true; w.len()]) - logp(&reference, &w, &vec![true; w.len()]))
        - (logp(&policy, &l, &l_mask) - logp(&reference, &l, &l_mask));
    let want = -(1.0 / (1.0 + (-0.1 * margin).exp())).ln();
    let got = knowrl_rl::update::dpo_backward(&policy, Some(&reference), &[pair], (0.1, 1.0), 1, 4);
    println!("margin {margin:.4}: DPO loss {got:.6}, by hand {want:.6}");
    assert!(margin.abs() > 0.1, "the perturbed reference differs ({margin})");
    assert!((got - want).abs() < 1e-5, "{got} vs {want}");
}
