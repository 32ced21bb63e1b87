//! The harness reports what one traced-jit call runs (kernels, GEMMs): in
//! the row, the table and the JSON. W6's compiled step runs W5's three
//! forward products and five backward ones (no gradient for the input).

use std::time::Duration;

use tracejit_bench::report::{row_json, schedule_note, schedules_text, table, Results};
use tracejit_bench::workloads::{selected, Mode};
use tracejit_bench::{run_workload, Budget, RunConfig, Timing};

const TINY: Budget = Budget { warmup: Duration::from_millis(1), measure: Duration::from_millis(2) };

#[test]
fn w6_reports_its_kernels_and_gemms() {
    let specs = selected(Some("mlp_train_step"));
    let cfg = RunConfig { budget: TINY, threads: 1, inject_wrong_result: None };
    let rows = run_workload(&specs[0], &cfg, &mut |_, _| {});
    assert!(rows.iter().all(|r| !r.failed()), "{rows:?}");
    let jit = rows.iter().find(|r| r.mode == Mode::TracedJit).expect("a traced-jit row");
    let st = *jit.schedule().expect("the JIT's schedule is recorded");
    assert_eq!(st.gemms, 8, "3 forward + 5 backward products: {st}");
    assert!(st.regions >= 3, "bias/relu epilogues, the loss and the updates are fused: {st}");
    assert_eq!(st.fallbacks, 0, "the labels' one_hot runs inside the loss region: {st}");
    assert_eq!(st.kernels(), st.regions + st.gemms + st.native_kernels + st.fallbacks);
    for r in rows.iter().filter(|r| !r.mode.needs_jit()) {
        assert!(r.schedule().is_none(), "{:?} runs no compiled schedule", r.mode);
    }
    // Mixed precision runs the same products on the bf16 GEMM.
    let bf16 = rows.iter().find(|r| r.mode == Mode::TracedJitBf16).expect("a traced-jit-bf16 row");
    let st16 = bf16.schedule().expect("compiled");
    assert_eq!((st16.gemms, st16.bf16_gemms, st16.fallbacks), (8, 8, 0), "{st16}");

    let timing = Timing { median_us: 1.0, min_us: 1.0, max_us: 1.0, samples: 1, batch: 1 };
    let bandwidth = tracejit_bench::floors::Bandwidth { gbps: 1.0, buffer_bytes: 1 << 20, timing: timing.clone() };
    let res = Results::new(rows.clone(), &specs, bandwidth, timing, true, 1);
    let note = schedule_note(&st);
    assert!(note.starts_with(&format!("{} kernels (", st.kernels())) && note.contains("8 GEMM"), "{note}");
    assert!(table(&res).contains(&note), "the table's notes name the kernels");
    let line = schedules_text(&res);
    assert_eq!(line.len(), 1);
    assert!(line[0].contains("W6 mlp_train_step") && line[0].contains("8 GEMMs"), "{line:?}");
    let json = row_json(&res, jit);
    assert_eq!(json["schedule"]["gemms"], 8);
    assert_eq!(json["schedule"]["kernels"], st.kernels());
    assert!(row_json(&res, &rows[0]).get("schedule").is_none(), "eager has none");
}
