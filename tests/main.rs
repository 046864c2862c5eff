//! The integration tests, one crate linked once: each module below was a test binary of its own, and the
//! helpers they share live in `support`. Tests of every module run side by side in this one process, so each
//! keeps what it creates (files, sockets, servers, cgroups) under names of its own. Some start their own
//! servers on loopback: sshd (ssh), Prometheus (prometheus), a one-node Slurm with munge (slurm) and tmux
//! (tmux); they need root and those Debian packages (scripts/test.sh installs them).

// In tests a panic is the failure message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod cli;
mod demo;
mod deploy;
mod kube;
mod layers;
mod prometheus;
mod remote;
mod run;
mod serve;
mod slurm;
mod ssh;
mod tmux;
mod tui;
