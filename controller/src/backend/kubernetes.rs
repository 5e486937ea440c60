//! The kubernetes backend in the binary: which API server and namespace
//! (a kubeconfig and its context, or the Pod's own service account),
//! observing the sandbox Pods and claims for a pass, applying the plan's
//! Pod operations (a session's end among them), `hermes exec` in a Pod
//! (made first through the planner, never replaced: a stale one runs the
//! command, said in one line) and the Pods of `hermes sandbox list`.

use std::path::PathBuf;
use std::time::Instant;

use async_trait::async_trait;
use hermes_backends::exec::{ExecIo, ExecOutcome, ExecRequest};
use hermes_backends::kubernetes::proxy::ProxyFiles;
use hermes_backends::kubernetes::{Cluster, PodExec, Source};
use hermes_model::action::{Action, Families, PodAction};
use hermes_model::desired::Desired;
use hermes_model::kubernetes::proxy::ProxyObject;
use hermes_model::kubernetes::{KubeObserved, PodWanted, activity_key};
use hermes_model::observed::Observed;
use hermes_model::plan::{Describe, Kind, Plan};
use hermes_model::sandbox::{
    LABEL_EGRESS, LABEL_PROFILE, LABEL_SESSION, LABEL_SESSION_TASK, LABEL_TASK,
};
use hermes_reconcilers::{HostPlan, Planner};
use tokio::sync::mpsc;

use crate::activity::Activity;
use crate::apply::{Applied, ApplyError};
use crate::exec_target::{ExecError, ExecTarget, FailClosed, Target, Values, Which};
use crate::home::Home;
use crate::listing::{ContainerRow, SandboxList};
use crate::seam::{Backend, Ending};

/// The kubernetes backend: Pods (and their claims) of one namespace.
pub struct Kubernetes;

/// Where the client's settings come from: `kubernetes_in_cluster`, else
/// `kubernetes_kubeconfig` (`~/` from `$HOME`), else the first file of
/// `$KUBECONFIG`, else `~/.kube/config`.
fn source(home: &Home, desired: &Desired) -> anyhow::Result<Source> {
    let k = &desired.config.terminal.kubernetes;
    if k.in_cluster {
        return Ok(Source::InCluster);
    }
    let env = crate::host::host_env(home)?;
    let user_home = env.process.get("HOME").cloned().unwrap_or_default();
    let path = match &k.kubeconfig {
        Some(p) => match p.strip_prefix("~/") {
            Some(rest) => PathBuf::from(&user_home).join(rest),
            None => PathBuf::from(p),
        },
        None => match env
            .process
            .get("KUBECONFIG")
            .and_then(|v| v.split(':').find(|p| !p.is_empty()))
        {
            Some(p) => PathBuf::from(p),
            None => PathBuf::from(&user_home).join(".kube").join("config"),
        },
    };
    Ok(Source::Kubeconfig {
        path,
        context: k.context.clone(),
    })
}

/// A client of the configured namespace.
pub async fn cluster(home: &Home, desired: &Desired) -> anyhow::Result<Cluster> {
    let source = source(home, desired)?;
    Ok(Cluster::connect(&source, &desired.config.terminal.kubernetes.namespace).await?)
}

/// Carries out the plan's Pod operations, in the plan's order (a claim
/// before its Pod).
async fn apply(home: &Home, desired: &Desired, plan: &HostPlan, verbose: bool) -> Applied {
    let mut applied = Applied::default();
    let ops = Families::of(&plan.ops).pod;
    if ops.is_empty() {
        return applied;
    }
    let cluster = cluster(home, desired).await;
    // Read once, when a Secret or the CA's ConfigMap is written.
    let mut files: Option<ProxyFiles> = None;
    // Once one of the proxy's writes failed, the rest wait for the next
    // pass: a Pod made on a Secret that was not written would carry the
    // new settings' hash and serve the old ones.
    let mut proxy_failed = false;
    for (op, action) in ops {
        let started = Instant::now();
        let of_proxy = matches!(action, PodAction::ApplyProxy { .. });
        let result = match &cluster {
            Ok(_) if of_proxy && proxy_failed => Err(ApplyError::backend(std::io::Error::other(
                "not carried out: an earlier write of the egress proxy failed; the next pass plans it again",
            ))),
            Ok(c) => match proxy_files(home, desired, action, &mut files) {
                Ok(()) => apply_one(home, c, action, files.as_ref())
                    .await
                    .map_err(ApplyError::backend),
                Err(e) => Err(ApplyError::backend(std::io::Error::other(format!("{e:#}")))),
            },
            Err(e) => Err(ApplyError::backend(std::io::Error::other(format!("{e:#}")))),
        };
        proxy_failed |= of_proxy && result.is_err();
        applied.record(op, started, result, verbose);
    }
    applied
}

/// Reads the proxy's files into `files` when `action` writes the Secret
/// or the CA's ConfigMap and they are not read yet.
fn proxy_files(
    home: &Home,
    desired: &Desired,
    action: &PodAction,
    files: &mut Option<ProxyFiles>,
) -> anyhow::Result<()> {
    if let PodAction::ApplyProxy {
        object: ProxyObject::Secret | ProxyObject::CaConfigMap,
        wanted,
        ..
    } = action
        && files.is_none()
    {
        *files = Some(crate::egress::cluster::files(home, desired, wanted)?);
    }
    Ok(())
}

/// Carries out one operation: whether it changed anything. The idle
/// reaper's delete is decided again now, with this host's record of the
/// Pod's last use too; a Pod kept is said on stderr (or in the log).
async fn apply_one(
    home: &Home,
    cluster: &Cluster,
    action: &PodAction,
    files: Option<&ProxyFiles>,
) -> Result<bool, hermes_backends::kubernetes::KubeError> {
    use hermes_backends::kubernetes::Reaped;
    let activity = Activity::new(home);
    let recorded = |name: &str| {
        let key = activity_key(&cluster.namespace, name);
        activity.read_all().ok().and_then(|r| r.get(&key).copied())
    };
    let (gone, reaped) = match action {
        PodAction::Delete { name, .. } => {
            hermes_backends::kubernetes::apply(cluster, action, None).await?;
            (name, Reaped::Done)
        }
        PodAction::DeleteIdle {
            name,
            uid,
            lifetime,
            kind,
        } => (
            name,
            hermes_backends::kubernetes::delete_if_idle(
                cluster,
                name,
                uid,
                *lifetime,
                *kind,
                recorded(name),
            )
            .await?,
        ),
        PodAction::Suspend {
            name,
            uid,
            lifetime,
        } => (
            name,
            hermes_backends::kubernetes::suspend_if_idle(
                cluster,
                name,
                uid,
                *lifetime,
                recorded(name),
            )
            .await?,
        ),
        _ => {
            hermes_backends::kubernetes::apply(cluster, action, files).await?;
            return Ok(true);
        }
    };
    match reaped {
        Reaped::Done => {}
        Reaped::Gone => return Ok(false),
        Reaped::Kept(why) => {
            crate::notices::progress(format_args!(
                "Pod {}/{gone} kept, not reaped: {why}",
                cluster.namespace
            ));
            return Ok(false);
        }
    }
    // Gone: its record would only pile up.
    let key = activity_key(&cluster.namespace, gone);
    if let Err(e) = activity.forget(&key) {
        tracing::warn!(pod = %gone, error = %e, "cannot remove the activity record");
    }
    Ok(true)
}

/// The sandbox of `which`: its Pod made (its claim first) when the
/// planner says so, then waited for until it runs.
async fn ready(
    home: &Home,
    desired: &Desired,
    which: &Which<'_>,
) -> anyhow::Result<(PodExec, Cluster)> {
    let wanted = wanted(desired, which);
    let cluster = cluster(home, desired).await?;
    let mut seen = hermes_backends::kubernetes::observe_key(&cluster, &wanted).await?;
    // One of ours on its way out (a `down`, a session's end, a replace of
    // another hermes): the command waits for it, then gets a new one.
    let leaving = match &seen {
        KubeObserved::Seen { pods, .. } => pods
            .iter()
            .find(|p| p.name == wanted.name && p.deleting && p.made_by_hermes())
            .map(|p| p.uid.clone()),
        KubeObserved::Unavailable { .. } => None,
    };
    if let Some(uid) = leaving {
        eprintln!(
            "hermes: Pod {}/{} is being deleted; the command waits for it to go, then runs in a new one",
            wanted.namespace, wanted.name
        );
        hermes_backends::kubernetes::wait_gone(&cluster, &wanted.name, &uid).await?;
        seen = hermes_backends::kubernetes::observe_key(&cluster, &wanted).await?;
    }
    // Held by what the cluster serves: the Pod to wait for is a Sandbox's
    // where agent-sandbox is there.
    let wanted = match &seen {
        KubeObserved::Seen { kind, .. } => wanted.holding(*kind),
        KubeObserved::Unavailable { .. } => wanted,
    };
    let mut ops = Vec::new();
    hermes_reconcilers::kubernetes::plan_one(&wanted, &seen, &mut ops);
    // Fail closed: no command while the proxy is not up, not even in a
    // Pod that runs already (its commands would reach nothing, or, made
    // before the proxy's wiring, the network directly).
    if let Some(why) = proxy_ready(home, desired, &cluster).await? {
        return Err(FailClosed(format!(
            "{}: {why}",
            hermes_reconcilers::kubernetes::target(&wanted.key)
        ))
        .into());
    }
    if let KubeObserved::Seen { pods, .. } = &seen
        && desired.config.proxy.enabled
        && let Some(p) = pods.iter().find(|p| p.name == wanted.name)
        && p.labels.get(LABEL_EGRESS) != wanted.labels.get(LABEL_EGRESS)
    {
        return Err(FailClosed(format!(
            "Pod {}/{} was made without the egress proxy's current wiring, and no command runs in it while the proxy is on: `hermes reconcile` replaces it (its claim kept)",
            wanted.namespace, wanted.name
        ))
        .into());
    }
    for op in &ops {
        if op.action.kind() == Kind::Blocked {
            anyhow::bail!("{}: {}", op.target, op.cause);
        }
        match &op.action {
            Action::Pod(
                action @ (PodAction::CreateClaim(_)
                | PodAction::Create(_)
                | PodAction::Resume { .. }),
            ) => {
                crate::exec_target::say(op);
                hermes_backends::kubernetes::apply(&cluster, action, None).await?;
            }
            Action::Pod(PodAction::Replace { .. }) if op.cause.contains(" ended (") => {
                anyhow::bail!(
                    "{}: {}; `hermes reconcile` makes it again",
                    op.target,
                    op.cause
                )
            }
            Action::Pod(PodAction::Replace { .. }) => eprintln!(
                "hermes: {} runs a stale spec ({}); the command runs in it as it is: `hermes reconcile` replaces it (its claim kept)",
                op.target, op.cause
            ),
            Action::Keep { .. } => anyhow::bail!("{}: {}", op.target, op.cause),
            Action::Pod(PodAction::Delete { .. }) => anyhow::bail!(
                "{}: {}; `hermes reconcile` carries that out first",
                op.target,
                op.cause
            ),
            _ => {}
        }
    }
    hermes_backends::kubernetes::ensure_running(&cluster, &wanted).await?;
    Ok((
        PodExec::new(cluster.clone(), &wanted.name, wanted.env.clone()),
        cluster,
    ))
}

/// Whether the egress proxy was ever set up in this home (its CA is
/// there).
fn proxy_set_up(home: &Home) -> bool {
    crate::egress::files::Paths::new(home).ca_cert().exists()
}

/// The home's egress proxy in the cluster brought up first, as a pass
/// would (each of its operations said on stderr), when `proxy.enabled`:
/// a sandbox's commands reach nothing without it. Why the sandbox may
/// still not run (fail closed), when it may not.
async fn proxy_ready(
    home: &Home,
    desired: &Desired,
    cluster: &Cluster,
) -> anyhow::Result<Option<String>> {
    use hermes_reconcilers::kubernetes::proxy;
    if !desired.config.proxy.enabled {
        return Ok(None);
    }
    let wanted = desired.kube_proxy();
    let Some(home_id) = desired.home_id.as_deref() else {
        return Ok(Some(
            "the egress proxy: this home's id is not known (fail closed)".to_string(),
        ));
    };
    let observe = || hermes_backends::kubernetes::proxy::observe(cluster, home_id, wanted.as_ref());
    let mut seen = observe().await?;
    let mut ops = proxy::plan(desired, &seen);
    let mut files = None;
    let mut applied = false;
    for op in &ops {
        if let Action::Pod(action @ PodAction::ApplyProxy { .. }) = &op.action {
            crate::exec_target::say(op);
            // A proxy that cannot be brought up: nothing runs (exit 3).
            let fail = |e: String| FailClosed(format!("egress proxy: {op}: {e}", op = op.target));
            proxy_files(home, desired, action, &mut files).map_err(|e| fail(format!("{e:#}")))?;
            hermes_backends::kubernetes::apply(cluster, action, files.as_ref())
                .await
                .map_err(|e| fail(e.to_string()))?;
            applied = true;
        }
    }
    if applied {
        seen = observe().await?;
        ops = proxy::plan(desired, &seen);
    }
    Ok(proxy::sandboxes_wait(desired, &seen, &ops))
}

/// A Pod ready for a command, its use recorded (for the idle reaper) when
/// a command starts and when it ends: on the Pod itself (its
/// last-used annotation, which every host reads and which an idle reap
/// planned before it cannot get past) and in this host's activity record.
struct PodTarget {
    exec: PodExec,
    cluster: Cluster,
    activity: Activity,
    key: String,
}

impl PodTarget {
    fn new(exec: PodExec, cluster: Cluster, home: &Home) -> PodTarget {
        let key = activity_key(&cluster.namespace, exec.pod());
        PodTarget {
            exec,
            cluster,
            activity: Activity::new(home),
            key,
        }
    }

    fn record(&self) {
        if let Err(e) = self.activity.touch(&self.key) {
            tracing::warn!(pod = self.exec.pod(), error = %e, "cannot record the sandbox's activity");
        }
    }
}

/// The most Pods one pass asks what runs in them (the reaper's candidates
/// beyond are looked at by later passes).
const COUNTED_PER_PASS: usize = 16;

/// Each Pod's last use from the activity records; for those the idle
/// reaper would remove, what runs in them (one exec each).
async fn mark_use(
    home: &Home,
    desired: &Desired,
    cluster: &Cluster,
    pods: &mut [hermes_model::kubernetes::SeenPod],
) {
    last_uses(home, &desired.config.terminal.kubernetes.namespace, pods);
    let now = hermes_reconcilers::unix_seconds(std::time::SystemTime::now());
    let candidates = pods
        .iter_mut()
        .filter(|p| hermes_reconcilers::kubernetes::idle_candidate(desired, p, now))
        .take(COUNTED_PER_PASS);
    for p in candidates {
        let exec = PodExec::new(cluster.clone(), &p.name, Vec::new());
        p.processes = exec.count_processes().await;
        tracing::debug!(pod = %p.name, processes = ?p.processes, "counted what runs in an idle Pod");
    }
}

/// Each Pod's last command: the later of its annotation and this host's
/// activity record.
fn last_uses(home: &Home, namespace: &str, pods: &mut [hermes_model::kubernetes::SeenPod]) {
    let records = Activity::new(home).read_all().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot read the activity records");
        Default::default()
    });
    for p in pods {
        let recorded = records.get(&activity_key(namespace, &p.name)).copied();
        p.last_used = p.last_used.max(recorded);
    }
}

/// The objects `hermes exec` runs a command of `which` in.
fn wanted(desired: &Desired, which: &Which<'_>) -> PodWanted {
    desired.pod(desired.exec_sandbox(which.task, which.session).key)
}

#[async_trait]
impl Backend for Kubernetes {
    fn planner(&self) -> Planner {
        hermes_reconcilers::kubernetes::planner
    }

    async fn observe(
        &self,
        home: &Home,
        desired: &Desired,
        observed: &mut Observed,
    ) -> Option<String> {
        let seen = match cluster(home, desired).await {
            Ok(c) => {
                // The proxy's objects are looked for where it is wanted or
                // was ever set up (to remove them once it is not): a home
                // that never used it asks nothing more.
                let proxy_home = desired
                    .home_id
                    .as_deref()
                    .filter(|_| desired.config.proxy.enabled || proxy_set_up(home));
                let mut seen = hermes_backends::kubernetes::observe(
                    &c,
                    &desired.pods,
                    proxy_home,
                    desired.kube_proxy().as_ref(),
                )
                .await;
                if let KubeObserved::Seen { pods, .. } = &mut seen {
                    mark_use(home, desired, &c, pods).await;
                }
                seen
            }
            Err(e) => KubeObserved::Unavailable {
                reason: format!("{e:#}"),
            },
        };
        let problem = match &seen {
            KubeObserved::Unavailable { reason } => Some(reason.clone()),
            KubeObserved::Seen { .. } => None,
        };
        observed.kubernetes = Some(seen);
        problem
    }

    async fn apply(
        &self,
        home: &Home,
        desired: &Desired,
        plan: &HostPlan,
        verbose: bool,
    ) -> Applied {
        apply(home, desired, plan, verbose).await
    }

    async fn exec_target(
        &self,
        home: &Home,
        desired: &Desired,
        which: &Which<'_>,
    ) -> anyhow::Result<(ExecTarget, Values)> {
        let (exec, cluster) = ready(home, desired, which).await?;
        let pod = PodTarget::new(exec, cluster, home);
        // `docker_forward_env`'s values, per command: no Pod holds them.
        let values = Values {
            base: desired.forward_env.clone(),
            pinned: Vec::new(),
        };
        Ok((Box::new(pod), values))
    }

    async fn find(
        &self,
        home: &Home,
        desired: &Desired,
        which: &Which<'_>,
    ) -> anyhow::Result<Option<ExecTarget>> {
        let wanted = wanted(desired, which);
        let cluster = cluster(home, desired).await?;
        let seen = hermes_backends::kubernetes::observe_key(&cluster, &wanted).await?;
        let running = match &seen {
            KubeObserved::Seen { pods, .. } => pods.iter().any(|p| {
                p.name == wanted.name && p.made_by_hermes() && p.phase == "Running" && !p.deleting
            }),
            KubeObserved::Unavailable { .. } => false,
        };
        Ok(running.then(|| {
            let exec = PodExec::new(cluster.clone(), &wanted.name, wanted.env.clone());
            Box::new(PodTarget::new(exec, cluster, home)) as ExecTarget
        }))
    }

    /// Every Pod of the profile deleted by uid, the claims kept.
    async fn down(
        &self,
        _home: &Home,
        desired: &Desired,
        observed: &Observed,
    ) -> Vec<hermes_model::plan::Op<Action>> {
        hermes_reconcilers::kubernetes::down(&desired.profile, observed)
    }

    /// The server and namespace the Pods live in.
    fn follow_key(&self, desired: &Desired) -> Option<String> {
        let k = &desired.config.terminal.kubernetes;
        Some(format!(
            "kubeconfig={:?} context={:?} in_cluster={} namespace={}",
            k.kubeconfig, k.context, k.in_cluster, k.namespace
        ))
    }

    /// A watch of the sandbox Pods (a 410 re-lists, failures back off, a
    /// refusal ends it).
    async fn follow(&self, home: &Home, desired: &Desired, wake: &mpsc::Sender<()>) -> String {
        let cluster = match cluster(home, desired).await {
            Ok(c) => c,
            Err(e) => return format!("{e:#}"),
        };
        hermes_backends::kubernetes::follow(&cluster, || {
            // Full: a pass is due anyway.
            let _ = wake.try_send(());
        })
        .await
        .to_string()
    }

    fn place(&self, desired: &Desired, which: &Which<'_>) -> String {
        let wanted = wanted(desired, which);
        format!("Pod {}/{}", wanted.namespace, wanted.name)
    }

    async fn list(&self, home: &Home, desired: &Desired) -> anyhow::Result<SandboxList> {
        let cluster = cluster(home, desired).await?;
        let seen = hermes_backends::kubernetes::observe(&cluster, &[], None, None).await;
        let mut pods = match seen {
            KubeObserved::Unavailable { reason } => anyhow::bail!("{reason}"),
            KubeObserved::Seen { pods, .. } => pods,
        };
        last_uses(home, &cluster.namespace, &mut pods);
        let now = hermes_reconcilers::unix_seconds(std::time::SystemTime::now());
        let rows = pods
            .into_iter()
            .map(|p| {
                let get = |k: &str| p.labels.get(k).cloned().unwrap_or_else(|| "-".to_string());
                let session = p.labels.get(LABEL_SESSION).cloned();
                let task = if session.is_some() {
                    get(LABEL_SESSION_TASK)
                } else {
                    get(LABEL_TASK)
                };
                let profile = get(LABEL_PROFILE);
                let spec_matches = (session.is_none() && profile == desired.profile).then(|| {
                    let key = hermes_model::sandbox::SandboxKey::persistent(&profile, &task);
                    p.spec_hash() == Some(desired.pod(key).hash.as_str())
                });
                let spec = match spec_matches {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "-",
                };
                let running = p.phase == "Running" && !p.deleting;
                let state = if p.deleting {
                    "deleting".to_string()
                } else {
                    p.phase.to_lowercase()
                };
                // The RuntimeClass of a Pod of the current spec (which
                // hashes it); `-` for the others, whose class is not read.
                let runtime = match spec_matches {
                    Some(true) => desired
                        .config
                        .terminal
                        .kubernetes
                        .runtime_class
                        .clone()
                        .unwrap_or_else(|| "default".to_string()),
                    _ => "-".to_string(),
                };
                ContainerRow {
                    name: p.name.clone(),
                    profile,
                    task,
                    state,
                    runtime,
                    session,
                    managed: true,
                    spec_matches,
                    spec: spec.to_string(),
                    age_seconds: p.started_at.map_or(0, |t| now - t),
                    // Not looked inside: the time since the last command.
                    idle_seconds: running.then(|| p.unused_since().map(|t| now - t)).flatten(),
                    processes: None,
                    pool: None,
                    age: p
                        .started_at
                        .map_or("-".to_string(), |t| hermes_reconcilers::age(now - t)),
                    idle: match running.then(|| p.unused_since()).flatten() {
                        Some(t) => hermes_reconcilers::age(now - t),
                        None => "-".to_string(),
                    },
                }
            })
            .collect();
        Ok(SandboxList::Containers(rows))
    }

    /// The session's Pods deleted by uid.
    async fn end_session(
        &self,
        home: &Home,
        desired: &Desired,
        session: &str,
    ) -> anyhow::Result<Ending> {
        let cluster = cluster(home, desired).await?;
        let seen = hermes_backends::kubernetes::observe(&cluster, &[], None, None).await;
        if let KubeObserved::Unavailable { reason } = &seen {
            anyhow::bail!("{reason}");
        }
        let ops = hermes_reconcilers::kubernetes::end_session(&desired.profile, session, &seen);
        Ok(Ending {
            plan: Plan::new(ops),
            engine: None,
        })
    }
}

#[async_trait]
impl Target for PodTarget {
    /// A Pod of its own per task and session: its /tmp.
    fn cwd_state(&self, _home: &Home, _desired: &Desired, _which: &Which<'_>) -> String {
        crate::exec_target::OWN_CWD_STATE.to_string()
    }

    fn jobs_dir(&self, _home: &Home, _desired: &Desired, _which: &Which<'_>) -> String {
        crate::exec_target::OWN_JOBS_DIR.to_string()
    }

    fn describe(&self, desired: &Desired) -> String {
        format!(
            "Pod {}/{}",
            desired.config.terminal.kubernetes.namespace,
            self.exec.pod()
        )
    }

    async fn exec(&self, req: &ExecRequest, io: ExecIo<'_>) -> Result<ExecOutcome, ExecError> {
        use hermes_backends::exec::Executor;
        // In use before it starts: a reap planned earlier fails its
        // precondition; a Pod already on its way out runs nothing.
        hermes_backends::kubernetes::mark_used(&self.cluster, self.exec.pod())
            .await
            .map_err(ExecError::backend)?;
        self.record();
        let outcome = Executor::exec(&self.exec, req, io).await;
        self.record();
        if let Err(e) = hermes_backends::kubernetes::mark_used(&self.cluster, self.exec.pod()).await
        {
            tracing::debug!(pod = self.exec.pod(), error = %e, "cannot mark the Pod's last use after the command");
        }
        outcome.map_err(ExecError::backend)
    }
}
