//! The examples' logger: `RUST_LOG` as given (default `warn`, so only
//! tracejit's retrace warnings show), with Cranelift kept at `warn` unless
//! `RUST_LOG` names it. `log` targets are crate names, and at `info`
//! Cranelift logs the IR of every kernel it compiles, burying tracejit's own
//! messages. `RUST_LOG=tracejit=info` shows every trace and its reason.

/// Installs the logger (once; later calls do nothing).
#[allow(dead_code, reason = "each example includes this file; train_charlm tags its lines instead")]
pub fn init() {
    init_tagged("");
}

/// [`init`] with every line starting with `tag` (a data-parallel rank's
/// `[rank 1/4] `); an empty tag keeps env_logger's own format.
pub fn init_tagged(tag: &str) {
    let spec = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_string());
    let mut builder = env_logger::Builder::new();
    builder.parse_filters(&spec);
    if !spec.contains("cranelift") {
        builder.parse_filters("cranelift=warn");
    }
    if !tag.is_empty() {
        use std::io::Write;
        let tag = tag.to_string();
        builder.format(move |buf, r| writeln!(buf, "{tag}{} {}: {}", r.level(), r.target(), r.args()));
    }
    builder.try_init().ok();
}
