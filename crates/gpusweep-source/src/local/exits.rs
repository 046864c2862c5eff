//! The exits of GPU processes, learned from their pidfds the moment they happen, instead of by rescanning
//! /proc: a thread waits on an epoll set of the pidfds of every process that holds or is charged GPU memory,
//! and wakes the poll loop when one of them ends. The poll that follows reads that process's GPUs at once,
//! and keeps reading them every few milliseconds while the driver lets the memory go.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use rustix::event::epoll;
use rustix::process::{Pid, PidfdFlags, pidfd_open};

/// Called when a watched process ended: wakes the poll loop.
pub(crate) type Waker = Box<dyn Fn() + Send + Sync>;

/// The epoll data of the shutdown eventfd: no PID is 0.
const STOP: u64 = 0;

/// The watched processes and the thread that waits on them.
pub(crate) struct ExitWatch {
    epoll: Arc<OwnedFd>,
    stop: Arc<OwnedFd>,
    /// PID -> (its start time, its pidfd).
    watched: HashMap<u32, (u64, OwnedFd)>,
}

impl ExitWatch {
    /// Start waiting. `None` where this kernel gives no pidfds or no epoll (exits are then seen at the next
    /// poll, as before).
    pub fn start(wake: Waker) -> Option<ExitWatch> {
        let ep = Arc::new(epoll::create(epoll::CreateFlags::CLOEXEC).ok()?);
        let stop = Arc::new(
            rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )
            .ok()?,
        );
        epoll::add(
            &*ep,
            &*stop,
            epoll::EventData::new_u64(STOP),
            epoll::EventFlags::IN,
        )
        .ok()?;
        let (ep2, _stop2) = (ep.clone(), stop.clone());
        std::thread::Builder::new()
            .name("gpu-exits".into())
            .spawn(move || {
                let mut events: Vec<epoll::Event> = Vec::with_capacity(16);
                loop {
                    events.clear();
                    match epoll::wait(&*ep2, rustix::buffer::spare_capacity(&mut events), None) {
                        Ok(_) => {}
                        Err(rustix::io::Errno::INTR) => continue,
                        Err(_) => return,
                    }
                    if events.iter().any(|e| e.data.u64() == STOP) {
                        return;
                    }
                    if !events.is_empty() {
                        wake();
                    }
                }
            })
            .ok()?;
        Some(ExitWatch {
            epoll: ep,
            stop,
            watched: HashMap::new(),
        })
    }

    /// Watch exactly these processes (PID, start time) from now on. A pidfd fires once (one-shot): the poll it
    /// wakes reads the process, finds it gone, and it leaves the set.
    pub fn watch(&mut self, procs: &[(u32, u64)]) {
        self.watched.retain(|pid, (start, fd)| {
            let keep = procs.iter().any(|(p, s)| p == pid && s == start);
            if !keep {
                let _ = epoll::delete(&*self.epoll, fd.as_fd());
            }
            keep
        });
        for &(pid, start) in procs {
            if self.watched.contains_key(&pid) {
                continue;
            }
            let Some(fd) = i32::try_from(pid)
                .ok()
                .and_then(Pid::from_raw)
                .and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok())
            else {
                continue;
            };
            let flags = epoll::EventFlags::IN | epoll::EventFlags::ONESHOT;
            if epoll::add(
                &*self.epoll,
                &fd,
                epoll::EventData::new_u64(u64::from(pid)),
                flags,
            )
            .is_ok()
            {
                self.watched.insert(pid, (start, fd));
            }
        }
    }
}

impl Drop for ExitWatch {
    fn drop(&mut self) {
        // Ends the waiting thread.
        let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
    }
}
