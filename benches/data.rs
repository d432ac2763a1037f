//! Benchmark: data loader throughput.
//!
//! Run with `cargo bench --bench data`; results go in BENCHMARKS.md. Each
//! measurement is repeated (default 3 times, `WEFT_BENCH_RUNS` to change);
//! the median is printed. Files are written under the system temporary
//! directory (`TMPDIR` to change) and read through the page cache:
//!
//! - open: checking a 16M-token u16 file (every id below the vocabulary)
//!   and hashing it (sha256), the one pass a run makes when it starts;
//! - token batches: 16 random windows of 65 tokens per step (the shape of
//!   `examples/configs/gpt_bytes.toml`), read and converted to i32 tensors,
//!   in the loop (depth 0) and through the prefetch thread (depth 2);
//! - table batches: 32 shuffled examples per step of a 100,000-example
//!   `.safetensors` table (x, y: f32[64] each, the MLP example's width);
//! - prepare: `weft data prepare` of weft's own documentation (specs/*.md
//!   and README.md, repeated to about 8 MB of text) byte-level and with a
//!   `tokenizer.json`: a GPT-2-style byte-level BPE of 4096 ids trained
//!   here on the same documents (the training is not timed).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use weft::data::{input_specs, BatchPart, DataConfig, DataPath, Order, Prefetcher, Split};
use weft::ir::tensor::{write_safetensors, HostTensor};
use weft::ir::{DType, TensorType};

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// The median wall time of reading `steps` batches through a prefetcher
/// of `depth` (each run reads other steps).
fn time_batches(split: &Arc<Split>, steps: u64, runs: usize, depth: usize) -> f64 {
    let mut t = Vec::new();
    for r in 0..runs {
        let whole = BatchPart::whole(split.batch_size());
        let mut p = Prefetcher::new(split.clone(), whole, r as u64 * steps, (r as u64 + 1) * steps, depth).unwrap();
        let clock = Instant::now();
        for _ in 0..steps {
            std::hint::black_box(p.next_batch().unwrap());
        }
        t.push(clock.elapsed().as_secs_f64());
    }
    median(t)
}

fn cfg(source: &str, path: &std::path::Path) -> DataConfig {
    DataConfig {
        source: source.into(),
        train: DataPath::File(path.to_path_buf()),
        val: None,
        dtype: "u16".into(),
        shuffle: true,
        prefetch: 0,
        eval_every: 0,
        eval_batches: 1,
    }
}

fn main() {
    let runs: usize = std::env::var("WEFT_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let dir = std::env::temp_dir().join(format!("weft-bench-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // Tokens.
    let n_tokens = 16usize << 20;
    let tok = dir.join("train.bin");
    let bytes: Vec<u8> = (0..n_tokens).flat_map(|i| (((i * 2654435761) >> 7) as u16 % 256).to_le_bytes()).collect();
    std::fs::write(&tok, &bytes).unwrap();
    let (batch, seq) = (16usize, 64usize);
    let gpt = [
        ("tokens".to_string(), TensorType::new(DType::I32, vec![batch, seq])),
        ("targets".to_string(), TensorType::new(DType::I32, vec![batch, seq])),
    ];
    let c = cfg("tokens", &tok);
    let mut open = Vec::new();
    let mut split = None;
    for _ in 0..runs {
        let t = Instant::now();
        split = Some(
            Split::open(
                &c,
                &c.train,
                "data.train",
                &input_specs(&gpt, &[("tokens".to_string(), 256), ("targets".to_string(), 256)].into()),
                0,
                Order::Shuffled,
            )
            .unwrap(),
        );
        open.push(t.elapsed().as_secs_f64());
    }
    let m = median(open);
    println!(
        "open (check ids + sha256) of {} MB: {:.1} ms, {:.0} MB/s",
        bytes.len() / 1_000_000,
        m * 1e3,
        bytes.len() as f64 / 1e6 / m
    );
    let split = Arc::new(split.unwrap());
    let steps = 20_000u64;
    for depth in [0usize, 2] {
        let m = time_batches(&split, steps, runs, depth);
        println!(
            "token batches ({batch} x {} tokens), prefetch {depth}: {:.1} us/batch, {:.2e} tokens/s, {:.0} windows/s",
            seq + 1,
            m / steps as f64 * 1e6,
            (steps as usize * batch * seq) as f64 / m,
            (steps as usize * batch) as f64 / m
        );
    }

    // Table.
    let (n, d, b) = (100_000usize, 64usize, 32usize);
    let xs: Vec<f32> = (0..n * d).map(|i| (i % 977) as f32 * 1e-3).collect();
    let t = BTreeMap::from([
        ("x".to_string(), HostTensor::from_f32(&[n, d], xs.clone()).unwrap()),
        ("y".to_string(), HostTensor::from_f32(&[n, d], xs).unwrap()),
    ]);
    let table = dir.join("table.safetensors");
    write_safetensors(&table, &t).unwrap();
    let mlp = [
        ("x".to_string(), TensorType::new(DType::F32, vec![b, d])),
        ("y".to_string(), TensorType::new(DType::F32, vec![b, d])),
    ];
    let c = cfg("table", &table);
    let split = Arc::new(
        Split::open(&c, &c.train, "data.train", &input_specs(&mlp, &Default::default()), 0, Order::Shuffled).unwrap(),
    );
    let steps = 5_000u64;
    for depth in [0usize, 2] {
        let m = time_batches(&split, steps, runs, depth);
        println!(
            "table batches ({b} examples of 2 x f32[{d}]), prefetch {depth}: {:.1} us/batch, {:.0} examples/s",
            m / steps as f64 * 1e6,
            (steps as usize * b) as f64 / m
        );
    }

    prepare_throughput(&dir, runs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `weft data prepare` throughput: bytes vs a trained byte-level BPE.
fn prepare_throughput(dir: &std::path::Path, runs: usize) {
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::models::TrainerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use weft::data::prepare::prepare;
    use weft::data::tokenize::Tokenizer;

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: Vec<std::path::PathBuf> = std::fs::read_dir(root.join("specs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.push(root.join("README.md"));
    let mut text = String::new();
    for d in &docs {
        text.push_str(&std::fs::read_to_string(d).unwrap());
    }
    let once = text.len();
    let corpus = dir.join("corpus.txt");
    std::fs::write(&corpus, text.repeat((8_000_000 / once).max(1))).unwrap();
    let corpus_bytes = std::fs::metadata(&corpus).unwrap().len() as f64;

    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(4096)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let mut bpe = tokenizers::Tokenizer::new(BPE::default());
    bpe.with_pre_tokenizer(Some(ByteLevel::default()));
    let files: Vec<String> = docs.iter().map(|p| p.display().to_string()).collect();
    bpe.train_from_files(&mut trainer, files).unwrap();
    let json = dir.join("tokenizer.json");
    bpe.save(&json, false).unwrap();

    for (name, tok) in [("bytes", Tokenizer::Bytes), ("byte-level BPE", Tokenizer::from_file(&json).unwrap())] {
        let mut t = Vec::new();
        let mut tokens = 0;
        for _ in 0..runs {
            let clock = Instant::now();
            let p = prepare(std::slice::from_ref(&corpus), &dir.join("prepared"), 0.1, &tok).unwrap();
            t.push(clock.elapsed().as_secs_f64());
            tokens = p.train_tokens + p.val_tokens;
        }
        let m = median(t);
        println!(
            "prepare {:.1} MB of text, {name} ({} ids): {:.2} s, {:.1} MB/s, {:.2e} tokens/s ({:.2} bytes/token)",
            corpus_bytes / 1e6,
            tok.vocab_size(),
            m,
            corpus_bytes / 1e6 / m,
            tokens as f64 / m,
            corpus_bytes / tokens as f64
        );
    }
}
