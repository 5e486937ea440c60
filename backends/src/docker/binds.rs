//! Which containers use a host directory: every container of the engine,
//! labelled or not, of any home, whose bind mounts come from inside it.
//! What decides whether a sandbox's disk image may be unmounted: no
//! container may be left holding its data directory.

use std::path::Path;

use bollard::query_parameters::ListContainersOptionsBuilder;

use super::Engine;
use super::error::DockerError;

impl Engine {
    /// The ids of the containers (any state, any label) with a mount whose
    /// source is `dir` or inside it. A source is compared as the engine
    /// reports it and with its symbolic links resolved.
    pub async fn containers_using(&self, dir: &Path) -> Result<Vec<String>, DockerError> {
        let options = ListContainersOptionsBuilder::default().all(true).build();
        let summaries = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| DockerError::engine("list containers", "all", e))?;
        let inside = |source: &str| {
            let source = Path::new(source);
            source.starts_with(dir)
                || std::fs::canonicalize(source).is_ok_and(|real| real.starts_with(dir))
        };
        Ok(summaries
            .into_iter()
            .filter(|s| {
                s.mounts
                    .iter()
                    .flatten()
                    .filter_map(|m| m.source.as_deref())
                    .any(inside)
            })
            .filter_map(|s| s.id)
            .collect())
    }
}
