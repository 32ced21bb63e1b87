//! Filetests of the schedule passes: each `tests/schedule/*.tj` file holds
//! a graph in the IR's text form and, after a `; schedule:` line, what the
//! JIT makes of it, one `; ` line each: every codegen pass that changed
//! something (`pass in_place on f: 2 regions write in place`), then the
//! final schedule listing ([`crate::Executable::schedule_listing`]). A
//! change to any schedule pass shows as a text diff here, as the IR's
//! filetests show an IR pass's and `tests/lowering` a region's lowering.
//!
//! The graphs avoid what the listing would take from the machine (bf16
//! products, which depend on the CPU's ISA): the files hold on every CPU.
//! `TRACEJIT_BLESS=1` rewrites every file's expected lines from the actual
//! output.

use std::path::PathBuf;

use tracejit_ir::Graph;

use crate::{Executable, JitOptions};

const MARKER: &str = "; schedule:";

/// The passes that changed something, then the listing.
fn actual(g: &Graph) -> Vec<String> {
    let exe = match Executable::with_options(g, &JitOptions::default()) {
        Ok(exe) => exe,
        Err(e) => return vec![format!("error: {e}")],
    };
    let mut out: Vec<String> = exe
        .codegen_report()
        .passes
        .iter()
        .filter(|r| r.changed)
        .map(|r| format!("pass {} on {}: {}", r.pass, r.graph, r.summary))
        .collect();
    out.extend(exe.schedule_listing().lines().map(str::to_string));
    out
}

#[test]
fn every_schedule_filetest_matches() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/schedule");
    let bless = std::env::var("TRACEJIT_BLESS").is_ok_and(|v| v == "1");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tj"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "the schedule filetests are missing: {files:?}");
    let mut failures = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let Some(at) = text.find(MARKER) else {
            failures.push(format!("{}: no `{MARKER}` line", path.display()));
            continue;
        };
        let (input, expected) = text.split_at(at);
        let g = match Graph::parse(input) {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!("{}: the input does not parse: {e}", path.display()));
                continue;
            }
        };
        let got = actual(&g);
        let want: Vec<String> = expected
            .lines()
            .skip(1)
            .map(|l| l.strip_prefix("; ").unwrap_or(l.trim_start_matches(';')).to_string())
            .collect();
        if bless {
            let lines: String = got.iter().map(|l| format!("; {l}\n")).collect();
            std::fs::write(path, format!("{input}{MARKER}\n{lines}")).unwrap();
        } else if got != want {
            failures.push(format!(
                "{}:\n--- expected\n{}\n--- got\n{}",
                path.display(),
                want.join("\n"),
                got.join("\n")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} schedule filetest(s) failed (rerun with TRACEJIT_BLESS=1 to accept the new output):\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
