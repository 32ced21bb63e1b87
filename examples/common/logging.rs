//! The examples' logger: `RUST_LOG` as given (default `warn`, so only
//! tracejit's retrace warnings show), with Cranelift kept at `warn` unless
//! `RUST_LOG` names it. `log` targets are crate names, and at `info`
//! Cranelift logs the IR of every kernel it compiles, burying tracejit's own
//! messages. `RUST_LOG=tracejit=info` shows every trace and its reason.

/// Installs the logger (once; later calls do nothing).
pub fn init() {
    let spec = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_string());
    let mut builder = env_logger::Builder::new();
    builder.parse_filters(&spec);
    if !spec.contains("cranelift") {
        builder.parse_filters("cranelift=warn");
    }
    builder.try_init().ok();
}
