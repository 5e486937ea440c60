//! Reading the Docker world: the containers labelled `hermes-agent=1`
//! (of this home only, when the engine is scoped to one).
//!
//! [`Engine::observe_states`] costs one list call, plus one inspect for
//! each container that ever started (for its start and finish times).
//! Containers still in `created` cost nothing beyond the list: a host with
//! hundreds of them left behind by failed starts is observed in one round
//! trip. [`Engine::observe`] adds one `top` for each running container (its
//! process count), the slowest read there is: the engine runs `ps` on the
//! host for it. [`Engine::count_processes`] reads it for chosen containers
//! only, such as the ones a plan would recreate.

use std::collections::{BTreeMap, HashMap};

use bollard::models::{
    ContainerInspectResponse, ContainerSummary, ContainerTopResponse, MountPoint,
};
use bollard::query_parameters::ListContainersOptionsBuilder;
use futures_util::{StreamExt, TryStreamExt};
use hermes_model::observed::{AgentMade, ContainerState, ObservedContainer};
use hermes_model::sandbox::{LABEL_AGENT, SandboxKey};

use super::Engine;
use super::error::{DockerError, is_not_found};
use super::top::Seen;

/// How many inspect/top calls run at once during a pass.
const CONCURRENCY: usize = 16;

impl Engine {
    /// Every container labelled `hermes-agent=1`, in any state, sorted by
    /// name, with the process count of every running one. A container
    /// removed between the list and its inspect is left out; any other
    /// failure fails the whole observation (a partial view must never look
    /// like "these containers are gone").
    pub async fn observe(&self) -> Result<Vec<ObservedContainer>, DockerError> {
        let (mut seen, where_seen) = self.list_and_inspect(None).await?;
        let running = seen
            .iter_mut()
            .filter(|c| c.state == ContainerState::Running);
        futures_util::stream::iter(running)
            .for_each_concurrent(CONCURRENCY, |container| {
                let processes = where_seen
                    .get(&container.id)
                    .copied()
                    .unwrap_or(Seen::Host { main_pid: None });
                async move {
                    container.processes = self.processes_of(container, processes).await;
                }
            })
            .await;
        Ok(seen)
    }

    /// As [`Engine::observe`], without the process counts (`processes` is
    /// `None`): no `top` call.
    pub async fn observe_states(&self) -> Result<Vec<ObservedContainer>, DockerError> {
        Ok(self.list_and_inspect(None).await?.0)
    }

    /// As [`Engine::observe_states`], but only the containers of `profile`
    /// are inspected: the others keep what the list says (state, labels,
    /// creation time), which is all a pass of that profile reads of them.
    pub async fn observe_profile(
        &self,
        profile: &str,
    ) -> Result<Vec<ObservedContainer>, DockerError> {
        Ok(self.list_and_inspect(Some(profile)).await?.0)
    }

    /// The labelled containers, and where the processes of each inspected
    /// one are seen, by id.
    async fn list_and_inspect(
        &self,
        profile: Option<&str>,
    ) -> Result<(Vec<ObservedContainer>, HashMap<String, Seen>), DockerError> {
        let filters = HashMap::from([("label", vec![format!("{LABEL_AGENT}=1")])]);
        let listed = self.list_owned(&filters, "labelled hermes-agent=1").await?;
        let mut seen = Vec::with_capacity(listed.len());
        let mut to_complete = Vec::new();
        for container in listed {
            let other_profile = profile.is_some_and(|p| container.profile() != Some(p));
            if container.state == ContainerState::Created || other_profile {
                seen.push(container);
            } else {
                to_complete.push(container);
            }
        }
        let completed: Vec<Option<(ObservedContainer, Seen)>> =
            futures_util::stream::iter(to_complete)
                .map(|container| self.complete(container))
                .buffer_unordered(CONCURRENCY)
                .try_collect()
                .await?;
        let mut where_seen = HashMap::new();
        for (container, processes) in completed.into_iter().flatten() {
            where_seen.insert(container.id.clone(), processes);
            seen.push(container);
        }
        seen.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.id.cmp(&b.id)));
        Ok((seen, where_seen))
    }

    /// Reads the process count of the running containers among `containers`
    /// whose id is in `ids` (one inspect and one `top` each). Best effort: a
    /// count that cannot be read stays `None`.
    pub async fn count_processes(&self, containers: &mut [ObservedContainer], ids: &[&str]) {
        let wanted = containers
            .iter_mut()
            .filter(|c| c.state == ContainerState::Running && ids.contains(&c.id.as_str()));
        futures_util::stream::iter(wanted)
            .for_each_concurrent(CONCURRENCY, |container| async move {
                let processes = match self.docker.inspect_container(&container.id, None).await {
                    Ok(info) => Seen::of(&info),
                    Err(e) => {
                        tracing::debug!(container = %container.name, error = %e, "inspect failed");
                        return;
                    }
                };
                container.processes = self.processes_of(container, processes).await;
            })
            .await;
    }

    /// The sandbox of `key`, looked up by its deterministic name with one
    /// inspect call: the fast path to reattach. `None` when there is no such
    /// container. `processes` is not read here (`None`).
    ///
    /// A container of that name without the `hermes-agent=1` label is
    /// [`DockerError::Foreign`], one of another home (when this handle is
    /// scoped to a home) [`DockerError::OtherHome`]: hermes neither adopts
    /// nor replaces them.
    pub async fn find(&self, key: &SandboxKey) -> Result<Option<ObservedContainer>, DockerError> {
        self.find_named(&key.container_name()).await
    }

    /// As [`Engine::find`], by the container's name (a warm-pool member's).
    pub async fn find_named(&self, name: &str) -> Result<Option<ObservedContainer>, DockerError> {
        let name = name.to_string();
        let info = match self.docker.inspect_container(&name, None).await {
            Ok(info) => info,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(DockerError::engine("inspect container", &name, e)),
        };
        let sources = mount_sources(info.mounts.as_deref());
        let container = from_inspect(info, &name);
        if container.label(LABEL_AGENT) != Some("1") {
            return Err(DockerError::Foreign { container: name });
        }
        if let Some(scope) = self.scope() {
            scope
                .owns(&container.labels, sources.iter().map(String::as_str))
                .map_err(|why| DockerError::OtherHome {
                    container: name,
                    why,
                })?;
        }
        Ok(Some(container))
    }

    /// The running, unclaimed warm-pool members of `profile` (sanitized),
    /// as one list call shows them (no inspect: what a claim reads is in
    /// the list, and it must be quick).
    pub async fn pool_members(&self, profile: &str) -> Result<Vec<ObservedContainer>, DockerError> {
        let filters = HashMap::from([
            (
                "label",
                vec![
                    format!("{LABEL_AGENT}=1"),
                    format!("{}={profile}", hermes_model::sandbox::LABEL_PROFILE),
                    hermes_model::sandbox::LABEL_POOL.to_string(),
                ],
            ),
            ("status", vec!["running".to_string()]),
        ]);
        let mut members: Vec<ObservedContainer> = self
            .list_owned(&filters, "of the warm pool")
            .await?
            .into_iter()
            .filter(|c| c.is_unclaimed_pool_member() && c.state == ContainerState::Running)
            .collect();
        members.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(members)
    }

    /// The containers the engine lists for `filters` that are this
    /// home's (its scope), as the list shows them; `what`: the listing,
    /// for an error.
    async fn list_owned(
        &self,
        filters: &HashMap<&str, Vec<String>>,
        what: &str,
    ) -> Result<Vec<ObservedContainer>, DockerError> {
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(filters)
            .build();
        let summaries = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| DockerError::engine("list containers", what, e))?;
        let mut owned = Vec::with_capacity(summaries.len());
        for summary in summaries {
            let sources = mount_sources(summary.mounts.as_deref());
            let Some(container) = from_summary(summary) else {
                continue;
            };
            if let Some(scope) = self.scope()
                && let Err(why) = scope.owns(&container.labels, sources.iter().map(String::as_str))
            {
                tracing::trace!(container = %container.name, %why, "another home's container, left out");
                continue;
            }
            owned.push(container);
        }
        Ok(owned)
    }

    /// Adds what only inspect knows to a container seen in the list, and
    /// returns where its processes are seen too. `None` when the
    /// container went away in between.
    async fn complete(
        &self,
        mut container: ObservedContainer,
    ) -> Result<Option<(ObservedContainer, Seen)>, DockerError> {
        let info = match self.docker.inspect_container(&container.id, None).await {
            Ok(info) => info,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(DockerError::engine("inspect container", &container.name, e)),
        };
        let processes = Seen::of(&info);
        if container.spec_hash().is_none() {
            container.made_by_agent = Some(agent_made(&info));
        }
        let inspected = from_inspect(info, &container.name);
        // The inspect is newer than the list.
        container.state = inspected.state;
        container.started_at = inspected.started_at;
        container.finished_at = inspected.finished_at;
        Ok(Some((container, processes)))
    }

    /// Waits until nothing runs in the running container `id` besides its
    /// init and keeper (no exec, whoever started it, and no process one
    /// left), or `grace` passed; polls the engine's `top`. `true` when it
    /// is idle (or not running, or gone), `false` when something still ran
    /// at the end of the grace, or what runs cannot be read.
    pub async fn wait_idle(&self, id: &str, grace: std::time::Duration) -> bool {
        const POLL: std::time::Duration = std::time::Duration::from_millis(200);
        let started = std::time::Instant::now();
        let mut said = false;
        loop {
            let processes = match self.docker.inspect_container(id, None).await {
                Ok(info) => match &info.state {
                    Some(s) if s.running == Some(true) => Seen::of(&info),
                    _ => return true,
                },
                Err(e) if is_not_found(&e) => return true,
                Err(e) => {
                    tracing::debug!(container = %id, error = %e, "inspect failed");
                    return false;
                }
            };
            let count = match self.top(id, processes).await {
                Ok(top) => count_processes(&top, processes.main_pid()),
                Err(e) if is_not_found(&e) => return true,
                Err(e) => {
                    tracing::debug!(container = %id, error = %e, "top failed");
                    None
                }
            };
            match count {
                Some(0) => return true,
                None => return false,
                Some(n) if started.elapsed() >= grace => {
                    tracing::warn!(container = %id, processes = n, grace_s = grace.as_secs(), "commands still run in the container; its removal stops them");
                    return false;
                }
                Some(n) => {
                    if !said {
                        tracing::info!(container = %id, processes = n, grace_s = grace.as_secs(), "waiting for the commands running in the container to end before it is removed");
                        said = true;
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn processes_of(&self, container: &ObservedContainer, processes: Seen) -> Option<u32> {
        match self.top(&container.id, processes).await {
            Ok(top) => count_processes(&top, processes.main_pid()),
            Err(e) => {
                tracing::debug!(container = %container.name, error = %e, "top failed");
                None
            }
        }
    }
}

/// What the inspect of a container without a spec hash says of the
/// settings that shape it (see [`AgentMade`]).
fn agent_made(info: &ContainerInspectResponse) -> AgentMade {
    let host = info.host_config.clone().unwrap_or_default();
    let config = info.config.clone().unwrap_or_default();
    AgentMade {
        image: config.image.unwrap_or_default(),
        nano_cpus: host.nano_cpus.unwrap_or(0),
        memory_bytes: host.memory.unwrap_or(0),
        shm_size_bytes: host.shm_size.unwrap_or(0),
        pids_limit: host.pids_limit.filter(|p| *p > 0),
        network_mode: host.network_mode.unwrap_or_default(),
        binds: host.binds.unwrap_or_default(),
        tmpfs: host.tmpfs.unwrap_or_default().into_iter().collect(),
        env: config
            .env
            .unwrap_or_default()
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        cap_add: host.cap_add.unwrap_or_default(),
        devices: host
            .devices
            .unwrap_or_default()
            .iter()
            .filter_map(|d| d.path_on_host.clone())
            .collect(),
        extra_hosts: host.extra_hosts.unwrap_or_default(),
        init: host.init.unwrap_or(false),
        user: config.user.clone().unwrap_or_default(),
        entrypoint: config.entrypoint.clone().unwrap_or_default(),
    }
}

/// The host sources of a container's mounts.
fn mount_sources(mounts: Option<&[MountPoint]>) -> Vec<String> {
    mounts
        .unwrap_or_default()
        .iter()
        .filter_map(|m| m.source.clone())
        .collect()
}

fn labels(map: Option<HashMap<String, String>>) -> BTreeMap<String, String> {
    map.unwrap_or_default().into_iter().collect()
}

fn from_summary(summary: ContainerSummary) -> Option<ObservedContainer> {
    let id = summary.id?;
    let name = summary
        .names
        .as_ref()
        .and_then(|names| names.first())
        .map(|n| n.trim_start_matches('/').to_string())
        .unwrap_or_else(|| id.clone());
    let state = summary.state.map_or(ContainerState::Dead, |s| {
        ContainerState::from_engine(s.as_ref())
    });
    Some(ObservedContainer {
        id,
        name,
        labels: labels(summary.labels),
        state,
        created: summary.created.unwrap_or(0),
        started_at: None,
        finished_at: None,
        processes: None,
        made_by_agent: None,
        adopted_hash: None,
    })
}

fn from_inspect(info: ContainerInspectResponse, fallback_name: &str) -> ObservedContainer {
    let state = info.state.unwrap_or_default();
    ObservedContainer {
        id: info.id.unwrap_or_default(),
        name: info
            .name
            .map(|n| n.trim_start_matches('/').to_string())
            .unwrap_or_else(|| fallback_name.to_string()),
        labels: labels(info.config.and_then(|c| c.labels)),
        state: state.status.map_or(ContainerState::Dead, |s| {
            ContainerState::from_engine(s.as_ref())
        }),
        created: info
            .created
            .as_deref()
            .and_then(parse_engine_time)
            .unwrap_or(0),
        started_at: state.started_at.as_deref().and_then(parse_engine_time),
        finished_at: state.finished_at.as_deref().and_then(parse_engine_time),
        processes: None,
        made_by_agent: None,
        adopted_hash: None,
    }
}

/// The processes of a running sandbox besides its init, the
/// `sleep infinity` that keeps it up, the runner's own processes and the
/// waiters of background commands (not the commands they run). `main_pid` is the pid of the
/// container's first process (the init, with `init: true`) as the listing numbers it. `None` when the
/// answer has no PID column.
fn count_processes(top: &ContainerTopResponse, main_pid: Option<i64>) -> Option<u32> {
    let titles = top.titles.as_ref()?;
    let column = |name: &str| titles.iter().position(|t| t == name);
    let pid_col = column("PID")?;
    let ppid_col = column("PPID");
    let cmd_col = column("CMD").or_else(|| column("COMMAND"));
    let main = main_pid.map(|p| p.to_string());
    let mut keeper_seen = false;
    let mut count = 0u32;
    for row in top.processes.as_deref().unwrap_or_default() {
        let pid = row.get(pid_col).map(String::as_str);
        let cmd = cmd_col.and_then(|c| row.get(c)).map(String::as_str);
        if let Some(main) = &main {
            if pid == Some(main.as_str()) {
                continue;
            }
        } else if cmd
            .is_some_and(|c| c.starts_with("/sbin/docker-init") || c.starts_with("docker-init"))
        {
            continue;
        }
        let child_of_main = match (&main, ppid_col.and_then(|c| row.get(c))) {
            (Some(main), Some(ppid)) => ppid == main,
            _ => true,
        };
        if !keeper_seen && child_of_main && cmd == Some("sleep infinity") {
            keeper_seen = true;
            continue;
        }
        if cmd.is_some_and(|c| {
            super::runner::is_runner_process(c) || crate::background::is_waiter_process(c)
        }) {
            continue;
        }
        count += 1;
    }
    Some(count)
}

/// Unix seconds of an RFC 3339 time as the engine writes it
/// (`2024-05-01T12:34:56.123456789Z`, or with an offset). Docker's zero
/// time (`0001-01-01T00:00:00Z`, "never") and anything unreadable are
/// `None`. The fraction of a second is dropped.
pub fn parse_engine_time(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(range)?;
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        part.iter().try_fold(0i64, |acc, d| {
            acc.checked_mul(10)?.checked_add(i64::from(d - b'0'))
        })
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if year <= 1 || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &b[19..];
    if rest.first() == Some(&b'.') {
        let digits = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        rest = &rest[1 + digits..];
    }
    let offset = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let digits = [*h1, *h2, *m1, *m2];
            if !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let d = |i: usize| i64::from(digits[i] - b'0');
            let minutes = (d(0) * 10 + d(1)) * 60 + d(2) * 10 + d(3);
            if *sign == b'+' {
                minutes * 60
            } else {
                -minutes * 60
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_times_read_as_unix_seconds() {
        assert_eq!(parse_engine_time("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_engine_time("2026-11-30T11:23:11.6707516Z"),
            Some(1_796_037_791)
        );
        assert_eq!(
            parse_engine_time("2024-02-29T23:59:59.999999999Z"),
            Some(1_709_251_199)
        );
        assert_eq!(
            parse_engine_time("2024-03-01T01:00:00+01:00"),
            Some(1_709_251_200)
        );
        assert_eq!(
            parse_engine_time("2024-02-29T22:00:00-02:00"),
            Some(1_709_251_200)
        );
    }

    #[test]
    fn the_zero_time_and_garbage_read_as_never() {
        assert_eq!(parse_engine_time("0001-01-01T00:00:00Z"), None);
        assert_eq!(parse_engine_time(""), None);
        assert_eq!(parse_engine_time("yesterday"), None);
        assert_eq!(parse_engine_time("2024-13-01T00:00:00Z"), None);
        assert_eq!(parse_engine_time("2024-01-01T00:00:00"), None);
        assert_eq!(parse_engine_time("2024-01-01T00:00:00.Z"), None);
        assert_eq!(parse_engine_time("2024-01-01T00:00:00+1:00"), None);
    }

    fn top(rows: &[[&str; 3]]) -> ContainerTopResponse {
        ContainerTopResponse {
            titles: Some(vec!["PID".into(), "PPID".into(), "CMD".into()]),
            processes: Some(
                rows.iter()
                    .map(|r| r.iter().map(|c| c.to_string()).collect())
                    .collect(),
            ),
        }
    }

    #[test]
    fn the_init_and_the_keeper_are_not_counted() {
        let idle = top(&[
            ["100", "90", "/sbin/docker-init -- sleep infinity"],
            ["101", "100", "sleep infinity"],
        ]);
        assert_eq!(count_processes(&idle, Some(100)), Some(0));
        let busy = top(&[
            ["100", "90", "/sbin/docker-init -- sleep infinity"],
            ["101", "100", "sleep infinity"],
            ["120", "90", "sh -c sleep infinity"],
            ["121", "120", "sleep infinity"],
        ]);
        assert_eq!(count_processes(&busy, Some(100)), Some(2));
        assert_eq!(count_processes(&busy, None), Some(2));
        // The runner and its handler are not busy; the command they run is.
        let runner = top(&[
            ["100", "90", "/sbin/docker-init -- sleep infinity"],
            ["101", "100", "sleep infinity"],
            [
                "130",
                "100",
                "sh -c # hermes-runner eval \"$1\" hermes-runner # The runner",
            ],
            [
                "131",
                "100",
                "sh -c # hermes-runner eval \"$1\" hermes-runner # The runner",
            ],
            ["132", "131", "python3 train.py"],
        ]);
        assert_eq!(count_processes(&runner, Some(100)), Some(1));
        let no_pid = ContainerTopResponse {
            titles: Some(vec!["CMD".into()]),
            processes: Some(vec![]),
        };
        assert_eq!(count_processes(&no_pid, Some(1)), None);
    }
}
