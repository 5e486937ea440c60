//! `hermes controller`: the loop of DESIGN.md, run continuously.
//!
//! Triggers only wake the loop — a change of config.yaml (once the file
//! is whole: a writer closed it, or a rename put it in place), an event of
//! a labelled container, a change of the egress proxy's health, the
//! engine answering again, a retry coming due, the resync timer — and
//! every pass observes everything and plans from scratch, so a missed or
//! merged trigger costs latency, never correctness. A pass starts on the
//! first trigger; the triggers that arrive while it runs make one
//! follow-up pass. One pass runs at a time, so no sandbox ever sees two
//! operations at once; a failed operation backs its target off (800 ms
//! doubling to 30 s, jittered) while the rest of the plan goes on. The
//! engine going away is an error of the pass, not of the controller, and
//! not one that grows with each wake-up: while the engine does not answer
//! it is asked every [`ENGINE_PROBE`], and the loop wakes as soon as it
//! answers, with the targets' back-offs forgotten (what failed while the
//! engine was away is tried again at once). The first SIGTERM or SIGINT
//! lets the operation in flight finish and exits 0; a second exits at
//! once. Sandboxes keep running. A pass connects to the engine only when
//! something wants Docker (`backend::needs_docker`: the Docker backend,
//! or the proxy-only network); any other pass looks at an engine when one
//! answers, and converges without one. A pass is [`crate::pass`], the same
//! as `hermes reconcile`'s: the stages of its plan (the proxy set up, then
//! started, then the sandboxes that waited on it) are carried out in one
//! pass; a stage the host no longer plans makes the next pass come at
//! once.

pub mod backoff;
pub mod lock;
pub mod status;
pub mod watch;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;
use hermes_backends::docker::Engine;
use hermes_model::action::Action;
use hermes_model::plan::{Describe, Kind, Op};
use tokio::sync::{Notify, mpsc};

use crate::apply::ApplyOptions;
use crate::home::Home;

use self::backoff::Backoff;
use self::lock::ControllerLock;
use self::status::ControllerStatus;
use self::watch::ConfigWatch;

/// A change of config.yaml that comes within this of the end of a pass
/// for an earlier one is part of a burst (an editor's save, a git
/// checkout): the follow-up pass waits until the burst has been quiet this
/// long, so that a burst makes two passes, the first at once.
const SETTLE: Duration = Duration::from_millis(100);
/// The longest a follow-up pass waits for a burst to end.
const SETTLE_MAX: Duration = Duration::from_secs(2);

/// While the engine does not answer, how often it is asked.
const ENGINE_PROBE: Duration = Duration::from_millis(200);
/// While the engine does not answer, a pass is tried at least this often
/// (the probe usually wakes the loop first).
const ENGINE_RETRY: Duration = Duration::from_secs(2);

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// One pass, then exit (like `reconcile`, but holding the lock).
    pub once: bool,
    /// Serve Prometheus metrics here.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Whether `metrics_addr` may be a non-loopback address.
    pub metrics_expose: bool,
}

/// Why the loop woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// The first pass.
    Start,
    Config,
    Engine,
    Proxy,
    /// The backend's own world changed (a Kubernetes watch).
    Backend,
    Timer,
    Stop,
}

impl Wake {
    fn as_str(self) -> &'static str {
        match self {
            Wake::Start => "start",
            Wake::Config => "config changed",
            Wake::Engine => "container event",
            Wake::Proxy => "proxy health changed",
            Wake::Backend => "backend event",
            Wake::Timer => "timer",
            Wake::Stop => "stop",
        }
    }
}

pub async fn run(home: &Home, profile: &str, options: Options) -> anyhow::Result<ExitCode> {
    hermes_model::desired::check_profile(profile)?;
    crate::notices::to_log();
    crate::fsio::ensure_dir(&status::run_dir(home), 0o700)?;
    let _lock = ControllerLock::acquire(&status::run_dir(home).join("controller.lock"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::new(Notify::new());
    // First SIGTERM/SIGINT: the loop stops after the operation in flight.
    // Second: exit at once.
    {
        let (stop, stopped) = (Arc::clone(&stop), Arc::clone(&stopped));
        crate::interrupt::on_signals(move || {
            tracing::info!(
                "stopping after the operation in flight (a second signal exits at once)"
            );
            stop.store(true, Ordering::SeqCst);
            stopped.notify_one();
        })?;
    }

    let (config_tx, mut config_rx) = mpsc::channel::<()>(64);
    let mut config_watch = ConfigWatch::new(&home.config(), config_tx)
        .map_err(|e| anyhow::anyhow!("cannot watch {}: {e}", home.config().display()))?;
    let (engine_tx, mut engine_rx) = mpsc::channel::<()>(64);
    let engine_down = Arc::new(Notify::new());
    spawn_engine_probe(Arc::clone(&engine_down), engine_tx.clone());
    let (follow_tx, mut follow_rx) = mpsc::channel::<()>(64);
    let (proxy_tx, mut proxy_rx) = mpsc::channel::<()>(4);
    let seen_proxy = SeenProxy::default();
    spawn_proxy_watch(home.clone(), Arc::clone(&seen_proxy), proxy_tx);

    let metrics = Arc::new(crate::metrics::Metrics::default());
    if let Some(addr) = options.metrics_addr {
        crate::metrics::serve(addr, options.metrics_expose, Arc::clone(&metrics)).await?;
    }

    let mut controller = Controller {
        home: home.clone(),
        profile: profile.to_string(),
        engine: None,
        events_started: false,
        engine_tx,
        backoff: Backoff::default(),
        engine_failures: 0,
        engine_retry_at: None,
        engine_down,
        status: ControllerStatus {
            pid: std::process::id(),
            started_at: hermes_reconcilers::unix_seconds(SystemTime::now()),
            ..ControllerStatus::default()
        },
        metrics,
        requeue: false,
        seen_proxy,
        acting: Arc::default(),
        follow_tx,
        following: None,
    };
    tracing::info!(
        pid = std::process::id(),
        home = %home.root().display(),
        profile,
        once = options.once,
        version = env!("CARGO_PKG_VERSION"),
        "controller started"
    );
    let mut wake = Wake::Start;
    let mut config_pass_ended: Option<Instant> = None;
    loop {
        controller.pass(wake, &stop).await;
        if wake == Wake::Config {
            config_pass_ended = Some(Instant::now());
        }
        if options.once || stop.load(Ordering::SeqCst) {
            break;
        }
        let resync = Duration::from_secs(controller.resync_seconds());
        let mut deadline = Instant::now() + resync;
        if std::mem::take(&mut controller.requeue) {
            deadline = Instant::now() + REQUEUE;
        }
        for retry in [
            controller.backoff.next_retry(Instant::now()),
            controller.engine_retry_at,
        ]
        .into_iter()
        .flatten()
        {
            deadline = deadline.min(retry);
        }
        wake = tokio::select! {
            Some(()) = config_rx.recv() => {
                // At once: the watch only reports a whole file. The rest
                // of a burst makes one follow-up pass, once it is over.
                if config_pass_ended.is_some_and(|end| end.elapsed() < SETTLE) {
                    settle(&mut config_rx).await;
                }
                while config_rx.try_recv().is_ok() {}
                if let Err(e) = config_watch.refresh() {
                    tracing::warn!(error = %e, "cannot follow config.yaml's directory");
                }
                Wake::Config
            }
            Some(()) = engine_rx.recv() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                while engine_rx.try_recv().is_ok() {}
                Wake::Engine
            }
            Some(()) = proxy_rx.recv() => Wake::Proxy,
            Some(()) = follow_rx.recv() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                while follow_rx.try_recv().is_ok() {}
                Wake::Backend
            }
            () = tokio::time::sleep_until(deadline.into()) => Wake::Timer,
            () = stopped.notified() => Wake::Stop,
        };
        if wake == Wake::Stop {
            break;
        }
    }
    tracing::info!(passes = controller.status.passes, "controller stopped");
    // One pass for a script or a unit's check: its exit says whether it
    // went through (an engine that does not answer, an operation that
    // failed, a config that cannot be used is 1).
    if options.once {
        let s = &controller.status;
        if s.engine_unreachable_since.is_some()
            || s.last_error.is_some()
            || s.config_invalid_since.is_some()
        {
            return Ok(ExitCode::from(1));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Waits until no change has come for [`SETTLE`] (at most [`SETTLE_MAX`]).
async fn settle(changes: &mut mpsc::Receiver<()>) {
    let deadline = Instant::now() + SETTLE_MAX;
    loop {
        tokio::time::sleep(SETTLE).await;
        let mut more = false;
        while changes.try_recv().is_ok() {
            more = true;
        }
        if !more || Instant::now() >= deadline {
            return;
        }
    }
}

/// How soon a pass that changed the proxy is followed by the next.
const REQUEUE: Duration = Duration::from_millis(100);

/// How often the proxy's health is probed for changes.
const PROXY_PROBE: Duration = Duration::from_secs(1);

/// The proxy's (running, healthy) as the last pass saw it; `None` before
/// the first pass.
type SeenProxy = Arc<std::sync::Mutex<Option<(bool, bool)>>>;

/// Wakes the loop when the egress proxy's (running, healthy) differs from
/// what the last pass saw: a killed proxy is noticed within a second, not
/// at the next resync, however soon after a pass it died (a probe compared
/// only with the previous probe misses a proxy that started and died
/// between two probes). Once a pass has seen the new state, probes agree
/// with it and stop waking the loop. A proxy that never runs costs a
/// pid-file read a second.
fn spawn_proxy_watch(home: Home, seen: SeenProxy, wake: mpsc::Sender<()>) {
    tokio::spawn(async move {
        let mut woke_for: Option<(bool, bool)> = None;
        loop {
            tokio::time::sleep(PROXY_PROBE).await;
            let proxy = crate::egress::pass::observe(&home).await;
            let now = (proxy.running, proxy.healthy);
            let last_pass = *seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match last_pass {
                Some(last) if last != now => {
                    // One wake per change: the pass it causes records `now`.
                    if woke_for != Some(now) {
                        tracing::info!(
                            running = now.0,
                            healthy = now.1,
                            "the proxy's health changed"
                        );
                        let _ = wake.try_send(());
                        woke_for = Some(now);
                    }
                }
                _ => woke_for = None,
            }
        }
    });
}

struct Controller {
    home: Home,
    profile: String,
    engine: Option<Engine>,
    events_started: bool,
    engine_tx: mpsc::Sender<()>,
    backoff: Backoff,
    engine_failures: u32,
    engine_retry_at: Option<Instant>,
    /// Told when the engine stops answering: the probe then asks it every
    /// [`ENGINE_PROBE`] and wakes the loop when it answers.
    engine_down: Arc<Notify>,
    status: ControllerStatus,
    metrics: Arc<crate::metrics::Metrics>,
    /// Set by a pass that changed the proxy: what waited on it (sandboxes
    /// blocked while it was down) is planned again at once.
    requeue: bool,
    /// The proxy as the last pass observed it, for the health watch.
    seen_proxy: SeenProxy,
    /// When passes run: the event watch tells hermes's own doings from a
    /// container's fate from outside.
    acting: Arc<Acting>,
    /// Where the backend's follow ([`crate::seam::Backend::follow`]) wakes
    /// the loop.
    follow_tx: mpsc::Sender<()>,
    /// The backend's follow: its key, its task, and when it stopped.
    following: Option<Following>,
}

/// A backend's follow, running or stopped.
struct Following {
    key: String,
    task: tokio::task::JoinHandle<()>,
}

/// How long a follow that stopped (refused, or the server's address
/// unreadable) waits before a pass starts it again with the same key.
const REFOLLOW: Duration = Duration::from_secs(300);

impl Controller {
    fn resync_seconds(&self) -> u64 {
        self.status.resync_seconds.unwrap_or(30).max(1)
    }

    /// One pass ([`crate::pass`]): load, observe, plan, apply what is not
    /// backing off, stage by stage.
    async fn pass(&mut self, wake: Wake, stop: &AtomicBool) {
        self.acting.begin();
        let started = Instant::now();
        let span = tracing::info_span!("pass", trigger = wake.as_str(), n = self.status.passes + 1);
        let _guard = span.enter();
        crate::notices::begin_pass();
        let now = hermes_reconcilers::unix_seconds(SystemTime::now());
        let mut errors = Vec::new();

        let (home, profile) = (self.home.clone(), self.profile.clone());
        let backoff = self.backoff.clone();
        let at = Instant::now();
        let hold = |op: &Op<Action>| {
            let held = acts(op.action.kind()) && backoff.waiting(&op.target, at).is_some();
            if held {
                tracing::debug!(resource = %op.target, action = op.action.verb(), "backing off");
            }
            held
        };
        let request = crate::pass::Request {
            load: crate::pass::Load::Pass,
            prune: false,
            apply: Some(ApplyOptions {
                verbose: false,
                stop: Some(stop),
                home: Some(&home),
            }),
            hold: &hold,
            planned: &|_| true,
        };
        let pass = match crate::pass::run(&home, &profile, request, self).await {
            Ok(pass) => pass,
            Err(e) => {
                // The profile name or the environment is wrong: nothing to plan.
                errors.push(crate::chain::Chain(&e).to_string());
                self.finish(started, now, errors, Vec::new());
                return;
            }
        };
        match &pass.config_error {
            Some(error) => {
                // Once per error, not once per pass.
                if self.status.config_error.as_ref() != Some(error) {
                    tracing::error!(error = %error, "config.yaml cannot be used; the last good config stands");
                }
                self.status.config_invalid_since.get_or_insert(now);
                self.status.config_error = Some(error.clone());
            }
            None => {
                if self.status.config_error.is_some() {
                    tracing::info!("config.yaml is valid again");
                }
                self.status.config_invalid_since = None;
                self.status.config_error = None;
            }
        }
        self.status.resync_seconds = Some(pass.desired.config.reconcile.resync_seconds);
        self.refollow(&pass.desired);
        if let Some(e) = &pass.ended {
            errors.push(e.clone());
            self.finish(started, now, errors, Vec::new());
            return;
        }
        *self
            .seen_proxy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((pass.observed.proxy.running, pass.observed.proxy.healthy));
        errors.extend(pass.errors.iter().cloned());
        let blocked = hermes_reconcilers::blocked(pass.last());
        if blocked != self.status.blocked {
            if blocked.is_empty() {
                tracing::info!("nothing is blocked any more");
            } else {
                tracing::warn!(blocked = %blocked.join("; "), "blocked");
            }
        }
        let applied = &pass.applied;
        let acted = pass
            .carried
            .iter()
            .any(|plan| plan.ops.iter().any(|op| acts(op.action.kind())));
        if acted {
            for target in &applied.succeeded {
                self.backoff.succeeded(target);
            }
            // A stage left for later, or a proxy changed: what waited on it
            // is planned again at once.
            self.requeue = pass.halted.is_some()
                || applied
                    .succeeded
                    .contains(&hermes_model::plan::Target::Proxy);
            for (target, error) in &applied.failures {
                let delay = self.backoff.failed(target, Instant::now());
                tracing::warn!(resource = %target, error = %error, failures = self.backoff.failures(target), retry_in_ms = delay.as_millis() as u64, "operation failed");
                errors.push(format!("{target}: {error}"));
            }
            let (mut done, mut failed) = (0u32, 0u32);
            for op in pass.carried.iter().flat_map(|plan| &plan.ops) {
                if !acts(op.action.kind()) {
                    continue;
                }
                let failure = applied.failures.iter().any(|(t, _)| t == &op.target);
                let succeeded = applied.succeeded.contains(&op.target);
                if failure {
                    failed += 1;
                } else if succeeded {
                    done += 1;
                    tracing::info!(resource = %op.target, action = op.action.verb(), cause = %op.cause, "done");
                } else {
                    // Skipped: a stop was asked for first.
                    continue;
                }
                let key = format!(
                    "{}/{}",
                    op.action.verb(),
                    if failure { "error" } else { "ok" }
                );
                *self.status.operations.entry(key).or_default() += 1;
            }
            tracing::info!(
                done,
                failed,
                ms = started.elapsed().as_millis() as u64,
                "pass applied its plan"
            );
        }
        self.finish(started, now, errors, blocked);
        self.acting.end();
    }

    /// Follows the configured backend's own world (a Kubernetes watch),
    /// anew when what it follows changed; one that stopped is started
    /// again only after [`REFOLLOW`], so a refusal is not asked again at
    /// every pass.
    fn refollow(&mut self, desired: &hermes_model::desired::Desired) {
        let backend = crate::backend::of(desired);
        let key = backend.follow_key(desired);
        if let Some(f) = &self.following {
            let same = key.as_deref() == Some(f.key.as_str());
            if same && !f.task.is_finished() {
                return;
            }
        }
        if let Some(f) = self.following.take() {
            f.task.abort();
        }
        let Some(key) = key else {
            return;
        };
        let (home, desired, wake) = (self.home.clone(), desired.clone(), self.follow_tx.clone());
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let why = backend.follow(&home, &desired, &wake).await;
            tracing::warn!(reason = %why, "stopped following the backend; passes on the timer see its changes");
            // A stop soon after the start is not retried before REFOLLOW.
            tokio::time::sleep(REFOLLOW.saturating_sub(started.elapsed())).await;
        });
        tracing::debug!(%key, "following the backend");
        self.following = Some(Following { key, task });
    }

    fn finish(&mut self, started: Instant, now: i64, errors: Vec<String>, blocked: Vec<String>) {
        let errors: Vec<String> = errors.into_iter().filter(|e| !e.is_empty()).collect();
        self.status.passes += 1;
        self.status.last_pass_at = Some(now);
        self.status.last_pass_ms = Some(started.elapsed().as_millis() as u64);
        self.status.last_error = (!errors.is_empty()).then(|| errors.join("; "));
        self.status.blocked = blocked;
        self.metrics.update(&self.status, started.elapsed());
        if let Err(e) = self.status.save(&status::path(&self.home)) {
            tracing::warn!(error = %e, "cannot write the controller status");
        }
    }

    /// The engine, connecting (and starting its event watch) when needed.
    /// `None` while the engine is unreachable and its retry is not due.
    async fn engine(&mut self) -> Option<Engine> {
        if let Some(engine) = &self.engine {
            return Some(engine.clone());
        }
        match Engine::connect().await {
            Ok(engine) => Some(self.adopt(engine.for_home(self.home.scope()))),
            Err(e) => {
                self.engine_failed(&e.to_string());
                None
            }
        }
    }

    /// The engine of a pass that does not need one, when it answers
    /// ([`crate::observe::optional_engine`]); its absence is no error.
    async fn optional_engine(&mut self) -> Option<Engine> {
        if let Some(engine) = &self.engine {
            return Some(engine.clone());
        }
        let engine = crate::observe::optional_engine(&self.home).await?;
        Some(self.adopt(engine))
    }

    /// Keeps a connected engine, and follows its events from then on.
    fn adopt(&mut self, engine: Engine) -> Engine {
        self.engine = Some(engine.clone());
        if !self.events_started {
            self.events_started = true;
            spawn_event_watch(
                engine.clone(),
                hermes_model::sandbox::sanitize(&self.profile),
                crate::activity::Activity::new(&self.home),
                self.engine_tx.clone(),
                Arc::clone(&self.acting),
            );
        }
        engine
    }

    /// The engine did not answer: not a failure that grows with each
    /// wake-up (every event of a stopping engine wakes the loop), but a
    /// state, left when the probe hears the engine again.
    fn engine_failed(&mut self, error: &str) {
        self.engine_failures += 1;
        self.engine_retry_at = Some(Instant::now() + ENGINE_RETRY);
        self.engine_down.notify_one();
        let now = hermes_reconcilers::unix_seconds(SystemTime::now());
        self.status.engine_unreachable_since.get_or_insert(now);
        self.status.last_error = Some(error.to_string());
        if self.engine_failures == 1 {
            tracing::warn!(error, "the engine does not answer; waiting for it");
        } else {
            tracing::debug!(
                error,
                failures = self.engine_failures,
                "the engine still does not answer"
            );
        }
    }

    /// A pass that does not need the engine went on without it: its
    /// absence is no longer a state to report.
    fn engine_not_needed(&mut self) {
        self.engine_failures = 0;
        self.engine_retry_at = None;
        self.status.engine_unreachable_since = None;
    }

    fn engine_ok(&mut self) {
        if self.engine_failures > 0 {
            tracing::info!("the engine answers again");
            // What failed while it was away failed for that reason.
            self.backoff = Backoff::default();
        }
        self.engine_failures = 0;
        self.engine_retry_at = None;
        self.status.engine_unreachable_since = None;
    }
}

/// Asks the engine every [`ENGINE_PROBE`] once told it does not answer,
/// and wakes the loop as soon as it does.
fn spawn_engine_probe(down: Arc<Notify>, wake: mpsc::Sender<()>) {
    tokio::spawn(async move {
        loop {
            down.notified().await;
            loop {
                tokio::time::sleep(ENGINE_PROBE).await;
                if Engine::connect().await.is_ok() {
                    let _ = wake.try_send(());
                    break;
                }
            }
        }
    });
}

/// The controller keeps its engine across passes, follows its events,
/// and tells a pass that needs it and finds none from one that goes on
/// without it.
impl crate::pass::Engines for Controller {
    async fn connect(&mut self, _home: &Home, needed: bool) -> Result<Option<Engine>, String> {
        if needed {
            // Docker only when something wants it: off the Docker backend
            // an engine is looked at when it answers, and none is no error.
            return match self.engine().await {
                Some(engine) => Ok(Some(engine)),
                None => Err(self.status.last_error.clone().unwrap_or_default()),
            };
        }
        let engine = self.optional_engine().await;
        if engine.is_none() {
            self.engine_not_needed();
        }
        Ok(engine)
    }

    fn observed(&mut self, outcome: Result<(), &str>, needed: bool) {
        match outcome {
            Ok(()) => self.engine_ok(),
            Err(e) if needed => self.engine_failed(e),
            Err(_) => {
                self.engine = None;
                self.engine_not_needed();
            }
        }
    }
}

/// Follows the engine's events of the profile's containers for as long as
/// the controller runs. A command's start or end is recorded as the
/// sandbox's activity (whoever ran it: Hermes Agent's `docker exec` too)
/// and wakes nothing. Each other event wakes the loop, and so does the stream's
/// end (the engine may be restarting: events are missed meanwhile) and
/// its coming back: while the engine does not answer it is asked every
/// [`ENGINE_PROBE`], and followed again as soon as it does. A stream that
/// ends at once with the engine answering is retried with a growing delay.
fn spawn_event_watch(
    engine: Engine,
    profile: String,
    activity: crate::activity::Activity,
    wake: mpsc::Sender<()>,
    acting: Arc<Acting>,
) {
    tokio::spawn(async move {
        let mut empty_streams = 0u32;
        loop {
            let mut events = Box::pin(engine.container_events(&profile));
            let mut got_any = false;
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) if event.is_exec() => {
                        got_any = true;
                        if let Err(e) = activity.touch_at(&event.container, event.time) {
                            tracing::debug!(container = %event.container, error = %e, "cannot record a command's activity");
                        }
                    }
                    Ok(event) => {
                        got_any = true;
                        // What happened to a container from outside (a
                        // `docker rm -f`, an OOM kill) is said; what hermes
                        // did itself is the pass's lines.
                        if !acting.lately()
                            && matches!(
                                event.action.as_str(),
                                "die" | "destroy" | "kill" | "oom" | "stop" | "pause" | "rename"
                            )
                        {
                            tracing::info!(parent: None, action = %event.action, container = %event.container, "container event");
                        } else {
                            tracing::debug!(action = %event.action, container = %event.container, "container event");
                        }
                        let _ = wake.try_send(());
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "the event stream broke");
                        break;
                    }
                }
            }
            let _ = wake.try_send(());
            if engine.docker().ping().await.is_err() {
                // Down: wait for it, then look again at once.
                while engine.docker().ping().await.is_err() {
                    tokio::time::sleep(ENGINE_PROBE).await;
                }
                let _ = wake.try_send(());
                empty_streams = 0;
                continue;
            }
            empty_streams = if got_any { 0 } else { empty_streams + 1 };
            let delay = ENGINE_PROBE.saturating_mul(1 << empty_streams.min(5));
            tokio::time::sleep(delay.min(Duration::from_secs(5))).await;
        }
    });
}

/// When the controller's passes run, for the event watch: an event while
/// one runs, or within [`Acting::AFTER`] of its end, is most likely one of
/// hermes's own operations.
#[derive(Debug, Default)]
struct Acting {
    running: AtomicBool,
    ended: std::sync::Mutex<Option<Instant>>,
}

impl Acting {
    /// How long after a pass its operations' events still arrive.
    const AFTER: Duration = Duration::from_secs(3);

    fn begin(&self) {
        self.running.store(true, Ordering::SeqCst);
    }

    fn end(&self) {
        *self
            .ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        self.running.store(false, Ordering::SeqCst);
    }

    /// Whether a pass runs, or ended a moment ago.
    fn lately(&self) -> bool {
        self.running.load(Ordering::SeqCst)
            || self
                .ended
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_some_and(|t| t.elapsed() < Self::AFTER)
    }
}

/// Whether an operation of this kind changes the host (reports and
/// refusals do not, and never back off).
fn acts(kind: Kind) -> bool {
    matches!(kind, Kind::Create | Kind::Change | Kind::Remove)
}
