//! Filetests of region lowering: each `tests/lowering/*.tj` file holds a
//! region body in the IR's text form and, after a `; lowered:` line, the
//! lowered program the JIT emits for it (`tracejit_jit::region_program`),
//! one `; ` line each — or `; unsupported: <reason>` for a body the JIT
//! does not compile. A change to lowering shows as a text diff here, as
//! the IR's filetests show a pass's.
//!
//! `TRACEJIT_BLESS=1` rewrites every file's expected lines from the
//! actual output (the runner is `filetests.rs`).

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
    crate::filetests::run_filetests("lowering", MARKER, 6, actual);
}
