//! The `batchonce` binary: registers the bundled job kinds and hands over to
//! the engine's command line.
//!
//! the `batchonce` binary, which is `batchonce::cli::main(batchonce_workers::registry())`.

fn main() -> std::process::ExitCode {
    batchonce::cli::main(batchonce_workers::registry())
}
