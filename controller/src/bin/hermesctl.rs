//! `hermesctl`: the controller's command line under a name Hermes Agent's
//! own `hermes` binary cannot shadow on PATH (see `hermes::main`).

fn main() -> std::process::ExitCode {
    hermes::main()
}
