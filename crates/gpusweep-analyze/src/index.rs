//! A reading looked up by PID in constant time. Analysis asks, of every holder and listed process, its
//! process, its ancestors and whether NVML lists it; found by scanning, a node with 10,000 holders took half a
//! second (the cost grew with the square of the holders).

use std::collections::{HashMap, HashSet};
use std::ops::Deref;

use gpusweep_core::model::{Holder, HostSnapshot, Proc};

/// A reading with its processes, holders and listed PIDs indexed; everything else as the reading has it.
pub struct Indexed<'a> {
    snap: &'a HostSnapshot,
    procs: HashMap<u32, &'a Proc>,
    holders: HashMap<u32, &'a Holder>,
    /// (GPU index, PID) for every process NVML lists.
    listed: HashSet<(u32, u32)>,
}

impl<'a> Indexed<'a> {
    pub fn new(snap: &'a HostSnapshot) -> Indexed<'a> {
        // The first of a PID wins, as a scan would find it.
        let mut procs = HashMap::with_capacity(snap.processes.len());
        for p in &snap.processes {
            procs.entry(p.pid).or_insert(p);
        }
        let mut holders = HashMap::with_capacity(snap.holders.len());
        for h in &snap.holders {
            holders.entry(h.pid).or_insert(h);
        }
        let listed = snap
            .gpus
            .iter()
            .flat_map(|g| g.processes.iter().map(move |p| (g.index, p.pid)))
            .collect();
        Indexed {
            snap,
            procs,
            holders,
            listed,
        }
    }

    pub fn proc(&self, pid: u32) -> Option<&'a Proc> {
        self.procs.get(&pid).copied()
    }

    pub fn holder(&self, pid: u32) -> Option<&'a Holder> {
        self.holders.get(&pid).copied()
    }

    /// Whether NVML lists `pid` on GPU `gpu`.
    pub fn listed_on(&self, gpu: u32, pid: u32) -> bool {
        self.listed.contains(&(gpu, pid))
    }
}

impl Deref for Indexed<'_> {
    type Target = HostSnapshot;
    fn deref(&self) -> &HostSnapshot {
        self.snap
    }
}
