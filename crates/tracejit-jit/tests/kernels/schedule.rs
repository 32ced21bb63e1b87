//! Filetests of the schedule passes: each `tests/schedule/*.tj` file holds
//! a graph and, after a `; schedule:` line, what the JIT makes of it:
//! every codegen pass that changed something (`pass in_place on f: 2
//! steps write in place`), then the final schedule listing
//! (`Executable::schedule_listing`). A change to any schedule pass shows
//! as a text diff here, as `tests/lowering` shows a region's lowering.
//!
//! The graphs avoid what the listing would take from the machine (bf16
//! products, which depend on the CPU's ISA): the files hold on every CPU.

use tracejit_ir::Graph;
use tracejit_jit::{Executable, JitOptions};

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
    crate::filetests::run_filetests("schedule", "; schedule:", 4, actual);
}
