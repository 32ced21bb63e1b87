//! The warning about a Function traced many times, rate-limited as
//! TensorFlow's retracing warning is: at the 5th trace, then at the 8th,
//! 16th, 32nd, ... (powers of two), so a loop over 200 shapes warns 6
//! times, not 196. Every trace is still logged at `info` with its reason.
//!
//! Without a `log` backend (no logger installed, so `log::max_level()` is
//! `Off`) the warning goes to stderr, as TensorFlow prints its own: a user
//! who never set up logging still learns that the cache is churning.

/// True for the trace counts that warn: 5, then every power of two past it.
pub(crate) fn warns_at(count: usize) -> bool {
    count == 5 || (count > 5 && count.is_power_of_two())
}

/// Warns, at the counts of [`warns_at`], that `name` was traced `count`
/// times.
pub(super) fn warn_if_excessive(name: &str, count: usize) {
    if !warns_at(count) {
        return;
    }
    let next = (count + 1).next_power_of_two();
    let message = format!(
        "tracejit: `{name}` has been traced {count} times (next warning at {next}); pass an input_signature \
         with -1 dims or enable reduce_retracing(true) to trace once for many shapes"
    );
    if log::max_level() == log::LevelFilter::Off {
        eprintln!("{message} [no `log` backend is installed: set one up, e.g. env_logger with RUST_LOG=tracejit=info, to see every retrace and its reason]");
    } else {
        log::warn!("{message}");
    }
}

#[cfg(test)]
mod tests {
    use super::warns_at;

    #[test]
    fn a_200_shape_loop_warns_six_times() {
        let at: Vec<usize> = (1..=200).filter(|&c| warns_at(c)).collect();
        assert_eq!(at, [5, 8, 16, 32, 64, 128]);
    }
}
