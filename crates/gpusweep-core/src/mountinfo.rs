//! What `/proc/PID/mountinfo` says that more than one layer needs: whether the `/proc` a reader sees hides
//! other users' processes (`hidepid`).

/// How a `/proc` mount hides processes: `hidepid` set (not 0/off), and the group exempt from it (`gid=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hiding {
    pub exempt_gid: Option<u32>,
}

/// How the `/proc` a `mountinfo` shows hides processes (the topmost proc mount on `/proc`); `None` when it
/// shows every process.
pub fn proc_hiding(mountinfo: &str) -> Option<Hiding> {
    let mut top = None;
    for line in mountinfo.lines() {
        let mut halves = line.splitn(2, " - ");
        let (Some(before), Some(after)) = (halves.next(), halves.next()) else {
            continue;
        };
        let mountpoint = before.split(' ').nth(4);
        let mut a = after.split(' ');
        let fstype = a.next();
        let superopts = a.nth(1).unwrap_or("");
        if mountpoint == Some("/proc") && fstype == Some("proc") {
            top = Some(superopts.to_string());
        }
    }
    let opts = top?;
    let mut hides = false;
    let mut exempt_gid = None;
    for o in opts.split(',') {
        match o.split_once('=') {
            Some(("hidepid", v)) => hides = !matches!(v, "0" | "off"),
            Some(("gid", g)) => exempt_gid = g.parse().ok(),
            _ => {}
        }
    }
    hides.then_some(Hiding { exempt_gid })
}
