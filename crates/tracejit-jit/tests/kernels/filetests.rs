//! The runner the JIT's filetests share (`lowering`, `schedule`): each
//! `*.tj` file of a directory holds an input graph in the IR's text form
//! and, after a marker line, the expected output, one `; ` line each.
//! `TRACEJIT_BLESS=1` rewrites every file's expected lines from the actual
//! output.

use std::path::PathBuf;

use tracejit_ir::Graph;

/// Runs every `tests/<dir>/*.tj` file (at least `min_files` of them):
/// `actual` gives a graph's output lines, compared with the lines after
/// `marker`.
pub fn run_filetests(dir: &str, marker: &str, min_files: usize, actual: impl Fn(&Graph) -> Vec<String>) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join(dir);
    let bless = std::env::var("TRACEJIT_BLESS").is_ok_and(|v| v == "1");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tj"))
        .collect();
    files.sort();
    assert!(files.len() >= min_files, "the filetests of {} are missing: {files:?}", dir.display());
    let mut failures = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let Some(at) = text.find(marker) else {
            failures.push(format!("{}: no `{marker}` line", path.display()));
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
            std::fs::write(path, format!("{input}{marker}\n{lines}")).unwrap();
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
        "{} filetest(s) of {} failed (rerun with TRACEJIT_BLESS=1 to accept the new output):\n\n{}",
        failures.len(),
        dir.display(),
        failures.join("\n\n")
    );
}
