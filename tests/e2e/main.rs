//! The end-to-end tests, one binary: the real server and agent binaries, the fake NVML
//! library, real PostgreSQL, Slurm, Prometheus, Chromium and the rest, each test driving them
//! as a person or a machine would. One binary links the server once, not once per file; nextest
//! (`scripts/test`) runs each test in its own process, side by side.

mod support;

mod aws_ce;
mod billing;
mod browser;
mod dcgm;
mod deploy;
mod export;
mod faults;
mod gpus;
mod kubernetes;
mod load;
mod many_servers;
mod metrics;
mod nvml_captures;
mod people;
mod replica;
mod serving;
mod slurm;
mod sso;
mod telemetry;
