//! Group-relative advantages (GRPO, Shao et al. 2024, §4.1.2 outcome supervision):
//! Â_i = (r_i − mean(r_group)) / (std(r_group) + ε), the same for every token of response i.
//! As verl computes it: std is the unbiased (N−1) estimate, ε = 1e-6, and a singleton group
//! gets mean 0 and std 1 (so its advantage is its raw reward).

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Normalisation {
    /// (r − mean) / (std + ε): GRPO.
    MeanStd,
    /// r − mean: Dr. GRPO (Liu et al. 2025) drops the std division.
    MeanOnly,
}

pub const EPS: f64 = 1e-6;

/// Mean and unbiased std of a group, with verl's singleton convention.
pub fn group_stats(rewards: &[f64]) -> (f64, f64) {
    let n = rewards.len();
    if n <= 1 {
        return (0.0, 1.0);
    }
    let mean = rewards.iter().sum::<f64>() / n as f64;
    let var = rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, var.sqrt())
}

/// Advantages for rewards grouped by `group[i]` (the prompt a response answers).
pub fn group_advantages(rewards: &[f64], group: &[usize], norm: Normalisation) -> Vec<f64> {
    use std::collections::HashMap;
    let mut members: HashMap<usize, Vec<f64>> = HashMap::new();
    for (r, g) in rewards.iter().zip(group) {
        members.entry(*g).or_default().push(*r);
    }
    let stats: HashMap<usize, (f64, f64)> = members.iter().map(|(g, v)| (*g, group_stats(v))).collect();
    rewards
        .iter()
        .zip(group)
        .map(|(r, g)| {
            let (m, s) = stats[g];
            match norm {
                Normalisation::MeanStd => (r - m) / (s + EPS),
                Normalisation::MeanOnly => r - m,
            }
        })
        .collect()
}

/// Groups whose rewards are all equal carry no signal; DAPO's dynamic sampling drops them.
pub fn informative_groups(rewards: &[f64], group: &[usize]) -> std::collections::BTreeSet<usize> {
    use std::collections::BTreeMap;
    let mut seen: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
    for (r, g) in rewards.iter().zip(group) {
        let e = seen.entry(*g).or_insert((*r, *r));
        e.0 = e.0.min(*r);
        e.1 = e.1.max(*r);
    }
    seen.into_iter().filter(|(_, (lo, hi))| hi > lo).map(|(g, _)| g).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpo_advantages_hand_computed() {
        // Group 0: rewards 1, 0, 0, 1 → mean 0.5, unbiased std sqrt(1/3) = 0.57735.
        // Group 1: all equal → advantage 0. Group 2: singleton 0.7 → mean 0, std 1 → 0.7/(1+ε).
        let r = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.7];
        let g = [0, 0, 0, 0, 1, 1, 2];
        let a = group_advantages(&r, &g, Normalisation::MeanStd);
        let s = (1.0f64 / 3.0).sqrt();
        let want = [0.5 / (s + EPS), -0.5 / (s + EPS), -0.5 / (s + EPS), 0.5 / (s + EPS), 0.0, 0.0, 0.7 / (1.0 + EPS)];
        for (x, y) in a.iter().zip(want) {
            assert!((x - y).abs() < 1e-12, "{a:?}");
        }
        assert!((a[0] - 0.866_024_9).abs() < 1e-6);
        let d = group_advantages(&r, &g, Normalisation::MeanOnly);
        assert_eq!(d, vec![0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.7]);
        assert_eq!(informative_groups(&r, &g).into_iter().collect::<Vec<_>>(), vec![0]);
    }
}
