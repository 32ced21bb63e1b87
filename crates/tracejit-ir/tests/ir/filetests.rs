//! Filetests of the passes, in the manner of Cranelift's: each
//! `tests/ir/filetests/*.tj` file holds an input graph in the text form, a
//! `; pass:` header, and `; check:` lines that the output must match.
//! [`run_all_filetests`] discovers and runs every file.
//!
//! A file's directives (comment lines, which `Graph::parse` skips):
//!
//! - `; pass: cse` — the passes to run, in order (names as `Pass::name`
//!   gives them, separated by spaces or commas), or `; pass: pipeline` for
//!   `Pipeline::default_pipeline()`.
//! - `; option: keep_composites` — sets `PassContext::keep_composites` (the
//!   inliner then keeps calls of `implements` functions for the selector);
//!   `; option: multi_pass_regions` lets fusion continue after reductions,
//!   as it does for the JIT;
//!   `; option: test_kernels` gives the selector the test registry, which
//!   has `tracejit.test.double` (x * 2 + 100) for f32 inputs;
//!   `; option: mixed_precision` has `auto_mixed_precision` round to bf16;
//!   `; option: int8_products` has it put products against weights in int8;
//!   `; option: channels_last` lets `channels_last` run.
//! - `; check: <line>` — some output line after the previous match equals
//!   `<line>`; `; nextln: <line>` — the line right after the previous match
//!   equals it; `; end` — no output line follows the previous match. Lines
//!   are compared exactly after trimming whitespace at both ends (so
//!   indentation is not checked; nesting is still fixed by line order).
//!
//! The output is, for each pass, `pass <name> (<summary>)` (or
//! `(unchanged)`), then the listing of the resulting graph; for `pipeline`,
//! the listing alone. Besides the checks, the runner asserts that the input
//! listing is exactly how the parsed input prints (so a file's input reads as
//! the graph it is), that the input verifies, that every pass leaves a graph
//! the verifier accepts and is idempotent, and that the output graph survives
//! its text form.
//!
//! `TRACEJIT_BLESS=1` rewrites every file's check lines from the actual
//! output: a `; check:` for the first line, `; nextln:` for each following
//! one and a final `; end`, so blessed files pin the whole output.
//!
//! Every golden listing of the pass tests lives here now, the selector and
//! pipeline ones included (`; option: test_kernels` gives them the registry
//! of `passes.rs` they used); `tests/ir/golden/` is gone. The Rust
//! tests in `passes.rs` that made them keep their other assertions (op
//! counts, interpreter results) and check that the graphs they build are
//! these files' inputs. What stays Rust-only needs Rust code: a custom
//! fusion acceptance rule (a closure), the `Restless`/`Vandal`/`Panicky`
//! passes of the pass-manager tests, dumps, and the differential proptest.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracejit_ir::passes::{
    AutoMixedPrecision, ChannelsLast, ConstantFolding, ConvRelu, Cse, Dce, FuseConvEpilogue, Fusion, HoistLoopProducts,
    Inline, KernelRegistry, Pass, PassContext, Pipeline, SelectImplementation, Simplify, SparseUpdate,
};
use tracejit_ir::{verify, Graph};

use crate::passes::{registry, run_checked};

/// The directory of the filetests.
fn filetest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/ir/filetests")
}

/// The input graph of filetest `name` (`tests/ir/filetests/<name>.tj`), for
/// Rust tests that make further assertions about the same graph.
pub fn filetest_input(name: &str) -> Graph {
    let path = filetest_dir().join(format!("{name}.tj"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = FileTest::parse(&path, &text);
    parse_graph(&path, &text, file.kernels().as_deref())
}

/// Every pass the files may name, found by `Pass::name`.
fn passes() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(Inline),
        Box::new(SelectImplementation),
        Box::new(ConstantFolding),
        Box::new(Simplify),
        Box::new(Cse),
        Box::new(Dce),
        Box::new(Fusion::default()),
        Box::new(SparseUpdate),
        Box::new(AutoMixedPrecision),
        Box::new(ConvRelu),
        Box::new(HoistLoopProducts),
        Box::new(ChannelsLast),
        Box::new(FuseConvEpilogue),
    ]
}

/// One check directive.
#[derive(Debug)]
enum Directive {
    /// `; check:` — a later line equals it.
    Check(String),
    /// `; nextln:` — the next line equals it.
    NextLine(String),
    /// `; end` — nothing follows.
    End,
}

/// A parsed filetest: its directives (the graph is the rest of the text).
struct FileTest {
    passes: Vec<String>,
    keep_composites: bool,
    test_kernels: bool,
    /// Fusion asks an executor that runs multi-pass regions (as the JIT
    /// does: a whole softmax in one kernel) instead of the default rule.
    multi_pass_regions: bool,
    /// `auto_mixed_precision` rounds products' operands to bf16.
    mixed_precision: bool,
    /// `auto_mixed_precision` puts products against weights in int8.
    int8_products: bool,
    /// `channels_last` runs (its context flag).
    channels_last: bool,
    /// Each check with its 1-based line in the file.
    checks: Vec<(usize, Directive)>,
}

impl FileTest {
    fn parse(path: &Path, text: &str) -> FileTest {
        let mut file = FileTest {
            passes: Vec::new(),
            keep_composites: false,
            test_kernels: false,
            multi_pass_regions: false,
            mixed_precision: false,
            int8_products: false,
            channels_last: false,
            checks: Vec::new(),
        };
        for (i, line) in text.lines().enumerate() {
            let Some(directive) = line.trim().strip_prefix(';') else { continue };
            let directive = directive.trim();
            let fail = |msg: &str| panic!("{}:{}: {msg}: `{line}`", path.display(), i + 1);
            if let Some(list) = directive.strip_prefix("pass:") {
                file.passes.extend(list.split([' ', ',']).filter(|s| !s.is_empty()).map(str::to_string));
            } else if let Some(option) = directive.strip_prefix("option:") {
                match option.trim() {
                    "keep_composites" => file.keep_composites = true,
                    "test_kernels" => file.test_kernels = true,
                    "multi_pass_regions" => file.multi_pass_regions = true,
                    "mixed_precision" => file.mixed_precision = true,
                    "int8_products" => file.int8_products = true,
                    "channels_last" => file.channels_last = true,
                    _ => fail(
                        "unknown option (keep_composites, test_kernels, multi_pass_regions, mixed_precision, \
                         int8_products, channels_last)",
                    ),
                }
            } else if let Some(pattern) = directive.strip_prefix("check:") {
                file.checks.push((i + 1, Directive::Check(pattern.trim().to_string())));
            } else if let Some(pattern) = directive.strip_prefix("nextln:") {
                file.checks.push((i + 1, Directive::NextLine(pattern.trim().to_string())));
            } else if directive == "end" {
                file.checks.push((i + 1, Directive::End));
            } else if directive.split_once(':').is_some_and(|(word, _)| !word.contains(' ')) {
                // `; word: ...` looks like a directive: a typo must not pass
                // silently as a comment.
                fail("unknown directive (pass, option, check, nextln, end)");
            }
        }
        if file.passes.is_empty() {
            panic!("{}: no `; pass:` line", path.display());
        }
        file
    }

    fn kernels(&self) -> Option<Arc<dyn KernelRegistry>> {
        self.test_kernels.then(registry)
    }

    fn context(&self, function: &str) -> PassContext {
        let mut cx = PassContext::new(function);
        cx.keep_composites = self.keep_composites;
        if self.mixed_precision {
            cx.mixed_precision = Some(tracejit_ir::tensor::DType::BF16);
        }
        cx.int8_products = self.int8_products;
        cx.channels_last = self.channels_last;
        if let Some(k) = self.kernels() {
            cx = cx.with_kernels(k);
        }
        if self.multi_pass_regions {
            cx = cx.with_region_acceptor(Arc::new(|_: &Graph| true));
        }
        cx
    }
}

/// Parses a file's graph, failing with the file's name.
fn parse_graph(path: &Path, text: &str, kernels: Option<&dyn KernelRegistry>) -> Graph {
    let parsed = match kernels {
        Some(k) => Graph::parse_with_kernels(text, k),
        None => Graph::parse(text),
    };
    parsed.unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs one file and returns its output.
fn run(path: &Path, text: &str, file: &FileTest) -> String {
    let kernels = file.kernels();
    let input = parse_graph(path, text, kernels.as_deref());
    let listing: Vec<&str> =
        text.lines().filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with(';')).collect();
    let printed = format!("{input:#}");
    assert_eq!(
        listing,
        printed.lines().collect::<Vec<_>>(),
        "{}: the input is not in canonical form; it prints as\n{printed}",
        path.display()
    );
    verify(&input).unwrap_or_else(|e| panic!("{}: the input does not verify: {e}", path.display()));
    let cx = file.context(&input.name);
    let mut out = String::new();
    let result = if file.passes == ["pipeline"] {
        let (after, _) = Pipeline::default_pipeline().run(&input, &cx).unwrap_or_else(|e| panic!("{e}"));
        after
    } else {
        let all = passes();
        let mut g = input;
        for name in &file.passes {
            let pass = all.iter().find(|p| p.name() == name).unwrap_or_else(|| {
                let names: Vec<&str> = all.iter().map(|p| p.name()).collect();
                panic!("{}: unknown pass `{name}` (known: {}, pipeline)", path.display(), names.join(", "))
            });
            let (after, r) = run_checked(pass.as_ref(), &g, &cx);
            let summary = if r.changed { r.summary.as_str() } else { "unchanged" };
            out.push_str(&format!("pass {name} ({summary})\n"));
            g = after;
        }
        g
    };
    let printed = format!("{result:#}");
    let back = parse_graph(path, &printed, kernels.as_deref());
    if let Some(diff) = result.structural_diff(&back) {
        panic!("{}: the output does not survive its text form: {diff}\n{printed}", path.display());
    }
    out.push_str(&printed);
    out
}

/// Matches `checks` against `output`; the error names the failing check.
fn match_checks(checks: &[(usize, Directive)], output: &str) -> Result<(), String> {
    let lines: Vec<&str> = output.lines().map(str::trim).collect();
    // The index of the line after the last match.
    let mut next = 0usize;
    for (line_no, check) in checks {
        match check {
            Directive::Check(p) => match lines[next..].iter().position(|l| l == p) {
                Some(i) => next += i + 1,
                None => return Err(format!("line {line_no}: `; check: {p}` matches no output line after line {next}")),
            },
            Directive::NextLine(p) => {
                if lines.get(next) != Some(&p.as_str()) {
                    let found = lines.get(next).map_or("end of output".to_string(), |l| format!("`{l}`"));
                    return Err(format!(
                        "line {line_no}: `; nextln: {p}` expected output line {}, found {found}",
                        next + 1
                    ));
                }
                next += 1;
            }
            Directive::End => {
                if next != lines.len() {
                    return Err(format!("line {line_no}: `; end` but output continues with `{}`", lines[next]));
                }
            }
        }
    }
    Ok(())
}

/// The file with its check lines replaced by ones that pin `output`.
fn blessed(text: &str, output: &str) -> String {
    let is_check = |l: &str| {
        let d = l.trim().strip_prefix(';').map(str::trim);
        d.is_some_and(|d| d.starts_with("check:") || d.starts_with("nextln:") || d == "end")
    };
    let mut out: Vec<String> = text.lines().filter(|l| !is_check(l)).map(str::to_string).collect();
    while out.last().is_some_and(|l| l.trim().is_empty()) {
        out.pop();
    }
    out.push(String::new());
    for (i, line) in output.lines().enumerate() {
        out.push(format!("; {}: {}", if i == 0 { "check" } else { "nextln" }, line.trim()));
    }
    out.push("; end".into());
    out.join("\n") + "\n"
}

#[test]
fn run_all_filetests() {
    let bless = std::env::var("TRACEJIT_BLESS").is_ok_and(|v| v == "1");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(filetest_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tj"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no filetests found");
    let mut failures = Vec::new();
    for path in &paths {
        let text = std::fs::read_to_string(path).unwrap();
        let file = FileTest::parse(path, &text);
        let output = run(path, &text, &file);
        if bless {
            std::fs::write(path, blessed(&text, &output)).unwrap();
            continue;
        }
        if file.checks.is_empty() {
            failures.push(format!("{}: no check lines (run with TRACEJIT_BLESS=1 to write them)", path.display()));
            continue;
        }
        if let Err(why) = match_checks(&file.checks, &output) {
            let expected: Vec<String> = file
                .checks
                .iter()
                .map(|(_, c)| match c {
                    Directive::Check(p) => format!("check:  {p}"),
                    Directive::NextLine(p) => format!("nextln: {p}"),
                    Directive::End => "end".into(),
                })
                .collect();
            failures.push(format!(
                "{}: {why}\n--- expected (checks)\n{}\n--- actual output\n{output}",
                path.display(),
                expected.join("\n")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} filetest(s) failed (rerun with TRACEJIT_BLESS=1 to accept the new output):\n\n{}",
        failures.len(),
        paths.len(),
        failures.join("\n\n")
    );
}

#[test]
fn check_matching_rules() {
    let out = "a\n  b\nc\nd\n";
    let check = |p: &str| Directive::Check(p.into());
    let next = |p: &str| Directive::NextLine(p.into());
    let run = |checks: Vec<Directive>| match_checks(&checks.into_iter().map(|c| (1, c)).collect::<Vec<_>>(), out);
    assert!(run(vec![check("b"), next("c"), next("d"), Directive::End]).is_ok());
    assert!(run(vec![check("a"), check("d")]).is_ok(), "check skips lines");
    assert!(run(vec![check("a"), next("c")]).unwrap_err().contains("found `b`"));
    assert!(run(vec![check("c"), check("b")]).is_err(), "checks match in order");
    assert!(run(vec![check("c"), Directive::End]).unwrap_err().contains("continues with `d`"));
    assert!(run(vec![check("x")]).is_err());
    let text = "; pass: cse\ngraph g() -> () {\n}\n; check: old\n; end\n";
    assert_eq!(
        blessed(text, "pass cse (unchanged)\n  x\n"),
        "; pass: cse\ngraph g() -> () {\n}\n\n; check: pass cse (unchanged)\n; nextln: x\n; end\n"
    );
}
