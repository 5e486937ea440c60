//! `hermes config`: path, env-path, get, set, unset, show, check.

use std::process::ExitCode;

use anyhow::Context;
use hermes_model::config::{self, Issue};
use hermes_model::value::Value;
use hermes_model::{dotenv, edit, keypath, schema, yaml};

use crate::cli::{ConfigCommand, Output};
use crate::fsio;
use crate::home::Home;
use crate::host::{read_config_text, read_env_text};

/// Mode of config.yaml, which may hold `docker_env` values: hermes writes
/// it 0600, an existing file included.
const CONFIG_MODE: u32 = 0o600;
/// Secrets: the file 0600, its directory 0700.
const SECRET_MODE: u32 = 0o600;
const HOME_MODE: u32 = 0o700;

pub fn run(home: &Home, command: ConfigCommand) -> anyhow::Result<ExitCode> {
    match command {
        ConfigCommand::Path => {
            println!("{}", home.config().display());
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::EnvPath => {
            println!("{}", home.env_file().display());
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Get { key, output, json } => get(home, &key, json || output == Output::Json),
        ConfigCommand::Set { key, value, force } => set(home, &key, &value, force),
        ConfigCommand::Unset { key } => unset(home, &key),
        ConfigCommand::Show { output, json } => show(home, json || output == Output::Json),
        ConfigCommand::Check { output } => check(home, output),
    }
}

/// Defaults with the file laid over them, without type validation: `get`
/// and `show` work on a file whose values are wrong, so they help fix it.
/// The `TERMINAL_*` variables that win over the file are laid over it
/// too, as a pass lays them; the keys they set are returned with it.
fn merged_view(home: &Home) -> anyhow::Result<(Value, Vec<config::EnvOverride>)> {
    let mut merged = schema::defaults();
    let root = match read_config_text(home)? {
        Some(text) => yaml::parse(&text).map_err(|e| {
            anyhow::anyhow!(
                "{}",
                Issue::from(e).render(&home.config().display().to_string())
            )
        })?,
        None => None,
    };
    let (root, overrides) =
        config::effective_tree(root, &crate::host::host_env(home)?.terminal_vars());
    if let Some(root) = root {
        merged.merge(&root.to_value());
    }
    Ok((merged, overrides))
}

/// `note: terminal.X is TERMINAL_X's value …` on stderr, for each key a
/// variable set.
fn note_overrides<'a>(overrides: impl IntoIterator<Item = &'a config::EnvOverride>) {
    for o in overrides {
        eprintln!(
            "note: {} is {}'s value, over config.yaml, as Hermes Agent reads it",
            o.path, o.var
        );
    }
}

/// The YAML of `config show` with `# from TERMINAL_X` after each key a
/// variable set.
fn annotate(yaml: &str, overrides: &[config::EnvOverride]) -> String {
    let mut section = "";
    let mut out = String::new();
    for line in yaml.lines() {
        out.push_str(line);
        if !line.starts_with(' ') {
            section = line.split(':').next().unwrap_or_default();
        } else if let Some(key) = line
            .strip_prefix("  ")
            .filter(|rest| !rest.starts_with(' '))
            .and_then(|rest| rest.split(':').next())
            && let Some(o) = overrides
                .iter()
                .find(|o| o.path == format!("{section}.{key}"))
        {
            out.push_str(&format!("  # from {}", o.var));
        }
        out.push('\n');
    }
    out
}

/// The keys of a path given on the command line, and the path as hermes
/// writes it (quotes only where a key holds a dot).
fn parse_key(key: &str) -> anyhow::Result<(Vec<String>, String)> {
    let keys = keypath::parse(key).map_err(|e| anyhow::anyhow!("bad key path: {e}"))?;
    let path = keypath::render(&keys);
    Ok((keys, path))
}

fn get(home: &Home, key: &str, json: bool) -> anyhow::Result<ExitCode> {
    let (keys, key) = parse_key(key)?;
    let (merged, overrides) = merged_view(home)?;
    note_overrides(overrides.iter().filter(|o| o.path == key));
    match merged.get_keys(&keys) {
        // `config show --json` has the null too: the key exists, unset.
        Some(Value::Null) if json => {
            println!("null");
            Ok(ExitCode::SUCCESS)
        }
        None | Some(Value::Null) => {
            eprintln!("Config key not set: {key}");
            crate::json::note_error(&format!("config key not set: {key}"));
            Ok(ExitCode::from(1))
        }
        Some(value) if json => {
            println!("{}", serde_json::to_string_pretty(&value.to_json())?);
            Ok(ExitCode::SUCCESS)
        }
        Some(value) => {
            println!("{}", value.to_display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn show(home: &Home, json: bool) -> anyhow::Result<ExitCode> {
    let (merged, overrides) = merged_view(home)?;
    if json {
        // The JSON stays the config; where a value came from goes beside.
        note_overrides(&overrides);
        println!("{}", serde_json::to_string_pretty(&merged.to_json())?);
    } else {
        print!("{}", annotate(&merged.to_yaml_block(0), &overrides));
    }
    Ok(ExitCode::SUCCESS)
}

/// What `config set` makes of a key neither hermes nor Hermes Agent
/// knows. A section neither knows (`termnal.backend`), or a key of
/// hermes's own sections that is one typo away from a known one
/// (`terminal.backnd`), is refused: saved, it would be ignored without a
/// word. Another unknown key is saved with a warning (a key of the agent's
/// sections, a newer agent's key).
enum Unknown {
    Known,
    Warn(String),
    Refuse(String),
}

fn unknown_key(keys: &[String], key: &str) -> Unknown {
    use hermes_model::config::agent;
    if schema::lookup(key).is_some() || schema::map_entry_of(keys).is_some() {
        return Unknown::Known;
    }
    let (section, leaf) = schema::split(key);
    let agents = match section {
        "terminal" => agent::AGENT_TERMINAL_DEFAULTS,
        "security" => agent::AGENT_SECURITY_KEYS,
        _ => &[],
    };
    if keys.len() == 2 && agents.contains(&leaf) {
        return Unknown::Known;
    }
    if schema::SECTIONS.contains(&section) {
        return match schema::did_you_mean(leaf, schema::leaves_of(section)) {
            Some(near) => Unknown::Refuse(format!(
                "unknown key `{key}`: did you mean `{section}.{near}`? (--force saves it anyway)"
            )),
            None => Unknown::Warn(format!("unknown key `{key}`, saved anyway")),
        };
    }
    if agent::AGENT_SECTIONS.contains(&section) {
        // Hermes Agent's own section: its keys are its business.
        return Unknown::Known;
    }
    let all = schema::KEYS.iter().map(|k| k.path);
    let hint = schema::did_you_mean(key, all)
        .map(str::to_string)
        .or_else(|| {
            schema::did_you_mean(section, schema::SECTIONS.iter().copied())
                .map(|near| format!("{near}.{leaf}"))
        });
    let hint = hint
        .map(|h| format!(" did you mean `{h}`?"))
        .unwrap_or_default();
    Unknown::Refuse(format!(
        "unknown section `{section}` (neither hermes's, {}, nor Hermes Agent's);{hint} (--force saves it anyway)",
        schema::SECTIONS.join(", ")
    ))
}

fn set(home: &Home, key: &str, raw: &str, force: bool) -> anyhow::Result<ExitCode> {
    if dotenv::is_credential_key(key) {
        let path = home.env_file();
        fsio::ensure_dir(home.root(), HOME_MODE)?;
        let old = read_env_text(home)?;
        let new = dotenv::set(&old, key, raw);
        fsio::write_atomic(&path, new.as_bytes(), SECRET_MODE, true)
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("Saved {key} to {} (0600)", path.display());
        return Ok(ExitCode::SUCCESS);
    }
    let (keys, key) = parse_key(key)?;
    let key = key.as_str();
    let unknown = unknown_key(&keys, key);
    if let Unknown::Refuse(why) = &unknown {
        if !force {
            eprintln!("error: {why}");
            eprintln!("{} was left unchanged.", home.config().display());
            return Ok(ExitCode::from(1));
        }
    }
    let ty = match schema::lookup(key) {
        Some(spec) => Some(spec.ty),
        // A host of proxy.resolve takes its address as text.
        None => schema::map_entry_of(&keys)
            .filter(|spec| spec.ty == schema::Ty::ResolveMap)
            .map(|_| schema::Ty::Str),
    };
    let value = edit::coerce(raw, ty).map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
    let path = home.config();
    let file = path.display().to_string();
    let old = read_config_text(home)?.unwrap_or_default();
    let new = edit::set(&old, key, &value, force).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
    // Refuse a value that makes the file invalid: every error the new text
    // has and the old one had not. Errors that were there before are only
    // reported, so that a broken file can be fixed one key at a time.
    let env = crate::host::host_env(home)?;
    // Every error of a text, those that block only the Docker sandboxes
    // included.
    let errors_of = |text: &str| match crate::load::load_text(home, text, &env) {
        Ok(loaded) => loaded.config.sandbox_errors,
        Err(errors) => errors.0,
    };
    let errors = errors_of(&new);
    if !errors.is_empty() {
        let before: Vec<(String, String)> = errors_of(&old)
            .into_iter()
            .map(|i| (i.path, i.message))
            .collect();
        let (theirs, ours): (Vec<Issue>, Vec<Issue>) = errors
            .into_iter()
            .partition(|i| before.contains(&(i.path.clone(), i.message.clone())));
        if !ours.is_empty() {
            for issue in &ours {
                if issue.path == key {
                    eprintln!("error: {}: {}", issue.path, issue.message);
                } else {
                    eprintln!("error: setting {key}: {}: {}", issue.path, issue.message);
                }
            }
            eprintln!("{file} was left unchanged.");
            return Ok(ExitCode::from(1));
        }
        for issue in theirs {
            eprintln!("warning: {}", issue.render(&file));
        }
    }
    match unknown {
        Unknown::Warn(why) | Unknown::Refuse(why) => eprintln!("warning: {why}"),
        Unknown::Known => {}
    }
    fsio::ensure_dir(home.root(), HOME_MODE)?;
    fsio::write_atomic(&path, new.as_bytes(), CONFIG_MODE, true)
        .with_context(|| format!("cannot write {file}"))?;
    println!("Set {key} = {} in {file}", value.to_yaml_inline());
    Ok(ExitCode::SUCCESS)
}

fn unset(home: &Home, key: &str) -> anyhow::Result<ExitCode> {
    if dotenv::is_credential_key(key) {
        let path = home.env_file();
        let old = read_env_text(home)?;
        return match dotenv::unset(&old, key) {
            Some(new) => {
                fsio::write_atomic(&path, new.as_bytes(), SECRET_MODE, true)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                println!("Removed {key} from {}", path.display());
                Ok(ExitCode::SUCCESS)
            }
            None => {
                println!("{key} is not set in {}; nothing to do", path.display());
                Ok(ExitCode::SUCCESS)
            }
        };
    }
    let (_, key) = parse_key(key)?;
    let key = key.as_str();
    let path = home.config();
    let file = path.display().to_string();
    let old = read_config_text(home)?.unwrap_or_default();
    match edit::unset(&old, key).map_err(|e| anyhow::anyhow!("{file}: {e}"))? {
        Some(new) => {
            fsio::write_atomic(&path, new.as_bytes(), CONFIG_MODE, true)
                .with_context(|| format!("cannot write {file}"))?;
            println!("Removed {key} from {file}");
        }
        None => println!("{key} is not set in {file}; nothing to do"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `config check --output json`: the file, whether it is valid, and
/// each error and warning with its key and place.
#[derive(Debug, Default, serde::Serialize)]
struct CheckJson {
    file: String,
    exists: bool,
    valid: bool,
    errors: Vec<IssueJson>,
    warnings: Vec<IssueJson>,
}

/// One problem: its key path and place when it has them.
#[derive(Debug, serde::Serialize)]
struct IssueJson {
    path: Option<String>,
    line: Option<usize>,
    column: Option<usize>,
    message: String,
}

impl IssueJson {
    fn of(issue: &Issue) -> IssueJson {
        IssueJson {
            path: (!issue.path.is_empty()).then(|| issue.path.clone()),
            line: issue.pos.map(|p| p.line),
            column: issue.pos.map(|p| p.col),
            message: issue.message.clone(),
        }
    }

    fn text(message: String) -> IssueJson {
        IssueJson {
            path: None,
            line: None,
            column: None,
            message,
        }
    }
}

fn check(home: &Home, output: Output) -> anyhow::Result<ExitCode> {
    let path = home.config();
    let file = path.display().to_string();
    let mut report = CheckJson {
        file: file.clone(),
        ..CheckJson::default()
    };
    let code = check_into(home, &file, &mut report)?;
    report.valid = code == ExitCode::SUCCESS;
    if output == Output::Json {
        crate::json::print(&report)?;
    }
    Ok(code)
}

/// The checks of `config check`, said on stderr (and stdout's one line
/// in text), and gathered in `report`.
fn check_into(home: &Home, file: &str, report: &mut CheckJson) -> anyhow::Result<ExitCode> {
    let json = crate::json::requested();
    let say = |line: String| {
        if !json {
            println!("{line}");
        }
    };
    let text = match read_config_text(home) {
        Ok(Some(text)) => text,
        Ok(None) => {
            say(format!(
                "No config file at {file}: the built-in defaults apply."
            ));
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => {
            eprintln!("error: {e}");
            report.exists = true;
            report.errors.push(IssueJson::text(e.to_string()));
            return Ok(ExitCode::from(1));
        }
    };
    report.exists = true;
    let env_mode_warning = env_mode_warning(home);
    let env = match crate::host::host_env(home) {
        Ok(env) => env,
        Err(e) => {
            let text = crate::chain::Chain(&e).to_string();
            eprintln!("error: {text}");
            report.errors.push(IssueJson::text(text));
            return Ok(ExitCode::from(1));
        }
    };
    let loaded = crate::load::load_text(home, &text, &env).and_then(|loaded| {
        // A cloud backend without its credentials cannot run a command:
        // an error here rather than a surprise at the first exec.
        let missing = hermes_model::cloud::check_credentials(&text, &env);
        if missing.is_empty() {
            Ok(loaded)
        } else {
            Err(config::ConfigError(missing))
        }
    });
    match loaded {
        Ok(loaded) => {
            for o in &loaded.overrides {
                eprintln!(
                    "note: {} is {}'s value ({}), over {file}, as Hermes Agent reads it",
                    o.path, o.var, o.value
                );
            }
            for w in &loaded.warnings {
                eprintln!("warning: {}", w.render(file));
                report.warnings.push(IssueJson::of(w));
            }
            let mut warn = |text: String| {
                eprintln!("warning: {text}");
                report.warnings.push(IssueJson::text(text));
            };
            if let Some(w) = env_mode_warning {
                warn(w);
            }
            if let Some(w) = home.exposure_warning() {
                warn(w.to_string());
            }
            if !loaded.config.proxy.enabled
                && let Ok(Some(pid)) =
                    crate::egress::daemon::running_pid(&crate::egress::files::Paths::new(home))
            {
                warn(format!(
                    "the egress proxy runs (pid {pid}) while proxy.enabled is false: \
                     the next pass (`hermes reconcile` or a running controller) stops it"
                ));
            }
            if loaded.config.proxy.credential_source == crate::egress::bitwarden::SOURCE
                && let Some(why) = crate::egress::bitwarden::not_ready(&env)
            {
                warn(why.to_string());
            }
            if loaded.config.terminal.backend == hermes_model::config::Backend::Docker
                && let Some(why) = crate::disk::unavailable()
            {
                warn(format!(
                    "terminal.container_disk is not enforced on this host: {why}"
                ));
            }
            let count = report.warnings.len();
            let warnings = format!("{count} warning{}", if count == 1 { "" } else { "s" });
            let errors = &loaded.config.sandbox_errors;
            if !errors.is_empty() {
                // The config is usable, but not as it says: a GitOps check
                // of it must fail.
                for issue in errors {
                    eprintln!("error: {}", issue.render(file));
                    report.errors.push(IssueJson::of(issue));
                }
                eprintln!(
                    "{file} is invalid for the Docker sandboxes: {} error{} of terminal.docker_extra_args or terminal.docker_runtime ({warnings}); a pass blocks the Docker sandboxes with them and converges the rest of the host.",
                    errors.len(),
                    if errors.len() == 1 { "" } else { "s" }
                );
                return Ok(ExitCode::from(1));
            }
            say(format!("{file} is valid ({warnings})."));
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            for issue in &errors.0 {
                eprintln!("error: {}", issue.render(file));
                report.errors.push(IssueJson::of(issue));
            }
            eprintln!(
                "{file} is invalid: {} error{}.",
                errors.0.len(),
                if errors.0.len() == 1 { "" } else { "s" }
            );
            Ok(ExitCode::from(1))
        }
    }
}

fn env_mode_warning(home: &Home) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = home.env_file();
    let mode = std::fs::metadata(&path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "{} is readable by others (mode {mode:o}); run `chmod 600 {}`",
            path.display(),
            path.display()
        )
    })
}
