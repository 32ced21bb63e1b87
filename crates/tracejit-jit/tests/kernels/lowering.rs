//! Filetests of region lowering: each `tests/lowering/*.tj` file holds a
//! region body in the IR's text form and, after a `; lowered:` line, the
//! lowered program the JIT emits for it (`tracejit_jit::region_program`),
//! one `; ` line each — or `; unsupported: <reason>` for a body the JIT
//! does not compile. A change to lowering shows as a text diff here, as
//! the IR's filetests show a pass's.
//!
//! `TRACEJIT_BLESS=1` rewrites every file's expected lines from the
//! actual output.

use std::path::PathBuf;

use tracejit_ir::Graph;

const MARKER: &str = "; lowered:";

/// The lowered text of `body`, as the expected lines hold it.
fn actual(body: &Graph) -> Vec<String> {
    match tracejit_jit::region_program(body) {
        Ok(program) => program.lines().map(str::to_string).collect(),
        Err(reason) => vec![format!("unsupported: {reason}")],
    }
}

#[test]
fn every_lowering_filetest_matches() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/lowering");
    let bless = std::env::var("TRACEJIT_BLESS").is_ok_and(|v| v == "1");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tj"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "the lowering filetests are missing: {files:?}");
    let mut failures = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let Some(at) = text.find(MARKER) else {
            failures.push(format!("{}: no `{MARKER}` line", path.display()));
            continue;
        };
        let (input, expected) = text.split_at(at);
        let body = match Graph::parse(input) {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!("{}: the input does not parse: {e}", path.display()));
                continue;
            }
        };
        let got = actual(&body);
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
        "{} lowering filetest(s) failed (rerun with TRACEJIT_BLESS=1 to accept the new output):\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
