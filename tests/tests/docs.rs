//! The documentation as a test: every command block of README.md and
//! docs/*.md marked runnable (a fence opened with ```` ```sh runnable ````)
//! runs, and every relative link points at a file (and heading) that
//! exists. docs/testing.md says how to mark a block.
//!
//! A block marked ```` ```sh runnable continues ```` runs after the
//! runnable block before it in the same file, in its home. Each block
//! runs with `bash -euo pipefail` in a fresh `HERMES_HOME` of a profile of
//! its own, with the built binary on `PATH` as `hermes` and as
//! `hermesctl`, bounded by [`BLOCK_TIMEOUT`]; `HERMES_TEST_IMAGE` is set (a
//! block may use `${HERMES_TEST_IMAGE:-…}`). The home starts with a
//! config.yaml holding only a free `proxy.tunnel_port`, so a block that
//! turns the proxy on never meets another proxy's port. What the blocks
//! of one home leave is removed after them: the proxy stopped, the
//! profile's containers removed, the home deleted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::fmt::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hermes_tests::cli::{CLOUD_CREDENTIALS, TestHome, hermes_bin, hermesctl_bin};
use hermes_tests::docker_cli::ProfileCleanup;
use hermes_tests::egress::{StopProxy, bridge_gateway, free_port_pair};

/// How long one block may run before it is killed and fails.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(300);

/// The word in a fence's info string that marks a block runnable.
const MARKER: &str = "runnable";

/// The word that makes a runnable block continue the one before it (same
/// file): it runs after it, in the same home.
const CONTINUES: &str = "continues";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace")
        .to_path_buf()
}

/// README.md and docs/*.md, relative to the repository's root, sorted.
fn doc_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| p.strip_prefix(&root).expect("under the root").to_path_buf())
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn read(rel: &Path) -> String {
    std::fs::read_to_string(repo_root().join(rel))
        .unwrap_or_else(|e| panic!("read {}: {e}", rel.display()))
}

/// A fenced code block.
#[derive(Debug)]
struct Block {
    /// The line of its opening fence, from 1.
    line: usize,
    /// The info string's words (`sh`, `runnable`).
    info: Vec<String>,
    /// Its text, the fence's indentation taken off.
    text: String,
}

impl Block {
    fn runnable(&self) -> bool {
        matches!(self.info.first().map(String::as_str), Some("sh" | "bash"))
            && self.info.iter().any(|w| w == MARKER)
    }
}

/// The fenced blocks of a Markdown text, and the text with every block's
/// lines (fences included) blanked, line numbers kept.
fn blocks(text: &str) -> (Vec<Block>, String) {
    let mut found = Vec::new();
    let mut prose = String::new();
    // (fence, indentation, block so far)
    let mut open: Option<(String, usize, Block)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None => {
                let fence: String = trimmed
                    .chars()
                    .take_while(|&c| c == '`' || c == '~')
                    .collect();
                if fence.len() >= 3 && fence.chars().all(|c| c == fence.as_bytes()[0] as char) {
                    let info = trimmed[fence.len()..]
                        .split_whitespace()
                        .map(str::to_string)
                        .collect();
                    open = Some((
                        fence,
                        indent,
                        Block {
                            line: i + 1,
                            info,
                            text: String::new(),
                        },
                    ));
                } else {
                    prose.push_str(line);
                }
            }
            Some((fence, fence_indent, block)) => {
                if trimmed.starts_with(fence.as_str()) && trimmed.trim_end() == fence.as_str() {
                    let (_, _, block) = open.take().expect("a block is open");
                    found.push(block);
                } else {
                    let cut = indent.min(*fence_indent);
                    block.text.push_str(&line[cut..]);
                    block.text.push('\n');
                }
            }
        }
        prose.push('\n');
    }
    (found, prose)
}

/// `text` with its inline code spans blanked (newlines kept).
fn without_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        // The closing run of the same length, if any.
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let n = chars[j..].iter().take_while(|&&c| c == '`').count();
                if n == run {
                    close = Some(j);
                    break;
                }
                j += n;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                for &c in &chars[i..j + run] {
                    out.push(if c == '\n' { '\n' } else { ' ' });
                }
                i = j + run;
            }
            None => {
                for _ in 0..run {
                    out.push('`');
                }
                i += run;
            }
        }
    }
    out
}

/// `(line, target)` of every inline link `[text](target)` outside code.
fn links(text: &str) -> Vec<(usize, String)> {
    let (_, prose) = blocks(text);
    let prose = without_code_spans(&prose);
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = prose[from..].find("](") {
        let start = from + at + 2;
        let Some(len) = prose[start..].find(|c: char| c == ')' || c.is_whitespace()) else {
            break;
        };
        let target = &prose[start..start + len];
        let line = prose[..start].matches('\n').count() + 1;
        out.push((line, target.to_string()));
        from = start + len;
    }
    out
}

/// The anchors GitHub gives a Markdown file's headings: lower case, every
/// character but letters, digits, spaces, `-` and `_` dropped, spaces as
/// `-`; a repeated one gets `-1`, `-2`, ….
fn anchors(text: &str) -> HashSet<String> {
    let (_, prose) = blocks(text);
    let mut seen = HashSet::new();
    for line in prose.lines() {
        let Some(title) = line
            .strip_prefix('#')
            .map(|l| l.trim_start_matches('#'))
            .and_then(|l| l.strip_prefix(' '))
        else {
            continue;
        };
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

#[test]
fn every_relative_link_points_at_a_file_and_heading_that_exist() {
    let root = repo_root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in doc_files() {
        let text = read(&file);
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap_or(Path::new("")).join(path)
            };
            let full = root.join(&dest);
            if !full.exists() {
                broken.push(format!(
                    "{}:{line}: {target}: {} does not exist",
                    file.display(),
                    dest.display()
                ));
                continue;
            }
            if let Some(anchor) = anchor.filter(|_| full.extension().is_some_and(|x| x == "md")) {
                let text = std::fs::read_to_string(&full).expect("read the link's target");
                if !anchors(&text).contains(anchor) {
                    broken.push(format!(
                        "{}:{line}: {target}: {} has no heading #{anchor}",
                        file.display(),
                        dest.display()
                    ));
                }
            }
        }
    }
    assert!(
        checked > 0,
        "no relative link found: the link scan is broken"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// A directory holding `hermes` and `hermesctl`, links to the built binary.
fn bin_dir(root: &Path) -> PathBuf {
    let dir = root.join("bin");
    std::fs::create_dir_all(&dir).expect("mkdir bin");
    std::os::unix::fs::symlink(hermes_bin(), dir.join("hermes")).expect("link hermes");
    std::os::unix::fs::symlink(hermesctl_bin(), dir.join("hermesctl")).expect("link hermesctl");
    dir
}

/// How a block ended.
#[derive(Debug)]
struct Outcome {
    /// The exit code; `None` when killed at the timeout or by a signal.
    code: Option<i32>,
    timed_out: bool,
    output: String,
    took: Duration,
}

/// The home a block (and the blocks that continue it) runs in, and what
/// is removed after them.
#[derive(Debug)]
struct Place {
    home: TestHome,
    bin: PathBuf,
    work: PathBuf,
    profile: String,
}

impl Place {
    /// A new home; `n` makes its profile unique.
    fn new(n: usize) -> Place {
        let profile = format!("docs{}b{n}", std::process::id());
        let home = TestHome::with_profile(&profile);
        let port = free_port_pair(Some(bridge_gateway()));
        home.write_config(format!("proxy:\n  tunnel_port: {port}\n"));
        let bin = bin_dir(home.root());
        let work = home.root().join("work");
        std::fs::create_dir_all(&work).expect("mkdir work");
        Place {
            home,
            bin,
            work,
            profile,
        }
    }

    /// Runs one block here.
    fn run(&self, file: &Path, block: &Block) -> Outcome {
        let root = self.home.root();
        let script = root.join(format!("block-{}.sh", block.line));
        // Names the failing command and its line in the file; the block's
        // first line is the script's second.
        let trap = "trap 'echo \"$DOCS_FILE:$((DOCS_LINE + LINENO - 1)): exited $?: $BASH_COMMAND\" >&2' ERR\n";
        std::fs::write(&script, format!("{trap}{}", block.text)).expect("write the block");
        let log_path = root.join(format!("block-{}.log", block.line));
        let log = std::fs::File::create(&log_path).expect("create the output log");

        let mut cmd = Command::new("bash");
        cmd.arg("-euo")
            .arg("pipefail")
            .arg(&script)
            .current_dir(&self.work)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log"))
            .stderr(log)
            .process_group(0);
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if (name.starts_with("HERMES") && name != "HERMES_BIN")
                || name.starts_with("TERMINAL_")
                || name == "RUST_LOG"
            {
                cmd.env_remove(name.as_ref());
            }
        }
        for name in CLOUD_CREDENTIALS {
            cmd.env_remove(name);
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.bin.clone()];
        paths.extend(std::env::split_paths(&path));
        cmd.env("PATH", std::env::join_paths(paths).expect("join PATH"))
            .env("HERMES_HOME", self.home.path())
            .env("HERMES_TEST_IMAGE", hermes_tests::test_image())
            .env("DOCS_FILE", file)
            .env("DOCS_LINE", block.line.to_string());

        let started = Instant::now();
        let mut child = cmd.spawn().expect("spawn bash");
        let (code, timed_out) = loop {
            if let Some(status) = child.try_wait().expect("wait for the block") {
                break (status.code(), false);
            }
            if started.elapsed() > BLOCK_TIMEOUT {
                let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
                let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
                let _ = child.wait();
                break (None, true);
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let took = started.elapsed();
        let output = std::fs::read_to_string(&log_path).unwrap_or_default();
        Outcome {
            code,
            timed_out,
            output,
            took,
        }
    }
}

impl Drop for Place {
    /// The proxy stopped, then the profile's containers removed (the home
    /// goes after, with its mounts).
    fn drop(&mut self) {
        drop(StopProxy(&self.home));
        drop(ProfileCleanup(self.profile.clone()));
    }
}

/// The runnable blocks of every file, in groups that share a home: a
/// block marked `continues` runs after the file's runnable block before it,
/// in its home.
fn groups() -> Vec<(PathBuf, Vec<Block>)> {
    let mut groups: Vec<(PathBuf, Vec<Block>)> = Vec::new();
    for file in doc_files() {
        let (found, _) = blocks(&read(&file));
        let mut first_of_file = true;
        for block in found.into_iter().filter(Block::runnable) {
            let continues = block.info.iter().any(|w| w == CONTINUES);
            match groups.last_mut() {
                Some((_, group)) if continues && !first_of_file => group.push(block),
                _ => {
                    assert!(
                        !continues,
                        "{}:{}: a block marked `{CONTINUES}` follows no runnable block",
                        file.display(),
                        block.line
                    );
                    groups.push((file.clone(), vec![block]));
                }
            }
            first_of_file = false;
        }
    }
    groups
}

#[test]
fn every_runnable_block_runs() {
    let groups = groups();
    assert!(
        groups.iter().any(|(f, _)| f == Path::new("README.md")),
        "README.md has no block marked `{MARKER}`: the quickstart is not tested"
    );
    let mut failures = String::new();
    let mut ran = 0;
    for (n, (file, group)) in groups.iter().enumerate() {
        let place = Place::new(n);
        for block in group {
            ran += 1;
            let out = place.run(file, block);
            let why = match (out.timed_out, out.code) {
                (true, _) => format!("timed out after {} s", BLOCK_TIMEOUT.as_secs()),
                (false, Some(0)) => "passed".to_string(),
                (false, Some(c)) => format!("exited {c}"),
                (false, None) => "was killed by a signal".to_string(),
            };
            eprintln!(
                "{}:{}: {why} in {:.1} s",
                file.display(),
                block.line,
                out.took.as_secs_f64()
            );
            if out.code == Some(0) {
                continue;
            }
            let _ = write!(
                failures,
                "\n{}:{}: the block {why}\n--- block ---\n{}--- output ---\n{}",
                file.display(),
                block.line,
                block.text,
                out.output
            );
            // The blocks that continue it would fail for it.
            break;
        }
    }
    assert!(
        failures.is_empty(),
        "{ran} runnable blocks run, failing:{failures}"
    );
}

#[test]
fn the_scanner_finds_fences_links_and_anchors() {
    let text = "# A title\n\nSee [b](docs/b.md#x-y) and `[not](a-link)`.\n\n  ```sh runnable\n  echo hi\n  ```\n\n```\n[no](link)\n```\n## X: y\n## X: y\n";
    let (found, _) = blocks(text);
    assert_eq!(found.len(), 2);
    assert!(found[0].runnable());
    assert_eq!((found[0].line, found[0].text.as_str()), (5, "echo hi\n"));
    assert!(!found[1].runnable());
    assert_eq!(links(text), vec![(3, "docs/b.md#x-y".to_string())]);
    let a = anchors(text);
    for want in ["a-title", "x-y", "x-y-1"] {
        assert!(a.contains(want), "{want} in {a:?}");
    }
}
