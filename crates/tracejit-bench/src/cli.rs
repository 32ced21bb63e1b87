//! Command-line options of `tracejit-bench`.

use std::fmt;

/// Parsed options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// `--quick`: 0.05 s per measurement and a 64 MiB bandwidth buffer.
    pub quick: bool,
    /// `--json`: JSON lines on stdout instead of the table.
    pub json: bool,
    /// `--threads N`: the JIT's thread count (`tracejit::config::set_num_threads`); 1 by default.
    pub threads: usize,
    /// `--filter NAME`: only workloads whose name contains NAME (or whose id is NAME).
    pub filter: Option<String>,
    /// `--no-report`: do not write target/bench-report/.
    pub no_report: bool,
    /// `--profile`: per-step times of each selected workload's traced-jit
    /// call instead of the table.
    pub profile: bool,
    /// `--tract` (built with the `tract` feature): tract's figures on the
    /// selected model workloads, as JSON lines, instead of the table.
    pub tract: bool,
    /// `--help`.
    pub help: bool,
    /// `--inject-wrong-result NAME` (testing the harness): perturb NAME's
    /// traced results; the run must then fail.
    pub inject_wrong_result: Option<String>,
}

/// A command line that does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}\n\n{USAGE}", self.0)
    }
}

impl std::error::Error for UsageError {}

/// The `--help` text.
pub const USAGE: &str = "\
usage: tracejit-bench [--quick] [--json] [--threads N] [--filter NAME] [--no-report] [--profile] [--tract]

Runs the workloads of shared/WORKLOADS.md (W1-W10) eager, traced-interp and
traced-jit, verifies every result against eager, and prints per-call times
with the machine's floors. Writes report.md, speedups.svg and results.jsonl
to target/bench-report/.

  --quick          0.05 s per measurement (0.5 s otherwise), 64 MiB bandwidth buffer
  --json           one JSON object per line on stdout instead of the table
  --threads N      threads the JIT's large kernels and GEMMs use, and eager mode's large ops
                   (default 1)
  --filter NAME    only workloads whose name contains NAME (or whose id is NAME, e.g. W3); the
                   real-model workloads (W14 resnet50, W14b resnet50_b8, W15 minilm_onnx: ONNX
                   files of shared/peers/models/make_models.py) run only when named, or with
                   --filter models
  --no-report      do not write target/bench-report/
  --profile        instead of the table: where one traced-jit call of each workload
                   spends its time, step by step (GEMMs, fused regions, ...), slowest first
  --inject-wrong-result NAME
                   (tests the harness) perturb NAME's traced results: the run must fail
  --tract          (built with --features tract) instead of the table: tract on the selected
                   model workloads, one JSON line each (first call, median, difference from tracejit)
  -h, --help       this text";

/// Parses the arguments (without the program name).
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Options, UsageError> {
    let mut o = Options { threads: 1, ..Options::default() };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, UsageError> {
            inline.clone().or_else(|| it.next()).ok_or_else(|| UsageError(format!("{name} needs a value")))
        };
        match flag.as_str() {
            "--quick" => o.quick = true,
            "--json" => o.json = true,
            "--no-report" => o.no_report = true,
            "--profile" => o.profile = true,
            "--tract" => o.tract = true,
            "-h" | "--help" => o.help = true,
            "--threads" => {
                let v = value("--threads")?;
                o.threads = match v.parse::<usize>() {
                    Ok(n) if n >= 1 => n,
                    _ => return Err(UsageError(format!("--threads: `{v}` is not a positive integer"))),
                };
            }
            "--filter" => o.filter = Some(value("--filter")?),
            "--inject-wrong-result" => o.inject_wrong_result = Some(value("--inject-wrong-result")?),
            // `cargo bench` passes `--bench` to every bench target.
            "--bench" => {}
            other => return Err(UsageError(format!("unknown argument `{other}`"))),
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Options, UsageError> {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_every_option() {
        let o = p(&["--quick", "--json", "--threads", "2", "--filter=gelu"]).unwrap();
        assert!(o.quick && o.json && !o.help && !o.profile);
        assert!(p(&["--profile"]).unwrap().profile);
        assert_eq!(o.threads, 2);
        assert_eq!(o.filter.as_deref(), Some("gelu"));
        assert_eq!(p(&[]).unwrap().threads, 1);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(p(&["--threads", "0"]).is_err());
        assert!(p(&["--threads"]).is_err());
        assert!(p(&["--frobnicate"]).is_err());
    }
}
