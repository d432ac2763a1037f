//! The `weft` command-line tool. See `weft --help`.

/// mimalloc instead of the system allocator: auto-sharding a large training
/// step builds and frees millions of small objects (e-nodes, partial
/// plans), and glibc's malloc spent a fifth of that time in allocation
/// and free-list consolidation (32-layer GPT on 2 cores: 3.4 s with glibc,
/// 2.5 s with mimalloc; BENCHMARKS.md). The libraries leave the choice to
/// the program that links them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(weft::cli::main());
}
