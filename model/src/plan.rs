//! The plan: what one pass would do, each operation with its cause.
//!
//! The same value is printed by `reconcile --dry-run` and carried out by
//! `reconcile`: there is no second place that decides. Printing is
//! deterministic (operations sorted by target) and Terraform-like:
//!
//! ```text
//! + sandbox default/default   create      no container with these labels
//! Plan: 1 to create, 0 to change, 0 to remove.
//! ```
//!
//! A pass whose first operations change the egress proxy plans in
//! [`Staged`] form: the later stages are what the planner predicts once
//! the stage before has been carried out (the proxy set up, then running
//! and healthy; the sandboxes that waited on it), printed and put in the
//! JSON beside the first, so that the dry run shows every operation the
//! pass will carry out.

use std::fmt;

use serde::Serialize;

pub use crate::settings::Change;

/// What an operation acts on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// The egress proxy daemon.
    Proxy,
    /// A sandbox of a profile and task (and session, for session sandboxes).
    Sandbox {
        profile: String,
        task: String,
        session: Option<String>,
    },
    /// A labelled container that belongs to no desired sandbox.
    Container { name: String },
    /// The remote host of the SSH backend (`user@host[:port]`).
    Ssh { dest: String },
    /// The singularity instance of a profile and task (and session, for
    /// a session's instance).
    Instance {
        profile: String,
        task: String,
        session: Option<String>,
    },
    /// The Kubernetes sandbox of a profile and task (and session) in its
    /// namespace.
    Pod {
        profile: String,
        task: String,
        session: Option<String>,
    },
    /// The warm pool of a profile's session sandboxes of a task
    /// (`terminal.warm_pool`): its unclaimed members.
    Pool { profile: String, task: String },
    /// The sandbox of a profile and task on a cloud service (`service` is
    /// modal, daytona or vercel_sandbox).
    Cloud {
        service: crate::config::Backend,
        profile: String,
        task: String,
    },
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Proxy => f.write_str("proxy"),
            Target::Sandbox {
                profile,
                task,
                session: None,
            } => write!(f, "sandbox {profile}/{task}"),
            Target::Sandbox {
                profile,
                task,
                session: Some(session),
            } => write!(f, "sandbox {profile}/{task}@{session}"),
            Target::Container { name } => write!(f, "container {name}"),
            Target::Ssh { dest } => write!(f, "ssh {dest}"),
            Target::Instance {
                profile,
                task,
                session: None,
            } => write!(f, "singularity {profile}/{task}"),
            Target::Instance {
                profile,
                task,
                session: Some(session),
            } => write!(f, "singularity {profile}/{task}@{session}"),
            Target::Pod {
                profile,
                task,
                session: None,
            } => write!(f, "kubernetes {profile}/{task}"),
            Target::Pod {
                profile,
                task,
                session: Some(session),
            } => write!(f, "kubernetes {profile}/{task}@{session}"),
            Target::Pool { profile, task } => write!(f, "pool {profile}/{task}"),
            Target::Cloud {
                service,
                profile,
                task,
            } => write!(f, "{service} {profile}/{task}"),
        }
    }
}

/// How an operation counts in the footer. Its JSON name (the plan's
/// `kind`) is spelled out here, so renaming a variant changes no output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Kind {
    /// Brings something up that is not there or not running (`+`).
    #[serde(rename = "create")]
    Create,
    /// Replaces or alters something that exists (`~`).
    #[serde(rename = "change")]
    Change,
    /// Takes something away (`-`).
    #[serde(rename = "remove")]
    Remove,
    /// Wanted, but refused for safety (`!`).
    #[serde(rename = "blocked")]
    Blocked,
    /// Seen and left alone, worth a word (`?`): no change.
    #[serde(rename = "report")]
    Report,
}

impl Kind {
    pub fn symbol(self) -> char {
        match self {
            Kind::Create => '+',
            Kind::Change => '~',
            Kind::Remove => '-',
            Kind::Blocked => '!',
            Kind::Report => '?',
        }
    }
}

/// One operation of a plan: a verb on a target, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Op<A> {
    pub target: Target,
    pub action: A,
    pub cause: String,
    /// The settings that differ, old and new, when the operation is a
    /// recreate whose settings are known (the cause names them too).
    pub changes: Vec<Change>,
}

/// What a plan's action must tell about itself to be printed.
pub trait Describe {
    /// How the operation counts.
    fn kind(&self) -> Kind;
    /// The verb printed in the plan (`create`, `recreate`, …).
    fn verb(&self) -> &'static str;
    /// Where the operation goes among those of its target and kind, before
    /// the verb's name decides: lower first (a Pod's claim before the Pod).
    fn step(&self) -> u8 {
        0
    }
}

/// A list of operations. Sorted by target on construction.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan<A> {
    pub ops: Vec<Op<A>>,
}

/// The counts of the footer (the plan JSON's `summary`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Summary {
    #[serde(rename = "create")]
    pub create: usize,
    #[serde(rename = "change")]
    pub change: usize,
    #[serde(rename = "remove")]
    pub remove: usize,
    #[serde(rename = "blocked")]
    pub blocked: usize,
    #[serde(rename = "reported")]
    pub reported: usize,
}

/// The plan as JSON (`reconcile --dry-run --output json`). Every name is
/// spelled out in a `serde` attribute, never taken from a Rust name: the
/// JSON is an interface, and renaming a type or a variant must not change
/// it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanJson<'a> {
    #[serde(rename = "operations")]
    pub operations: Vec<OpJson<'a>>,
    #[serde(rename = "summary")]
    pub summary: Summary,
    /// No operation would change anything and nothing is blocked, in any
    /// stage.
    #[serde(rename = "converged")]
    pub converged: bool,
    /// The stages after the first (whose operations are `operations`),
    /// each carried out once the one before has been; left out when the
    /// plan has one stage.
    #[serde(rename = "stages", skip_serializing_if = "<[_]>::is_empty")]
    pub stages: Vec<StageJson<'a>>,
}

/// A later stage of [`PlanJson`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageJson<'a> {
    /// Its number: 2 for the first after the plan's own operations.
    #[serde(rename = "stage")]
    pub stage: usize,
    /// What it waits for, in words.
    #[serde(rename = "after")]
    pub after: &'a str,
    #[serde(rename = "operations")]
    pub operations: Vec<OpJson<'a>>,
    #[serde(rename = "summary")]
    pub summary: Summary,
}

/// One operation of [`PlanJson`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpJson<'a> {
    #[serde(rename = "kind")]
    pub kind: Kind,
    /// The target as printed (`sandbox default/default`).
    #[serde(rename = "target")]
    pub target: String,
    /// The verb as printed (`create`, `recreate`, …).
    #[serde(rename = "action")]
    pub action: &'static str,
    #[serde(rename = "cause")]
    pub cause: &'a str,
    /// The settings that differ (`{field, old, new}`), on a recreate whose
    /// old settings are known; left out otherwise.
    #[serde(rename = "changes", skip_serializing_if = "<[_]>::is_empty")]
    pub changes: &'a [Change],
}

impl<A: Describe> Plan<A> {
    pub fn new(mut ops: Vec<Op<A>>) -> Plan<A> {
        ops.sort_by(|a, b| {
            (&a.target, a.action.kind(), a.action.step(), a.action.verb()).cmp(&(
                &b.target,
                b.action.kind(),
                b.action.step(),
                b.action.verb(),
            ))
        });
        Plan { ops }
    }

    pub fn summary(&self) -> Summary {
        let mut s = Summary::default();
        for op in &self.ops {
            match op.action.kind() {
                Kind::Create => s.create += 1,
                Kind::Change => s.change += 1,
                Kind::Remove => s.remove += 1,
                Kind::Blocked => s.blocked += 1,
                Kind::Report => s.reported += 1,
            }
        }
        s
    }

    /// Whether applying the plan would change anything, or something wanted
    /// is blocked: the host is not where the config says.
    pub fn is_pending(&self) -> bool {
        self.ops.iter().any(|op| op.action.kind() != Kind::Report)
    }

    /// The plan as JSON: the same operations, in the same order.
    pub fn to_json(&self) -> PlanJson<'_> {
        PlanJson {
            operations: self.ops_json(),
            summary: self.summary(),
            converged: !self.is_pending(),
            stages: Vec::new(),
        }
    }

    fn ops_json(&self) -> Vec<OpJson<'_>> {
        self.ops
            .iter()
            .map(|op| OpJson {
                kind: op.action.kind(),
                target: op.target.to_string(),
                action: op.action.verb(),
                cause: &op.cause,
                changes: &op.changes,
            })
            .collect()
    }

    /// The operations that change the host, as printed (symbol, target,
    /// verb), in order: what two plans must share to do the same work
    /// (causes name times and values that move between two looks).
    pub fn work(&self) -> Vec<(Kind, String, &'static str)> {
        self.ops
            .iter()
            .filter(|op| matches!(op.action.kind(), Kind::Create | Kind::Change | Kind::Remove))
            .map(|op| (op.action.kind(), op.target.to_string(), op.action.verb()))
            .collect()
    }
}

/// The narrowest a wrapped cause gets: a terminal narrower than the
/// operation's head and this is not wrapped for.
const MIN_CAUSE_COLUMNS: usize = 24;

/// `text` cut into lines of at most `columns` characters at spaces (a
/// word longer than a line stands alone on its line).
fn wrap(text: &str, columns: usize) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut rest = text;
    while rest.chars().count() > columns {
        // The last space within the line; else the first space after it.
        let cut = rest
            .char_indices()
            .take(columns + 1)
            .filter(|(_, c)| *c == ' ')
            .map(|(i, _)| i)
            .last()
            .or_else(|| rest.find(' '));
        let Some(cut) = cut else { break };
        lines.push(&rest[..cut]);
        rest = rest[cut..].trim_start_matches(' ');
    }
    lines.push(rest);
    lines
}

/// A plan carried out in stages: `first` at once, then each of `later`
/// once the stage before it has been carried out and the host, observed
/// again, plans what the stage predicted.
#[derive(Debug, Clone, PartialEq)]
pub struct Staged<A> {
    pub first: Plan<A>,
    pub later: Vec<Stage<A>>,
}

/// A stage after the first: what it waits for, and its operations as
/// predicted.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage<A> {
    /// What the stage waits for, in words ("the proxy is running and
    /// healthy").
    pub after: String,
    pub plan: Plan<A>,
}

impl<A: Describe> Staged<A> {
    /// A plan of one stage.
    pub fn single(first: Plan<A>) -> Staged<A> {
        Staged {
            first,
            later: Vec::new(),
        }
    }

    /// Whether any stage would change anything or has something blocked.
    pub fn is_pending(&self) -> bool {
        self.first.is_pending() || self.later.iter().any(|s| s.plan.is_pending())
    }

    /// Every stage's plan, the first first.
    pub fn plans(&self) -> impl Iterator<Item = &Plan<A>> {
        std::iter::once(&self.first).chain(self.later.iter().map(|s| &s.plan))
    }

    /// The staged plan as JSON: the first stage's operations as a plan of
    /// one stage has them, the later ones under `stages`.
    pub fn to_json(&self) -> PlanJson<'_> {
        let mut json = self.first.to_json();
        json.converged = !self.is_pending();
        json.stages = self
            .later
            .iter()
            .enumerate()
            .map(|(i, stage)| StageJson {
                stage: i + 2,
                after: &stage.after,
                operations: stage.plan.ops_json(),
                summary: stage.plan.summary(),
            })
            .collect();
        json
    }
}

impl<A: Describe> fmt::Display for Staged<A> {
    /// A plan of one stage prints as [`Plan`]; more, each under a heading
    /// that says what it waits for.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.later.is_empty() {
            return match f.width() {
                Some(columns) => write!(f, "{:columns$}", self.first),
                None => write!(f, "{}", self.first),
            };
        }
        let n = self.later.len() + 1;
        // The width (a terminal's) goes on to each stage's plan.
        let plan = |f: &mut fmt::Formatter<'_>, plan: &Plan<A>| match f.width() {
            Some(columns) => write!(f, "{plan:columns$}"),
            None => write!(f, "{plan}"),
        };
        writeln!(f, "Stage 1 of {n}:")?;
        plan(f, &self.first)?;
        for (i, stage) in self.later.iter().enumerate() {
            writeln!(f, "\n\nStage {} of {n}, once {}:", i + 2, stage.after)?;
            plan(f, &stage.plan)?;
        }
        Ok(())
    }
}

/// One line per operation. With a width (`format!("{plan:100}")`, a
/// terminal's), a cause longer than the line is wrapped at spaces, its
/// next lines indented under its start; without one, each operation is one
/// line, whatever its length (what a script or a log reads).
impl<A: Describe> fmt::Display for Plan<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .ops
            .iter()
            .map(|op| op.target.to_string().chars().count())
            .max()
            .unwrap_or(0);
        let columns = f.width();
        for op in &self.ops {
            let head = format!(
                "{} {:<width$}   {:<10}  ",
                op.action.kind().symbol(),
                op.target.to_string(),
                op.action.verb(),
            );
            let indent = head.chars().count();
            let lines = match columns {
                Some(columns) if columns >= indent + MIN_CAUSE_COLUMNS => {
                    wrap(&op.cause, columns - indent)
                }
                _ => vec![op.cause.as_str()],
            };
            let mut lines = lines.into_iter();
            writeln!(f, "{head}{}", lines.next().unwrap_or_default())?;
            for line in lines {
                writeln!(f, "{:indent$}{line}", "")?;
            }
        }
        let s = self.summary();
        if !self.is_pending() {
            return write!(f, "No changes. The host is converged.");
        }
        write!(
            f,
            "Plan: {} to create, {} to change, {} to remove",
            s.create, s.change, s.remove
        )?;
        if s.blocked > 0 {
            write!(f, ", {} blocked", s.blocked)?;
        }
        write!(f, ".")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    enum Verb {
        Create,
        Recreate,
        Remove,
        Blocked,
        Unmanaged,
    }

    impl Describe for Verb {
        fn kind(&self) -> Kind {
            match self {
                Verb::Create => Kind::Create,
                Verb::Recreate => Kind::Change,
                Verb::Remove => Kind::Remove,
                Verb::Blocked => Kind::Blocked,
                Verb::Unmanaged => Kind::Report,
            }
        }
        fn verb(&self) -> &'static str {
            match self {
                Verb::Create => "create",
                Verb::Recreate => "recreate",
                Verb::Remove => "remove",
                Verb::Blocked => "blocked",
                Verb::Unmanaged => "unmanaged",
            }
        }
    }

    fn sandbox(task: &str) -> Target {
        Target::Sandbox {
            profile: "default".into(),
            task: task.into(),
            session: None,
        }
    }

    fn op(target: Target, action: Verb, cause: &str) -> Op<Verb> {
        Op {
            target,
            action,
            cause: cause.into(),
            changes: Vec::new(),
        }
    }

    #[test]
    fn with_a_width_a_long_cause_wraps_under_itself_and_without_one_it_does_not() {
        let cause = "container_memory 5120 MB → 2048 MB (forces recreate); no command running; files outside /workspace and /root are lost";
        let plan = Plan::new(vec![op(sandbox("default"), Verb::Recreate, cause)]);
        let wide = plan.to_string();
        assert_eq!(
            wide.lines().next().unwrap().chars().count(),
            40 + cause.chars().count()
        );
        let narrow = format!("{plan:80}");
        assert_eq!(
            narrow,
            "\
~ sandbox default/default   recreate    container_memory 5120 MB → 2048 MB
                                        (forces recreate); no command running;
                                        files outside /workspace and /root are
                                        lost
Plan: 0 to create, 1 to change, 0 to remove."
        );
        for line in narrow.lines() {
            assert!(line.chars().count() <= 80, "{line:?}");
        }
        // Too narrow to be worth it: one line, as without a width.
        assert_eq!(format!("{plan:50}"), wide);
        // A stage's plan wraps the same.
        let staged = Staged {
            first: plan.clone(),
            later: vec![Stage {
                after: "the proxy runs".into(),
                plan: plan.clone(),
            }],
        };
        assert_eq!(
            format!("{staged:80}")
                .matches("\n                                        lost")
                .count(),
            2
        );
        // A word longer than a line stands alone.
        assert_eq!(wrap("a bbbbbbbbbb c", 5), ["a", "bbbbbbbbbb", "c"]);
    }

    #[test]
    fn plans_print_sorted_with_causes_and_a_footer() {
        let plan = Plan::new(vec![
            op(
                sandbox("old-task"),
                Verb::Remove,
                "orphan: exited 14m ago (> 10m)",
            ),
            op(
                Target::Proxy,
                Verb::Create,
                "enabled in config, not running",
            ),
            op(sandbox("default"), Verb::Recreate, "spec changed"),
            op(
                sandbox("default"),
                Verb::Blocked,
                "egress proxy not listening (fail closed)",
            ),
        ]);
        assert_eq!(
            plan.to_string(),
            "\
+ proxy                      create      enabled in config, not running
~ sandbox default/default    recreate    spec changed
! sandbox default/default    blocked     egress proxy not listening (fail closed)
- sandbox default/old-task   remove      orphan: exited 14m ago (> 10m)
Plan: 1 to create, 1 to change, 1 to remove, 1 blocked."
        );
        assert!(plan.is_pending());
    }

    #[test]
    fn a_plan_of_reports_only_is_converged() {
        let plan = Plan::new(vec![op(
            Target::Container { name: "x".into() },
            Verb::Unmanaged,
            "no spec hash label",
        )]);
        assert!(!plan.is_pending());
        assert_eq!(
            plan.to_string(),
            "? container x   unmanaged   no spec hash label\nNo changes. The host is converged."
        );
        assert!(plan.to_json().converged);
        let empty: Plan<Verb> = Plan::new(vec![]);
        assert_eq!(empty.to_string(), "No changes. The host is converged.");
    }

    #[test]
    fn the_plan_json_spells_every_name() {
        let plan = Plan::new(vec![
            op(sandbox("a"), Verb::Create, "c1"),
            op(sandbox("b"), Verb::Recreate, "c2"),
            op(sandbox("c"), Verb::Remove, "c3"),
            op(sandbox("d"), Verb::Blocked, "c4"),
            op(
                Target::Container { name: "x".into() },
                Verb::Unmanaged,
                "c5",
            ),
        ]);
        let json = serde_json::to_value(plan.to_json()).unwrap();
        let kinds: Vec<&str> = json["operations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|op| op["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["create", "change", "remove", "blocked", "report"]);
        assert_eq!(
            json["operations"][1],
            serde_json::json!({
                "kind": "change",
                "target": "sandbox default/b",
                "action": "recreate",
                "cause": "c2",
            })
        );
        assert_eq!(
            json["summary"],
            serde_json::json!({
                "create": 1, "change": 1, "remove": 1, "blocked": 1, "reported": 1,
            })
        );
        assert_eq!(json["converged"], serde_json::Value::Bool(false));
    }
}
