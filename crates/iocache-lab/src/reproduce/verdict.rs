//! A reproduction's verdict must follow from the
//! numbers, not from prose written after looking at them. Each claim of a
//! paper is a [`Check`] with the paper's figure, ours and a stated
//! tolerance; [`Check::outcome`] classifies it as reproduced in direction
//! and size, partially (direction only) or not, and says why. The rules are
//! plain functions of the numbers, so a unit test can feed them crafted
//! values.

use serde::{Deserialize, Serialize};

/// How close our size must be to the paper's: within a factor, or within
/// a number of points (the unit of the claim), whichever is looser. Either
/// may be absent.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    pub factor: Option<f64>,
    pub points: Option<f64>,
}

impl Tolerance {
    pub const fn factor(f: f64) -> Tolerance {
        Tolerance {
            factor: Some(f),
            points: None,
        }
    }

    pub const fn points(p: f64) -> Tolerance {
        Tolerance {
            factor: None,
            points: Some(p),
        }
    }

    pub const fn either(f: f64, p: f64) -> Tolerance {
        Tolerance {
            factor: Some(f),
            points: Some(p),
        }
    }

    fn describe(&self) -> String {
        match (self.factor, self.points) {
            (Some(f), Some(p)) => format!("within a factor of {f} or {p} points"),
            (Some(f), None) => format!("within a factor of {f}"),
            (None, Some(p)) => format!("within {p} points"),
            (None, None) => "any size".into(),
        }
    }
}

/// What is compared.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Check {
    /// An effect against a neutral value (1 for a ratio, 0 for a
    /// difference): the paper reports a value or a range `[paper_lo,
    /// paper_hi]` on one side of `neutral`. Direction: ours is on the same
    /// side, at least `min_effect` away from `neutral`. Size: ours is in the
    /// paper's range widened by `tolerance`.
    Effect {
        paper_lo: f64,
        paper_hi: f64,
        ours: f64,
        neutral: f64,
        min_effect: f64,
        tolerance: Tolerance,
    },
    /// An effect measured on a machine whose own noise is `noise` (on the
    /// scale of `min_effect`): decided as [`Check::Effect`] with `noise`
    /// as the smallest effect, but an effect within the noise is
    /// undecided, not "no effect".
    EffectOverNoise {
        paper_lo: f64,
        paper_hi: f64,
        ours: f64,
        neutral: f64,
        noise: f64,
        tolerance: Tolerance,
    },
    /// A statement that holds in `held` of `cases` cases (workloads,
    /// devices): reproduced when it holds in at least `most` (a share) of
    /// them, partially when in at least `some`, not otherwise.
    Share {
        held: usize,
        cases: usize,
        most: f64,
        some: f64,
    },
}

/// The three verdicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Reproduced,
    Partially,
    Not,
    /// The machine cannot decide: the effect is within its measured noise.
    Undecided,
}

impl Outcome {
    pub fn text(self) -> &'static str {
        match self {
            Outcome::Reproduced => "reproduced in direction and size",
            Outcome::Partially => "partially reproduced",
            Outcome::Not => "not reproduced",
            Outcome::Undecided => "undecided (within this machine's noise)",
        }
    }

    /// Several claims' outcomes as one: every decided claim reproduced,
    /// none at all, or something between; undecided claims count for
    /// neither (undecided when no claim was decided).
    pub fn combine(outcomes: impl IntoIterator<Item = Outcome>) -> Option<Outcome> {
        let every: Vec<Outcome> = outcomes.into_iter().collect();
        let all: Vec<Outcome> = every
            .iter()
            .copied()
            .filter(|o| *o != Outcome::Undecided)
            .collect();
        if all.is_empty() {
            (!every.is_empty()).then_some(Outcome::Undecided)
        } else if all.iter().all(|o| *o == Outcome::Reproduced) {
            Some(Outcome::Reproduced)
        } else if all.iter().all(|o| *o == Outcome::Not) {
            Some(Outcome::Not)
        } else {
            Some(Outcome::Partially)
        }
    }
}

fn num(v: f64) -> String {
    if v == 0.0 || (v.abs() >= 0.01 && v.abs() < 1e6) {
        let s = format!("{v:.3}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    } else {
        format!("{v:.3e}")
    }
}

impl Check {
    /// [`Check::Effect`] against the paper's single value `paper` (not a
    /// range).
    pub fn effect(paper: f64, ours: f64, neutral: f64, min_effect: f64, tolerance: Tolerance) -> Check {
        Check::Effect {
            paper_lo: paper,
            paper_hi: paper,
            ours,
            neutral,
            min_effect,
            tolerance,
        }
    }

    /// [`Check::EffectOverNoise`] against the paper's single value `paper`.
    pub fn effect_over_noise(paper: f64, ours: f64, neutral: f64, noise: f64, tolerance: Tolerance) -> Check {
        Check::EffectOverNoise {
            paper_lo: paper,
            paper_hi: paper,
            ours,
            neutral,
            noise,
            tolerance,
        }
    }

    /// [`Check::Share`] for a statement the paper makes of most cases:
    /// reproduced when it holds in 75 % of them, partially from 25 %.
    pub fn most(held: usize, cases: usize) -> Check {
        Check::Share {
            held,
            cases,
            most: 0.75,
            some: 0.25,
        }
    }

    /// The verdict and the reason, from the numbers alone.
    pub fn outcome(&self) -> (Outcome, String) {
        match *self {
            Check::EffectOverNoise {
                paper_lo,
                paper_hi,
                ours,
                neutral,
                noise,
                tolerance,
            } => {
                if ours.is_finite() && (ours - neutral).abs() <= noise {
                    return (
                        Outcome::Undecided,
                        format!(
                            "undecided: ours {} is within this machine's noise ({}) of the neutral {}",
                            num(ours),
                            num(noise),
                            num(neutral)
                        ),
                    );
                }
                Check::Effect {
                    paper_lo,
                    paper_hi,
                    ours,
                    neutral,
                    min_effect: noise,
                    tolerance,
                }
                .outcome()
            }
            Check::Effect {
                paper_lo,
                paper_hi,
                ours,
                neutral,
                min_effect,
                tolerance,
            } => {
                let (lo, hi) = (paper_lo.min(paper_hi), paper_lo.max(paper_hi));
                let paper = if lo == hi {
                    num(lo)
                } else {
                    format!("{}–{}", num(lo), num(hi))
                };
                if !ours.is_finite() {
                    return (
                        Outcome::Not,
                        format!("ours is not a number ({ours}); paper {paper}"),
                    );
                }
                let paper_side = ((lo + hi) / 2.0 - neutral).signum();
                let effect = ours - neutral;
                if effect.abs() < min_effect {
                    return (
                        Outcome::Not,
                        format!(
                            "no effect: ours {} is within {} of the neutral {} (paper {paper})",
                            num(ours),
                            num(min_effect),
                            num(neutral)
                        ),
                    );
                }
                if effect.signum() != paper_side {
                    return (
                        Outcome::Not,
                        format!(
                            "opposite direction: ours {} is on the other side of {} from the paper's {paper}",
                            num(ours),
                            num(neutral)
                        ),
                    );
                }
                let by_factor = tolerance.factor.is_some_and(|f| {
                    // A factor compares magnitudes on the paper's side.
                    let (o, l, h) = (ours.abs(), lo.abs().min(hi.abs()), lo.abs().max(hi.abs()));
                    o >= l / f && o <= h * f && ours.signum() == ((lo + hi) / 2.0).signum()
                });
                let by_points = tolerance.points.is_some_and(|p| ours >= lo - p && ours <= hi + p);
                if by_factor || by_points {
                    (
                        Outcome::Reproduced,
                        format!(
                            "same direction, and ours {} is {} of the paper's {paper}",
                            num(ours),
                            tolerance.describe()
                        ),
                    )
                } else {
                    (
                        Outcome::Partially,
                        format!(
                            "same direction, but ours {} is not {} of the paper's {paper}",
                            num(ours),
                            tolerance.describe()
                        ),
                    )
                }
            }
            Check::Share {
                held,
                cases,
                most,
                some,
            } => {
                if cases == 0 {
                    return (Outcome::Not, "no cases to check".into());
                }
                let share = held as f64 / cases as f64;
                let outcome = if share >= most {
                    Outcome::Reproduced
                } else if share >= some && held > 0 {
                    Outcome::Partially
                } else {
                    Outcome::Not
                };
                (
                    outcome,
                    format!(
                        "holds in {held} of {cases} cases ({:.0} %; reproduced from {:.0} %, partially from {:.0} %)",
                        share * 100.0,
                        most * 100.0,
                        some * 100.0
                    ),
                )
            }
        }
    }
}

/// In how many of the cases counted so far a statement held, for a
/// [`Check::Share`]; shown as "HELD of CASES".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub held: usize,
    pub cases: usize,
}

impl Tally {
    /// One more case, in which the statement `held` or not.
    pub fn count(&mut self, held: bool) {
        self.cases += 1;
        self.held += usize::from(held);
    }

    /// [`Check::most`] of the cases counted.
    pub fn most(self) -> Check {
        Check::most(self.held, self.cases)
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of {}", self.held, self.cases)
    }
}

/// One claim of a paper and what we measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Claim {
    /// Where the paper says it (`Fig. 8`, `Table IV`).
    pub source: String,
    /// The claim, in our words, with the paper's number.
    pub claim: String,
    /// What we measured, in words, with our numbers.
    pub ours: String,
    pub check: Check,
    pub outcome: Outcome,
    pub why: String,
}

impl Claim {
    pub fn new(source: &str, claim: impl Into<String>, ours: impl Into<String>, check: Check) -> Claim {
        let (outcome, why) = check.outcome();
        Claim {
            source: source.into(),
            claim: claim.into(),
            ours: ours.into(),
            check,
            outcome,
            why,
        }
    }
}

/// A reproduction's whole verdict (written as `verdict.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Verdict {
    pub name: String,
    pub paper: String,
    /// The combined outcome of the claims checked; absent when none was.
    pub outcome: Option<Outcome>,
    pub claims: Vec<Claim>,
    /// What was not run, and why (a missing trace, a part not built).
    pub skipped: Vec<String>,
    /// The figures written, relative to the output directory.
    pub figures: Vec<String>,
    /// The commands and settings used, for the record.
    pub setup: Vec<String>,
}

impl Verdict {
    pub fn new(name: &str, paper: &str) -> Verdict {
        Verdict {
            name: name.into(),
            paper: paper.into(),
            outcome: None,
            claims: Vec::new(),
            skipped: Vec::new(),
            figures: Vec::new(),
            setup: Vec::new(),
        }
    }

    pub fn push(&mut self, claim: Claim) {
        self.claims.push(claim);
        self.outcome = Outcome::combine(self.claims.iter().map(|c| c.outcome));
    }

    /// As Markdown: the overall verdict, a table of claims, skips, figures.
    pub fn markdown(&self) -> String {
        let mut out = format!("# {}: {}\n\n", self.name, self.paper);
        out += &format!(
            "**Verdict: {}.**\n\n",
            self.outcome.map_or("nothing checked", Outcome::text)
        );
        if !self.claims.is_empty() {
            out += "| source | the paper | ours | verdict | why |\n|---|---|---|---|---|\n";
            for c in &self.claims {
                out += &format!(
                    "| {} | {} | {} | {} | {} |\n",
                    cell(&c.source),
                    cell(&c.claim),
                    cell(&c.ours),
                    c.outcome.text(),
                    cell(&c.why)
                );
            }
            out += "\n";
        }
        if !self.skipped.is_empty() {
            out += "Skipped or not built:\n\n";
            for s in &self.skipped {
                out += &format!("- {s}\n");
            }
            out += "\n";
        }
        if !self.figures.is_empty() {
            out += "Figures:\n\n";
            for f in &self.figures {
                out += &format!("![{f}]({f})\n\n");
            }
        }
        if !self.setup.is_empty() {
            out += "Setup:\n\n";
            for s in &self.setup {
                out += &format!("- {s}\n");
            }
        }
        out
    }

    /// As text for the terminal.
    pub fn text(&self) -> String {
        let mut out = format!(
            "{} ({}): {}\n",
            self.name,
            self.paper,
            self.outcome.map_or("nothing checked", Outcome::text)
        );
        for c in &self.claims {
            out += &format!(
                "  [{}] {}\n      paper: {}\n      ours:  {}\n      why:   {}\n",
                c.outcome.text(),
                c.source,
                c.claim,
                c.ours,
                c.why
            );
        }
        for s in &self.skipped {
            out += &format!("  skipped: {s}\n");
        }
        out
    }
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effect(paper: f64, ours: f64, neutral: f64, tolerance: Tolerance) -> Outcome {
        Check::effect(paper, ours, neutral, 0.01, tolerance).outcome().0
    }

    #[test]
    fn ratios_are_classified_by_direction_then_size() {
        // The paper: 3x. Within a factor of 2 of it: reproduced.
        assert_eq!(effect(3.0, 2.0, 1.0, Tolerance::factor(2.0)), Outcome::Reproduced);
        assert_eq!(effect(3.0, 5.9, 1.0, Tolerance::factor(2.0)), Outcome::Reproduced);
        // Right direction, too small or too large: partially.
        assert_eq!(effect(3.0, 1.2, 1.0, Tolerance::factor(2.0)), Outcome::Partially);
        assert_eq!(effect(3.0, 7.0, 1.0, Tolerance::factor(2.0)), Outcome::Partially);
        // The other way, or no effect at all: not.
        assert_eq!(effect(3.0, 0.8, 1.0, Tolerance::factor(2.0)), Outcome::Not);
        assert_eq!(effect(3.0, 1.005, 1.0, Tolerance::factor(2.0)), Outcome::Not);
        // A drop (ratio below 1): same rules on the other side.
        assert_eq!(
            effect(0.25, 0.4, 1.0, Tolerance::factor(2.0)),
            Outcome::Reproduced
        );
        assert_eq!(effect(0.25, 0.9, 1.0, Tolerance::factor(2.0)), Outcome::Partially);
        assert_eq!(effect(0.25, 1.3, 1.0, Tolerance::factor(2.0)), Outcome::Not);
    }

    #[test]
    fn points_and_ranges() {
        // The paper: 27.38 %; ours 27.40 within 0.1 points.
        assert_eq!(
            effect(27.38, 27.40, 0.0, Tolerance::points(0.1)),
            Outcome::Reproduced
        );
        assert_eq!(
            effect(27.38, 27.60, 0.0, Tolerance::points(0.1)),
            Outcome::Partially
        );
        // A factor or points, whichever is looser: 4.1 % vs 1.5 % (factor 2.7,
        // 2.6 points).
        assert_eq!(
            effect(4.1, 1.5, 0.0, Tolerance::either(2.0, 3.0)),
            Outcome::Reproduced
        );
        assert_eq!(
            effect(4.1, 1.5, 0.0, Tolerance::either(2.0, 1.0)),
            Outcome::Partially
        );
        assert_eq!(effect(4.1, -1.5, 0.0, Tolerance::either(2.0, 3.0)), Outcome::Not);
        // A range: the paper's 52–94 % reduction.
        let range = |ours| {
            Check::Effect {
                paper_lo: 52.0,
                paper_hi: 94.0,
                ours,
                neutral: 0.0,
                min_effect: 1.0,
                tolerance: Tolerance::points(10.0),
            }
            .outcome()
            .0
        };
        assert_eq!(range(60.0), Outcome::Reproduced);
        assert_eq!(range(43.0), Outcome::Reproduced);
        assert_eq!(range(20.0), Outcome::Partially);
        assert_eq!(range(0.5), Outcome::Not);
        assert_eq!(range(-30.0), Outcome::Not);
        assert_eq!(range(f64::NAN), Outcome::Not);
    }

    #[test]
    fn shares_and_combination() {
        let share = |held, cases| Check::most(held, cases).outcome().0;
        assert_eq!(share(4, 4), Outcome::Reproduced);
        assert_eq!(share(3, 4), Outcome::Reproduced);
        assert_eq!(share(1, 4), Outcome::Partially);
        assert_eq!(share(0, 4), Outcome::Not);
        assert_eq!(share(0, 0), Outcome::Not);
        use Outcome::*;
        assert_eq!(Outcome::combine([Reproduced, Reproduced]), Some(Reproduced));
        assert_eq!(Outcome::combine([Reproduced, Not]), Some(Partially));
        assert_eq!(Outcome::combine([Not, Not]), Some(Not));
        assert_eq!(Outcome::combine([]), None);
        // Undecided claims count for neither side.
        assert_eq!(Outcome::combine([Reproduced, Undecided]), Some(Reproduced));
        assert_eq!(Outcome::combine([Not, Undecided]), Some(Not));
        assert_eq!(Outcome::combine([Undecided, Undecided]), Some(Undecided));
    }

    #[test]
    fn tallies_count_cases_and_the_ones_that_held() {
        let mut t = Tally::default();
        for held in [true, false, true, true] {
            t.count(held);
        }
        assert_eq!(t, Tally { held: 3, cases: 4 });
        assert_eq!(t.to_string(), "3 of 4");
        assert_eq!(t.most(), Check::most(3, 4));
    }

    #[test]
    fn an_effect_within_the_noise_is_undecided() {
        let check = |ours: f64| {
            Check::effect_over_noise(3.0, ours, 1.0, 0.2, Tolerance::factor(2.0))
                .outcome()
                .0
        };
        assert_eq!(check(1.1), Outcome::Undecided);
        assert_eq!(check(0.85), Outcome::Undecided);
        assert_eq!(check(2.5), Outcome::Reproduced);
        assert_eq!(check(1.3), Outcome::Partially);
        assert_eq!(check(0.5), Outcome::Not, "beyond the noise, the other way");
        assert_eq!(check(f64::NAN), Outcome::Not);
    }

    #[test]
    fn verdicts_round_trip_through_json() {
        let mut v = Verdict::new("x", "Paper");
        v.push(Claim::new(
            "Fig. 1",
            "3x",
            "2x",
            Check::effect(3.0, 2.0, 1.0, 0.01, Tolerance::factor(2.0)),
        ));
        let text = serde_json::to_string(&v).unwrap();
        let back: Verdict = serde_json::from_str(&text).unwrap();
        assert_eq!(back.outcome, Some(Outcome::Reproduced));
        assert!(v.markdown().contains("reproduced in direction and size"));
    }
}
