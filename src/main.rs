//! The `weft` command-line tool. See `weft --help`.

fn main() {
    std::process::exit(weft::cli::main());
}
