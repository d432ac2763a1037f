//! The `weft` command-line tool. See `weft --help`.

/// mimalloc instead of the system allocator: auto-sharding a large training
/// step builds and frees millions of small objects (e-nodes, partial
/// plans), and glibc's malloc spent a fifth of that time in allocation
/// and free-list consolidation (32-layer GPT on 2 cores: 3.4 s with glibc,
/// 2.5 s with mimalloc; BENCHMARKS.md). The libraries leave the choice to
/// the program that links them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option: `mi_option_purge_delay` in the
/// `mi_option_e` enum of the v3 `mimalloc.h` that libmimalloc-sys 0.1.49
/// builds (the crate names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() {
    // Never hand freed memory back to the OS. A training step frees and
    // re-allocates the same large buffers every step; with mimalloc's
    // default delay they are purged between steps and every reuse faults
    // in fresh, zeroed (huge) pages: 2,200 page faults and ~15% of a
    // step's CPU time in the kernel's page clearing for the MLP FSDP step
    // (BENCHMARKS.md). Memory stays at the run's peak instead, as with
    // XLA's allocator.
    // SAFETY: mi_option_set only stores an integer in mimalloc's option
    // table; it is called before any other thread exists.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    std::process::exit(weft::cli::main());
}
