//! Running commands over a session: one-shot execs, the guarded agent start, and `--deploy`.

use russh::ChannelMsg;
use russh::client::Handle;
use sha2::{Digest, Sha256};
use tokio::io::BufReader;

use super::connect::Client;
use crate::remote::stream::read_line_bounded;
use gpusweep_core::protocol::MAX_LINE_BYTES;

/// A session channel running `command`.
async fn open_exec(
    handle: &Handle<Client>,
    command: &str,
) -> Result<russh::Channel<russh::client::Msg>, String> {
    let ch = handle
        .channel_open_session()
        .await
        .map_err(|e| format!("open channel: {e}"))?;
    ch.exec(true, command)
        .await
        .map_err(|e| format!("exec: {e}"))?;
    Ok(ch)
}

/// Run a command to completion: (exit status, stdout), stdin fed from `input`. Output is bounded.
pub async fn exec(
    handle: &Handle<Client>,
    command: &str,
    input: Option<&[u8]>,
    max: usize,
) -> Result<(Option<u32>, Vec<u8>), String> {
    let mut ch = open_exec(handle, command).await?;
    if let Some(data) = input {
        ch.data_bytes(data.to_vec())
            .await
            .map_err(|e| format!("upload: {e}"))?;
    }
    ch.eof().await.map_err(|e| format!("eof: {e}"))?;
    let mut out = Vec::new();
    let mut status = None;
    while let Some(msg) = ch.wait().await {
        match msg {
            ChannelMsg::Data { data } => {
                if out.len() + data.len() > max {
                    return Err(format!("the host sent more than {max} bytes"));
                }
                out.extend_from_slice(&data);
            }
            ChannelMsg::ExitStatus { exit_status } => status = Some(exit_status),
            _ => {}
        }
    }
    Ok((status, out))
}

pub use gpusweep_core::format::shell_quote;

/// What a host without the agent's program answers instead of a hello.
pub const NOT_FOUND: &str = "GPUSWEEP-AGENT-NOT-FOUND";

/// The agent command, guarded so that a host without the program says so in one line: one exec, one round
/// trip, instead of a probe session before the real one.
pub fn guarded(remote_command: &str) -> String {
    let prog = remote_command
        .split_whitespace()
        .next()
        .unwrap_or("gpusweep");
    format!(
        "if command -v {} >/dev/null 2>&1; then {remote_command}\nelse echo {NOT_FOUND}; fi",
        shell_quote(prog)
    )
}

/// Run `line` (a shell line that prints `NOT_FOUND` when the program is missing: `guarded` or
/// `Deployment::run_line`) on a new channel; `Ok(None)` when the host lacks the program.
pub async fn start_agent(
    handle: &Handle<Client>,
    line: &str,
) -> Result<
    Option<(
        impl tokio::io::AsyncBufRead + Unpin + Send + 'static + use<>,
        impl tokio::io::AsyncWrite + Unpin + use<>,
    )>,
    String,
> {
    let ch = open_exec(handle, line).await?;
    let (r, w) = tokio::io::split(ch.into_stream());
    let mut r = BufReader::new(r);
    let first = read_line_bounded(&mut r, MAX_LINE_BYTES)
        .await
        .map_err(|e| format!("reading the agent: {e}"))?
        .unwrap_or_default();
    if String::from_utf8_lossy(&first).trim() == NOT_FOUND {
        return Ok(None);
    }
    // Hand the first line back to the protocol reader, in front of the rest.
    let mut line = first;
    line.push(b'\n');
    Ok(Some((
        BufReader::new(tokio::io::AsyncReadExt::chain(
            std::io::Cursor::new(line),
            r,
        )),
        w,
    )))
}

/// This binary, to be uploaded to `~/.cache/gpusweep/gpusweep-VERSION-SHA` on a host of the same
/// architecture. The directory is the user's own, mode 0700, never a symlink; the upload goes to a fresh
/// `mktemp` name in it and is renamed into place; the checksum is verified by the same shell line that execs
/// the binary, so nothing can be swapped in between two round trips.
pub(crate) struct Deployment {
    bytes: Vec<u8>,
    sum: String,
}

/// The directory checks every deploy line starts with (POSIX sh).
const DIR: &str = "umask 077; d=\"$HOME/.cache/gpusweep\"; \
    mkdir -p \"$d\" && [ -d \"$d\" ] && [ ! -L \"$d\" ] && [ -O \"$d\" ] && chmod 700 \"$d\" || \
    { echo \"gpusweep: $d is not a directory of this user's own\"; exit 3; }";

impl Deployment {
    /// Read and hash this binary, after checking that the host runs the same architecture.
    pub(super) async fn prepare(handle: &Handle<Client>) -> Result<Deployment, String> {
        let (st, arch) = exec(handle, "uname -m", None, 256).await?;
        let arch = String::from_utf8_lossy(&arch).trim().to_string();
        if st != Some(0) || arch != std::env::consts::ARCH {
            return Err(format!(
                "cannot deploy: the host is {arch:?}, this binary is {}",
                std::env::consts::ARCH
            ));
        }
        // Reading and hashing the whole binary is blocking work: off the async threads.
        tokio::task::spawn_blocking(|| {
            let exe =
                std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
            let bytes =
                std::fs::read(&exe).map_err(|e| format!("reading {}: {e}", exe.display()))?;
            let sum = hex(&Sha256::digest(&bytes));
            Ok::<_, String>(Deployment { bytes, sum })
        })
        .await
        .map_err(|e| format!("reading this binary: {e}"))?
    }

    fn file_name(&self) -> String {
        format!("gpusweep-{}-{}", env!("CARGO_PKG_VERSION"), &self.sum[..16])
    }

    /// One line: verify the uploaded binary's checksum and exec it as the agent, or print `NOT_FOUND`.
    pub fn run_line(&self) -> String {
        format!(
            "{DIR}; f=\"$d/{name}\"; \
             if [ -f \"$f\" ] && [ ! -L \"$f\" ] && [ \"$(sha256sum \"$f\" 2>/dev/null | cut -d' ' -f1)\" = {sum} ]; \
             then exec \"$f\" agent; else echo {NOT_FOUND}; fi",
            name = self.file_name(),
            sum = self.sum
        )
    }

    /// The upload line: stdin into a fresh temporary name, then renamed into place.
    pub fn upload_line(&self) -> String {
        format!(
            "{DIR}; t=$(mktemp \"$d/.upload.XXXXXXXX\") || exit 4; \
             if cat > \"$t\" && chmod 700 \"$t\" && mv -f \"$t\" \"$d/{name}\"; then exit 0; fi; \
             rm -f \"$t\"; exit 5",
            name = self.file_name()
        )
    }

    pub(super) async fn upload(&self, handle: &Handle<Client>) -> Result<(), String> {
        let (st, out) = exec(handle, &self.upload_line(), Some(&self.bytes), 4096).await?;
        if st == Some(0) {
            Ok(())
        } else {
            Err(format!(
                "upload failed (exit {st:?}){}",
                String::from_utf8_lossy(&out)
                    .lines()
                    .next()
                    .map(|l| format!(": {}", gpusweep_core::format::escape(l)))
                    .unwrap_or_default()
            ))
        }
    }
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write as _;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}
