//! `hermes completions SHELL` and `hermes man [--dir DIR]`: shell
//! completions and manual pages, generated from the command line's own
//! definition (clap_complete, clap_mangen), so they never drift from
//! `--help`. Both name the binary as it was invoked (`hermesctl` too).

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

/// Writes the completion script for `shell` on stdout.
pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    let mut command = crate::command_line();
    let name = command.get_name().to_string();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, name, &mut script);
    write_out(&script)
}

/// Writes the manual page of the whole command on stdout, or, with a
/// directory, one page per command and subcommand into it.
pub fn man(dir: Option<&Path>) -> anyhow::Result<ExitCode> {
    let command = crate::command_line();
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(command, dir)
                .with_context(|| format!("cannot write the pages into {}", dir.display()))?;
            eprintln!("wrote the manual pages into {}", dir.display());
            Ok(ExitCode::SUCCESS)
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut page)
                .context("cannot render the manual page")?;
            write_out(&page)
        }
    }
}

/// Writes bytes on stdout; a reader gone away is the end, not an error.
fn write_out(bytes: &[u8]) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e).context("cannot write the output"),
    }
}
