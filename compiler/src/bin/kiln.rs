fn main() {
    std::process::exit(kiln_compiler::cli::main());
}
