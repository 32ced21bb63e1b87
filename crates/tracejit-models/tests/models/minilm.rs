//! all-MiniLM-L6-v2 from its published files against sentence-transformers:
//! the word-piece ids of every line of `data/minilm_sentences.txt` (accents,
//! CJK, emoji, control characters, unknown symbols, an empty line, lines
//! past 256 pieces) exactly as Hugging Face's tokenizer gives them, and each
//! embedding within cosine 0.99999 of PyTorch's (`scripts/
//! make_minilm_reference.py` made the fixture; its docstring says how).
//!
//! It needs the model: `scripts/fetch_minilm.sh` unpacks it (`.ci/run` does),
//! then `cargo test --workspace --test models -- --ignored minilm::`. Run
//! without the model it fails with that instruction; it never skips.

use std::path::PathBuf;

use tracejit_models::{EmbedOptions, SentenceEmbedder};

fn model_dir() -> PathBuf {
    let root = std::env::var_os("TRACEJIT_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tracejit"));
    let dir = root.join("all-minilm-l6-v2-0.1.0");
    assert!(
        dir.join(".complete").exists(),
        "all-MiniLM-L6-v2 is not at {}: run scripts/fetch_minilm.sh first",
        dir.display()
    );
    dir
}

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn lines() -> Vec<String> {
    let text = std::fs::read_to_string(data("minilm_sentences.txt")).unwrap();
    text.split('\n').map(str::to_string).collect::<Vec<_>>()[..text.matches('\n').count()].to_vec()
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2: scripts/fetch_minilm.sh, then --ignored"]
fn token_ids_are_hugging_faces() {
    let model = SentenceEmbedder::load(model_dir()).unwrap();
    let lines = lines();
    let want: Vec<Vec<u32>> = serde_json::from_str(&std::fs::read_to_string(data("minilm_token_ids.json")).unwrap())
        .expect("the fixture's ids");
    let texts: Vec<&str> = lines.iter().map(String::as_str).collect();
    let got = model.tokenize(&texts).unwrap();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "line {i}: {:?}", lines[i]);
    }
    assert!(want.iter().any(|w| w.len() == 256), "the fixture reaches the truncation");
    assert!(want.iter().any(|w| w.contains(&100)), "and [UNK]");
    assert_eq!(want[4], [101, 102], "an empty line is [CLS] [SEP]");
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2: scripts/fetch_minilm.sh, then --ignored"]
fn embeddings_match_sentence_transformers() {
    let model = SentenceEmbedder::load(model_dir()).unwrap();
    let lines = lines();
    let texts: Vec<&str> = lines.iter().map(String::as_str).collect();
    let reference = tracejit::checkpoint::read(data("minilm_reference.safetensors")).unwrap();
    let want = reference["embeddings"].to_vec::<f32>().unwrap();
    // Batches of 7 so the lines meet others of different lengths.
    let got = model.embed_with(&texts, EmbedOptions { batch_size: 7, ..EmbedOptions::default() }, &mut |_| {}).unwrap();
    for (i, g) in got.iter().enumerate() {
        let w = &want[i * 384..(i + 1) * 384];
        let dot: f64 = g.iter().zip(w).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
        let norms: f64 = (g.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>()
            * w.iter().map(|b| f64::from(*b).powi(2)).sum::<f64>())
        .sqrt();
        let cosine = dot / norms;
        assert!(cosine >= 0.99999, "line {i} {:?}: cosine {cosine}", lines[i]);
    }
    let stats = model.function().concrete_functions()[0].schedule_stats().expect("compiled by the JIT");
    assert!(stats.gemms >= 6 * 4, "{stats}");
}
