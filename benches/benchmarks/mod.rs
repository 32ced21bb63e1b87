//! The benchmark groups run by `bench_main`.

pub mod cache;
pub mod eager;
pub mod first_call;
pub mod kernel;
