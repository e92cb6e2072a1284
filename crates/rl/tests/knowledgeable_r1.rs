//! Knowledgeable-R1: golden advantages (every branch of T and β), the three objectives' values
//! and gradient signs, and RPK = the PK responses' tokens scored under the context prompt.
mod common;
use knowrl_rl::knowledgeable_r1::{advantages, transform, Beta, KnowledgeableR1Config, PkAdvantage, QuestionRewards};
use knowrl_rl::update::{pg_backward, Normaliser};

const EPS: f64 = 1e-6;

fn q(ck: &[f64], pk: &[f64], ck_tokens: &[f64], pk_tokens: &[f64]) -> QuestionRewards {
    QuestionRewards { ck: ck.into(), pk: pk.into(), ck_tokens: ck_tokens.into(), pk_tokens: pk_tokens.into() }
}

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-9, "{a} vs {b}");
}

#[test]
fn advantages_hand_computed_and_beta_below_zero_ck_is_one() {
    // CK rewards [1, 0], PK [1, 1]. Pool U = {1,0,1,1}: mean 0.75, unbiased std 0.5.
    // CK global (1−.75)/.5 = 0.5, (0−.75)/.5 = −1.5; CK local over {1,0}: ±0.5/0.70711.
    let cfg = KnowledgeableR1Config::default();
    let a = advantages(&cfg, &[q(&[1.0, 0.0], &[1.0, 1.0], &[2.0, 4.0], &[3.0, 3.0])]);
    let s = 0.5f64.sqrt();
    close(a.ck[0][0], 0.25 / (0.5 + EPS) + 0.5 / (s + EPS));
    close(a.ck[0][1], -0.75 / (0.5 + EPS) - 0.5 / (s + EPS));
    close(a.rpk_raw[0][0], 0.25 / (0.5 + EPS));
    // Released code: J_PK uses the global advantage; the paper's local one is 0 here (all PK equal).
    assert_eq!(a.pk, a.rpk_raw);
    let local = advantages(
        &KnowledgeableR1Config { pk_advantage: PkAdvantage::Local, ..cfg.clone() },
        &[q(&[1.0, 0.0], &[1.0, 1.0], &[2.0, 4.0], &[3.0, 3.0])],
    );
    assert_eq!(local.pk, vec![vec![0.0, 0.0]]);
    // Token-weighted E_ck = (1.2071·2 − 2.2071·4)/6 < 0 → β = 1 (released rule).
    assert!(a.sums.0 < 0.0);
    assert_eq!(a.beta, 1.0);
    // The paper's trajectory sums: S_ck = −1 − ..., S_rpk− = 0 (no non-positive RPK) → guard → 1.
    let p = advantages(
        &KnowledgeableR1Config { beta: Beta::AdaptiveTrajectories, ..cfg.clone() },
        &[q(&[1.0, 0.0], &[1.0, 1.0], &[2.0, 4.0], &[3.0, 3.0])],
    );
    assert_eq!(p.sums.2, 0.0);
    assert_eq!(p.beta, 1.0);
    // Ablations: without A_ck-local only the global part remains, and vice versa.
    let g = advantages(
        &KnowledgeableR1Config { ck_local: false, ..cfg.clone() },
        &[q(&[1.0, 0.0], &[1.0, 1.0], &[1.0; 2], &[1.0; 2])],
    );
    close(g.ck[0][0], 0.25 / (0.5 + EPS));
    let l = advantages(
        &KnowledgeableR1Config { ck_global: false, ..cfg },
        &[q(&[1.0, 0.0], &[1.0, 1.0], &[1.0; 2], &[1.0; 2])],
    );
    close(l.ck[0][0], 0.5 / (s + EPS));
}

#[test]
fn beta_clips_at_001_and_at_1_and_is_interior_otherwise() {
    let cfg = KnowledgeableR1Config::default();
    // CK [1,1], PK [0,0]: pool std sqrt(1/3); A_ck = 0.866 (local part 0: all-equal CK group),
    // Â = −0.866. E_ck = 0.866, E_rpk+ = 0, E_rpk− = −0.866 → β = −1 → clipped to 0.01.
    let a = advantages(&cfg, &[q(&[1.0, 1.0], &[0.0, 0.0], &[1.0; 2], &[1.0; 2])]);
    let h = 0.5 / ((1.0f64 / 3.0).sqrt() + EPS);
    close(a.ck[0][0], h);
    close(a.rpk_raw[0][0], -h);
    assert_eq!(a.beta, 0.01);
    close(a.rpk[0][0], -0.01 * h);

    // CK [1,0] and PK [1,0]: A_ck sums to 0 (E_ck = 0); Â = ±h. PK token counts [1, 3]:
    // E_rpk+ = h/4, E_rpk− = −3h/4 → β = (0 − h/4)/(−3h/4) = 1/3 (interior).
    let a = advantages(&cfg, &[q(&[1.0, 0.0], &[1.0, 0.0], &[1.0; 2], &[1.0, 3.0])]);
    close(a.sums.0, 0.0);
    close(a.beta, 1.0 / 3.0);
    close(a.rpk[0][0], h); // positive: kept
    close(a.rpk[0][1], -h / 3.0); // non-positive: × β
                                  // PK token counts [3, 1]: β = (−3h/4)/(−h/4) = 3. Released code keeps 3; the paper's range clips to 1.
    let a = advantages(&cfg, &[q(&[1.0, 0.0], &[1.0, 0.0], &[1.0; 2], &[3.0, 1.0])]);
    close(a.beta, 3.0);
    let c = advantages(
        &KnowledgeableR1Config { beta_upper_clip: true, ..cfg.clone() },
        &[q(&[1.0, 0.0], &[1.0, 0.0], &[1.0; 2], &[3.0, 1.0])],
    );
    assert_eq!(c.beta, 1.0);
    // Paper's trajectory sums: S_ck = 0, S_rpk+ = h, S_rpk− = −h → clip(1) = 1.
    let p = advantages(
        &KnowledgeableR1Config { beta: Beta::AdaptiveTrajectories, ..cfg.clone() },
        &[q(&[1.0, 0.0], &[1.0, 0.0], &[1.0; 2], &[3.0, 1.0])],
    );
    close(p.beta, 1.0);
    // Fixed β.
    let f = advantages(
        &KnowledgeableR1Config { beta: Beta::Fixed, fixed_beta: 0.2, ..cfg },
        &[q(&[1.0, 0.0], &[1.0, 0.0], &[1.0; 2], &[3.0, 1.0])],
    );
    assert_eq!(f.beta, 0.2);
    close(f.rpk[0][1], -0.2 * h);
    assert_eq!(transform(0.0, 0.5), 0.0);
    assert_eq!(transform(-2.0, 0.5), -1.0);
    assert_eq!(transform(2.0, 0.5), 2.0);
}

fn step_ctx_rows(extra: &str) -> (Vec<knowrl_rl::update::PgRow>, Vec<knowrl_rl::task::Task>, Option<Normaliser>) {
    tch::set_num_threads(1);
    let policy = common::policy();
    let r = common::retriever();
    let tasks = common::context_tasks(2);
    let cfg = common::config(
        &std::env::temp_dir().join("knowrl-kr1-unused"),
        1,
        &format!("[method]\nname = \"knowledgeable_r1\"\nn_pk = 3\nn_ck = 2\n{extra}"),
    );
    let ctx = common::ctx(&policy, &r, &cfg);
    let picks: Vec<&knowrl_rl::task::Task> = tasks.iter().collect();
    let out = cfg.method.spec().build().step(&ctx, &picks).unwrap();
    (out.pg_rows().to_vec(), tasks, out.pg_normaliser())
}

#[test]
fn rpk_rows_are_pk_responses_scored_under_the_context_prompt() {
    let (rows, tasks, norm) = step_ctx_rows("");
    let policy = common::policy();
    let tok = policy.tokenizer().unwrap();
    let p_ids: Vec<Vec<u32>> = tasks.iter().map(|t| t.query_only.ids(tok).unwrap()).collect();
    let c_ids: Vec<Vec<u32>> = tasks.iter().map(|t| t.with_context.as_ref().unwrap().ids(tok).unwrap()).collect();
    // 2 questions × (2 CK + 3 RPK + 3 PK) rows.
    assert_eq!(rows.len(), 2 * (2 + 3 + 3));
    let pk: Vec<_> = rows.iter().filter(|r| p_ids.contains(&r.seq.prompt)).collect();
    let under_context: Vec<_> = rows.iter().filter(|r| c_ids.contains(&r.seq.prompt)).collect();
    assert_eq!(pk.len(), 6);
    assert_eq!(under_context.len(), 10);
    for p in &pk {
        let qi = p_ids.iter().position(|x| *x == p.seq.prompt).unwrap();
        // Its RPK twin: same tokens, the same question's context prompt, not the PK prompt.
        let twin = under_context
            .iter()
            .find(|r| r.seq.response == p.seq.response && r.seq.prompt == c_ids[qi])
            .expect("an RPK row with the PK response under p′");
        assert_ne!(twin.seq.prompt, p.seq.prompt);
        // Released default: J_PK's advantage is the untransformed global one, J_RPK's is T(·).
        assert!(twin.advantage == p.advantage || (p.advantage <= 0.0 && twin.advantage >= p.advantage));
    }
    // Scoring the RPK row really conditions on the context: different log-probs from PK's.
    let score = |prompt: &[u32], resp: &[u32]| {
        let s = knowrl_engine::score::score(
            &policy.lm,
            &[knowrl_engine::score::ScoreRequest { prompt, response: resp, loss_mask: None }],
            1.0,
            knowrl_engine::Mode::EVAL,
        );
        s.logprobs.sum(tch::Kind::Float).double_value(&[])
    };
    let p = pk[0];
    let qi = p_ids.iter().position(|x| *x == p.seq.prompt).unwrap();
    assert!((score(&p.seq.prompt, &p.seq.response) - score(&c_ids[qi], &p.seq.response)).abs() > 1e-4);
    // The normaliser counts generated responses once (2 × (3 + 2)), not the 3 objectives' rows.
    let n = norm.unwrap();
    assert_eq!(n.sequences, 10.0);
}

#[test]
fn objectives_values_and_gradient_signs() {
    // Ablations as λ switches: without J_PK / J_RPK the rows disappear.
    let (rows, _, _) = step_ctx_rows("lambda_pk = 0.0");
    assert_eq!(rows.len(), 2 * (2 + 3));
    let (rows, _, _) = step_ctx_rows("lambda_rpk = 0.0");
    assert_eq!(rows.len(), 2 * (2 + 3));
    // Without both, the PK responses carry no objective and leave the normaliser too: it counts
    // the CK responses alone (2 × 2), tokens included.
    let (rows, _, norm) = step_ctx_rows("lambda_pk = 0.0\nlambda_rpk = 0.0");
    let n = norm.unwrap();
    assert_eq!((rows.len(), n.sequences), (2 * 2, 4.0));
    assert_eq!(n.tokens, rows.iter().map(|r| r.seq.loss_mask.iter().filter(|m| **m).count() as f64).sum::<f64>());

    // On hand-made rows: at ratio 1 the clipped surrogate is −A per token, so the batch loss is
    // −Σ_rows λ·A·|o| / N_tokens; a positive-advantage row's log-prob rises after a step and a
    // negative one's falls.
    tch::set_num_threads(1);
    let policy = common::policy();
    let tok = policy.tokenizer().unwrap();
    let prompt = tok.encode("<|im_start|>user\nQuestion<|im_end|>\n<|im_start|>assistant\n", false).unwrap();
    let good = tok.encode("<answer> Vobilford </answer>", false).unwrap();
    let bad = tok.encode("<answer> Draitekir </answer>", false).unwrap();
    let row = |resp: &Vec<u32>, a: f64, w: f64| {
        let seq = knowrl_rl::update::Sequence {
            prompt: prompt.clone(),
            response: resp.clone(),
            loss_mask: vec![true; resp.len()],
        };
        knowrl_rl::update::PgRow::new(seq, a, w)
    };
    let rows = vec![row(&good, 1.5, 1.0), row(&bad, -0.5, 2.0)];
    let norm = Normaliser { tokens: 10.0, sequences: 2.0 };
    let cfg = common::config(&std::env::temp_dir().join("knowrl-kr1-unused"), 1, "");
    let params = policy.trainable_parameters();
    for (_, p) in &params {
        p.shallow_clone().zero_grad();
    }
    let st = pg_backward(&policy, None, &rows, norm, &cfg.algorithm, 1.0, 8);
    let want = -(1.0 * 1.5 * good.len() as f64 + 2.0 * -0.5 * bad.len() as f64) / 10.0;
    assert!((st.loss - want).abs() < 1e-5, "{} vs {want}", st.loss);
    let lp = |resp: &Vec<u32>| {
        let s = knowrl_engine::score::score(
            &policy.lm,
            &[knowrl_engine::score::ScoreRequest { prompt: &prompt, response: resp, loss_mask: None }],
            1.0,
            knowrl_engine::Mode::EVAL,
        );
        s.logprobs.sum(tch::Kind::Float).double_value(&[])
    };
    // Each objective's gradient alone, one small SGD step: a row with A > 0 gains log-prob, a row
    // with A < 0 loses it (rows are stepped separately: they share the answer tags).
    let step_on = |r: &knowrl_rl::update::PgRow| {
        for (_, p) in &params {
            p.shallow_clone().zero_grad();
        }
        let before: Vec<tch::Tensor> = params.iter().map(|(_, p)| p.detach().copy()).collect();
        let lp0 = lp(&r.seq.response);
        pg_backward(&policy, None, std::slice::from_ref(r), norm, &cfg.algorithm, 1.0, 8);
        tch::no_grad(|| {
            for (_, p) in &params {
                let g = p.grad();
                if g.defined() {
                    let _ = p.shallow_clone().f_sub_(&(g * 1e-2)).unwrap();
                }
            }
        });
        let lp1 = lp(&r.seq.response);
        tch::no_grad(|| {
            for ((_, p), b) in params.iter().zip(&before) {
                p.shallow_clone().copy_(b);
            }
        });
        lp1 - lp0
    };
    assert!(step_on(&rows[0]) > 0.0, "positive advantage: log-prob must rise");
    assert!(step_on(&rows[1]) < 0.0, "negative advantage: log-prob must fall");
}

/// The advantages `step` gives each row are `advantages()` of the rewards of the responses they
/// carry (the indexing from questions and samples to rows): rewards recomputed from each row's
/// own response, in the order the step lays rows out (question by question: its CK rows, then
/// each PK response's RPK and PK rows).
#[test]
fn step_assigns_each_row_the_advantage_of_its_own_reward() {
    use knowrl_rl::agent::{parse_action, Action};
    let (rows, tasks, _) = step_ctx_rows("");
    let policy = common::policy();
    let tok = policy.tokenizer().unwrap();
    let reward = |r: &knowrl_rl::update::PgRow, q: usize| {
        let text = tok.decode(&r.seq.response, true).unwrap();
        let answer = match parse_action(&text) {
            Action::Answer(a) => Some(a),
            _ => None,
        };
        knowrl_rl::reward::reward(knowrl_rl::reward::RewardKind::Em, answer.as_deref(), &tasks[q].golden)
    };
    let len = |r: &knowrl_rl::update::PgRow| r.seq.loss_mask.iter().filter(|m| **m).count() as f64;
    let (n_ck, n_pk) = (2, 3);
    let per_question = n_ck + 2 * n_pk;
    let ck_of = |q: usize| &rows[q * per_question..q * per_question + n_ck];
    let pk_of = |q: usize| &rows[q * per_question + n_ck..(q + 1) * per_question];
    let batch: Vec<QuestionRewards> = (0..2)
        .map(|q| {
            let ck = ck_of(q);
            let pk: Vec<_> = pk_of(q).iter().skip(1).step_by(2).collect();
            QuestionRewards {
                ck: ck.iter().map(|r| reward(r, q)).collect(),
                pk: pk.iter().map(|r| reward(r, q)).collect(),
                ck_tokens: ck.iter().map(len).collect(),
                pk_tokens: pk.iter().map(|r| len(r)).collect(),
            }
        })
        .collect();
    let want = advantages(&KnowledgeableR1Config { n_pk, n_ck, ..Default::default() }, &batch);
    for q in 0..2 {
        for i in 0..n_ck {
            assert_eq!(ck_of(q)[i].advantage, want.ck[q][i], "CK row {q}/{i}");
        }
        for i in 0..n_pk {
            let (rpk, pk) = (&pk_of(q)[2 * i], &pk_of(q)[2 * i + 1]);
            assert_eq!(rpk.seq.response, pk.seq.response);
            assert_eq!(rpk.advantage, want.rpk[q][i], "RPK row {q}/{i}");
            assert_eq!(pk.advantage, want.pk[q][i], "PK row {q}/{i}");
        }
    }
    let rewards: Vec<f64> = batch.iter().flat_map(|q| q.ck.iter().chain(&q.pk).copied()).collect();
    println!("rewards {rewards:?}, beta {}", want.beta);
    assert!(rewards.iter().any(|r| *r != rewards[0]), "the batch has no reward variance: the check would be vacuous");
}
