//! The `infertrace` binary: everything is in the library (`infertrace::cli`).

fn main() -> std::process::ExitCode {
    infertrace::cli::main()
}
