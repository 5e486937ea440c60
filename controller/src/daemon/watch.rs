//! Watching config.yaml for the controller. The parent directory is
//! watched, not the file: editors save by writing a new file and renaming
//! it over the old one, and GitOps tools swap a symlink (`ln -sfn`) or a
//! `..data` directory; a watch on the file itself would be lost with the
//! first save. When config.yaml is a symlink, the directory of its target
//! is watched as well, and the watches follow the link when it moves.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// The watches on config.yaml's directories; each relevant change sends
/// one `()` (the receiver debounces).
#[derive(Debug)]
pub struct ConfigWatch {
    watcher: RecommendedWatcher,
    config: PathBuf,
    watched: BTreeSet<PathBuf>,
    /// The file names whose changes matter, shared with the callback.
    names: Arc<Mutex<BTreeSet<String>>>,
}

impl ConfigWatch {
    pub fn new(config: &Path, wake: mpsc::Sender<()>) -> notify::Result<ConfigWatch> {
        let names = Arc::new(Mutex::new(names_of_interest(config)));
        let seen_names = Arc::clone(&names);
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let relevant = match &event {
                Ok(event) if !completes_a_change(&event.kind) => false,
                Ok(event) => {
                    let names = seen_names.lock().unwrap_or_else(|e| e.into_inner());
                    event.paths.iter().any(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| names.contains(n) || n.starts_with(".."))
                    })
                }
                // A watch error (overflow, say): look again to be safe.
                Err(_) => true,
            };
            if relevant {
                let _ = wake.try_send(());
            }
        })?;
        let mut watch = ConfigWatch {
            watcher,
            config: config.to_path_buf(),
            watched: BTreeSet::new(),
            names,
        };
        watch.refresh()?;
        Ok(watch)
    }

    /// Watches the directories config.yaml lives in now (its own, and its
    /// symlink target's), and drops the ones it left.
    pub fn refresh(&mut self) -> notify::Result<()> {
        let mut wanted = BTreeSet::new();
        if let Some(dir) = self.config.parent() {
            wanted.insert(dir.to_path_buf());
        }
        if let Ok(target) = std::fs::canonicalize(&self.config) {
            if let Some(dir) = target.parent() {
                wanted.insert(dir.to_path_buf());
            }
        }
        for gone in self.watched.difference(&wanted) {
            let _ = self.watcher.unwatch(gone);
        }
        for dir in wanted.difference(&self.watched) {
            self.watcher.watch(dir, RecursiveMode::NonRecursive)?;
        }
        self.watched = wanted;
        *self.names.lock().unwrap_or_else(|e| e.into_inner()) = names_of_interest(&self.config);
        Ok(())
    }
}

/// Whether an event of this kind leaves the file whole: a writer closing
/// it (`IN_CLOSE_WRITE`), a rename (an editor's save, a symlink or
/// `..data` swap), a removal. Opening, creating and each write of an
/// in-place save are not: the file may be half-written then, and the
/// close that follows wakes the loop. Reading the file (as every pass
/// does) is no change.
fn completes_a_change(kind: &notify::EventKind) -> bool {
    use notify::EventKind;
    use notify::event::{AccessKind, AccessMode, ModifyKind};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) | EventKind::Create(_) => false,
        EventKind::Modify(ModifyKind::Data(_)) => false,
        EventKind::Modify(_) | EventKind::Remove(_) | EventKind::Any | EventKind::Other => true,
    }
}

/// The file names whose changes matter: config.yaml, and the name of its
/// symlink target.
fn names_of_interest(config: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    if let Some(name) = config.file_name().and_then(|n| n.to_str()) {
        names.insert(name.to_string());
    }
    if let Ok(target) = std::fs::canonicalize(config) {
        if let Some(name) = target.file_name().and_then(|n| n.to_str()) {
            names.insert(name.to_string());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    async fn woken(rx: &mut mpsc::Receiver<()>) -> bool {
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .is_ok();
        // Drain the burst one change makes.
        tokio::time::sleep(Duration::from_millis(100)).await;
        while rx.try_recv().is_ok() {}
        got
    }

    #[tokio::test]
    async fn a_rename_over_the_config_and_a_symlink_swap_both_wake() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, "a: 1\n").unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let mut watch = ConfigWatch::new(&config, tx).unwrap();

        let tmp = dir.path().join(".config.yaml.new");
        std::fs::write(&tmp, "a: 2\n").unwrap();
        std::fs::rename(&tmp, &config).unwrap();
        assert!(woken(&mut rx).await, "rename over config.yaml");

        // A GitOps-style swap: config.yaml becomes a symlink, replaced by rename.
        let v1 = dir.path().join("v1.yaml");
        std::fs::write(&v1, "a: 3\n").unwrap();
        let link = dir.path().join(".tmp-link");
        std::os::unix::fs::symlink(&v1, &link).unwrap();
        std::fs::rename(&link, &config).unwrap();
        assert!(woken(&mut rx).await, "symlink swap");
        watch.refresh().unwrap();
        // An edit of the link's target wakes too.
        std::fs::write(&v1, "a: 4\n").unwrap();
        assert!(woken(&mut rx).await, "edit of the target");

        // Reading the config, as every pass does, does not wake.
        let _ = std::fs::read_to_string(&config).unwrap();
        let quiet = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await;
        assert!(quiet.is_err(), "woken by a read of the config");

        // Another file in the directory does not wake.
        std::fs::write(dir.path().join("unrelated"), "x").unwrap();
        let quiet = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await;
        assert!(quiet.is_err(), "woken by an unrelated file");
    }

    #[tokio::test]
    async fn an_in_place_write_wakes_once_closed_never_half_written() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, "a: 1\n").unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let _watch = ConfigWatch::new(&config, tx).unwrap();

        let mut file = std::fs::File::create(&config).unwrap();
        file.write_all(b"a: ").unwrap();
        file.flush().unwrap();
        let early = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await;
        assert!(early.is_err(), "woken while the file was half-written");
        file.write_all(b"2\n").unwrap();
        drop(file);
        assert!(woken(&mut rx).await, "the writer closed the file");
        assert_eq!(std::fs::read_to_string(&config).unwrap(), "a: 2\n");
    }
}
