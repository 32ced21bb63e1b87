//! Sentence embeddings with all-MiniLM-L6-v2 (or any sentence-transformers
//! BERT directory), the model nobody here trained, from its own files:
//!
//! ```sh
//! scripts/fetch_minilm.sh        # prints the model directory (~/.cache/tracejit/all-minilm-l6-v2-0.1.0)
//! cargo run --release --example embed -- --model DIR --json FILE              # one JSON array per line of FILE
//! cargo run --release --example embed -- --model DIR --query "a horse" FILE   # FILE's lines ranked by meaning
//! ```
//!
//! `--json` prints, for every line of FILE in order, the line's normalized
//! mean-pooled embedding as a JSON array of 384 floats (an empty line is
//! embedded as sentence-transformers embeds `""`). `--query` prints the
//! `--top` (default 10) lines closest to the query by cosine similarity.
//! `--bf16` runs the products in bf16 with f32 accumulation
//! (`mixed_precision`). Lines are batched by length (`--batch`, default 32); a progress bar
//! shows on long files; the embeddings are cached beside FILE
//! (`FILE.embeddings.safetensors`, keyed by the text and the model's
//! files) so a second query of the same file embeds only the query.

#[path = "common/logging.rs"]
mod logging;

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use tracejit::prelude::*;
use tracejit_models::{EmbedOptions, SentenceEmbedder};

struct Args {
    model: PathBuf,
    file: PathBuf,
    query: Option<String>,
    top: usize,
    batch: usize,
    no_cache: bool,
    bf16: bool,
}

const USAGE: &str = "usage: embed --model DIR (--json | --query TEXT [--top K]) [--batch N] [--bf16] [--no-cache] FILE";

fn parse() -> anyhow::Result<Args> {
    let mut it = std::env::args().skip(1);
    let (mut model, mut file, mut query, mut json) = (None, None, None, false);
    let (mut top, mut batch, mut no_cache, mut bf16) = (10, 32, false, false);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value\n{USAGE}"));
        match a.as_str() {
            "--model" => model = Some(PathBuf::from(value("--model")?)),
            "--query" => query = Some(value("--query")?),
            "--json" => json = true,
            "--top" => top = value("--top")?.parse().context("--top takes a count")?,
            "--batch" => batch = value("--batch")?.parse().context("--batch takes a count")?,
            "--no-cache" => no_cache = true,
            "--bf16" => bf16 = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            f if !f.starts_with("--") && file.is_none() => file = Some(PathBuf::from(f)),
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let (Some(model), Some(file)) = (model, file) else { bail!("--model DIR and FILE are needed\n{USAGE}") };
    if json == query.is_some() {
        bail!("give exactly one of --json and --query\n{USAGE}");
    }
    if batch == 0 {
        bail!("--batch must be at least 1");
    }
    Ok(Args { model, file, query, top, batch, no_cache, bf16 })
}

/// A hash of the text, the precision and the model's files: what the
/// cache is keyed by.
fn cache_key(text: &str, model: &Path, bf16: bool) -> anyhow::Result<i64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(text.as_bytes());
    h.write_u8(u8::from(bf16));
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        let bytes = std::fs::read(model.join(f)).with_context(|| format!("reading {}", model.join(f).display()))?;
        h.write(&bytes);
    }
    Ok(h.finish() as i64)
}

/// The embeddings `[lines, width]` of every line, from the cache when its
/// key matches, else computed (with a progress bar past 500 lines) and
/// cached.
fn embed_file(model: &SentenceEmbedder, args: &Args, lines: &[&str], key: i64) -> anyhow::Result<Vec<Vec<f32>>> {
    let cache = PathBuf::from(format!("{}.embeddings.safetensors", args.file.display()));
    if !args.no_cache {
        if let Ok(t) = tracejit::checkpoint::read(&cache) {
            if t.get("key").and_then(|k| k.to_vec::<i64>().ok()) == Some(vec![key]) {
                let e = &t["embeddings"];
                let width = e.shape()[1];
                return Ok(e.to_vec::<f32>()?.chunks(width).map(<[f32]>::to_vec).collect());
            }
        }
    }
    let bar = (lines.len() > 500).then(|| {
        let b = ProgressBar::new(lines.len() as u64);
        b.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} lines, {per_sec}, eta {eta}").unwrap());
        b
    });
    let start = std::time::Instant::now();
    let options = EmbedOptions { batch_size: args.batch, ..EmbedOptions::default() };
    let out = model.embed_with(lines, options, &mut |done| {
        if let Some(b) = &bar {
            b.set_position(done as u64);
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
        let secs = start.elapsed().as_secs_f64();
        eprintln!("embedded {} lines in {secs:.1} s ({:.0} lines/s)", lines.len(), lines.len() as f64 / secs);
    }
    if !args.no_cache {
        let width = out.first().map_or(0, Vec::len);
        let flat: Vec<f32> = out.concat();
        let tensors = BTreeMap::from([
            ("embeddings".to_string(), Tensor::from_vec(flat, &[out.len(), width])),
            ("key".to_string(), Tensor::from_vec(vec![key], &[1])),
        ]);
        if let Err(e) = tracejit::checkpoint::write(&cache, &tensors) {
            eprintln!("warning: not cached: {e}");
        }
    }
    Ok(out)
}

fn main() -> anyhow::Result<()> {
    logging::init();
    let args = parse()?;
    let text = std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    // One text per line; a final newline does not start another.
    let mut lines: Vec<&str> = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).collect();
    if text.ends_with('\n') {
        lines.pop();
    }
    let mut model = SentenceEmbedder::load(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    if args.bf16 {
        model = model.with_mixed_precision(DType::BF16);
    }
    let key = cache_key(&text, &args.model, args.bf16)?;
    let embeddings = embed_file(&model, &args, &lines, key)?;
    match &args.query {
        None => {
            use std::io::Write;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            for e in &embeddings {
                let items: Vec<String> = e.iter().map(|v| format!("{v}")).collect();
                writeln!(out, "[{}]", items.join(","))?;
            }
        }
        Some(q) => {
            let qe = model.embed(&[q.as_str()])?.remove(0);
            let mut scored: Vec<(f32, usize)> = embeddings
                .iter()
                .enumerate()
                .map(|(i, e)| (e.iter().zip(&qe).map(|(a, b)| a * b).sum::<f32>(), i))
                .collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0));
            for (score, i) in scored.into_iter().take(args.top) {
                println!("{score:.4}  {:>6}  {}", i + 1, lines[i]);
            }
        }
    }
    Ok(())
}
