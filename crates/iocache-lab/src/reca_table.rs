//! ReCA's category vectors measured rather than guessed: one generated
//! reference workload per category of the built-in table (that category's
//! defining behaviour in TPDS'18 §3.3, `examples/workloads/reca-reference/`),
//! classified by the same classifier the controller uses, and the measured
//! workload vector set beside the table's (`iocache lab reca-table`).

use iocache_core::reca::{CategoryTable, Features, RecaControllerParams, FEATURE_NAMES};
use iocache_sim::reca::reca_characterize;
use iocache_sim::workload::WorkloadSpec;

use crate::error::{invalid, Result};
use crate::reproduce::{gen_reader, workload};

/// Requests per reference workload the built-in table's vectors were
/// measured with.
pub const REFERENCE_REQUESTS: u64 = 100_000;

/// The reference workloads, by the category they stand for.
pub const REFERENCES: [(&str, &str); 5] = [
    (
        "random_consumers",
        include_str!("../../../examples/workloads/reca-reference/random_consumers.toml"),
    ),
    (
        "sequential_producer_consumers",
        include_str!("../../../examples/workloads/reca-reference/sequential_producer_consumers.toml"),
    ),
    (
        "random_producer_consumers",
        include_str!("../../../examples/workloads/reca-reference/random_producer_consumers.toml"),
    ),
    (
        "archival_consumers",
        include_str!("../../../examples/workloads/reca-reference/archival_consumers.toml"),
    ),
    (
        "large_file_generators",
        include_str!("../../../examples/workloads/reca-reference/large_file_generators.toml"),
    ),
];

/// One category's reference workload, as the classifier saw it.
#[derive(Clone, Debug)]
pub struct Measured {
    pub category: String,
    pub requests: u64,
    pub classified: u64,
    /// The workload vector over the whole reference workload.
    pub measured: Features,
    /// The table's vector for this category (none: not in the table).
    pub table: Option<Features>,
    /// The table's category nearest to the measured vector, and its distance.
    pub nearest: String,
    pub nearest_distance: f64,
}

/// `spec` with its phases' requests scaled to `requests` in all (each
/// phase keeps its share, at least one request).
fn scaled(mut spec: WorkloadSpec, requests: u64) -> WorkloadSpec {
    let total: u64 = spec.phases.iter().map(|p| p.requests).sum::<u64>().max(1);
    for p in &mut spec.phases {
        p.requests = ((u128::from(p.requests) * u128::from(requests) / u128::from(total)) as u64).max(1);
    }
    spec
}

/// Generates each reference workload with `requests` requests, classifies
/// it (one window over the whole workload) and matches the vector against
/// `table`.
pub fn derive(table: &CategoryTable, requests: u64) -> Result<Vec<Measured>> {
    if table.categories.is_empty() {
        return Err(invalid!("the category table is empty"));
    }
    let mut out = Vec::new();
    for (category, text) in REFERENCES {
        let spec = scaled(workload(text)?, requests.max(1));
        let total = spec.phases.iter().map(|p| p.requests).sum();
        let params = RecaControllerParams {
            window_requests: total,
            ..RecaControllerParams::default()
        };
        let seen = reca_characterize(&mut gen_reader(&spec)?, table, params)?;
        let measured = Features(seen.features);
        let (best, distances) = table.nearest(&measured);
        out.push(Measured {
            category: category.to_string(),
            requests: total,
            classified: seen.classified,
            measured,
            table: table.find(category).map(|i| table.categories[i].features),
            nearest: table.categories[best].name.clone(),
            nearest_distance: distances[best],
        });
    }
    Ok(out)
}

/// The measured vectors beside the table's, one row per category and
/// source, as text.
pub fn render(rows: &[Measured]) -> String {
    let short = ["sr", "sw", "tr", "tw", "rr", "rw", "ov"];
    let mut s = format!("{:<31} {:<8}", "category", "vector");
    for n in short {
        s += &format!(" {n:>5}");
    }
    s += "  nearest in the table (distance)\n";
    for r in rows {
        let line = |label: &str, f: &Features| {
            let mut l = format!("{:<31} {label:<8}", r.category);
            for v in f.0 {
                l += &format!(" {v:>5.3}");
            }
            l
        };
        s += &line("measured", &r.measured);
        s += &format!("  {} ({:.3})\n", r.nearest, r.nearest_distance);
        if let Some(t) = &r.table {
            s += &line("table", t);
            s += &format!("  distance to measured {:.3}\n", t.distance(&r.measured));
        }
    }
    s
}

/// `f` in hundredths: the six class shares rounded so that they still sum
/// to 1 (largest remainders first), the overlapped share rounded alone.
pub fn hundredths(f: &Features) -> [u32; 7] {
    let mut out = [0u32; 7];
    let mut rest: Vec<(f64, usize)> = Vec::new();
    for (i, v) in f.0[..6].iter().enumerate() {
        let h = v * 100.0;
        out[i] = h.floor() as u32;
        rest.push((h - h.floor(), i));
    }
    let total: u32 = out[..6].iter().sum();
    if total > 0 || f.0[..6].iter().any(|v| *v > 0.0) {
        rest.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for (_, i) in rest.iter().take(100usize.saturating_sub(total as usize)) {
            out[*i] += 1;
        }
    }
    out[6] = (f.0[6] * 100.0).round() as u32;
    out
}

/// The measured vectors as the TOML keys of `reca-categories.toml`
/// (in hundredths, [`hundredths`]), one block per category.
pub fn render_toml(rows: &[Measured]) -> String {
    let mut s = String::new();
    for r in rows {
        s += &format!(
            "# {}: measured on examples/workloads/reca-reference/{}.toml, {} requests\n",
            r.category, r.category, r.requests
        );
        for (name, h) in FEATURE_NAMES.iter().zip(hundredths(&r.measured)) {
            s += &format!("{name} = {:.2}\n", f64::from(h) / 100.0);
        }
        s += "\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reference workload, small, is classified into its own
    /// category by the built-in table: swapping two categories' vectors in
    /// the table breaks this.
    #[test]
    fn each_reference_workload_is_its_own_category_in_the_builtin_table() {
        let rows = derive(&CategoryTable::builtin(), 20_000).unwrap();
        assert_eq!(rows.len(), REFERENCES.len());
        for r in &rows {
            assert_eq!(r.nearest, r.category, "{}", render(&rows));
            assert!(
                r.classified >= r.requests * 9 / 10,
                "{}: {} classified",
                r.category,
                r.classified
            );
        }
    }

    /// The check above fails when two categories' vectors trade places.
    #[test]
    fn swapped_vectors_are_caught() {
        let mut table = CategoryTable::builtin();
        let a = table.find("random_consumers").unwrap();
        let b = table.find("large_file_generators").unwrap();
        let (fa, fb) = (table.categories[a].features, table.categories[b].features);
        table.categories[a].features = fb;
        table.categories[b].features = fa;
        let rows = derive(&table, 20_000).unwrap();
        assert!(rows.iter().any(|r| r.nearest != r.category), "{}", render(&rows));
    }

    /// The built-in table's vectors are the ones measured on the reference
    /// workloads at `REFERENCE_REQUESTS` (in hundredths).
    #[test]
    fn the_builtin_vectors_are_the_measured_ones() {
        let rows = derive(&CategoryTable::builtin(), REFERENCE_REQUESTS).unwrap();
        for r in &rows {
            let t = r.table.expect("every reference category is in the table");
            let h = hundredths(&r.measured);
            for (i, (m, v)) in h.iter().zip(t.0).enumerate() {
                assert!(
                    (f64::from(*m) / 100.0 - v).abs() < 1e-9,
                    "{} {}: measured {m} hundredths, table {v:.3}\n{}",
                    r.category,
                    FEATURE_NAMES[i],
                    render_toml(&rows)
                );
            }
        }
    }

    #[test]
    fn hundredths_keep_the_six_shares_summing_to_one() {
        let h = hundredths(&Features([0.787, 0.0, 0.197, 0.0, 0.016, 0.0, 0.004]));
        assert_eq!(h, [79, 0, 20, 0, 1, 0, 0]);
        let h = hundredths(&Features([1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.0, 0.0, 0.0, 0.5]));
        assert_eq!(h[..6].iter().sum::<u32>(), 100);
        assert_eq!(h[6], 50);
        assert_eq!(hundredths(&Features::default()), [0; 7]);
    }

    #[test]
    fn scaling_keeps_each_phase_share() {
        let spec = scaled(workload(REFERENCES[3].1).unwrap(), 1_000);
        let phases: Vec<u64> = spec.phases.iter().map(|p| p.requests).collect();
        assert_eq!(phases, vec![800, 200]);
    }
}
