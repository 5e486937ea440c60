//! `hermes`: the controller's command line (see the library, `hermes::main`).

fn main() -> std::process::ExitCode {
    hermes::main()
}
