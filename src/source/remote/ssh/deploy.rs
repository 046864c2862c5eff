//! Running commands over a session: one-shot execs, the guarded agent start, and `--deploy`.

use russh::ChannelMsg;
use russh::client::Handle;
use sha2::{Digest, Sha256};
use tokio::io::BufReader;

use super::connect::Client;
use crate::core::protocol::MAX_LINE_BYTES;
use crate::source::remote::stream::read_line_bounded;

/// Run a command to completion: (exit status, stdout), stdin fed from `input`. Output is bounded.
pub async fn exec(
    handle: &Handle<Client>,
    command: &str,
    input: Option<&[u8]>,
    max: usize,
) -> Result<(Option<u32>, Vec<u8>), String> {
    let mut ch = handle
        .channel_open_session()
        .await
        .map_err(|e| format!("open channel: {e}"))?;
    ch.exec(true, command)
        .await
        .map_err(|e| format!("exec: {e}"))?;
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

pub use crate::core::format::shell_quote;

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

/// Start `command` on a new channel; `Ok(None)` when the host lacks its program.
pub async fn start_agent(
    handle: &Handle<Client>,
    command: &str,
) -> Result<
    Option<(
        impl tokio::io::AsyncBufRead + Unpin + Send + 'static + use<>,
        impl tokio::io::AsyncWrite + Unpin + use<>,
    )>,
    String,
> {
    let ch = handle
        .channel_open_session()
        .await
        .map_err(|e| format!("open channel: {e}"))?;
    ch.exec(true, guarded(command))
        .await
        .map_err(|e| format!("exec: {e}"))?;
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

/// Upload this binary to `~/.cache/gpusweep/gpusweep-VERSION-SHA` when the architectures match; returns the
/// command that runs it as an agent.
pub async fn deploy(handle: &Handle<Client>) -> Result<String, String> {
    let (st, arch) = exec(handle, "uname -m", None, 256).await?;
    let arch = String::from_utf8_lossy(&arch).trim().to_string();
    if st != Some(0) || arch != std::env::consts::ARCH {
        return Err(format!(
            "cannot deploy: the host is {arch:?}, this binary is {}",
            std::env::consts::ARCH
        ));
    }
    // Reading and hashing the whole binary is blocking work: off the async threads.
    let (bytes, sum) = tokio::task::spawn_blocking(|| {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
        let bytes = std::fs::read(&exe).map_err(|e| format!("reading {}: {e}", exe.display()))?;
        let sum = hex(&Sha256::digest(&bytes));
        Ok::<_, String>((bytes, sum))
    })
    .await
    .map_err(|e| format!("reading this binary: {e}"))??;
    let path = format!(
        "\"$HOME/.cache/gpusweep/gpusweep-{}-{}\"",
        env!("CARGO_PKG_VERSION"),
        &sum[..16]
    );
    let check = format!("sha256sum {path} 2>/dev/null | cut -d' ' -f1");
    let (_, have) = exec(handle, &check, None, 256).await?;
    if String::from_utf8_lossy(&have).trim() != sum {
        let up = format!(
            "mkdir -p \"$HOME/.cache/gpusweep\" && cat > {path}.tmp && chmod 755 {path}.tmp && mv {path}.tmp {path}"
        );
        let (st, _) = exec(handle, &up, Some(&bytes), 4096).await?;
        if st != Some(0) {
            return Err(format!("upload failed (exit {st:?})"));
        }
        let (_, have) = exec(handle, &check, None, 256).await?;
        if String::from_utf8_lossy(&have).trim() != sum {
            return Err("the uploaded binary's checksum does not match".into());
        }
    }
    Ok(format!("{path} agent"))
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write as _;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}
